"""The answers benchmark's bookkeeping: grades come from committed files, never from a guess.

No model runs here: the grade lookup, the loop hint, the chat a question is asked as, the
splits, the question set and the reported files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.answers_bench import (
    PERSONAS,
    QUESTIONS,
    REPORTED,
    SPLITS,
    Sampling,
    clashes,
    grade,
    known_grades,
    loops,
    messages,
    normalized,
    record,
    select,
    split_counts,
)


def test_answers_are_graded_by_question_and_text_and_new_ones_stay_ungraded(
    tmp_path: Path,
) -> None:
    graded = {
        "runs": [
            {
                "answers": [
                    {"id": "legs", "answer": "A spider has\n eight legs.", "sensible": True},
                    {"id": "legs", "answer": "Six.", "sensible": False},
                    {"id": "brazil", "answer": "Portuguese.", "sensible": None},
                ]
            }
        ]
    }
    (tmp_path / "answers_m.json").write_text(json.dumps(graded))
    grades = known_grades(tmp_path)
    assert grades == {("legs", "A spider has eight legs."): True, ("legs", "Six."): False}
    answers = [
        {"id": "legs", "answer": "A spider has eight  legs."},
        {"id": "legs", "answer": "Six."},
        {"id": "brazil", "answer": "Portuguese."},  # never graded (null)
        {"id": "brazil", "answer": "Six."},  # graded, but for another question
    ]
    assert grade(answers, grades) == {"sensible": 1, "not_sensible": 1, "ungraded": 2, "of": 4}
    assert [a["sensible"] for a in answers] == [True, False, None, None]


def test_a_repeated_phrase_is_flagged_as_a_loop() -> None:
    assert loops("açaí, açaí, açaí, açaí, açaí, açaí")
    assert loops("Use a warm scarf. Use a warm scarf. Use a warm scarf.")
    assert not loops("It is big. It is big. Yes.")
    assert not loops("A spider has eight legs, and an insect has six legs.")


def test_sampling_tags_name_the_penalties() -> None:
    assert Sampling().tag() == "greedy"
    assert Sampling(repeat_penalty=1.1).tag() == "greedy+rp1.1"
    assert Sampling(frequency_penalty=0.5, dry_multiplier=0.8).tag() == "greedy+fp0.5+dry0.8"
    assert Sampling().request()["temperature"] == 0.0


def test_a_question_is_asked_after_the_persona_and_its_earlier_turns() -> None:
    alone = {"id": "legs", "q": "How many legs does a spider have?"}
    assert messages("Be brief.", alone) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "How many legs does a spider have?"},
    ]
    follow_up = {
        "id": "oven",
        "turns": [
            {"role": "user", "content": "How do I make banana bread?"},
            {"role": "assistant", "content": "Mash bananas, mix, and bake it."},
        ],
        "q": "and how long in the oven?",
    }
    assert [(m["role"], m["content"]) for m in messages("Be brief.", follow_up)] == [
        ("system", "Be brief."),
        ("user", "How do I make banana bread?"),
        ("assistant", "Mash bananas, mix, and bake it."),
        ("user", "and how long in the oven?"),
    ]
    assert follow_up["turns"][0] is not messages("Be brief.", follow_up)[1]  # a copy


def test_answers_are_counted_per_split_and_splits_are_chosen_in_file_order() -> None:
    answers: list[dict[str, Any]] = [
        {"id": "a", "split": "safety", "sensible": True},
        {"id": "b", "split": "held_out", "sensible": False},
        {"id": "c", "split": "held_out", "sensible": None},
        {"id": "d", "sensible": True},  # recorded before the splits: a tuning question
    ]
    assert split_counts(answers) == {
        "tuning": {"sensible": 1, "not_sensible": 0, "ungraded": 0, "of": 1},
        "held_out": {"sensible": 0, "not_sensible": 1, "ungraded": 1, "of": 2},
        "safety": {"sensible": 1, "not_sensible": 0, "ungraded": 0, "of": 1},
    }
    questions = [
        {"id": "t1", "split": "tuning"},
        {"id": "h1", "split": "held_out"},
        {"id": "s1", "split": "safety"},
        {"id": "h2", "split": "held_out"},
    ]
    assert [q["id"] for q in select(questions, None)] == ["t1", "h1", "s1", "h2"]
    assert [q["id"] for q in select(questions, ["safety", "held_out"])] == ["h1", "s1", "h2"]
    assert [q["id"] for q in select(questions, ["held_out"], first=1)] == ["h1"]


def test_a_recorded_run_replaces_its_key_keeps_notes_and_never_another_persona(
    tmp_path: Path,
) -> None:
    path = tmp_path / "answers_m.json"
    model = {"name": "m", "file": "m.gguf", "sha256": "0" * 64}
    wrong = {"id": "legs", "answer": "Six.", "sensible": False, "why": "six"}
    record(path, model, "p/greedy/max80", {"persona_text": "Be brief.", "answers": [wrong]})
    again = {"id": "legs", "answer": "Six.", "sensible": False}
    record(path, model, "p/greedy/max80", {"persona_text": "Be brief.", "answers": [again]})
    runs = json.loads(path.read_text())["runs"]
    assert [r["run"] for r in runs] == ["p/greedy/max80"]
    assert runs[0]["answers"][0]["why"] == "six"
    assert clashes(path, "p/greedy/max80", "Be long.")  # main refuses before the run
    assert not clashes(path, "p/greedy/max80", "Be brief.")
    assert not clashes(path, "q/greedy/max80", "Be long.")
    with pytest.raises(ValueError):
        record(path, model, "p/greedy/max80", {"persona_text": "Be long.", "answers": []})


def test_the_question_set_and_the_reported_grades_are_well_formed() -> None:
    questions = json.loads(QUESTIONS.read_text())["questions"]
    ids = [q["id"] for q in questions]
    assert len(set(ids)) == len(ids)
    assert all(q["q"].strip() and q["expect"].strip() for q in questions)
    splits = [q["split"] for q in questions]
    assert set(splits) == set(SPLITS)
    assert splits == sorted(splits, key=SPLITS.index)  # tuning first: its answers stay the same
    assert splits.count("tuning") == 48  # the personas were chosen on these; never add to them
    assert splits.count("held_out") >= 30 and splits.count("safety") >= 20
    multi_turn = [q for q in questions if "turns" in q]
    assert len([q for q in multi_turn if q["split"] == "held_out"]) >= 8
    for q in multi_turn:
        roles = [t["role"] for t in q["turns"]]
        assert roles and roles == ["user", "assistant"] * (len(roles) // 2), q["id"]
        assert all(t["content"].strip() for t in q["turns"]), q["id"]
    assert set(PERSONAS) >= {"server", "spoken"}
    split_of = dict(zip(ids, splits, strict=True))
    for path in sorted(REPORTED.glob("answers_*.json")):
        data = json.loads(path.read_text())
        assert data["machine_line"] and data["model"]["sha256"]
        for run in data["runs"]:
            assert {a["id"] for a in run["answers"]} <= set(ids), path
            assert all(isinstance(a["sensible"], bool) for a in run["answers"]), path
            assert all(a.get("split", "tuning") == split_of[a["id"]] for a in run["answers"])
            sensible = sum(a["sensible"] for a in run["answers"])
            assert run["counts"]["sensible"] == sensible, (path, run["run"])
            if "split_counts" in run:
                assert run["split_counts"] == split_counts(run["answers"]), (path, run["run"])
    assert normalized(" a\n b ") == "a b"


def test_one_answer_has_one_grade_across_all_reported_runs() -> None:
    grades: dict[tuple[str, str], bool] = {}
    for path in sorted(REPORTED.glob("answers_*.json")):
        for run in json.loads(path.read_text())["runs"]:
            for a in run["answers"]:
                key = (a["id"], normalized(a["answer"]))
                assert grades.setdefault(key, a["sensible"]) == a["sensible"], (path, key)
