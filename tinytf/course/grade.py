"""``tinytf grade SUBMISSIONS``: a gradebook from a folder of student notebooks, whatever they contain.

Layout: ``SUBMISSIONS/<student>/<exNN_name>.ipynb`` (nbgrader's collected layout
``SUBMISSIONS/<student>/<exNN>/<exNN_name>.ipynb`` works too). For every student and exercise:

1. *Sandbox* (student code runs here): a private nbgrader course root (a copy of this run's
   freshly built gradebook db and the source notebook) and ``nbgrader autograde`` of that one
   submission, under :func:`tinytf.course.sandbox.run_limited` — per-cell timeout (nbgrader's
   ``Execute.timeout``), a whole-notebook wall limit, ``RLIMIT_AS`` per process, everything killed
   at the end. Hidden tests call ``record(...)`` into the job's ``TINYTF_RECORD_DIR``.
2. *Finish* (no student code): ``python -I -m tinytf.course.grade finish …`` in a clean
   interpreter decides each test cell's status from the submitted notebook (deleted, renamed or
   edited test cells), nbgrader's executed notebook (errors, timeouts) and the clean-process judges
   (:mod:`tinytf.course.judges`): a cell nbgrader passed whose judge fails or whose record is missing
   is ``tampered`` and earns 0. It writes feedback HTML through ``nbgrader generate_feedback`` from a
   copy with every hidden test and every test-cell traceback removed (nbgrader 0.9.6's feedback
   does not remove hidden tests itself).
3. The parent writes ``grades.csv``, ``grades_per_cell.csv``, ``feedback/<student>/<exercise>.html``
   and ``summary.txt`` atomically, sorted, with no timestamps: re-running gives the same files.

Submissions are only ever read (copied into the job folder).
"""

from __future__ import annotations

import argparse
import csv
import html
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .nbgrader_root import REPO, build_course_root, ensure_tool_path, find_notebooks, nbgrader_meta, strip_hidden, write_atomic
from .sandbox import Limits, run_limited

__all__ = ["STATUSES", "CellSpec", "CellResult", "ExerciseResult", "grade", "grade_specs", "summary_text", "main"]

STATUSES = ("ok", "failed", "error", "timeout", "missing-cell", "tampered", "unreadable", "missing-submission", "needs-manual-grade")
# The exercise's status is the most serious status among its cells, in this order.
_SEVERITY = ("unreadable", "missing-submission", "tampered", "missing-cell", "timeout", "error", "failed", "needs-manual-grade", "ok")
_MAX_OUTPUT = 10_000  # characters kept per output in feedback
_STUDENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,127}$")


@dataclass(frozen=True)
class CellSpec:
    """One graded cell of an exercise: ``kind`` is "auto" (a test cell) or "manual" (a written answer)."""

    grade_id: str
    kind: str
    points: float
    visible: str  # the source students see (hidden tests removed)
    also: tuple[str, ...] = ()  # other accepted sources (the test as released to students earlier)


@dataclass
class CellResult:
    student: str
    exercise: str
    cell: str
    points: float
    max_points: float
    status: str
    message: str = ""


@dataclass
class ExerciseResult:
    student: str
    exercise: str
    score: float
    max_score: float
    status: str
    message: str
    cells: list[CellResult] = field(default_factory=list)
    feedback: str | None = None  # path of the feedback HTML in the job folder


# ----------------------------------------------------------------------------------------------
# notebook helpers (pure; used by both processes)


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def grade_specs(source_nb: dict, released: dict | None = None) -> list[CellSpec]:
    """The graded cells of an instructor notebook, in order; ``released``: a student version handed out
    earlier, whose test-cell sources are accepted as unedited too."""
    earlier = {gid: strip_hidden(_source(c)) for gid, c in _cells_by_id(released).items()} if released else {}
    specs = []
    for cell in source_nb.get("cells", []):
        meta = nbgrader_meta(cell)
        if not meta.get("grade"):
            continue
        kind = "manual" if meta.get("solution") or cell.get("cell_type") != "code" else "auto"
        gid = str(meta["grade_id"])
        also = (earlier[gid],) if gid in earlier else ()
        specs.append(CellSpec(gid, kind, float(meta.get("points", 0) or 0), strip_hidden(_source(cell)), also))
    return specs


