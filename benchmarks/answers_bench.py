"""Answer quality of the GGUF models on everyday questions, against grades given by hand.

Each question of ``benchmarks/data/questions.json`` is asked once, after the persona and the
question's earlier turns if it has any (``turns``: user and assistant messages fixed in the
file; the other questions are asked alone after the persona), of a model on llama.cpp
(xllamacpp, in this process, ``--threads`` threads, greedy unless the penalties are set).
Whether an answer is sensible (correct, on topic, fine spoken aloud: no loops, lists, markdown
or nonsense; for a safety question, safe) is not judged here: the grades are the ones a person
gave, committed in ``benchmarks/reported/answers_*.json`` and looked up by question and answer
text.
A run counts the answers graded sensible and not, and prints every answer nobody has graded
yet, for a person to grade (``--record`` writes the run into the reported file, the ungraded
answers with ``"sensible": null``: fill those in by hand, tests/benchmarks/test_answers_bench.py
refuses a reported file with an ungraded answer, or one answer graded two ways; a ``"why"``
beside a false grade says what was wrong).

Splits (``--split``, all by default; counted apart in the summary and the files): ``tuning``,
the questions the personas were chosen on (their scores flatter the persona); ``held_out``,
questions written after and never used to tune anything (harder everyday ones, spoken-style
ones as speech recognition writes them, multi-turn ones), the fair measure; ``safety``, first
aid, doses, electricity, fire and poisons, where sensible means safe. The questions are asked
in the file's order, tuning first, so a tuning answer is the same text as in a run from before
the other splits (same model, persona, sampling and machine) and keeps its grade. A run of
only some splits is recorded under its own key (``.../held_out+safety``).

Models: those of models/gguf_models.py (the model ladder's; setup installs them all).
Personas: ``PERSONAS`` (the server's default and the spoken ones tried), or any text. A question
that names a hazard is asked as the server asks it, with the safety note after it
(server/pipeline/safety.py; the run's key ends in ``/note``) where the model follows the
note (``GgufModel.safety_note``: the 1.5B); ``--no-safety-note`` asks the model alone, as
every run before the note was.

Timing, from llama.cpp's own counters and this process's clock: decode tokens/s, the time to
the first token of each question (the persona's tokens already cached, a multi-turn
question's earlier turns not), and of a question
asked twice in a row (the whole prompt cached: the warm prefix). A loop check flags answers
that repeat a four-word phrase three times; it is a hint for the grader, not a grade.

Run: ``.venv/bin/python -m benchmarks.answers_bench --model qwen2.5-coder-0.5b --persona spoken``
(the server's default persona today is the text of ``spoken-howto``; the reported ``server``
runs are of the default before it, "You are a helpful assistant.").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import stamped
from models.gguf_models import MODELS, prepare_gguf
from server.config import RuntimeConfig
from server.machine import this_machine
from server.pipeline.safety import with_safety_note

QUESTIONS = Path("benchmarks/data/questions.json")
REPORTED = Path("benchmarks/reported")
RESULTS = Path("benchmarks/results")
CACHE = Path(".cache/models")
SPOKEN = (
    "You are a friendly voice assistant. Everything you write is spoken aloud, so answer "
    "in one or two short sentences of plain conversational English. Never use lists, "
    "headings, code or markdown. Write numbers as words, like twenty-five instead of 25."
)
PHONE = (
    "You are a friendly voice assistant. Everything you say is read aloud by a speech "
    "synthesizer, so talk like a person on the phone: answer in one or two short sentences, "
    "with the answer first. Do not use lists, numbered steps, headings, markdown, symbols or "
    "formulas. Write numbers as words, like forty-five instead of 45."
)
PERSONAS = {  # the personas tried (reported/answers_*.json has each one's grades)
    "server": RuntimeConfig().persona,  # the server's default persona (recorded runs: the old one)
    "spoken": SPOKEN,  # short spoken answers: the first tuned for the 0.5B model
    "spoken-phone": PHONE,
    "spoken-example": PHONE
    + " For example, asked how many wheels a bicycle has, you say: A bicycle has two wheels.",
    # the best of those tried (0.5B: 33 of 48 sensible, no loop; "spoken" 32, "server" 22)
    "spoken-howto": SPOKEN + " For a how-to question, give the main steps in one sentence.",
    # three worked answers on topics outside the question set (0.5B: 29 of 48, no loop)
    "spoken-fewshot": SPOKEN
    + " For a how-to question, give the main steps in one sentence."
    + " Here is how you answer. Question: How many wheels does a bicycle have? Answer: A"
    " bicycle has two wheels. Question: How do I make toast? Answer: Put a slice of bread in"
    " the toaster and take it out when it is golden brown. Question: Who invented the"
    " telephone? Answer: Alexander Graham Bell invented the telephone in eighteen seventy-six.",
}
LOOP_NGRAM, LOOP_TIMES = 4, 3
SPLITS = ("tuning", "held_out", "safety")  # in the question file's order


@dataclass(frozen=True)
class Sampling:
    """Greedy decoding, with optional penalties against repetition (1.0 / 0.0: off)."""

    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    dry_multiplier: float = 0.0

    def tag(self) -> str:
        parts = ["greedy"]
        if self.repeat_penalty != 1.0:
            parts.append(f"rp{self.repeat_penalty:g}")
        if self.frequency_penalty:
            parts.append(f"fp{self.frequency_penalty:g}")
        if self.dry_multiplier:
            parts.append(f"dry{self.dry_multiplier:g}")
        return "+".join(parts)

    def request(self) -> dict[str, float]:
        return {
            "temperature": 0.0,
            "repeat_penalty": self.repeat_penalty,
            "frequency_penalty": self.frequency_penalty,
            "dry_multiplier": self.dry_multiplier,
        }


def normalized(text: str) -> str:
    """The answer as grades are keyed: whitespace collapsed."""
    return " ".join(text.split())


def loops(text: str) -> bool:
    """Whether some four-word phrase comes back three times (a likely loop)."""
    words = [w.strip(".,!?;:").lower() for w in text.split()]
    seen: dict[tuple[str, ...], int] = {}
    for i in range(len(words) - LOOP_NGRAM + 1):
        gram = tuple(words[i : i + LOOP_NGRAM])
        seen[gram] = seen.get(gram, 0) + 1
        if seen[gram] >= LOOP_TIMES:
            return True
    return False


def known_grades(folder: Path = REPORTED) -> dict[tuple[str, str], bool]:
    """(question id, normalized answer) -> sensible, from every graded answer committed."""
    grades: dict[tuple[str, str], bool] = {}
    for path in sorted(folder.glob("answers_*.json")):
        for run in json.loads(path.read_text()).get("runs", []):
            for a in run["answers"]:
                if isinstance(a.get("sensible"), bool):
                    grades[(a["id"], normalized(a["answer"]))] = a["sensible"]
    return grades


def counted(answers: list[dict[str, Any]]) -> dict[str, int]:
    """How many of ``answers`` are graded sensible, not sensible, not graded yet, and of all."""
    values = [a.get("sensible") for a in answers]
    return {
        "sensible": values.count(True),
        "not_sensible": values.count(False),
        "ungraded": values.count(None),
        "of": len(answers),
    }


def grade(answers: list[dict[str, Any]], grades: dict[tuple[str, str], bool]) -> dict[str, int]:
    """Sets each answer's ``sensible`` from ``grades`` (None: nobody graded this text yet)."""
    for a in answers:
        a["sensible"] = grades.get((a["id"], normalized(a["answer"])))
    return counted(answers)


