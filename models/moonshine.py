"""Speech recognition: Moonshine tiny (English) on onnxruntime, a call's cost in proportion to
the audio.

Moonshine's encoder reads the raw 16 kHz waveform, as long as it is: no 30 s window, no mel
features, no padding. The weights (27 M parameters, MIT) ship in ``moonshine-voice`` 0.1.0
(``moonshine_voice/assets/tiny-en``, ORT format); only those files are read, the package is
never imported. Greedy decoding with the decoder's key-value cache; the decoder can continue
after words already decided (``prefix``), as ``models.asr.WhisperAsr`` does.

Moonshine has no no-speech estimate, and hears words in a cough, a click or silence ("You",
"Oh, my God") as confidently as in speech. ``MoonshineWithWhisper`` therefore hands short
clips, where such sounds live, and the primed hearing of interjections to Whisper.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt

from models.asr import (
    MIN_LOG_P,
    RIVALS,
    AsrError,
    Heard,
    Pcm16k,
    Rivals,
    WhisperAsr,
    heard_text,
    last_word_at,
    likeliest,
    mean_log_p,
    undecided_end,
)

log = logging.getLogger(__name__)

PACKAGE = "moonshine_voice"  # moonshine-voice 0.1.0; later versions ship no weights
MODEL_FILES = {  # the files of assets/tiny-en and their sha256
    "encoder_model.ort": "94e90a4654fc45cdfedb77c4c08e1739f48862998e58fada384b25118134f221",
    "decoder_model_merged.ort": "cf524c4862d36e9e5ab032eddc73637efd822d70e868ac575cf1a46e1e4708a0",
    "tokenizer.bin": "6884b35fd6377d4c4d32336a0bc152f36b64d1e45b6503683cdc238250a8472d",
}
RATE_HZ = 16_000
MIN_SAMPLES = 1_600  # 0.1 s: the encoder's convolutions need about 56 ms; shorter is padded
MAX_SAMPLES = 64 * RATE_HZ  # the longest input Moonshine was made for
START, END = 1, 2  # <s>, </s>
SPACE = "\u2581".encode()  # SentencePiece's word mark
TOKENS_PER_S = 6.5  # generation stops at this many tokens a second of audio (+ MIN_TOKENS)
MIN_TOKENS = 4
LAYERS, HEADS, HEAD_DIM = 6, 8, 36
SHORT_S = 1.0  # MoonshineWithWhisper: clips up to this long go to Whisper
# the longest clip to give it: its decoder fails on ~9.5 s of continuous speech and longer
# (onnxruntime: "Attempting to broadcast an axis by a dimension other than 1. 2 by 415"; 9 s
# passed), so longer utterances are heard in pieces (models.long_speech)
LONGEST_S = 8.0


def _plain_words(text: str) -> list[str]:
    return "".join(c.lower() if c.isalnum() or c == "'" else " " for c in text).split()


def _samples(pcm: Pcm16k) -> npt.NDArray[np.float32]:
    """``pcm`` as the encoder reads it: float in [-1, 1), at least MIN_SAMPLES (padded)."""
    audio = np.zeros(max(MIN_SAMPLES, min(pcm.size, MAX_SAMPLES)), np.float32)
    audio[: min(pcm.size, audio.size)] = pcm[: audio.size].astype(np.float32) / 32768.0
    return audio


def moonshine_model_dir() -> Path:
    """The tiny-en folder inside the installed ``moonshine-voice`` package (not imported)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise AsrError("moonshine-voice is not installed: it ships Moonshine tiny (English)")
    path = Path(next(iter(spec.submodule_search_locations))) / "assets" / "tiny-en"
    missing = [name for name in MODEL_FILES if not (path / name).is_file()]
    if missing:
        raise AsrError(f"Moonshine files missing in {path}: {', '.join(missing)} (need 0.1.0)")
    return path


def verify(path: Path) -> None:
    """Check every model file's sha256; AsrError names the first that differs."""
    for name, want in MODEL_FILES.items():
        digest = hashlib.sha256((path / name).read_bytes()).hexdigest()
        if digest != want:
            raise AsrError(f"{path / name}: sha256 {digest}, expected {want}")


