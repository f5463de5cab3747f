"""Ids of a conversation's items and responses, unique within the session.

Generated ids count up per session (``item_<n>``, ``resp_<n>``): they say nothing about other
sessions. A client may name the items it creates; such an id must be new to the session.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

from server.errors import InvalidItem, UnknownItem
from server.runtime.events import (
    CallItemAdded,
    FunctionCallMade,
    ItemDeleted,
    ItemRetrieved,
    ItemTruncated,
    SessionEvent,
    UserItemAdded,
)
from server.runtime.history import History, Turn, check_audio_end
from server.runtime.media import samples_to_ms
from server.runtime.response import Response
from server.runtime.tools import FunctionCall

MAX_ITEM_ID_CHARS = 64


class ItemIds:
    """Hands out the ids of one session's items and responses."""

    def __init__(self) -> None:
        self._items = 0
        self._responses = 0
        self._taken: set[str] = set()

    def item(self) -> str:
        """A new item id."""
        while True:
            self._items += 1
            item_id = f"item_{self._items:04d}"
            if item_id not in self._taken:
                self._taken.add(item_id)
                return item_id

    def response(self) -> str:
        """A new response id."""
        self._responses += 1
        return f"resp_{self._responses:04d}"

    def claim(self, item_id: str | None) -> str:
        """``item_id`` chosen by the client (InvalidItem if taken or malformed), or a new one."""
        if item_id is None:
            return self.item()
        if not item_id or len(item_id) > MAX_ITEM_ID_CHARS or not item_id.isprintable():
            raise InvalidItem(f"an item id is 1 to {MAX_ITEM_ID_CHARS} printable characters")
        if item_id in self._taken:
            raise InvalidItem(f"the conversation already has an item {item_id!r}")
        self._taken.add(item_id)
        return item_id


class Items:
    """A session's conversation items as a client edits them (the OpenAI Realtime client
    events): add a user message, delete an item, truncate an agent item to what was heard.
    None of them changes the turn state; each tells the client (into ``events``)."""

    def __init__(
        self, history: History, ids: ItemIds, response: Response, events: deque[SessionEvent]
    ) -> None:
        self._history = history
        self._ids = ids
        self._response = response
        self._events = events

    @property
    def reply_response_id(self) -> str | None:
        """The response in progress (None between responses)."""
        return self._response.response_id if self._response.epoch is not None else None

    @property
    def reply_item_id(self) -> str | None:
        """The assistant item of the response in progress (None between responses)."""
        return self._response.item_id if self._response.epoch is not None else None

    def check_cut(self, item_id: str, audio_end_ms: float) -> None:
        """Whether the reply in progress (``item_id``) can be cut at ``audio_end_ms``: not past
        what of it was played (InvalidItem), checked before it is stopped."""
        if item_id == self.reply_item_id:
            check_audio_end(audio_end_ms, samples_to_ms(self._response.heard_samples))

    def add_user(self, text: str, epoch: int, item_id: str | None = None) -> Turn:
        """A user message (``item_id``: the client's choice, or new); it answers nothing."""
        if not text.strip():
            raise InvalidItem("a user item needs text")
        previous = self._history.last_item_id
        turn = self._history.add_user_item(text, epoch, self._ids.claim(item_id))
        self._events.append(UserItemAdded(turn.item_id, turn.text, previous))
        return turn

    def add_call(self, call: FunctionCall, epoch: int, item_id: str | None = None) -> Turn:
        """A function call a client adds (a conversation it replays); it calls nothing."""
        if self._history.call(call.call_id) is not None:
            raise InvalidItem(f"the conversation already has a call {call.call_id[:64]!r}")
        previous = self._history.last_item_id
        turn = self._history.add_call(call, epoch, self._ids.claim(item_id))
        added = CallItemAdded(turn.item_id, previous, "function_call", call.call_id)
        self._events.append(replace(added, name=call.name, arguments=call.arguments))
        return turn

    def add_call_output(
        self,
        call_id: str,
        output: str,
        epoch: int,
        item_id: str | None = None,
        told: bool = True,
    ) -> Turn:
        """A function call's output (``function_call_output``), for a call the conversation
        holds (InvalidItem otherwise); it answers nothing by itself. ``told``: the client
        hears of it (not of the avatar's own tools' outputs)."""
        if self._history.call(call_id) is None:
            raise InvalidItem(f"the conversation has no function call {call_id[:64]!r}")
        previous = self._history.last_item_id
        turn = self._history.add_call_output(call_id, output, epoch, self._ids.claim(item_id))
        if told:
            added = CallItemAdded(turn.item_id, previous, "function_call_output", call_id, output)
            self._events.append(added)
        return turn

    def record_call(self, call: FunctionCall, epoch: int, told: bool = True) -> Turn:
        """The response in progress made ``call``: a function_call item in history, told to
        the client (who runs it; ``told`` False: a tool the server runs)."""
        previous = self._history.last_item_id
        turn = self._history.add_call(call, epoch, self._ids.item(), self._response.item_id)
        response_id = self._response.response_id
        made = FunctionCallMade(
            epoch, response_id, turn.item_id, call.call_id, call.name, call.arguments, previous
        )
        if told:
            self._events.append(made)
        return turn

    def retrieve(self, item_id: str) -> None:
        """``conversation.item.retrieve``: the item as the history holds it, told to the
        client (UnknownItem); nothing changes."""
        turn = self._history.item(item_id)
        role = turn.role.value
        found = ItemRetrieved(item_id, role, turn.text, turn.truncated, turn.typed, turn.call_id)
        if turn.call is not None:
            call = turn.call
            found = replace(found, call_id=call.call_id, name=call.name, arguments=call.arguments)
        self._events.append(found)

    def delete(self, item_id: str) -> None:
        """``conversation.item.delete`` (UnknownItem; InvalidItem for the reply in progress)."""
        self._not_in_progress(item_id)
        self._history.delete(item_id)
        self._events.append(ItemDeleted(item_id))

    def truncate(self, item_id: str, audio_end_ms: float) -> Turn | None:
        """``conversation.item.truncate``: the client played agent item ``item_id`` only up to
        ``audio_end_ms``; history keeps the words heard by then (UnknownItem, InvalidItem).
        None: the item is the last reply, stopped before any of its words was heard (history
        never had it)."""
        self._not_in_progress(item_id)
        try:
            turn = self._history.truncate(item_id, audio_end_ms)
        except UnknownItem:
            if item_id != self._response.item_id:
                raise
            self._events.append(ItemTruncated(-1, 0, audio_end_ms, "", item_id, audio_end_ms))
            return None
        cut = ItemTruncated(turn.epoch, 0, audio_end_ms, turn.text, item_id, audio_end_ms)
        self._events.append(cut)
        return turn

    def _not_in_progress(self, item_id: str) -> None:
        if item_id == self.reply_item_id:
            raise InvalidItem("that item is the response in progress: cancel it first")
