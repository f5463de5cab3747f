"""The inbound audio path's own parts: the jitter buffer that holds nothing, and the silence
put where the microphone's frames skip time."""

from __future__ import annotations

from fractions import Fraction

import av
import numpy as np
from aiortc.rtp import RtpPacket

from server.rtc.inbound import MAX_FILLED_MS, Gaps
from server.rtc.jitter import ArrivalBuffer

TIME_BASE = Fraction(1, 48_000)


def packet(seq: int) -> RtpPacket:
    p = RtpPacket(sequence_number=seq % 65_536, timestamp=(seq * 960) % (1 << 32))
    p._data = f"frame {seq}".encode()  # type: ignore[attr-defined]  # as the receiver sets it
    return p


def released(buffer: ArrivalBuffer, seqs: list[int]) -> list[int | None]:
    """The sequence numbers each added packet released (None: nothing)."""
    out: list[int | None] = []
    for seq in seqs:
        flag, frame = buffer.add(packet(seq))
        assert flag is False
        out.append(None if frame is None else int(frame.data.split()[1]))
    return out


def test_each_packet_is_released_as_it_arrives_and_a_loss_holds_nothing_back() -> None:
    buffer = ArrivalBuffer()
    assert released(buffer, [0, 1, 2, 4, 5, 6]) == [0, 1, 2, 4, 5, 6]  # 3 lost
    assert (buffer.released, buffer.dropped) == (6, 0)


def test_a_late_or_repeated_packet_is_dropped() -> None:
    buffer = ArrivalBuffer()
    assert released(buffer, [10, 12, 11, 13, 13, 14]) == [10, 12, None, 13, None, 14]
    assert buffer.dropped == 2


def test_sequence_numbers_wrap_and_a_new_numbering_starts_over() -> None:
    buffer = ArrivalBuffer()
    wrapping = [65_534, 65_535, 65_536, 65_537]  # numbered 65534, 65535, 0, 1
    assert released(buffer, wrapping) == wrapping
    # far behind the last (over 100 packets): the sender numbers anew, not a late packet
    assert released(buffer, [1_000, 800, 801]) == [1_000, 800, 801]


def opus_like(pts: int, samples: int = 960) -> av.AudioFrame:
    """An audio frame as aiortc's Opus decoder gives it: s16, stereo, packed, 48 kHz."""
    pcm = np.full((1, samples * 2), 1_000, np.int16)
    frame = av.AudioFrame.from_ndarray(pcm, format="s16", layout="stereo")
    frame.sample_rate, frame.pts, frame.time_base = 48_000, pts, TIME_BASE
    return frame


def test_a_lost_frame_is_heard_as_silence_of_its_length_at_its_time() -> None:
    gaps = Gaps()
    assert gaps.before(opus_like(0)) is None
    assert gaps.before(opus_like(960)) is None
    silence = gaps.before(opus_like(3 * 960))  # the frame at 1920 never came
    assert silence is not None
    assert (silence.samples, silence.sample_rate, silence.pts) == (960, 48_000, 1920)
    assert (silence.format.name, silence.layout.name) == ("s16", "stereo")
    assert not silence.to_ndarray().any()
    assert gaps.filled_ms == 20.0
    assert gaps.before(opus_like(4 * 960)) is None  # back on time


def test_a_planar_frame_gets_planar_silence() -> None:
    pcm = np.zeros((1, 480), np.float32)
    frame = av.AudioFrame.from_ndarray(pcm, format="fltp", layout="mono")
    frame.sample_rate, frame.time_base = 48_000, TIME_BASE
    gaps = Gaps()
    frame.pts = 0
    assert gaps.before(frame) is None
    frame.pts = 960  # 480 samples after the previous frame's end
    silence = gaps.before(frame)
    assert silence is not None and silence.samples == 480 and silence.format.name == "fltp"


def test_a_sender_that_stopped_is_not_filled() -> None:
    gaps = Gaps()
    gaps.before(opus_like(0))
    resumed = 960 + 48 * (MAX_FILLED_MS + 20)  # after more than MAX_FILLED_MS
    assert gaps.before(opus_like(resumed)) is None
    assert gaps.filled_ms == 0.0
    assert gaps.before(opus_like(resumed + 2 * 960)) is not None  # timed from there on
