"""The seam between the session runtime and the engines that answer the user.

A :class:`TurnPipeline` is shared by all sessions. The runtime asks it for the final transcript
of an utterance, then for the reply's sentences (the LLM stage), then for each sentence's audio
(the TTS stage) under the conditions in force at that chunk boundary.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import inspect
import secrets
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol, cast, runtime_checkable

import numpy as np
import numpy.typing as npt

from server.config import Config, PipelineConfig
from server.errors import ConfigError
from server.owner import NO_OWNER
from server.pipeline.engines import Rivals
from server.pipeline.ladder import Climb
from server.runtime.chunk import PhonemeTiming, WordTiming
from server.runtime.conditions import Conditions
from server.runtime.history import ContextEntry
from server.runtime.session_view import SessionView
from server.runtime.tools import NO_TOOLS, FunctionCall, ToolSettings
from server.scheduling.engine_queue import JobTag


@dataclass(frozen=True)
class ReplyRequest:
    """What the LLM stage needs to write a reply. ``owner``: the digest of the token that
    created the session (``NO_OWNER`` when authentication is off); with the session id, it
    says whose prefix cache the request may share (see :class:`CacheSalts`). ``view``: the
    session's live view (its playback slack), so that a chunk goes to speech before its
    sentence ends when the playback would otherwise run dry (None: sentences only)."""

    session_id: str
    epoch: int
    context: tuple[ContextEntry, ...]
    conditions: Conditions
    owner: str = NO_OWNER
    view: Callable[[], SessionView] | None = field(default=None, compare=False, repr=False)
    standing: ReplyStanding | None = field(default=None, compare=False, repr=False)
    tools: ToolSettings = NO_TOOLS  # the functions the reply may call


ReplyPiece = str | FunctionCall  # what the LLM stage gives: a chunk's text, or a call


class ReplyStanding:
    """Whether a reply is optional work, which steers the LLM stage (a :class:`TurnTrace` only
    records). An early reply (server/conversation/early.py) is ``held`` until the turn's reply
    adopts it; held, a reply someone waits for sheds it (``shed``: its request was ended, and
    what it wrote is no reply)."""

    def __init__(self, held: bool = False) -> None:
        self.held = held
        self.shed = False

    def adopt(self) -> None:
        """Someone waits for it now: no longer optional, no longer shed."""
        self.held = False

    def shed_now(self) -> bool:
        """Shed it if it is held and not shed yet; whether it was."""
        if not self.held or self.shed:
            return False
        self.shed = True
        return True


class CacheSalts:
    """Prefix-cache scopes for a shared LLM engine (its ``cache_salt``): one per owner (the
    token digest), or one per session when authentication is off.

    Requests reuse cached prompt blocks only within a scope, so the cache cannot tell a
    session what another owner said (a hit, or a faster first token, on a guessed prefix).
    Everything is salted, the persona too (a client may replace it). A salt is HMAC-SHA256
    under a random per-process key, 64 hex characters: stable while the process lives, and
    neither the token digest nor the session id can be read back from it.
    """

    def __init__(self, key: bytes | None = None) -> None:
        self._key = secrets.token_bytes(32) if key is None else key

    def of(self, request: ReplyRequest) -> str:
        """The scope of ``request``'s prompt: its owner's, or its session's without one."""
        if request.owner == NO_OWNER:
            return self._salt("session", request.session_id)
        return self._salt("owner", request.owner)

    def internal(self, name: str) -> str:
        """A scope of the server's own requests (start-up warm-ups); no session shares it."""
        return self._salt("internal", name)

    def _salt(self, kind: str, name: str) -> str:
        return hmac.new(self._key, f"{kind}\x1f{name}".encode(), hashlib.sha256).hexdigest()


