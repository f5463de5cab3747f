"""Audio in GA events, for a transport whose client sends and plays the audio itself (the
WebSocket of ``GET /v1/realtime``; over WebRTC audio travels on the tracks and these events
are refused).

In: ``input_audio_buffer.append`` (``audio``: base64 of PCM16 mono little-endian at 24 kHz, at
most ``MAX_APPEND_MS`` a message) and ``input_audio_buffer.commit``; a ``session.update`` may
name only that format (``audio/pcm`` at 24 kHz) for input and output. Out:
``response.output_audio.delta`` (the reply's audio in the same format). Values and checks
only: the link carries them out.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from server.wire.protocol import ProtocolError

RATE_HZ = 24_000  # input and output sample rate (Hz): the GA ``audio/pcm`` format
PCM_TYPE = "audio/pcm"
MAX_APPEND_MS = 1000  # audio in one append (ms)
MAX_APPEND_BYTES = MAX_APPEND_MS * RATE_HZ * 2 // 1000  # 48,000 bytes of PCM16
MAX_APPEND_CHARS = 4 * -(-MAX_APPEND_BYTES // 3)  # its base64 length
APPEND = "input_audio_buffer.append"
COMMIT = "input_audio_buffer.commit"
AUDIO_DELTA = "response.output_audio.delta"


@dataclass(frozen=True)
class AudioAppend:
    """Audio the client sends: PCM16 mono samples at ``RATE_HZ``."""

    pcm: npt.NDArray[np.int16]
    event_id: str | None = None

    @property
    def duration_ms(self) -> float:
        return len(self.pcm) * 1000 / RATE_HZ


@dataclass(frozen=True)
class AudioCommit:
    """The client ends its turn now (push to talk)."""

    event_id: str | None = None


AudioEvent = AudioAppend | AudioCommit


@dataclass(frozen=True)
class ReplyAudio:
    """Whose audio a delta carries: a response and its assistant item."""

    response_id: str
    item_id: str


def parse_audio_event(data: dict[str, Any], event_id: str | None, kind: str) -> AudioEvent | None:
    """An append or a commit (``data``: the decoded event); None for any other ``kind``.
    ProtocolError for audio that is not base64 of whole 16-bit samples, or is over
    ``MAX_APPEND_MS``."""
    if kind == COMMIT:
        return AudioCommit(event_id)
    if kind != APPEND:
        return None
    audio = data.get("audio")
    if not isinstance(audio, str):
        raise ProtocolError("invalid_value", "audio must be a base64 string", event_id, "audio")
    if len(audio) > MAX_APPEND_CHARS:
        message = f"at most {MAX_APPEND_MS} ms ({MAX_APPEND_BYTES} bytes) of audio per append"
        raise ProtocolError("invalid_value", message, event_id, "audio")
    try:
        raw = base64.b64decode(audio, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("invalid_value", "audio is not base64", event_id, "audio") from None
    if len(raw) % 2:
        message = "audio must be whole 16-bit samples (PCM16, an even number of bytes)"
        raise ProtocolError("invalid_value", message, event_id, "audio")
    return AudioAppend(np.frombuffer(raw, "<i2").astype(np.int16), event_id)


def _format(value: object, param: str, event_id: str | None) -> None:
    if value is None:
        return
    kind = value.get("type") if isinstance(value, dict) else None
    rate = value.get("rate", RATE_HZ) if isinstance(value, dict) else None
    if kind != PCM_TYPE or rate != RATE_HZ:
        message = f"audio is {PCM_TYPE} at {RATE_HZ} Hz only (PCM16 mono)"
        raise ProtocolError("unsupported_feature", message, event_id, param)


def check_formats(data: dict[str, Any], event_id: str | None) -> None:
    """A ``session.update`` names no audio format but PCM16 at 24 kHz (ProtocolError)."""
    session = data.get("session")
    audio = session.get("audio") if isinstance(session, dict) else None
    if not isinstance(audio, dict):
        return
    for side in ("input", "output"):
        part = audio.get(side)
        if isinstance(part, dict):
            _format(part.get("format"), f"session.audio.{side}.format", event_id)


def audio_delta(reply: ReplyAudio, pcm: npt.NDArray[np.int16]) -> dict[str, Any]:
    """A ``response.output_audio.delta`` of ``pcm`` (PCM16 mono at ``RATE_HZ``)."""
    delta = base64.b64encode(np.ascontiguousarray(pcm, "<i2").tobytes()).decode("ascii")
    ids = {"response_id": reply.response_id, "item_id": reply.item_id}
    return {"type": AUDIO_DELTA, **ids, "output_index": 0, "content_index": 0, "delta": delta}
