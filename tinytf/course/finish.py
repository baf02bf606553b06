"""The clean "finish" process of ``tinytf grade``: judge each graded job and write its feedback page.

``python -I -m tinytf.course.finish --spec JOBS.json --course ROOT`` runs no student code. For every
job it decides each test cell's status from the submitted notebook (deleted, renamed or edited test
cells), nbgrader's executed notebook (errors, timeouts) and the clean-process judges
(:mod:`tinytf.course.judges`): a cell nbgrader passed whose judge fails is ``failed`` — or ``tampered``
when its record shows that checking functions had been replaced in the kernel — and one whose record
is missing (``record`` bypassed) is ``tampered``; both earn 0. It writes the feedback page
(:mod:`tinytf.course.feedback`) and the job's verdict to ``<job>/result.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from .feedback import feedback_page, sanitize_for_feedback
from .gradebook import CellResult
from .notebook import (
    cell_source,
    cells_by_id,
    first_line,
    hidden_lines,
    load_json,
    nbgrader_meta,
    skip_slow_imports,
    strip_ansi,
    strip_hidden,
    write_atomic,
)
from .release import earlier_release, load_manifest

__all__ = ["CellSpec", "grade_specs", "classify_test_cell", "judge_cells", "sanitize_for_feedback", "main"]

@dataclass(frozen=True)
class CellSpec:
    """One graded cell of an exercise: ``kind`` is "auto" (a test cell) or "manual" (a written answer)."""

    grade_id: str
    kind: str
    points: float
    visible: str  # the source students see (hidden tests removed)
    also: tuple[str, ...] = ()  # other accepted sources (the test as released to students earlier)


def grade_specs(source_nb: dict, released: dict | None = None) -> list[CellSpec]:
    """The graded cells of an instructor notebook, in order; ``released``: a student version handed out
    earlier, whose test-cell sources are accepted as unedited too."""
    earlier = {gid: strip_hidden(cell_source(c)) for gid, c in cells_by_id(released).items()} if released else {}
    specs = []
    for cell in source_nb.get("cells", []):
        meta = nbgrader_meta(cell)
        if not meta.get("grade"):
            continue
        kind = "manual" if meta.get("solution") or cell.get("cell_type") != "code" else "auto"
        gid = str(meta["grade_id"])
        also = (earlier[gid],) if gid in earlier else ()
        specs.append(CellSpec(gid, kind, float(meta.get("points", 0) or 0), strip_hidden(cell_source(cell)), also))
    return specs


def _error_line(cell: dict, tb: list[str]) -> int | None:
    """The line of ``cell`` the error passed through (from IPython's ``Cell In[n], line L``)."""
    count = cell.get("execution_count")
    text = strip_ansi("\n".join(tb))
    lines = [int(m.group(2)) for m in re.finditer(r"Cell In\[(\d+)\], line (\d+)", text) if count is not None and int(m.group(1)) == count]
    return lines[0] if lines else None


def _ran_for(cell: dict) -> float | None:
    """Seconds the cell ran, from nbclient's timing metadata (``iopub.execute_input`` to ``shell.execute_reply``)."""
    from datetime import datetime

    times = cell.get("metadata", {}).get("execution", {})
    try:
        start, end = (datetime.fromisoformat(str(times[k]).replace("Z", "+00:00")) for k in ("iopub.execute_input", "shell.execute_reply"))
    except (KeyError, ValueError):
        return None
    return max(0.0, (end - start).total_seconds())


def timeout_message(cell: dict, limit: float | None = None) -> str:
    """A cell stopped for time, in words: the limit, how long it had run, and what to do (slow is not wrong)."""
    ran = _ran_for(cell)
    return ("the cell ran past the per-cell time limit" + (f" of {limit:g} s" if limit else "")
            + (f" (it had run {ran:.0f} s)" if ran is not None else "")
            + " and was stopped: too slow, not wrong. Set fast = True in the parameters cell or use fewer steps")


def classify_test_cell(cell: dict, limit: float | None = None) -> tuple[str, str]:
    """``(status, message)`` of an executed test cell from its outputs (before judging); ``limit``: the
    per-cell time limit it ran under (said when it was stopped for time)."""
    errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    if not errors:
        return "ok", ""
    err = errors[-1]
    ename, evalue = str(err.get("ename", "Error")), strip_ansi(str(err.get("evalue", "")))
    if ename == "CellTimeoutError":
        return "timeout", timeout_message(cell, limit)
    line = _error_line(cell, list(err.get("traceback", [])))
    if line is None or line in hidden_lines(cell_source(cell)):
        where, evalue = "a hidden test", ""
    else:
        where = f"line {line}"
    msg = f"{ename}{': ' + first_line(evalue, 200) if evalue.strip() else ''} ({where})"
    return ("failed" if ename == "AssertionError" else "error"), msg


def _kernel_death(log: str) -> bool:
    return any(s in log for s in ("DeadKernelError", "Kernel died", "kernel died", "KernelDied"))


def _executed(job: Path, student: str, ex: str, name: str) -> tuple[dict, str]:
    """nbgrader's autograded notebook (or {}) and a note on why there is none."""
    sandbox = load_json(job / "sandbox.json")
    verdict = load_json(job / "autograde.json") if (job / "autograde.json").exists() else {}
    ag_path = job / "autograded" / student / ex / name
    if sandbox["timed_out"]:
        return {}, f"the notebook ran past the whole-notebook limit ({sandbox['limit']:g} s) and was stopped"
    if ag_path.exists() and verdict.get("success"):
        return load_json(ag_path), ""
    log = verdict.get("log", "") + verdict.get("error", "")
    if _kernel_death(log) or not verdict:
        return {}, "the notebook's kernel died (os._exit, a crash, or the memory limit) and grading stopped"
    return {}, "nbgrader could not grade this notebook: " + (log.strip().splitlines() or ["no log"])[-1][:200]


def _cell_status(spec: CellSpec, cell: dict | None, executed: dict[str, dict], records: dict, timed_out: bool,
                 note: str, limit: float | None = None, manifest: dict | None = None, ex: str = "") -> tuple[str, str]:
    """``(status, message)`` of one graded cell of one job; ``manifest``: every release's test cells
    (:func:`tinytf.course.release.load_manifest`), a test cell matching one of them is no edit."""
    if cell is None:
        return "missing-cell", "this test cell is missing from the submission (deleted, renamed, or metadata stripped)"
    if spec.kind == "manual":
        return "needs-manual-grade", "written answer: an instructor grades it"
    status, message = _graded_status(spec, executed, records, timed_out, note, limit)
    if cell_source(cell).strip() in {spec.visible.strip(), *(a.strip() for a in spec.also)}:
        return status, message
    if earlier_release(manifest or {}, ex, spec.grade_id, cell_source(cell)):  # not tampering: today's version ran
        return status, "; ".join(m for m in (f"this test comes from an earlier release of {ex}; today's version was run",
                                             message) if m)
    return "tampered", "this locked test cell was edited; edited test cells earn 0"


def _graded_status(spec: CellSpec, executed: dict[str, dict], records: dict, timed_out: bool, note: str,
                   limit: float | None) -> tuple[str, str]:
    """``(status, message)`` of a test cell whose source is accepted, from the run and its judge."""
    from .judges import run_judge

    if timed_out:
        return "timeout", note
    if not executed:
        return "error", note
    if spec.grade_id not in executed:
        return "missing-cell", "this test cell is missing from the graded notebook"
    status, message = classify_test_cell(executed[spec.grade_id], limit)
    if status != "ok":
        return status, message
    rec = records.get(spec.grade_id)
    if rec is None:
        return "tampered", "the cell passed but exported no result for the independent check"
    passed, why = run_judge(spec.grade_id, rec["value"], rec["inputs"])
    if not passed:
        patched = [str(x) for x in rec.get("interference") or []]
        if patched:  # evidence: the kernel's checks were replaced, so its "pass" proves nothing
            return "tampered", f"the cell passed only because {', '.join(patched)} had been replaced; the independent check: {why}"[:300]
        return "failed", f"wrong result (found by the independent check): {why}"[:300]
    return "ok", ""


def _stopped_cells(nb: dict, limit: float | None) -> list[str]:
    """The student's own cells (not test cells) that were stopped for time, in words."""
    from .notebook import describe_cell, is_test_cell

    cells = nb.get("cells", []) if nb else []
    return [f"{describe_cell(cells, i)}: {timeout_message(c, limit)}" for i, c in enumerate(cells)
            if c.get("cell_type") == "code" and not is_test_cell(c)
            and any(o.get("output_type") == "error" and o.get("ename") == "CellTimeoutError" for o in c.get("outputs", []))]


def judge_cells(job: Path, course: Path, ex: str, student: str, name: str, submission: Path) -> tuple[list[CellResult], str, dict]:
    """Per-cell results for one job, a one-line note, and the autograded notebook (or {})."""
    from .record import load_records

    also_path = course / "released-earlier" / name
    specs = grade_specs(load_json(course / "source" / ex / name), load_json(also_path) if also_path.exists() else None)
    submitted = cells_by_id(load_json(submission))
    autograded, note = _executed(job, student, ex, name)
    if not submitted:
        note = (note + "; " if note else "") + "the submission has no nbgrader cell metadata (stripped?)"
    records = load_records(job / "records")
    executed = cells_by_id(autograded)
    timed_out = bool(load_json(job / "sandbox.json")["timed_out"])
    config = job.parent / f"{student}__{ex}.nbgrader.json"
    limit = load_json(config).get("Execute", {}).get("timeout") if config.exists() else None
    note = "; ".join(x for x in (note, *_stopped_cells(autograded, limit)) if x)
    manifest = load_manifest(course / "released-earlier")
    results = []
    for spec in specs:
        status, message = _cell_status(spec, submitted.get(spec.grade_id), executed, records, timed_out, note, limit,
                                       manifest, ex)
        results.append(CellResult(student, ex, spec.grade_id, spec.points if status == "ok" else 0.0, spec.points, status, message))
    return results, note, autograded


def _load_judge_files(files: Iterable[str]) -> None:
    for i, path in enumerate(files):
        spec = importlib.util.spec_from_file_location(f"_tinytf_extra_judges_{i}", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load judges from {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _finish_one(item: dict, course: Path) -> None:
    """Judge one job and write its feedback page and ``<job>/result.json``."""
    job = Path(item["job"])
    try:
        lang, root = item.get("edition", "en"), Path(item.get("course", course))  # the submission's edition
        cells, note, autograded = judge_cells(job, root, item["exercise"], item["student"], item["name"], Path(item["submission"]))
        fb = feedback_page(job, item["exercise"], item["student"], item["name"], cells, note, autograded, lang)
        payload = {"note": note, "feedback": str(fb), "cells": [asdict(c) for c in cells]}
    except Exception as err:  # noqa: BLE001 - one broken job must not stop the others
        payload = {"error": f"{type(err).__name__}: {err}"[:300]}
    write_atomic(job / "result.json", json.dumps(payload))


def finish(spec: Path | None, course: Path, judge_files: Iterable[str] = ()) -> None:
    """Judge and render feedback for every job listed in ``spec`` (a JSON list), one by one; with
    ``spec`` None, for every job read from stdin (one JSON object a line) as the grader sends them,
    each as soon as its sandbox has ended."""
    from .nbgrader_root import ensure_tool_path

    ensure_tool_path()
    _load_judge_files(judge_files)
    if spec is None:  # what every job needs, imported while the first sandboxes run
        import nbgrader.apps  # noqa: F401

        from .judges import load_all

        load_all()
    items = load_json(spec) if spec is not None else (json.loads(line) for line in sys.stdin if line.strip())
    for item in items:
        _finish_one(item, course)


def main(argv: list[str] | None = None) -> int:
    """``python -I -m tinytf.course.finish [--spec JOBS.json] --course ROOT [--judge-file F ...]``
    (without ``--spec``: the jobs come on stdin, one JSON object a line)."""
    skip_slow_imports()
    parser = argparse.ArgumentParser(prog="python -m tinytf.course.finish")
    parser.add_argument("--spec", help="JSON list of jobs to judge (default: one job a line on stdin)")
    parser.add_argument("--course", required=True)
    parser.add_argument("--judge-file", action="append", default=[])
    args = parser.parse_args(argv)
    finish(Path(args.spec) if args.spec else None, Path(args.course), args.judge_file)
    return 0


if __name__ == "__main__":  # pragma: no cover
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # every result is written (atomically); the interpreter's shutdown only costs time
