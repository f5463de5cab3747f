"""Speech of any length: an utterance longer than a recogniser takes, heard in pieces cut at
quiet points.

Moonshine tiny fails on about 10 s of continuous audio (onnxruntime: "Attempting to broadcast
an axis by a dimension other than 1. 2 by 457" on an 11 s recording of a person), and Whisper
reads at most its 30 s window and drops the rest. :class:`InPieces` never hands its recogniser
more than ``longest_s``: a longer utterance is cut at the quietest moment between
``shortest_s`` and ``longest_s`` after the last cut (a pause between words or a breath, rarely
inside one), each piece is heard with the words before it as context (Whisper's previous-text
prompt; Moonshine reads none), and the texts are joined. A cut depends only on the audio up to
``longest_s`` after the one before, so the pieces of a growing utterance stay where they were:
their texts are kept (keyed by their samples and context), and the partial transcripts of a
long turn, and the final one, decode only the newest piece again.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

import numpy as np
import numpy.typing as npt

from models.asr import Heard, Pcm16k

RATE_HZ = 16_000
QUIET_FRAME = 480  # 30 ms: the energy is compared frame by frame ...
QUIET_SPAN = 5  # ... over 150 ms (a pause, not the closure of one consonant)
KEPT_PIECES = 64  # texts of pieces kept (a few long turns' worth)


class Recogniser(Protocol):
    """A recogniser as :class:`InPieces` uses it (models.asr.WhisperAsr, the Moonshine pair);
    ``context``: text said before the audio, where the recogniser can read it."""

    def transcribe(self, pcm: Pcm16k, prefix: str = "", context: str = "") -> str: ...

    def hear(self, pcm: Pcm16k, prefix: str = "", context: str = "") -> Heard: ...

    def transcribe_after(self, pcm: Pcm16k, context: str) -> str: ...


def quiet_cuts(pcm: Pcm16k, longest: int, shortest: int) -> list[int]:
    """Where to cut ``pcm`` (16 kHz samples) into pieces of at most ``longest`` samples: each
    cut at the middle of the quietest ``QUIET_SPAN`` frames between ``shortest`` and
    ``longest`` samples after the cut before it (the earliest of equals)."""
    if not 0 < shortest < longest:
        raise ValueError(f"need 0 < shortest < longest, got {shortest}, {longest}")
    cuts: list[int] = []
    start = 0
    while pcm.size - start > longest:
        window = pcm[start + shortest : start + longest].astype(np.float32)
        frames = window[: window.size // QUIET_FRAME * QUIET_FRAME].reshape(-1, QUIET_FRAME)
        energy = (frames * frames).mean(axis=1)
        span = min(QUIET_SPAN, energy.size)
        summed = np.convolve(energy, np.ones(span), mode="valid")
        first = int(np.argmin(summed))
        cut = start + shortest + (first * QUIET_FRAME) + span * QUIET_FRAME // 2
        assert start < cut <= start + longest
        cuts.append(cut)
        start = cut
    return cuts


def _joined(*texts: str) -> str:
    return " ".join(t for t in texts if t)


class InPieces:
    """``asr`` for audio of any length: at most ``longest_s`` a call (see the module)."""

    def __init__(self, asr: Recogniser, longest_s: float, shortest_s: float) -> None:
        self.asr = asr
        self.longest = int(longest_s * RATE_HZ)
        self.shortest = int(shortest_s * RATE_HZ)
        self._kept: OrderedDict[bytes, str] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def cross_check(self) -> bool:
        """The recogniser's ``cross_check`` (False where it has none)."""
        return bool(getattr(self.asr, "cross_check", False))

    @cross_check.setter
    def cross_check(self, on: bool) -> None:
        if hasattr(self.asr, "cross_check"):
            self.asr.cross_check = on

    def set_fallback_observer(self, observe: Callable[[str], None]) -> None:
        """Passed on to the recogniser, where it has one to fall back on."""
        setter = getattr(self.asr, "set_fallback_observer", None)
        if setter is not None:
            setter(observe)

    def transcribe(self, pcm: Pcm16k, prefix: str = "", context: str = "") -> str:
        """Text of the utterance. ``prefix`` (words decided for its start) is used where the
        utterance is one piece; a longer one's earlier pieces are kept from before instead."""
        if pcm.size <= self.longest:
            return self.asr.transcribe(pcm, prefix, context)
        said, last = self._before_last(pcm, context)
        return _joined(said, self.asr.transcribe(last, "", _joined(context, said)))

    def hear(self, pcm: Pcm16k, prefix: str = "", context: str = "") -> Heard:
        """Like ``transcribe``, with the words weighed in place of the last one."""
        if pcm.size <= self.longest:
            return self.asr.hear(pcm, prefix, context)
        said, last = self._before_last(pcm, context)
        heard = self.asr.hear(last, "", _joined(context, said))
        return Heard(_joined(said, heard.text), heard.last_word_rivals)

    def transcribe_after(self, pcm: Pcm16k, context: str) -> str:
        if pcm.size <= self.longest:
            return self.asr.transcribe_after(pcm, context)
        said, last = self._before_last(pcm, context)
        return _joined(said, self.asr.transcribe_after(last, _joined(context, said)))

    def _before_last(self, pcm: Pcm16k, context: str) -> tuple[str, Pcm16k]:
        """The text of every piece but the last (kept, or heard now), and the last piece."""
        bounds = [0, *quiet_cuts(pcm, self.longest, self.shortest)]
        said = ""
        for start, end in itertools.pairwise(bounds):
            said = _joined(said, self._piece(pcm[start:end], _joined(context, said)))
        return said, pcm[bounds[-1] :]

    def _piece(self, piece: Pcm16k, context: str) -> str:
        key = hashlib.blake2b(context.encode() + b"\0" + piece.tobytes(), digest_size=16).digest()
        with self._lock:
            if key in self._kept:
                self._kept.move_to_end(key)
                return self._kept[key]
        text = self.asr.transcribe(piece, "", context)
        with self._lock:
            self._kept[key] = text
            while len(self._kept) > KEPT_PIECES:
                self._kept.popitem(last=False)
        return text


def pieces_of(pcm: npt.NDArray[np.int16], longest_s: float, shortest_s: float) -> list[Pcm16k]:
    """``pcm`` cut as :class:`InPieces` cuts it (for tests and benchmarks)."""
    bounds = [0, *quiet_cuts(pcm, int(longest_s * RATE_HZ), int(shortest_s * RATE_HZ)), pcm.size]
    return [pcm[a:b] for a, b in itertools.pairwise(bounds)]
