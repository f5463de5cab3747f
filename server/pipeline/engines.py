"""What the voice pipeline (server/pipeline/voice.py) needs of its engines: structural
Protocols that models/ satisfies without knowing them (models.asr, models.llm, models.tts)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

Message = dict[str, Any]  # role, content; an assistant's tool_calls, a system one's tools
Rivals = tuple[tuple[str, float], ...]  # words weighed in place of a text's last one, with p


class Asr(Protocol):
    def transcribe(self, pcm: npt.NDArray[np.int16], prefix: str = "") -> str: ...


@runtime_checkable
class WeighsLastWord(Protocol):
    """A recogniser that also tells the words it weighed in place of the text's last one, each
    with its probability (models.asr)."""

    def hear(self, pcm: npt.NDArray[np.int16], prefix: str = "") -> tuple[str, Rivals]: ...


@runtime_checkable
class CrossChecks(Protocol):
    """A recogniser whose final transcripts two models may hear and check against each other
    (models.moonshine's pair); ``cross_check`` turns it on or off."""

    cross_check: bool


@runtime_checkable
class FallsBack(Protocol):
    """A recogniser that hands a clip to another where one fails (models.moonshine's pair):
    ``observe(name)`` is told which one failed, in the thread that called it."""

    def set_fallback_observer(self, observe: Callable[[str], None]) -> None: ...


@runtime_checkable
class PrimedAsr(Protocol):
    """A recogniser that reads ``context`` as said before the audio (models.asr.WhisperAsr)."""

    def transcribe_after(self, pcm: npt.NDArray[np.int16], context: str) -> str: ...


class Llm(Protocol):
    """models.llm.LlmEngine as this module uses it (``cache_salt``: the prefix-cache scope)."""

    def stream(
        self,
        messages: Sequence[Message],
        request_id: str,
        max_tokens: int,
        *,
        cache_salt: str | None = None,
    ) -> AsyncIterator[str]: ...

    async def prefill(
        self, messages: Sequence[Message], request_id: str, *, cache_salt: str | None = None
    ) -> Any: ...

    async def abort(self, request_id: str) -> None: ...

    def last_stats(self, request_id: str) -> Any: ...

    async def close(self) -> None: ...


class CallLike(Protocol):
    """A function call an LLM made (models.tool_calls.ToolCall): its arguments are a JSON
    object's text, valid for the tool's schema."""

    @property
    def name(self) -> str: ...

    @property
    def arguments(self) -> str: ...


@runtime_checkable
class CallsTools(Protocol):
    """An LLM that calls functions (models.llamacpp.LlamaCppEngine.stream_tools): the reply's
    text deltas, and each call it makes, its arguments held to the tool's schema. ``tools``:
    chat-template tools; ``choice``: auto, none, required or a function's name.
    ``calls_tools``: whether the model it runs has a format for calls (SmolLM2's template has
    none: it is offered no tools, and only talks)."""

    @property
    def calls_tools(self) -> bool: ...

    def stream_tools(
        self,
        messages: Sequence[Message],
        request_id: str,
        max_tokens: int,
        *,
        tools: Sequence[dict[str, Any]],
        choice: str = "auto",
        cache_salt: str | None = None,
    ) -> AsyncIterator[str | CallLike]: ...


@runtime_checkable
class TakesSafetyNote(Protocol):
    """An LLM whose model follows a system message after the user's words (the safety note,
    server/pipeline/safety.py) instead of reading it aloud, as small models do."""

    @property
    def takes_safety_note(self) -> bool: ...


@runtime_checkable
class HoldsReplies(Protocol):
    """An LLM whose reply can stop where it is and go on later: its text after ``said`` (the
    reply's words so far), until it ends or ``hold()`` turns true, checked at every token in
    an engine thread (models.llamacpp.LlamaCppEngine.stream_held; its finish reason is then
    "held")."""

    def stream_held(
        self,
        messages: Sequence[Message],
        said: str,
        request_id: str,
        max_tokens: int,
        *,
        hold: Callable[[], bool],
        cache_salt: str | None = None,
    ) -> AsyncIterator[str]: ...


@runtime_checkable
class PrefillsOpenTurn(Protocol):
    """An LLM that warms the prefix cache with a chat whose last message is still being
    said: the prompt stops inside it, a token prefix of the reply's prompt once it is said
    (models.llm_vllm.VllmEngine.prefill_open). ``paused``: the user paused after these words, so
    they may be all the message says (an engine may then open the reply's turn too)."""

    async def prefill_open(
        self,
        messages: Sequence[Message],
        request_id: str,
        *,
        cache_salt: str | None = None,
        paused: bool = False,
    ) -> Any: ...


@runtime_checkable
class JudgesSentenceEnd(Protocol):
    """An LLM that says how likely the user's last message, its final mark taken away, is a
    whole sentence (models.llamacpp.LlamaCppEngine.sentence_end_probability: 0-1)."""

    async def sentence_end_probability(
        self, messages: Sequence[Message], *, cache_salt: str | None = None
    ) -> float: ...


class WordLike(Protocol):
    @property
    def word(self) -> str: ...

    @property
    def start(self) -> int: ...

    @property
    def end(self) -> int: ...


class SpeechLike(Protocol):
    @property
    def pcm(self) -> npt.NDArray[np.int16]: ...

    @property
    def words(self) -> Sequence[WordLike]: ...

    @property
    def phonemes(self) -> Sequence[tuple[str, int, int]]: ...


class Tts(Protocol):
    def synthesize(self, text: str) -> SpeechLike: ...


class SpeechPieceLike(SpeechLike, Protocol):
    """A piece of a text's speech: its own audio; the first piece has the whole text's
    timings, later ones none. ``last``: no piece follows."""

    @property
    def last(self) -> bool: ...


@runtime_checkable
class TtsInPieces(Protocol):
    """A TTS that gives a text's speech in pieces, each as soon as it is made
    (models.tts.OnnxVoiceTts: the first after a quarter of a second of audio or more is
    decoded). ``pace``: how long speech took to make lately over its duration, waits for the
    engine included (None: not known); the engine sizes the pieces so that each is made
    before the audio before it plays out, or gives one piece. Each ``next`` is one
    synchronous, CPU-bound step."""

    def pieces(self, text: str, pace: float | None) -> Iterator[SpeechPieceLike]: ...


@runtime_checkable
class Releases(Protocol):
    """An engine that holds a thread of its own (models.tts.OnnxVoiceTts: gruut's):
    ``shutdown`` ends it, blocking until a call in progress is done."""

    def shutdown(self) -> None: ...
