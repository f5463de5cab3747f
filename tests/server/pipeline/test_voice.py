"""The voice pipeline's own logic: chunking streamed text, prompts, the TTS seam."""

from __future__ import annotations

import asyncio
import functools
import threading
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from models.tts import OnnxVoiceTts, TtsError, split_sentences
from server.config import Config
from server.conversation.conversation import Conversation
from server.conversation.partial_words import ended_early, heard_more, partial_due, stable_words
from server.http.auth import token_digest
from server.metrics import Metrics
from server.owner import NO_OWNER
from server.pipeline.chunks import STARVING_MIN_WORDS, FirstChunkCutter, SpeechTime
from server.pipeline.engines import PrefillsOpenTurn
from server.pipeline.seams import (
    CacheSalts,
    ReplyRequest,
    ReplyStanding,
    SessionScoped,
    TurnTrace,
    WarmsUp,
)
from server.pipeline.voice import VoicePipeline, to_messages
from server.runtime.conditions import Conditions
from server.runtime.history import CacheClass, ContextEntry, Role
from server.runtime.session_view import SessionView
from server.scheduling.engine_queue import JobTag, ShedWork
from server.scheduling.scheduler import DeadlineScheduler
from tests.support.detectors import deaf_detector
from tests.support.stand_ins import stand_in_pipeline


def feed_all(cutter: FirstChunkCutter, text: str, step: int = 3) -> list[str]:
    out: list[str] = []
    for i in range(0, len(text), step):
        out += cutter.feed(text[i : i + step])
    return out + cutter.flush()


def test_first_chunk_is_cut_early_then_whole_sentences() -> None:
    text = "Paris is the capital and the largest city of France. It has many museums. Enjoy!"
    chunks = feed_all(FirstChunkCutter(split_sentences, first_words=4), text)
    assert chunks[0] == "Paris is the capital"
    assert chunks[1:] == ["and the largest city of France.", "It has many museums.", "Enjoy!"]
    assert " ".join(chunks) == text


def test_a_short_first_sentence_is_not_cut() -> None:
    chunks = feed_all(FirstChunkCutter(split_sentences, first_words=6), "Yes. I can help you.")
    assert chunks == ["Yes.", "I can help you."]


def test_later_chunks_go_to_speech_early_only_while_the_playback_would_run_dry() -> None:
    text = "Paris is the capital and the largest city of France, on the Seine. It has museums."
    plenty = FirstChunkCutter(split_sentences, first_words=4, starving=lambda words: False)
    assert feed_all(plenty, text) == [
        "Paris is the capital",
        "and the largest city of France, on the Seine.",
        "It has museums.",
    ]
    assert plenty.starved_cuts == 0
    asked: list[str] = []

    def starving(words: str) -> bool:
        asked.append(words)
        return True

    running_dry = FirstChunkCutter(split_sentences, first_words=4, starving=starving)
    # each early cut holds the complete words written so far, at least three of them; a
    # sentence (or clause) that ends before that is cut where it ends
    chunks = feed_all(running_dry, text, step=2)
    assert chunks == [
        "Paris is the capital",
        "and the largest",
        "city of France,",
        "on the Seine.",
        "It has museums.",
    ]
    assert running_dry.starved_cuts == 2
    assert all(len(chunk.split()) >= STARVING_MIN_WORDS for chunk in chunks[1:3])
    # it is asked about the words it would cut, and only once there are enough of them
    assert asked[:2] == ["and the largest", "city of France,"]
    assert all(len(words.split()) >= STARVING_MIN_WORDS for words in asked)


def test_speech_time_follows_what_chunks_took_lately() -> None:
    speech = SpeechTime(ms_per_char=6.0)
    assert speech.expected_ms(20) == 120.0
    for _ in range(12):  # two sessions now share the speech engine: chunks take longer
        speech.observe(chars=20, elapsed_ms=400.0)
    assert 19.0 < speech.ms_per_char <= 20.0
    speech.observe(chars=0, elapsed_ms=50.0)  # nothing said: nothing learnt
    assert 19.0 < speech.ms_per_char <= 20.0
    for _ in range(12):
        speech.observe(chars=40, elapsed_ms=200.0)
    assert 5.0 <= speech.ms_per_char < 6.0