class Tokens:
    """Moonshine's vocabulary from ``tokenizer.bin``: each token's bytes after its length (one
    byte, or two as a 7-bit varint). Text in SentencePiece's form: U+2581 begins a word."""

    def __init__(self, path: Path) -> None:
        data, at, pieces = path.read_bytes(), 0, []
        while at < len(data):
            size = data[at]
            at += 1
            if size >= 0x80:
                size = (size & 0x7F) | (data[at] << 7)
                at += 1
            pieces.append(data[at : at + size])
            at += size
        self.pieces = pieces
        self.ids = {piece: i for i, piece in reversed(list(enumerate(pieces)))}
        self.longest = max(len(p) for p in pieces)

    def special(self, token: int) -> bool:
        return token <= END or self.pieces[token].startswith(b"<<ST_")

    def decode(self, tokens: list[int]) -> str:
        raw = b"".join(self.pieces[t] for t in tokens if not self.special(t))
        return raw.replace(SPACE, b" ").decode("utf-8", "replace").strip()

    def encode(self, text: str) -> list[int]:
        """Tokens of ``text`` (words after a word mark), the longest known piece first; bytes
        no piece holds are byte tokens."""
        raw = b"".join(SPACE + word.encode() for word in text.split())
        out, at = [], 0
        while at < len(raw):
            for size in range(min(self.longest, len(raw) - at), 0, -1):
                token = self.ids.get(raw[at : at + size])
                if token is not None and not self.special(token):
                    out.append(token)
                    at += size
                    break
            else:  # unreachable while every byte has a token; kept total
                raise AsrError(f"no token for byte {raw[at]} of {text!r}")
        return out


