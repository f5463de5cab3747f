"""A reply's text that waits while the reply is paused.

When voice is heard over a reply, the reply pauses and the voice's words are transcribed
(server/conversation/interjection.py). On a machine of few cores the LLM, still writing the
rest of the reply, would take a share of them from that hearing, and the pause's verdict would
come late. Where the LLM can stop a reply and go on with it later (:class:`HoldsReplies`),
its request stops at the first token after the pause; once the reply resumes, a new request
goes on after the words written so far (the prompt ends inside the assistant's turn, and the
slot still holds what it computed, so little is read again). A pause that ends in an
interruption ends the reply's epoch: nothing more is written for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence

from server.pipeline.engines import HoldsReplies, Llm, Message
from server.runtime.session_view import SessionView

log = logging.getLogger(__name__)

POLL_S = 0.02  # how often a held reply looks whether its reply has resumed
LONGEST_HOLD_S = 30.0  # a hold longer than this goes on writing anyway (pauses end sooner)


async def reply_text(
    llm: Llm,
    messages: Sequence[Message],
    request_id: str,
    max_tokens: int,
    salt: str | None,
    view: Callable[[], SessionView] | None,
    poll: Callable[[], Awaitable[None]] = lambda: asyncio.sleep(POLL_S),
) -> AsyncGenerator[str, None]:
    """The reply's deltas; held while ``view()`` says the reply is paused (where the LLM can
    hold a reply and ``view`` is given), looking again after each ``poll()`` (at most
    ``LONGEST_HOLD_S / POLL_S`` times). The first request is ``request_id``, the ones after
    a hold ``request_id+1``, ``+2``, ...; together they write at most ``max_tokens``.
    Closing this closes the request running."""
    if view is None or not isinstance(llm, HoldsReplies):
        stream = llm.stream(messages, request_id, max_tokens, cache_salt=salt)
        try:
            async for delta in stream:
                yield delta
        finally:
            await _close(stream)
        return
    epoch = view().epoch

    def hold() -> bool:  # an engine thread asks at every token: it only reads
        return view().paused

    said, left, part, rid = "", max_tokens, 0, request_id
    while left > 0:
        stream = llm.stream_held(messages, said, rid, left, hold=hold, cache_salt=salt)
        try:
            async for delta in stream:
                said += delta
                yield delta
        finally:
            await _close(stream)
        stats = llm.last_stats(rid)
        if stats is None or stats.finish_reason != "held":
            return
        left -= int(stats.output_tokens)
        log.debug("reply %s held after %d tokens", request_id, max_tokens - left)
        if not await _resumed(view, epoch, poll):
            return
        part += 1
        rid = f"{request_id}+{part}"


async def _close(stream: AsyncIterator[str]) -> None:
    """Close ``stream`` now, however its reading ended: its request stops."""
    closer = getattr(stream, "aclose", None)
    if closer is not None:
        await closer()


async def _resumed(
    view: Callable[[], SessionView], epoch: int, poll: Callable[[], Awaitable[None]]
) -> bool:
    """Wait while the reply is paused: True once it resumed, False if its epoch ended."""
    for _ in range(round(LONGEST_HOLD_S / POLL_S)):
        now = view()
        if now.epoch != epoch:
            return False
        if not now.paused:
            return True
        await poll()
    return view().epoch == epoch