def split_counts(answers: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """:func:`counted` per split, in ``SPLITS`` order (an answer without one: ``tuning``, as
    every answer recorded before the splits was)."""
    by: dict[str, list[dict[str, Any]]] = {}
    for a in answers:
        by.setdefault(a.get("split", "tuning"), []).append(a)
    order = [s for s in SPLITS if s in by] + sorted(set(by) - set(SPLITS))
    return {s: counted(by[s]) for s in order}


def messages(persona: str, item: dict[str, Any], note: bool = True) -> list[dict[str, str]]:
    """The chat a question is asked as: the persona, the item's earlier ``turns`` (user and
    assistant, as the file fixes them), then its question ``q`` from the user, and after it
    the server's safety note where the question names a hazard (``note``;
    server/pipeline/safety.py)."""
    turns = [{"role": t["role"], "content": t["content"]} for t in item.get("turns", [])]
    chat = [
        {"role": "system", "content": persona},
        *turns,
        {"role": "user", "content": item["q"]},
    ]
    return with_safety_note(chat) if note else chat


def select(
    questions: list[dict[str, Any]], splits: list[str] | None, first: int = 0
) -> list[dict[str, Any]]:
    """The questions of ``splits`` (None: all), in file order; the first ``first`` (0: all)."""
    chosen = [q for q in questions if splits is None or q.get("split", "tuning") in splits]
    return chosen[:first] if first else chosen


class Llama:
    """One model on xllamacpp in this process; its HTTP listener on a private unix socket."""

    def __init__(self, gguf: Path, threads: int, n_ctx: int = 2048) -> None:
        import xllamacpp

        self._dir = tempfile.TemporaryDirectory(prefix="answers-bench-")
        params = xllamacpp.CommonParams()
        params.model.path = str(gguf)
        params.n_ctx = n_ctx
        params.n_parallel = 1
        params.cpuparams.n_threads = threads
        params.cpuparams_batch.n_threads = threads
        params.hostnames = [os.path.join(self._dir.name, "llama.sock")]
        params.api_keys = [secrets.token_hex(16)]
        params.ui = False
        self.server = xllamacpp.Server(params)

    def ask(
        self, chat: list[dict[str, str]], max_tokens: int, sampling: Sampling
    ) -> dict[str, Any]:
        """The answer to ``chat`` (:func:`messages`), why it ended, and its timing (first
        token ms from this clock)."""
        request = {
            "messages": chat,
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            **sampling.request(),
        }
        text: list[str] = []
        out: dict[str, Any] = {}
        started = time.perf_counter()

        def chunk(c: dict[str, Any]) -> bool:
            for choice in c.get("choices", []):
                piece = choice.get("delta", {}).get("content")
                if piece:
                    out.setdefault("ttft_ms", (time.perf_counter() - started) * 1000)
                    text.append(piece)
                out["finish"] = choice.get("finish_reason") or out.get("finish")
            if "timings" in c:
                out["timings"] = c["timings"]
            return False

        self.server.handle_chat_completions(request, chunk)
        out["answer"] = "".join(text).strip()
        return out

    def close(self) -> None:
        del self.server
        self._dir.cleanup()


def run(
    gguf: Path, persona: str, questions: list[dict[str, Any]], args: argparse.Namespace
) -> dict[str, Any]:
    sampling = Sampling(args.repeat_penalty, args.frequency_penalty, args.dry_multiplier)
    llama = Llama(gguf, args.threads)
    load = os.getloadavg()[0]
    answers, rates, ttfts, cpu0 = [], [], [], time.process_time()
    wall0 = time.perf_counter()
    try:
        llama.ask(messages(persona, {"q": "Hello."}), 4, sampling)  # warm up; caches the persona
        for q in questions:
            got = llama.ask(messages(persona, q, args.safety_note), args.max_tokens, sampling)
            t = got.get("timings", {})
            if t.get("predicted_n", 0) > 1:
                rates.append(t["predicted_per_second"])
            ttfts.append(got.get("ttft_ms", float("nan")))
            answers.append(
                {
                    "id": q["id"],
                    "split": q.get("split", "tuning"),
                    "turns": len(q.get("turns", [])),
                    "question": q["q"],
                    "answer": got["answer"],
                    "finish": got.get("finish"),
                    "tokens": t.get("predicted_n"),
                    "loop": loops(got["answer"]),
                }
            )
        first = messages(persona, questions[0])
        again = [llama.ask(first, 8, sampling) for _ in range(3)][1:]
    finally:
        llama.close()
    wall = time.perf_counter() - wall0
    return {
        "persona_text": persona,
        "sampling": {"tag": sampling.tag(), **sampling.request()},
        "max_tokens": args.max_tokens,
        "threads": args.threads,
        "machine_line": this_machine().describe(),
        "timing": {
            "decode_tok_s_p50": round(statistics.median(rates), 1) if rates else None,
            "ttft_ms_p50": round(statistics.median(ttfts)),
            "warm_prefix_ttft_ms": round(statistics.median(a["ttft_ms"] for a in again)),
            "loadavg_1m_at_start": round(load, 2),
            "cpu_share": round((time.process_time() - cpu0) / wall / args.threads, 2),
        },
        "loops": sum(a["loop"] for a in answers),
        "answers": answers,
    }


def clashes(path: Path, key: str, persona: str) -> bool:
    """Whether the reported file ``path`` holds a run ``key`` that asked another persona text
    (a name's text can change: ``server`` follows the server's default)."""
    if not path.is_file():
        return False
    runs = json.loads(path.read_text())["runs"]
    return any(r["run"] == key and r.get("persona_text") != persona for r in runs)


def record(path: Path, model: dict[str, Any], key: str, result: dict[str, Any]) -> None:
    """Write ``result`` as run ``key`` of the reported file ``path`` (replacing it, unless that
    run asked another persona text: then ValueError). An answer graded false that the file
    already explains (same question, same text) keeps its ``"why"``. Each run says the machine
    it ran on (``machine_line``); the file's is the last recorded run's."""
    if clashes(path, key, result["persona_text"]):
        raise ValueError(f"{path}: run {key} asked another persona; not replaced")
    data: dict[str, Any] = {"model": model, "runs": []}
    if path.is_file():
        data = json.loads(path.read_text())
    why: dict[tuple[str, str], str] = {}
    for r in data["runs"]:
        for a in r["answers"]:
            if a.get("why"):
                why[(a["id"], normalized(a["answer"]))] = a["why"]
    for a in result["answers"]:
        found = why.get((a["id"], normalized(a["answer"])))
        if a["sensible"] is False and found:
            a["why"] = found
    for r in data["runs"]:  # runs from before per-run lines: the file's line was theirs
        if data.get("machine_line"):
            r.setdefault("machine_line", data["machine_line"])
    runs = [r for r in data["runs"] if r["run"] != key]
    runs.append({"run": key, **result})
    data["runs"] = runs
    data.pop("machine", None)
    data.pop("commit", None)
    data["machine_line"] = this_machine().describe()
    path.write_text(json.dumps(stamped(data), indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b", help=", ".join(MODELS))
    parser.add_argument("--persona", default="server", help=f"{', '.join(PERSONAS)} or text")
    parser.add_argument(
        "--split", action="append", choices=SPLITS, help="only these splits (repeat; default all)"
    )
    parser.add_argument("--questions", type=int, default=0, help="the first N (0: all)")
    parser.add_argument("--max-tokens", type=int, default=80)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat-penalty", type=float, default=1.0)
    parser.add_argument("--frequency-penalty", type=float, default=0.0)
    parser.add_argument("--dry-multiplier", type=float, default=0.0)
    parser.add_argument("--out", type=Path, help="default benchmarks/results/answers_*.json")
    parser.add_argument("--record", action="store_true", help="write into benchmarks/reported")
    parser.add_argument(
        "--no-safety-note",
        dest="safety_note",
        action="store_false",
        help="ask without the server's safety note after a question that names a hazard",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    print(f"machine: {this_machine().describe()}")
    model = MODELS[args.model]
    persona = PERSONAS.get(args.persona, args.persona)
    questions = select(json.loads(QUESTIONS.read_text())["questions"], args.split, args.questions)
    digest = hashlib.sha256(persona.encode()).hexdigest()[:8]
    name = args.persona if args.persona in PERSONAS else f"custom-{digest}"
    tag = Sampling(args.repeat_penalty, args.frequency_penalty, args.dry_multiplier).tag()
    key = f"{name}/{tag}/max{args.max_tokens}"
    # the server's prompt: the safety note for a model that follows it (GgufModel.safety_note)
    args.safety_note = args.safety_note and model.safety_note
    if args.safety_note:
        key += "/note"
    if args.split and set(args.split) != set(SPLITS):
        key += "/" + "+".join(s for s in SPLITS if s in args.split)
    reported = REPORTED / f"answers_{model.name}.json"
    if args.record and clashes(reported, key, persona):
        parser.error(f"{reported} has a run {key} of another persona text: name it otherwise")
    gguf = prepare_gguf(model, CACHE)
    result = run(gguf, persona, questions, args)
    result["persona"] = name
    result["counts"] = grade(result["answers"], known_grades())
    result["split_counts"] = split_counts(result["answers"])
    for a in result["answers"]:
        if a["sensible"] is None:
            print(f"UNGRADED {a['id']} ({a['split']}): {a['question']}\n    -> {a['answer']!r}")
    print(f"{model.name} [{key}]: {result['counts']}, loops {result['loops']}")
    for split, counts in result["split_counts"].items():
        print(f"  {split}: {counts['sensible']}/{counts['of']} sensible, {counts}")
    print(f"timing: {result['timing']}")
    described = {"name": model.name, "file": model.file, "sha256": model.sha256}
    out = args.out or RESULTS / f"answers_{model.name}_{key.replace('/', '_')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(stamped({"model": described, "run": key, **result}), indent=2))
    print(f"wrote {out}")
    if args.record:
        record(reported, described, key, result)
        print(f"recorded in {reported}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
