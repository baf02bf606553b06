"""The released test cells an exercise check runs: where the released notebook of an edition is, whether a
notebook is an instructor source, and the notebook to execute with the released tests restored. Shared by
``tinytf validate`` (:mod:`tinytf.course.check.validate`) and the self-check (:mod:`tinytf.course.check.selfcheck`)."""

from __future__ import annotations

import copy
import os
from pathlib import Path

from ..build.release import earlier_release
from ..exercises import EDITION_FOLDERS, REPO
from ..ipynb import cell_source, is_test_cell, nbgrader_meta
from ..messages import say
from .report import Report

__all__ = ["find_released", "released_folder", "is_source", "restore_tests"]


def find_released(ex: str, released_dir: Path) -> Path | None:
    """The released notebook of exercise ``ex`` in ``released_dir`` (``exNN_*.ipynb``), or None."""
    hits = sorted(released_dir.glob(f"{ex}_*.ipynb")) + sorted(released_dir.glob(f"{ex}.ipynb"))
    return hits[0] if hits else None


def is_source(nb: dict) -> bool:
    """An instructor source (``solutions/``), not a student's copy: a solution cell still holds nbgrader's
    ``### BEGIN SOLUTION`` region (release replaces every one of them by ``raise NotImplementedError()``)."""
    return any(nbgrader_meta(c).get("solution") and "### BEGIN SOLUTION" in cell_source(c) for c in nb.get("cells", []))


def restore_tests(student: dict, released: dict | None, report: Report,
                  manifest: dict | None = None) -> tuple[dict, list[tuple[str, float]]]:
    """The notebook to execute (released tests restored) and the ``(grade_id, points)`` to report on.

    An instructor source (:func:`is_source`) is checked as a source: its own test cells, hidden tests
    included, run as written, and none is compared with the release. A test cell that differs from
    today's release but matches an earlier one (``manifest``: :func:`tinytf.course.build.release.load_manifest`)
    is not edited: today's version runs, and a note says so.
    """
    nb = copy.deepcopy(student)
    for cell in nb["cells"]:
        cell["source"] = cell_source(cell)
    report.source = is_source(nb)
    if released is None or report.source:
        tests = [(nbgrader_meta(c)["grade_id"], float(nbgrader_meta(c).get("points", 0))) for c in nb["cells"] if is_test_cell(c)]
        return nb, tests
    rel_cells = released["cells"]
    tests = [(nbgrader_meta(c)["grade_id"], float(nbgrader_meta(c).get("points", 0))) for c in rel_cells if is_test_cell(c)]
    if rel_cells and not any(nbgrader_meta(c) for c in nb["cells"]):
        report.structure.append(say("stripped", report.lang))
    by_id = {nbgrader_meta(c).get("grade_id"): c for c in nb["cells"] if nbgrader_meta(c).get("grade_id")}
    for i, rel in enumerate(rel_cells):
        gid = nbgrader_meta(rel).get("grade_id")
        if not gid or not nbgrader_meta(rel).get("locked"):
            continue
        mine = by_id.get(gid)
        if mine is None:
            if is_test_cell(rel):
                report.structure.append(say("deleted", report.lang, gid=gid))
                report.problems[gid] = "deleted"
            # put the released cell back after its predecessor so the run matches grading
            before = [nbgrader_meta(c).get("grade_id") for c in rel_cells[:i]]
            prev = next((g for g in reversed(before) if g in by_id), None)
            idx = next((j + 1 for j, c in enumerate(nb["cells"]) if prev and nbgrader_meta(c).get("grade_id") == prev), len(nb["cells"]))
            restored = copy.deepcopy(rel)
            restored["source"] = cell_source(rel)
            nb["cells"].insert(idx, restored)
            by_id[gid] = restored
        elif cell_source(mine).strip() != cell_source(rel).strip():
            if is_test_cell(rel) and earlier_release(manifest or {}, report.exercise, gid, cell_source(mine)):
                report.notes.append(say("earlier_release", report.lang, gid=gid, ex=report.exercise))
                report.problems[gid] = "earlier release"
            elif is_test_cell(rel):
                report.structure.append(say("edited", report.lang, gid=gid))
                report.problems[gid] = "edited"
            mine["source"] = cell_source(rel)
    return nb, tests


def released_folder(lang: str, released_dir: str | os.PathLike | None) -> Path:
    """Where the released version of a notebook of edition ``lang`` is: ``exercises/`` or ``exercises/zh/``."""
    if released_dir:
        return Path(released_dir)
    return REPO / EDITION_FOLDERS.get(lang, EDITION_FOLDERS["en"])[1]
