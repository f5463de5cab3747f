"""Typed text always gets through (a real peer against the server process, tone pipeline).

The tone pipeline here takes 1.5 s to its first sentence, so a reply stays a while in
"thinking" before it speaks: a typed message sent then, or while the reply plays, interrupts it
like speech and gets its own reply, with no error.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.peers import Peer
from tests.support.server_process import TONE_PIPELINE, ServerProcess, server_process, tone_env

pytestmark = pytest.mark.usefixtures("client_ice")  # tests/conftest.py

THINK_MS = 1500


server = server_process(
    {"server.debug_endpoints": "true"},
    pipeline=TONE_PIPELINE,
    env=tone_env(1500, sentences=2, think_ms=THINK_MS),
)


def of_epoch(epoch: int) -> Any:
    return lambda e: e.get("epoch") == epoch


async def test_typed_text_while_thinking_and_while_speaking_gets_a_reply(
    server: ServerProcess, peers: list[Peer]
) -> None:
    peer = Peer(server.url, video=False)
    peers.append(peer)
    await peer.connect()
    peer.send({"type": "conversation.item.create", "text": "first question"})
    await peer.wait_event("response.created", where=of_epoch(0))
    assert not any(e["type"] == "response.audio_transcript.delta" for _, e in peer.events)
    # thinking: the reply has no words yet
    peer.send({"type": "conversation.item.create", "text": "second question"})
    cancelled = await peer.wait_event("response.done", where=of_epoch(0))
    assert cancelled["status"] == "cancelled"
    await peer.wait_event("response.audio_transcript.delta", timeout=15, where=of_epoch(1))
    # speaking: its first sentence is playing
    peer.send({"type": "conversation.item.create", "text": "third question"})
    interrupted = await peer.wait_event("response.done", where=of_epoch(1))
    assert interrupted["status"] == "cancelled"
    done = await peer.wait_event("response.done", timeout=20, where=of_epoch(2))
    assert done["status"] == "completed"
    assert not [e for _, e in peer.events if e["type"] == "error"]
    session = server.session(peer.session_id)
    assert session is not None
    users = [(t["text"], t["epoch"]) for t in session["history"] if t["role"] == "user"]
    assert users == [("first question", 0), ("second question", 1), ("third question", 2)]
    # the last reply, to the third question, was heard whole
    last = session["history"][-1]
    assert last["role"] == "assistant" and last["epoch"] == 2 and not last["truncated"]
    assert last["text"] == "Tone number 1 for epoch 2. Tone number 2 for epoch 2."