def test_context_becomes_chat_messages() -> None:
    context = (
        ContextEntry(CacheClass.ANCHOR, Role.SYSTEM, "persona"),
        ContextEntry(CacheClass.RECENT, Role.USER, "hi"),
        ContextEntry(CacheClass.RECENT, Role.ASSISTANT, "hello"),
        ContextEntry(CacheClass.CURRENT, Role.USER, "how are"),
    )
    assert to_messages(context) == [
        {"role": "system", "content": "persona"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "how are"},
    ]


@pytest.mark.parametrize(
    ("previous", "current", "agreed"),
    [
        ("", "hello", ""),
        ("hello", "hello world", "hello"),
        ("the weather is", "The weather is sunny", "The weather is"),
        ("Hello, world", "hello world.", "hello world."),
        ("I want to go", "I want two goats", "I want"),
        ("open the kitch", "open the kitchen", "open the"),
        ("same words here", "same words here", "same words here"),
        ("different start", "another start", ""),
        ("it's fine", "Its fine", "Its fine"),
    ],
)
def test_stable_words(previous: str, current: str, agreed: str) -> None:
    assert stable_words(previous, current) == agreed


def test_a_decode_that_heard_fewer_words_than_the_last_partial_ended_early() -> None:
    stable, before = (
        "What is the difference between a frog",
        "What is the difference between a frog and a",
    )
    assert ended_early(stable, "What is the difference between a frog?", before)
    assert not ended_early(stable, "What is the difference between a frog and a toad?", before)
    assert not ended_early("", "What is", before)  # nothing was given to end after
    assert not ended_early("Tell me", "Tell me a story.", "Tell me a story")
    # the one without the stable words is kept only where it heard more
    assert heard_more("What is the difference between a frog and a toad?", "... a frog?")
    assert not heard_more("What is the difference?", "What is the difference between?")
    assert not heard_more("Tell me a story.", "Tell me a story")


async def test_synthesized_chunks_carry_word_and_phoneme_timings() -> None:
    class NoLlm:  # synthesize does not touch the LLM
        async def close(self) -> None:
            pass

    threads_before = set(threading.enumerate())
    voice = OnnxVoiceTts()
    pipeline = VoicePipeline(
        None,  # type: ignore[arg-type]
        NoLlm(),  # type: ignore[arg-type]
        voice,
        split_sentences,
        max_tokens=10,
        first_chunk_words=6,
    )
    try:
        tag = JobTag("s", 0, lambda: SessionView("s", 0, 0.0, 2000.0))
        audio = await pipeline.synthesize(
            "The weather is lovely today.", Conditions("p", "joe", "a"), tag
        )
    finally:
        await pipeline.close()
    # the voice's own thread (gruut's) ends with the pipeline
    assert not [
        t for t in set(threading.enumerate()) - threads_before if t.name.startswith("gruut")
    ]
    with pytest.raises(TtsError):
        voice.synthesize("Closed.")
    assert audio.pcm.dtype == np.int16 and len(audio.pcm) > 48_000 * 0.5
    assert [w.word.strip(".") for w in audio.words] == ["The", "weather", "is", "lovely", "today"]
    assert audio.phonemes[0].start == 0 and audio.phonemes[-1].end == len(audio.pcm)
    assert all(a.end == b.start for a, b in zip(audio.phonemes, audio.phonemes[1:], strict=False))


class _Speech:
    pcm = np.zeros(480, np.int16)
    words: tuple[()] = ()
    phonemes: tuple[()] = ()


class _Engines:
    """ASR and TTS that answer at once; the LLM side only closes."""

    def transcribe(self, pcm: object, prefix: str = "") -> str:
        return "hi"

    def synthesize(self, text: str) -> _Speech:
        return _Speech()

    async def close(self) -> None:
        pass


def _served(pipeline: VoicePipeline) -> list[set[str]]:
    """The sessions each engine queue's scheduler keeps a fairness record of."""
    out = []
    for queue in (pipeline.asr_queue, pipeline.tts_queue):
        scheduler = queue._scheduler
        assert isinstance(scheduler, DeadlineScheduler)
        out.append(set(scheduler.served))
    return out


def _pipeline(engines: _Engines) -> VoicePipeline:
    """The real pipeline on stand-in engines (``engines`` is also the LLM)."""
    return stand_in_pipeline(engines)


