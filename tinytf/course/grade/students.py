"""The class ``tinytf grade`` grades: its students' folders and submissions, and the shards of a class too big for one machine.

``SUBMISSIONS/<student>/<exNN_name>.ipynb`` (or nbgrader's ``SUBMISSIONS/<student>/<exNN>/<exNN_name>.ipynb``): the
students' folders (:func:`student_folders`), their safe nbgrader ids (:func:`safe_id`), the submission
(:func:`find_submission`) and the copy nbgrader grades (:func:`for_nbgrader`).

Shards (``tinytf grade --shard K/N`` per machine, then ``tinytf gradebook merge``): a student belongs to shard
``int(sha256(folder name)) mod N``, so adding students never moves existing ones; ``--shard auto/N`` takes K from
``SLURM_ARRAY_TASK_ID`` (a Slurm array) or ``JOB_COMPLETION_INDEX`` (a Kubernetes Indexed Job). A sharded run
writes ``OUT/shard.json``; :func:`merge` checks the shards against each other (same N and exercises, every K once,
no student twice) and writes exactly the gradebook one run over everyone writes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..ipynb import write_atomic
from .gradebook import ExerciseResult, read_gradebook, write_gradebook

__all__ = ["SHARD_ENV", "shard_of", "in_shard", "parse_shard", "write_shard_info", "merge", "student_folders", "safe_id",
           "find_submission", "for_nbgrader"]

SHARD_ENV = ("SLURM_ARRAY_TASK_ID", "JOB_COMPLETION_INDEX")
_INFO = "shard.json"


def shard_of(student: str, n: int) -> int:
    """The shard (0 … n-1) of ``student`` (a submission folder name)."""
    return int.from_bytes(hashlib.sha256(student.encode("utf-8")).digest(), "big") % n


def in_shard(student: str, k: int, n: int) -> bool:
    """Whether ``student`` is graded by shard ``k`` of ``n``."""
    return shard_of(student, n) == k


def parse_shard(spec: str, env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """``(K, N)`` from ``"K/N"`` or ``"auto/N"`` (K from $SLURM_ARRAY_TASK_ID or $JOB_COMPLETION_INDEX)."""
    env = os.environ if env is None else env
    k_text, sep, n_text = spec.partition("/")
    if not sep or not n_text.strip().isdigit() or int(n_text) < 1:
        raise ValueError(f"--shard {spec!r}: expected K/N or auto/N with N >= 1, e.g. 0/4 or auto/4")
    n = int(n_text)
    if k_text.strip() == "auto":
        found = [(name, env[name]) for name in SHARD_ENV if env.get(name, "").strip()]
        if not found:
            raise ValueError(f"--shard auto/{n}: neither {' nor '.join(SHARD_ENV)} is set; run it as a Slurm array task "
                             f"(--array=0-{n - 1}) or a Kubernetes Indexed Job, or give the index: --shard K/{n}")
        name, k_text = found[0]
        source = f"${name}={k_text}"
    else:
        source = f"--shard {spec}"
    if not k_text.strip().isdigit():
        raise ValueError(f"{source}: the shard index must be a whole number from 0 to {n - 1}")
    k = int(k_text)
    if k >= n:
        raise ValueError(f"{source}: shard index {k} is not below the number of shards {n} (indices are 0 … {n - 1})")
    return k, n


def write_shard_info(out: Path, shard: tuple[int, int], exercises: Sequence[str], students: Sequence[str]) -> None:
    """``OUT/shard.json``: which shard this gradebook is, for :func:`merge` to check."""
    info = {"shard": shard[0], "of": shard[1], "exercises": sorted(exercises), "students": sorted(students)}
    write_atomic(Path(out) / _INFO, json.dumps(info, indent=1, sort_keys=True) + "\n")


def _info(folder: Path, results: list[ExerciseResult]) -> dict:
    path = folder / _INFO
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    return {"shard": None, "of": None, "exercises": sorted({r.exercise for r in results}),
            "students": sorted({r.student for r in results})}


def _check(folders: list[Path], infos: list[dict], results: list[list[ExerciseResult]]) -> None:
    """ValueError naming the problem when the gradebooks are not the disjoint shards of one run."""
    exercise_sets = {tuple(i["exercises"]) for i, r in zip(infos, results) if r or i["shard"] is not None}
    if len(exercise_sets) > 1:
        listing = "; ".join(f"{f}: {' '.join(i['exercises']) or '(none)'}" for f, i in zip(folders, infos))
        raise ValueError(f"the gradebooks graded different exercises ({listing}); grade every shard with the same --exercises")
    seen: dict[str, Path] = {}
    for folder, info in zip(folders, infos):
        for student in info["students"]:
            if student in seen:
                raise ValueError(f"student {student!r} is in both {seen[student]} and {folder}: overlapping shards "
                                 "(the same shard twice, or different N?)")
            seen[student] = folder
    max_scores: dict[str, set[float]] = {}
    for rs in results:
        for r in rs:
            max_scores.setdefault(r.exercise, set()).add(r.max_score)
    if any(len(v) > 1 for v in max_scores.values()):
        raise ValueError(f"the shards disagree on the points of an exercise ({max_scores}): they were graded against different solutions")
    sharded = [i for i in infos if i["shard"] is not None]
    if sharded:
        ns = {i["of"] for i in sharded}
        if len(ns) > 1 or len(sharded) != len(infos):
            raise ValueError(f"the gradebooks are shards of different splits (N = {sorted(ns)}) or mix sharded and unsharded runs")
        ks = sorted(i["shard"] for i in sharded)
        (n,) = ns
        missing = sorted(set(range(n)) - set(ks))
        if missing or len(ks) != len(set(ks)):
            raise ValueError(f"shards of N={n}: got {ks}; every shard 0 … {n - 1} exactly once is needed (missing: {missing})")


def merge(folders: Sequence[str | Path], out: str | Path) -> list[ExerciseResult]:
    """Merge the gradebooks in ``folders`` into ``out`` (grades.csv, grades_per_cell.csv, feedback/, summary.txt)."""
    folders = [Path(f) for f in folders]
    if not folders:
        raise ValueError("nothing to merge: give the shards' output folders")
    results = [read_gradebook(f) for f in folders]
    infos = [_info(f, r) for f, r in zip(folders, results)]
    _check(folders, infos, results)
    merged = [r for rs in results for r in rs]
    write_gradebook(merged, Path(out))
    return sorted(merged, key=lambda r: (r.student, r.exercise))


_STUDENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,127}$")


def student_folders(submissions: Path, shard: tuple[int, int] | None = None) -> list[Path]:
    """The students' folders of ``submissions`` (hidden ones skipped), sorted; with ``shard=(K, N)``
    only those of shard K of N (:func:`tinytf.course.grade.students.in_shard`)."""
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
