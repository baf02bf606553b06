"""The submissions folder of ``tinytf grade``: ``SUBMISSIONS/<student>/<exNN_name>.ipynb`` (or
nbgrader's collected ``SUBMISSIONS/<student>/<exNN>/<exNN_name>.ipynb``): which folders are students
(:func:`student_folders`), each student's safe nbgrader id (:func:`safe_id`), which file is the
submission (:func:`find_submission`) and the copy nbgrader grades (:func:`for_nbgrader`)."""

from __future__ import annotations

import re
from pathlib import Path

from .shard import in_shard

__all__ = ["student_folders", "safe_id", "find_submission", "for_nbgrader"]

_STUDENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,127}$")


def student_folders(submissions: Path, shard: tuple[int, int] | None = None) -> list[Path]:
    """The students' folders of ``submissions`` (hidden ones skipped), sorted; with ``shard=(K, N)``
    only those of shard K of N (:func:`tinytf.course.shard.in_shard`)."""
    students = sorted(p for p in submissions.iterdir() if p.is_dir() and not p.name.startswith("."))
    if shard is not None:
        students = [p for p in students if in_shard(p.name, *shard)]
    return students


def safe_id(name: str) -> str:
    """``name`` when it is a safe nbgrader student id, else a readable safe id with a hash suffix."""
    if _STUDENT.match(name):
        return name
    import hashlib

    return "s_" + re.sub(r"[^A-Za-z0-9_.@+-]", "_", name)[:60] + "_" + hashlib.sha1(name.encode()).hexdigest()[:8]


def find_submission(student_dir: Path, ex: str, name: str) -> Path | None:
    """A student's submission of ``ex`` (file ``name``): ``name`` or ``ex/name`` in ``student_dir``,
    else the one ``ex*.ipynb`` there or in ``ex/`` (None when there is none, or more than one)."""
    for cand in (student_dir / name, student_dir / ex / name):
        if cand.is_file():
            return cand
    matches = sorted(p for p in student_dir.glob(f"{ex}*.ipynb") if p.is_file())
    matches += sorted(p for p in student_dir.glob(f"{ex}/{ex}*.ipynb") if p.is_file())
    return matches[0] if len(matches) == 1 else None


def for_nbgrader(nb: dict, known: set[str]) -> dict:
    """The copy nbgrader grades: cells whose grade_id the source does not know (renamed, invented) or whose
    nbgrader metadata is malformed become ordinary cells, so one bad cell cannot stop the whole notebook."""
    for cell in nb.get("cells", []):
        meta = cell.get("metadata")
        if not isinstance(meta, dict) or "nbgrader" not in meta:
            continue
        nbg = meta["nbgrader"]
        if not isinstance(nbg, dict) or nbg.get("grade_id") not in known:
            del meta["nbgrader"]
    return nb
