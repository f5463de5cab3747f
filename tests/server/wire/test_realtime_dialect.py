"""The ``oai-events`` dialect end to end inside one conversation: client events in the OpenAI
Realtime GA shapes act with GA semantics, and every server event validates against the official
``openai`` package's models (``RealtimeServerEvent``); this server's own events are
``x-avatar.*``. A deterministic reply pipeline (tones) answers; the test pulls the audio as a
peer's track would."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from server.config import load_config
from server.conversation.conversation import REALTIME_DIALECT, Conversation
from server.conversation.utterance import Utterance
from server.metrics import Metrics
from server.pipeline.turn_detector import TurnDetector, VadEvent, VadEventKind
from server.runtime.history import Role
from server.runtime.media import FRAME_SAMPLES
from server.runtime.turn import TurnState
from tests.support.tone_pipeline import InstructedTonePipeline

SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(RealtimeServerEvent)
PERSONA = "You are a calm guide for the museum."


class Link:
    """The conversation's link as a peer would be: every event taken, no media clock."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send(self, event: dict[str, Any]) -> bool:
        self.sent.append(event)
        return True

    def media_ms(self) -> float | None:
        return None

    def of(self, kind: str, after: int = 0) -> list[dict[str, Any]]:
        return [e for e in self.sent[after:] if e["type"] == kind]


class Gate:
    def is_speech(self, frame: Any) -> bool:
        return False


class Quiet:
    window = 512

    def probability(self, window: Any) -> float:
        return 0.0

    def reset(self) -> None:
        pass


def validate(events: list[dict[str, Any]]) -> tuple[int, set[str]]:
    """Every GA event validates against the openai package's models; every other one is an
    ``x-avatar.*`` extension. Returns how many GA events, of which types."""
    types: set[str] = set()
    count = 0
    for event in events:
        assert isinstance(event.get("event_id"), str) and event["event_id"], event
        if event["type"].startswith("x-avatar."):
            continue
        model = SERVER_EVENT.validate_python(event)
        assert model.type == event["type"]
        types.add(event["type"])
        count += 1
    return count, types


@pytest.fixture
async def talk() -> AsyncIterator[tuple[Conversation, Link]]:
    conversation, link = open_talk({"runtime.persona": PERSONA}, InstructedTonePipeline(200.0, 2))
    yield conversation, link
    await conversation.close()


def open_talk(
    settings: dict[str, str], pipeline: InstructedTonePipeline
) -> tuple[Conversation, Link]:
    """A started conversation (no partials) on a link whose channel speaks GA; close it."""
    config = load_config(overrides={"pipeline.incremental": "false", **settings})
    detector = TurnDetector(Gate(), Quiet(), config.vad)
    conversation = Conversation("r" * 32, config, detector, pipeline, Metrics())
    link = Link()
    conversation.attach(link)
    conversation.start()
    conversation.link_open(audio=True, video=False, resumed=None, dialect=REALTIME_DIALECT)
    return conversation, link


def send(conversation: Conversation, event: dict[str, Any]) -> None:
    conversation.receive(json.dumps(event))


async def until(
    link: Link, kind: str, after: int = 0, conversation: Conversation | None = None
) -> dict[str, Any]:
    """Wait (bounded) for an event of ``kind``; with ``conversation``, its audio is pulled
    meanwhile, 20 ms a step, as a peer's track would."""
    for _ in range(2000):
        found = link.of(kind, after)
        if found:
            return found[0]
        if conversation is not None:
            conversation.pull_audio(FRAME_SAMPLES)
        await asyncio.sleep(0.002)
    raise AssertionError(f"no {kind} in {[e['type'] for e in link.sent[after:]]}")


def user_message(text: str) -> dict[str, Any]:
    content = [{"type": "input_text", "text": text}]
    return {
        "type": "conversation.item.create",
        "item": {"type": "message", "role": "user", "content": content},
    }