class MoonshineAsr:
    """Moonshine tiny (English) on CPU, greedy decoding, one call at a time.

    ``transcribe`` is synchronous and CPU heavy; run it in a worker thread. Calls from several
    threads are serialised by a lock.
    """

    def __init__(self, model_dir: Path | None = None, cpu_threads: int = 1) -> None:
        if cpu_threads < 1:
            raise ValueError(f"cpu_threads must be >= 1, got {cpu_threads}")
        import onnxruntime

        path = model_dir or moonshine_model_dir()
        started = time.perf_counter()
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = cpu_threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # shared cores
        options.log_severity_level = 3
        try:
            make = onnxruntime.InferenceSession
            cpu = ["CPUExecutionProvider"]
            self._encoder = make(str(path / "encoder_model.ort"), options, providers=cpu)
            self._decoder = make(str(path / "decoder_model_merged.ort"), options, providers=cpu)
            self.tokens = Tokens(path / "tokenizer.bin")
        except (RuntimeError, ValueError, OSError, IndexError) as exc:
            raise AsrError(f"cannot load Moonshine from {path}: {exc}") from exc
        self._outputs = [o.name for o in self._decoder.get_outputs()]
        self._lock = threading.Lock()
        self._encoded: tuple[bytes, npt.NDArray[np.float32]] | None = None
        log.info(
            "loaded Moonshine tiny from %s (cpu, %d threads) in %.0f ms",
            path,
            cpu_threads,
            (time.perf_counter() - started) * 1000,
        )

    def transcribe(self, pcm: Pcm16k, prefix: str = "", context: str = "") -> str:
        """Text of a 16 kHz mono int16 utterance, stripped; "" when no word was heard.

        ``prefix``: words already decided for the start of this audio; the decoder continues
        after them (their last mark left open), and the text returned starts with them.
        ``context`` (text said before the audio) is not read: Moonshine has no such prompt.
        """
        return self._transcribe(pcm, prefix, rivals=False).text

    def hear(self, pcm: Pcm16k, prefix: str = "", context: str = "") -> Heard:
        """Like ``transcribe``, with the words Moonshine weighed in place of the last one."""
        return self._transcribe(pcm, prefix, rivals=True)

    def score(self, pcm: Pcm16k, text: str) -> float:
        """How likely Moonshine finds ``text`` for this audio: the mean log probability of its
        tokens and the end of text after them, read in one decoder pass (the audio's encoding
        is kept from a call on the same audio just before)."""
        tokens = self.tokens.encode(text.strip())
        if pcm.size == 0 or not tokens:
            return MIN_LOG_P
        with self._lock:
            try:
                hidden = self._encode(_samples(pcm))
                rows = self._decoder.run(None, self._first_feed(hidden, [START, *tokens]))[0][0]
            except Exception as exc:  # onnxruntime's Fail is no RuntimeError
                raise AsrError(f"Moonshine failed on {pcm.size} samples: {exc}") from exc
        return mean_log_p(rows, [*tokens, END])

    def _encode(self, audio: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """The encoder's states for ``audio``; the last audio's are kept (a score follows a
        decode of the same audio)."""
        key = hashlib.blake2b(audio.tobytes(), digest_size=16).digest()
        if self._encoded is not None and self._encoded[0] == key:
            return self._encoded[1]
        whole = np.ones((1, audio.size), np.int64)
        (out,) = self._encoder.run(None, {"input_values": audio[None], "attention_mask": whole})
        hidden: npt.NDArray[np.float32] = out
        self._encoded = (key, hidden)
        return hidden

    def _first_feed(self, hidden: npt.NDArray[np.float32], ids: list[int]) -> dict[str, object]:
        """The decoder's input for its first step over ``ids`` (nothing cached yet)."""
        empty = np.zeros((1, HEADS, 0, HEAD_DIM), np.float32)
        return {
            "input_ids": np.array([ids], np.int64),
            "encoder_hidden_states": hidden,
            "encoder_attention_mask": np.ones(hidden.shape[:2], np.int64),
            "use_cache_branch": np.array([False]),
            **{
                f"past_key_values.{layer}.{side}.{kind}": empty
                for layer in range(LAYERS)
                for side in ("decoder", "encoder")
                for kind in ("key", "value")
            },
        }

    def _transcribe(self, pcm: Pcm16k, prefix: str, rivals: bool) -> Heard:
        if pcm.ndim != 1:
            raise ValueError(f"expected mono audio (one dimension), got shape {pcm.shape}")
        if pcm.size == 0:
            return Heard("", ())
        audio = _samples(pcm)
        clip = pcm[: audio.size]
        forced = self.tokens.encode(undecided_end(prefix)) if prefix.strip() else []
        limit = len(forced) + MIN_TOKENS + math.ceil(TOKENS_PER_S * clip.size / RATE_HZ)
        with self._lock:
            try:
                steps = self._decode(audio, forced, limit)
            except Exception as exc:  # onnxruntime's Fail is no RuntimeError
                raise AsrError(f"Moonshine failed on {pcm.size} samples: {exc}") from exc
        text = heard_text(self.tokens.decode, [token for token, _ in steps], len(forced))
        if not text:
            return Heard("", ())
        if not rivals:
            return Heard(text, ())
        words = self._words(steps)
        at = last_word_at([word for word, _ in words], text)
        first = None if at is None else words[at][1]
        return Heard(text, () if first is None else self._rivals(*first))

    def _decode(
        self, audio: npt.NDArray[np.float32], forced: list[int], limit: int
    ) -> list[tuple[int, npt.NDArray[np.float32]]]:
        """Greedy decoding after ``forced`` tokens, at most ``limit`` tokens: each token with
        the logits it was chosen from (the forced ones' too)."""
        hidden = self._encode(audio)
        ids = [START, *forced]
        feed = self._first_feed(hidden, ids)
        steps: list[tuple[int, npt.NDArray[np.float32]]] = []
        while len(steps) < limit:
            cached = bool(steps)  # the first step reads the prompt and the forced tokens whole
            if cached:
                feed["input_ids"] = np.array([ids[-1:]], np.int64)
                feed["use_cache_branch"] = np.array([True])
            logits, *present = self._decoder.run(None, feed)
            for name, value in zip(self._outputs[1:], present, strict=True):
                if not cached or ".decoder." in name:  # the encoder's keys are made once
                    feed[name.replace("present", "past_key_values")] = value
            rows = logits[0]
            if not cached:
                steps = [(t, rows[i]) for i, t in enumerate(forced)]
            token = int(rows[-1].argmax())
            if token == END:
                break
            steps.append((token, rows[-1]))
            ids.append(token)
        return steps

    def _words(
        self, steps: list[tuple[int, npt.NDArray[np.float32]]]
    ) -> list[tuple[str, tuple[int, npt.NDArray[np.float32]] | None]]:
        """The decoded words, each with the token that began it and its logits (None for a
        word that begins with punctuation only)."""
        words: list[tuple[str, tuple[int, npt.NDArray[np.float32]] | None]] = []
        for token, logits in steps:
            piece = self.tokens.pieces[token]
            if self.tokens.special(token):
                continue
            text = piece.replace(SPACE, b" ").decode("utf-8", "replace")
            if piece.startswith(SPACE) or not words:
                words.append(("", (token, logits) if any(c.isalnum() for c in text) else None))
            word, first = words[-1]
            words[-1] = (word + text.strip(), first)
        return words

    def _rivals(self, token: int, logits: npt.NDArray[np.float32]) -> Rivals:
        """The likeliest tokens but ``token`` at its step (RIVALS, special ones left out), as
        text with the softmax share of the step's logits."""
        best = likeliest(logits, RIVALS * 2 + 1)
        rivals = [(t, p) for t, p in best if t != token and not self.tokens.special(t)]
        out = [(self.tokens.decode([t]).lower(), p) for t, p in rivals]
        return tuple((text, share) for text, share in out if text)[:RIVALS]


class MoonshineWithWhisper:
    """Moonshine for the words of every clip longer than ``short_s``; Whisper for shorter ones
    (a cough, a click, "mm-hm": Whisper can tell no speech, Moonshine hears "You") and for the
    primed hearing of interjections (``transcribe_after``). Where one fails on a clip
    (``AsrError``) the other hears it: the failure is logged and ``on_fallback`` told the name
    of the one that failed. One lock: one call at a time, so the recognisers share the
    threads the CPU plan gave speech recognition.

    ``cross_check``: a final transcript (``transcribe``) is heard by both, and where their
    words differ each model scores both texts (``score``: the mean log probability of the
    text's tokens for this audio); the text the two find likelier together wins. Each
    mishears what the other often gets right (espeak-ng's voice: Moonshine alone 17 %, Whisper
    16 %, the pair 8 % word errors; BENCHMARKS.md), at about twice one's cost. Partial
    transcripts (``hear``) stay Moonshine's alone."""

    def __init__(
        self,
        words: MoonshineAsr,
        whisper: WhisperAsr,
        short_s: float = SHORT_S,
        cross_check: bool = True,
    ) -> None:
        self.words, self.whisper = words, whisper
        self.short = int(short_s * RATE_HZ)
        self.cross_check = cross_check
        self._lock = threading.Lock()
        self.on_fallback: Callable[[str], None] | None = None  # called in the calling thread

    def _pick(self, pcm: Pcm16k) -> tuple[MoonshineAsr | WhisperAsr, MoonshineAsr | WhisperAsr]:
        """The recogniser for ``pcm``, and the other."""
        if pcm.size <= self.short:
            return self.whisper, self.words
        return self.words, self.whisper

    def _either(self, pcm: Pcm16k, call: Callable[[MoonshineAsr | WhisperAsr], Heard]) -> Heard:
        first, other = self._pick(pcm)
        with self._lock:
            try:
                return call(first)
            except AsrError as exc:
                self._failed(first, pcm, exc)
                return call(other)

    def _failed(self, asr: MoonshineAsr | WhisperAsr, pcm: Pcm16k, exc: AsrError) -> None:
        name = "moonshine" if asr is self.words else "whisper"
        log.warning("%s failed on %.1f s of audio: %s", name, pcm.size / RATE_HZ, exc)
        if self.on_fallback is not None:
            self.on_fallback(name)

    def set_fallback_observer(self, observe: Callable[[str], None]) -> None:
        self.on_fallback = observe

    def transcribe(self, pcm: Pcm16k, prefix: str = "", context: str = "") -> str:
        if not self.cross_check or pcm.size <= self.short:
            heard = self._either(pcm, lambda asr: Heard(asr.transcribe(pcm, prefix, context), ()))
            return heard.text
        with self._lock:
            texts: dict[MoonshineAsr | WhisperAsr, str] = {}
            for asr in (self.words, self.whisper):
                try:
                    # Whisper hears it whole: the prefix (the words two of Moonshine's partials
                    # agreed on) may hold the very word Moonshine mishears
                    first = prefix if asr is self.words else ""
                    texts[asr] = asr.transcribe(pcm, first, context)
                except AsrError as exc:
                    self._failed(asr, pcm, exc)
            if not texts:
                raise AsrError(f"both recognisers failed on {pcm.size} samples")
            if len(texts) == 1:
                return next(iter(texts.values()))
            return self._likelier(pcm, texts[self.words], texts[self.whisper])

    def _likelier(self, pcm: Pcm16k, heard: str, other: str) -> str:
        """Of Moonshine's text ``heard`` and Whisper's ``other``, the one both models find
        likelier for ``pcm`` (summed mean log probabilities); Moonshine's where they agree
        word for word, or where Whisper heard no speech."""
        if _plain_words(heard) == _plain_words(other) or not other or not heard:
            return heard or other
        try:
            ours = self.words.score(pcm, heard) + self.whisper.score(pcm, heard)
            theirs = self.words.score(pcm, other) + self.whisper.score(pcm, other)
        except AsrError as exc:
            log.warning("scoring two transcripts failed: %s", exc)
            return heard
        log.debug("transcripts differ (%.2f against %.2f): %r, %r", ours, theirs, heard, other)
        return heard if ours >= theirs else other

    def hear(self, pcm: Pcm16k, prefix: str = "", context: str = "") -> Heard:
        return self._either(pcm, lambda asr: asr.hear(pcm, prefix, context))

    def transcribe_after(self, pcm: Pcm16k, context: str) -> str:
        with self._lock:
            return self.whisper.transcribe_after(pcm, context)
