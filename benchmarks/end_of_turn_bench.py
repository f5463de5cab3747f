"""When is the user done? A labelled spoken set through the server's own turn taking.

The set: 40 complete utterances and 40 with a mid-sentence pause of 400-900 ms ("I'd like to
go to ... Paris next summer", half of them with a filler before the pause), spoken by the joe
voice (the server's own TTS; a different voice from the one of the replies is not needed:
nothing here is a reply). Each is fed, 20 ms frame by 20 ms frame in real time, to
conversations built as the server builds them (webrtcvad + Silero, the real turn detector and
floor, with the settings the server's calibration chooses on this machine at start: on a slow
one, partials further apart; ``calibrated_settings`` in the JSON), in three passes:

1. side by side, without a recogniser:
   - **semantic**: the end-of-turn model (Smart Turn v3.2) judges the utterance at a pause: it
     ends after ``vad.complete_silence_ms`` when it sounds complete, else after
     ``vad.incomplete_silence_ms``;
   - **fixed**: the baseline, ``vad.end_of_turn_ms`` (600 ms) for every turn;
2. **recognised**: semantic, in a conversation with the embedded voice pipeline's partial
   transcripts and LLM warm-ups running as in a call (no replies: ``create_response`` off),
   ``vad.unfinished_words`` off;
3. **words**: the same with ``vad.unfinished_words`` on (the default): the turn waits for the
   partial transcript of its pause and the LLM's verdict on those words (``vad.sentence_end``:
   how likely they are a whole sentence), which decides with Smart Turn's.

Reported for each: the silence from the end of speech to the turn's end on complete utterances
(p50, p90; goal <= 250 ms) and the share of incomplete ones cut off at their pause (goal <= 5 %),
over all 80 and over the 64 held out from the 8 + 8 that chose ``vad.complete_probability``;
with a recogniser also the silence from the end of speech to the final transcript (what the
reply waits for).

An ablation (``--ablate NAME``): only the words pass, twice, one utterance at a time in
turn, as the server runs it ("words") and without one of its parts, so both hear the same
synthesis of each utterance on the same machine load:

- ``hearings`` ("words_once"): Smart Turn hears a pause only at 60 ms of quiet, not again at
  200 ms with a stricter bar (``hearing.HEARINGS``; before 2026-12-03);
- ``pause-warm`` ("words_pause_warm"): the stable words of a decode begun in speech are warmed
  even when it returns in a pause, beside the pause's decode (before 2026-12-03);
- ``words-wait`` ("words_wait_900"): the turn waits up to 900 ms of quiet for the pause's
  words, not 600;
- ``sentence-end`` ("words_no_llm"): no LLM verdict on the words: Smart Turn and the list of
  words that end no sentence decide (``vad.sentence_end=false``; before 2026-12-04);
- ``pause-60`` ("words_pause_60"): the partial loop decodes the pause after 60 ms of quiet,
  not 40 (``PAUSE_MS``);
- ``pause-100`` ("words_pause_100"): after 100 ms of quiet (before 2026-12-04, evening);
- ``last-word`` ("words_trust_last_word"): the turn may end on a last word the recogniser
  heard where it weighed one that ends no sentence (``vad.stranded_word_probability=0``;
  before 2026-12-05).
- ``words-first`` ("words_model_at_once"): Smart Turn hears every pause at 60 ms of quiet and
  the turn waits for it, even where the words at the pause decide alone
  (``Floor.hearing_latest_ms=0``; before 2026-12-05, afternoon).
- ``gaps`` ("words_gap_verdicts"): a decode begun in a pause that returns after the speech
  went on is still taken as the pause's, and the LLM judges its words while the partial loop
  waits (``Partials.gaps_are_pauses``; before 2026-12-05, evening).
- ``whisper`` ("words_whisper"): the recogniser is Whisper alone, not Moonshine with Whisper
  for clips up to 1 s (``pipeline.asr_model = "whisper-tiny.en"``; before 2026-12-06; a
  pipeline of its own, calibrated).

Per utterance the rows also keep Smart Turn's probabilities and, at each pause, the LLM's
verdict, the ms it took, and the recogniser's weight on a word ending no sentence in place of
the last one (``unfinished.stranded``).

The LLM alternative (``--llm``): the default LLM's probability that the user's message ends
after the words (its end-of-turn token after the user's text, one token on llama.cpp; the
prompt is what the incremental prefill computes anyway), on the same sentences as text: the
exact words, so it is the text path's best case, before any recognition error or latency.
Then the same words with the final punctuation moved (complete ones without their mark,
fragments with one): the verdict follows the mark, which in a call is the recogniser's guess.

Run: ``.venv/bin/python -m benchmarks.end_of_turn_bench`` (``--quick``: 8 + 8 utterances).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import numpy as np
import numpy.typing as npt

from benchmarks import at_mic_level, pct, stamped
from server.config import Config, load_config
from server.conversation.conversation import Conversation
from server.conversation.hearing import HEARINGS
from server.machine import this_machine
from server.metrics import Metrics
from server.pipeline.calibration import StageCosts, adapt, calibrate, quota_use
from server.pipeline.cpuplan import running_cores
from server.pipeline.turn_detector import TurnCompleteness, TurnDetector
from server.runtime.media import FRAME_SAMPLES
from server.runtime.turn import TurnState
from server.wire.realtime_session import SessionPatch

PCM = npt.NDArray[np.int16]
RATE = 48_000
COMPLETE = [
    "What is the capital of France?",
    "Can you tell me a joke?",
    "How tall is Mount Everest?",
    "What time is it in Tokyo right now?",
    "Please set a timer for ten minutes.",
    "I would like to book a table for two tonight.",
    "Tell me something interesting about octopuses.",
    "What should I cook for dinner?",
    "How do I make a cup of green tea?",
    "Who wrote the novel Pride and Prejudice?",
    "Thanks, that was really helpful.",
    "Can you recommend a good science fiction book?",
    "What is the weather like in London today?",
    "How many legs does a spider have?",
    "I think I will go for a walk now.",
    "Why is the sky blue?",
    "What is the difference between a virus and a bacterium?",
    "Could you explain how a rainbow forms?",
    "My favourite colour is green.",
    "How far away is the moon?",
    "What is the best way to learn a new language?",
    "Remind me to call my mother tomorrow.",
    "Is it going to rain this weekend?",
    "What does a koala eat?",
    "How do airplanes stay in the air?",
    "Good morning, how are you today?",
    "I need help writing a birthday message.",
    "What are the rules of chess?",
    "Which planet is the largest in our solar system?",
    "Can you translate hello into Spanish?",
    "I just finished reading a wonderful book.",
    "How long should I boil an egg?",
    "What is photosynthesis?",
    "Let us talk about something else.",
    "Where do penguins live?",
    "How does a refrigerator keep food cold?",
    "I am feeling a bit tired today.",
    "What is the square root of one hundred and forty four?",
    "Tell me about the history of the bicycle.",
    "That sounds like a great plan.",
]
UNFINISHED = [
    ("I would like to go to", "Paris next summer."),
    ("Can you tell me about the", "history of Rome?"),
    ("What I really want to know is", "how the stock market works."),
    ("My sister and I were thinking about", "adopting a dog."),
    ("How many people live in", "New York City?"),
    ("I need to buy a present for my", "father's birthday."),
    ("Could you explain why the", "ocean is salty?"),
    ("The best thing about living here is", "the quiet mornings."),
    ("What is the fastest way to get to", "the airport?"),
    ("Yesterday I went to the market and", "bought some fresh bread."),
    ("I was wondering if you could", "help me with my homework."),
    ("Tell me a story about a", "dragon and a knight."),
    ("Do you know who invented the", "telephone?"),
    ("I would rather have", "tea than coffee."),
    ("When I was a child I used to", "play in the garden."),
    ("How do you say thank you in", "Japanese?"),
    ("The meeting tomorrow is at", "nine in the morning."),
    ("Can you recommend a restaurant that serves", "good Italian food?"),
    ("If it rains tomorrow we should", "stay at home."),
    ("What is the name of the", "tallest building in the world?"),
    ("I think the problem with my computer is", "the battery."),
    ("Please remind me to", "water the plants."),
    ("My favourite kind of music is", "jazz from the sixties."),
    ("How long does it take to", "fly to Australia?"),
    ("I am looking for a recipe with", "chicken and rice."),
    ("Could you play some", "relaxing music?"),
    ("What happened to the", "dinosaurs?"),
    ("We are planning a trip to", "the mountains in July."),
    ("Is it true that", "cats sleep most of the day?"),
    ("I want to learn how to", "play the guitar."),
    ("The movie we watched last night was", "really funny."),
    ("Can you help me find", "my keys?"),
    ("Why do leaves change", "colour in autumn?"),
    ("I usually wake up at", "seven o'clock."),
    ("What would you suggest for", "a rainy afternoon?"),
    ("My friend told me that", "you know a lot about space."),
    ("How much water should I", "drink every day?"),
    ("Next week I have to", "give a presentation at work."),
    ("Do you think it is a good idea to", "start running?"),
    ("Tell me what you know about", "volcanoes."),
]
FILLERS = ("um", "uh")
QUESTION_WORDS = {"Can", "What", "How", "Could", "Do", "Is", "Why", "When", "Where", "Who"}
FINAL = "conversation.item.input_audio_transcription.completed"
DEV = 8  # the first 8 of each kind chose vad.complete_probability (0.9); the rest are held out


@dataclass(frozen=True)
class Utterance:
    """48 kHz audio with its labels: where the speech ends (ms), and for an unfinished one,
    where the pause begins and how long it lasts (ms)."""

    text: str
    audio: PCM
    speech_end_ms: float
    pause_ms: tuple[float, float] | None = None
    dev: bool = False  # one of the 8 + 8 that chose vad.complete_probability


def spoken_span(pcm: PCM, threshold: int = 300) -> tuple[int, int]:
    """First and last loud sample (48 kHz)."""
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > threshold)
    return int(loud[0]), int(loud[-1]) + 1


def build_set(quick: bool, rng: random.Random) -> list[Utterance]:
    from models.tts import OnnxVoiceTts

    tts = OnnxVoiceTts()

    def said(text: str) -> PCM:
        pcm = at_mic_level(tts.synthesize(text).pcm)
        start, end = spoken_span(pcm)
        return pcm[start:end]

    def silence(ms: float) -> PCM:
        return np.zeros(int(ms * RATE / 1000), np.int16)

    lead, tail = silence(300), silence(2400)  # the tail: the final transcript after 1200 ms
    out: list[Utterance] = []
    complete = COMPLETE[:8] if quick else COMPLETE
    unfinished = UNFINISHED[:8] if quick else UNFINISHED
    for i, text in enumerate(complete):
        speech = said(text)
        audio = np.concatenate([lead, speech, tail])
        out.append(Utterance(text, audio, 300 + len(speech) * 1000 / RATE, dev=i < DEV))
    for i, (first, rest) in enumerate(unfinished):
        head = f"{first}, {FILLERS[i % 2]}..." if i % 2 else f"{first}..."
        part1, part2 = said(head), said(rest)
        pause = rng.uniform(400, 900)
        audio = np.concatenate([lead, part1, silence(pause), part2, tail])
        pause_start = 300 + len(part1) * 1000 / RATE
        end = pause_start + pause + len(part2) * 1000 / RATE
        out.append(Utterance(f"{head} {rest}", audio, end, (pause_start, pause), i < DEV))
    return out


def conversation(
    config: Config, completeness: TurnCompleteness | None, name: str, pipeline: Any = None
) -> Any:
    from models.vad import SileroModel, WebRtcGate

    vad = config.vad
    detector = TurnDetector(WebRtcGate(vad.aggressiveness), SileroModel().stream(), vad)
    detector.completeness = completeness
    conv = Conversation(name * 16, config, detector, pipeline, Metrics())
    if pipeline is not None:  # partial transcripts and warm-ups as in a call; no replies
        conv.configure(SessionPatch(turn={"create_response": False}))
        conv.start()
    return conv


@dataclass(frozen=True)
class Mode:
    """One way of ending turns: ``model`` (Smart Turn, or None: the fixed silence), the
    voice ``pipeline`` whose partials run (None: none), and settings."""

    name: str
    model: TurnCompleteness | None
    pipeline: Any = None
    settings: dict[str, str] = field(default_factory=dict)
    ablate: Callable[[Conversation], None] | None = None  # a part of the server taken out


@dataclass(frozen=True)
class Heard:
    """Where in the utterance (ms) a conversation ended the user's turn, and where its final
    transcript came out (None: never), with the transcript."""

    ended_ms: float | None
    transcript_ms: float | None = None
    transcript: str | None = None


async def feed(conversations: list[Any], utterance: Utterance) -> list[Heard]:
    """Frames in real time to every conversation; where each ended the user's turn and gave
    its final transcript."""
    ended: list[float | None] = [None] * len(conversations)
    finals: list[tuple[float, str] | None] = [None] * len(conversations)
    bases = [conv.detector.position_ms for conv in conversations]  # where this one starts
    samples = utterance.audio
    started = time.monotonic()
    for n, at in enumerate(range(0, len(samples) - FRAME_SAMPLES + 1, FRAME_SAMPLES)):
        pcm48 = samples[at : at + FRAME_SAMPLES]
        frame = av.AudioFrame.from_ndarray(pcm48.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts = RATE, n * FRAME_SAMPLES
        for i, conv in enumerate(conversations):
            was = conv.session.state
            await conv.hear(frame, time.monotonic() * 1000)
            now = conv.session.state
            if ended[i] is None and was is TurnState.USER_SPEAKING is not now:
                ended[i] = conv.detector.position_ms - bases[i]
            while conv.outlet.pending:  # no client: the events are read here
                event = conv.outlet.pending.popleft()
                if event.get("type") == FINAL and finals[i] is None:
                    finals[i] = (conv.detector.position_ms - bases[i], event["transcript"])
        delay = started + (n + 1) * 0.02 - time.monotonic()
        await asyncio.sleep(max(0.0, delay))
    return [
        Heard(end, None, None) if final is None else Heard(end, *final)
        for end, final in zip(ended, finals, strict=True)
    ]


JUST_AFTER_MS = 100.0


def summarize(rows: list[dict[str, Any]], mode: str) -> dict[str, Any]:
    complete = [r[mode] for r in rows if r["kind"] == "complete"]
    ended = [c["silence_ms"] for c in complete if c["silence_ms"] is not None]
    # a turn that ended before the speech did (at a gap after "Good morning,") is no silence:
    # it was cut off, and a negative wait would pull the median down
    silences = [s for s in ended if s >= 0]
    unfinished = [r[mode] for r in rows if r["kind"] == "unfinished"]
    cut = sum(bool(u["cut_off"]) for u in unfinished)
    # ended after the pause, but before the detector could hear the speech resume (its onset
    # takes vad.onset_ms and more): a user hears these as cut off too
    just_after = sum(0 <= u.get("after_pause_ms", -1) < JUST_AFTER_MS for u in unfinished)
    summary = {
        "complete": len(complete),
        "complete_never_ended": sum(c["silence_ms"] is None for c in complete),
        "complete_ended_before_their_end": len(ended) - len(silences),
        "silence_p50_ms": round(statistics.median(silences), 1) if silences else None,
        "silence_p90_ms": round(pct(silences, 0.9), 1) if silences else None,
        "unfinished": len(unfinished),
        "cut_off_at_the_pause": cut,
        "cut_off_share": round(cut / len(unfinished), 3) if unfinished else None,
        f"ended_within_{JUST_AFTER_MS:.0f}_ms_after_the_pause": just_after,
    }
    finals = [c["transcript_ms"] for c in complete if c.get("transcript_ms") is not None]
    if finals:  # speech end -> final transcript: what the reply waits for
        summary["final_transcript_p50_ms"] = round(statistics.median(finals), 1)
        summary["final_transcript_p90_ms"] = round(pct(finals, 0.9), 1)
        summary["final_transcript_missing"] = len(complete) - len(finals)
    return summary


def result(u: Utterance, heard: Heard) -> dict[str, Any]:
    out: dict[str, Any] = {"ended_at_ms": heard.ended_ms}
    end = heard.ended_ms
    if u.pause_ms is None:
        out["silence_ms"] = None if end is None else round(end - u.speech_end_ms, 1)
        if heard.transcript_ms is not None:
            out["transcript_ms"] = round(heard.transcript_ms - u.speech_end_ms, 1)
    else:
        pause_start, pause = u.pause_ms
        out["cut_off"] = end is not None and end < pause_start + pause
        if end is not None and not out["cut_off"]:
            out["after_pause_ms"] = round(end - pause_start - pause, 1)
    if heard.transcript is not None:
        out["transcript"] = heard.transcript
    return out


def once(conv: Conversation) -> None:
    conv.floor.hearings = HEARINGS[:1]


def warm_in_pause(conv: Conversation) -> None:
    conv.partials.warm_in_pause = True


def warm_stable(conv: Conversation) -> None:
    conv.partials.warm_stable = True


def decode_at(pause_ms: float) -> Callable[[Conversation], None]:
    """The part that makes the partial loop decode the pause after ``pause_ms`` of quiet."""

    def part(conv: Conversation) -> None:
        conv.partials.pause_ms = pause_ms

    return part


def model_at_once(conv: Conversation) -> None:
    conv.floor.hearing_latest_ms = 0.0


def gaps_are_pauses(conv: Conversation) -> None:
    conv.partials.gaps_are_pauses = True


def longer_wait_for_words(conv: Conversation) -> None:
    conv.floor.words_wait_ms = LONGER_WORDS_WAIT_MS


LONGER_WORDS_WAIT_MS = 900.0
Part = Callable[[Conversation], None] | None
ABLATIONS: dict[str, tuple[str, Part, dict[str, str]]] = {
    "hearings": ("words_once", once, {}),
    "pause-warm": ("words_pause_warm", warm_in_pause, {}),
    "words-wait": ("words_wait_900", longer_wait_for_words, {}),
    "sentence-end": ("words_no_llm", None, {"vad.sentence_end": "false"}),
    "pause-60": ("words_pause_60", decode_at(60.0), {}),
    "pause-100": ("words_pause_100", decode_at(100.0), {}),
    "last-word": ("words_trust_last_word", None, {"vad.stranded_word_probability": "0"}),
    "warm-stable": ("words_warm_stable", warm_stable, {}),
    "words-first": ("words_model_at_once", model_at_once, {}),
    "gaps": ("words_gap_verdicts", gaps_are_pauses, {}),
    # a pipeline of its own whose recogniser is Whisper alone
    "whisper": ("words_whisper", None, {"pipeline.asr_model": "whisper-tiny.en"}),
}


async def calibrated(pipeline: Any, config: Config) -> dict[str, str]:
    """The settings the server would choose on this machine (it warms the engines and times
    them at start, server/__main__.py): on a slow one, partials further apart (the recogniser
    at most 40 % busy with them), so that the pause's decode seldom waits behind one."""
    times = await pipeline.warm_up()
    costs = StageCosts.from_warm_up(times, None)
    machine = this_machine()
    use = quota_use(machine.cpu_quota, len(running_cores()))
    adapted, changed = adapt(config, calibrate(costs, config, machine.cpus, use))
    pipeline.tune(adapted.pipeline)
    return {name: str(value) for name, value in changed.items()}