async def test_a_closed_peer_is_forgotten_by_the_shared_engine_queues() -> None:
    engines = _Engines()
    pipeline = _pipeline(engines)
    assert isinstance(pipeline, SessionScoped)
    sid = "p" * 32
    no_detector = deaf_detector()  # a peer that never connects hears nothing
    peer = Conversation(sid, Config(), no_detector, pipeline, Metrics())
    try:
        for session in (sid, "live"):
            tag = JobTag(session, 0, functools.partial(SessionView, session, 0, 0.0, 2000.0))
            assert await pipeline.transcribe(np.zeros(1600, np.int16), tag) == "hi"
            await pipeline.synthesize("Hi.", Conditions("p", "joe", "a"), tag)
        assert _served(pipeline) == [{sid, "live"}, {sid, "live"}]
        await peer.close()
        assert _served(pipeline) == [{"live"}, {"live"}]
    finally:
        await peer.close()
        await pipeline.close()


class _WarmEngines(_Engines):
    """Records the start-up calls; its LLM writes two tokens, or fails when told to."""

    def __init__(self, llm_fails: bool = False) -> None:
        self.calls: list[str] = []
        self.prompts: list[list[Any]] = []
        self.llm_fails = llm_fails

    def transcribe(self, pcm: object, prefix: str = "") -> str:
        self.calls.append("asr")
        return super().transcribe(pcm, prefix)

    def synthesize(self, text: str) -> _Speech:
        self.calls.append("tts")
        return super().synthesize(text)

    async def stream(
        self, messages: Any, request_id: str, max_tokens: int, *, cache_salt: str | None = None
    ) -> Any:
        self.calls.append("llm")
        self.prompts.append(list(messages))
        if self.llm_fails:
            raise ConnectionError("no replica answered")
        for token in ("Hi", "!"):
            yield token


@pytest.mark.parametrize("llm_fails", [False, True])
async def test_warm_up_calls_every_engine_and_survives_a_failure(llm_fails: bool) -> None:
    engines = _WarmEngines(llm_fails)
    pipeline = _pipeline(engines)
    try:
        assert isinstance(pipeline, WarmsUp)
        times = await pipeline.warm_up()
    finally:
        await pipeline.close()
    # speech first (twice: the second, warm, call is the one timed), then its transcript
    # (padded to 1 s: the stub's speech is 10 ms) three times as a final and once as a partial
    assert engines.calls == ["tts", "tts", "asr", "asr", "asr", "asr", "llm", "llm", "llm"]
    assert times["tts_ms"] is not None and times["tts_cold_ms"] is not None
    assert times["asr_ms"] is not None and times["asr_partial_ms"] is not None
    assert (times["llm_ms"] is None) == llm_fails
    # the calibration's inputs: the second request's speed, and the third's first token (the
    # turn with words added after the cached prompt)
    assert (times["llm_first_token_ms"] is None) == llm_fails
    assert (times["llm_turn_ms"] is None) == llm_fails
    assert engines.prompts[-1][-1]["content"].startswith(engines.prompts[-2][-1]["content"])
    assert len(engines.prompts[-1][-1]["content"]) > len(engines.prompts[-2][-1]["content"])
    assert times["llm_tokens_per_s"] is None or times["llm_tokens_per_s"] > 0
    assert times["asr_audio_ms"] == 1000.0  # the stub's speech, padded to 1 s
    assert _served(pipeline) == [set(), set()]  # the warm-up leaves no session record behind


class _HeldLlm(_Engines):
    """An LLM whose reply holds after its first piece until ``release`` is set."""

    def __init__(self) -> None:
        self.writing = asyncio.Event()
        self.release = asyncio.Event()
        self.prefills = 0

    async def stream(
        self, messages: Any, request_id: str, max_tokens: int, *, cache_salt: str | None = None
    ) -> Any:
        self.writing.set()
        yield "Hello"
        await self.release.wait()
        yield " there."

    async def prefill(
        self, messages: Any, request_id: str, *, cache_salt: str | None = None
    ) -> Any:
        self.prefills += 1
        return SimpleNamespace(cached_tokens=0)

    def last_stats(self, request_id: str) -> None:
        return None