async def speak(conversation: Conversation, ms: float = 600.0) -> None:
    """A spoken turn as the turn detector would report it: start, voice, stop."""
    await conversation.on_vad(VadEvent(VadEventKind.START, 0.0, 0.0, 0.0))
    for _ in range(int(ms // 20)):
        conversation.keep_audio(np.full(320, 1000, np.int16))
    await conversation.on_vad(VadEvent(VadEventKind.STOP, ms, 0.0))


async def test_session_created_is_ga_then_the_native_description(
    talk: tuple[Conversation, Link],
) -> None:
    conversation, link = talk
    created, extension = link.sent[0], link.sent[1]
    assert created["type"] == "session.created" and extension["type"] == "x-avatar.session"
    assert created["session"]["instructions"] == PERSONA
    assert created["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    assert extension["session"]["id"] == conversation.session_id
    validate(link.sent)


async def test_a_typed_item_answers_nothing_until_response_create(
    talk: tuple[Conversation, Link],
) -> None:
    conversation, link = talk
    send(conversation, user_message("Where is the cafe?"))
    added = await until(link, "conversation.item.added")
    assert added["item"]["role"] == "user"
    assert added["item"]["content"][0]["text"] == "Where is the cafe?"
    await asyncio.sleep(0.05)
    assert not link.of("response.created")  # an item alone asks for nothing
    assert conversation.session.state is TurnState.LISTENING
    send(conversation, {"type": "response.create", "event_id": "ask-1"})
    done = await until(link, "response.done", conversation=conversation)
    assert done["response"]["status"] == "completed"
    assert len(link.of("response.created")) == 1  # exactly one response
    item = done["response"]["output"][0]
    heard = item["content"][0]["transcript"]
    assert heard.startswith("As told: You are a calm guide")
    assert conversation.session.history.item(item["id"]).text == heard
    for kind in ("output_audio_buffer.started", "output_audio_buffer.stopped"):
        assert link.of(kind)[0]["response_id"] == done["response"]["id"]
    visemes = link.of("x-avatar.viseme")  # mouth shapes name their response
    assert visemes and {v["response_id"] for v in visemes} == {done["response"]["id"]}
    deltas = "".join(e["delta"] for e in link.of("response.output_audio_transcript.delta"))
    assert deltas == heard
    count, types = validate(link.sent)
    assert count >= 14 and "response.content_part.added" in types


async def test_per_response_instructions_apply_to_that_response_only(
    talk: tuple[Conversation, Link],
) -> None:
    conversation, link = talk
    send(conversation, user_message("Hello"))
    send(
        conversation,
        {"type": "response.create", "response": {"instructions": "Speak like a robot."}},
    )
    done = await until(link, "response.done", conversation=conversation)
    assert done["response"]["output"][0]["content"][0]["transcript"].startswith(
        "As told: Speak like a robot."
    )
    n = len(link.sent)
    send(conversation, {"type": "response.create"})
    again = await until(link, "response.done", after=n, conversation=conversation)
    assert again["response"]["output"][0]["content"][0]["transcript"].startswith(
        "As told: You are a calm"
    )
    validate(link.sent)


async def test_a_spoken_turn_and_a_barge_in(talk: tuple[Conversation, Link]) -> None:
    conversation, link = talk
    await speak(conversation)
    started = link.of("input_audio_buffer.speech_started")[0]
    committed = await until(link, "input_audio_buffer.committed")
    assert committed["item_id"] == started["item_id"]
    completed = await until(link, "conversation.item.input_audio_transcription.completed")
    assert completed["item_id"] == started["item_id"]
    assert completed["transcript"].startswith("utterance of")
    assert conversation.session.history.item(started["item_id"]).text == completed["transcript"]
    await until(link, "output_audio_buffer.started", conversation=conversation)
    for _ in range(10):  # 200 ms of the reply is heard
        conversation.pull_audio(FRAME_SAMPLES)
    created = link.of("response.created")[0]["response"]
    n = len(link.sent)
    await speak(conversation)  # the user talks over the reply
    cleared = await until(link, "output_audio_buffer.cleared", after=n)
    assert cleared["response_id"] == created["id"]
    truncated = link.of("conversation.item.truncated", n)[0]
    done = link.of("response.done", n)[0]["response"]
    assert done["status"] == "cancelled"
    item = done["output"][0]
    assert truncated["item_id"] == item["id"] and item["status"] == "incomplete"
    agent = conversation.session.history.item(item["id"])
    assert agent.role is Role.ASSISTANT and agent.truncated
    assert abs(truncated["audio_end_ms"] - agent.audio_ms) <= 1
    assert 180 <= truncated["audio_end_ms"] <= 260  # what was pulled before the barge-in
    await until(link, "response.done", after=len(link.sent), conversation=conversation)
    _, types = validate(link.sent)
    assert {"input_audio_buffer.speech_stopped", "conversation.item.done"} <= types


async def test_items_are_truncated_and_deleted_by_id(talk: tuple[Conversation, Link]) -> None:
    conversation, link = talk
    send(conversation, user_message("Tell me about the paintings"))
    send(conversation, {"type": "response.create"})
    done = await until(link, "response.done", conversation=conversation)
    item_id = done["response"]["output"][0]["id"]
    before = conversation.session.history.item(item_id)
    send(
        conversation,
        {
            "type": "conversation.item.truncate",
            "item_id": item_id,
            "content_index": 0,
            "audio_end_ms": 150,
        },
    )
    truncated = await until(link, "conversation.item.truncated")
    assert truncated == {**truncated, "item_id": item_id, "audio_end_ms": 150}
    after = conversation.session.history.item(item_id)
    assert after.truncated and len(after.text.split()) < len(before.text.split())
    assert all(end <= 150 for end in after.word_ends_ms)
    user_id = link.of("conversation.item.added")[0]["item"]["id"]
    send(conversation, {"type": "conversation.item.delete", "item_id": user_id})
    deleted = await until(link, "conversation.item.deleted")
    assert deleted["item_id"] == user_id
    assert [t.item_id for t in conversation.session.history.turns] == [item_id]
    send(
        conversation,
        {"type": "conversation.item.delete", "item_id": "item_none", "event_id": "del-2"},
    )
    error = await until(link, "error")
    assert error["error"]["code"] == "item_not_found" and error["error"]["event_id"] == "del-2"
    assert error["error"]["param"] == "item_id"
    validate(link.sent)


async def test_items_are_retrieved_as_the_conversation_holds_them(
    talk: tuple[Conversation, Link],
) -> None:
    """OpenAI's Agents SDK asks for every item it hears of (after a transcript, after a
    truncation): ``conversation.item.retrieved`` holds the item as the history does, an agent
    item cut to the words heard; an unknown id is an ``item_not_found`` error; nothing else
    changes. Every event validates against the openai package's models."""
    conversation, link = talk
    send(conversation, user_message("Tell me about the paintings"))
    send(conversation, {"type": "response.create"})
    done = await until(link, "response.done", conversation=conversation)
    agent_id = done["response"]["output"][0]["id"]
    user_id = link.of("conversation.item.added")[0]["item"]["id"]
    send(conversation, {"type": "conversation.item.retrieve", "item_id": user_id})
    user = (await until(link, "conversation.item.retrieved"))["item"]
    assert (user["id"], user["role"], user["status"]) == (user_id, "user", "completed")
    assert user["content"] == [{"type": "input_text", "text": "Tell me about the paintings"}]
    truncate = {"type": "conversation.item.truncate", "item_id": agent_id, "content_index": 0}
    send(conversation, {**truncate, "audio_end_ms": 150})
    await until(link, "conversation.item.truncated")
    turns = len(conversation.session.history.turns)
    mark = len(link.sent)
    send(conversation, {"type": "conversation.item.retrieve", "item_id": agent_id})
    agent = (await until(link, "conversation.item.retrieved", after=mark))["item"]
    heard = conversation.session.history.item(agent_id).text
    assert (agent["id"], agent["role"], agent["status"]) == (agent_id, "assistant", "incomplete")
    assert agent["content"] == [{"type": "output_audio", "transcript": heard}]
    send(conversation, {"type": "conversation.item.retrieve", "item_id": "nope", "event_id": "r"})
    error = await until(link, "error")
    assert (error["error"]["code"], error["error"]["event_id"]) == ("item_not_found", "r")
    assert len(conversation.session.history.turns) == turns  # nothing changed
    validate(link.sent)


async def test_refusals_are_ga_errors_and_change_nothing(talk: tuple[Conversation, Link]) -> None:
    conversation, link = talk
    send(conversation, user_message("Hi"))
    send(conversation, {"type": "response.create"})
    await until(link, "response.created")
    send(conversation, {"type": "response.create", "event_id": "again"})
    busy = await until(link, "error")
    assert busy["error"]["code"] == "conversation_already_has_active_response"
    assert busy["error"]["event_id"] == "again"
    await until(link, "response.done", conversation=conversation)
    n = len(link.sent)
    for event in (
        {"type": "input_audio_buffer.append", "audio": "AAAA"},
        {
            "type": "session.update",
            "session": {"type": "realtime", "tools": [{"type": "mcp", "server_label": "f"}]},
        },
        {
            "type": "session.update",
            "session": {
                "audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "x"}}}
            },
        },
        {"type": "no.such.event"},
        {
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "assistant", "content": []},
        },
        # SECURITY.md: 15,500 characters were taken, past the persona's 4,000
        {"type": "response.create", "response": {"instructions": "Be brief. " * 1550}},
    ):
        send(conversation, event)
    for _ in range(100):
        if len(link.of("error", n)) == 6:
            break
        await asyncio.sleep(0.01)
    errors = link.of("error", n)
    assert [e["error"]["code"] for e in errors] == [
        "unsupported_feature",
        "unsupported_feature",
        "invalid_value",
        "unknown_event",
        "unsupported_feature",
        "invalid_value",
    ]
    assert errors[-1]["error"]["param"] == "response.instructions"
    assert not link.of("response.created", n)
    assert all(
        e["error"]["type"] == "invalid_request_error" and e["error"]["message"] for e in errors
    )
    assert conversation.session.conditions.persona == PERSONA
    assert not link.of("session.updated", n)
    validate(link.sent)


async def test_session_update_sets_instructions_and_turn_detection(
    talk: tuple[Conversation, Link],
) -> None:
    conversation, link = talk
    detection = {
        "type": "server_vad",
        "silence_duration_ms": 300,
        "threshold": 0.6,
        "create_response": False,
    }
    update = {
        "type": "realtime",
        "instructions": "Answer in one word.",
        "audio": {"input": {"turn_detection": detection}, "output": {"voice": "marin"}},
    }
    send(conversation, {"type": "session.update", "session": update})
    updated = await until(link, "session.updated")
    session = updated["session"]
    assert session["instructions"] == "Answer in one word."
    assert session["audio"]["output"]["voice"] == "marin"
    turn = session["audio"]["input"]["turn_detection"]
    assert turn["silence_duration_ms"] == 300 and turn["create_response"] is False
    assert conversation.detector._stop_frames == 15
    await speak(conversation)
    await until(link, "conversation.item.input_audio_transcription.completed")
    await asyncio.sleep(0.05)
    assert not link.of("response.created")  # create_response off: the turn waits
    assert conversation.session.state is TurnState.LISTENING
    send(conversation, {"type": "response.create"})
    done = await until(link, "response.done", conversation=conversation)
    assert done["response"]["output"][0]["content"][0]["transcript"].startswith(
        "As told: Answer in one word."
    )
    validate(link.sent)


class Sure:
    """An end-of-turn model that finds every utterance complete."""

    def probability(self, pcm: Any) -> float:
        return 0.9


@pytest.mark.parametrize("model", [True, False])
async def test_semantic_vad_applies_where_the_end_of_turn_model_is(model: bool) -> None:
    conversation, link = open_talk({}, InstructedTonePipeline(200.0, 2))
    try:
        if model:
            conversation.detector.completeness = Sure()
        detection = {"type": "semantic_vad", "eagerness": "high", "interrupt_response": False}
        update = {"type": "realtime", "audio": {"input": {"turn_detection": detection}}}
        send(conversation, {"type": "session.update", "session": update})
        turn = (await until(link, "session.updated"))["session"]["audio"]["input"]
        settings = conversation.turn_settings
        if model:  # high eagerness: half the waits (1200 ms unfinished, 160 ms complete)
            assert turn["turn_detection"] == {
                "type": "semantic_vad",
                "eagerness": "high",
                "create_response": True,
                "interrupt_response": False,
            }
            assert conversation.detector._stop_frames == 600 // 20
            assert settings.complete_wait_ms == 80
        else:  # no model on this server: it says what it does instead
            assert turn["turn_detection"]["type"] == "server_vad"
            assert settings.complete_wait_ms is None and not settings.interrupt_response
        validate(link.sent)
    finally:
        await conversation.close()


async def test_cutting_the_reply_in_progress_past_what_played_is_refused(
    talk: tuple[Conversation, Link],
) -> None:
    conversation, link = talk
    send(conversation, user_message("Hi"))
    send(conversation, {"type": "response.create"})
    await until(link, "output_audio_buffer.started", conversation=conversation)
    item_id = link.of("response.output_item.added")[0]["item"]["id"]
    cut = {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0}
    send(conversation, {**cut, "audio_end_ms": 60_000})
    error = await until(link, "error")
    assert error["error"]["code"] == "invalid_item"
    assert conversation.session.items.reply_item_id == item_id  # still playing: nothing changed
    send(conversation, {**cut, "audio_end_ms": 0})
    done = await until(link, "response.done")
    assert done["response"]["status"] == "cancelled"
    for _ in range(50):  # the stop cuts it where it played, then the client's cut follows
        if (
            link.of("conversation.item.truncated")[-1:]
            and link.of("conversation.item.truncated")[-1]["audio_end_ms"] == 0
        ):
            break
        await asyncio.sleep(0.01)
    truncated = link.of("conversation.item.truncated")[-1]
    assert truncated["item_id"] == item_id and truncated["audio_end_ms"] == 0
    assert all(t.item_id != item_id or not t.text for t in conversation.session.history.turns)
    validate(link.sent)


def test_prefix_padding_keeps_that_much_audio_before_the_speech_start() -> None:
    utterance = Utterance()
    for _ in range(25):  # 500 ms of 20 ms frames before the speech
        utterance.keep(np.ones(320, np.int16), speaking=False)
    utterance.preroll_ms = 100
    utterance.begin()
    assert utterance.samples == 100 * 16


async def test_text_only_replies_are_output_text_and_in_history_at_once(
    talk: tuple[Conversation, Link],
) -> None:
    conversation, link = talk
    send(conversation, {"type": "session.update", "session": {"output_modalities": ["text"]}})
    updated = await until(link, "session.updated")
    assert updated["session"]["output_modalities"] == ["text"]
    send(conversation, user_message("Hi"))
    send(conversation, {"type": "response.create"})
    done = await until(link, "response.done")  # nothing is pulled: there is no audio
    response = done["response"]
    assert response["status"] == "completed" and response["output_modalities"] == ["text"]
    text = response["output"][0]["content"][0]
    assert text["type"] == "output_text" and text["text"].startswith("As told:")
    deltas = "".join(e["delta"] for e in link.of("response.output_text.delta"))
    assert deltas == text["text"] == link.of("response.output_text.done")[0]["text"]
    assert not link.of("response.output_audio_transcript.delta")
    assert not link.of("output_audio_buffer.started") and not link.of("x-avatar.viseme")
    assert conversation.session.history.item(response["output"][0]["id"]).text == text["text"]
    assert conversation.session.state is TurnState.LISTENING
    n = len(link.sent)  # one reply in speech: the response's own output_modalities
    send(conversation, {"type": "response.create", "response": {"output_modalities": ["audio"]}})
    spoken = await until(link, "response.done", after=n, conversation=conversation)
    assert spoken["response"]["output_modalities"] == ["audio"]
    assert link.of("output_audio_buffer.started", n)
    pipeline = conversation.pipeline
    assert isinstance(pipeline, InstructedTonePipeline)
    text_request, spoken_request = pipeline.requests
    # a spoken reply's text is cut short when its playback runs low; a text reply has none
    assert text_request.view is None
    assert spoken_request.view is not None and spoken_request.view().slack_ms >= 0
    _, types = validate(link.sent)
    assert {"response.output_text.delta", "response.output_text.done"} <= types
