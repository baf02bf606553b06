"""The student corpus end to end: ``tinytf validate`` and ``tinytf grade`` give every case its verdict.

Each ``tests/corpus/exNN/<case>.json`` is a student's notebook: the released exercise with every
solution region filled in from the instructor notebook, then the case's cells (the student's own code,
keyed by the cell's nbgrader grade id) put in. For each case:

- ``tinytf validate`` is clean exactly when the case says so, names the listed pitfalls (by catalog
  name) and says the listed words;
- one ``tinytf grade`` run over the whole corpus gives the case its status and autograded points;
- the promise of the self-check: a notebook that validates clean earns every autograded point.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import _coursekit as K
import pytest

from tinytf.checks import Pitfall
from tinytf.course.grade import grade
from tinytf.course.messages import say
from tinytf.course.nbgrader_root import REPO, find_notebooks
from tinytf.course.validate import format_report, validate

pytestmark = pytest.mark.grading  # real validate/grade runs: make unit, not make test-fast

CORPUS = REPO / "tests" / "corpus"
CASES = sorted(CORPUS.glob("ex[0-9][0-9]/*.json"))
RELEASED, SOLUTIONS = find_notebooks(REPO / "exercises"), find_notebooks(REPO / "solutions")


def _case_id(path: Path) -> str:
    return f"{path.parent.name}-{path.stem}"


def _student_notebook(case: dict) -> dict:
    """The released notebook as this student hands it in."""
    ex = case["exercise"]
    nb = K.solved(K.load(RELEASED[ex]), K.load(SOLUTIONS[ex]))
    found = set()
    for cell in nb["cells"]:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid in case["cells"]:
            cell["source"], _ = case["cells"][gid], found.add(gid)
    missing = set(case["cells"]) - found
    assert not missing, f"{ex}: the corpus names cells the released notebook does not have: {sorted(missing)}"
    return nb


def _write_submissions(folder: Path) -> None:
    for path in CASES:
        case = json.loads(path.read_text(encoding="utf-8"))
        (folder / _case_id(path)).mkdir(parents=True)
        (folder / _case_id(path) / RELEASED[case["exercise"]].name).write_text(json.dumps(_student_notebook(case)), encoding="utf-8")


@pytest.fixture(scope="module")
def submissions(tmp_path_factory) -> Path:
    """Every case as a student's folder: written once per test run, shared by both xdist workers."""
    return K.once_per_run(tmp_path_factory, "corpus-submissions", _write_submissions)


def _grade_corpus(submissions: Path):
    exercises = sorted({json.loads(p.read_text(encoding="utf-8"))["exercise"] for p in CASES})
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
    for p in CASES:
        case = json.loads(p.read_text(encoding="utf-8"))
        assert case["exercise"] == p.parent.name, f"{p}: exercise {case['exercise']!r} in folder {p.parent.name}"
        by_ex.setdefault(case["exercise"], []).append(case)
    assert set(by_ex) == set(RELEASED), f"exercises without a corpus: {sorted(set(RELEASED) - set(by_ex))}"
    for ex, cases in by_ex.items():
        assert sum(not c["validate"]["clean"] for c in cases) >= 2, f"{ex}: at least two wrong answers"
        assert any(c["validate"]["clean"] and not c["cells"] for c in cases), f"{ex}: the solution itself is a case"


# each exercise's validate runs form an xdist group of their own, so that both workers share them
# (the grading run of the whole corpus stays with this file's other tests: they read its gradebook)
VALIDATE_CASES = [pytest.param(p, id=_case_id(p), marks=pytest.mark.xdist_group(f"corpus-validate-{p.parent.name}")) for p in CASES]


@pytest.mark.parametrize("path", VALIDATE_CASES)
def test_validate_gives_the_expected_verdict(path, submissions):
    case = json.loads(path.read_text(encoding="utf-8"))
    nb = submissions / _case_id(path) / RELEASED[case["exercise"]].name
    report = validate(nb, released_dir=REPO / "exercises")
    text = format_report(report)
    want = case["validate"]
    clean = report.ok and not report.findings
    assert clean == want["clean"], f"{_case_id(path)} ({case['about']}): validate said\n{text}"
    named = {int(f["pitfall"]) for f in report.findings}
    for name in want["pitfalls"]:
        assert int(Pitfall[name]) in named, f"{_case_id(path)}: validate must name {name}; it said\n{text}"
    for words in want["says"]:
        assert words in text, f"{_case_id(path)}: validate must say {words!r}; it said\n{text}"
    assert "without encryption" not in text
    _assert_each_finding_prints_its_own_fix(report, text)
    assert report.self_check_ok == report.ok, (
        f"{_case_id(path)}: the notebook's self-check says {'OK' if report.self_check_ok else 'FAILED'} but validate "
        f"says {'OK' if report.ok else 'FAILED'} — a student must never get green from one and red from the other\n{text}")


def _assert_each_finding_prints_its_own_fix(report, text: str) -> None:
    """A finding with its own fix prints that fix (in the report's language) as its fix line, never the catalog's."""
    lines = text.splitlines()
    for f in report.findings:
        own = f.get("fix")  # said in the report's language by the catalog, like title and evidence
        if not own:
            continue
        start = next(i for i, line in enumerate(lines) if line.startswith("  x [") and line.endswith(f" {f['title']}"))
        block = lines[start + 1 : next((j for j in range(start + 1, len(lines)) if not lines[j].startswith("      ")), len(lines))]
        assert block[-1] == "      " + say("fix", report.lang, fix=own), f"{f['title']}: its own fix must be its fix line\n{text}"
        pitfall = Pitfall(int(f["pitfall"]))
        if pitfall:
            catalog = pitfall.entry.fix_zh if report.lang == "zh" else pitfall.fix.replace("`", "")
            assert catalog not in "\n".join(block), f"{f['title']}: the catalog's fix {catalog!r} is wrong here\n{text}"


@pytest.mark.parametrize("path", CASES, ids=_case_id)
def test_grade_gives_the_expected_status_and_points(path, graded):
    case = json.loads(path.read_text(encoding="utf-8"))
    got = graded[(_case_id(path), case["exercise"])]
    want = case["grade"]
    assert (got["status"], got["points"], got["max_points"]) == (want["status"], want["score"], want["max_score"]), (
        f"{_case_id(path)} ({case['about']}): graded {got}, expected {want}")
    if case["validate"]["clean"]:
        assert got["points"] == got["max_points"], "a notebook that validates clean earns every autograded point"
