"""The microphone's Opus decoder: a lost packet's audio recovered, not left silent.

aiortc decodes through FFmpeg, which cannot ask libopus for what a lost packet held. A WebRTC
sender (Chrome, Safari, the mobile SDKs) puts a low-bitrate copy of each frame into the next
packet once the receiver reports loss (in-band FEC, ``useinbandfec=1``). This decoder calls
libopus itself (the copy PyAV ships, else the system's), and where the packets' timestamps
skip a frame it decodes that copy from the packet that follows; frames lost before that one
are extrapolated by libopus's concealment (PLC), up to ``MAX_CONCEALED_SAMPLES``. Longer gaps
stay gaps, which the inbound path fills with silence (server/rtc/inbound.py).

Frames come out as aiortc's do: s16 stereo at 48 kHz, pts the receiver's mapped RTP
timestamp (samples, growing without a wrap). A frame made for a lost packet says how in its
``opaque`` (:class:`Concealed`), so that the peer counts the loss.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import enum
import fractions
import logging
from functools import cache
from pathlib import Path

import aiortc.rtcrtpreceiver
import av
import numpy as np
from aiortc import RTCRtpCodecParameters
from aiortc.codecs import get_decoder
from aiortc.codecs.base import Decoder
from aiortc.jitterbuffer import JitterFrame
from av.frame import Frame

log = logging.getLogger(__name__)

RATE_HZ = 48_000  # Opus's RTP clock and the decoder's output rate
CHANNELS = 2  # as aiortc's decoder: the inbound path mixes down
TIME_BASE = fractions.Fraction(1, RATE_HZ)
MAX_FRAME_SAMPLES = 5760  # 120 ms, the longest Opus packet (per channel)
MAX_CONCEALED_SAMPLES = 4800  # 100 ms: libopus's extrapolation fades out by then


class Concealed(enum.StrEnum):
    """How a frame whose packet was lost was made."""

    RECOVERED = "recovered"  # decoded from the copy (FEC) the next packet carried
    EXTRAPOLATED = "extrapolated"  # by libopus's concealment from the audio before (PLC)


class OpusUnavailable(RuntimeError):
    """No libopus to load."""


FEC_PARAMETER = "useinbandfec"  # RFC 7587: this receiver uses in-band FEC; send it


def receiving_fec(codec: RTCRtpCodecParameters) -> RTCRtpCodecParameters:
    """``codec`` as a receiver that uses in-band FEC advertises it (Opus only; the answer's
    ``a=fmtp`` then says ``useinbandfec=1``), or unchanged where libopus cannot be loaded."""
    if codec.mimeType.lower() != "audio/opus" or not available():
        return codec
    return dataclasses.replace(codec, parameters={**codec.parameters, FEC_PARAMETER: 1})


def _decoder_for(codec: RTCRtpCodecParameters) -> Decoder:
    """aiortc's decoder choice, but ours for Opus a receiver advertised FEC for."""
    if codec.mimeType.lower() == "audio/opus" and codec.parameters.get(FEC_PARAMETER) == 1:
        return ConcealingOpusDecoder()
    return get_decoder(codec)


def install() -> None:
    """Let receivers whose Opus codec says ``useinbandfec=1`` (:func:`receiving_fec`) decode
    with :class:`ConcealingOpusDecoder`; every other receiver keeps aiortc's decoders. aiortc
    picks a decoder by codec alone, in its receiver module: that choice is wrapped once."""
    aiortc.rtcrtpreceiver.get_decoder = _decoder_for  # type: ignore[attr-defined]


# samples (48 kHz) of one Opus frame by its TOC configuration (RFC 6716 3.1): SILK 10, 20, 40,
# 60 ms; hybrid 10, 20 ms; CELT 2.5, 5, 10, 20 ms
_FRAME_SAMPLES = (480, 960, 1920, 2880) * 3 + (480, 960) * 2 + (120, 240, 480, 960) * 4


def packet_samples(packet: bytes) -> int:
    """Samples (48 kHz, per channel) an Opus packet plays, read from its TOC byte (and the
    frame count of a code 3 packet), at most MAX_FRAME_SAMPLES; 0 for no packet. Pure Python,
    without libopus: for the inbound audio's budget (server/rtc/jitter.py)."""
    if not packet:
        return 0
    toc = packet[0]
    code = toc & 0x3
    if code == 0:
        frames = 1
    elif code in (1, 2):
        frames = 2
    else:
        frames = packet[1] & 0x3F if len(packet) > 1 else 0
    return min(frames * _FRAME_SAMPLES[toc >> 3], MAX_FRAME_SAMPLES)


def has_copy(packet: bytes) -> bool:
    """Whether an Opus packet carries the previous frame's FEC copy."""
    return bool(libopus().opus_packet_has_lbrr(packet, len(packet)) > 0)


@cache
def available() -> bool:
    """Whether libopus loads (else Opus is decoded by aiortc, lost frames left silent)."""
    try:
        libopus()
    except OpusUnavailable as exc:
        log.warning("lost microphone packets will be silence: %s", exc)
        return False
    return True


