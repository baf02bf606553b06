"""The student's feedback page of one graded job: :func:`sanitize_for_feedback` makes a copy of the autograded
notebook safe to show (hidden tests and test-cell tracebacks removed — nbgrader 0.9.6's feedback keeps hidden tests —,
each test cell showing its points, status and message, long outputs cut); :func:`feedback_page` writes it as
``<job>/feedback.html`` with nbconvert, the points table on top (a plain page when it cannot be rendered).
"""

from __future__ import annotations

import functools
import html
import json
from pathlib import Path
from typing import Any

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
    each test cell shows its points, status and message in ``lang``."""
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
            text = f"{r.points:g} / {r.max_points:g} — {status_name(r.status, lang)}"
            text += f": {translate(r.message, lang)}" if r.message else ""
            cell["outputs"] = [{"output_type": "stream", "name": "stdout" if r.status == "ok" else "stderr", "text": text + "\n"}]
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


@functools.cache
def _exporter() -> Any:
    """nbconvert's HTML exporter, made once per grading worker (its templates are parsed once, not per page). What a
    student wrote and printed is sanitised (``sanitize_html``). Highlighting and sanitising a cell are remembered by its
    text: the released notebook's own cells, the same in every submission of an exercise, are done once per worker."""
    from nbconvert import HTMLExporter
    from nbconvert.filters import Highlight2HTML
    from nbconvert.filters.strings import clean_html

    highlight = Highlight2HTML(pygments_lexer="ipython3")
    remembered = functools.lru_cache(maxsize=8192)
    highlight_text = remembered(lambda source, language: highlight(source, language))
    return HTMLExporter(template_name="classic", sanitize_html=True,
                        filters={"highlight_code": lambda source, language=None, metadata=None: highlight_text(source, language),
                                 "clean_html": remembered(clean_html)})


def feedback_page(job: Path, ex: str, student: str, name: str, cells: list[CellResult], note: str, autograded: dict,
                  lang: str = "en") -> Path:
    """``<job>/feedback.html``: the graded notebook made safe to show (:func:`sanitize_for_feedback`) as nbconvert's
    HTML, the points table on top, in the submission's language ``lang`` (a plain table when it cannot be rendered)."""
    out = job / "feedback.html"
    if autograded:
        nb = sanitize_for_feedback(autograded, cells, lang)
        nb["cells"].insert(0, _summary_cell(ex, student, cells, note, lang))
        try:
            import nbformat

            node = nbformat.reads(json.dumps(nb), as_version=4)  # sources as one string each, as nbconvert wants them
            body, _ = _exporter().from_notebook_node(node, resources={"metadata": {"name": f"{ex} — {student}"}})
            write_atomic(out, body)
            return out
        except Exception:  # noqa: BLE001 - a notebook nbconvert cannot render still gets its page, below
            pass
    write_atomic(out, plain_html(ex, student, cells, note, lang))
    return out
