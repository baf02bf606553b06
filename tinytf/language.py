"""Which edition of the workbook is running: English (``"en"``) or Chinese (``"zh"``).

The two editions run the same code, so a function that prints for students (a self-check, the
pitfall table) asks :func:`notebook_language` which language to speak. The answer always comes
from a notebook's metadata (``metadata.tinytf.edition``), never from a folder name:

1. ``TINYTF_LANG`` (``en``/``zh``), set by ``tinytf validate`` and the grader for the notebook they run;
2. the notebook JupyterLab runs this kernel for (``JPY_SESSION_NAME``, set by jupyter-server);
3. the notebooks in the working directory (where nbval, papermill and JupyterLab start a kernel),
   when they are all of one edition;
4. English.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["LANGUAGES", "edition_of", "notebook_language", "edition_folder"]

LANGUAGES = ("en", "zh")


def edition_of(nb: dict[str, Any]) -> str:
    """``"zh"`` or ``"en"``: a notebook's ``metadata.tinytf.edition`` (English when absent)."""
    meta = nb.get("metadata") if isinstance(nb, dict) else None
    tinytf_meta = meta.get("tinytf") if isinstance(meta, dict) else None
    value = tinytf_meta.get("edition", "en") if isinstance(tinytf_meta, dict) else "en"
    return value if value in LANGUAGES else "en"


def _file_edition(path: Path) -> str | None:
    try:
        return edition_of(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None


def _session_notebook() -> Path | None:
    name = os.environ.get("JPY_SESSION_NAME", "")
    if not name.endswith(".ipynb"):
        return None
    for cand in (Path(name), Path.cwd() / Path(name).name):
        if cand.is_file():
            return cand
    return None


def notebook_language(default: str = "en") -> str:
    """The language of the running notebook (see the module docstring for the order of evidence)."""
    env = os.environ.get("TINYTF_LANG", "").strip().lower()
    if env in LANGUAGES:
        return env
    session = _session_notebook()
    if session is not None and (found := _file_edition(session)) is not None:
        return found
    try:
        here = {e for p in sorted(Path.cwd().glob("*.ipynb"))[:50] if (e := _file_edition(p)) is not None}
    except OSError:
        here = set()
    if len(here) == 1:
        return here.pop()
    return default if default in LANGUAGES else "en"


def edition_folder(folder: str | os.PathLike, lang: str | None = None) -> Path:
    """Where ``folder``'s notebooks of an edition live: ``folder/zh`` for the Chinese edition (when that
    folder exists), ``folder`` itself for English. ``lang`` defaults to :func:`notebook_language`, so one
    line of code reads ``notebooks/`` in an English chapter and ``notebooks/zh/`` in its Chinese twin."""
    base = Path(folder)
    lang = lang if lang in LANGUAGES else notebook_language()
    twin = base / lang
    return twin if lang != "en" and twin.is_dir() else base
