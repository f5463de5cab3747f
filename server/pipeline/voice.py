"""The voice pipeline: speech recognition, a language model and speech synthesis as one
:class:`~server.pipeline.seams.TurnPipeline`.

The engines are seams (structural Protocols in server/pipeline/engines.py): this module knows
no particular model.
CPU-heavy calls (ASR, TTS) run in worker threads, never on the event loop; the LLM streams.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import secrets
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from server.clock import Clock, MonotonicClock
from server.config import PipelineConfig, SchedulerConfig
from server.errors import RuntimeErrorBase
from server.pipeline.chunks import (
    FirstChunkCutter,
    SpeechTime,
    Splitter,
)
from server.pipeline.engines import (
    Asr,
    CallsTools,
    CrossChecks,
    FallsBack,
    JudgesSentenceEnd,
    Llm,
    Message,
    PrefillsOpenTurn,
    PrimedAsr,
    Releases,
    TakesSafetyNote,
    Tts,
    WeighsLastWord,
)
from server.pipeline.held import reply_text
from server.pipeline.ladder import Climb, load_next
from server.pipeline.repetition import loop_end
from server.pipeline.resample import resample
from server.pipeline.safety import with_safety_note
from server.pipeline.seams import (
    CacheSalts,
    ReplyPiece,
    ReplyRequest,
    ReplyStanding,
    SpeechAudio,
    Transcript,
    TurnTrace,
)
from server.pipeline.speaker import Speaker
from server.runtime.conditions import Conditions
from server.runtime.history import CacheClass, ContextEntry
from server.runtime.media import MEDIA_RATE_HZ
from server.runtime.session_view import SessionView
from server.runtime.stage import Stage
from server.runtime.tools import FunctionCall, ToolSettings
from server.scheduling.engine_queue import EngineQueue, JobTag, ShedWork
from server.scheduling.scheduler import make_scheduler

log = logging.getLogger(__name__)

# a Whisper tiny.en call on 2 cores of a fast machine, encoding the utterance and 1 s of silence
ASR_COST_FIXED_MS = 40.0
ASR_COST_MS_PER_S = 30.0  # per second of audio
SPEECH_MS_PER_CHAR = 6.0  # text to audio until measured: the joe voice, 2-core AVX2 host
WARM_UP_SESSION = "warm-up"  # the engine queues' name for the start-up calls
WARM_UP_SPEECH = "Hello there, how are you today?"
WARM_UP_MESSAGES: list[Message] = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello."},
]
# the same turn with the last words a call adds after its warm-up: a reply's prompt reads the
# words heard since the pause's warm-up and the assistant's header (7-13 tokens measured)
WARM_UP_TURN: list[Message] = [
    WARM_UP_MESSAGES[0],
    {"role": "user", "content": WARM_UP_MESSAGES[1]["content"] + " What is the capital of France?"},
]
T = TypeVar("T")


class LlmWarmUpEmpty(RuntimeErrorBase):
    """The LLM's warm-up request ended without any text."""

    code = "llm_warm_up_empty"


def to_messages(
    context: Sequence[ContextEntry], tools: ToolSettings | None = None
) -> list[Message]:
    """Context entries (anchor, recent window, current turn) as chat messages.

    With ``tools`` (an LLM that calls them), the system message carries them (``tools``: the
    chat template lists them in the prompt, the same in every request of the session, warm-ups
    included), a call is an assistant message's ``tool_calls`` (after the words of the reply
    that made it) and a call's output a ``tool`` message. Without, calls and outputs are left
    out: a model that cannot call tools is not shown any."""
    messages: list[Message] = []
    for entry in context:
        if entry.call is not None or entry.call_id:
            if tools is None:
                continue
            if entry.call_id:
                messages.append({"role": "tool", "content": entry.text})
                continue
            call = entry.call
            assert call is not None
            function = {"name": call.name, "arguments": call.arguments_object()}
            made = {"type": "function", "id": call.call_id, "function": function}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last["tool_calls"] = [*last.get("tool_calls", ()), made]
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [made]})
            continue
        messages.append({"role": entry.role.value, "content": entry.text})
    if tools is not None and tools.tools and messages and messages[0]["role"] == "system":
        messages[0] = {**messages[0], "tools": tools.as_chat()}
    return messages


async def _generator(stream: AsyncIterator[T]) -> AsyncGenerator[T, None]:
    """``stream`` as a generator whose closing closes it (the engine aborts the request)."""
    try:
        async for item in stream:
            yield item
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()


