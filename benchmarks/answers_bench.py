"""Answer quality of the GGUF models on everyday questions, against grades given by hand.

Each question of ``benchmarks/data/questions.json`` is asked once, alone after the persona,
of a model on llama.cpp (xllamacpp, in this process, ``--threads`` threads, greedy unless the
penalties are set). Whether an answer is sensible (correct, on topic, fine spoken aloud: no
loops, lists, markdown or nonsense) is not judged here: the grades are the ones a person gave,
committed in ``benchmarks/reported/answers_*.json`` and looked up by question and answer text.
A run counts the answers graded sensible and not, and prints every answer nobody has graded
yet, for a person to grade (``--record`` writes the run into the reported file, the ungraded
answers with ``"sensible": null``: fill those in by hand, tests/benchmarks/test_answers_bench.py
refuses a reported file with an ungraded answer, or one answer graded two ways).

Models: those of models/gguf_models.py (the 1.5B's 22 piece packages are no dependency of the
project: install them, or put them on PYTHONPATH, to prepare it). Personas: ``PERSONAS`` (the
server's default and the spoken ones tried), or any text.

Timing, from llama.cpp's own counters and this process's clock: decode tokens/s, the time to
the first token of each question (the persona's tokens already cached), and of a question
asked twice in a row (the whole prompt cached: the warm prefix). A loop check flags answers
that repeat a four-word phrase three times; it is a hint for the grader, not a grade.

Run: ``.venv/bin/python -m benchmarks.answers_bench --model qwen2.5-coder-0.5b --persona spoken``
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
    "server": RuntimeConfig().persona,  # the server's default persona
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


def grade(answers: list[dict[str, Any]], grades: dict[tuple[str, str], bool]) -> dict[str, int]:
    """Sets each answer's ``sensible`` from ``grades`` (None: nobody graded this text yet)."""
    for a in answers:
        a["sensible"] = grades.get((a["id"], normalized(a["answer"])))
    values = [a["sensible"] for a in answers]
    return {
        "sensible": values.count(True),
        "not_sensible": values.count(False),
        "ungraded": values.count(None),
        "of": len(answers),
    }


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
        self, system: str, question: str, max_tokens: int, sampling: Sampling
    ) -> dict[str, Any]:
        """The answer, why it ended, and its timing (first token ms from this clock)."""
        request = {
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": question},
            ],
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
    gguf: Path, persona: str, questions: list[dict[str, str]], args: argparse.Namespace
) -> dict[str, Any]:
    sampling = Sampling(args.repeat_penalty, args.frequency_penalty, args.dry_multiplier)
    llama = Llama(gguf, args.threads)
    load = os.getloadavg()[0]
    answers, rates, ttfts, cpu0 = [], [], [], time.process_time()
    wall0 = time.perf_counter()
    try:
        llama.ask(persona, "Hello.", 4, sampling)  # warm up; caches the persona's tokens
        for q in questions:
            got = llama.ask(persona, q["q"], args.max_tokens, sampling)
            t = got.get("timings", {})
            if t.get("predicted_n", 0) > 1:
                rates.append(t["predicted_per_second"])
            ttfts.append(got.get("ttft_ms", float("nan")))
            answers.append(
                {
                    "id": q["id"],
                    "question": q["q"],
                    "answer": got["answer"],
                    "finish": got.get("finish"),
                    "tokens": t.get("predicted_n"),
                    "loop": loops(got["answer"]),
                }
            )
        again = [llama.ask(persona, questions[0]["q"], 8, sampling) for _ in range(3)][1:]
    finally:
        llama.close()
    wall = time.perf_counter() - wall0
    return {
        "persona_text": persona,
        "sampling": {"tag": sampling.tag(), **sampling.request()},
        "max_tokens": args.max_tokens,
        "threads": args.threads,
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


def record(path: Path, model: dict[str, Any], key: str, result: dict[str, Any]) -> None:
    """Write ``result`` as run ``key`` of the reported file ``path`` (replacing it)."""
    data: dict[str, Any] = {"model": model, "runs": []}
    if path.is_file():
        data = json.loads(path.read_text())
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
    parser.add_argument("--questions", type=int, default=0, help="the first N (0: all)")
    parser.add_argument("--max-tokens", type=int, default=80)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat-penalty", type=float, default=1.0)
    parser.add_argument("--frequency-penalty", type=float, default=0.0)
    parser.add_argument("--dry-multiplier", type=float, default=0.0)
    parser.add_argument("--out", type=Path, help="default benchmarks/results/answers_*.json")
    parser.add_argument("--record", action="store_true", help="write into benchmarks/reported")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    print(f"machine: {this_machine().describe()}")
    model = MODELS[args.model]
    persona = PERSONAS.get(args.persona, args.persona)
    questions = json.loads(QUESTIONS.read_text())["questions"]
    questions = questions[: args.questions] if args.questions else questions
    gguf = prepare_gguf(model, CACHE)
    result = run(gguf, persona, questions, args)
    digest = hashlib.sha256(persona.encode()).hexdigest()[:8]
    result["persona"] = args.persona if args.persona in PERSONAS else f"custom-{digest}"
    result["counts"] = grade(result["answers"], known_grades())
    key = f"{result['persona']}/{result['sampling']['tag']}/max{args.max_tokens}"
    for a in result["answers"]:
        if a["sensible"] is None:
            print(f"UNGRADED {a['id']}: {a['question']}\n    -> {a['answer']!r}")
    print(f"{model.name} [{key}]: {result['counts']}, loops {result['loops']}")
    print(f"timing: {result['timing']}")
    described = {"name": model.name, "file": model.file, "sha256": model.sha256}
    out = args.out or RESULTS / f"answers_{model.name}_{key.replace('/', '_')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(stamped({"model": described, "run": key, **result}), indent=2))
    print(f"wrote {out}")
    if args.record:
        record(REPORTED / f"answers_{model.name}.json", described, key, result)
        print(f"recorded in {REPORTED / f'answers_{model.name}.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