def _cells_by_id(nb: dict) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for cell in nb.get("cells", []) if isinstance(nb, dict) else []:
        gid = nbgrader_meta(cell).get("grade_id") if isinstance(cell, dict) else None
        if isinstance(gid, str) and gid not in out:
            out[gid] = cell
    return out


def read_notebook(path: Path) -> dict:
    """The notebook JSON as a dict; ValueError with a short reason when it is not a notebook."""
    import nbformat

    try:
        raw = path.read_bytes()
        nb = json.loads(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"not valid JSON ({type(err).__name__}: {str(err)[:120]})") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list) or nb.get("nbformat") != 4:
        raise ValueError("JSON but not an nbformat-4 notebook (no 'cells' list)")
    try:
        nbformat.validate(nbformat.from_dict(nb))
    except Exception as err:  # noqa: BLE001 - any schema problem makes it unreadable for nbgrader
        first = str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__
        raise ValueError(f"not a valid notebook ({first})") from None
    return nb


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _hidden_lines(full_source: str) -> set[int]:
    """1-based line numbers inside hidden-test blocks (markers included)."""
    hidden, inside = set(), False
    for i, line in enumerate(full_source.split("\n"), start=1):
        if "BEGIN HIDDEN TESTS" in line:
            inside = True
        if inside:
            hidden.add(i)
        if "END HIDDEN TESTS" in line:
            inside = False
    return hidden


def _error_line(cell: dict, tb: list[str]) -> int | None:
    """The line of ``cell`` the error passed through (from IPython's ``Cell In[n], line L``)."""
    count = cell.get("execution_count")
    text = _ANSI.sub("", "\n".join(tb))
    lines = [int(m.group(2)) for m in re.finditer(r"Cell In\[(\d+)\], line (\d+)", text) if count is not None and int(m.group(1)) == count]
    return lines[0] if lines else None


def classify_test_cell(cell: dict) -> tuple[str, str]:
    """``(status, message)`` of an executed test cell from its outputs (before judging)."""
    errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    if not errors:
        return "ok", ""
    err = errors[-1]
    ename, evalue = str(err.get("ename", "Error")), _ANSI.sub("", str(err.get("evalue", "")))
    if ename == "CellTimeoutError":
        return "timeout", "the cell ran past the per-cell time limit"
    line = _error_line(cell, list(err.get("traceback", [])))
    hidden = _hidden_lines(_source(cell))
    if line is None or line in hidden:
        where = "a hidden test"
        evalue = ""
    else:
        where = f"line {line}"
    msg = f"{ename}{': ' + evalue.strip().splitlines()[0][:200] if evalue.strip() else ''} ({where})"
    return ("failed" if ename == "AssertionError" else "error"), msg


# ----------------------------------------------------------------------------------------------
# the clean "finish" process


