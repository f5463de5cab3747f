"""A reply's text held while the reply is paused (server/pipeline/held.py), on an LLM that
writes one word a token and stops at its hold as llama.cpp does (the real engine's side is
tested in tests/models/test_llamacpp.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from models.llm import GenerationStats
from server.pipeline.engines import Message
from server.pipeline.held import reply_text
from server.runtime.session_view import SessionView

STORY = "one day a dragon woke up and flew over the hills to see a castle"
WORDS = STORY.split()


class Writer:
    """Writes :data:`WORDS` from where ``said`` ends, one a token; records each request."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, int]] = []  # (said, request id, max tokens)
        self.stats: dict[str, GenerationStats] = {}

    async def stream_held(
        self,
        messages: Sequence[Message],
        said: str,
        request_id: str,
        max_tokens: int,
        *,
        hold: Callable[[], bool],
        cache_salt: str | None = None,
    ) -> AsyncIterator[str]:
        self.requests.append((said, request_id, max_tokens))
        start, out, finish = len(said.split()), 0, "stop"
        try:
            for word in WORDS[start:]:
                if out == max_tokens:
                    finish = "length"
                    break
                out += 1
                yield word + " "
                if hold():
                    finish = "held"
                    break
        finally:
            self.stats[request_id] = GenerationStats(10, 0, out, None, finish)

    def stream(self, messages: Any, request_id: str, max_tokens: int, **_: Any) -> Any:
        raise AssertionError("a writer that holds is asked to hold")

    async def prefill(self, messages: Any, request_id: str, **_: Any) -> None:
        return None

    async def abort(self, request_id: str) -> None:
        pass

    def last_stats(self, request_id: str) -> GenerationStats | None:
        return self.stats.get(request_id)

    async def close(self) -> None:
        pass


@dataclass
class Turn:
    """The session as the reply's text sees it: ``resume_after`` polls un-pause it."""

    view: SessionView
    polls: int = 0
    resume_after: int = 3
    end_epoch: bool = False  # the pause ends in an interruption instead

    def __call__(self) -> SessionView:
        return self.view

    async def poll(self) -> None:
        self.polls += 1
        if self.polls == self.resume_after:
            if self.end_epoch:
                self.view = replace(self.view, epoch=self.view.epoch + 1, paused=False)
            else:
                self.view = replace(self.view, paused=False)


async def read(writer: Writer, turn: Turn, max_tokens: int, pause_at: int) -> list[str]:
    """The deltas; the reply pauses once ``pause_at`` have come."""
    out: list[str] = []
    text = reply_text(writer, [], "r", max_tokens, None, turn, turn.poll)
    async for delta in text:
        out.append(delta)
        if len(out) == pause_at:
            turn.view = replace(turn.view, paused=True)
    return out


async def test_a_paused_reply_stops_writing_and_goes_on_from_its_words_once_resumed() -> None:
    writer, turn = Writer(), Turn(SessionView("s", 0, 500.0, 2000.0))
    out = await read(writer, turn, 10, pause_at=3)
    assert turn.polls == 3  # it waited while paused
    # one request to the pause, then one from its words, together at most 10 tokens
    assert writer.requests == [("", "r", 10), ("one day a ", "r+1", 7)]
    assert "".join(out).split() == WORDS[:10]


async def test_a_pause_that_ends_the_epoch_ends_the_reply() -> None:
    writer, turn = Writer(), Turn(SessionView("s", 0, 500.0, 2000.0), end_epoch=True)
    out = await read(writer, turn, 10, pause_at=3)
    assert len(writer.requests) == 1 and "".join(out).split() == WORDS[:3]


async def test_without_a_view_the_reply_is_one_request() -> None:
    class Plain(Writer):
        def stream(self, messages: Any, request_id: str, max_tokens: int, **_: Any) -> Any:
            return self.stream_held(messages, "", request_id, max_tokens, hold=lambda: False)

    writer = Plain()
    out = [d async for d in reply_text(writer, [], "r", 5, None, None)]
    assert writer.requests == [("", "r", 5)] and len(out) == 5