@dataclass
class TurnTrace:
    """Timings of one reply, filled in by the pipeline as the stages finish (ms, monotonic).

    A recorder, not a value: the stages write it, the runtime reads it when the reply ends.
    It goes to the client (``response.timings``), so it holds figures of this reply only:
    nothing counted from other sessions (their number, queue positions, cache contents). The
    cache figures count blocks of the request's own scope (:class:`CacheSalts`).
    """

    endpoint_ms: float = 0.0  # end-of-turn decision
    asr_final_ms: float | None = None  # final transcript known
    llm_first_token_ms: float | None = None
    first_chunk_text_ms: float | None = None
    first_tts_ms: float | None = None  # the first audio of the first chunk synthesized
    first_audio_ms: float | None = None  # first non-silent frame sent
    cached_tokens: int = 0  # prefix-cache tokens reused by the reply's prompt
    prompt_tokens: int = 0
    prefill_cached_tokens: int = 0  # best warm-up hit while the user spoke
    early: bool = False  # begun at a pause, before the endpoint (server/conversation/early.py)

    def as_dict(self) -> dict[str, float | int | bool | None]:
        """Stage latencies in ms after the endpoint (0: done before it, by an early reply),
        the token counts, and whether the reply was an early one."""

        def since(t: float | None) -> float | None:
            return None if t is None else round(max(0.0, t - self.endpoint_ms), 1)

        return {
            "asr_final_ms": since(self.asr_final_ms),
            "llm_first_token_ms": since(self.llm_first_token_ms),
            "first_chunk_text_ms": since(self.first_chunk_text_ms),
            "first_tts_ms": since(self.first_tts_ms),
            "voice_to_voice_ms": since(self.first_audio_ms),
            "cached_tokens": self.cached_tokens,
            "prompt_tokens": self.prompt_tokens,
            "prefill_cached_tokens": self.prefill_cached_tokens,
            "early_reply": self.early,
        }


@dataclass(frozen=True)
class SpeechAudio:
    """A sentence's audio: int16 mono at 48 kHz, with word and phoneme timings (samples).

    Or a piece of it (``SpeaksInPieces``): its own audio, the sentence's timings in the first
    piece (none in later ones); ``last``: no piece follows."""

    pcm: npt.NDArray[np.int16]
    words: tuple[WordTiming, ...] = ()
    phonemes: tuple[PhonemeTiming, ...] = ()
    last: bool = True


@dataclass(frozen=True)
class Transcript:
    """What the recogniser heard, and the words it weighed in place of the last one, each with
    its probability (0-1; none where it does not tell): at a pause mid-sentence it often hears
    a word that ends no sentence as one that finishes it ("the" as "that")."""

    text: str
    last_word_rivals: Rivals = ()


class TurnPipeline(Protocol):
    """Engines behind the runtime (ASR, LLM, TTS); shared by every session."""

    async def transcribe(
        self, utterance: npt.NDArray[np.int16], tag: JobTag, prefix: str = ""
    ) -> str:
        """Final transcript of a 16 kHz mono utterance ("" when nothing was said). ``prefix``:
        words already decided for its start (stable partial words), which the recogniser may
        continue from instead of decoding them again."""
        ...

    async def partial_transcript(
        self, utterance: npt.NDArray[np.int16], tag: JobTag, prefix: str = ""
    ) -> Transcript:
        """Transcript of the utterance so far, while the user is still speaking."""
        ...

    async def prefill(self, request: ReplyRequest, *, paused: bool = False) -> int:
        """Push the context so far into the engine (prefix-cache warm-up); returns the number
        of prompt tokens that were already cached. ``paused``: the user's turn in progress
        (a ``CURRENT`` entry last) paused after its words, which may be all it says. Optional
        work: may raise ``engine_queue.ShedWork`` under load (and ``partial_transcript``
        too)."""
        ...

    def reply(self, request: ReplyRequest, trace: TurnTrace) -> AsyncIterator[ReplyPiece]:
        """The reply, one chunk text (sentence or clause) at a time, and each function call
        it makes (after the text before it)."""
        ...

    async def synthesize(self, text: str, conditions: Conditions, tag: JobTag) -> SpeechAudio:
        """Speech for one sentence in the voice of ``conditions``. ``tag`` says whose it is, so a
        shared engine can serve the session closest to an underrun first."""
        ...

    async def close(self) -> None:
        """Release engines at shutdown."""
        ...


@runtime_checkable
class SpeaksInPieces(Protocol):
    """A pipeline that gives a chunk's speech in pieces when the session needs it soon (the
    first piece sooner than the whole would come)."""

    def synthesize_pieces(
        self, text: str, conditions: Conditions, tag: JobTag
    ) -> AsyncGenerator[SpeechAudio, None]:
        """The speech of ``text`` as ``synthesize`` gives it, in one piece or several."""
        ...