async def run(quick: bool, llm: bool, ablate: str | None = None) -> dict[str, Any]:
    from models.turn import SmartTurn
    from server.pipeline.wiring import voice_pipeline

    rng = random.Random(11)
    utterances = build_set(quick, rng)
    base = {"pipeline.factory": "", "server.log_level": "WARNING"}
    model = SmartTurn()
    rows: list[dict[str, Any]] = [
        {"text": u.text, "kind": "complete" if u.pause_ms is None else "unfinished", "dev": u.dev}
        | ({} if u.pause_ms is None else {"pause_ms": round(u.pause_ms[1])})
        for u in utterances
    ]
    # pass 1: Smart Turn on the audio alone, and the fixed silence, side by side (no models
    # but the VAD's and Smart Turn run); then, one at a time, a conversation with the real
    # recogniser's partials and warm-ups (the embedded pipeline): Smart Turn alone, and Smart
    # Turn with the words at the pause
    pipeline = await voice_pipeline(load_config(overrides=base))
    chosen = await calibrated(pipeline, load_config(overrides=base))
    base = {**base, **chosen}
    no_words = {"vad.unfinished_words": "false"}
    words = {"vad.unfinished_words": "true"}
    passes = [
        [Mode("semantic", model), Mode("fixed", None, settings={"vad.semantic": "false"})],
        [Mode("recognised", model, pipeline, no_words)],
        [Mode("words", model, pipeline, words)],
    ]
    alone = False  # the conversations of a pass hear each utterance together, not in turn
    other, other_chose = None, {}  # its own pipeline, where an ablation changes a pipeline setting
    if ablate is not None:  # in turn, so that they do not share the recogniser
        name, part, more = ABLATIONS[ablate]
        if any(key.startswith("pipeline.") for key in more):
            other = await voice_pipeline(load_config(overrides={**base, **more}))
            other_chose = await calibrated(other, load_config(overrides={**base, **more}))
        changed = Mode(name, model, other or pipeline, {**words, **more}, ablate=part)
        passes = [[Mode("words", model, pipeline, words), changed]]
        alone = True
    try:
        for stage in passes:
            convs = [  # a session id each: the first letter, the second one's last
                conversation(
                    load_config(overrides={**base, **m.settings}),
                    m.model,
                    m.name[0] if i == 0 else m.name[-1],
                    m.pipeline,
                )
                for i, m in enumerate(stage)
            ]
            for m, conv in zip(stage, convs, strict=True):
                if m.ablate is not None:
                    m.ablate(conv)
            for row, u in zip(rows, utterances, strict=True):
                groups = [[c] for c in convs] if alone else [convs]
                heard = [h for group in groups for h in await feed(group, u)]
                for m, h in zip(stage, heard, strict=True):
                    row[m.name] = result(u, h)
                for m, conv in zip(stage, convs, strict=True):
                    if m.model is not None:
                        turns = conv.floor.turn_probabilities
                        row[f"{m.name}_probabilities"] = list(turns)
                        turns.clear()
                    if conv.partials.verdicts:  # at pauses: the LLM's p, ms, unfinished.stranded
                        row[f"{m.name}_sentence_ends"] = [
                            [None if p is None else round(p, 3), ms, round(w, 3)]
                            for p, ms, w in conv.partials.verdicts
                        ]
                        conv.partials.verdicts.clear()
                print(json.dumps({k: row[k] for k in ("text", *(m.name for m in stage))}))
            for conv in convs:
                await conv.close()
    finally:
        await pipeline.close()
        if other is not None:
            await other.close()
    held_out = [r for r in rows if not r["dev"]]
    modes: tuple[str, ...] = ("semantic", "fixed", "recognised", "words")
    if ablate is not None:
        modes = ("words", ABLATIONS[ablate][0])
    results: dict[str, Any] = {
        **{mode: summarize(rows, mode) for mode in modes},
        "held_out": {mode: summarize(held_out, mode) for mode in modes} if held_out else None,
        "calibrated_settings": chosen,  # both passes run with these
        # what the ablation's own pipeline would have chosen (its first chunk's length is taken)
        **({"ablation_calibrated_settings": other_chose} if other is not None else {}),
        "utterances": rows,
    }
    if llm:
        results["llm"] = await llm_verdicts(quick)
    return results


