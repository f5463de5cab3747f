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

The floor decides and the conversation acts: each method here takes what happened (a
detector event, more audio judged, a verdict, an interjection's words) and returns the actions
to carry out (server/conversation/turn_actions.py). It starts no task and awaits nothing; the
session's state changes only when the conversation carries an action out.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

from server.clock import Clock
from server.config import Config
from server.conversation.hearing import HEARING_LATEST_MS, HEARINGS, hears_now, words_alone
from server.conversation.interjection import (
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
from server.conversation.room import RoomNoise
from server.conversation.turn_actions import (
    DropEarly,
    EndTurn,
    HearUtterance,
    PauseReply,
    ResumeReply,
    TakeFloor,
    TranscribeInterjection,
    TurnAction,
)
from server.conversation.unfinished import Bars, Words, sounds_unfinished, words_at_pause
from server.conversation.utterance import Utterance
from server.metrics import Metrics
from server.pipeline.turn_detector import TurnDetector, VadEvent, VadEventKind, VadState
from server.runtime.session import Session
from server.runtime.turn import TurnState
from server.wire.realtime_session import TurnSettings

log = logging.getLogger(__name__)

WORDS_WAIT_MS = 600.0  # quiet (ms) up to which a complete-sounding turn waits for its words
Actions = list[TurnAction]


class Floor:
    """The turn's course for one conversation, decided from the turn detector's events."""

    def __init__(
        self,
        session: Session,
        detector: TurnDetector,
        utterance: Utterance,
        partials: Partials,
        config: Config,
        metrics: Metrics,
        clock: Clock,
        settings: Callable[[], TurnSettings],
        incremental: bool,
    ) -> None:
        """``incremental``: partial transcripts run while the user speaks (a pipeline that
        decodes them, ``pipeline.incremental`` on)."""
        self._session = session
        self._sid = session.session_id[:8]
        self._detector = detector
        self._utterance = utterance
        self._partials = partials
        self._config = config
        self._metrics = metrics
        self._clock = clock
        self._settings = settings
        self._incremental = incremental
        self.judge = InterjectionJudge(JudgeRules.of(config.vad), session.session_id)
        self.partials_on = False  # the partial loop runs for the user's turn
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
    def on_vad(self, event: VadEvent) -> Actions:
        """One decision of the turn detector: its onset, start or stop of speech."""
        state = self._session.state
        replying = state in (TurnState.THINKING, TurnState.AGENT_SPEAKING)
        if event.kind is VadEventKind.ONSET:
            if replying and self._pauses() and not self.room.onset():
                return self._pause(event.at_ms, event.onset_arrival_ms)
            return []
        if event.kind is VadEventKind.START:
            self._metrics.speech_starts.inc()
            self.speech_starts += 1
            if state is TurnState.PAUSED:
                return []  # the judge sees the speech on the next step
            if replying and not self._settings().interrupt_response:
                return []  # speech over a reply is not heard (interrupt_response off)
            if replying and self._pauses() and self.room.in_noise():
                return self._pause(event.at_ms, event.onset_arrival_ms)  # judged from here
            return self._take_floor(event.at_ms, event.onset_arrival_ms, event.confirmed_arrival_ms)
        if state is TurnState.USER_SPEAKING:
            return self.end_turn(event.at_ms)
        return []

    def after_frames(self, masked_ms: float = float("inf"), early: bool = False) -> Actions:
        """The detector judged more audio: the user's turn may end early (it sounds complete),
        or the pause's judgement moves on (``masked_ms``: since the residual echo gate last hid
        a frame from the detector; ``early``: a reply was begun at the user's pause)."""
        state, detector = self._session.state, self._detector
        if state is TurnState.USER_SPEAKING:
            dropped: Actions = []
            if detector.quiet_ms == 0.0 and early:
                dropped.append(DropEarly("the user spoke on"))
            return dropped + self._semantic_end()
        actions: Actions = []
        if state is TurnState.AGENT_SPEAKING and self._resumed_in_speech:
            actions = self._speaks_on()
        if state is not TurnState.PAUSED and not actions:
            self.judge.abandon()
            return actions
        speech = detector.state is VadState.SPEECH
        quiet, gate_quiet = detector.quiet_ms, detector.gate_quiet_ms
        now = Listening(
            detector.position_ms, speech, quiet, gate_quiet, masked_ms, detector.gate_tonal
        )
        step = self.judge.step(now)
        if isinstance(step, AskWords):
            actions.append(TranscribeInterjection(step))
        elif step is not None:
            actions += self.decide(step)
        return actions

    def _speaks_on(self) -> Actions:
        """The reply resumed while the speech over it had only paused (no words yet, or a
        backchannel so far): if it goes on, the reply pauses again and it is judged anew
        ("Stop, [a breath] please tell me something else")."""
        detector = self._detector
        if detector.state is not VadState.SPEECH:
            self._resumed_in_speech = False
        elif detector.quiet_ms == 0.0 and self._pauses():
            self._resumed_in_speech = False
            return self._pause(detector.position_ms, self._clock.now_ms())
        return []

    def _pauses(self) -> bool:
        return self._config.vad.pause_first and self._settings().interrupt_response

    def _pause(self, at_ms: float, arrival_ms: float) -> Actions:
        """Pause the reply for voice from ``at_ms`` (input timeline); the judge hears it."""
        self.judge.heard(at_ms)
        return [PauseReply(arrival_ms)]

    def interjection_heard(self, ask: AskWords, text: str, took_ms: float) -> Actions:
        """The words of the voice over the paused reply came (``took_ms`` after they were
        asked for): the judge decides, if the reply is still paused."""
        self.heard.add(text, took_ms)
        decision = self.judge.words(ask.attempt, text, reply_words(self._session))
        if decision is None or self._session.state is not TurnState.PAUSED:
            return []
        return self.decide(decision)

    def decide(self, decision: Decision) -> Actions:
        """The judge's decision about the paused reply: resume it, or the user takes the floor."""
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
            return [ResumeReply(decision.reason)]
        self.interrupted += 1
        back_ms = self._detector.position_ms - self.judge.onset_ms
        actions = self._take_floor(self.judge.onset_ms, back_ms=back_ms)
        if self._detector.state is VadState.SILENCE:  # the speech already ended
            actions += self.end_turn(self._detector.position_ms)
        return actions

    def client_stopped(self) -> Actions:
        """A client that plays the audio itself stopped the paused reply (it truncated it at
        the voice over it): speech already confirmed interrupts now and becomes the user's
        turn; voice not yet confirmed is left to the detector, whose start of speech begins
        the turn once the reply is cancelled."""
        if self._session.state is not TurnState.PAUSED:
            return []
        if self._detector.state is not VadState.SPEECH:
            return []
        actions = self.decide(Decision(Verdict.INTERRUPT, "the client stopped the reply"))
        self.judge.abandon()
        return actions

    def overdue(self) -> Actions:
        """The paused turn reached its deadline: the voice over the reply is judged now."""
        return self.decide(self.judge.overdue())

    # --- a semantic end of turn -----------------------------------------------------------------
    def _semantic_end(self) -> Actions:
        wait = self._settings().complete_wait_ms
        model = self._detector.completeness
        if wait is None or model is None or self._detector.state is not VadState.SPEECH:
            return []
        quiet = self._detector.quiet_ms
        if quiet == 0.0:  # the user speaks on: a verdict on what came before no longer holds
            self._forget_verdict()
            return []
        actions: Actions = []
        hearing = self.hearings[self._probes] if self._probes < len(self.hearings) else None
        ready = self._complete is not True and not self._probing
        alone = self._words_alone(quiet)
        due = hears_now(quiet, alone, self.hearing_latest_ms)
        if hearing is not None and ready and quiet >= hearing.quiet_ms and due:
            self._probing = True
            self._probes += 1
            actions.append(HearUtterance(self._probe_gen, hearing))
        if quiet < wait:
            return actions
        if self._complete is None and alone is not Words.END:
            return actions  # not heard yet: only words that end the turn whatever it hears do
        if self._complete is not None:  # the model judged: now the words
            words = self._words(quiet)
            if words is Words.WAIT or (words is Words.UNFINISHED and not self._complete):
                return actions  # the detector's longer wait holds (the model may hear it again)
            if words is Words.UNFINISHED:
                self._complete, self._probes = False, len(self.hearings)  # the words outrank it
                log.debug("session %s: the words at the pause sound unfinished", self._sid)
                return actions
        event = self._detector.end_turn()
        assert event is not None
        return actions + self.end_turn(event.at_ms)

    def ending(self) -> bool:
        """Whether the user's turn may end as soon as its silence is long enough (its words left
        to the reply): the end-of-turn model has yet to judge this pause (and the words at it
        do not keep it open whatever it hears), or called it complete and the latest partial
        heard all the speech and does not stop mid-sentence."""
        quiet = self._detector.quiet_ms
        if self._complete is None:
            return quiet > 0 and self._model_pending(quiet)
        return quiet > 0 and self._words(quiet) is Words.END

    def _judges(self) -> bool:
        """Whether an end-of-turn model judges this conversation's pauses."""
        return self._settings().complete_wait_ms is not None and bool(self._detector.completeness)

    def _model_pending(self, quiet: float) -> bool:
        """The model has not judged this pause yet, and its verdict counts."""
        if self._complete is not None or not self._judges():
            return False
        return self._words_alone(quiet) is not Words.UNFINISHED

    def _words(self, quiet_ms: float, complete: bool | None = None) -> Words:
        """What the partial loop's transcript of this pause and the LLM's verdict on it say,
        with the end-of-turn model's (server/conversation/unfinished.py; ``complete``: as if
        it said that); where no partials run, the model alone."""
        complete = bool(self._complete) if complete is None else complete
        if not self.partials_on or not self._config.vad.unfinished_words:
            return Words.END if complete else Words.UNFINISHED
        partial, samples = self._partials.partial, self._utterance.samples
        pause_start = samples - int(quiet_ms * 16)
        return words_at_pause(
            partial.covered,
            partial.text,
            pause_start,
            quiet_ms,
            self._partials.coming(samples),
            self.words_wait_ms,
            self._partials.verdict,
            complete,
            Bars.of(self._config.vad),
            partial.last_word_rivals,
        )

    def _words_alone(self, quiet_ms: float) -> Words | None:
        """What the words at this pause say whatever the end-of-turn model hears (None: its
        verdict decides; always None with ``hearing_latest_ms`` 0, the model waited for)."""
        if not self.hearing_latest_ms:
            return None
        return words_alone(self._words(quiet_ms, False), self._words(quiet_ms, True))

    def heard_probability(self, hearing: HearUtterance, probability: float | None) -> None:
        """The end-of-turn model heard the utterance: ``probability`` that it is complete (None:
        the model failed). A verdict on an earlier pause no longer counts."""
        self._probing = False
        if probability is None or hearing.generation != self._probe_gen:
            return
        threshold = self._config.vad.complete_probability
        self._complete = hearing.hearing.sounds_complete(probability, threshold)
        self.turn_probabilities.append(round(probability, 3))
        sounds = "complete" if self._complete else "unfinished"
        quiet = hearing.hearing.quiet_ms
        log.debug(
            "session %s: the utterance sounds %s (%.2f at %.0f ms of quiet)",
            *(self._sid, sounds, probability, quiet),
        )

    def _forget_verdict(self) -> None:
        self._complete = None
        self._probes = 0
        self._probe_gen += 1

    # --- the user's turn ----------------------------------------------------------------------
    def _take_floor(
        self,
        at_ms: float,
        onset_arrival_ms: float | None = None,
        confirmed_arrival_ms: float | None = None,
        back_ms: float = 0.0,
    ) -> Actions:
        """The user takes the floor from ``at_ms`` on (an interruption of a reply, or a new
        turn); ``back_ms``: audio before now that is already theirs (a judged interjection)."""
        self._forget_verdict()
        begin = not self.partials_on
        partials = begin and self._incremental
        self.partials_on = self.partials_on or partials
        vad, model = self._config.vad, self._detector.completeness
        semantic = model is not None and self._settings().complete_wait_ms is not None
        judge = semantic and vad.unfinished_words and vad.sentence_end
        arrivals = (onset_arrival_ms, confirmed_arrival_ms)
        return [TakeFloor(at_ms, *arrivals, back_ms, begin, partials, judge)]

    def may_reply_early(self) -> bool:
        """Whether the reply may begin at this pause (server/conversation/early.py): its words
        end a sentence, the turn gets a spoken reply and waits on: the end-of-turn model heard
        it as unfinished, none judges (a fixed silence), or the words hold it whatever it
        hears. Not while that model's verdict is pending (a turn it calls complete ends at
        once)."""
        settings = self._settings()
        if not self._config.pipeline.early_reply or not settings.create_response:
            return False
        judged, words = self._partials.judged(), self._partials.partial.text
        bar = self._config.vad.sentence_end_with_model
        unfinished = sounds_unfinished(words) if judged is None else judged < bar
        if settings.text_only or unfinished:
            return False
        return not self._model_pending(self._detector.quiet_ms)

    def partials_stopped(self) -> None:
        """The partial loop of the user's turn was stopped (typed text, a cleared input)."""
        self.partials_on = False

    def end_turn(self, at_ms: float) -> Actions:
        """The user's turn ends (the VAD heard a pause from ``at_ms`` on the input timeline, or
        the turn reached its deadline): transcribe it and reply."""
        self._forget_verdict()
        self.partials_on = False
        return [EndTurn(at_ms)]
