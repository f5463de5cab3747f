"""A turn never hangs: every turn state but listening ends within its deadline.

The deadlines are in server/runtime/turn.py.

The peer runs the real VoicePipeline with its engine queues; the engines are stand-ins that
block at one stage (an ASR stuck behind another session's job, or stuck running; an LLM that
never gives its first token; a TTS that never returns). Time is a fake clock: the test moves
it past the deadline and asks the peer to enforce it, so nothing sleeps for real to test logic.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np
import pytest

from models.tts import split_sentences
from server.clock import FakeClock
from server.config import Config
from server.conversation.conversation import Conversation
from server.metrics import Metrics
from server.pipeline.turn_detector import VadEvent, VadEventKind
from server.pipeline.voice import VoicePipeline
from server.runtime.session_view import SessionView
from server.runtime.turn import TurnState
from server.scheduling.engine_queue import JobTag

THINKING_MS = 20_000  # the default deadline of thinking (runtime.thinking_timeout_ms)
SPEECH = np.full(16_000, 500, np.int16)  # 1 s at 16 kHz: long enough to be transcribed


class _Speech:
    def __init__(self) -> None:
        self.pcm = np.full(48_000, 3000, np.int16)  # 1 s of audio at 48 kHz
        self.words: tuple[()] = ()
        self.phonemes: tuple[()] = ()


class StuckEngines:
    """ASR, LLM and TTS that answer at once, except ``stuck`` (asr, llm, tts, second_tts),
    which blocks until :meth:`release` (the ASR and TTS in their worker thread)."""

    def __init__(self, stuck: str) -> None:
        self.stuck = stuck
        self.entered = threading.Event()  # the stuck call has started
        self._release = threading.Event()
        self.tts_calls = 0

    def release(self) -> None:
        self._release.set()

    def _block(self) -> None:
        self.entered.set()
        self._release.wait(30)

    def transcribe(self, pcm: object, prefix: str = "") -> str:
        if self.stuck == "asr":
            self._block()
        return "hello there"

    async def stream(
        self,
        messages: Sequence[Any],
        request_id: str,
        max_tokens: int,
        *,
        cache_salt: str | None = None,
    ) -> AsyncIterator[str]:
        if self.stuck == "llm":
            self.entered.set()
            await asyncio.Event().wait()  # no first token, ever
        yield "Hello to you. It is a fine day. "

    async def prefill(
        self, messages: Sequence[Any], request_id: str, *, cache_salt: str | None = None
    ) -> None:
        return None

    async def abort(self, request_id: str) -> None:
        pass

    def last_stats(self, request_id: str) -> None:
        return None

    def synthesize(self, text: str) -> _Speech:
        self.tts_calls += 1
        if self.stuck == "tts" or (self.stuck == "second_tts" and self.tts_calls == 2):
            self._block()
        return _Speech()

    async def close(self) -> None:
        pass


class Detector:
    """The peer asks its turn detector where the input is and how long it has been quiet."""

    position_ms = 1_000.0
    quiet_ms = 0.0
    completeness = None  # no end-of-turn model
    echo = None  # no echo canceller

    def tune(self, threshold: float, end_of_turn_ms: int) -> None:
        pass


def events(peer: Conversation, kind: str) -> list[dict[str, Any]]:
    """What the peer sent (its outbox: no data channel is open in these tests)."""
    return [e for e in peer.outlet.pending if e["type"] == kind]


async def until(check: Any, what: str) -> None:
    """Let the peer's tasks run until ``check()`` (bounded: 200 steps of 10 ms)."""
    for _ in range(200):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


@pytest.fixture
async def rig(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Conversation, Any, Any]]:
    """A peer on a fake clock with engines stuck at ``request.param``."""
    clock = FakeClock(1_000.0)
    engines = StuckEngines(request.param)
    pipeline = VoicePipeline(
        engines,
        engines,
        engines,
        split_sentences,
        max_tokens=40,
        first_chunk_words=6,
        clock=clock,
    )
    detector: Any = Detector()
    metrics = Metrics()
    peer = Conversation("s" * 32, Config(), detector, pipeline, metrics, clock=clock)
    try:
        yield peer, clock, (engines, pipeline, metrics)
    finally:
        engines.release()
        await peer.close()
        await pipeline.close()


async def speak_a_turn(peer: Conversation) -> None:
    """The VAD hears a start, a second of speech, then the end of the turn."""
    await peer.on_vad(VadEvent(VadEventKind.START, 0.0, 0.0))
    peer.keep_audio(SPEECH)
    await peer.on_vad(VadEvent(VadEventKind.STOP, 1_000.0, 0.0))
    assert peer.session.state is TurnState.THINKING


