"""What the reply of one turn does next, decided from what it is told (server/conversation/
reply.py carries it out).

A spoken turn's final transcript is sent and committed (an empty one is no turn; with the
session's ``create_response`` off the turn is not answered); a stale epoch ends the reply
unheard. Then the response starts (audio or text), the early reply begun at the user's pause
(server/conversation/early.py) is adopted if it asks the same, and each sentence of the LLM's
stream is opened as a chunk, sent as text, and spoken (the early reply's first sentence with
its ready speech) or, in a text reply, committed as it is sent. The stream's end, a chunk gone
stale, or a failure finishes the response; a timeout or an engine's error also tells the
client (``server_error``), a ``StaleWork`` (a barge-in ended the epoch while a job waited) not.

``ReplyPlan`` decides: it is told what happened and returns the actions to carry out in order;
the last may ask for something (``Transcribe``, ``CommitTurn``, ``StartResponse``,
``TryAdopt``, ``AwaitEarly``, ``NextSentence``, ``OpenChunk``, ``Speak``) whose outcome is told
back. It reads the session, changes nothing and awaits nothing, so it is tested without
asyncio (tests/server/conversation/test_reply_plan.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from server.pipeline.seams import TurnTrace
from server.runtime.chunk import Chunk
from server.runtime.conditions import Conditions
from server.runtime.events import ResponseDone, ResponseStatus
from server.runtime.session import Session
from server.runtime.tools import FunctionCall
from server.scheduling.engine_queue import StaleWork


@dataclass(frozen=True)
class Transcribe:
    """Transcribe the turn's utterance (final); tell ``transcribed``."""


@dataclass(frozen=True)
class EmitTranscript:
    """Send the client the final ``transcript`` of the user's item ``item_id``."""

    epoch: int
    transcript: str
    item_id: str


@dataclass(frozen=True)
class CommitTurn:
    """Commit the user's turn with ``text`` (``answer``: a response follows); tell
    ``committed``."""

    text: str
    answer: bool


@dataclass(frozen=True)
class Flush:
    """Send the client what the session emitted."""


@dataclass(frozen=True)
class StartResponse:
    """The response of ``epoch`` begins, in ``output`` (``audio`` or ``text``); tell
    ``started``."""

    epoch: int
    output: str


@dataclass(frozen=True)
class Compose:
    """Make the reply's request now (the conversation as history holds it, its instructions)."""


@dataclass(frozen=True)
class TryAdopt:
    """Whether the early reply answers the request; tell ``answers``."""


@dataclass(frozen=True)
class AwaitEarly:
    """Someone waits for the early reply now: wait for its preparation (a stage's time at
    most); tell ``prepared``."""


@dataclass(frozen=True)
class AdoptEarly:
    """The reply goes on from the early one: its trace, its sentences."""


@dataclass(frozen=True)
class CloseEarly:
    """Close the early reply before the reply's own request (the LLM slot is the session's)."""


@dataclass(frozen=True)
class OpenStream:
    """Open the LLM's sentence stream for the request."""


@dataclass(frozen=True)
class NextSentence:
    """Take the stream's next sentence (a stage's time at most); tell ``sentence``."""


@dataclass(frozen=True)
class OpenChunk:
    """Open a chunk of ``epoch`` for ``sentence``; tell ``opened``."""

    epoch: int
    sentence: str


@dataclass(frozen=True)
class MakeCall:
    """The reply of ``epoch`` calls a function: record ``call`` and tell the client; tell
    ``called``."""

    epoch: int
    call: FunctionCall


@dataclass(frozen=True)
class FollowUp:
    """The reply of ``epoch`` ran the avatar's own tools and said nothing after them: another
    reply follows once it has played, reading their outputs."""

    epoch: int


@dataclass(frozen=True)
class EmitDelta:
    """Send the client ``chunk``'s text (the reply of ``epoch``: response ``response_id``,
    item ``item_id``)."""

    epoch: int
    chunk: Chunk
    response_id: str
    item_id: str


@dataclass(frozen=True)
class DeliverText:
    """A text reply's ``chunk``: committed as it is sent."""

    chunk: Chunk


