"""An ``.ipynb`` file as data, for every course tool: cells (plain dicts), reading (:func:`read_notebook`: nbformat's
schema check), writing (:func:`dumps_notebook`: deterministic text; :func:`write_atomic`), and the config of every
kernel the tools start (:func:`kernel_config`). Nothing here executes a notebook."""

from __future__ import annotations

import json
import os
import re
import tempfile
import uuid
from pathlib import Path
from typing import Any

__all__ = ["HIDDEN_BEGIN", "HIDDEN_END", "cell_source", "strip_ansi", "first_line", "nbgrader_meta", "is_test_cell", "cells_by_id",
           "strip_hidden", "hidden_lines", "load_json", "read_notebook", "dumps_notebook", "write_atomic", "skip_slow_imports",
           "kernel_config", "describe_cell"]

HIDDEN_BEGIN, HIDDEN_END = "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_CELL_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def skip_slow_imports() -> None:
    """Make ``jsonschema`` skip ``rfc3987_syntax`` in this process (call before nbformat is imported).

    jsonschema imports it eagerly to check the ``iri`` formats, and it compiles ~40 Lark grammars at
    import: 1.5-4 s per process (python-jsonschema/jsonschema#1428), paid by every grading process.
    No notebook or nbgrader schema uses those formats; jsonschema skips them when the import fails.
    """
    import sys

    sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]  # None: "import fails"


def kernel_config(ipc_dir: str | os.PathLike | None = None) -> Any:
    """The traitlets config of every kernel we start (nbclient's, nbgrader's and papermill's): one per kernel.

    IPC transport: the kernel's sockets are files under a path made fresh by each call (in ``ipc_dir``, else
    the temporary folder), so kernels started at the same moment never race for a TCP port (jupyter_client
    picks a free port, frees it and hands it to the kernel: "Address already in use"), no socket is reachable
    over the network, and a kernel in a sandbox without a network (:mod:`tinytf.course.grade.sandbox`) still
    talks to its client through the folder they share. jupyter_client provisions CurveZMQ keys for kernelspecs
    that declare ``supported_encryption: curve`` (ipykernel >= 7). The kernel is stopped as soon as the run
    ends (``shutdown_kernel = "immediate"``: a graceful shutdown only waits, 0.7-1 s a notebook).
    """
    import zmq  # Jupyter's messaging and config: kept out of `import tinytf`
    from traitlets.config import Config

    c = Config()
    c.KernelManager.transport = "ipc"
    base = Path(ipc_dir) if ipc_dir is not None else Path(tempfile.gettempdir())
    c.KernelManager.ip = str(base / f"k-{uuid.uuid4().hex[:12]}")  # sockets: <ip>-<port> (short: a socket path has 108 bytes)
    c.KernelManager.transport_encryption = "auto" if zmq.has("curve") else "disabled"
    c.NotebookClient.shutdown_kernel = "immediate"
    return c


def cell_source(cell: dict) -> str:
    """The cell's ``source`` as one string (nbformat allows a list of lines)."""
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def strip_ansi(text: str) -> str:
    """``text`` without terminal colour codes (IPython tracebacks are full of them)."""
    return _ANSI.sub("", text)


def first_line(text: str, n: int = 240) -> str:
    """The first line of ``text`` (colour codes removed, stripped), at most ``n`` characters."""
    return (strip_ansi(text).strip().splitlines() or [""])[0][:n]


def nbgrader_meta(cell: dict) -> dict:
    """The cell's ``metadata["nbgrader"]`` dict (empty when absent or malformed)."""
    meta = cell.get("metadata", {}) if isinstance(cell, dict) else {}
    nbg = meta.get("nbgrader") if isinstance(meta, dict) else None
    return nbg if isinstance(nbg, dict) else {}


def is_test_cell(cell: dict) -> bool:
    """An autograded test cell: a graded code cell that is not a solution."""
    meta = nbgrader_meta(cell)
    return bool(meta.get("grade")) and not meta.get("solution") and cell.get("cell_type") == "code"


