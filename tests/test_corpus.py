"""The student corpus through ``tinytf grade``: every case gets its status and autograded points.

Each ``tests/corpus/exNN/<case>.json`` is a student's notebook: the released exercise with every
solution region filled in from the instructor notebook, then the case's cells (the student's own code,
keyed by the cell's nbgrader grade id) put in (tests/_corpus.py). For each case:

- one ``tinytf grade`` run over the whole corpus gives the case its status and autograded points
  (``tinytf validate`` on each case: test_corpus_validate.py, on the other xdist worker);
- the promise of the self-check: a notebook that validates clean earns every autograded point.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import _corpus as C
import _coursekit as K
import pytest

from tinytf.course.grade.run import grade

pytestmark = pytest.mark.grading  # a real grading run: make unit, not make test-fast


@pytest.fixture(scope="module")
def submissions(tmp_path_factory) -> Path:
    return C.submissions(tmp_path_factory)


def _grade_corpus(submissions: Path):
    exercises = sorted({json.loads(p.read_text(encoding="utf-8"))["exercise"] for p in C.CASES})
    return lambda out: grade(submissions, out, exercises=exercises, jobs=2, timeout=60, notebook_timeout=300, progress=False)


@pytest.fixture(scope="module")
def graded(submissions, tmp_path_factory) -> dict[tuple[str, str], dict]:
    """``{(student, exercise): {"status", "points", "max_points"}}`` over the autograded cells: one grading
    run of the whole corpus per test run (kept on disk, so a second set-up of this fixture reads it)."""
    out = K.once_per_run(tmp_path_factory, "corpus-graded", _grade_corpus(submissions))
    with (out / "grades.csv").open(newline="", encoding="utf-8") as f:
        status = {(r["student"], r["exercise"]): r["status"] for r in csv.DictReader(f)}
    result: dict[tuple[str, str], dict] = {}
    with (out / "grades_per_cell.csv").open(newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            if r["status"] == "needs-manual-grade":
                continue  # written answers: an instructor's points, not the autograder's
            row = result.setdefault((r["student"], r["exercise"]), {"status": status[(r["student"], r["exercise"])],
                                                                   "points": 0.0, "max_points": 0.0})
            row["points"] += float(r["points"])
            row["max_points"] += float(r["max_points"])
    return result


def test_the_corpus_covers_every_exercise_with_two_wrong_answers_and_the_solution():
    by_ex: dict[str, list[dict]] = {}
    for p in C.CASES:
        case = json.loads(p.read_text(encoding="utf-8"))
        assert case["exercise"] == p.parent.name, f"{p}: exercise {case['exercise']!r} in folder {p.parent.name}"
        by_ex.setdefault(case["exercise"], []).append(case)
    assert set(by_ex) == set(C.RELEASED), f"exercises without a corpus: {sorted(set(C.RELEASED) - set(by_ex))}"
    for ex, cases in by_ex.items():
        assert sum(not c["validate"]["clean"] for c in cases) >= 2, f"{ex}: at least two wrong answers"
        assert any(c["validate"]["clean"] and not c["cells"] for c in cases), f"{ex}: the solution itself is a case"


@pytest.mark.parametrize("path", C.CASES, ids=C.case_id)
def test_grade_gives_the_expected_status_and_points(path, graded):
    case = json.loads(path.read_text(encoding="utf-8"))
    got = graded[(C.case_id(path), case["exercise"])]
    want = case["grade"]
    assert (got["status"], got["points"], got["max_points"]) == (want["status"], want["score"], want["max_score"]), (
        f"{C.case_id(path)} ({case['about']}): graded {got}, expected {want}")
    if case["validate"]["clean"]:
        assert got["points"] == got["max_points"], "a notebook that validates clean earns every autograded point"
