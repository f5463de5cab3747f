"""Pause first, decide second: voice over a reply pauses it; a cough, a click or "mm-hm" lets it
resume from the exact sample where it paused, a real interruption stops it.

The judge is tested alone on scripted detector readings; then a whole Conversation runs on a
fake clock with a real TurnDetector whose gate and confirming model are scripted, a pipeline
whose recogniser says what the test wants, and its output pulled as the audio track would.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import av
import numpy as np
import numpy.typing as npt
import pytest

from models.tts import split_sentences
from server.clock import FakeClock
from server.config import load_config
from server.conversation.conversation import Conversation
from server.conversation.interjection import (
    INTERJECTION_CONTEXT,
    AskWords,
    Decision,
    InterjectionJudge,
    JudgeRules,
    Listening,
    Phase,
    Verdict,
    is_backchannel,
    own_words,
    reply_words,
    words_of,
)
from server.conversation.room import NOISY_HOLD_MS, NOISY_LAPSES
from server.metrics import Metrics
from server.pipeline.echo import EchoPath
from server.pipeline.seams import (
    ReplyRequest,
    SpeechAudio,
    Transcript,
    TurnPipeline,
    TurnTrace,
)
from server.pipeline.turn_detector import TurnCompleteness, TurnDetector
from server.pipeline.voice import VoicePipeline
from server.runtime.conditions import Conditions
from server.runtime.history import Role
from server.runtime.media import FRAME_SAMPLES
from server.runtime.session import Session
from server.runtime.turn import TurnState
from server.scheduling.engine_queue import JobTag
from tests.server.runtime.test_session import play, say
from tests.support.pace import within

RULES = JudgeRules(interruption_ms=600.0, quiet_ms=160.0)


# --- the words ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text",
    ["", "Mm-hm.", "mhm", "Yeah.", "Okay.", "OK", "Uh-huh.", "Right, right.", "I see.",
     "Oh, okay.", "(coughs)", "[MUSIC]", " you", "Yeah, got it.", "Thank you.",
     # what Whisper tiny wrote for espeak-ng's "Mm-hm." and "Mhm."
     "== Animation ==", "Mmmmmmmmm", "M-M-M-M-M", "Mm-hmm.", "Uhhh, okay.",
     # what it wrote for them primed with INTERJECTION_CONTEXT: repeats of the sound
     "Mm-m-m-m-m-m-m.", "Mm-hm. Mm-hm. Mm-hm. Mm-h", "Uh-huh. Uh-huh. Uh-huh. Uh-h",
     # a drawn-out sound spelt with hyphens (benchmarks/interjection_words.py)
     "A-mm-m-m-m-m-m.", "Emm-m-hm.", "Emm."],
)  # fmt: skip
def test_backchannels_and_noises_are_no_bid_for_the_floor(text: str) -> None:
    assert is_backchannel(text)


@pytest.mark.parametrize(
    "text",
    ["Wait.", "Stop.", "No.", "Hold on.", "Yeah, but what about Paris?", "Sorry, one question.",
     "okay okay okay okay okay okay okay",
     # hyphenated words, and letters spelt out, are no hum
     "X-ray, please.", "A T-shirt.", "I-t.", "A-a-a."],
)  # fmt: skip
def test_words_that_take_the_floor(text: str) -> None:
    assert not is_backchannel(text)


# --- the judge, step by step ------------------------------------------------------------------
def steps(judge: InterjectionJudge, script: list[Listening]) -> list[Any]:
    return [judge.step(now) for now in script]


def test_voice_the_model_never_confirms_resumes_once_the_gate_lapses() -> None:
    judge = InterjectionJudge(RULES)
    judge.heard(1000.0)
    out = steps(judge, [Listening(1000.0 + 20 * i, False, 0.0, 20.0 * i) for i in range(12)])
    assert out[:10] == [None] * 10
    assert out[10] == Decision(Verdict.RESUME, "no voice") and judge.phase is Phase.IDLE


def test_a_tone_that_lapses_while_the_echo_gate_hides_frames_resumes_at_once() -> None:
    # a beep over the reply's echo: nothing to transcribe (Whisper would make words of it)
    judge = InterjectionJudge(RULES)
    judge.heard(1000.0)
    script = [
        Listening(1000.0 + 20 * i, False, 0.0, 20.0 * i, max(0.0, 20.0 * (i - 2)), True)
        for i in range(20)
    ]
    out = [o for o in steps(judge, script) if o is not None]
    assert out == [Decision(Verdict.RESUME, "a tone")] and not judge.confirmed


def test_voice_that_lapses_while_the_echo_gate_hides_frames_is_transcribed() -> None:
    # the user says "stop" over the reply's echo: the gate let its first syllables through
    # (the pause), then the echo gate hid the rest from the detector for 500 ms after
    judge = InterjectionJudge(RULES)
    judge.heard(1000.0)
    script = [
        Listening(1000.0 + 20 * i, False, 0.0, 20.0 * i, max(0.0, 20.0 * (i - 25)))
        for i in range(40)
    ]
    out = steps(judge, script)
    ask = next(o for o in out if o is not None)
    assert out.index(ask) == 35  # 200 ms after the last hidden frame, not after the gate's lapse
    assert ask == AskWords(1, 1000.0) and judge.phase is Phase.WORDS
    assert judge.words(1, "Stop.") == Decision(Verdict.INTERRUPT, "words")
    # the same voice with no words in it: the reply resumes; at the pause's deadline too
    judge.heard(3000.0)
    steps(
        judge,
        [Listening(3000.0 + 20 * i, False, 0.0, 20.0 * i, 20.0 * i - 40.0) for i in range(3, 15)],
    )
    assert judge.words(judge.attempt, "") == Decision(Verdict.RESUME, "no words")
    judge.heard(5000.0)
    steps(
        judge,
        [Listening(5000.0 + 20 * i, False, 0.0, 20.0 * i, 20.0 * i - 40.0) for i in range(3, 15)],
    )
    assert judge.overdue() == Decision(Verdict.RESUME, "undecided")  # it was never speech


def test_confirmed_speech_is_not_quiet_while_the_echo_gate_hides_frames() -> None:
    judge = InterjectionJudge(RULES)
    judge.heard(1000.0)
    judge.step(Listening(1100.0, True, 0.0, 0.0, 0.0))
    # the detector hears quiet: the echo gate hid the frames (the reply's echo still comes back)
    hidden = [Listening(1100.0 + 20 * i, True, 20.0 * i, 20.0 * i, 0.0) for i in range(1, 30)]
    assert steps(judge, hidden) == [None] * 29 and judge.phase is Phase.SPEECH
    # the echo is over: 160 ms of quiet that was heard
    heard = [Listening(1700.0 + 20 * i, True, 600.0 + 20 * i, 600.0, 20.0 * i) for i in range(9)]
    out = steps(judge, heard)
    assert out[:8] == [None] * 8 and out[8] == AskWords(1, 1000.0)


def test_long_speech_is_judged_by_its_words_so_far() -> None:
    judge = InterjectionJudge(RULES)
    judge.heard(1000.0)
    out = steps(judge, [Listening(1000.0 + 20 * i, True, 0.0, 0.0) for i in range(1, 31)])
    assert out[-1] == AskWords(1, 1000.0, final=False) and set(out[:-1]) == {None}
    assert judge.words(1, "Sorry, can I") == Decision(Verdict.INTERRUPT, "words")

    judge.heard(5000.0)  # "oh, okay, I see": a long backchannel is judged when it ends
    out = steps(judge, [Listening(5000.0 + 20 * i, True, 0.0, 0.0) for i in range(1, 31)])
    assert out[-1] == AskWords(2, 5000.0, final=False)
    assert judge.words(2, "Oh, okay,") is None and judge.phase is Phase.SPEECH
    assert judge.step(Listening(5700.0, True, 20.0, 20.0)) is None  # asked once only
    final = judge.step(Listening(5860.0, True, 160.0, 160.0))
    assert final == AskWords(3, 5000.0)
    assert judge.words(3, "Oh, okay, I see.") == Decision(Verdict.RESUME, "backchannel")


def test_short_speech_is_judged_by_its_words() -> None:
    judge = InterjectionJudge(RULES)
    judge.heard(1000.0)
    assert steps(judge, [Listening(1100.0, True, 0.0, 0.0), Listening(1300.0, True, 100.0, 100.0)])
    ask = judge.step(Listening(1360.0, True, 160.0, 160.0))
    assert ask == AskWords(1, 1000.0) and judge.phase is Phase.WORDS
    assert judge.words(1, "Mm-hm.") == Decision(Verdict.RESUME, "backchannel")

    judge.heard(5000.0)
    judge.step(Listening(5100.0, True, 0.0, 0.0))
    ask = judge.step(Listening(5300.0, True, 160.0, 160.0))
    assert isinstance(ask, AskWords)
    assert judge.words(ask.attempt, "Wait.") == Decision(Verdict.INTERRUPT, "words")


def test_speech_that_goes_on_while_its_words_are_transcribed_is_judged_again() -> None:
    judge = InterjectionJudge(RULES)
    judge.heard(1000.0)
    judge.step(Listening(1100.0, True, 0.0, 0.0))
    first = judge.step(Listening(1300.0, True, 160.0, 160.0))
    assert isinstance(first, AskWords)
    assert judge.step(Listening(1320.0, True, 0.0, 0.0)) is None  # the user speaks on
    assert judge.words(first.attempt, "Yeah.") is None  # not a reason to resume any more
    again = judge.step(Listening(1520.0, True, 160.0, 160.0))
    assert isinstance(again, AskWords) and again.attempt == first.attempt + 1
    assert judge.words(first.attempt, "Yeah.") is None  # too late: it no longer counts
    assert judge.words(again.attempt, "Yeah, wait.") == Decision(Verdict.INTERRUPT, "words")


def test_a_pause_past_its_deadline_is_decided_by_what_was_confirmed() -> None:
    judge = InterjectionJudge(RULES)
    judge.heard(0.0)
    assert judge.overdue() == Decision(Verdict.RESUME, "undecided")
    judge.heard(0.0)
    judge.step(Listening(100.0, True, 0.0, 0.0))
    assert judge.overdue() == Decision(Verdict.INTERRUPT, "undecided speech")


# --- the reply's own words -----------------------------------------------------------------
SAID = tuple(
    words_of("The Eiffel Tower is in Paris. It was built for a fair in eighteen eighty-nine")
)


@pytest.mark.parametrize(
    "text", ["Paris.", "It was built.", "A fair, in eighteen", "Eiffel Tower is in Peru."]
)
def test_the_replys_own_words_come_back_as_its_echo(text: str) -> None:
    assert own_words(text, SAID)  # the last: one misheard word of four


@pytest.mark.parametrize(
    "text",
    ["", "Mm-hm.", "Stop.", "No, it was not.", "Wait, Paris?", "Tell me about Rome.",
     "Is it tall?", "Built in Peru?"],
)  # fmt: skip
def test_words_not_the_replys_own_are_the_users(text: str) -> None:
    # none, a hum, a bid for the floor among its words, or a word or more it never said
    assert not own_words(text, SAID)
    assert not own_words("Paris.", ())  # nothing heard of the reply yet


def test_the_replys_own_words_resume_it_once_the_voice_falls_quiet() -> None:
    judge = InterjectionJudge(RULES)
    judge.heard(1000.0)
    out = steps(judge, [Listening(1000.0 + 20 * i, True, 0.0, 0.0) for i in range(1, 31)])
    assert out[-1] == AskWords(1, 1000.0, final=False)
    assert judge.words(1, "It was built for", SAID) is None  # its echo goes on: judged later
    final = judge.step(Listening(1700.0, True, 160.0, 160.0))
    assert final == AskWords(2, 1000.0)
    assert judge.words(2, "It was built for a fair.", SAID) == Decision(
        Verdict.RESUME, "its own words"
    )
    judge.heard(5000.0)
    judge.step(Listening(5100.0, True, 0.0, 0.0))
    ask = judge.step(Listening(5300.0, True, 160.0, 160.0))
    assert isinstance(ask, AskWords)
    assert judge.words(ask.attempt, "Wait, Paris?", SAID) == Decision(Verdict.INTERRUPT, "words")


def test_the_replys_words_are_those_the_user_heard_of_it(session: Session) -> None:
    session.speech_started()
    session.speech_stopped()
    session.commit_user_turn("Where is the Eiffel Tower?")
    assert session.start_response(session.epoch)
    say(session, "It is in Paris.", 200, words=True)
    say(session, "It was built in eighteen eighty nine.", 700, words=True)
    assert reply_words(session) == ()
    play(session, 300)  # the first sentence (committed to history) and one word of the next
    assert reply_words(session) == ("it", "is", "in", "paris", "it")
    play(session, 400)
    assert reply_words(session, last=3) == ("built", "in", "eighteen")


# --- a whole conversation -------------------------------------------------------------------
class Voice:
    """The scripted gate and confirming model: voice while ``on`` (the model agrees only when
    ``confirmed``)."""

    window = 512

    def __init__(self) -> None:
        self.on = False
        self.confirmed = True

    def is_speech(self, frame: npt.NDArray[np.int16]) -> bool:
        return self.on

    def probability(self, window: npt.NDArray[np.int16]) -> float:
        return 0.9 if self.on and self.confirmed else 0.0

    def reset(self) -> None:
        pass


def reply_pcm(samples: int) -> npt.NDArray[np.int16]:
    """A reply whose every sample differs from its neighbours: a skip or a repeat shows."""
    return (np.arange(samples) % 30_000 + 1).astype(np.int16)


REPLY = reply_pcm(48_000)  # each sentence: 1 s


class ScriptedPipeline:
    """Replies two sentences of :data:`REPLY`; the recogniser says ``words``."""

    def __init__(self) -> None:
        self.words = ""
        self.transcribed = 0

    async def transcribe(
        self, utterance: npt.NDArray[np.int16], tag: JobTag, prefix: str = ""
    ) -> str:
        self.transcribed += 1
        return self.words

    async def partial_transcript(
        self, utterance: npt.NDArray[np.int16], tag: JobTag, prefix: str = ""
    ) -> Transcript:
        return Transcript("")

    async def prefill(self, request: ReplyRequest, *, paused: bool = False) -> int:
        return 0

    async def reply(self, request: ReplyRequest, trace: TurnTrace) -> AsyncIterator[str]:
        yield "Once upon a time."
        yield "The end."

    async def synthesize(self, text: str, conditions: Conditions, tag: JobTag) -> SpeechAudio:
        return SpeechAudio(REPLY)

    async def close(self) -> None:
        pass


class Rig:
    """A conversation on a fake clock (``pipeline``: made for that clock; default: the scripted
    one), with ``settings`` (dotted names)."""

    def __init__(
        self,
        pipeline: Callable[[FakeClock], TurnPipeline] | None = None,
        settings: dict[str, str] | None = None,
        completeness: TurnCompleteness | None = None,
    ) -> None:
        overrides = {"pipeline.incremental": "false", "runtime.fade_ms": "0", **(settings or {})}
        config = load_config(overrides=overrides)
        self.voice = Voice()
        self.clock = FakeClock(1_000.0)
        self.pipeline = ScriptedPipeline()
        made = self.pipeline if pipeline is None else pipeline(self.clock)
        detector = TurnDetector(self.voice, self.voice, config.vad, completeness)
        self.conversation = Conversation(
            "c" * 32, config, detector, made, Metrics(), clock=self.clock
        )
        self.heard: list[npt.NDArray[np.int16]] = []  # what the audio track sent
        self._pts = 0

    async def tick(self, frames: int = 1) -> None:
        """20 ms of media: one inbound frame heard, one outbound frame pulled."""
        for _ in range(frames):
            frame = av.AudioFrame.from_ndarray(
                np.zeros((1, FRAME_SAMPLES), np.int16), format="s16", layout="mono"
            )
            frame.sample_rate, frame.pts = 48_000, self._pts
            self._pts += FRAME_SAMPLES
            self.clock.advance(20.0)
            await self.conversation.hear(frame, self.clock.now_ms())
            self.heard.append(self.conversation.pull_audio(FRAME_SAMPLES))
            for _ in range(5):
                await asyncio.sleep(0)  # the reply's tasks run

    async def ask(self) -> None:
        """Typed text starts a reply; ticks until its audio plays."""
        await self.conversation.typed_text("Tell me a story.")
        # a pipeline whose engines run in threads (voice_pipeline) needs real time too: wait
        # on a real deadline that follows the machine's pace, not on a count of ticks
        deadline = time.monotonic() + within(5.0)
        while time.monotonic() < deadline:
            await self.tick()
            if self.heard[-1].any():
                return
            await asyncio.sleep(0.002)
        raise AssertionError("the reply never played")

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.conversation.outlet.pending if e["type"] == kind]

    def received(self) -> npt.NDArray[np.int16]:
        """The reply as heard, pauses (silent frames) left out."""
        return np.concatenate([f for f in self.heard if f.any()])


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    rig = Rig()
    try:
        yield rig
    finally:
        await rig.conversation.close()


async def interject(rig: Rig, frames: int, words: str = "", confirmed: bool = True) -> None:
    """The user makes a sound over the reply for ``frames`` x 20 ms (recognised as ``words``)."""
    rig.pipeline.words = words
    rig.voice.on, rig.voice.confirmed = True, confirmed
    await rig.tick(frames)
    rig.voice.on = False


async def until_state(rig: Rig, state: TurnState, frames: int = 100) -> None:
    for _ in range(frames):
        if rig.conversation.session.state is state:
            return
        await rig.tick()
    raise AssertionError(f"never {state.value}: {rig.conversation.session.state.value}")


@pytest.mark.parametrize(
    ("frames", "words", "confirmed", "reason"),
    [
        (3, "", False, "no voice"),  # a click: the gate hears it, the model does not
        (12, "(coughs)", True, "no words"),
        (15, "Mm-hm.", True, "backchannel"),
        (40, "Oh, okay, I see.", True, "backchannel"),  # long, but only a backchannel
    ],
)
async def test_a_false_interruption_resumes_from_the_sample_where_it_paused(
    rig: Rig, frames: int, words: str, confirmed: bool, reason: str
) -> None:
    await rig.ask()
    await rig.tick(10)
    await interject(rig, frames, words, confirmed)
    assert rig.conversation.session.state is TurnState.PAUSED
    assert not rig.heard[-1].any()  # paused at once: silence while the user made the sound
    await until_state(rig, TurnState.LISTENING, frames=200)
    received = rig.received()
    assert np.array_equal(received, np.concatenate([REPLY, REPLY]))  # every sample, once
    session = rig.conversation.session
    agent = [t for t in session.history.turns if t.role is Role.ASSISTANT][-1]
    assert agent.text == "Once upon a time. The end." and not agent.truncated
    (resumed,) = rig.events("output_audio_buffer.resumed")
    assert resumed["reason"] == reason
    assert len(rig.events("output_audio_buffer.paused")) == 1
    assert session.epoch == 0  # nothing interrupted the reply
    # its words: none for a click; once when it fell quiet; once more when it grew long
    assert rig.pipeline.transcribed == (0 if reason == "no voice" else 1 + (frames >= 40))
    judged = rig.conversation.describe()["interjections"]
    assert (judged["resumed"], judged["interrupted"]) == (1, 0)
    assert judged["words"] == ([] if reason == "no voice" else [words] * (1 + (frames >= 40)))


@pytest.mark.parametrize(("frames", "words"), [(40, "Sorry, one question."), (12, "Wait.")])
async def test_a_real_interruption_stops_the_reply_where_it_paused(
    rig: Rig, frames: int, words: str
) -> None:
    await rig.ask()
    await rig.tick(10)
    before = sum(f.any() for f in rig.heard)
    await interject(rig, frames, words)
    await until_state(rig, TurnState.USER_SPEAKING if frames == 40 else TurnState.THINKING)
    session = rig.conversation.session
    assert session.epoch == 1  # the one interrupt path bumped it
    (truncated,) = rig.events("conversation.item.truncated")
    sent = sum(f.any() for f in rig.heard)
    assert sent <= before + 3  # paused within the onset (40 ms) and a frame of resampling
    assert truncated["audio_end_ms"] == pytest.approx(sent * 20.0)  # what was heard, exactly
    assert not rig.events("output_audio_buffer.resumed")
    judged = rig.conversation.describe()["interjections"]
    assert (judged["resumed"], judged["interrupted"], judged["words"]) == (0, 1, [words])
    # the user's turn holds the interjection from its onset
    assert rig.events("input_audio_buffer.speech_started")


async def test_speech_that_goes_on_after_a_resume_pauses_the_reply_again(rig: Rig) -> None:
    # "Stop, [a breath] please tell me something else": the first word alone is heard as no
    # words and the reply resumes; the speech goes on, so the reply pauses again and the
    # rest is judged
    await rig.ask()
    await rig.tick(10)
    await interject(rig, 12, "")
    await until_state(rig, TurnState.AGENT_SPEAKING, frames=20)
    (resumed,) = rig.events("output_audio_buffer.resumed")
    assert resumed["reason"] == "no words"
    await interject(rig, 30, "Please tell me something else.")
    await until_state(rig, TurnState.USER_SPEAKING)
    assert len(rig.events("output_audio_buffer.paused")) == 2
    assert rig.conversation.session.epoch == 1  # then it was an interruption
    judged = rig.conversation.describe()["interjections"]
    assert (judged["resumed"], judged["interrupted"]) == (1, 1)


async def test_with_pause_first_off_confirmed_speech_stops_the_reply_at_once() -> None:
    rig = Rig(settings={"vad.pause_first": "false"})
    try:
        await rig.ask()
        rig.voice.on = True
        await rig.tick(4)
        assert rig.conversation.session.state is TurnState.USER_SPEAKING
        assert not rig.events("output_audio_buffer.paused")
    finally:
        await rig.conversation.close()


async def test_a_pause_past_its_deadline_resumes_unconfirmed_voice(rig: Rig) -> None:
    await rig.ask()
    rig.voice.on, rig.voice.confirmed = True, False
    await rig.tick(3)  # the gate goes on hearing something the model never confirms
    assert rig.conversation.session.state is TurnState.PAUSED
    rig.clock.advance(2_000.0)  # runtime.paused_timeout_ms
    await rig.conversation.enforce_deadline()
    assert rig.conversation.session.state is TurnState.AGENT_SPEAKING
    assert rig.events("output_audio_buffer.resumed")[0]["reason"] == "undecided"


# --- through the real pipeline's engine queues ------------------------------------------------
class Engines:
    """ASR, LLM and TTS stand-ins for VoicePipeline: the recogniser says ``words``, the LLM
    tells a five-sentence story, each sentence 1 s of :data:`REPLY`-like audio."""

    def __init__(self) -> None:
        self.words = ""

    def transcribe(self, pcm: object, prefix: str = "") -> str:
        return self.words

    async def stream(self, messages: Any, request_id: str, max_tokens: int, **_: Any) -> Any:
        yield "One day a dragon woke up. It flew over the hills. It saw a castle. "
        yield "It landed in a field. Then it slept again. "

    async def prefill(self, messages: Any, request_id: str, **_: Any) -> None:
        return None

    async def abort(self, request_id: str) -> None:
        pass

    def last_stats(self, request_id: str) -> None:
        return None

    def synthesize(self, text: str) -> Any:
        return SpeechAudio(REPLY)

    async def close(self) -> None:
        pass


def voice_pipeline(engines: Engines) -> Callable[[FakeClock], TurnPipeline]:
    """The real voice pipeline on ``engines``, made for a rig's clock."""

    def made(clock: FakeClock) -> TurnPipeline:
        return VoicePipeline(
            engines,
            engines,
            engines,
            split_sentences,
            max_tokens=60,
            first_chunk_words=6,
            clock=clock,
        )

    return made


