"""The student corpus (``tests/corpus/exNN/<case>.json``) as students' submissions: shared by
test_corpus.py (one grading run) and test_corpus_validate.py (validate on each case), which
``make unit`` runs on different xdist workers (``--dist loadfile``)."""

from __future__ import annotations

import json
from pathlib import Path

import _coursekit as K

from tinytf.course.exercises import REPO, find_notebooks

CORPUS = REPO / "tests" / "corpus"
CASES = sorted(CORPUS.glob("ex[0-9][0-9]/*.json"))
RELEASED, SOLUTIONS = find_notebooks(REPO / "exercises"), find_notebooks(REPO / "solutions")


def case_id(path: Path) -> str:
    return f"{path.parent.name}-{path.stem}"


def student_notebook(case: dict) -> dict:
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


def write_submissions(folder: Path) -> None:
    for path in CASES:
        case = json.loads(path.read_text(encoding="utf-8"))
        (folder / case_id(path)).mkdir(parents=True)
        (folder / case_id(path) / RELEASED[case["exercise"]].name).write_text(json.dumps(student_notebook(case)), encoding="utf-8")


def submissions(tmp_path_factory) -> Path:
    """Every case as a student's folder: written once per test run, shared by both xdist workers."""
    return K.once_per_run(tmp_path_factory, "corpus-submissions", write_submissions)