@runtime_checkable
class QueueObservable(Protocol):
    """A pipeline whose shared engines report how long jobs waited for them, and whether they
    started past their deadline (``observe(engine, wait_ms, late)``)."""

    def set_queue_observer(self, observe: Callable[[str, float, bool], None]) -> None: ...


@runtime_checkable
class ReportsFallbacks(Protocol):
    """A pipeline whose recogniser falls back to another where one fails on a clip:
    ``observe(name)`` is told the one that failed (from an engine thread)."""

    def set_fallback_observer(self, observe: Callable[[str], None]) -> None: ...


@runtime_checkable
class SessionScoped(Protocol):
    """A pipeline whose shared engines keep per-session records (e.g. scheduling fairness);
    ``forget`` drops them once the session has ended."""

    def forget(self, session_id: str) -> None: ...


@runtime_checkable
class PrimedTranscripts(Protocol):
    """A pipeline whose recogniser can be told what was likely said: ``context`` is read as
    text said before the audio (Whisper's previous-text prompt), which steers its spelling."""

    async def transcribe_primed(
        self, utterance: npt.NDArray[np.int16], tag: JobTag, context: str
    ) -> str: ...


@runtime_checkable
class JudgesWords(Protocol):
    """A pipeline whose LLM tells how likely the user's words at a pause (the ``CURRENT``
    entry last) are a whole sentence: 0-1, None where it cannot tell."""

    async def sentence_end(self, request: ReplyRequest) -> float | None: ...


@runtime_checkable
class WarmsUp(Protocol):
    """A pipeline whose engines are slow on their first calls (allocations, kernel choices,
    caches): ``warm_up`` runs each once on a short input before the server says ready, and
    returns each stage's time (ms; None for a stage that failed, which is only logged)."""

    async def warm_up(self) -> dict[str, float | None]: ...


@runtime_checkable
class ReportsLoad(Protocol):
    """A pipeline that says when required work is in progress or waiting (optional work,
    such as idle avatar frames at full rate, is shed then)."""

    @property
    def busy(self) -> bool: ...


def engines_busy(pipeline: object) -> bool:
    """Whether ``pipeline`` reports required work (any session's): optional work waits."""
    return isinstance(pipeline, ReportsLoad) and pipeline.busy


async def one_piece(audio: SpeechAudio) -> AsyncGenerator[SpeechAudio, None]:
    """``audio`` (already made) as the only piece of its chunk."""
    yield audio


def speech_pieces(
    pipeline: TurnPipeline, text: str, conditions: Conditions, tag: JobTag
) -> AsyncGenerator[SpeechAudio, None]:
    """The speech of ``text``: in pieces where ``pipeline`` gives them, else whole."""
    if isinstance(pipeline, SpeaksInPieces):
        return pipeline.synthesize_pieces(text, conditions, tag)

    async def whole() -> AsyncGenerator[SpeechAudio, None]:
        yield await pipeline.synthesize(text, conditions, tag)

    return whole()


@runtime_checkable
class Tunable(Protocol):
    """A pipeline that takes settings chosen after it was built (the calibration's), and the
    share of the CPU its stages are expected to have in a conversation (``stage_share``: what
    its engines did alone at start takes 1 / this as long there)."""

    def tune(self, settings: PipelineConfig, stage_share: float = 1.0) -> None: ...


@runtime_checkable
class OnLadder(Protocol):
    """A pipeline whose LLM is a rung of the model ladder (``climb``; None: not climbed):
    the calibration times it (``warm_up_llm``, ms) and loads the next smaller one in its
    place (``load_next_rung``: False once the climb is over)."""

    climb: Climb | None

    async def warm_up_llm(self) -> dict[str, float | None]: ...

    async def load_next_rung(self) -> bool: ...


PipelineFactory = Callable[[Config], "TurnPipeline | Awaitable[TurnPipeline]"]


async def load_pipeline(config: Config) -> TurnPipeline | None:
    """Build the pipeline named by ``pipeline.factory`` (``module:function``, sync or async);
    None if unset (the server then listens only)."""
    spec = config.pipeline.factory
    if not spec:
        return None
    module_name, sep, attr = spec.partition(":")
    if not sep:
        raise ConfigError(f"pipeline.factory: expected 'module:function', got {spec!r}")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"pipeline.factory: cannot load {spec!r}: {exc}") from None
    built = cast(PipelineFactory, factory)(config)
    if inspect.isawaitable(built):
        return await built
    return built
