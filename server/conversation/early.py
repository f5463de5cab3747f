"""An early reply: the reply to the user's words begun at a pause, before the turn ended.

The partial loop decodes the pause as soon as the user stops (server/conversation/
partials.py). The turn may wait on after that decode: the end-of-turn model heard the
utterance as unfinished and its longer silence holds, or no model judges and a fixed silence
ends the turn. When those words end a sentence, the reply to them is begun then (from 100 ms
of quiet: a shorter gap is often one between two words), as the turn's reply would begin: its
LLM stream opened and its first sentence synthesised; nothing is emitted or played. Not while
the model has yet to judge: a turn it calls complete ends at once, and the early reply would
gain nothing while keeping other work waiting (server/conversation/floor.py).

When the turn ends, the reply adopts it if it asks the same: the same epoch, the same prompt
(the final transcript is the pause's words, and the history window did not move) and the same
conditions. Its first sentence then plays at once. Otherwise (the user spoke on, other words,
an interruption, the conversation closed) it is dropped: its LLM request is aborted and its
speech thrown away. Nothing of it was heard, so history holds none of it, and the epoch does
not move: nothing was interrupted.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from server.pipeline.seams import ReplyPiece, ReplyRequest, ReplyStanding, SpeechAudio, TurnTrace
from server.tasks import cancel


def prompt_of(request: ReplyRequest) -> list[tuple[str, str]]:
    """What the LLM reads for ``request``: each context entry's role and text."""
    return [(entry.role.value, entry.text) for entry in request.context]


@dataclass(eq=False)
class EarlyReply:
    """One early reply: the request it answers, its trace (stage times from its start), its
    sentence stream, and once prepared its first sentence and that sentence's speech
    (``failed``: the preparation raised; the turn's reply starts afresh; ``adopted``: the
    turn's reply goes on from it)."""

    request: ReplyRequest
    trace: TurnTrace
    sentences: AsyncIterator[ReplyPiece]
    task: asyncio.Task[None] | None = None
    first: ReplyPiece | None = None
    audio: SpeechAudio | None = None
    failed: bool = False
    adopted: bool = False

    @property
    def standing(self) -> ReplyStanding:
        """Whether it is still optional work (held) or was shed (server/pipeline/seams.py)."""
        assert self.request.standing is not None  # an early reply's request carries one
        return self.request.standing

    def answers(self, request: ReplyRequest) -> bool:
        """Whether ``request`` asks what this reply answers (same epoch, prompt, conditions)."""
        mine = self.request
        return (
            mine.epoch == request.epoch
            and mine.conditions == request.conditions
            and prompt_of(mine) == prompt_of(request)
        )

    async def rest(self) -> AsyncIterator[ReplyPiece]:
        """The reply's sentences once adopted: the first (already taken), then the stream's."""
        if self.first is not None:
            yield self.first
        async for sentence in self.sentences:
            yield sentence

    async def close(self) -> None:
        """Stop its preparation and close its stream (the engine aborts the request)."""
        await cancel(self.task)
        closer = getattr(self.sentences, "aclose", None)
        if closer is not None:
            await closer()
