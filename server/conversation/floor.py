"""Who has the floor: the user's turn starting and ending, and voice over a reply.

The user's turn ends after ``end_of_turn_ms`` of silence (the turn detector's stop). With a
semantic end of turn (``semantic_vad``), the end-of-turn model hears the utterance as soon as
the user pauses, and once more later in the same pause, with a stricter bar, if it sounded
unfinished (server/conversation/hearing.py; where the words at the pause are judged, only
once they leave it the decision): when it sounds complete the turn ends after the shorter
``complete_wait_ms``, else the detector's longer wait holds (a pause mid-sentence). Where
partial transcripts run, the turn that sounds complete also waits (up to ``WORDS_WAIT_MS`` of
quiet) for the partial loop's decode of the pause, the final transcript in waiting: words that
stop mid-sentence ("... go to") keep it open for the longer wait
(server/conversation/unfinished.py).

Voice over a reply pauses it at once (the gate's onset): a short fade, the playback cursor
held, every unplayed chunk kept. The interjection judge (server/conversation/interjection.py)
then calls it an interruption, and the epoch bumps through the conversation's one interrupt
path, or not (a cough, a click, "mm-hm"), and the reply resumes from the exact sample where it
paused. With ``vad.pause_first`` off (or ``interrupt_response`` off) confirmed speech stops the
reply at once, as before.

A sound that keeps pausing the reply and is never voice is the room (server/conversation/
room.py). At a pause where the turn waits on, the reply may begin early (server/
conversation/early.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import numpy as np
import numpy.typing as npt

from server.clock import Clock
from server.config import Config
from server.conversation.hearing import HEARING_LATEST_MS, HEARINGS, Hearing, hears_now, words_alone
from server.conversation.interjection import (
    INTERJECTION_CONTEXT,
    AskWords,
    Decision,
    HeardWords,
    InterjectionJudge,
    JudgeRules,
    Listening,
    Verdict,
    reply_words,
)
from server.conversation.partials import Partials
from server.conversation.playout import Playout
from server.conversation.realtime_session import TurnSettings
from server.conversation.reply import Replies
from server.conversation.room import RoomNoise
from server.conversation.unfinished import Bars, Words, sounds_unfinished, words_at_pause
from server.conversation.utterance import Utterance
from server.metrics import Metrics
from server.pipeline.seams import PrimedTranscripts, TurnPipeline, TurnTrace
from server.pipeline.turn_detector import TurnDetector, VadEvent, VadEventKind, VadState
from server.runtime.session import BargeIn, Session
from server.runtime.turn import TurnState
from server.scheduling.engine_queue import JobTag, StaleWork
from server.tasks import cancel

log = logging.getLogger(__name__)

Spawn = Callable[[Coroutine[Any, Any, None], str], "asyncio.Task[None]"]
PREROLL_MS = 100.0  # of audio before the onset given to the recogniser with an interjection
WORDS_WAIT_MS = 600.0  # quiet (ms) up to which a complete-sounding turn waits for its words


class Floor:
    """The turn's course for one conversation, from the turn detector's events."""

    def __init__(
        self,
        session: Session,
        detector: TurnDetector,
        utterance: Utterance,
        partials: Partials,
        pipeline: TurnPipeline | None,
        config: Config,
        metrics: Metrics,
        playout: Playout,
        replies: Replies,
        clock: Clock,
        settings: Callable[[], TurnSettings],
        spawn: Spawn,
        tag: Callable[[], JobTag],
        interrupt: Callable[[BargeIn | None], Awaitable[None]],
        flush: Callable[[], None],
    ) -> None:
        self._session = session
        self._sid = session.session_id[:8]
        self._detector = detector
        self._utterance = utterance
        self._partials = partials
        self._pipeline = pipeline
        self._config = config
        self._metrics = metrics
        self._playout = playout
        self._replies = replies
        self._clock = clock
        self._settings = settings
        self._spawn = spawn
        self._tag = tag
        self._interrupt = interrupt
        self._flush = flush
        self.judge = InterjectionJudge(JudgeRules.of(config.vad), session.session_id)
        self._partials_task: asyncio.Task[None] | None = None
        self._words_task: asyncio.Task[None] | None = None
        self._complete: bool | None = None  # the model's verdict on the utterance as it stands
        self._probing = False
        self.hearings = HEARINGS  # when in a pause the model hears the utterance
        self.hearing_latest_ms = HEARING_LATEST_MS  # 0: it hears at once, and is waited for
        self.words_wait_ms = WORDS_WAIT_MS
        self._probes = 0  # hearings begun in this pause
        self._probe_gen = 0  # an older probe's verdict no longer counts
        self.turn_probabilities: deque[float] = deque(maxlen=16)  # recent verdicts (diagnostics)
        self.speech_starts = 0
        self.resumed = 0  # pauses that were no interruption
        self.interrupted = 0  # pauses that were
        self.heard = HeardWords(session.session_id)  # recent interjections' transcripts
        self._resumed_in_speech = False  # resumed while the speech over it had only paused
        self.room = RoomNoise(clock, self._sid)

    # --- the detector's events ----------------------------------------------------------------
    async def on_vad(self, event: VadEvent) -> None:
        state = self._session.state
        replying = state in (TurnState.THINKING, TurnState.AGENT_SPEAKING)
        if event.kind is VadEventKind.ONSET:
            if replying and self._pauses() and not self.room.onset():
                self._pause(event)
        elif event.kind is VadEventKind.START:
            self._metrics.speech_starts.inc()
            self.speech_starts += 1
            if state is TurnState.PAUSED:
                pass  # the judge sees the speech on the next step
            elif replying and not self._settings().interrupt_response:
                return  # speech over a reply is not heard (interrupt_response off)
            elif replying and self._pauses() and self.room.in_noise() and self._pause(event):
                pass  # a noisy room: paused at confirmed speech, judged from here
            else:
                await self._speech_started(event.at_ms, event)
        elif state is TurnState.USER_SPEAKING:
            await self.end_user_turn(event.at_ms)
        self._flush()

    async def after_frames(self, masked_ms: float = float("inf")) -> None:
        """The detector judged more audio: the user's turn may end early (it sounds complete),
        or the pause's judgement moves on (``masked_ms``: since the residual echo gate last hid
        a frame from the detector)."""
        if self._session.state is TurnState.USER_SPEAKING:
            self._partials.heard()  # the partial loop looks at once (a pause may have begun)
            if self._detector.quiet_ms == 0.0 and self._replies.early is not None:
                await self._replies.drop_early("the user spoke on")
            await self._semantic_end()
            return
        detector = self._detector
        if self._session.state is TurnState.AGENT_SPEAKING and self._resumed_in_speech:
            self._speaks_on()
        if self._session.state is not TurnState.PAUSED:
            self.judge.abandon()
            return
        speech = detector.state is VadState.SPEECH
        quiet, gate_quiet = detector.quiet_ms, detector.gate_quiet_ms
        now = Listening(
            detector.position_ms, speech, quiet, gate_quiet, masked_ms, detector.gate_tonal
        )
        step = self.judge.step(now)
        if isinstance(step, AskWords):
            await cancel(self._words_task)
            self._words_task = self._spawn(self._judge_words(step), "interjection-words")
        elif step is not None:
            await self.decide(step)

    def _speaks_on(self) -> None:
        """The reply resumed while the speech over it had only paused (no words yet, or a
        backchannel so far): if it goes on, the reply pauses again and it is judged anew
        ("Stop, [a breath] please tell me something else")."""
        detector = self._detector
        if detector.state is not VadState.SPEECH:
            self._resumed_in_speech = False
        elif detector.quiet_ms == 0.0 and self._pauses() and self._session.pause_reply():
            self._resumed_in_speech = False
            self.judge.heard(detector.position_ms)
            now_ms = self._clock.now_ms()
            self._playout.barged_in(now_ms, now_ms)
            self._flush()

    def _pauses(self) -> bool:
        return self._config.vad.pause_first and self._settings().interrupt_response

    def _pause(self, event: VadEvent) -> bool:
        """Pause the reply for the voice of ``event``; whether a reply was paused."""
        if not self._session.pause_reply():
            return False
        self.judge.heard(event.at_ms)
        self._playout.barged_in(event.onset_arrival_ms, event.onset_arrival_ms)
        self._flush()
        return True

    async def _judge_words(self, ask: AskWords) -> None:
        """Transcribe the interjection (from just before its onset) and let the judge decide."""
        audio = self._utterance.recent(self._detector.position_ms - ask.from_ms + PREROLL_MS)
        pipeline, asked_ms = self._pipeline, self._clock.now_ms()
        assert pipeline is not None  # a reply plays, so there is a pipeline
        try:
            if isinstance(pipeline, PrimedTranscripts):
                text = await pipeline.transcribe_primed(audio, self._tag(), INTERJECTION_CONTEXT)
            else:
                text = await pipeline.transcribe(audio, self._tag())
        except StaleWork:
            return  # the pause was decided some other way (typed text, cancel, its deadline)
        except Exception as exc:  # the recogniser failed: the pause's deadline decides
            log.warning("session %s: interjection not transcribed: %s", self._sid, exc)
            return
        self.heard.add(text, self._clock.now_ms() - asked_ms)
        decision = self.judge.words(ask.attempt, text, reply_words(self._session))
        if decision is not None and self._session.state is TurnState.PAUSED:
            await self.decide(decision)

    async def decide(self, decision: Decision) -> None:
        """Act on the judge's decision about the paused reply."""
        verdict = decision.verdict.value
        log.info("session %s: voice over the reply: %s (%s)", self._sid, verdict, decision.reason)
        self._metrics.interjections.labels(verdict).inc()
        if decision.verdict is Verdict.RESUME:
            self.resumed += 1
            # voice never confirmed (a click, a beep; also one the echo gate partly hid, whose
            # words were then asked for) is not speech that could go on: the room's sound
            confirmed = self.judge.confirmed
            if not confirmed:
                self.room.lapsed()
            self._resumed_in_speech = confirmed and self._detector.state is VadState.SPEECH
            self._session.resume_reply(decision.reason)
            self._flush()
            return
        self.interrupted += 1
        back_ms = self._detector.position_ms - self.judge.onset_ms
        await self._speech_started(self.judge.onset_ms, None, back_ms)
        if self._detector.state is VadState.SILENCE:  # the speech already ended
            await self.end_user_turn(self._detector.position_ms)
        self._flush()

    async def overdue(self) -> None:
        """The paused turn reached its deadline."""
        await self.decide(self.judge.overdue())

    # --- a semantic end of turn -----------------------------------------------------------------
    async def _semantic_end(self) -> None:
        wait = self._settings().complete_wait_ms
        model = self._detector.completeness
        if wait is None or model is None or self._detector.state is not VadState.SPEECH:
            return
        quiet = self._detector.quiet_ms
        if quiet == 0.0:  # the user speaks on: a verdict on what came before no longer holds
            self._forget_verdict()
            return
        hearing = self.hearings[self._probes] if self._probes < len(self.hearings) else None
        ready = self._complete is not True and not self._probing
        alone = self._words_alone(quiet)
        due = hears_now(quiet, alone, self.hearing_latest_ms)
        if hearing is not None and ready and quiet >= hearing.quiet_ms and due:
            audio = self._utterance.audio()
            self._probing = True
            self._probes += 1
            self._spawn(self._probe(self._probe_gen, audio, hearing), "end-of-turn")
        if quiet < wait:
            return
        if self._complete is None and alone is not Words.END:
            return  # not heard yet: only words that end the turn whatever it hears end it now
        if self._complete is not None:  # the model judged: now the words
            words = self._words(quiet)
            if words is Words.WAIT or (words is Words.UNFINISHED and not self._complete):
                return  # the detector's longer wait holds (the model may hear it again)
            if words is Words.UNFINISHED:
                self._complete, self._probes = False, len(self.hearings)  # the words outrank it
                log.debug("session %s: the words at the pause sound unfinished", self._sid)
                return
        event = self._detector.end_turn()
        assert event is not None
        await self.end_user_turn(event.at_ms)
        self._flush()

    def _ending(self) -> bool:
        """Whether the user's turn may end as soon as its silence is long enough (its words left
        to the reply): the end-of-turn model has yet to judge this pause (and the words at it
        do not keep it open whatever it hears), or called it complete and the latest partial
        heard all the speech and does not stop mid-sentence."""
        quiet = self._detector.quiet_ms
        if self._complete is None:
            return quiet > 0 and self._model_pending(quiet)
        return quiet > 0 and self._words(quiet) is Words.END

    def _judges(self) -> bool:  # whether an end-of-turn model judges this conversation's pauses
        return self._settings().complete_wait_ms is not None and bool(self._detector.completeness)

    def _model_pending(self, quiet: float) -> bool:  # not judged yet, and its verdict counts
        return (self._complete is None and self._judges()
                and self._words_alone(quiet) is not Words.UNFINISHED)  # fmt: skip

    def _words(self, quiet_ms: float, complete: bool | None = None) -> Words:
        """What the partial loop's transcript of this pause and the LLM's verdict on it say,
        with the end-of-turn model's (server/conversation/unfinished.py; ``complete``: as if
        it said that); where no partials run, the model alone."""
        complete = bool(self._complete) if complete is None else complete
        if self._partials_task is None or not self._config.vad.unfinished_words:
            return Words.END if complete else Words.UNFINISHED
        partial, samples = self._partials.partial, self._utterance.samples
        pause_start = samples - int(quiet_ms * 16)
        coming, vad = self._partials.coming(samples), self._config.vad
        verdict, wait_ms, bars = self._partials.verdict, self.words_wait_ms, Bars.of(vad)
        return words_at_pause(partial.covered, partial.text, pause_start, quiet_ms, coming, wait_ms,
                              verdict, complete, bars, partial.last_word_rivals)  # fmt: skip

    def _words_alone(self, quiet_ms: float) -> Words | None:
        """What the words at this pause say whatever the end-of-turn model hears (None: its
        verdict decides; always None with ``hearing_latest_ms`` 0, the model waited for)."""
        if not self.hearing_latest_ms:
            return None
        return words_alone(self._words(quiet_ms, False), self._words(quiet_ms, True))

    async def _probe(self, gen: int, audio: npt.NDArray[np.int16], hearing: Hearing) -> None:
        """The end-of-turn model hears the utterance (in a worker thread)."""
        model = self._detector.completeness
        assert model is not None
        try:
            probability = await asyncio.to_thread(model.probability, audio)
        finally:
            self._probing = False
        if gen == self._probe_gen:
            threshold = self._config.vad.complete_probability
            self._complete = hearing.sounds_complete(probability, threshold)
            self.turn_probabilities.append(round(probability, 3))
            log.debug("session %s: the utterance sounds %s (%.2f at %.0f ms of quiet)", self._sid,
                      "complete" if self._complete else "unfinished", probability,
                      hearing.quiet_ms)  # fmt: skip

    def _forget_verdict(self) -> None:
        self._complete = None
        self._probes = 0
        self._probe_gen += 1

    # --- the user's turn ----------------------------------------------------------------------
    async def _speech_started(
        self, at_ms: float, event: VadEvent | None, back_ms: float = 0.0
    ) -> None:
        """The user takes the floor from ``at_ms`` on (an interruption of a reply, or a new
        turn); ``back_ms``: audio before now that is already theirs (a judged interjection)."""
        self._forget_verdict()
        barge = self._session.speech_started(at_ms)
        if barge is not None:
            if event is not None:  # not paused first: the reaction is timed from here
                self._playout.barged_in(event.onset_arrival_ms, event.confirmed_arrival_ms)
            await self._interrupt(barge)
        if self._session.state is TurnState.USER_SPEAKING and self._partials_task is None:
            self._utterance.begin(back_ms)
            self._partials.reset()
            if self._pipeline is not None and self._config.pipeline.incremental:
                vad, model = self._config.vad, self._detector.completeness
                semantic = model is not None and self._settings().complete_wait_ms is not None
                judge = semantic and vad.unfinished_words and vad.sentence_end
                run = self._partials.run(self._pipeline, self._ending, self._reply_early, judge)
                self._partials_task = self._spawn(run, "partials")

    async def _reply_early(self) -> bool:
        """Begin the reply at this pause (server/conversation/early.py) if its words end a
        sentence, the turn gets a spoken reply and waits on: the end-of-turn model heard it as
        unfinished, none judges (a fixed silence), or the words hold it whatever it hears. Not
        while that model's verdict is pending (a turn it calls complete ends at once), nor while
        the engines are busy."""
        settings = self._settings()
        if not self._config.pipeline.early_reply or not settings.create_response:
            return False
        judged, words = self._partials.judged(), self._partials.partial.text
        bar = self._config.vad.sentence_end_with_model
        unfinished = sounds_unfinished(words) if judged is None else judged < bar
        if settings.text_only or unfinished:
            return False
        if self._model_pending(self._detector.quiet_ms):
            return False
        return await self._replies.begin_early(self._session.epoch)

    async def stop_partials(self) -> None:
        task, self._partials_task = self._partials_task, None
        await cancel(task)

    async def end_user_turn(self, at_ms: float) -> None:
        """The user's turn ends (the VAD heard a pause from ``at_ms`` on the input timeline, or
        the turn reached its deadline): transcribe it and reply."""
        self._forget_verdict()
        await self.stop_partials()
        trace = TurnTrace(endpoint_ms=self._clock.now_ms())
        self._session.speech_stopped(at_ms)
        utterance = self._utterance.take()
        silence = int((self._detector.position_ms - at_ms) * 16)  # samples of the turn's end
        speech_end = max(0, len(utterance) - silence)
        self._replies.start(self._session.epoch, trace, utterance=utterance, speech_end=speech_end)