def cells_by_id(nb: Any) -> dict[str, dict]:
    """``{grade_id: cell}`` for the cells with an nbgrader ``grade_id`` (the first one wins)."""
    out: dict[str, dict] = {}
    for cell in nb.get("cells", []) if isinstance(nb, dict) else []:
        gid = nbgrader_meta(cell).get("grade_id")
        if isinstance(gid, str) and gid not in out:
            out[gid] = cell
    return out


def strip_hidden(source: str) -> str:
    """``source`` without its ``### BEGIN HIDDEN TESTS`` … ``### END HIDDEN TESTS`` blocks (lines included)."""
    out, hidden = [], False
    for line in source.split("\n"):
        if HIDDEN_BEGIN in line:
            hidden = True
        elif HIDDEN_END in line:
            hidden = False
        elif not hidden:
            out.append(line)
    return "\n".join(out)


def hidden_lines(source: str) -> set[int]:
    """1-based line numbers inside hidden-test blocks (markers included)."""
    hidden, inside = set(), False
    for i, line in enumerate(source.split("\n"), start=1):
        if HIDDEN_BEGIN in line:
            inside = True
        if inside:
            hidden.add(i)
        if HIDDEN_END in line:
            inside = False
    return hidden


def load_json(path: str | os.PathLike) -> Any:
    """``json.loads`` of a UTF-8 file (our own files: no friendly error)."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def read_notebook(path: str | os.PathLike) -> dict:
    """The notebook JSON as a dict; ValueError with a short reason when it is not a notebook."""
    skip_slow_imports()  # also in a student's kernel (the self-check reads the notebook): 1.4-3.6 s there
    import nbformat

    try:
        nb = json.loads(Path(path).read_bytes().decode("utf-8"))
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


def dumps_notebook(nb: Any) -> str:
    """Deterministic JSON for a notebook: sorted keys, 1-space indent, stable cell ids, final newline.

    Cell ids that are missing or duplicated are replaced by ``cell-NNN`` (position), never random.
    """
    skip_slow_imports()
    import nbformat

    nb = json.loads(json.dumps(nb))  # plain dicts, a private copy
    nb.setdefault("nbformat", 4)
    nb["nbformat_minor"] = max(int(nb.get("nbformat_minor", 5)), 5)
    seen: set[str] = set()
    for i, cell in enumerate(nb.get("cells", [])):
        cid = cell.get("id")
        if not isinstance(cid, str) or not _CELL_ID.fullmatch(cid) or cid in seen:
            cid = f"cell-{i:03d}"
        seen.add(cid)
        cell["id"] = cid
        if isinstance(cell.get("source"), list):
            cell["source"] = "".join(cell["source"])
    text = nbformat.writes(nbformat.from_dict(nb), version=4)  # json with sort_keys=True, indent=1
    return text if text.endswith("\n") else text + "\n"


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Write ``data`` to ``path`` through a temp file in the same folder and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; gradebooks and exercises are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _defines(source: str) -> list[str]:
    """Names of the functions and classes a code cell defines (top level), in order."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return re.findall(r"^(?:def|class)\s+([A-Za-z_]\w*)", source, re.M)
    return [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def describe_cell(cells: list[dict], index: int, lang: str = "en") -> str:
    """How a student finds ``cells[index]`` in JupyterLab: what it defines, or the heading above it,
    and its position — ``cell 7 (defines scores_by_hand)`` or ``cell 9 (under "Task 1b — scaling")``
    (``lang="zh"``: ``第 7 个单元（定义 scores_by_hand）``)."""
    cell = cells[index]
    zh = lang == "zh"
    where = f"第 {index + 1} 个单元" if zh else f"cell {index + 1}"
    names = _defines(cell_source(cell)) if cell.get("cell_type") == "code" else []
    if names:
        return f"{where}（定义 {', '.join(names)}）" if zh else f"{where} (defines {', '.join(names)})"
    for prev in reversed(cells[:index]):
        if prev.get("cell_type") == "markdown":
            heading = next((ln.lstrip("#").strip() for ln in cell_source(prev).splitlines() if ln.startswith("#")), None)
            if heading:
                return f"{where}（“{first_line(heading, 60)}”之下）" if zh else f'{where} (under "{first_line(heading, 60)}")'
    return where