@dataclass(frozen=True)
class Speak:
    """Synthesise ``chunk`` and queue its speech (``from_early``: the early reply's ready
    speech of its first sentence); tell ``spoken``."""

    chunk: Chunk
    from_early: bool


@dataclass(frozen=True)
class WaitForRoom:
    """Wait until the lookahead budget has room."""


@dataclass(frozen=True)
class Finish:
    """The response of ``epoch`` has no more chunks (``status``: completed or failed)."""

    epoch: int
    status: ResponseStatus


@dataclass(frozen=True)
class WarmWhenPlayed:
    """Once the reply of ``epoch`` has played out, move the recent window and warm it."""

    epoch: int


@dataclass(frozen=True)
class ServerError:
    """Tell the client an engine failed (``error.type`` ``server_error``)."""

    code: str
    message: str


@dataclass(frozen=True)
class ReportTimings:
    """The heard reply's stage ``timings`` (ms), as ``response.timings`` and for /debug."""

    epoch: int
    status: str
    timings: dict[str, Any]


ReplyAction = (
    Transcribe
    | EmitTranscript
    | CommitTurn
    | Flush
    | StartResponse
    | Compose
    | TryAdopt
    | AwaitEarly
    | AdoptEarly
    | CloseEarly
    | OpenStream
    | NextSentence
    | OpenChunk
    | MakeCall
    | FollowUp
    | EmitDelta
    | DeliverText
    | Speak
    | WaitForRoom
    | Finish
    | WarmWhenPlayed
    | ServerError
)
Actions = list[ReplyAction]
# what the loop awaits or asks the session, and tells back (the last action of a list)
ASKS = (
    Transcribe,
    CommitTurn,
    StartResponse,
    TryAdopt,
    AwaitEarly,
    NextSentence,
    OpenChunk,
    MakeCall,
    Speak,
)