async def test_prefix_warm_ups_are_shed_while_a_reply_is_written() -> None:
    engines = _HeldLlm()
    pipeline = _pipeline(engines)
    request = ReplyRequest("s" * 32, 0, (), Conditions("p", "joe", "a"))
    try:
        assert await pipeline.prefill(request) == 0 and engines.prefills == 1
        assert not pipeline.busy

        async def consume() -> list[str]:
            return [str(chunk) async for chunk in pipeline.reply(request, TurnTrace(endpoint_ms=0))]

        reply = asyncio.create_task(consume())
        await asyncio.wait_for(engines.writing.wait(), 5)
        assert pipeline.busy
        with pytest.raises(ShedWork):
            await pipeline.prefill(request)
        assert engines.prefills == 1  # the engine never saw it
        engines.release.set()
        assert "".join(await reply) == "Hello there."
        assert not pipeline.busy
        await pipeline.prefill(request)
        assert engines.prefills == 2
    finally:
        await pipeline.close()


class _AbortingLlm(_HeldLlm):
    """The held LLM, whose ``abort`` ends a request's stream where it holds."""

    def __init__(self) -> None:
        super().__init__()
        self.aborted: list[str] = []
        self._ended: dict[str, asyncio.Event] = {}

    async def stream(
        self, messages: Any, request_id: str, max_tokens: int, *, cache_salt: str | None = None
    ) -> Any:
        ended = self._ended.setdefault(request_id, asyncio.Event())
        self.writing.set()
        yield "Hello"
        waits = [asyncio.ensure_future(e.wait()) for e in (self.release, ended)]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        if not ended.is_set():
            yield " there."

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self._ended.setdefault(request_id, asyncio.Event()).set()


async def test_a_reply_someone_waits_for_sheds_a_held_early_reply() -> None:
    engines = _AbortingLlm()
    pipeline = _pipeline(engines)
    conditions = Conditions("p", "joe", "a")
    early = ReplyStanding(held=True)
    mine, theirs = (
        ReplyRequest("s" * 32, 0, (), conditions, standing=early),
        ReplyRequest("t" * 32, 0, (), conditions),
    )

    async def consume(request: ReplyRequest, trace: TurnTrace) -> str:
        return "".join([str(chunk) async for chunk in pipeline.reply(request, trace)])

    try:
        held = asyncio.create_task(consume(mine, TurnTrace(endpoint_ms=0, early=True)))
        await asyncio.wait_for(engines.writing.wait(), 5)
        # it sheds other optional work, as a reply does
        assert pipeline.busy
        with pytest.raises(ShedWork):
            await pipeline.prefill(theirs)
        wanted = asyncio.create_task(consume(theirs, TurnTrace(endpoint_ms=0)))
        with pytest.raises(ShedWork):
            await asyncio.wait_for(held, 5)  # what it wrote is no reply
        assert early.shed and engines.aborted == [f"{'s' * 8}-e0-1"]
        engines.release.set()
        assert await asyncio.wait_for(wanted, 5) == "Hello there."
    finally:
        await pipeline.close()


def test_cache_salts_scope_owners_or_sessions_and_hide_both() -> None:
    salts = CacheSalts(b"k" * 32)
    ctx: tuple[ContextEntry, ...] = ()
    conditions = Conditions("p", "joe", "a")
    alice, bob = token_digest("alice-token-0123456789"), token_digest("bob-token-0123456789")

    def salt(session: str, owner: str = NO_OWNER) -> str:
        return salts.of(ReplyRequest(session, 0, ctx, conditions, owner=owner))

    assert salt("s1") != salt("s2")  # no authentication: a scope per session
    assert salt("s1", alice) == salt("s2", alice) != salt("s1", bob)  # a scope per token
    assert salt("s1") == salt("s1") and salt("s1") != salts.internal("s1")
    assert CacheSalts(b"j" * 32).of(ReplyRequest("s1", 0, ctx, conditions)) != salt("s1")
    assert CacheSalts().internal("x") != CacheSalts().internal("x")  # a random key each
    for value in (salt("s" * 32), salt("s1", alice)):
        assert len(value) == 64 and int(value, 16) >= 0  # 256 bits, hex: vLLM takes it
        assert "s" * 32 not in value and alice[:16] not in value


class _SaltedLlm(_HeldLlm):
    """Records the cache salt of each LLM call: (what, salt)."""

    def __init__(self) -> None:
        super().__init__()
        self.release.set()
        self.salts: list[tuple[str, str | None]] = []

    async def stream(
        self, messages: Any, request_id: str, max_tokens: int, *, cache_salt: str | None = None
    ) -> Any:
        self.salts.append(("stream", cache_salt))
        yield "Hi."

    async def prefill(
        self, messages: Any, request_id: str, *, cache_salt: str | None = None
    ) -> Any:
        self.salts.append(("prefill", cache_salt))
        return await super().prefill(messages, request_id)

    async def abort(self, request_id: str) -> None:
        pass