def _load_judge_files(files: Iterable[str]) -> None:
    for i, path in enumerate(files):
        spec = importlib.util.spec_from_file_location(f"_tinytf_extra_judges_{i}", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load judges from {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _kernel_death(log: str) -> bool:
    return any(s in log for s in ("DeadKernelError", "Kernel died", "kernel died", "KernelDied"))


def judge_cells(job: Path, course: Path, ex: str, student: str, name: str, submission: Path) -> tuple[list[CellResult], str, dict]:
    """Per-cell results for one job, a one-line note, and the autograded notebook (or {})."""
    from .judges import run_judge
    from .record import load_records

    source_nb = json.loads((course / "source" / ex / name).read_text(encoding="utf-8"))
    also_path = course / "released-earlier" / name
    earlier = json.loads(also_path.read_text(encoding="utf-8")) if also_path.exists() else None
    specs = grade_specs(source_nb, earlier)
    submitted = _cells_by_id(json.loads(submission.read_text(encoding="utf-8")))
    sandbox = json.loads((job / "sandbox.json").read_text(encoding="utf-8"))
    ag_path = job / "autograded" / student / ex / name
    verdict = {}
    if (job / "autograde.json").exists():
        verdict = json.loads((job / "autograde.json").read_text(encoding="utf-8"))
    autograded: dict = {}
    note = ""
    if sandbox["timed_out"]:
        note = f"the notebook ran past the whole-notebook limit ({sandbox['limit']:g} s) and was stopped"
    elif ag_path.exists() and verdict.get("success"):
        autograded = json.loads(ag_path.read_text(encoding="utf-8"))
    else:
        log = verdict.get("log", "") + verdict.get("error", "")
        if _kernel_death(log) or not verdict:
            note = "the notebook's kernel died (os._exit, a crash, or the memory limit) and grading stopped"
        else:
            note = "nbgrader could not grade this notebook: " + (log.strip().splitlines() or ["no log"])[-1][:200]
    if not any(nbgrader_meta(c) for c in submitted.values()) and not submitted:
        note = (note + "; " if note else "") + "the submission has no nbgrader cell metadata (stripped?)"
    records = load_records(job / "records")
    executed = _cells_by_id(autograded)
    results = []
    for spec in specs:
        r = CellResult(student, ex, spec.grade_id, 0.0, spec.points, "ok")
        cell = submitted.get(spec.grade_id)
        if cell is None:
            r.status, r.message = "missing-cell", "this test cell is missing from the submission (deleted, renamed, or metadata stripped)"
        elif spec.kind == "manual":
            r.status, r.message = "needs-manual-grade", "written answer: an instructor grades it"
        elif _source(cell).strip() not in {spec.visible.strip(), *(a.strip() for a in spec.also)}:
            r.status, r.message = "tampered", "this locked test cell was edited; edited test cells earn 0"
        elif sandbox["timed_out"]:
            r.status, r.message = "timeout", note
        elif not autograded:
            r.status, r.message = "error", note
        elif spec.grade_id not in executed:
            r.status, r.message = "missing-cell", "this test cell is missing from the graded notebook"
        else:
            r.status, r.message = classify_test_cell(executed[spec.grade_id])
            if r.status == "ok":
                rec = records.get(spec.grade_id)
                if rec is None:
                    r.status, r.message = "tampered", "the cell passed but exported no result for the independent check"
                else:
                    passed, why = run_judge(spec.grade_id, rec["value"], rec["inputs"])
                    if not passed:
                        r.status, r.message = "tampered", f"the cell passed but the independent check disagrees: {why}"[:300]
        r.points = spec.points if r.status == "ok" else 0.0
        results.append(r)
    return results, note, autograded


def _truncate(text: str) -> str:
    return text if len(text) <= _MAX_OUTPUT else text[:_MAX_OUTPUT] + f"\n… (output truncated: {len(text):,} characters)"


def sanitize_for_feedback(nb: dict, cells: list[CellResult]) -> dict:
    """A copy safe to show students: hidden tests and test-cell outputs removed, long outputs cut."""
    nb = json.loads(json.dumps(nb))
    by_id = {c.cell: c for c in cells}
    for cell in nb.get("cells", []):
        src = _source(cell)
        gid = nbgrader_meta(cell).get("grade_id")
        if "HIDDEN TESTS" in src:
            cell["source"] = strip_hidden(src)
        if cell.get("cell_type") != "code":
            continue
        meta = nbgrader_meta(cell)
        if gid in by_id and meta.get("grade") and not meta.get("solution"):  # a test cell
            r = by_id[gid]
            text = f"{r.status}: {r.message}" if r.message else r.status
            cell["outputs"] = [] if r.status == "ok" else [{"output_type": "stream", "name": "stderr", "text": text + "\n"}]
            continue
        kept = []
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                out["text"] = _truncate(_source({"source": out.get("text", "")}))
            elif out.get("output_type") == "error":
                out["traceback"] = [_truncate("\n".join(out.get("traceback", [])))]
            else:
                data = out.get("data", {})
                for key in list(data):
                    if isinstance(data[key], (str, list)):
                        data[key] = _truncate(_source({"source": data[key]}))
            kept.append(out)
        cell["outputs"] = kept
    return nb


def _summary_cell(ex: str, student: str, cells: list[CellResult], note: str) -> dict:
    rows = "\n".join(f"| `{c.cell}` | {c.points:g} / {c.max_points:g} | {c.status} | {html.escape(c.message)} |" for c in cells)
    total = sum(c.points for c in cells)
    best = sum(c.max_points for c in cells)
    text = f"## tinytf grading: {ex} for {student}\n\n**{total:g} / {best:g} points** (written answers are added by an instructor).\n\n"
    if note:
        text += f"Note: {html.escape(note)}\n\n"
    text += "| test cell | points | status | details |\n|---|---|---|---|\n" + rows + "\n"
    return {"cell_type": "markdown", "id": "tinytf-grading-summary", "metadata": {}, "source": text}


def _plain_html(ex: str, student: str, cells: list[CellResult], note: str) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(c.cell)}</td><td>{c.points:g} / {c.max_points:g}</td><td>{html.escape(c.status)}</td>"
        f"<td>{html.escape(c.message)}</td></tr>"
        for c in cells
    )
    return (
        f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(ex)} — {html.escape(student)}</title></head><body>"
        f"<h1>{html.escape(ex)} — {html.escape(student)}</h1><p>{html.escape(note)}</p>"
        f"<table border='1'><tr><th>test cell</th><th>points</th><th>status</th><th>details</th></tr>{rows}</table></body></html>\n"
    )


