"""Text to the espeak-style phoneme symbols a Piper voice was trained on, without espeak.

gruut (MIT, with its CMUdict-based English lexicon and g2p model in ``gruut-lang-en``) splits
the text into sentences, verbalises numbers, currency, dates and abbreviations ("$3.14" ->
"three dollars fourteen cents") and gives each word its IPA phonemes. Its IPA is close to
espeak-ng's but not the same, so a few rules bring it to espeak's en-us conventions: long
vowels (iː uː ɑː ɔː ɜː), stressed r-coloured vowels as ɜː, flapped t (ɾ), no primary stress
on function words, affricates and diphthongs as separate symbols. Pauses are the text's
punctuation, as piper writes them (", " between phrases, ". ? !" at a sentence's end).
"""

# ruff: noqa: RUF001, RUF002, RUF003  (IPA symbols look like Latin letters on purpose)
from __future__ import annotations

import logging
import re
import sqlite3
import unicodedata
from collections.abc import Collection, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gruut.const import Word
    from gruut.text_processor import TextProcessor

log = logging.getLogger(__name__)

SPACE = " "
STRESS = frozenset("ˈˌ")  # IPA stress marks
LONG = "ː"  # IPA length mark
_TIE = "\u0361"  # the tie bar of gruut's affricates: d͡ʒ -> d ʒ
_VOWELS = frozenset("aeiouæɐɑɒɔəɚɛɜɝɪʊʌᵻɨ")
_SENTENCE_END = ".?!"
_PHRASE_END = ",;:"
_MAX_WORDS_PER_TOKEN = 32  # "$1,234,567.89" is 17 spoken words
# Unstressed in running speech, as espeak speaks them ("how are you" -> hˌaʊ ɑːɹ juː)
FUNCTION_WORDS = frozenset(
    {
        *("a", "an", "the", "and", "or", "nor", "of", "to", "in", "on", "at", "for"),
        *("from", "with", "by", "as", "than", "if", "is", "are", "was", "were", "be", "am"),
        *("been", "i", "you", "he", "she", "it", "we", "they", "him", "her", "us"),
        *("them", "my", "your", "his", "its", "our", "their", "this", "these", "those"),
        *("can", "could", "will", "would", "shall", "should", "may", "might", "must"),
        *("has", "have", "had", "into", "onto", "upon", "through"),
    }
)
# Secondary stress only ("when will you" -> wˌɛn wɪl juː)
SECONDARY_WORDS = frozenset(
    {"when", "where", "why", "how", "which", "while", "what", "who", "not", "about", "but", "me"}
)
# more abbreviations for gruut (beside its "Mr.", "Dr.", "St.", "%"...)
_ABBREVIATIONS: dict[str | re.Pattern[Any], str] = {
    re.compile(r"^[eE]\.[gG]\.?"): "for example",
    re.compile(r"^[iI]\.[eE]\.?"): "that is",
    re.compile(r"^([eE])tc\.?"): r"\1t cetera",
}
# gruut symbols outside espeak's inventory: the nearest espeak symbols
_FALLBACK = {"g": "ɡ", "r": "ɹ", "ɝ": "ɜː", "ɫ": "l", "ʧ": "tʃ", "ʤ": "dʒ"}


@dataclass(frozen=True)
class Sentence:
    """One sentence for one run of the voice: its symbols (each in the voice's id map) and
    for each symbol the index of the spoken word it belongs to (-1: a pause)."""

    symbols: tuple[str, ...]
    owners: tuple[int, ...]


@dataclass(frozen=True)
class Phonemized:
    """A text's sentences; its spoken words as gruut verbalised them ("Mister", "three"); its
    written words (``written_words``) and for each the range [first, last) of its spoken
    words ("$3.14" -> "three dollars fourteen cents")."""

    sentences: tuple[Sentence, ...]
    words: tuple[str, ...]
    written: tuple[str, ...]
    ranges: tuple[tuple[int, int], ...]