class ReplyPlan:
    """The course of one reply (of ``epoch``): what it does next."""

    def __init__(
        self,
        session: Session,
        epoch: int,
        text_only: bool,
        instructions: bool = False,
        early: bool = False,
        incremental: bool = False,
        limit_s: float = 0.0,
    ) -> None:
        """``instructions``: the reply has its own (the early reply, on the persona, cannot
        answer it); ``early``: an early reply was begun at the turn's pause; ``incremental``:
        the window is warmed once the reply has played; ``limit_s``: each engine call's."""
        self._session = session
        self.epoch = epoch
        self.text_only = text_only
        self._instructions = instructions
        self._early = early
        self._incremental = incremental
        self._limit_s = limit_s
        self._answer = True
        self._pipeline = True  # False: no reply pipeline (a spoken turn is only committed)
        self._ready = False  # the early reply's first sentence is spoken already ...
        self._voice: Conditions | None = None  # ... with these conditions
        self._own_unsaid = False  # the avatar's own tools ran, and no words came after them
        self._client_calls = 0  # calls for the client to run

    # --- the turn ------------------------------------------------------------------------------
    def without_pipeline(self, spoken: bool) -> Actions:
        """No reply pipeline: a spoken turn is committed empty (listen only); a reply asked for
        fails."""
        self._pipeline = False
        if spoken:
            return [CommitTurn("", True)]
        return [
            Finish(self.epoch, ResponseStatus.FAILED),
            ServerError("no_pipeline", "this server has no reply pipeline"),
            Flush(),
        ]

    def begin(self, spoken: bool) -> Actions:
        """The reply starts: to a spoken turn (transcribed first) or to the conversation."""
        return [Transcribe()] if spoken else self._start()

    def transcribed(self, transcript: str, answer: bool) -> Actions:
        """The final ``transcript`` came; ``answer``: the session answers a spoken turn by
        itself (``create_response``)."""
        session = self._session
        if self.epoch != session.epoch:
            return []  # an interruption moved on while it was transcribed
        self._answer = answer
        item_id = session.user_item_id or ""
        return [EmitTranscript(self.epoch, transcript, item_id), CommitTurn(transcript, answer)]

    def committed(self, turn: bool) -> Actions:
        """The turn was committed (``turn`` False: an empty transcript, no turn)."""
        if not self._pipeline or not turn or not self._answer:
            return [Flush()]
        return self._start()

    def _start(self) -> Actions:
        return [StartResponse(self.epoch, "text" if self.text_only else "audio")]

    def started(self, began: bool) -> Actions:
        """The response began (False: its epoch is stale already)."""
        if not began:
            return []
        if self._early and not self._instructions and not self.text_only:
            return [Flush(), Compose(), TryAdopt()]
        return [Flush(), Compose(), *self._own_stream()]

    # --- the early reply -----------------------------------------------------------------------
    def answers(self, same: bool) -> Actions:
        """Whether the early reply asks what the reply asks (epoch, prompt, conditions)."""
        return [AwaitEarly()] if same else self._own_stream()

    def prepared(self, usable: bool, ready: bool, voice: Conditions) -> Actions:
        """The early reply was waited for: ``usable`` (it neither failed nor was shed),
        ``ready``: its first sentence's speech is made (with ``voice``)."""
        if not usable:
            return self._own_stream()
        self._ready, self._voice = ready, voice
        return [AdoptEarly(), NextSentence()]

    def _own_stream(self) -> Actions:
        """The reply's own LLM stream (an early reply is closed first)."""
        opens: Actions = [CloseEarly()] if self._early else []
        return [*opens, OpenStream(), NextSentence()]

    # --- the sentences -------------------------------------------------------------------------
    def sentence(self, text: str | FunctionCall | None) -> Actions:
        """The stream's next sentence (or a function call) came (None: the stream ended)."""
        if text is None:
            return self._finish()
        if isinstance(text, FunctionCall):
            return [MakeCall(self.epoch, text)]
        return [OpenChunk(self.epoch, text)]

    def called(self, made: bool, own: bool = False) -> Actions:
        """The call was recorded and told (False: its epoch is stale: no call); ``own``: one
        of the avatar's own tools, run already (its output in history)."""
        if not made:
            return self._finish()
        if own:
            self._own_unsaid = True
        else:
            self._client_calls += 1
        return [Flush(), NextSentence()]

    def opened(self, chunk: Chunk | None) -> Actions:
        """The sentence's chunk was opened (None: its epoch is stale)."""
        if chunk is None:
            return self._finish()
        self._own_unsaid = False
        items = self._session.items
        ids = (items.reply_response_id or "", items.reply_item_id or "")
        actions: Actions = [Flush(), EmitDelta(self.epoch, chunk, *ids)]
        if self.text_only:
            return [*actions, DeliverText(chunk), NextSentence()]
        from_early = self._ready and self._session.conditions == self._voice
        self._ready = False
        return [*actions, Speak(chunk, from_early)]

    def spoken(self, queued: bool) -> Actions:
        """The chunk's speech was queued (False: it went stale)."""
        if not queued:
            return self._finish()
        return [WaitForRoom(), NextSentence()]

    def _finish(self) -> Actions:
        actions: Actions = []
        if self._own_unsaid and not self._client_calls:  # the client's output leads on
            actions.append(FollowUp(self.epoch))
        actions.append(Finish(self.epoch, ResponseStatus.COMPLETED))
        if self._incremental:
            actions.append(WarmWhenPlayed(self.epoch))
        return actions

    # --- the end -------------------------------------------------------------------------------
    def failed(self, error: Exception) -> Actions:
        """A stage failed: a ``StaleWork`` (the epoch ended while its job waited), a timeout, or
        an engine's error. The engine's own words stay in the log: they may name internal
        hosts, ports or limits, which are no business of the client's."""
        if isinstance(error, StaleWork):
            return []
        if isinstance(error, TimeoutError):
            message = f"an engine took over {self._limit_s:g} s; reply stopped"
            failure = ServerError("engine_timeout", message)
        else:
            name = type(error).__name__
            failure = ServerError(
                "engine_error", f"the reply failed ({name}); the server logged why"
            )
        return [failure, Finish(self.epoch, ResponseStatus.FAILED)]


def reported(done: ResponseDone, trace: TurnTrace | None) -> ReportTimings | None:
    """A reply ended (``done``; ``trace``: its timings): reported if it was heard."""
    if trace is None or trace.first_audio_ms is None:
        return None
    return ReportTimings(done.epoch, str(done.status), trace.as_dict())