def _feedback(job: Path, ex: str, student: str, name: str, cells: list[CellResult], note: str, autograded: dict) -> Path:
    out = job / "feedback.html"
    if not autograded:
        write_atomic(out, _plain_html(ex, student, cells, note))
        return out
    nb = sanitize_for_feedback(autograded, cells)
    nb["cells"].insert(0, _summary_cell(ex, student, cells, note))
    write_atomic(job / "autograded" / student / ex / name, json.dumps(nb))
    try:
        from nbgrader.api import Gradebook

        from .nbgrader_root import COURSE_ID, api

        with Gradebook(f"sqlite:///{job / 'gradebook.db'}", COURSE_ID) as gb:
            for c in cells:
                if c.status not in ("ok", "needs-manual-grade"):
                    try:
                        g = gb.find_grade(c.cell, Path(name).stem, ex, student)
                    except Exception:  # noqa: BLE001 - a cell nbgrader never saw
                        continue
                    g.manual_score = 0.0
            gb.db.commit()
        result = api(job).generate_feedback(ex, student, force=True)
        html_path = job / "feedback" / student / ex / (Path(name).stem + ".html")
        if result.get("success") and html_path.exists():
            shutil.copyfile(html_path, out)
            return out
    except Exception:  # noqa: BLE001 - fall back to the plain page below
        pass
    write_atomic(out, _plain_html(ex, student, cells, note))
    return out


def _finish(args: argparse.Namespace) -> int:
    """Judge and render feedback for every job listed in ``--spec`` (a JSON list), one by one."""
    ensure_tool_path()
    _load_judge_files(args.judge_file or [])
    course = Path(args.course)
    for item in json.loads(Path(args.spec).read_text(encoding="utf-8")):
        job = Path(item["job"])
        try:
            cells, note, autograded = judge_cells(job, course, item["exercise"], item["student"], item["name"], Path(item["submission"]))
            fb = _feedback(job, item["exercise"], item["student"], item["name"], cells, note, autograded)
            payload = {"note": note, "feedback": str(fb), "cells": [asdict(c) for c in cells]}
        except Exception as err:  # noqa: BLE001 - one broken job must not stop the others
            payload = {"error": f"{type(err).__name__}: {err}"[:300]}
        write_atomic(job / "result.json", json.dumps(payload))
    return 0


# ----------------------------------------------------------------------------------------------
# the parent: discover, run the jobs, write the gradebook


@dataclass
class _Context:
    course: Path
    work: Path
    names: dict[str, str]
    specs: dict[str, list[CellSpec]]
    cell_timeout: int
    limits: Limits
    env: dict[str, str]
    judge_files: list[str]
    known_ids: dict[str, set[str]]


def _safe_id(name: str) -> str:
    """``name`` when it is a safe nbgrader student id, else a readable safe id with a hash suffix."""
    if _STUDENT.match(name):
        return name
    import hashlib

    return "s_" + re.sub(r"[^A-Za-z0-9_.@+-]", "_", name)[:60] + "_" + hashlib.sha1(name.encode()).hexdigest()[:8]


