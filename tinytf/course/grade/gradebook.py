"""The gradebook: per-cell and per-exercise results, and the files ``tinytf grade`` writes from them.

``OUT/grades.csv``, ``OUT/grades_per_cell.csv``, ``OUT/feedback/<student>/<exercise>.html`` and
``OUT/summary.txt``, written atomically, sorted, without timestamps: the same results give the same
files. :func:`read_gradebook` reads the CSVs back into results, so gradebooks of disjoint groups of
students merge into the one a single run would write (:mod:`tinytf.course.grade.students`).
"""

from __future__ import annotations

import csv
import html
import io
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...translation import gettext as _
from ..ipynb import write_atomic

__all__ = ["STATUSES", "CellResult", "ExerciseResult", "aggregate", "whole", "plain_html", "summary_text",
           "write_gradebook", "read_gradebook"]

STATUSES = ("ok", "failed", "error", "timeout", "missing-cell", "tampered", "unreadable", "missing-submission", "needs-manual-grade")
# The exercise's status is the most serious status among its cells, in this order.
_SEVERITY = ("unreadable", "missing-submission", "tampered", "missing-cell", "timeout", "error", "failed", "needs-manual-grade", "ok")
# edition: the submission's language (metadata.tinytf.edition: en / zh; empty when there was no notebook)
_EXERCISE_COLUMNS = ["student", "exercise", "edition", "score", "max_score", "status", "message"]
_CELL_COLUMNS = ["student", "exercise", "cell", "points", "max_points", "status", "message"]


@dataclass
class CellResult:
    """One graded cell of one student's exercise."""

    student: str
    exercise: str
    cell: str
    points: float
    max_points: float
    status: str
    message: str = ""


@dataclass
class ExerciseResult:
    """One student's exercise: the sum of its cells and the most serious of their statuses."""

    student: str
    exercise: str
    score: float
    max_score: float
    status: str
    message: str
    cells: list[CellResult] = field(default_factory=list)
    feedback: str | None = None  # path of a feedback HTML page to copy into the gradebook
    edition: str = ""  # "en" / "zh": the submission's edition; "" when no notebook could be read


def whole(ex: str, student: str, cells: list[tuple[str, float]], status: str, message: str) -> ExerciseResult:
    """Every cell (``(grade_id, points)``) of the exercise gets ``status`` and 0 points."""
    results = [CellResult(student, ex, gid, 0.0, pts, status, message) for gid, pts in cells]
    return ExerciseResult(student, ex, 0.0, sum(pts for _, pts in cells), status, message, results)


def aggregate(student: str, ex: str, cells: list[CellResult], note: str) -> ExerciseResult:
    """The exercise's result from its cells; ``note`` (when given) is its message."""
    statuses = {c.status for c in cells} or {"ok"}
    status = next(s for s in _SEVERITY if s in statuses)
    counts = Counter(c.status for c in cells)
    msg = note or ", ".join(f"{n} {s}" for s, n in sorted(counts.items()) if s != "ok")
    return ExerciseResult(student, ex, sum(c.points for c in cells), sum(c.max_points for c in cells), status, msg, cells)


def plain_html(ex: str, student: str, cells: list[CellResult], note: str, lang: str = "en") -> str:
    """A feedback page with the status table only (when nbgrader's page cannot be made), in ``lang``."""
    from ..messages import status_name, translate

    rows = "".join(
        f"<tr><td>{html.escape(c.cell)}</td><td>{c.points:g} / {c.max_points:g}</td><td>{html.escape(status_name(c.status, lang))}</td>"
        f"<td>{html.escape(translate(c.message, lang))}</td></tr>"
        for c in cells
    )
    heads = (_("test cell", lang), _("points", lang), _("status", lang), _("details", lang))
    head_row = "".join(f"<th>{html.escape(h)}</th>" for h in heads)
    return (
        f"<!DOCTYPE html>\n<html lang='{'zh-CN' if lang == 'zh' else 'en'}'><head><meta charset='utf-8'>"
        f"<title>{html.escape(ex)} — {html.escape(student)}</title></head><body>"
        f"<h1>{html.escape(ex)} — {html.escape(student)}</h1><p>{html.escape(translate(note, lang))}</p>"
        f"<table border='1'><tr>{head_row}</tr>{rows}</table></body></html>\n"
    )


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
    rows = [_EXERCISE_COLUMNS]
    rows += [[r.student, r.exercise, r.edition, _fmt(r.score), _fmt(r.max_score), r.status, r.message] for r in results]
    cells = [_CELL_COLUMNS]
    cells += [[c.student, c.exercise, c.cell, _fmt(c.points), _fmt(c.max_points), c.status, c.message] for r in results for c in r.cells]
    write_atomic(out / "grades.csv", _csv(rows))
    write_atomic(out / "grades_per_cell.csv", _csv(cells))
    for r in results:
        dest = out / "feedback" / r.student / f"{r.exercise}.html"
        if r.feedback and Path(r.feedback).exists():
            if Path(r.feedback).resolve() != dest.resolve():
                write_atomic(dest, Path(r.feedback).read_bytes())
        else:
            write_atomic(dest, plain_html(r.exercise, r.student, r.cells, r.message, r.edition or "en"))
    write_atomic(out / "summary.txt", summary_text(results))


def _read_csv(path: Path, columns: list[str]) -> list[dict[str, str]]:
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: is {path.parent} a gradebook written by `tinytf grade`?")
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames != columns:
            raise ValueError(f"{path}: columns {reader.fieldnames}, expected {columns}")
        return list(reader)


def read_gradebook(out: Path) -> list[ExerciseResult]:
    """The results a gradebook folder holds (feedback pages referenced, not read)."""
    out = Path(out)
    cells: dict[tuple[str, str], list[CellResult]] = {}
    for row in _read_csv(out / "grades_per_cell.csv", _CELL_COLUMNS):
        c = CellResult(row["student"], row["exercise"], row["cell"], float(row["points"]), float(row["max_points"]),
                       row["status"], row["message"])
        cells.setdefault((c.student, c.exercise), []).append(c)
    results = []
    for row in _read_csv(out / "grades.csv", _EXERCISE_COLUMNS):
        key = (row["student"], row["exercise"])
        page = out / "feedback" / key[0] / f"{key[1]}.html"
        results.append(ExerciseResult(*key, float(row["score"]), float(row["max_score"]), row["status"], row["message"],
                                      cells.get(key, []), str(page) if page.is_file() else None, row["edition"]))
    return results
