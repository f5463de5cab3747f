"""The answers benchmark's bookkeeping: grades come from committed files, never from a guess.

No model runs here: the grade lookup, the loop hint, the question set and the reported files.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.answers_bench import (
    PERSONAS,
    QUESTIONS,
    REPORTED,
    Sampling,
    grade,
    known_grades,
    loops,
    normalized,
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


def test_the_question_set_and_the_reported_grades_are_well_formed() -> None:
    questions = json.loads(QUESTIONS.read_text())["questions"]
    assert len(questions) >= 40
    ids = [q["id"] for q in questions]
    assert len(set(ids)) == len(ids)
    assert all(q["q"].strip() and q["expect"].strip() for q in questions)
    assert set(PERSONAS) >= {"server", "spoken"}
    for path in sorted(REPORTED.glob("answers_*.json")):
        data = json.loads(path.read_text())
        assert data["machine_line"] and data["model"]["sha256"]
        for run in data["runs"]:
            assert {a["id"] for a in run["answers"]} <= set(ids), path
            assert all(isinstance(a["sensible"], bool) for a in run["answers"]), path
            sensible = sum(a["sensible"] for a in run["answers"])
            assert run["counts"]["sensible"] == sensible, (path, run["run"])
    assert normalized(" a\n b ") == "a b"


def test_one_answer_has_one_grade_across_all_reported_runs() -> None:
    grades: dict[tuple[str, str], bool] = {}
    for path in sorted(REPORTED.glob("answers_*.json")):
        for run in json.loads(path.read_text())["runs"]:
            for a in run["answers"]:
                key = (a["id"], normalized(a["answer"]))
                assert grades.setdefault(key, a["sensible"]) == a["sensible"], (path, key)