class Phonemizer:
    """gruut for US English, mapped to ``symbols`` (the voice's id map). gruut opens its
    lexicon (SQLite) in the thread that first uses it, so it runs on a thread of its own."""

    def __init__(self, symbols: Collection[str]) -> None:
        self._symbols = frozenset(symbols)
        self._dropped: set[str] = set()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gruut")
        self._processor = self._worker.submit(_text_processor).result()
        self.phonemize("Hello, world.")  # loads the lexicon, the g2p and the POS tagger

    def phonemize(self, text: str) -> Phonemized:
        """The text's sentences as symbols; raises what gruut raises (RuntimeError once
        closed)."""
        return self._worker.submit(self._phonemize, text).result()

    def close(self) -> None:
        """Ends gruut's thread once what it is doing is done."""
        self._worker.shutdown(wait=True)

    def _phonemize(self, text: str) -> Phonemized:
        graph, root = self._processor(verbalise(plain(text)), lang="en_US")
        words: list[str] = []
        sentences = []
        for sentence in self._processor.sentences(graph, root, punctuations=False):
            built = self._sentence(sentence, words)
            if any(owner >= 0 for owner in built.owners):
                sentences.append(built)
        written = written_words(text)
        alone = [self._said_alone(w) if _is_verbalised(w) else None for w in written]
        ranges = assign_words(written, words, alone)
        return Phonemized(tuple(sentences), tuple(words), tuple(written), tuple(ranges))

    def _said_alone(self, token: str) -> str:
        """The letters of the words gruut makes of ``token`` on its own ("25°C" ->
        "twentyfivedegreescelsius"): where that token's words are in a sentence."""
        graph, root = self._processor(verbalise(plain(token)), lang="en_US")
        said = self._processor.words(graph, root, punctuations=False)
        return "".join(_key(w.text) for w in said if w.is_spoken and w.phonemes)

    def _sentence(self, gruut_words: Iterable[Word], words: list[str]) -> Sentence:
        """Symbols of one sentence; appends its spoken words to ``words``."""
        symbols: list[str] = []
        owners: list[int] = []
        after_word = False  # a space goes between two words, owned by the first
        for word in gruut_words:
            if word.is_break:
                mark = _pause(word.text, bool(word.is_major_break))
                symbols.append(mark)
                owners.append(-1)
                if mark in _PHRASE_END:
                    symbols.append(SPACE)
                    owners.append(-1)
                after_word = False
                continue
            sounds = self._known(espeak_symbols(word.phonemes or (), _primary(word.text)))
            if not word.is_spoken or not any(s not in STRESS for s in sounds):
                continue
            if after_word:
                if symbols[-1] == "ɚ" and _first_sound(sounds) in _VOWELS:
                    symbols.append("ɹ")  # linking r: "answer is" -> ˈænsɚɹ ɪz
                    owners.append(len(words) - 1)
                symbols.append(SPACE)
                owners.append(len(words) - 1)
            symbols += sounds
            owners += [len(words)] * len(sounds)
            words.append(word.text)
            after_word = True
        return Sentence(tuple(symbols), tuple(owners))

    def _known(self, symbols: Iterable[str]) -> list[str]:
        """``symbols`` in the voice's id map: others mapped to near ones or dropped (logged once
        each)."""
        out: list[str] = []
        for symbol in symbols:
            if symbol in self._symbols:
                out.append(symbol)
            elif all(s in self._symbols for s in _FALLBACK.get(symbol, "\0")):
                out += list(_FALLBACK[symbol])
            elif symbol not in self._dropped:
                self._dropped.add(symbol)
                log.warning("phoneme %r is not in the voice's map: dropped", symbol)
        return out


def _text_processor() -> TextProcessor:
    """gruut's English text processor, with a few more abbreviations and acronyms that are
    in its lexicon read as words ("NASA"; gruut spells every word in capitals out)."""
    from gruut.lang import en_is_initialism
    from gruut.text_processor import TextProcessor

    processor = TextProcessor(default_lang="en_US")
    settings = processor.get_settings("en_US")
    settings.abbreviations.update(_ABBREVIATIONS)
    lookup = settings.lookup_phonemes
    _index_lexicon(lookup)

    def is_initialism(text: str) -> bool:
        letters = sum(ch.isalpha() for ch in text)
        is_word = letters > 3 and lookup is not None and lookup(text.strip()) is not None
        return bool(en_is_initialism(text)) and not is_word

    settings.is_initialism = is_initialism
    return processor


