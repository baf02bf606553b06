"""The verdict on one graded submission (:func:`verdict`, in the grading worker after the sandboxed run): each test
cell's status and points, from the submitted notebook (deleted, renamed or edited test cells), nbgrader's executed
notebook (errors, timeouts) and the judges (:mod:`tinytf.course.reference.judging`) — a cell nbgrader passed whose
judge fails is ``failed``, or ``tampered`` when its record shows replaced checking functions or is missing
(``record`` bypassed) — and the student's feedback page (:mod:`tinytf.course.grade.feedback`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..build.release import earlier_release, load_manifest
from ..ipynb import cell_source, cells_by_id, first_line, hidden_lines, load_json, nbgrader_meta, strip_ansi, strip_hidden
from .feedback import feedback_page
from .gradebook import CellResult, ExerciseResult, aggregate
from .sandbox import Job, SandboxRun

__all__ = ["CellSpec", "grade_specs", "classify_test_cell", "judge_cells", "verdict"]


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


def _executed(job: Job, run: SandboxRun) -> tuple[dict, str]:
    """nbgrader's autograded notebook (or {}) and a note on why there is none."""
    autograded = job.workdir / job.name
    if run.timed_out:
        return {}, f"the notebook ran past the whole-notebook limit ({job.limits.timeout:g} s) and was stopped"
    if autograded.exists() and run.success:
        return load_json(autograded), ""
    if _kernel_death(run.log) or not run.log:
        return {}, "the notebook's kernel died (os._exit, a crash, or the memory limit) and grading stopped"
    return {}, "nbgrader could not grade this notebook: " + (run.log.strip().splitlines() or ["no log"])[-1][:200]


def _cell_status(spec: CellSpec, cell: dict | None, executed: dict[str, dict], records: dict, timed_out: bool,
                 note: str, limit: float | None = None, manifest: dict | None = None, ex: str = "") -> tuple[str, str]:
    """``(status, message)`` of one graded cell of one job; ``manifest``: every release's test cells
    (:func:`tinytf.course.build.release.load_manifest`), a test cell matching one of them is no edit."""
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
    from ..reference.judging import run_judge

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
    from ..ipynb import describe_cell, is_test_cell

    cells = nb.get("cells", []) if nb else []
    return [f"{describe_cell(cells, i)}: {timeout_message(c, limit)}" for i, c in enumerate(cells)
            if c.get("cell_type") == "code" and not is_test_cell(c)
            and any(o.get("output_type") == "error" and o.get("ename") == "CellTimeoutError" for o in c.get("outputs", []))]


def judge_cells(job: Job, run: SandboxRun) -> tuple[list[CellResult], str, dict]:
    """Per-cell results for one job, a one-line note, and the autograded notebook (or {})."""
    from ..reference.judging import load_records

    ex, name, course = job.exercise, job.name, job.course
    also_path = course / "released-earlier" / name
    specs = grade_specs(load_json(course / "source" / ex / name), load_json(also_path) if also_path.exists() else None)
    submitted = cells_by_id(load_json(job.submission))
    autograded, note = _executed(job, run)
    if not submitted:
        note = (note + "; " if note else "") + "the submission has no nbgrader cell metadata (stripped?)"
    records = load_records(job.records)
    executed = cells_by_id(autograded)
    limit = job.config.get("Execute", {}).get("timeout")
    note = "; ".join(x for x in (note, *_stopped_cells(autograded, limit)) if x)
    manifest = load_manifest(course / "released-earlier")
    results = []
    for spec in specs:
        status, message = _cell_status(spec, submitted.get(spec.grade_id), executed, records, run.timed_out, note, limit,
                                       manifest, ex)
        results.append(CellResult(job.display, ex, spec.grade_id, spec.points if status == "ok" else 0.0, spec.points, status,
                                  message))
    return results, note, autograded


def verdict(job: Job, run: SandboxRun) -> ExerciseResult:
    """The gradebook's result for ``job`` after its sandboxed ``run``, with its feedback page written."""
    cells, note, autograded = judge_cells(job, run)
    result = aggregate(job.display, job.exercise, cells, note)
    result.feedback = str(feedback_page(job.root, job.exercise, job.student, job.name, cells, note, autograded, job.edition))
    result.edition = job.edition
    return result
