"""A reply's text in chunks for speech: the first cut short so that speech starts early, the
later ones whole sentences unless the playback would run dry first, judged by how long speech
takes to make here (:class:`SpeechTime`)."""

from __future__ import annotations

from collections.abc import Callable

# a later chunk goes to speech before its sentence ends when the audio queued ahead of the
# playback cursor (ms) is less than this margin plus the time its words take to be spoken
# (waiting for the speech engine and synthesis, as measured lately: SpeechTime)
STARVING_MARGIN_MS = 250.0
STARVING_MIN_WORDS = 3  # complete words such a cut needs (fewer: wait for more)
SPEECH_TIME_WEIGHT = 0.25  # of the latest chunk in the running estimate
Splitter = Callable[[str], tuple[list[str], str]]


class SpeechTime:
    """How long a chunk takes from its text to its audio, as the replies met it lately: ms
    per character, waiting for the shared speech engine and synthesis together (a running
    average, each chunk weighing ``SPEECH_TIME_WEIGHT``). Two sessions speaking at once on
    two cores take about twice as long as one: a fixed threshold fits only one of them."""

    def __init__(self, ms_per_char: float) -> None:
        self.ms_per_char = ms_per_char

    def observe(self, chars: int, elapsed_ms: float) -> None:
        """A chunk of ``chars`` characters became audio ``elapsed_ms`` after it was asked."""
        if chars <= 0 or elapsed_ms < 0:
            return
        latest = elapsed_ms / chars
        self.ms_per_char += SPEECH_TIME_WEIGHT * (latest - self.ms_per_char)

    def expected_ms(self, chars: int) -> float:
        """The time (ms) ``chars`` characters are expected to take to become audio."""
        return self.ms_per_char * max(chars, 0)

    def runs_dry(self, slack_ms: float, text: str) -> bool:
        """Whether ``slack_ms`` of audio queued ahead of the playback cursor runs out before
        ``text`` becomes audio (``STARVING_MARGIN_MS`` to spare)."""
        return slack_ms < STARVING_MARGIN_MS + self.expected_ms(len(text))


class FirstChunkCutter:
    """Chunks streamed text: sentences from ``splitter``; the reply's first chunk is cut early,
    after ``first_words`` words, so that speech can start before the first sentence ends.

    Later chunks are whole sentences, unless the playback would run dry first: when
    ``starving(words)`` says so for the complete words written so far (the audio queued ahead
    of the playback cursor will not last until the sentence is written and spoken), those
    words, at least ``STARVING_MIN_WORDS`` of them, go to speech at once, the rest of the
    sentence after them.
    """

    def __init__(
        self, splitter: Splitter, first_words: int, starving: Callable[[str], bool] | None = None
    ) -> None:
        self._split = splitter
        self._first_words = first_words
        self._starving = starving
        self._buffer = ""
        self._first = True
        self.starved_cuts = 0  # chunks cut before their sentence ended, to keep speech going

    def feed(self, delta: str) -> list[str]:
        self._buffer += delta
        chunks, self._buffer = self._split(self._buffer)
        if not chunks:
            # a word is complete once a space follows it
            words = self._buffer.lstrip().split(" ")
            if self._first:
                if len(words) > self._first_words:
                    chunks = self._take(words, self._first_words)
            elif (
                len(words) > STARVING_MIN_WORDS
                and self._starving
                and self._starving(" ".join(words[:-1]))
            ):
                chunks = self._take(words, len(words) - 1)
                self.starved_cuts += 1
        chunks = [c.strip() for c in chunks if c.strip()]
        if chunks:
            self._first = False
        return chunks

    def _take(self, words: list[str], n: int) -> list[str]:
        """The first ``n`` words as a chunk; the buffer keeps the rest."""
        self._buffer = " ".join(words[n:])
        return [" ".join(words[:n])]

    def flush(self) -> list[str]:
        tail, self._buffer = self._buffer.strip(), ""
        return [tail] if tail else []

    def end_with(self, text: str, fed: int) -> None:
        """The reply is ``text`` (``fed`` characters of the text were fed so far): the text not
        yet cut becomes the rest of ``text``; what was cut already is said already."""
        start = fed - len(self._buffer)  # where the buffer begins in the text
        self._buffer = text[start:]
