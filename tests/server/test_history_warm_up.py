"""Once a reply has played out, the conversation as history holds it is warmed in the LLM's
prefix cache (server/conversation/reply.py): a recent window that has just moved on is read
then, while the user listens, not when the next reply waits for it."""

from __future__ import annotations

from server.pipeline.seams import ReplyRequest
from server.runtime.history import CacheClass, Role
from server.runtime.turn import TurnState
from tests.server.test_interjection import Rig, ScriptedPipeline, until_state


class Recording(ScriptedPipeline):
    """Records each warm-up's context (role and text of each entry)."""

    def __init__(self) -> None:
        super().__init__()
        self.warmed: list[list[tuple[Role, str]]] = []

    async def prefill(self, request: ReplyRequest, *, paused: bool = False) -> int:
        self.warmed.append([(e.role, e.text) for e in request.context])
        return 0


async def test_the_history_is_warmed_once_the_reply_has_played_out() -> None:
    recording = Recording()
    rig = Rig(lambda clock: recording, settings={"pipeline.incremental": "true"})
    try:
        await rig.ask()
        await until_state(rig, TurnState.AGENT_SPEAKING)
        assert recording.warmed == []  # nothing while the reply plays
        await until_state(rig, TurnState.LISTENING, frames=200)
        await rig.tick(3)
        (context,) = recording.warmed
        assert context[-2:] == [
            (Role.USER, "Tell me a story."),
            (Role.ASSISTANT, "Once upon a time. The end."),
        ]
        entries = rig.conversation.request(rig.conversation.session.epoch).context
        assert entries[-1].cache_class is CacheClass.RECENT  # no turn in progress
    finally:
        await rig.conversation.close()


async def test_a_reply_cut_off_by_the_user_warms_nothing_after_it() -> None:
    recording = Recording()
    rig = Rig(lambda clock: recording, settings={"pipeline.incremental": "true"})
    try:
        await rig.ask()
        await rig.conversation.typed_text("Stop, something else.")  # a new epoch, a new reply
        await rig.tick(5)
        assert recording.warmed == []
        await until_state(rig, TurnState.AGENT_SPEAKING)
        await until_state(rig, TurnState.LISTENING, frames=200)
        await rig.tick(3)
        (context,) = recording.warmed  # the reply that played out; none for the one cut off
        assert context[-2:] == [
            (Role.USER, "Stop, something else."),
            (Role.ASSISTANT, "Once upon a time. The end."),
        ]
    finally:
        await rig.conversation.close()