async def expect_timeout(
    peer: Conversation, clock: FakeClock, metrics: Metrics, stage: str, state: TurnState
) -> None:
    """Just before the deadline nothing happens; at it, the turn ends with a timeout error."""
    entered = peer.session.turn.entered_ms
    clock.advance(entered + THINKING_MS - 1 - clock.now_ms())
    await peer.enforce_deadline()
    assert peer.session.state is state and not events(peer, "error")
    clock.advance(1)
    await peer.enforce_deadline()
    assert peer.session.state is TurnState.LISTENING
    (error,) = events(peer, "error")
    assert error["error"]["code"] == "timeout" and error["error"]["stage"] == stage
    assert error["error"]["state"] == state.value
    assert "_" not in error["error"]["message"]  # words for people, not state names
    assert peer.replies.task is None  # the reply task was cancelled and awaited
    assert metrics.turn_timeouts.labels(stage)._value.get() == 1
    assert metrics.barge_ins._value.get() == 0  # a timeout is not a barge-in


@pytest.mark.parametrize("rig", ["asr"], indirect=True)
async def test_asr_queued_behind_other_work_times_out_from_the_end_of_turn(
    rig: tuple[Conversation, FakeClock, Any],
) -> None:
    peer, clock, (engines, pipeline, metrics) = rig
    # another session's transcript holds the one ASR worker
    other = JobTag("o" * 32, 0, lambda: SessionView("o" * 32, 0, 0.0, 2000.0))
    held = asyncio.get_running_loop().create_task(pipeline.transcribe(SPEECH, other))
    await until(engines.entered.is_set, "the other session's ASR job to run")
    await speak_a_turn(peer)
    await until(lambda: pipeline.asr_queue.waiting == 1, "our transcript to queue")
    await expect_timeout(peer, clock, metrics, "asr", TurnState.THINKING)
    assert not events(peer, "response.created")  # no reply was started
    engines.release()
    assert await held == "hello there"


@pytest.mark.parametrize("rig", ["asr"], indirect=True)
async def test_asr_running_too_long_times_out(rig: tuple[Conversation, FakeClock, Any]) -> None:
    peer, clock, (engines, _, metrics) = rig
    await speak_a_turn(peer)
    await until(engines.entered.is_set, "our ASR job to run")
    await expect_timeout(peer, clock, metrics, "asr", TurnState.THINKING)
    # the turn was never transcribed: nothing of it is in the history
    assert peer.session.history.turns == ()


@pytest.mark.parametrize("rig", ["llm"], indirect=True)
async def test_no_first_token_times_out(rig: tuple[Conversation, FakeClock, Any]) -> None:
    peer, clock, (engines, _, metrics) = rig
    await speak_a_turn(peer)
    await until(engines.entered.is_set, "the LLM request")
    await until(lambda: events(peer, "response.created"), "response.created")
    await expect_timeout(peer, clock, metrics, "llm", TurnState.THINKING)
    (done,) = events(peer, "response.done")
    assert done["status"] == "failed"
    assert [t.text for t in peer.session.history.turns] == ["hello there"]  # the question


@pytest.mark.parametrize("rig", ["tts"], indirect=True)
async def test_first_speech_never_made_times_out(rig: tuple[Conversation, FakeClock, Any]) -> None:
    peer, clock, (engines, _, metrics) = rig
    await speak_a_turn(peer)
    await until(engines.entered.is_set, "the TTS job")
    await expect_timeout(peer, clock, metrics, "tts", TurnState.THINKING)
    assert events(peer, "response.done")[-1]["status"] == "failed"


@pytest.mark.parametrize("rig", ["second_tts"], indirect=True)
async def test_a_reply_stalled_while_speaking_times_out(
    rig: tuple[Conversation, FakeClock, Any],
) -> None:
    peer, clock, (engines, _, metrics) = rig
    await speak_a_turn(peer)
    await until(engines.entered.is_set, "the second chunk's TTS job")
    session = peer.session
    session.pull_audio(48_000)  # the first chunk plays out; the second never comes
    assert session.state is TurnState.AGENT_SPEAKING
    deadline = Config().runtime.agent_speaking_timeout_ms
    clock.advance(session.turn.entered_ms + deadline - clock.now_ms())
    await peer.enforce_deadline()
    assert session.state is TurnState.LISTENING
    (error,) = events(peer, "error")
    assert error["error"]["stage"] == "tts" and error["error"]["state"] == "agent_speaking"
    assert [t.text for t in session.history.turns] == ["hello there", "Hello to you."]
    assert metrics.turn_timeouts.labels("tts")._value.get() == 1


@pytest.mark.parametrize("rig", ["none"], indirect=True)
async def test_a_user_turn_past_its_deadline_ends_as_at_a_pause(
    rig: tuple[Conversation, FakeClock, Any],
) -> None:
    peer, clock, (_, _, metrics) = rig
    await peer.on_vad(VadEvent(VadEventKind.START, 0.0, 0.0))
    peer.keep_audio(SPEECH)
    deadline = Config().runtime.user_speaking_timeout_ms
    clock.advance(deadline - 1)
    await peer.enforce_deadline()
    assert peer.session.state is TurnState.USER_SPEAKING
    clock.advance(1)
    await peer.enforce_deadline()
    assert metrics.turn_timeouts.labels("speech")._value.get() == 1
    # the turn was transcribed and answered as if the user had paused
    await until(lambda: events(peer, "response.created"), "the reply")
    assert peer.session.history.turns[0].text == "hello there"
    assert not events(peer, "error")