async def test_a_paused_reply_with_a_full_buffer_still_has_its_words_heard() -> None:
    """The paused session is past its lookahead budget (its buffer full and held): the
    recognition of the interjection is never deferred with the rest of its work."""
    engines = Engines()

    rig = Rig(voice_pipeline(engines))
    conversation = rig.conversation
    try:
        await rig.ask()
        for _ in range(200):  # the speech of the next sentences fills the budget
            await asyncio.sleep(0.005)
            if conversation.session.playback.space == 0:
                break
        engines.words = "Mm-hm."
        rig.voice.on = True
        await rig.tick(12)
        rig.voice.on = False
        assert conversation.session.state is TurnState.PAUSED
        assert conversation.session.playback.space == 0  # held full: past its budget
        for _ in range(100):
            await rig.tick()
            await asyncio.sleep(0.005)  # the ASR runs in its engine thread
            if conversation.session.state is not TurnState.PAUSED:
                break
        assert conversation.session.state is TurnState.AGENT_SPEAKING
        assert rig.events("output_audio_buffer.resumed")[0]["reason"] == "backchannel"
    finally:
        await conversation.close()
        assert conversation.pipeline is not None
        await conversation.pipeline.close()


class SlowHearing(Engines):
    """The LLM writes its first sentence, the rest once ``more`` is set; the recogniser hears
    only once ``heard`` is set (a slow machine); every sentence synthesised is recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.more = asyncio.Event()
        self.heard = threading.Event()
        self.synthesised: list[str] = []

    def transcribe(self, pcm: object, prefix: str = "") -> str:
        self.heard.wait(10.0)
        return self.words

    async def stream(self, messages: Any, request_id: str, max_tokens: int, **_: Any) -> Any:
        yield "One day a dragon woke up. "
        await self.more.wait()
        yield "It flew over the hills. It saw a castle. "

    def synthesize(self, text: str) -> Any:
        self.synthesised.append(text)
        return SpeechAudio(REPLY)


async def test_a_paused_replys_speech_waits_while_the_voice_over_it_is_heard() -> None:
    """Its buffer far from full, a paused reply's next sentences are not synthesised while the
    voice over it is heard (the hearing gets the cores first); once it resumes, they are."""
    engines = SlowHearing()

    rig = Rig(voice_pipeline(engines), settings={"runtime.lookahead_budget_ms": "10000"})
    conversation = rig.conversation
    try:
        await rig.ask()
        engines.words = "Mm-hm."
        rig.voice.on = True
        await rig.tick(12)
        rig.voice.on = False
        assert conversation.session.state is TurnState.PAUSED
        engines.more.set()  # the rest of the reply's text comes while it is paused
        for _ in range(20):
            await rig.tick()
            await asyncio.sleep(0.005)  # the TTS would run in its engine thread
        assert conversation.session.state is TurnState.PAUSED
        assert engines.synthesised == ["One day a dragon woke up."]
        assert conversation.session.playback.space > 0  # room: only the pause holds it
        engines.heard.set()
        # the hearing and the synthesis run in engine threads: wait for what is needed, on a
        # real deadline that follows the machine's pace (a busy machine takes longer), not
        # on a count of ticks
        deadline = time.monotonic() + within(10.0)
        while len(engines.synthesised) < 3 and time.monotonic() < deadline:
            await rig.tick()
            await asyncio.sleep(0.005)
        assert rig.events("output_audio_buffer.resumed")[0]["reason"] == "backchannel"
        assert engines.synthesised[1:] == ["It flew over the hills.", "It saw a castle."]
    finally:
        engines.heard.set()
        await conversation.close()
        assert conversation.pipeline is not None
        await conversation.pipeline.close()


def test_the_command_line_client_shows_a_pause_and_a_resume(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    from client.cli import show_event

    with caplog.at_level("INFO", logger="client"):
        show_event({"type": "x-avatar.output_audio_buffer.paused", "audio_end_ms": 1240.0})
        show_event(
            {"type": "output_audio_buffer.resumed", "paused_ms": 620.0, "reason": "backchannel"}
        )
    assert "reply paused at 1240 ms of its audio: hearing you" in caplog.text
    assert "reply resumed after a 620 ms pause (backchannel)" in caplog.text
    assert len(capsys.readouterr().out.splitlines()) == 2  # every event is still a JSON line


class PrimedPipeline(ScriptedPipeline):
    """A pipeline whose recogniser can be primed; records what it was primed with."""

    def __init__(self) -> None:
        super().__init__()
        self.contexts: list[str] = []

    async def transcribe_primed(
        self, utterance: npt.NDArray[np.int16], tag: JobTag, context: str
    ) -> str:
        self.contexts.append(context)
        return self.words


async def test_an_interjection_is_transcribed_primed_with_backchannels() -> None:
    pipeline = PrimedPipeline()
    rig = Rig(lambda clock: pipeline)
    rig.pipeline = pipeline  # what interject() makes it hear
    try:
        await rig.ask()
        await rig.tick(10)
        await interject(rig, 15, "Mm-hm. Mm-hm. Mm-hm.")
        assert rig.conversation.session.state is TurnState.PAUSED
        await until_state(rig, TurnState.LISTENING, frames=200)
        assert pipeline.contexts == [INTERJECTION_CONTEXT]  # the judge's words, primed
        assert pipeline.transcribed == 0
        assert rig.conversation.floor.resumed == 1 and rig.conversation.floor.interrupted == 0
    finally:
        await rig.conversation.close()


async def clicks_that_prove_no_voice(rig: Rig) -> None:
    """NOISY_LAPSES clicks over the playing reply: each pauses it, and it resumes."""
    for _ in range(NOISY_LAPSES):
        await interject(rig, 3, confirmed=False)
        assert rig.conversation.session.state is TurnState.PAUSED
        await until_state(rig, TurnState.AGENT_SPEAKING, frames=50)
        await rig.tick(2)


async def test_a_room_whose_sounds_are_no_voice_stops_pausing_the_reply(rig: Rig) -> None:
    """Three clicks in a row pause the reply and prove no voice: the fourth does not pause it
    (a beeping phone would chop it), while confirmed speech still pauses it and is judged."""
    await rig.ask()
    await rig.tick(5)
    await clicks_that_prove_no_voice(rig)
    assert rig.conversation.floor.resumed == NOISY_LAPSES
    await interject(rig, 3, confirmed=False)  # the room again: the reply plays on
    assert rig.conversation.session.state is TurnState.AGENT_SPEAKING
    assert rig.heard[-1].any()
    await rig.tick(15)
    await interject(rig, 15, "Stop.")  # the user: paused once the model confirms the voice
    assert rig.conversation.session.state in (TurnState.PAUSED, TurnState.USER_SPEAKING)
    for _ in range(50):  # its words are judged once it falls quiet: an interruption
        if rig.conversation.floor.interrupted:
            break
        await rig.tick()
    assert rig.conversation.floor.interrupted == 1
    assert rig.conversation.floor.resumed == NOISY_LAPSES


async def test_sounds_the_echo_gate_partly_hid_and_no_model_confirmed_make_the_room_noisy(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Beeps over the reply's echo: the echo gate hides frames up to 40 ms after each, so the
    judge asks for their words (none) instead of calling them no voice at once. Never
    confirmed as speech, they are the room's sounds all the same: after three, the gate alone
    no longer pauses the reply (in the slow profile each such pause waited 1.8 s for Whisper,
    and a beeping microphone held the reply for minutes)."""
    detector = rig.conversation.detector
    hidden = property(lambda _echo: max(0.0, detector.gate_quiet_ms - 40.0))
    monkeypatch.setattr(EchoPath, "masked_ms", hidden)
    await rig.ask()
    await rig.tick(5)
    await clicks_that_prove_no_voice(rig)
    assert rig.events("output_audio_buffer.resumed")[-1]["reason"] == "no words"
    await interject(rig, 3, confirmed=False)  # the room again: the reply plays on
    assert rig.conversation.session.state is TurnState.AGENT_SPEAKING
    assert rig.conversation.floor.resumed == NOISY_LAPSES