def _find_submission(student_dir: Path, ex: str, name: str) -> Path | None:
    for cand in (student_dir / name, student_dir / ex / name):
        if cand.is_file():
            return cand
    matches = sorted(p for p in student_dir.glob(f"{ex}*.ipynb") if p.is_file())
    matches += sorted(p for p in student_dir.glob(f"{ex}/{ex}*.ipynb") if p.is_file())
    return matches[0] if len(matches) == 1 else None


def specs_ids(ctx: _Context, ex: str) -> set[str]:
    return ctx.known_ids[ex]


def _for_nbgrader(nb: dict, known: set[str]) -> dict:
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


def _whole(ex: str, student: str, specs: list[CellSpec], status: str, message: str) -> ExerciseResult:
    cells = [CellResult(student, ex, s.grade_id, 0.0, s.points, status, message) for s in specs]
    return ExerciseResult(student, ex, 0.0, sum(s.points for s in specs), status, message, cells)


def _aggregate(student: str, ex: str, cells: list[CellResult], note: str) -> ExerciseResult:
    statuses = {c.status for c in cells} or {"ok"}
    status = next(s for s in _SEVERITY if s in statuses)
    counts = Counter(c.status for c in cells)
    msg = note or ", ".join(f"{n} {s}" for s, n in sorted(counts.items()) if s != "ok")
    return ExerciseResult(student, ex, sum(c.points for c in cells), sum(c.max_points for c in cells), status, msg, cells)


def _sandbox_one(ctx: _Context, student: str, student_dir: Path, ex: str) -> ExerciseResult | dict:
    """Run one submission in the sandbox; an ExerciseResult when nothing needs judging, else a job item."""
    name, specs = ctx.names[ex], ctx.specs[ex]
    sub = _find_submission(student_dir, ex, name)
    if sub is None:
        return _whole(ex, student, specs, "missing-submission", f"no {name} in the submission folder")
    try:
        read_notebook(sub)
    except ValueError as err:
        return _whole(ex, student, specs, "unreadable", f"{sub.name}: {err}")
    display, student = student, _safe_id(student)  # nbgrader and the paths get a safe id; the CSVs the folder name
    job = ctx.work / "jobs" / f"{student}__{ex}"
    shutil.rmtree(job, ignore_errors=True)
    (job / "source" / ex).mkdir(parents=True)
    shutil.copyfile(ctx.course / "gradebook.db", job / "gradebook.db")
    shutil.copyfile(ctx.course / "source" / ex / name, job / "source" / ex / name)
    (job / "submitted" / student / ex).mkdir(parents=True)
    pristine = job.parent / f"{student}__{ex}.submitted.ipynb"  # outside the sandbox's root
    shutil.copyfile(sub, pristine)
    write_atomic(job / "submitted" / student / ex / name, json.dumps(_for_nbgrader(read_notebook(sub), specs_ids(ctx, ex))))
    (job / "records").mkdir()
    env = dict(ctx.env, TINYTF_RECORD_DIR=str(job / "records"), IPYTHONDIR=str(job / ".ipython"))
    cmd = [sys.executable, "-m", "tinytf.course.sandbox", "autograde", str(job), ex, student,
           "--timeout", str(ctx.cell_timeout), "--result", str(job / "autograde.json")]
    run = run_limited(cmd, ctx.limits, cwd=job, env=env, log=job / "autograde.log")
    write_atomic(job / "sandbox.json", json.dumps({"timed_out": run.timed_out, "returncode": run.returncode,
                                                   "seconds": run.seconds, "limit": ctx.limits.timeout}))
    if run.timed_out:
        (job / "autograde.json").unlink(missing_ok=True)  # whatever it wrote is not trusted
    return {"job": str(job), "exercise": ex, "student": student, "display": display, "name": name, "submission": str(pristine)}


