"""Client events acted on, one at a time and in order, in either dialect (native ``events``,
OpenAI Realtime GA ``oai-events``). A refused event gets one ``error`` and changes nothing.

Interruptions (``response.cancel``, ``output_audio_buffer.clear``, typed text, truncating the
reply in progress) all go through the conversation's one interrupt path.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from server.errors import InvalidConditionUpdate, InvalidItem, InvalidTransition, UnknownItem
from server.runtime.session import REPLYING, Session
from server.runtime.tools import ToolSettings
from server.wire.protocol import (
    PlaybackAck,
    ProtocolError,
    ResponseCancel,
    SessionUpdate,
    TextInput,
)
from server.wire.realtime_client import (
    InputClear,
    ItemCreate,
    ItemDelete,
    ItemRetrieve,
    ItemTruncate,
    OutputClear,
    RealtimeEvent,
    RealtimeUpdate,
    ResponseCreate,
)
from server.wire.realtime_session import SessionPatch
from server.wire.realtime_tools import CallCreate, CallOutputCreate, ToolsUpdate

log = logging.getLogger(__name__)

BUSY_MESSAGE = "Still answering your last message, one moment."
SESSION_CONFIGURED = "realtime.session.configured"  # the GA dialect's session.updated


class Conversing(Protocol):
    """What the client events act on (server/conversation/conversation.py)."""

    session: Session
    tools: ToolSettings

    async def cancel_reply(self) -> bool: ...

    async def typed_text(self, text: str) -> None: ...

    async def clear_input(self) -> None: ...

    def answer(
        self,
        instructions: str | None,
        text_only: bool | None = None,
        tools: ToolSettings | None = None,
    ) -> None: ...

    def answer_when_played(
        self, instructions: str | None, text_only: bool | None, tools: ToolSettings | None
    ) -> None: ...

    def configure(self, patch: SessionPatch) -> None: ...

    def emit(self, event: dict[str, Any]) -> None: ...

    def flush_events(self) -> None: ...


async def handle(conversation: Conversing, event: RealtimeEvent) -> None:
    """One client event; a refused one gets one ``error`` and changes nothing."""
    session = conversation.session
    try:
        await _act(conversation, session, event)
    except InvalidConditionUpdate as exc:
        _refuse(conversation, exc.code, str(exc), event)
    except UnknownItem as exc:
        _refuse(conversation, exc.code, str(exc), event, "item_id")
    except InvalidItem as exc:
        _refuse(conversation, exc.code, str(exc), event)
    except InvalidTransition as exc:  # the turn's state names stay in the log
        log.info("session %s: %s refused: %s", session.session_id[:8], type(event).__name__, exc)
        if isinstance(event, ResponseCreate):
            message = "a response is in progress or the user is speaking; try again after it"
            _refuse(conversation, "conversation_already_has_active_response", message, event)
        else:
            _refuse(conversation, "conversation_busy", BUSY_MESSAGE, event)
    conversation.flush_events()


async def _act(conversation: Conversing, session: Session, event: RealtimeEvent) -> None:
    if isinstance(event, SessionUpdate):
        session.request_update(event.changes)
    elif isinstance(event, RealtimeUpdate):
        conversation.configure(event.patch)
        conversation.emit({"type": SESSION_CONFIGURED})
    elif isinstance(event, ResponseCancel):
        if not await conversation.cancel_reply():
            _refuse(conversation, "no_active_response", "there is no reply to cancel", event)
    elif isinstance(event, OutputClear):
        await conversation.cancel_reply()
    elif isinstance(event, TextInput):
        await conversation.typed_text(event.text)
    elif isinstance(event, ItemCreate):
        session.items.add_user(event.text, session.epoch, event.item_id)
        session.calls.other_item()
    elif isinstance(event, ToolsUpdate):
        if event.changes:
            session.request_update(event.changes)  # checked first: a bad one changes nothing
        conversation.configure(SessionPatch(tools=event.tools, tool_choice=event.tool_choice))
    elif isinstance(event, CallOutputCreate):
        answered = session.add_call_output(event.call_id, event.output, event.item_id)
        if event.answer and answered:  # the native dialect: answered by itself
            await _respond(conversation, session, ResponseCreate(event_id=event.event_id))
    elif isinstance(event, CallCreate):
        session.items.add_call(event.call, session.epoch, event.item_id)
        session.calls.other_item()
    elif isinstance(event, ResponseCreate):
        await _respond(conversation, session, event)
    elif isinstance(event, InputClear):
        await conversation.clear_input()
    elif isinstance(event, ItemTruncate):
        if event.item_id == session.items.reply_item_id:  # stop it first: then cut it
            session.items.check_cut(event.item_id, event.audio_end_ms)
            await conversation.cancel_reply()
        session.items.truncate(event.item_id, event.audio_end_ms)
    elif isinstance(event, ItemDelete):
        session.items.delete(event.item_id)
    elif isinstance(event, ItemRetrieve):
        session.items.retrieve(event.item_id)
    elif isinstance(event, PlaybackAck):
        session.ack_playback(event.played_ms)


async def _respond(conversation: Conversing, session: Session, event: ResponseCreate) -> None:
    """``response.create``. After the output of a call nobody waits for any more (an
    interruption cancelled it, or its deadline passed) it starts no reply: the conversation
    has moved on; nor a second reply to the same output (a client asks after each output of a
    reply that made several calls). After a call's output that came while the reply that made
    the call still plays (its words before the call, or its next calls), the answer follows
    that reply."""
    tools = event.tool_settings(conversation.tools)
    last = session.history.turns[-1] if session.history.turns else None
    output = last.item_id if last is not None and last.call_id else None
    if not session.calls.reply_wanted(output):
        sid = session.session_id[:8]
        log.info("session %s: response.create after a late or answered output: none", sid)
        return
    if output is not None and session.state in REPLYING:
        session.calls.replying_to(output)
        conversation.answer_when_played(event.instructions, event.text_only, tools)
        return
    session.request_response()
    if output is not None:
        session.calls.replying_to(output)
    conversation.answer(event.instructions, event.text_only, tools)


def _refuse(
    conversation: Conversing,
    code: str,
    message: str,
    event: RealtimeEvent,
    param: str | None = None,
) -> None:
    conversation.emit(ProtocolError(code, message, event.event_id, param).to_event())
