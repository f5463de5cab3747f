"""Once a reply has played out, a recent window that is nearly full moves on and is warmed in
the LLM's prefix cache (server/conversation/reply.py): the moved window is read then, while
the user listens, not when the next reply waits for it. A window that stays is not warmed."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from server.pipeline.seams import ReplyRequest
from server.runtime.history import Role
from server.runtime.turn import TurnState
from tests.server.conversation.test_interjection import Rig, ScriptedPipeline, until_state

STORY = (Role.ASSISTANT, "Once upon a time. The end.")


class Recording(ScriptedPipeline):
    """Records each warm-up's context (role and text of each entry)."""

    def __init__(self) -> None:
        super().__init__()
        self.warmed: list[list[tuple[Role, str]]] = []

    async def prefill(self, request: ReplyRequest, *, paused: bool = False) -> int:
        self.warmed.append([(e.role, e.text) for e in request.context])
        return 0


@contextlib.asynccontextmanager
async def rig_with(recording: Recording, window_tokens: int) -> AsyncIterator[Rig]:
    settings = {
        "pipeline.incremental": "true",
        "runtime.recent_window_tokens": str(window_tokens),
    }
    rig = Rig(lambda clock: recording, settings=settings)
    try:
        yield rig
    finally:
        await rig.conversation.close()


async def played_out(rig: Rig) -> None:
    await until_state(rig, TurnState.AGENT_SPEAKING)
    await until_state(rig, TurnState.LISTENING, frames=200)
    await rig.tick(3)


async def test_a_full_window_moves_on_and_is_warmed_once_the_reply_has_played_out() -> None:
    recording = Recording()
    # "Tell me a story." and the story: 11 tokens
    async with rig_with(recording, window_tokens=12) as rig:
        await rig.ask()
        await until_state(rig, TurnState.AGENT_SPEAKING)
        assert recording.warmed == []  # nothing while the reply plays
        await played_out(rig)
        (context,) = recording.warmed
        assert context[1:] == [STORY]  # the window moved on: the question no longer in it


async def test_a_window_with_room_left_is_not_warmed() -> None:
    recording = Recording()
    async with rig_with(recording, window_tokens=1024) as rig:
        await rig.ask()
        await played_out(rig)
        assert recording.warmed == []
        history = rig.conversation.session.history
        assert [t.role for t in history.recent_window(1024)] == [Role.USER, Role.ASSISTANT]


async def test_a_reply_cut_off_by_the_user_warms_nothing_after_it() -> None:
    recording = Recording()
    async with rig_with(recording, window_tokens=12) as rig:
        await rig.ask()
        await rig.conversation.typed_text("Stop, something else.")  # a new epoch, a new reply
        await rig.tick(5)
        assert recording.warmed == []
        await played_out(rig)
        (context,) = recording.warmed  # the reply that played out; none for the one cut off
        assert context[1:] == [STORY]
