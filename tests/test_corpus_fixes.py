"""Every diagnosis in the corpus prints a fix that works: applied to the case, the finding disappears.

Each wrong case ``tests/corpus/exNN/<case>.json`` carries, next to the student's ``cells``, its
``fixed`` version — ``{grade_id: [[old, new], ...]}``, the edits that the printed fix asks for, applied
to the student's own cell — and ``fix``, the words of the fix line the diagnosis prints for it. In one
namespace per exercise (the instructor notebook executed once, cell by cell, the way a kernel runs it),
the student's cells are put in and the exercise's diagnosis (``tinytf.course.reference.exNN.diagnose``,
what the self-check and ``tinytf validate`` print) runs: it names the case's pitfalls and prints the
case's fix; then the fixed cells are put in and the same diagnosis finds nothing. No kernel per case:
the diagnosis runs in this process, on the case's code.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import matplotlib
import nbformat
import pytest
import torch

from tinytf.checks import Pitfall
from tinytf.course.check.report import finding_lines
from tinytf.course.check.selfcheck import finding_json
from tinytf.course.exercises import EXERCISES, REFERENCE_MODULES

matplotlib.use("Agg")

pytestmark = pytest.mark.grading  # executes each instructor notebook once: make unit, not make test-fast

ROOT = Path(__file__).resolve().parents[1]
WRONG = sorted(p for p in (ROOT / "tests" / "corpus").glob("ex[0-9][0-9]/*.json")
               if not json.loads(p.read_text(encoding="utf-8"))["validate"]["clean"])


def _solution(ex: str) -> list[Any]:
    (path,) = (ROOT / "solutions").glob(f"{ex}_*.ipynb")
    return [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


def _run(ns: dict[str, Any], source: str, name: str) -> None:
    try:
        exec(compile(source, f"<{name}>", "exec"), ns)  # noqa: S102 - our notebook and the corpus's code
    except Exception:  # noqa: BLE001 - a student's broken cell is the diagnosis's business, as in a kernel
        pass


class Notebook:
    """The instructor notebook of one exercise, executed once (its test cells and the self-check left out)."""

    def __init__(self, ex: str) -> None:
        self.ex, self.ns = ex, {"__name__": "__main__"}
        self.sources = {}
        for cell in _solution(ex):
            meta = cell.metadata.get("nbgrader", {})
            if (meta.get("grade") and not meta.get("solution")) or "self_check(" in cell.source:
                continue
            if meta.get("grade_id"):
                self.sources[meta["grade_id"]] = cell.source
            _run(self.ns, cell.source, meta.get("grade_id", "cell"))

    def diagnose(self, cells: dict[str, str]) -> list[dict[str, Any]]:
        """The diagnosis's findings (as validate reads them) with ``cells`` put in; the solution's back after."""
        for gid, source in cells.items():
            assert gid in self.sources, f"{self.ex}: no solution cell {gid}"
            _run(self.ns, source, gid)
        try:
            torch.manual_seed(0)  # the judges' fresh inputs: the same on every run
            findings = importlib.import_module(REFERENCE_MODULES[self.ex]).diagnose(self.ns)
            return [json.loads(json.dumps(finding_json(f))) for f in findings]
        finally:
            for gid in cells:
                _run(self.ns, self.sources[gid], gid)


@pytest.fixture(scope="module")
def notebooks() -> dict[str, Notebook]:
    return {}


def _fixed(case: dict[str, Any]) -> dict[str, str]:
    cells = dict(case["cells"])
    for gid, edits in case["fixed"].items():
        for old, new in edits:
            assert cells[gid].count(old) == 1, f"the fix's edit {old!r} must match the student's {gid} exactly once"
            cells[gid] = cells[gid].replace(old, new)
    return cells


def test_every_wrong_case_of_every_exercise_carries_its_fix():
    assert len(WRONG) >= 2 * len(EXERCISES), [p.name for p in WRONG]
    for path in WRONG:
        case = json.loads(path.read_text(encoding="utf-8"))
        assert case.get("fixed") and case.get("fix"), f"{path.parent.name}/{path.name}: a wrong case carries 'fixed' and 'fix'"
        assert set(case["fixed"]) <= set(case["cells"]), f"{path.name}: the fix edits the student's own cells"


@pytest.mark.parametrize("path", WRONG, ids=lambda p: f"{p.parent.name}-{p.stem}")
def test_the_printed_fix_applied_to_the_case_makes_its_finding_disappear(path, notebooks):
    case = json.loads(path.read_text(encoding="utf-8"))
    ex = case["exercise"]
    nb = notebooks[ex] if ex in notebooks else notebooks.setdefault(ex, Notebook(ex))
    wrong = nb.diagnose(case["cells"])
    text = "\n".join(line for f in wrong for lang in ("en", "zh") for line in finding_lines(f, lang))
    assert wrong, f"{path.stem}: the diagnosis finds nothing in the wrong case"
    for name in case["validate"]["pitfalls"]:
        assert int(Pitfall[name]) in {f["pitfall"] for f in wrong}, f"{path.stem}: must name {name}:\n{text}"
    for f in wrong:  # a fix line in both editions: the finding's own, or its catalog pitfall's where that fits
        assert f.get("fix") or f["pitfall"], f"{path.stem}: {f['title']!r} names no pitfall and carries no fix of its own"
        zh = finding_lines(f, "zh")
        assert any(line.strip().startswith("修复：") for line in zh), f"{path.stem}: {f['title']!r}: no Chinese fix line"
    fix_lines = [line.strip() for f in wrong for line in finding_lines(f, "en")[1:]]
    assert any(case["fix"] in line for line in fix_lines), f"{path.stem}: the diagnosis must print the fix {case['fix']!r}:\n{text}"
    fixed = nb.diagnose(_fixed(case))
    assert fixed == [], (f"{path.stem}: with the fix applied the diagnosis still finds "
                         + "\n".join(f"{f['title']}: {f['message']}" for f in fixed))
