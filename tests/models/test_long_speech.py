"""Speech of any length: the recogniser never gets more audio than it takes, a long utterance
is heard in pieces cut at quiet points, with the words before each piece as its context, and
a recogniser that fails on a clip is replaced by the other one for that clip."""

from __future__ import annotations

import numpy as np
import pytest

from models.asr import AsrError, Heard, Pcm16k
from models.long_speech import InPieces, pieces_of, quiet_cuts
from models.moonshine import LONGEST_S, MoonshineAsr, MoonshineWithWhisper

RATE = 16_000


def babble(seconds: float, gaps_at_s: list[float], seed: int = 1) -> Pcm16k:
    """Loud noise standing for continuous speech, silent for 200 ms at each of ``gaps_at_s``."""
    rng = np.random.default_rng(seed)
    pcm = rng.integers(-8000, 8000, int(seconds * RATE)).astype(np.int16)
    for at in gaps_at_s:
        pcm[int(at * RATE) : int((at + 0.2) * RATE)] = 0
    return pcm


class Counting:
    """A recogniser that fails, as Moonshine does, on more than ``longest`` samples, and
    otherwise says which piece it heard (by its first sample's position in ``whole``)."""

    def __init__(self, whole: Pcm16k, longest: int) -> None:
        self.whole, self.longest = whole, longest
        self.calls: list[tuple[int, str]] = []  # (samples, context)

    def _text(self, pcm: Pcm16k, context: str) -> str:
        if pcm.size > self.longest:
            raise AsrError(f"too long: {pcm.size}")
        self.calls.append((pcm.size, context))
        k = int(np.flatnonzero(pcm)[0])  # a piece may start in a pause: find its first sound
        found = int(np.flatnonzero(np.all(self._windows() == pcm[k : k + 64], axis=1))[0])
        return f"w{(found - k) // RATE}"

    def _windows(self) -> np.ndarray:
        return np.lib.stride_tricks.sliding_window_view(self.whole, 64)

    def transcribe(self, pcm: Pcm16k, prefix: str = "", context: str = "") -> str:
        return self._text(pcm, context)

    def hear(self, pcm: Pcm16k, prefix: str = "", context: str = "") -> Heard:
        return Heard(self._text(pcm, context), (("rival", 0.1),))

    def transcribe_after(self, pcm: Pcm16k, context: str) -> str:
        return self._text(pcm, context)


def test_cuts_fall_in_the_pauses_and_no_piece_is_too_long() -> None:
    gaps = [5.0, 11.0, 17.5, 24.0, 31.0, 38.0, 45.5, 52.0]
    pcm = babble(60, gaps)
    cuts = quiet_cuts(pcm, 8 * RATE, 4 * RATE)
    assert cuts, "a minute of speech is one piece"
    for cut in cuts:
        assert any(at * RATE <= cut <= (at + 0.2) * RATE for at in gaps), cut / RATE
    pieces = pieces_of(pcm, 8.0, 4.0)
    assert sum(p.size for p in pieces) == pcm.size
    assert max(p.size for p in pieces) <= 8 * RATE
    # a cut depends only on the audio before it: the same cuts in the first 40 s alone
    first = quiet_cuts(pcm[: 40 * RATE], 8 * RATE, 4 * RATE)
    assert len(first) >= 4 and first == cuts[: len(first)]
    with pytest.raises(ValueError):
        quiet_cuts(pcm, 4 * RATE, 4 * RATE)


def test_a_minute_is_heard_whole_in_pieces_with_the_words_before_as_context() -> None:
    pcm = babble(60, [5.0, 11.0, 17.5, 24.0, 31.0, 38.0, 45.5, 52.0])
    asr = Counting(pcm, 8 * RATE)
    with pytest.raises(AsrError):
        asr.transcribe(pcm)
    long = InPieces(asr, 8.0, 4.0)
    text = long.transcribe(pcm, prefix="ignored for a long one")
    starts = [0, *(c // RATE for c in quiet_cuts(pcm, 8 * RATE, 4 * RATE))]
    assert text == " ".join(f"w{s}" for s in starts)
    assert all(size <= 8 * RATE for size, _ in asr.calls)
    contexts = [context for _, context in asr.calls]
    assert contexts == [" ".join(f"w{s}" for s in starts[:i]) for i in range(len(starts))]
    # the partials of a growing turn, then the final: earlier pieces are not heard again
    asr.calls.clear()
    heard = long.hear(pcm[: 58 * RATE])
    assert heard.text.split() == text.split()[: len(heard.text.split())]
    assert heard.last_word_rivals == (("rival", 0.1),)
    assert len(asr.calls) == 1  # only the newest piece
    # short audio goes as it is, prefix included
    asr.calls.clear()
    assert long.transcribe(pcm[: 3 * RATE]) == "w0" and asr.calls == [(3 * RATE, "")]


class Failing:
    """A recogniser that fails on every clip."""

    def transcribe(self, pcm: Pcm16k, prefix: str = "", context: str = "") -> str:
        raise AsrError("Moonshine failed: Attempting to broadcast an axis")

    def hear(self, pcm: Pcm16k, prefix: str = "", context: str = "") -> Heard:
        raise AsrError("Moonshine failed: Attempting to broadcast an axis")


class Fixed:
    def __init__(self, text: str) -> None:
        self.text = text

    def transcribe(self, pcm: Pcm16k, prefix: str = "", context: str = "") -> str:
        return self.text

    def hear(self, pcm: Pcm16k, prefix: str = "", context: str = "") -> Heard:
        return Heard(self.text, ())

    def transcribe_after(self, pcm: Pcm16k, context: str) -> str:
        return self.text


def test_a_recogniser_that_fails_on_a_clip_is_replaced_by_the_other_and_counted() -> None:
    failed: list[str] = []
    pair = MoonshineWithWhisper(Failing(), Fixed("heard by whisper"))  # type: ignore[arg-type]
    long = InPieces(pair, LONGEST_S, LONGEST_S / 2)
    long.set_fallback_observer(failed.append)
    clip = babble(3, [])
    assert long.transcribe(clip) == "heard by whisper"
    assert long.hear(clip).text == "heard by whisper"
    assert failed == ["moonshine", "moonshine"]
    # the other way round: Whisper (short clips) fails, Moonshine hears it
    pair = MoonshineWithWhisper(Fixed("heard by moonshine"), Failing())  # type: ignore[arg-type]
    pair.set_fallback_observer(failed.append)
    assert pair.transcribe(babble(0.5, [])) == "heard by moonshine"
    assert failed[-1] == "whisper"


@pytest.mark.timeout(120)
def test_real_moonshine_fails_past_its_limit_and_the_pieces_keep_it_under() -> None:
    """The failure the pieces avoid, on the real model: 10 s of babble-like speech."""
    from tests.support.speech import speak

    said = " ".join(["the quick brown fox jumps over the lazy dog and runs away"] * 3)
    pcm = speak(said)  # espeak-ng, 48 kHz
    from server.pipeline.resample import resample

    clip = resample(pcm, 48_000, RATE)
    if clip.size < 10.5 * RATE:
        clip = np.concatenate([clip, clip])
    moonshine = MoonshineAsr(cpu_threads=1)
    with pytest.raises(AsrError):
        moonshine.transcribe(clip[: int(10.5 * RATE)])
    pieces = InPieces(moonshine, LONGEST_S, LONGEST_S / 2)  # type: ignore[arg-type]
    text = pieces.transcribe(clip[: int(10.5 * RATE)])
    assert text.lower().count("fox") >= 2, text