def _library_path() -> str:
    """PyAV's libopus (the one FFmpeg uses here), else the system's."""
    bundled = Path(av.__file__).resolve().parent.parent / "av.libs"
    for candidate in sorted(bundled.glob("libopus*.so*")):
        return str(candidate)
    found = ctypes.util.find_library("opus")
    if found is None:
        raise OpusUnavailable(f"no libopus in {bundled} nor on the system")
    return found


@cache
def libopus() -> ctypes.CDLL:
    """libopus with the decoder's functions typed; OpusUnavailable if none loads."""
    path = _library_path()
    try:
        lib = ctypes.CDLL(path)
    except OSError as exc:
        raise OpusUnavailable(f"{path}: {exc}") from exc
    lib.opus_decoder_create.restype = ctypes.c_void_p
    lib.opus_decoder_create.argtypes = [ctypes.c_int32, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    lib.opus_decoder_destroy.restype = None
    lib.opus_decoder_destroy.argtypes = [ctypes.c_void_p]
    lib.opus_decode.restype = ctypes.c_int
    lib.opus_decode.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_int32,
        ctypes.POINTER(ctypes.c_int16),
        ctypes.c_int,
        ctypes.c_int,
    ]
    lib.opus_packet_get_nb_samples.restype = ctypes.c_int
    lib.opus_packet_get_nb_samples.argtypes = [ctypes.c_char_p, ctypes.c_int32, ctypes.c_int32]
    lib.opus_packet_has_lbrr.restype = ctypes.c_int  # libopus 1.5 on
    lib.opus_packet_has_lbrr.argtypes = [ctypes.c_char_p, ctypes.c_int32]
    return lib


class ConcealingOpusDecoder(Decoder):
    """Opus packets to 48 kHz s16 stereo frames; lost frames recovered (FEC, then PLC)."""

    def __init__(self) -> None:
        self._lib = libopus()
        error = ctypes.c_int(0)
        self._state = self._lib.opus_decoder_create(RATE_HZ, CHANNELS, ctypes.byref(error))
        if not self._state or error.value != 0:
            raise OpusUnavailable(f"opus_decoder_create failed: error {error.value}")
        self._pcm = (ctypes.c_int16 * (MAX_FRAME_SAMPLES * CHANNELS))()
        self._next: int | None = None  # the timestamp the next packet should have
        self.made = dict.fromkeys(Concealed, 0)  # frames made for lost packets, by how

    def __del__(self) -> None:
        state, self._state = getattr(self, "_state", None), None
        if state:
            self._lib.opus_decoder_destroy(state)

    def decode(self, encoded_frame: JitterFrame) -> list[Frame]:
        """The frames of one packet, after those recovered for the packets lost before it."""
        data, timestamp = encoded_frame.data, encoded_frame.timestamp
        samples = self._lib.opus_packet_get_nb_samples(data, len(data), RATE_HZ)
        if samples <= 0:
            raise av.InvalidDataError(-1, f"not an Opus packet ({len(data)} bytes)")
        frames = self._recover(data, timestamp, samples)
        frames.append(self._frame(self._run(data, samples, fec=False), timestamp, None))
        self._next = timestamp + samples
        return frames

    def _recover(self, data: bytes, timestamp: int, samples: int) -> list[Frame]:
        """Frames for the time the packets skipped before ``timestamp``: the last one (of the
        packet's own length) from its FEC copy, those before it by PLC; nothing for a gap over
        ``MAX_CONCEALED_SAMPLES`` but the FEC frame (the rest is heard as silence)."""
        if self._next is None:
            return []
        skipped = timestamp - self._next  # aiortc's mapped timestamps do not wrap
        if skipped <= 0 or skipped % 120:
            return []  # in order, older (the buffer drops those), or not whole 2.5 ms steps
        fec_samples = min(skipped, samples)
        frames: list[Frame] = []
        plc_total = skipped - fec_samples
        if plc_total <= MAX_CONCEALED_SAMPLES - fec_samples:
            start = self._next
            while plc_total > 0:
                step = min(plc_total, samples)
                pcm = self._run(None, step, fec=False)
                frames.append(self._frame(pcm, start, Concealed.EXTRAPOLATED))
                start, plc_total = start + step, plc_total - step
        fec_at = timestamp - fec_samples
        # without a copy in the packet, libopus's FEC call extrapolates
        how = Concealed.RECOVERED if has_copy(data) else Concealed.EXTRAPOLATED
        frames.append(self._frame(self._run(data, fec_samples, fec=True), fec_at, how))
        return frames

    def _run(self, data: bytes | None, samples: int, *, fec: bool) -> np.ndarray:
        """One libopus call: ``samples`` per channel, interleaved."""
        size = 0 if data is None else len(data)
        got = self._lib.opus_decode(self._state, data, size, self._pcm, samples, int(fec))
        if got < 0:
            raise av.InvalidDataError(-1, f"opus_decode failed: error {got}")
        return np.ctypeslib.as_array(self._pcm)[: got * CHANNELS].copy()

    def _frame(self, pcm: np.ndarray, pts: int, how: Concealed | None) -> Frame:
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="stereo")
        frame.sample_rate = RATE_HZ
        frame.pts = pts
        frame.time_base = TIME_BASE
        if how is not None:
            self.made[how] += 1
            frame.opaque = how
        return frame
