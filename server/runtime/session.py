"""The session runtime: epoch, cursors, turn state, chunks, history, playback. No I/O.

Everything that changes a session goes through a method here, so the rules (stale epochs are
dropped, history holds only what was played, conditions change at chunk boundaries) live in one
place; the chunk bookkeeping of the response in progress is server/runtime/response.py. Time
comes from the injected clock; media positions are samples at 48 kHz.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Collection, Mapping
from typing import Any, TypeVar

from server.clock import Clock
from server.config import RuntimeConfig
from server.errors import InvalidTransition
from server.runtime.boundary import ConditionGate
from server.runtime.calls import PendingCalls
from server.runtime.chunk import Chunk, StageMessage
from server.runtime.conditions import ConditionQueue, Conditions
from server.runtime.events import (
    InputCleared,
    InputCommitted,
    ResponseDone,
    ResponseStatus,
    SessionEvent,
    SpeechStarted,
    SpeechStopped,
    TurnTimedOut,
    UserItemAdded,
)
from server.runtime.history import History, TokenCounter, Turn, approx_tokens
from server.runtime.items import ItemIds, Items
from server.runtime.media import ms_to_samples, samples_to_ms
from server.runtime.playback import PlaybackBuffer, Pull
from server.runtime.response import ChunkAudio, Response, heard_prefix
from server.runtime.session_records import BargeIn, Cursors, InputCursors, Overdue
from server.runtime.session_view import SessionView
from server.runtime.stage import Stage
from server.runtime.tools import FunctionCall
from server.runtime.turn import TurnDeadlines, TurnMachine, TurnState

__all__ = ["BargeIn", "ChunkAudio", "Cursors", "Overdue", "Session", "heard_prefix"]

log = logging.getLogger(__name__)

P = TypeVar("P")
REPLYING = (TurnState.THINKING, TurnState.AGENT_SPEAKING, TurnState.PAUSED)  # a reply is on


class Session:
    """One connected peer's conversation state."""

    def __init__(
        self,
        session_id: str,
        config: RuntimeConfig,
        clock: Clock,
        count_tokens: TokenCounter = approx_tokens,
        choices: Mapping[str, Collection[str]] | None = None,
    ) -> None:
        """``choices``: the values a condition may take (e.g. the renderer's appearances)."""
        self.session_id = session_id
        self.config = config
        self.clock = clock
        self.epoch = 0
        self.turn = TurnMachine(
            session_id,
            clock,
            TurnDeadlines(
                config.user_speaking_timeout_ms,
                config.thinking_timeout_ms,
                config.agent_speaking_timeout_ms,
                config.paused_timeout_ms,
            ),
        )
        self.history = History(config.persona, config.max_history_turns, count_tokens)
        self.playback: PlaybackBuffer[Any] = PlaybackBuffer(
            ms_to_samples(config.lookahead_budget_ms),
            ms_to_samples(config.fade_ms),
            lambda: self.epoch,
        )
        self.stale_dropped: Counter[Stage] = Counter()
        self.input = InputCursors()
        self._turn_ended_ms: float | None = None
        self._events: deque[SessionEvent] = deque()
        self._conditions = ConditionGate(
            ConditionQueue(Conditions(config.persona, config.voice, config.appearance), choices),
            self.history,
            self._events,
        )
        self._response = Response(session_id, self.playback, self.history, self._events)
        self.acked_playback_ms = 0.0
        self.ids = ItemIds()
        self.user_item_id: str | None = None  # the item the user's speech in progress becomes
        self.items = Items(self.history, self.ids, self._response, self._events)
        self.calls = PendingCalls(session_id)  # the agent's calls waiting for their output
        self._paused_from = TurnState.AGENT_SPEAKING  # the state a resumed reply goes back to

    # --- read-only views ------------------------------------------------------------------
    @property
    def state(self) -> TurnState:
        return self.turn.state

    @property
    def conditions(self) -> Conditions:
        return self._conditions.current

    @property
    def cursors(self) -> Cursors:
        playback = self.playback
        heard, prefilled = self.input.heard_until, self.input.prefilled_until
        return Cursors(heard, prefilled, playback.generation_cursor, playback.playback_cursor)

    def chunk(self, chunk_id: int) -> Chunk:
        """The chunk ``chunk_id``; UnknownChunk if there is none (or no longer)."""
        return self._response.chunk(chunk_id)

    def pending_chunks(self) -> tuple[Chunk, ...]:
        return self._response.pending()

    def drain_events(self) -> list[SessionEvent]:
        """Events produced since the last call, oldest first."""
        out = list(self._events)
        self._events.clear()
        return out

    def view(self) -> SessionView:
        """What the scheduler needs to know about this session now."""
        waiting = self._turn_ended_ms if self.state is TurnState.THINKING else None
        paused = self.state is TurnState.PAUSED
        if paused:  # the user waits for the reply to go on (or stop)
            waiting = self.turn.entered_ms
        budget = float(self.config.lookahead_budget_ms)
        slack = self.playback.slack_ms
        return SessionView(self.session_id, self.epoch, slack, budget, waiting, paused)

    # --- input side -----------------------------------------------------------------------
    def speech_started(self, at_ms: float | None = None) -> BargeIn | None:
        """The VAD heard the user start speaking (``at_ms`` on the input timeline); over a
        response this is a barge-in."""
        barge: BargeIn | None = None
        if self.state is not TurnState.USER_SPEAKING or self.user_item_id is None:
            self.user_item_id = self.ids.item()  # a new turn: a new user item
        if self.state in REPLYING:
            barge = self.bump_epoch("barge-in: user speech", TurnState.USER_SPEAKING)
        elif self.state is TurnState.LISTENING:
            self.history.start_user_turn()
            self.calls.interrupted("the user spoke")
            self.turn.to(TurnState.USER_SPEAKING, "speech started")
        start = samples_to_ms(self.input.heard_until) if at_ms is None else at_ms
        self._events.append(SpeechStarted(start, self.user_item_id))
        return barge

    def set_user_transcript(self, text: str) -> None:
        self.history.set_user_text(text)  # the latest partial transcript of the turn

    def speech_stopped(self, at_ms: float | None = None) -> None:
        """End of the user's turn (VAD silence from ``at_ms``); the agent starts thinking."""
        if self.state is not TurnState.USER_SPEAKING:
            raise InvalidTransition(f"speech stopped while {self.state.value}")
        self.turn.to(TurnState.THINKING, "end of turn")
        self._turn_ended_ms = self.clock.now_ms()
        end = samples_to_ms(self.input.heard_until) if at_ms is None else at_ms
        item_id = self.user_item_id = self.user_item_id or self.ids.item()
        self._events.append(SpeechStopped(end, item_id))
        self._events.append(InputCommitted(item_id, self.history.last_item_id))

    def commit_user_turn(self, final_text: str, answer: bool = True) -> Turn | None:
        """The final transcript of the ended turn; empty text means it was no turn at all.
        ``answer`` False (no automatic response): listen again until ``response.create``."""
        self.history.set_user_text(final_text)
        item_id, self.user_item_id = self.user_item_id or self.ids.item(), None
        turn = self.history.end_user_turn(self.epoch, item_id)
        if (turn is None or not answer) and self.state is TurnState.THINKING:
            self.turn.to(TurnState.LISTENING, "no response" if turn else "empty transcript")
        return turn

    def submit_text(self, text: str) -> tuple[Turn | None, BargeIn | None]:
        """Typed user text (``conversation.item.create``): a whole turn at once. It always gets
        through: over a reply it interrupts like speech; over the user's own spoken turn it
        takes that turn's place."""
        if not text.strip():
            raise ValueError("typed text is empty")
        barge = None
        if self.state in REPLYING:
            barge = self.bump_epoch("barge-in: typed text", TurnState.THINKING)
        elif self.state is TurnState.USER_SPEAKING:
            # the typed message supersedes the spoken turn in progress (it is not transcribed)
            self.turn.to(TurnState.THINKING, "typed text supersedes speech")
        else:
            self.turn.to(TurnState.THINKING, "typed text")
        self.calls.interrupted("the user typed")
        self._turn_ended_ms = self.clock.now_ms()
        self.user_item_id = None
        self.history.set_user_text(text)
        previous = self.history.last_item_id
        turn = self.history.end_user_turn(self.epoch, self.ids.item())
        if turn is not None:
            self._events.append(UserItemAdded(turn.item_id, turn.text, previous))
        return turn, barge

    def request_response(self) -> None:
        """``response.create``: answer the conversation as it stands; only while listening."""
        if self.state is not TurnState.LISTENING:
            raise InvalidTransition(f"response.create while {self.state.value}")
        self.turn.to(TurnState.THINKING, "response.create")
        self._turn_ended_ms = self.clock.now_ms()

    def clear_input(self) -> None:
        """``input_audio_buffer.clear``: the user's speech in progress is dropped."""
        if self.state is TurnState.USER_SPEAKING:
            self.history.start_user_turn()
            self.user_item_id = None
            self.turn.to(TurnState.LISTENING, "input_audio_buffer.clear")
        self._events.append(InputCleared())

    def cancel_response(self) -> BargeIn | None:
        """``response.cancel`` from the client: stop the reply, keep what was heard."""
        if self.state not in REPLYING:
            return None
        return self.bump_epoch("response.cancel", TurnState.LISTENING)

    def pause_reply(self) -> bool:
        """Voice over a reply, not yet judged: playback holds, every chunk is kept. False when
        no reply is on."""
        if self.state not in (TurnState.THINKING, TurnState.AGENT_SPEAKING):
            return False
        self._paused_from = self.state
        self._response.pause()
        self.turn.to(TurnState.PAUSED, "voice over the reply")
        return True

    def resume_reply(self, reason: str) -> None:
        """No interruption (``reason``): the reply plays on from the sample where it paused."""
        if self.state is not TurnState.PAUSED:
            raise InvalidTransition(f"resume while {self.state.value}")
        self._response.resume(reason)
        self.turn.to(self._paused_from, f"resumed: {reason}")

    def ack_playback(self, played_ms: float) -> float:
        """The client has played ``played_ms`` of output: never beyond what was sent, never
        backwards. Returns the acknowledged position (ms)."""
        sent_ms = samples_to_ms(self.playback.playback_cursor)
        self.acked_playback_ms = max(self.acked_playback_ms, min(played_ms, sent_ms))
        return self.acked_playback_ms

    # --- liveness ---------------------------------------------------------------------------
    def overdue(self) -> Overdue | None:
        """The current turn state if it is past its deadline (see server/runtime/turn.py), with the
        stage it is waiting for; None while every deadline holds."""
        waited = self.turn.overdue()
        if waited is None:
            return None
        return Overdue(self.state, self._response.waiting_for(self.state), waited)

    def time_out(self, overdue: Overdue) -> BargeIn:
        """End a reply that passed its deadline: it stops as at an interruption (what was heard
        stays in history; ``response.done`` says failed), an ``error`` (``timeout``) names the
        late stage, and the session listens again (a user's turn ends as at a pause instead)."""
        if overdue.state not in REPLYING:
            raise InvalidTransition(f"time_out of a {overdue.state.value} turn")
        self._events.append(TurnTimedOut(self.epoch, overdue.state.value, overdue.stage))
        if overdue.stage == "asr":
            self.history.start_user_turn()  # never transcribed: the turn is dropped
        return self.bump_epoch(
            f"timeout: {overdue.stage}", TurnState.LISTENING, ResponseStatus.FAILED
        )

    # --- epochs -----------------------------------------------------------------------------
    def bump_epoch(
        self,
        reason: str,
        next_state: TurnState = TurnState.USER_SPEAKING,
        status: ResponseStatus = ResponseStatus.CANCELLED,
    ) -> BargeIn:
        """An interruption (speech, typed text, cancel, a missed turn deadline): start a new
        epoch. Unplayed chunks are discarded, the chunk being played is committed up to what
        was heard, queued output is flushed, and older-epoch messages are dropped from now on.
        ``status``: of the ``response.done`` sent for a reply in progress."""
        old = self.epoch
        self.epoch += 1
        flushed = self.playback.flush()
        cut = self._response.interrupt(old, status)
        if next_state is TurnState.USER_SPEAKING:
            self.history.start_user_turn()
        self.calls.interrupted(reason)
        self.turn.to(next_state, reason)
        cuts = f"{len(cut.discarded)} chunks discarded, {samples_to_ms(flushed):.0f} ms flushed"
        sid = self.session_id[:8]
        log.info("session %s epoch %d -> %d (%s): %s", sid, old, self.epoch, reason, cuts)
        return BargeIn(old, self.epoch, reason, cut.discarded, cut.truncated, flushed)

    def accept(self, msg: StageMessage[Any]) -> bool:
        """Stage-message gate: False (and counted) for an older epoch's message."""
        if msg.epoch < self.epoch:
            self.stale_dropped[msg.stage] += 1
            return False
        if msg.epoch > self.epoch:
            raise ValueError(f"message of future epoch {msg.epoch} (session at {self.epoch})")
        return True

    def message(self, chunk: Chunk, stage: Stage, payload: P) -> StageMessage[P]:
        """A stage message for ``chunk`` carrying ``payload``."""
        return StageMessage(
            self.session_id, chunk.chunk_id, chunk.epoch, stage, chunk.conditions_version, payload
        )

    # --- output side ----------------------------------------------------------------------
    def request_update(self, changes: dict[str, object]) -> None:
        """``session.update``: queued, applied at the next chunk boundary. Invalid: no change."""
        self._conditions.request(changes)
        self._apply_conditions_if_idle()

    def observe_presence(self, note: str) -> None:
        """Vision's note on the user (present / stepped away): applied at the next boundary."""
        self._conditions.observe(note)
        self._apply_conditions_if_idle()

    def start_response(self, epoch: int, output: str = "audio") -> bool:
        """Generation of a reply for ``epoch`` begins (``output``: ``audio``, or ``text`` for
        a text-only reply); False if that epoch is already stale."""
        if epoch != self.epoch or self.state not in (TurnState.THINKING, TurnState.PAUSED):
            return False
        self._response.begin(epoch, self.ids.response(), self.ids.item(), output)
        return True

    def record_call(self, epoch: int, call: FunctionCall, told: bool = True) -> bool:
        """The response of ``epoch`` called a function: an item in history, told to the
        client (``told``; not for the avatar's own tools), waiting for its output until the
        call's deadline. False (nothing recorded) if that epoch is stale: an interruption came
        between the call's making and now."""
        if epoch != self.epoch or epoch != self._response.epoch:
            self.stale_dropped[Stage.LLM] += 1
            return False
        self.items.record_call(call, epoch, told)
        self.calls.made(call.call_id, self.clock.now_ms() + self.config.tool_output_timeout_ms)
        return True

    def add_call_output(
        self, call_id: str, output: str, item_id: str | None = None, told: bool = True
    ) -> bool:
        """A ``function_call_output`` for ``call_id`` (InvalidItem for a call the
        conversation does not hold): the client's, or (``told`` False) an output the server
        made. Kept in history whenever it comes; whether it came while the call waited for it
        (if not, the ``response.create`` after it starts no reply)."""
        self.items.add_call_output(call_id, output, self.epoch, item_id, told)
        return self.calls.answered(call_id)

    def deliver_text(self, chunk: Chunk) -> bool:
        """A text-only reply's chunk: committed as it is sent; False if stale."""
        if chunk.epoch != self.epoch:
            return False
        self._response.show(chunk.chunk_id)
        self._maybe_finish()
        return True

    def open_chunk(self, epoch: int, text: str) -> Chunk | None:
        """A chunk boundary: queued condition updates apply, then a new chunk is opened.

        Returns None (and counts a stale LLM message) for an older epoch.
        """
        if epoch < self.epoch:
            self.stale_dropped[Stage.LLM] += 1
            return None
        if epoch != self._response.epoch:
            raise InvalidTransition(f"open_chunk for epoch {epoch} without start_response")
        conditions = self._conditions.apply()
        return self._response.open(epoch, text, conditions.version)

    def deliver_audio(self, msg: StageMessage[ChunkAudio]) -> int | None:
        """Queue a chunk's audio within the lookahead budget.

        Returns the number of samples accepted (a prefix: deliver the rest later), or None when
        the message is stale and was dropped.
        """
        if not self.accept(msg):
            return None
        return self._response.add_audio(msg.chunk_id, msg.epoch, msg.payload)

    def deliver_video(self, msg: StageMessage[Any], offset: int) -> bool:
        """Queue a video frame shown from ``offset`` samples into its chunk; False if refused."""
        if not self.accept(msg):
            return False
        return self.playback.push_video(msg.chunk_id, msg.epoch, offset, msg.payload)

    def finish_response(
        self, epoch: int, status: ResponseStatus | str = ResponseStatus.COMPLETED
    ) -> None:
        """The generator has no more chunks for ``epoch`` (``status``: completed or failed, or
        its value). What is buffered still plays, then the turn listens again; a turn that
        never got a response (e.g. its engine failed first) listens again now."""
        status = ResponseStatus(status)
        if epoch != self.epoch:
            return
        if self._response.epoch is None:
            if self.state is TurnState.THINKING:
                self._events.append(ResponseDone(epoch, status))
                self.turn.to(TurnState.LISTENING, f"no reply ({status})")
            return
        self._response.finish(status)
        self._maybe_finish()

    def pull_audio(self, n: int) -> Pull:
        """The outbound track takes ``n`` samples; played chunks are committed to history."""
        pulled = self.playback.pull(n)
        for span in pulled.spans:
            if self._response.played(span) and self.state is TurnState.THINKING:
                self.turn.to(TurnState.AGENT_SPEAKING, "first audio played")
        self._maybe_finish()
        return pulled

    # --- internals --------------------------------------------------------------------------
    def _apply_conditions_if_idle(self) -> None:
        """No chunk in flight: this is a boundary, so queued changes apply now."""
        if not self.pending_chunks():
            self._conditions.apply()

    def _maybe_finish(self) -> None:
        """When the reply is generated and every chunk played: response done, listen again."""
        if not self._response.settle():
            return
        if self.state in REPLYING:
            self.playback.resume()  # played out while paused: nothing is held any more
            self.turn.to(TurnState.LISTENING, "reply played out")
        if self._conditions.pending:
            self._conditions.apply()