async def test_every_llm_call_is_salted_with_its_requests_scope() -> None:
    engines = _SaltedLlm()
    salts = CacheSalts(b"k" * 32)
    pipeline = VoicePipeline(
        engines, engines, engines, split_sentences, max_tokens=4, first_chunk_words=6, salts=salts
    )
    owned = ReplyRequest("s" * 32, 0, (), Conditions("p", "joe", "a"), owner="d" * 64)
    try:
        await pipeline.prefill(owned)
        assert [c async for c in pipeline.reply(owned, TurnTrace(endpoint_ms=0))] == ["Hi."]
        await pipeline.warm_up()
    finally:
        await pipeline.close()
    mine = salts.of(owned)
    assert engines.salts == [
        ("prefill", mine),  # the warm-up fills the scope the reply reads
        ("stream", mine),
        ("stream", salts.internal("warm-up")),  # the start-up requests: a scope of their own
        ("stream", salts.internal("warm-up")),
        ("stream", salts.internal("warm-up")),
    ]


class _OpenTurnLlm(_SaltedLlm):
    """Also warms a chat whose last message is still being said (PrefillsOpenTurn)."""

    def __init__(self) -> None:
        super().__init__()
        self.opened: list[Any] = []
        self.paused: list[bool] = []

    async def prefill_open(
        self, messages: Any, request_id: str, *, cache_salt: str | None = None, paused: bool = False
    ) -> Any:
        self.salts.append(("prefill_open", cache_salt))
        self.opened.append(list(messages))
        self.paused.append(paused)
        return SimpleNamespace(cached_tokens=32)


async def test_a_turn_in_progress_is_warmed_open_under_the_replys_salt() -> None:
    """The user's turn in progress (a CURRENT entry last) goes to prefill_open, so that the
    reply's prompt extends the warm-up's; a committed context goes whole, as before; and with
    ``warm_prefix`` off (the ablation's partials-only mode) nothing reaches the LLM."""
    engines = _OpenTurnLlm()
    assert isinstance(engines, PrefillsOpenTurn)
    salts = CacheSalts(b"k" * 32)
    pipeline = VoicePipeline(
        engines, engines, engines, split_sentences, max_tokens=4, first_chunk_words=6, salts=salts
    )
    persona = ContextEntry(CacheClass.ANCHOR, Role.SYSTEM, "persona")
    words = ContextEntry(CacheClass.CURRENT, Role.USER, "Tell me about")
    speaking = ReplyRequest("s" * 32, 0, (persona, words), Conditions("p", "joe", "a"))
    committed = replace(speaking, context=(persona, replace(words, cache_class=CacheClass.RECENT)))
    try:
        assert await pipeline.prefill(speaking) == 32
        assert await pipeline.prefill(speaking, paused=True) == 32  # the user paused
        assert await pipeline.prefill(committed) == 0
        pipeline.warm_prefix = False
        assert await pipeline.prefill(speaking) == 0
    finally:
        await pipeline.close()
    salt = salts.of(speaking)
    assert engines.salts == [("prefill_open", salt), ("prefill_open", salt), ("prefill", salt)]
    assert engines.opened == [to_messages(speaking.context)] * 2
    assert engines.paused == [False, True]


async def test_the_peer_hands_its_owner_to_the_pipeline() -> None:
    no_detector = deaf_detector()
    peer = Conversation("p" * 32, Config(), no_detector, None, Metrics(), owner="d" * 64)
    try:
        request = peer.request(0)
    finally:
        await peer.close()
    assert (request.session_id, request.owner) == ("p" * 32, "d" * 64)


def test_response_timings_describe_the_reply_only() -> None:
    """What a client reads in ``response.timings``: its own reply's stage times and token
    counts (cache hits in its own scope); nothing counted from other sessions."""
    trace = TurnTrace(endpoint_ms=100.0, llm_first_token_ms=350.0, cached_tokens=64)
    timings = trace.as_dict()
    assert set(timings) == {
        "asr_final_ms",
        "llm_first_token_ms",
        "first_chunk_text_ms",
        "first_tts_ms",
        "voice_to_voice_ms",
        "cached_tokens",
        "prompt_tokens",
        "prefill_cached_tokens",
        "early_reply",
    }
    assert (timings["llm_first_token_ms"], timings["cached_tokens"]) == (250.0, 64)
    assert timings["early_reply"] is False