def new_call_id() -> str:
    """A call's id: random, so that it says nothing of other sessions or calls."""
    return f"call_{secrets.token_hex(8)}"


class VoicePipeline:
    """ASR -> LLM -> TTS behind the TurnPipeline seam, shared by every session.

    Every LLM request is salted (``salts``): a session shares cached prompt blocks only with
    the sessions of its owner (see :class:`~server.pipeline.seams.CacheSalts`).
    """

    def __init__(
        self,
        asr: Asr,
        llm: Llm,
        tts: Tts,
        splitter: Splitter,
        *,
        max_tokens: int,
        first_chunk_words: int,
        scheduler_config: SchedulerConfig | None = None,
        clock: Clock | None = None,
        salts: CacheSalts | None = None,
        engine_nice: int = 0,
        climb: Climb | None = None,
        load_llm: Callable[[str], Awaitable[Llm]] | None = None,
    ) -> None:
        """``engine_nice``: how much lower the ASR and TTS worker threads run than the event
        loop (the CPU plan's ``engine_nice``). ``climb``: the model ladder ``llm`` is the
        first loaded rung of, and ``load_llm`` loads another rung by name (the calibration
        climbs down with :meth:`load_next_rung`)."""
        self._asr = asr
        self._llm = llm
        self.climb = climb
        self._load_llm = load_llm
        self._tts = tts
        self._splitter = splitter
        self._max_tokens = max_tokens
        self._first_chunk_words = first_chunk_words
        config = scheduler_config or SchedulerConfig()
        self._clock = clock = clock or MonotonicClock()
        # each engine is one worker thread shared by all sessions, fed deadline first
        queue = functools.partial(EngineQueue, clock=clock, deadlines=config, nice=engine_nice)
        self.asr_queue = queue("asr", make_scheduler(config))
        self.tts_queue = queue("tts", make_scheduler(config))
        self._salts = salts or CacheSalts()
        # False: prefill() warms nothing (partial transcripts without LLM warm-ups: an ablation)
        self.warm_prefix = True
        self._ids = itertools.count(1)
        # request id -> its standing: replies being written
        self._writing: dict[str, ReplyStanding] = {}
        self.speech_time = SpeechTime(SPEECH_MS_PER_CHAR)  # from the warm-up, then each chunk
        self._speaker = Speaker(tts, self.tts_queue, clock, lambda: self.speech_time)

    def tune(self, settings: PipelineConfig, stage_share: float = 1.0) -> None:
        """Take the calibrated settings (the first chunk's length), and expect speech to be
        made at 1 / ``stage_share`` the pace of the warm-up's until a chunk measures it."""
        self._first_chunk_words = settings.first_chunk_words
        self._speaker.expect(stage_share)
        if isinstance(self._asr, CrossChecks):
            self._asr.cross_check = settings.asr_cross_check

    def asr_cost_ms(self, samples: int) -> float:
        """Expected time (ms) of one ASR call on ``samples`` of 16 kHz audio."""
        return ASR_COST_FIXED_MS + ASR_COST_MS_PER_S * samples / 16_000

    def set_fallback_observer(self, observe: Callable[[str], None]) -> None:
        """``observe(name)`` is told each time recogniser ``name`` failed on a clip and the
        other heard it instead (a recogniser without a second one has nothing to tell)."""
        if isinstance(self._asr, FallsBack):
            self._asr.set_fallback_observer(observe)

    def set_queue_observer(self, observe: Callable[[str, float, bool], None]) -> None:
        """``observe(engine, wait_ms, late)`` is called as each ASR/TTS job leaves its queue."""
        for queue in (self.asr_queue, self.tts_queue):
            queue.on_wait = functools.partial(observe, queue.name)

    def forget(self, session_id: str) -> None:
        """The session ended: the engine queues drop what their schedulers kept about it."""
        for queue in (self.asr_queue, self.tts_queue):
            queue.forget(session_id)

    async def transcribe(
        self, utterance: npt.NDArray[np.int16], tag: JobTag, prefix: str = ""
    ) -> str:
        return (await self._recognise(utterance, tag, prefix, optional=False)).text

    async def partial_transcript(
        self, utterance: npt.NDArray[np.int16], tag: JobTag, prefix: str = ""
    ) -> Transcript:
        """Optional work: raises ShedWork when dropped for required work."""
        return await self._recognise(utterance, tag, prefix, optional=True)

    async def transcribe_primed(
        self, utterance: npt.NDArray[np.int16], tag: JobTag, context: str
    ) -> str:
        """A transcript with ``context`` read as said before it (a recogniser that cannot be
        primed transcribes plainly)."""
        return (await self._recognise(utterance, tag, "", False, context=context)).text

    async def _recognise(
        self,
        utterance: npt.NDArray[np.int16],
        tag: JobTag,
        prefix: str,
        optional: bool,
        context: str = "",
    ) -> Transcript:
        """One ASR call through the shared queue; nothing for < 100 ms of audio (not a word). A
        partial (``optional``) has the words the recogniser weighed in place of its last one."""
        if len(utterance) < 1600:
            return Transcript("")
        asr = self._asr

        def job() -> Transcript:
            if context and isinstance(asr, PrimedAsr):
                return Transcript(asr.transcribe_after(utterance, context))
            if optional and isinstance(asr, WeighsLastWord):
                return Transcript(*asr.hear(utterance, prefix))
            return Transcript(asr.transcribe(utterance, prefix))

        cost_ms = self.asr_cost_ms(len(utterance))
        return await self.asr_queue.run(tag, Stage.ASR, cost_ms, job, optional=optional)

    @property
    def busy(self) -> bool:
        """Required work is in progress or waiting: a reply being written, or a final
        transcript or speech queued. Optional work (partials, prefix warm-ups, avatar frames
        at full rate while idle) is shed while it is."""
        queued = self.asr_queue.required_waiting + self.tts_queue.required_waiting
        return self._replying > 0 or queued > 0

    @property
    def _replying(self) -> int:
        """Replies being written, early ones too: optional work (warm-ups, another session's
        early reply) waits while they are."""
        return len(self._writing)

    async def _shed_held(self) -> None:
        """A reply someone waits for begins: early replies nobody has adopted yet
        (server/conversation/early.py) are optional work, so their requests end; the turn's
        own reply starts afresh if its turn ends on their words."""
        for rid, standing in list(self._writing.items()):
            if standing.shed_now():
                log.debug("reply %s: an early reply, shed for a reply someone waits for", rid)
                await self._llm.abort(rid)

    async def prefill(self, request: ReplyRequest, *, paused: bool = False) -> int:
        """Warm the prefix cache; a warm-up is an optimisation, so a failed one only logs, and
        it is shed (ShedWork) while a reply is being written: it would slow that reply.

        With the user's turn in progress (a ``CURRENT`` entry last), an LLM that can leaves
        that turn open (:class:`PrefillsOpenTurn`, told whether the user ``paused`` after
        those words): the reply's prompt then extends the warm-up's. Other LLMs get the whole
        prompt as it is now, whose blocks before the user's words are reused. Both are salted
        like the reply.
        """
        if not self.warm_prefix:
            return 0
        if self._replying:
            raise ShedWork("llm: prefix warm-up shed while a reply is written")
        rid = f"{request.session_id[:8]}-warm-{next(self._ids)}"
        salt = self._salts.of(request)
        open_turn = bool(request.context) and request.context[-1].cache_class is CacheClass.CURRENT
        try:
            messages = self._messages(request)
            if open_turn and isinstance(self._llm, PrefillsOpenTurn):
                stats = await self._llm.prefill_open(messages, rid, cache_salt=salt, paused=paused)
            else:
                stats = await self._llm.prefill(messages, rid, cache_salt=salt)
        except Exception as exc:
            log.warning("warm-up %s failed: %s: %s", rid, type(exc).__name__, exc)
            return 0
        return int(stats.cached_tokens)

    async def sentence_end(self, request: ReplyRequest) -> float | None:
        """How likely the user's words at a pause (the ``CURRENT`` entry last) are a whole
        sentence (0-1), by the LLM (:class:`JudgesSentenceEnd`); None where it cannot tell or
        failed (only logged). Not shed: the end of the user's turn waits for it."""
        if not isinstance(self._llm, JudgesSentenceEnd):
            return None
        salt = self._salts.of(request)
        try:
            messages = self._messages(request)
            return await self._llm.sentence_end_probability(messages, cache_salt=salt)
        except Exception as exc:
            log.warning("sentence-end verdict failed: %s: %s", type(exc).__name__, exc)
            return None

    def _calls_tools(self, request: ReplyRequest) -> bool:
        """Whether the request offers tools to an LLM that can call them."""
        llm = self._llm
        return bool(request.tools.tools) and isinstance(llm, CallsTools) and llm.calls_tools

    def _messages(self, request: ReplyRequest) -> list[Message]:
        return to_messages(request.context, request.tools if self._calls_tools(request) else None)

    def _stream(
        self, request: ReplyRequest, rid: str, salt: str
    ) -> AsyncGenerator[str | Any, None]:
        """The LLM's deltas (and calls, where the request offers tools to an LLM that calls
        them; such a reply is not held while paused). A turn that names a hazard gets the
        safety note after it, where the model follows it (server/pipeline/safety.py)."""
        messages = self._messages(request)
        if isinstance(self._llm, TakesSafetyNote) and self._llm.takes_safety_note:
            messages = with_safety_note(messages)
        if self._calls_tools(request):
            assert isinstance(self._llm, CallsTools)
            stream = self._llm.stream_tools(
                messages,
                rid,
                self._max_tokens,
                tools=request.tools.as_chat(),
                choice=request.tools.choice.for_engine(),
                cache_salt=salt,
            )
            return _generator(stream)
        if request.tools.callable:
            log.info("reply %s: this LLM calls no tools; it only talks", rid)
        return reply_text(self._llm, messages, rid, self._max_tokens, salt, request.view)

    async def reply(self, request: ReplyRequest, trace: TurnTrace) -> AsyncIterator[ReplyPiece]:
        rid = f"{request.session_id[:8]}-e{request.epoch}-{next(self._ids)}"
        view = request.view
        starving = None if view is None else self._starving(view)
        cutter = FirstChunkCutter(self._splitter, self._first_chunk_words, starving)
        salt = self._salts.of(request)
        stream = self._stream(request, rid, salt)
        standing = request.standing or ReplyStanding()
        if not standing.held:
            await self._shed_held()
        self._writing[rid] = standing
        said = ""
        try:
            async for delta in stream:
                if trace.llm_first_token_ms is None:
                    trace.llm_first_token_ms = self._clock.now_ms()
                if not isinstance(delta, str):  # a call: the words before it go first
                    for chunk in cutter.flush():
                        yield chunk
                    yield FunctionCall(new_call_id(), delta.name, delta.arguments)
                    continue
                said += delta
                if (end := loop_end(said)) is not None:
                    log.info("reply %s repeats itself: it ends after the first saying", rid)
                    cutter.end_with(said[:end], len(said) - len(delta))
                    break
                for chunk in cutter.feed(delta):
                    if trace.first_chunk_text_ms is None:
                        trace.first_chunk_text_ms = self._clock.now_ms()
                    yield chunk
            if standing.shed:  # aborted: what it wrote is no reply
                raise ShedWork(f"llm: early reply {rid} shed")
            for chunk in cutter.flush():
                if trace.first_chunk_text_ms is None:
                    trace.first_chunk_text_ms = self._clock.now_ms()
                yield chunk
        finally:
            self._writing.pop(rid, None)
            if cutter.starved_cuts:
                log.debug(
                    "reply %s: %d chunks cut short, the playback running low",
                    rid,
                    cutter.starved_cuts,
                )
            await stream.aclose()  # a cancelled reply aborts its request
            stats = self._llm.last_stats(rid)
            if stats is not None:
                trace.cached_tokens = int(stats.cached_tokens)
                trace.prompt_tokens = int(stats.prompt_tokens)

    def _starving(self, view: Callable[[], SessionView]) -> Callable[[str], bool]:
        """Whether ``words`` must go to speech now: the audio queued ahead of the session's
        playback cursor would run out before they are spoken (the margin, and the time
        speech takes to make here lately)."""

        def starving(words: str) -> bool:
            return self.speech_time.runs_dry(view().slack_ms, words)

        return starving

    async def synthesize(self, text: str, conditions: Conditions, tag: JobTag) -> SpeechAudio:
        return await self._speaker.whole(text, tag)

    def synthesize_pieces(
        self, text: str, conditions: Conditions, tag: JobTag
    ) -> AsyncGenerator[SpeechAudio, None]:
        return self._speaker.pieces(text, tag)

    async def warm_up(self) -> dict[str, float | None]:
        """The engines' first calls, through their queues, before the server says ready: the
        TTS says a short sentence (``tts_first_ms``: its first piece, where it gives pieces),
        the ASR transcribes it (three times), the LLM writes a few tokens. The TTS says it
        twice, and the second (warm) call's times count (``tts_cold_ms``: the first's; a first
        call's allocations made its first piece 84-141 ms in the slow profile). Times in ms, and
        what they were measured on (``tts_audio_ms``,
        ``asr_audio_ms``, ``llm_first_token_ms``, ``llm_tokens_per_s``: the calibration's
        inputs; the first token is a reply's whose prompt the cache holds but for the turn's
        last words, as after a warm-up in a call); a stage that fails is logged and reported
        as None (the server still starts)."""
        tag = JobTag(WARM_UP_SESSION, 0, lambda: SessionView(WARM_UP_SESSION, 0, 0.0, 1.0))
        times: dict[str, float | None] = {}
        await self._timed(times, "tts_cold_ms", self._speaker.warm_up(WARM_UP_SPEECH, tag))
        spoken = await self._timed(times, "tts_ms", self._speaker.warm_up(WARM_UP_SPEECH, tag))
        speech, times["tts_first_ms"] = (None, None) if spoken is None else spoken
        if times["tts_ms"] is not None:
            self.speech_time = SpeechTime(times["tts_ms"] / len(WARM_UP_SPEECH))
        pcm = np.zeros(16_000, np.int16)  # at least 1 s at 16 kHz, so that the ASR runs
        if speech is not None:
            said = resample(np.asarray(speech.pcm, np.int16), MEDIA_RATE_HZ, 16_000)
            pcm = np.concatenate([said, pcm[len(said) :]])
        # CTranslate2 settles only after a few calls of different lengths (measured: the first
        # conversation's final transcript took 444 ms against 130-230 ms later)
        half = pcm[: max(1600, len(pcm) // 2)]
        for key, clip in (("asr_ms", pcm), ("asr_half_ms", half), ("asr_again_ms", pcm)):
            await self._timed(times, key, self.transcribe(clip, tag))
        await self._timed(times, "asr_partial_ms", self.partial_transcript(pcm, tag))
        times["asr_audio_ms"] = len(pcm) / 16
        times["tts_audio_ms"] = None if speech is None else len(speech.pcm) / (MEDIA_RATE_HZ / 1000)
        self.forget(WARM_UP_SESSION)
        times.update(await self.warm_up_llm())
        return times

    async def warm_up_llm(self) -> dict[str, float | None]:
        """The LLM's part of :meth:`warm_up` (also for a model the ladder loads later): its
        first request, its steady speed (``llm_tokens_per_s``) and a reply's first token
        (``llm_first_token_ms``); times in ms, None where a request failed."""
        times: dict[str, float | None] = {}
        await self._timed(times, "llm_ms", self._drain(WARM_UP_MESSAGES, 4))
        # the second request: the engine's steady speed (tokens a second)
        rate = await self._timed(times, "llm_again_ms", self._drain(WARM_UP_MESSAGES, 16))
        times["llm_tokens_per_s"] = None if rate is None else rate[1]
        # the third: a reply's first token, its prompt cached but for the turn's last words
        turn = await self._timed(times, "llm_turn_ms", self._drain(WARM_UP_TURN, 1))
        times["llm_first_token_ms"] = None if turn is None else turn[0]
        return times

    async def load_next_rung(self) -> bool:
        """Load the ladder's next model in place of the LLM held now (closed once the new one
        has loaded); False when the climb is over (or there is no ladder)."""
        if self.climb is None or self._load_llm is None:
            return False
        engine = await load_next(self.climb, self._load_llm)
        if engine is None:
            return False
        old, self._llm = self._llm, engine
        await old.close()
        return True

    async def _timed(
        self, times: dict[str, float | None], key: str, call: Awaitable[T]
    ) -> T | None:
        """Await a warm-up call; its time (ms) goes to ``times[key]``, or None if it failed."""
        started = self._clock.now_ms()
        try:
            result = await call
        except Exception as exc:
            log.warning("warm-up %s failed: %s: %s", key, type(exc).__name__, exc)
            times[key] = None
            return None
        times[key] = self._clock.now_ms() - started
        return result

    async def _drain(
        self, messages: Sequence[Message], max_tokens: int
    ) -> tuple[float, float | None]:
        """One LLM request of the warm-up, its text read and dropped. Returns the time to its
        first text (ms) and the text pieces a second after that (None: only one piece)."""
        started = self._clock.now_ms()
        first: float | None = None
        pieces = 0
        salt = self._salts.internal(WARM_UP_SESSION)
        async for _ in self._llm.stream(messages, WARM_UP_SESSION, max_tokens, cache_salt=salt):
            first = self._clock.now_ms() if first is None else first
            pieces += 1
        if first is None:
            raise LlmWarmUpEmpty("the LLM wrote nothing")
        rest_ms = self._clock.now_ms() - first
        rate = (pieces - 1) / rest_ms * 1000 if pieces > 1 and rest_ms > 0 else None
        return first - started, rate

    async def close(self) -> None:
        await self._llm.close()
        await self.asr_queue.close()
        await self.tts_queue.close()
        for engine in (self._asr, self._tts):
            if isinstance(engine, Releases):
                await asyncio.to_thread(engine.shutdown)