def _index_lexicon(lookup: object) -> None:
    """Give gruut's lexicon an index: its SQLite table has none on ``word``, so each new
    word was a scan of the whole table (about 6 ms; 100 ms a sentence). The table is copied
    into memory (about 15 MB) and indexed there; the installed file is not changed."""
    from gruut.lang import DelayedSqlitePhonemizer
    from gruut.phonemize import SqlitePhonemizer

    if not isinstance(lookup, DelayedSqlitePhonemizer):
        log.warning("gruut's lexicon is not the expected SQLite one: words are looked up slowly")
        return
    memory = sqlite3.connect(":memory:")
    disk = sqlite3.connect(f"{lookup.db_path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        disk.backup(memory)
    finally:
        disk.close()
    memory.execute("CREATE INDEX IF NOT EXISTS word_phonemes_word ON word_phonemes (word)")
    lookup.phonemizer = SqlitePhonemizer(db_conn=memory, **lookup.phonemizer_args)


def plain(text: str) -> str:
    """``text`` without accents ("café" -> "cafe"; gruut's English guesser drops accented
    letters) and with straight apostrophes."""
    decomposed = unicodedata.normalize("NFKD", text.replace("\u2019", "'"))
    return unicodedata.normalize("NFC", "".join(ch for ch in decomposed if not _is_mark(ch)))


def _is_mark(ch: str) -> bool:
    return unicodedata.category(ch) == "Mn"


_DECADES = (
    *("tens", "twenties", "thirties", "forties", "fifties", "sixties", "seventies", "eighties"),
    "nineties",
)
_UNITS = {
    **{"°C": "degrees Celsius", "°F": "degrees Fahrenheit", "°": "degrees", "km": "kilometers"},
    **{"km/h": "kilometers per hour", "mph": "miles per hour", "kg": "kilograms", "g": "grams"},
    **{"cm": "centimeters", "mm": "millimeters", "ml": "milliliters", "lb": "pounds"},
    **{"lbs": "pounds", "ft": "feet", "GB": "gigabytes", "MB": "megabytes", "TB": "terabytes"},
}
_FRACTIONS = {"1/2": "one half", "1/3": "one third", "2/3": "two thirds", "1/4": "one quarter"}
_FRACTIONS |= {"3/4": "three quarters", "24/7": "twenty four seven"}
_UNIT = re.compile(
    r"(?<=\d) ?(" + "|".join(re.escape(u) for u in sorted(_UNITS, key=len, reverse=True)) + ")"
    r"(?![A-Za-z])"
)
_DECADE = re.compile(r"\b(\d{1,2})?([1-9])0'?s\b")
_CENTURY = re.compile(r"\b(\d{1,2})00'?s\b")
_FRACTION = re.compile(r"(?<![\d/])(\d+)[/\u2044](\d+)(?![\d/])")


def verbalise(text: str) -> str:
    """What gruut reads wrongly or not at all, in words: units after a number ("25°C" ->
    "25 degrees Celsius"), decades ("1990s" -> "19 nineties"), fractions ("3/4")."""
    text = _UNIT.sub(lambda m: " " + _UNITS[m.group(1)], text)
    text = _CENTURY.sub(lambda m: "two thousands" if m[1] == "20" else f"{m[1]} hundreds", text)
    text = _DECADE.sub(lambda m: f"{m[1] or ''} {_DECADES[int(m[2]) - 1]}".strip(), text)
    return _FRACTION.sub(lambda m: _FRACTIONS.get(f"{m[1]}/{m[2]}", f"{m[1]} over {m[2]}"), text)


def _primary(text: str) -> str:
    """What a word's primary stress mark becomes: none for function words, secondary for a
    few more ("how", "not"), else itself."""
    word = text.casefold()
    return "" if word in FUNCTION_WORDS else "ˌ" if word in SECONDARY_WORDS else "ˈ"


def _first_sound(symbols: Sequence[str]) -> str:
    return next((s for s in symbols if s not in STRESS), "")


def _pause(text: str, major: bool) -> str:
    """The punctuation symbol of a break: the text's own mark, else "." or ","."""
    marks = _SENTENCE_END if major else _PHRASE_END
    return next((ch for ch in text if ch in marks), marks[0])


def espeak_symbols(phonemes: Sequence[str], primary: str = "ˈ") -> list[str]:
    """A word's gruut phonemes (IPA, stress on the vowel: ["h", "ɛ", "l", "ˈoʊ"]) as espeak
    en-us symbols, one character each (["h", "ɛ", "l", "ˈ", "o", "ʊ"]); its primary stress
    mark becomes ``primary`` ("" for a function word)."""
    units = [_split_stress(p) for p in phonemes]
    if not primary and [base for _, base in units] == ["ə"]:
        return ["ɐ"]  # the article "a"
    units = _restress(units, primary)
    syllables = sum(base[:1] in _VOWELS for _, base in units)
    out: list[str] = []
    for i, (stress, base) in enumerate(units):
        following = units[i + 1][1] if i + 1 < len(units) else ""
        if base[:1] in _VOWELS:
            final = syllables > 1 and i == len(units) - 1
            base = _vowel(base, bool(stress), final, following)
        elif base == "t" and _flaps(units, i):
            base = "ɾ"
        out += list(stress) + list(base)
    return out


def _restress(units: Sequence[tuple[str, str]], primary: str) -> list[tuple[str, str]]:
    """Primary stress as ``primary``; a secondary stress after the primary one dropped, as
    espeak says compounds ("sunlight" sˈʌnlaɪt)."""
    out: list[tuple[str, str]] = []
    seen_primary = False
    for stress, base in units:
        if stress == "ˌ" and seen_primary:
            stress = ""
        elif stress == "ˈ":
            seen_primary, stress = True, primary
        out.append((stress, base))
    return out


def _split_stress(phoneme: str) -> tuple[str, str]:
    """(stress marks, the sound) of one gruut phoneme, decomposed, without tie bars."""
    text = unicodedata.normalize("NFD", phoneme).replace(_TIE, "")
    stress = "".join(ch for ch in text if ch in STRESS)
    return stress, "".join(ch for ch in text if ch not in STRESS)


def _vowel(base: str, stressed: bool, final: bool, following: str) -> str:
    """espeak's length and quality for a vowel: short i at the end of "happy" and before a
    vowel ("really"), short ɔ before n ŋ f s ("on", "long", "cost"); stressed ɚ is ɜː ("bird"
    bˈɜːd), an unstressed one links to a vowel with ɹ ("mystery" mˈɪstɚɹi)."""
    if base in ("ɚ", "ɝ"):
        return "ɜː" if stressed else "ɚɹ" if following[:1] in _VOWELS else "ɚ"
    if base == "i":
        return "i" if (final and not stressed) or following[:1] in _VOWELS else "iː"
    if base in ("u", "ɑ"):
        return base + LONG
    if base == "ɔ" and following[:1] not in ("n", "ŋ", "f", "s"):
        return "ɔː"
    return base


def _flaps(units: Sequence[tuple[str, str]], i: int) -> bool:
    """Whether the t at ``i`` is a US flap: after a vowel or ɹ, before an unstressed vowel
    ("water", "city", "little"), but not in "-ton" ("button" keeps its t)."""
    if i == 0 or i + 1 >= len(units):
        return False
    before, (stress, after) = units[i - 1][1], units[i + 1]
    if not (before[-1:] in _VOWELS or before == "ɹ") or stress or after[:1] not in _VOWELS:
        return False
    return not (after == "ə" and i + 2 == len(units) - 1 and units[i + 2][1] == "n")


def written_words(text: str) -> list[str]:
    """The text's words as written: whitespace-separated, with a letter or digit."""
    return [token for token in text.split() if any(ch.isalnum() for ch in token)]


def _is_verbalised(token: str) -> bool:
    """Whether gruut may say ``token`` in other words: digits, symbols ("$", "%", "°")."""
    return any(not (ch.isalpha() or ch in "'.,;:!?\"()-") for ch in plain(token))


def _key(text: str) -> str:
    return "".join(ch for ch in plain(text).casefold() if ch.isalnum())


def assign_words(
    tokens: Sequence[str], spoken: Sequence[str], alone: Sequence[str | None] | None = None
) -> list[tuple[int, int]]:
    """For each written token ("$3.14", "apples,"), the range [first, last) of the spoken
    words it became ("three dollars fourteen cents", "apples"). Dynamic programming: a
    token costs 0 when its letters and digits are those of its words ("U.S.A." -> "U S A"),
    0.5 when they are those of ``alone`` (the token's words said on their own, "2 3" ->
    "two", "three"), 1 for other words, 2 when nothing was spoken for it; every spoken word
    belongs to exactly one token."""
    n, m = len(tokens), len(spoken)
    alone = alone or [None] * n
    keys = [_key(w) for w in spoken]
    inf = float("inf")
    cost = [[inf] * (m + 1) for _ in range(n + 1)]
    step = [[0] * (m + 1) for _ in range(n + 1)]
    cost[0][0] = 0.0
    for i, token in enumerate(tokens):
        key = _key(token)
        for j in range(m + 1):
            if cost[i][j] == inf:
                continue
            joined = ""
            for size in range(min(_MAX_WORDS_PER_TOKEN, m - j) + 1):
                if size:
                    joined += keys[j + size - 1]
                price = _price(size, joined, key, alone[i])
                if cost[i][j] + price < cost[i + 1][j + size]:
                    cost[i + 1][j + size] = cost[i][j] + price
                    step[i + 1][j + size] = size
    if cost[n][m] == inf:  # more spoken words than tokens can take: the last takes the rest
        return _assign_evenly(n, m)
    ranges: list[tuple[int, int]] = []
    j = m
    for i in range(n, 0, -1):
        ranges.append((j - step[i][j], j))
        j -= step[i][j]
    return ranges[::-1]


def _price(size: int, joined: str, key: str, alone: str | None) -> float:
    if size == 0:
        return 2.0
    return 0.0 if key and joined == key else 0.5 if alone and joined == alone else 1.0


def _assign_evenly(n: int, m: int) -> list[tuple[int, int]]:
    bounds = [round(k * m / n) for k in range(n + 1)] if n else [0]
    return list(pairwise(bounds))
