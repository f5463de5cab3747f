"""The OpenAI Realtime GA session object: read from ``session.update`` (and the ``session`` of
``POST /v1/realtime/calls``) into what this server can apply, and described back to clients.

What applies: ``instructions`` (the persona), ``audio.output.voice``, ``audio.input.
turn_detection`` of type ``server_vad`` (``threshold``, ``silence_duration_ms``,
``prefix_padding_ms``, ``create_response``, ``interrupt_response``) or ``semantic_vad``
(``eagerness``, ``create_response``, ``interrupt_response``), and ``output_modalities``
(``["audio"]``: speech and its transcript; ``["text"]``: text only), ``tools`` (function
tools: server/wire/realtime_tools.py) and ``tool_choice``. Refused with a clear error,
changing nothing: MCP tools, turning turn detection off, transcription sessions.
Accepted and ignored (they mean nothing over WebRTC here, or are the server's choice):
``model``, audio formats, ``audio.input.transcription``, ``noise_reduction``, ``speed``,
``tracing``, ``include``, ``max_output_tokens``, ``truncation``, ``prompt``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from server.config import Config
from server.runtime.tools import FunctionTool, ToolChoice, ToolSettings
from server.wire.protocol import ProtocolError
from server.wire.realtime_tools import parse_tool_choice, parse_tools

SILENCE_MS = (100, 10_000)  # silence_duration_ms bounds (the server's vad.end_of_turn_ms)
PREFIX_MS = (0, 500)  # prefix_padding_ms bounds: the pre-roll the utterance keeps
EAGERNESS = {"low": 2.0, "medium": 1.0, "auto": 1.0, "high": 0.5}  # semantic_vad: x the waits
AUDIO_FORMAT = {"type": "audio/pcm", "rate": 24_000}  # nominal: WebRTC carries Opus


@dataclass(frozen=True)
class TurnSettings:
    """How a session detects and answers the end of the user's turn.

    ``threshold``: speech probability (0-1) of the confirming model; ``silence_ms``: silence
    that ends a turn (``server_vad``); ``prefix_ms``: audio kept before the speech start;
    ``create_response``: a turn is answered by itself; ``interrupt_response``: the user's
    speech stops a reply; ``text_only``: replies are text, not speech (``output_modalities``
    ``["text"]``); ``semantic`` (``semantic_vad``): a turn that sounds complete ends after
    ``complete_ms`` of silence, one that does not after ``incomplete_ms``, both scaled by the
    ``eagerness``.
    """

    threshold: float
    silence_ms: int
    prefix_ms: int
    create_response: bool = True
    interrupt_response: bool = True
    text_only: bool = False
    semantic: bool = False
    eagerness: str = "auto"
    complete_ms: int = 160
    incomplete_ms: int = 1200

    @classmethod
    def from_config(cls, config: Config) -> TurnSettings:
        vad = config.vad
        return cls(
            vad.silero_threshold,
            vad.end_of_turn_ms,
            PREFIX_MS[1],
            semantic=vad.semantic,
            complete_ms=vad.complete_silence_ms,
            incomplete_ms=vad.incomplete_silence_ms,
        )

    @property
    def end_of_turn_ms(self) -> int:
        """Silence (ms) that ends any turn: an unfinished-sounding one with ``semantic``."""
        if self.semantic:
            return round(self.incomplete_ms * EAGERNESS[self.eagerness])
        return self.silence_ms

    @property
    def complete_wait_ms(self) -> int | None:
        """Silence (ms) that ends a turn that sounds complete; None without ``semantic``."""
        return round(self.complete_ms * EAGERNESS[self.eagerness]) if self.semantic else None

    def to_json(self) -> dict[str, Any]:
        if self.semantic:
            return {
                "type": "semantic_vad",
                "eagerness": self.eagerness,
                "create_response": self.create_response,
                "interrupt_response": self.interrupt_response,
            }
        return {
            "type": "server_vad",
            "threshold": self.threshold,
            "silence_duration_ms": self.silence_ms,
            "prefix_padding_ms": self.prefix_ms,
            "create_response": self.create_response,
            "interrupt_response": self.interrupt_response,
            "idle_timeout_ms": None,
        }


@dataclass(frozen=True)
class SessionPatch:
    """What one GA session object asks for: ``conditions`` (persona, voice) for the runtime
    session, ``turn`` fields to change (None: unchanged)."""

    conditions: dict[str, str] = field(default_factory=dict)
    turn: dict[str, Any] = field(default_factory=dict)
    tools: tuple[FunctionTool, ...] | None = None
    tool_choice: ToolChoice | None = None

    def apply_turn(self, settings: TurnSettings) -> TurnSettings:
        return replace(settings, **self.turn) if self.turn else settings

    def apply_tools(self, settings: ToolSettings) -> ToolSettings:
        """``settings`` with this patch's tools and choice (a choice of a function no longer
        offered goes back to ``auto``)."""
        tools = settings.tools if self.tools is None else self.tools
        choice = settings.choice if self.tool_choice is None else self.tool_choice
        if choice.name and choice.name not in {tool.name for tool in tools}:
            choice = ToolChoice()
        return ToolSettings(tools, choice)


def _refuse(message: str, param: str, event_id: str | None, code: str = "invalid_value") -> None:
    raise ProtocolError(code, message, event_id, param)


def _object(value: object, param: str, event_id: str | None) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        _refuse(f"{param} must be an object", param, event_id)
    assert isinstance(value, dict)
    return value


def _number(value: object, low: float, high: float, param: str, event_id: str | None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        _refuse(f"{param} must be a number", param, event_id)
    assert isinstance(value, int | float)
    if not low <= value <= high:
        _refuse(f"{param} must be between {low:g} and {high:g}", param, event_id)
    return float(value)


def _flag(value: object, param: str, event_id: str | None) -> bool:
    if not isinstance(value, bool):
        _refuse(f"{param} must be true or false", param, event_id)
    return bool(value)


def _turn_detection(value: object, event_id: str | None) -> dict[str, Any]:
    param = "session.audio.input.turn_detection"
    if value is None:
        _refuse(
            "turning turn detection off (null) is not supported: this server detects turns",
            param,
            event_id,
            "unsupported_feature",
        )
    detection = _object(value, param, event_id)
    kind = detection.get("type", "server_vad")
    if kind not in ("server_vad", "semantic_vad"):
        _refuse(f"unknown turn detection type {str(kind)[:32]!r}", f"{param}.type", event_id)
    turn: dict[str, Any] = {"semantic": kind == "semantic_vad"}
    for name in ("create_response", "interrupt_response"):
        if detection.get(name) is not None:
            turn[name] = _flag(detection[name], f"{param}.{name}", event_id)
    if kind == "semantic_vad":
        eagerness = detection.get("eagerness")
        if eagerness is not None:
            if eagerness not in EAGERNESS:
                _refuse("eagerness is low, medium, high or auto", f"{param}.eagerness", event_id)
            turn["eagerness"] = eagerness
        return turn
    if detection.get("threshold") is not None:
        turn["threshold"] = _number(detection["threshold"], 0, 1, f"{param}.threshold", event_id)
    if detection.get("silence_duration_ms") is not None:
        silence = _number(
            detection["silence_duration_ms"], *SILENCE_MS, f"{param}.silence_duration_ms", event_id
        )
        turn["silence_ms"] = int(silence)
    if detection.get("prefix_padding_ms") is not None:
        prefix = _number(
            detection["prefix_padding_ms"], *PREFIX_MS, f"{param}.prefix_padding_ms", event_id
        )
        turn["prefix_ms"] = int(prefix)
    return turn


def output_modalities(value: object, where: str, event_id: str | None) -> bool | None:
    """``output_modalities``: True for ``["text"]`` (text only), False for ``["audio"]`` (speech
    and its transcript), None when absent; ProtocolError otherwise."""
    if value is None:
        return None
    if value in (["text"], ["audio"]):
        return value == ["text"]
    _refuse(
        'output_modalities is ["audio"] (speech and its transcript) or ["text"]',
        f"{where}.output_modalities",
        event_id,
    )
    return None


def parse_session(session: object, event_id: str | None = None) -> SessionPatch:
    """A GA session object as a patch; ProtocolError (with ``param``) for what this server
    cannot do or a malformed field. Nothing is applied here."""
    data = _object(session, "session", event_id)
    if data.get("type", "realtime") != "realtime":
        _refuse(
            "only realtime sessions are supported", "session.type", event_id, "unsupported_feature"
        )
    tools = None
    if data.get("tools") is not None:
        tools = parse_tools(data["tools"], "session.tools", event_id)
    choice = None
    if data.get("tool_choice") is not None:
        choice = parse_tool_choice(data["tool_choice"], tools, "session.tool_choice", event_id)
    text_only = output_modalities(data.get("output_modalities"), "session", event_id)
    conditions: dict[str, str] = {}
    instructions = data.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str) or not instructions.strip():
            _refuse("instructions must be a non-empty string", "session.instructions", event_id)
        conditions["persona"] = str(instructions)
    audio = _object(data.get("audio"), "session.audio", event_id)
    output = _object(audio.get("output"), "session.audio.output", event_id)
    voice = output.get("voice")
    if voice is not None:
        if isinstance(voice, dict):  # a custom voice is named by its id
            voice = voice.get("id")
        if not isinstance(voice, str) or not voice.strip():
            _refuse("voice must be a non-empty string", "session.audio.output.voice", event_id)
        conditions["voice"] = str(voice)
    turn: dict[str, Any] = {}
    source = _object(audio.get("input"), "session.audio.input", event_id)
    if "turn_detection" in source:
        turn = _turn_detection(source["turn_detection"], event_id)
    if text_only is not None:
        turn["text_only"] = text_only
    return SessionPatch(conditions, turn, tools, choice)


def model_name(config: Config) -> str:
    """The model a client is told it talks to: the LLM's name, never a file path."""
    pipeline = config.pipeline
    return pipeline.llm_remote_model or Path(pipeline.llm_model).name or "avatar-server"


def session_object(
    session_id: str,
    config: Config,
    persona: str,
    voice: str,
    turn: TurnSettings,
    tools: ToolSettings | None = None,
) -> dict[str, Any]:
    """The GA session object of ``session.created`` / ``session.updated``."""
    return {
        "type": "realtime",
        "object": "realtime.session",
        "id": session_id,
        "model": model_name(config),
        "instructions": persona,
        "output_modalities": ["text"] if turn.text_only else ["audio"],
        "audio": {
            "input": {
                "format": AUDIO_FORMAT,
                "transcription": None,
                "noise_reduction": None,
                "turn_detection": turn.to_json(),
            },
            "output": {"format": AUDIO_FORMAT, "voice": voice, "speed": 1.0},
        },
        "tools": [tool.as_session() for tool in tools.tools] if tools else [],
        "tool_choice": tools.choice.as_session() if tools else "auto",
        "max_output_tokens": config.pipeline.llm_max_tokens,
    }
