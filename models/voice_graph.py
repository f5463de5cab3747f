"""The voice's graph in two parts, so that a sentence's audio can be decoded in windows.

A Piper VITS graph makes the sentence's latent frames first (text encoder, duration predictor,
flow: 192 channels, one frame per ``HOP_SAMPLES`` samples at the voice's rate), then its
decoder (HiFi-GAN, the nodes under ``/dec/``) turns all of them into audio. The decoder is most
of a synthesis (the joe voice on one thread: 58 of 85 ms for "Sure, I can.") and reads each
frame with a bounded context, so it can run on a window of frames: with ``CONTEXT_FRAMES`` on
either side of the frames it emits, the window's samples are the whole decode's (measured on
the joe voice: 122 dB signal to difference with 16 frames, 64 dB with 8). The first audio of a
sentence then waits for the front part and one short window, not for the whole decode.

The split is made in memory with ``onnx.utils.Extractor`` (the file on disk is not changed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

HOP_SAMPLES = 256  # samples at the voice's rate per latent frame (Piper's hop length)
DECODER_FIRST_NODE = "/dec/conv_pre/Conv"  # the decoder's first node; its input is the frames
CONTEXT_FRAMES = 16  # frames decoded on either side of a window's own
HEAD_MS = 240.0  # the first window's own audio (ms) at the least
GROWTH = 3  # each later window emits this many times the frames of the one before
# the next window must be decoded before the audio before it plays out: at a pace p (decode
# time over audio time, waits for the engine included) the second window, GROWTH x the head
# and its context, takes p x (GROWTH x head + 2 x context), which the head must outlast
HEAD_SAFETY = 1.5  # that head, made this much longer (the pace moves)
MAX_PACE = 0.3  # slower than this, the head would be most of a chunk: one piece


class VoiceGraphError(RuntimeError):
    """The graph is not one this module can split (no decoder where a Piper voice has it)."""


def decoder_input(model: onnx.ModelProto) -> str:
    """The tensor the decoder reads: the latent frames (batch, channels, frames)."""
    for node in model.graph.node:
        if node.name == DECODER_FIRST_NODE:
            return str(node.input[0])
    raise VoiceGraphError(f"the voice's graph has no {DECODER_FIRST_NODE} node")


def split_voice(
    model: onnx.ModelProto, extra_front_outputs: tuple[str, ...] = ()
) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """(front, decoder): the front reads the graph's inputs and gives the latent frames (and
    ``extra_front_outputs``, tensors computed on the way); the decoder reads the frames and
    gives the graph's other outputs (the audio)."""
    from onnx.utils import Extractor

    frames = decoder_input(model)
    inputs = [i.name for i in model.graph.input]
    outputs = [o.name for o in model.graph.output if o.name not in extra_front_outputs]
    extractor = Extractor(model)
    front = extractor.extract_model(inputs, [frames, *extra_front_outputs])
    decoder = extractor.extract_model([frames], outputs)
    return front, decoder


@dataclass(frozen=True)
class Window:
    """Frames ``start``..``end`` emitted from a decode of frames ``lo``..``hi`` (the context
    on either side included)."""

    start: int
    end: int
    lo: int
    hi: int

    def emitted(self) -> slice:
        """Where the window's own samples lie in its decode's output."""
        first = (self.start - self.lo) * HOP_SAMPLES
        return slice(first, first + (self.end - self.start) * HOP_SAMPLES)


def head_frames(rate_hz: int, head_ms: float = HEAD_MS) -> int:
    """Frames in the first window at ``rate_hz`` (at least one)."""
    return max(1, math.ceil(head_ms / 1000 * rate_hz / HOP_SAMPLES))


def head_for_pace(pace: float | None, rate_hz: int, context: int = CONTEXT_FRAMES) -> int | None:
    """The first window's own frames at ``pace`` (decode time over audio time; None or
    ``MAX_PACE`` and slower: no head, one window): long enough that the second window is
    decoded before it plays out, ``HEAD_MS`` at the least."""
    if pace is None or not 0 <= pace < MAX_PACE:
        return None
    needed = HEAD_SAFETY * 2 * pace * context / (1 - GROWTH * pace)
    return max(head_frames(rate_hz), math.ceil(needed))


def windows(frames: int, head: int | None, context: int = CONTEXT_FRAMES) -> list[Window]:
    """The windows that decode ``frames`` frames: one if ``head`` is None (or they are few),
    else ``head`` frames first and each later window ``GROWTH`` times the one before, a last
    one shorter than ``head`` merged into the one before it. Every window carries ``context``
    frames on either side where the sentence has them."""
    if frames <= 0:
        return []
    own: list[tuple[int, int]] = []
    if head is None or frames <= head + head:
        own.append((0, frames))
    else:
        start, size = 0, head
        while start < frames:
            end = min(frames, start + size)
            if frames - end < head:
                end = frames
            own.append((start, end))
            start, size = end, size * GROWTH
    return [
        Window(start, end, max(0, start - context), min(frames, end + context))
        for start, end in own
    ]
