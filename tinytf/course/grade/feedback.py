"""The student's feedback page of one graded job: :func:`sanitize_for_feedback` makes a copy of the autograded
notebook safe to show (hidden tests and test-cell tracebacks removed — nbgrader 0.9.6's feedback keeps hidden tests —,
each test cell showing its status and message, long outputs cut); :func:`feedback_page` writes ``<job>/feedback.html``
through ``nbgrader generate_feedback`` from it, a summary on top (a plain page when nbgrader cannot render it).
"""

from __future__ import annotations

import html
import json
import shutil
from pathlib import Path

from ..ipynb import cell_source, nbgrader_meta, strip_hidden, write_atomic
from ..messages import say, status_name, translate
from .gradebook import CellResult, plain_html

__all__ = ["sanitize_for_feedback", "feedback_page"]

_MAX_OUTPUT = 10_000  # characters kept per output in feedback


def _truncate(text: str) -> str:
    return text if len(text) <= _MAX_OUTPUT else text[:_MAX_OUTPUT] + f"\n… (output truncated: {len(text):,} characters)"


def _coalesced(outputs: list[dict]) -> list[dict]:
    """Consecutive stream outputs of one stream joined: how a kernel split its prints into messages
    depends on timing, and the feedback page must be the same on every run."""
    merged: list[dict] = []
    for out in outputs:
        prev = merged[-1] if merged else None
        if (out.get("output_type") == "stream" and prev is not None and prev.get("output_type") == "stream"
                and prev.get("name") == out.get("name")):
            prev["text"] = cell_source({"source": prev.get("text", "")}) + cell_source({"source": out.get("text", "")})
        else:
            merged.append(out)
    return merged


def _trimmed(outputs: list[dict]) -> list[dict]:
    outputs = _coalesced(outputs)
    for out in outputs:
        if out.get("output_type") == "stream":
            out["text"] = _truncate(cell_source({"source": out.get("text", "")}))
        elif out.get("output_type") == "error":
            out["traceback"] = [_truncate("\n".join(out.get("traceback", [])))]
        else:
            data = out.get("data", {})
            for key in list(data):
                if isinstance(data[key], (str, list)):
                    data[key] = _truncate(cell_source({"source": data[key]}))
    return outputs


def sanitize_for_feedback(nb: dict, cells: list[CellResult], lang: str = "en") -> dict:
    """A copy safe to show students: hidden tests and test-cell outputs removed, long outputs cut;
    each test cell shows its status and message in ``lang``."""
    nb = json.loads(json.dumps(nb))
    by_id = {c.cell: c for c in cells}
    for cell in nb.get("cells", []):
        src = cell_source(cell)
        meta = nbgrader_meta(cell)
        if "HIDDEN TESTS" in src:
            cell["source"] = strip_hidden(src)
        if cell.get("cell_type") != "code":
            continue
        if meta.get("grade_id") in by_id and meta.get("grade") and not meta.get("solution"):  # a test cell
            r = by_id[meta["grade_id"]]
            status = status_name(r.status, lang)
            text = f"{status}: {translate(r.message, lang)}" if r.message else status
            cell["outputs"] = [] if r.status == "ok" else [{"output_type": "stream", "name": "stderr", "text": text + "\n"}]
        else:
            cell["outputs"] = _trimmed(cell.get("outputs", []))
    return nb


def _summary_cell(ex: str, student: str, cells: list[CellResult], note: str, lang: str = "en") -> dict:
    rows = "\n".join(f"| `{c.cell}` | {c.points:g} / {c.max_points:g} | {status_name(c.status, lang)} | "
                     f"{html.escape(translate(c.message, lang))} |" for c in cells)
    total = sum(c.points for c in cells)
    best = sum(c.max_points for c in cells)
    text = f"## {say('fb_title', lang, ex=ex, student=student)}\n\n{say('fb_points', lang, total=total, best=best)}\n\n"
    if note:
        text += say("fb_note", lang, note=html.escape(translate(note, lang))) + "\n\n"
    text += say("fb_columns", lang) + "\n|---|---|---|---|\n" + rows + "\n"
    return {"cell_type": "markdown", "id": "tinytf-grading-summary", "metadata": {}, "source": text}


def _zero_failed(job: Path, ex: str, student: str, name: str, cells: list[CellResult]) -> None:
    """Our verdict overrides nbgrader's in the job's gradebook, so its feedback page shows our points."""
    from nbgrader.api import Gradebook

    from ..build.nbgrader_root import COURSE_ID

    with Gradebook(f"sqlite:///{job / 'gradebook.db'}", COURSE_ID) as gb:
        for c in cells:
            if c.status not in ("ok", "needs-manual-grade"):
                try:
                    g = gb.find_grade(c.cell, Path(name).stem, ex, student)
                except Exception:  # noqa: BLE001 - a cell nbgrader never saw
                    continue
                g.manual_score = 0.0
        gb.db.commit()


def feedback_page(job: Path, ex: str, student: str, name: str, cells: list[CellResult], note: str, autograded: dict,
                  lang: str = "en") -> Path:
    """The student's feedback page, in the submission's language ``lang``."""
    out = job / "feedback.html"
    if not autograded:
        write_atomic(out, plain_html(ex, student, cells, note, lang))
        return out
    nb = sanitize_for_feedback(autograded, cells, lang)
    nb["cells"].insert(0, _summary_cell(ex, student, cells, note, lang))
    write_atomic(job / "autograded" / student / ex / name, json.dumps(nb))
    try:
        from ..build.nbgrader_root import api

        _zero_failed(job, ex, student, name, cells)
        result = api(job).generate_feedback(ex, student, force=True)
        html_path = job / "feedback" / student / ex / (Path(name).stem + ".html")
        if result.get("success") and html_path.exists():
            shutil.copyfile(html_path, out)
            return out
    except Exception:  # noqa: BLE001 - fall back to the plain page below
        pass
    write_atomic(out, plain_html(ex, student, cells, note, lang))
    return out