def test_a_partial_is_due_after_an_interval_or_at_once_at_a_pause() -> None:
    second = 16_000
    # speaking: every interval, not before
    assert not partial_due(200, 300, quiet_ms=0, samples=2 * second, covered=second)
    assert partial_due(300, 300, quiet_ms=0, samples=2 * second, covered=second)
    # a pause after audio the last partial did not hear: at once, whatever the interval
    assert partial_due(20, 300, quiet_ms=100, samples=2 * second, covered=second)
    # ... but not again once a partial heard everything up to the pause
    covered = 2 * second - 1600
    assert not partial_due(20, 300, quiet_ms=100, samples=2 * second, covered=covered)
    # ... nor after another interval of the end-of-turn silence: nothing new to hear
    assert not partial_due(900, 300, quiet_ms=500, samples=2 * second, covered=2 * second - 8000)
    # speech again after the pause: due as usual
    assert partial_due(300, 300, quiet_ms=0, samples=2 * second + 800, covered=2 * second)
    # nothing new, or too short to transcribe: never
    assert not partial_due(900, 300, quiet_ms=0, samples=second, covered=second)
    assert not partial_due(900, 300, quiet_ms=0, samples=4_000, covered=0)


class _LoopingLlm(_Engines):
    """An LLM caught in a loop (as SmolLM2 was on a question about Brazil)."""

    def __init__(self) -> None:
        self.pieces = 0
        self.closed = False

    async def stream(
        self, messages: Any, request_id: str, max_tokens: int, *, cache_salt: str | None = None
    ) -> Any:
        try:
            yield "In Brazil they speak Portuguese."
            for _ in range(200):
                self.pieces += 1
                yield " Thank you,"
        finally:
            self.closed = True

    def last_stats(self, request_id: str) -> None:
        return None


SLOW_SENTENCE = "The tallest mountain on the whole planet is Mount Everest in Nepal."


class _SlowSentenceLlm(_Engines):
    """One long sentence, a word at a time."""

    async def stream(
        self, messages: Any, request_id: str, max_tokens: int, *, cache_salt: str | None = None
    ) -> Any:
        for word in SLOW_SENTENCE.split(" "):
            yield word + " "

    def last_stats(self, request_id: str) -> None:
        return None


@pytest.mark.parametrize(
    ("slack_ms", "ms_per_char", "cut"),
    [
        (None, 6.0, False),
        (5000.0, 6.0, False),
        (100.0, 6.0, True),
        # 450 ms of audio ahead: enough where speech is made fast, too little where it is
        # slow (two sessions sharing the speech engine): the threshold follows SpeechTime
        (450.0, 1.0, False),
        (450.0, 30.0, True),
    ],
)
async def test_a_reply_is_cut_before_its_sentence_ends_when_its_playback_runs_low(
    slack_ms: float | None, ms_per_char: float, cut: bool
) -> None:
    pipeline = _pipeline(_SlowSentenceLlm())
    pipeline.speech_time = SpeechTime(ms_per_char)
    view = None if slack_ms is None else functools.partial(SessionView, "s" * 32, 0, slack_ms, 1e3)
    request = ReplyRequest("s" * 32, 0, (), Conditions("p", "joe", "a"), view=view)
    try:
        chunks = [str(chunk) async for chunk in pipeline.reply(request, TurnTrace(endpoint_ms=0))]
    finally:
        await pipeline.close()
    assert chunks[0] == "The tallest mountain on the whole"  # the first chunk: 6 words
    assert " ".join(chunks) == SLOW_SENTENCE
    assert (len(chunks) > 2) is cut  # else the rest of the sentence is one chunk


async def test_a_reply_that_repeats_itself_ends_after_the_first_saying() -> None:
    engines = _LoopingLlm()
    pipeline = _pipeline(engines)
    request = ReplyRequest("s" * 32, 0, (), Conditions("p", "joe", "a"))
    try:
        chunks = [str(chunk) async for chunk in pipeline.reply(request, TurnTrace(endpoint_ms=0))]
    finally:
        await pipeline.close()
    assert " ".join(chunks) == "In Brazil they speak Portuguese. Thank you,"
    assert engines.closed and engines.pieces < 10  # the request was stopped, not read out