def _finish_all(ctx: _Context, items: list[dict], jobs: int) -> None:
    """Run the clean judging processes: ``jobs`` interpreters, each over a share of the items."""
    chunks = [items[i::jobs] for i in range(jobs) if items[i::jobs]]

    def run(k: int, chunk: list[dict]) -> None:
        spec = ctx.work / f"finish-{k}.json"
        spec.write_text(json.dumps(chunk), encoding="utf-8")
        cmd = [sys.executable, "-I", "-m", "tinytf.course.grade", "finish", "--spec", str(spec), "--course", str(ctx.course)]
        for f in ctx.judge_files:
            cmd += ["--judge-file", f]
        clean_env = {k: v for k, v in ctx.env.items() if k != "TINYTF_RECORD_DIR"}
        subprocess.run(cmd, cwd=ctx.work, env=clean_env, stdin=subprocess.DEVNULL, capture_output=True, timeout=600 + 120 * len(chunk))

    with ThreadPoolExecutor(max_workers=len(chunks) or 1) as pool:
        for fut in [pool.submit(run, k, c) for k, c in enumerate(chunks)]:
            try:
                fut.result()
            except subprocess.TimeoutExpired:
                pass  # the jobs without result.json are reported as grader errors


def _collect(ctx: _Context, item: dict) -> ExerciseResult:
    ex, student = item["exercise"], item.get("display", item["student"])
    path = Path(item["job"]) / "result.json"
    payload = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {"error": "the judging process did not finish"}
    if "error" in payload:
        return _whole(ex, student, ctx.specs[ex], "error", "grader error while judging: " + payload["error"])
    cells = [CellResult(**dict(c, student=student)) for c in payload["cells"]]
    res = _aggregate(student, ex, cells, payload["note"])
    res.feedback = payload["feedback"]
    return res


def _base_env() -> dict[str, str]:
    ensure_tool_path()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TINYTF_RECORD", "JPY_", "JUPYTER_"))}
    env.update(TINYTF_HEADLESS="1", MPLBACKEND="Agg", TINYTF_DEVICE="cpu", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", MALLOC_ARENA_MAX="2", PYTHONDONTWRITEBYTECODE="1", PYTHONHASHSEED="0",
               PYDEVD_DISABLE_FILE_VALIDATION="1")
    return env


def _fmt(x: float) -> str:
    return f"{x:g}"