async def test_the_gate_pauses_again_once_the_room_is_quiet(rig: Rig) -> None:
    await rig.ask()
    await rig.tick(5)
    for _ in range(NOISY_LAPSES):
        await interject(rig, 3, confirmed=False)
        await until_state(rig, TurnState.AGENT_SPEAKING, frames=50)
    await until_state(rig, TurnState.LISTENING, frames=400)  # the reply ends; the room quiets
    await rig.tick(round(NOISY_HOLD_MS / 20))
    await rig.ask()
    await interject(rig, 3, confirmed=False)
    assert rig.conversation.session.state is TurnState.PAUSED


async def test_the_echo_cancellers_far_end_gets_every_sample_sent_and_the_held_silence(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the link sent (the reply's samples, and silence where media time passed without
    the playback cursor) is what may come back through the client's speakers."""
    far_end: list[npt.NDArray[np.int16]] = []
    monkeypatch.setattr(rig.conversation.echo, "played", far_end.append)
    await rig.ask()
    sent = rig.conversation.pull_audio(FRAME_SAMPLES)
    assert far_end[-1] is sent and sent.any()
    rig.conversation.on_cursor_held(50 * FRAME_SAMPLES)  # a second skipped
    assert len(far_end[-1]) == 50 * FRAME_SAMPLES and not far_end[-1].any()