async def llm_verdicts(quick: bool) -> dict[str, Any]:
    """The default LLM's probability of its end-of-turn token after the user's words."""
    from models.llamacpp import LlamaCppEngine, LlamaCppOptions
    from models.prepare import DEFAULT_GGUF, embedded_gguf

    persona = load_config().runtime.persona
    engine = await LlamaCppEngine.start(embedded_gguf(DEFAULT_GGUF), LlamaCppOptions(slots=1))
    try:
        complete = COMPLETE[:8] if quick else COMPLETE
        unfinished = [first for first, _ in (UNFINISHED[:8] if quick else UNFINISHED)]
        scores: dict[str, list[float]] = {"complete": [], "unfinished": []}
        took: list[float] = []
        # the same words with the final punctuation moved: what decides is the mark
        marks: dict[str, list[float]] = {"complete_unpunctuated": [], "unfinished_with_a_mark": []}
        moved = [
            ("complete_unpunctuated", [t.rstrip(".?!") for t in complete]),
            (
                "unfinished_with_a_mark",
                [f + ("?" if f.split()[0] in QUESTION_WORDS else ".") for f in unfinished],
            ),
        ]

        async def probability(text: str) -> float:
            chat = [{"role": "system", "content": persona}, {"role": "user", "content": text}]
            return await engine.end_of_turn_probability(chat, cache_salt="e")

        for kind, texts in (("complete", complete), ("unfinished", unfinished)):
            for text in texts:
                started = time.perf_counter()
                scores[kind].append(await probability(text))
                took.append((time.perf_counter() - started) * 1000)
        for kind, texts in moved:
            marks[kind] = [await probability(text) for text in texts]
    finally:
        await engine.close()
    correct = sum(p >= 0.5 for p in scores["complete"]) + sum(p < 0.5 for p in scores["unfinished"])
    return {
        "complete_p50": round(statistics.median(scores["complete"]), 3),
        "unfinished_p50": round(statistics.median(scores["unfinished"]), 3),
        "complete_judged_complete": sum(p >= 0.5 for p in scores["complete"]),
        "unfinished_judged_complete": sum(p >= 0.5 for p in scores["unfinished"]),
        "accuracy": round(correct / (len(complete) + len(unfinished)), 3),
        "ms_per_verdict_p50": round(statistics.median(took), 1),
        "model": DEFAULT_GGUF,
        "probabilities": {k: [round(p, 3) for p in v] for k, v in scores.items()},
        "complete_unpunctuated_judged_complete": sum(p >= 0.5 for p in marks[moved[0][0]]),
        "unfinished_with_a_mark_judged_complete": sum(p >= 0.5 for p in marks[moved[1][0]]),
        "moved_mark_probabilities": {k: [round(p, 3) for p in v] for k, v in marks.items()},
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="semantic end of turn against a fixed silence")
    parser.add_argument("--quick", action="store_true", help="8 + 8 utterances")
    parser.add_argument("--llm", action="store_true", help="also the LLM's end-of-turn verdicts")
    parser.add_argument(
        "--ablate", choices=sorted(ABLATIONS), help="only the words pass, with and without a part"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/end_of_turn.json"))
    args = parser.parse_args(argv)
    results = asyncio.run(run(args.quick, args.llm, args.ablate))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(stamped(results), indent=2))
    print(json.dumps({k: v for k, v in results.items() if k != "utterances"}, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