def _csv(rows: list[list[Any]]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return buf.getvalue()


def summary_text(results: list[ExerciseResult]) -> str:
    """Students graded, mean score per exercise, and counts per status (exercises and cells)."""
    students = sorted({r.student for r in results})
    lines = [f"students graded: {len(students)}", "mean score per exercise:"]
    for ex in sorted({r.exercise for r in results}):
        rs = [r for r in results if r.exercise == ex]
        mean = sum(r.score for r in rs) / len(rs)
        lines.append(f"  {ex}: {mean:.2f} / {rs[0].max_score:g}  ({len(rs)} submissions)")
    ex_counts = Counter(r.status for r in results)
    cell_counts = Counter(c.status for r in results for c in r.cells)
    lines.append("exercises per status: " + ", ".join(f"{s} {ex_counts[s]}" for s in STATUSES if ex_counts[s]))
    lines.append("test cells per status: " + ", ".join(f"{s} {cell_counts[s]}" for s in STATUSES if cell_counts[s]))
    return "\n".join(lines) + "\n"


def write_gradebook(results: list[ExerciseResult], out: Path) -> None:
    """grades.csv, grades_per_cell.csv, feedback/<student>/<exercise>.html and summary.txt, atomically."""
    results = sorted(results, key=lambda r: (r.student, r.exercise))
    rows = [["student", "exercise", "score", "max_score", "status", "message"]]
    rows += [[r.student, r.exercise, _fmt(r.score), _fmt(r.max_score), r.status, r.message] for r in results]
    cells = [["student", "exercise", "cell", "points", "max_points", "status", "message"]]
    cells += [[c.student, c.exercise, c.cell, _fmt(c.points), _fmt(c.max_points), c.status, c.message] for r in results for c in r.cells]
    write_atomic(out / "grades.csv", _csv(rows))
    write_atomic(out / "grades_per_cell.csv", _csv(cells))
    for r in results:
        dest = out / "feedback" / r.student / f"{r.exercise}.html"
        if r.feedback and Path(r.feedback).exists():
            write_atomic(dest, Path(r.feedback).read_bytes())
        else:
            write_atomic(dest, _plain_html(r.exercise, r.student, r.cells, r.message))
    write_atomic(out / "summary.txt", summary_text(results))


def grade(
    submissions: str | Path,
    out: str | Path = REPO / "build" / "grades",
    *,
    solutions: str | Path = REPO / "solutions",
    exercises: Iterable[str] | None = None,
    jobs: int = 1,
    timeout: int = 60,
    notebook_timeout: float | None = None,
    memory_mb: int = 4096,
    released: str | Path | None = REPO / "exercises",
    judge_files: Iterable[str] = (),
    keep_work: bool = False,
    progress: bool = True,
) -> list[ExerciseResult]:
    """Grade every ``SUBMISSIONS/<student>/`` on every exercise; write the gradebook to ``out``.

    ``timeout``: seconds per cell; ``notebook_timeout``: seconds per notebook (default
    ``max(120, 4 * timeout)``); ``memory_mb``: address-space limit of each grading process.
    ``released``: the folder of student versions handed out (``exercises/``); a test cell identical to
    the one released there is not "edited" even if the instructor changed the test since.
    """
    from tqdm.auto import tqdm

    submissions, out = Path(submissions), Path(out)
    if not submissions.is_dir():
        raise FileNotFoundError(f"{submissions} is not a folder of SUBMISSIONS/<student>/<exercise>.ipynb")
    sols = find_notebooks(solutions, exercises)
    if not sols:
        raise FileNotFoundError(f"no exNN_*.ipynb in {solutions}")
    students = sorted(p for p in submissions.iterdir() if p.is_dir() and not p.name.startswith("."))
    work = Path(tempfile.mkdtemp(prefix="tinytf-grade-"))
    try:
        course, names = build_course_root(sols, work / "course")  # a fresh gradebook db every run
        for name in names.values():
            if released and (Path(released) / name).is_file():
                (course / "released-earlier").mkdir(exist_ok=True)
                shutil.copyfile(Path(released) / name, course / "released-earlier" / name)
        specs = {ex: grade_specs(json.loads(p.read_text(encoding="utf-8"))) for ex, p in sols.items()}
        limit = float(notebook_timeout) if notebook_timeout else max(120.0, 4.0 * timeout)
        known = {ex: {nbgrader_meta(c).get("grade_id") for c in json.loads(p.read_text(encoding="utf-8"))["cells"]} - {None}
                 for ex, p in sols.items()}
        ctx = _Context(course, work, names, specs, int(timeout), Limits(limit, memory_mb), _base_env(),
                       [str(Path(f).resolve()) for f in judge_files], known)
        tasks = [(s.name, s, ex) for s in students for ex in sorted(sols)]
        results: list[ExerciseResult] = []
        pending: list[dict] = []
        with ThreadPoolExecutor(max_workers=max(1, int(jobs))) as pool:
            futures = {pool.submit(_sandbox_one, ctx, *t): t for t in tasks}
            bar = tqdm(total=len(tasks), desc="grading", unit="notebook", disable=not progress)
            for fut in as_completed(futures):
                student, _, ex = futures[fut]
                try:
                    got = fut.result()
                except Exception as err:  # noqa: BLE001 - the run finishes whatever happens
                    got = _whole(ex, student, specs[ex], "error", f"grader error: {type(err).__name__}: {err}"[:300])
                (results if isinstance(got, ExerciseResult) else pending).append(got)
                bar.update(1)
            bar.close()
        pending.sort(key=lambda it: (it["student"], it["exercise"]))
        _finish_all(ctx, pending, max(1, int(jobs)))
        results += [_collect(ctx, item) for item in pending]
        write_gradebook(results, out)
    finally:
        if keep_work:
            print(f"work folder kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return sorted(results, key=lambda r: (r.student, r.exercise))


def main(argv: list[str] | None = None) -> int:
    """``python -m tinytf.course.grade finish …`` (the clean judging process)."""
    parser = argparse.ArgumentParser(prog="python -m tinytf.course.grade")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("finish")
    p.add_argument("--spec", required=True, help="JSON list of jobs to judge")
    p.add_argument("--course", required=True)
    p.add_argument("--judge-file", action="append")
    p.set_defaults(func=_finish)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
