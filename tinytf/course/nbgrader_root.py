"""A temporary nbgrader course root over our flat layout, and deterministic notebook I/O.

nbgrader wants ``<root>/source/<assignment>/<notebook>.ipynb``; tinytf keeps
``solutions/exNN_name.ipynb``. We use ONE nbgrader assignment PER EXERCISE: assignment ``exNN``
holds the single notebook ``exNN_name.ipynb``. So a course root looks like::

    root/gradebook.db                          (sqlite, rebuilt every run, never committed)
    root/source/ex01/ex01_by_hand.ipynb        (copied from solutions/)
    root/release/ex01/ex01_by_hand.ipynb       (generate_assignment: the student version)
    root/submitted/<student>/ex01/ex01_by_hand.ipynb
    root/autograded/<student>/ex01/...         (autograde)
    root/feedback/<student>/ex01/...html       (generate_feedback)

Everything is configured programmatically (no ``nbgrader_config.py`` is read). The notebook
helpers (reading, deterministic writing, cell metadata) are in :mod:`tinytf.course.notebook`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .notebook import kernel_config

__all__ = [
    "COURSE_ID",
    "REPO",
    "exercise_id",
    "find_notebooks",
    "nbgrader_config",
    "api",
    "ensure_tool_path",
    "build_course_root",
]

COURSE_ID = "tinytf"
REPO = Path(__file__).resolve().parents[2]
_EX = re.compile(r"^(ex\d\d)(?:_[A-Za-z0-9_-]*)?$")


def exercise_id(name: str | os.PathLike) -> str:
    """``"ex03"`` from ``"ex03_heads.ipynb"`` / a path / ``"ex03"``; ValueError otherwise."""
    stem = Path(name).name.removesuffix(".ipynb")
    m = _EX.match(stem)
    if not m:
        raise ValueError(f"{name!s}: exercise notebooks are named exNN_<topic>.ipynb (e.g. ex03_heads.ipynb)")
    return m.group(1)


def find_notebooks(folder: str | os.PathLike, exercises: Iterable[str] | None = None) -> dict[str, Path]:
    """``{exercise_id: path}`` for ``folder/exNN_*.ipynb``, optionally only ``exercises``."""
    wanted = set(exercises) if exercises is not None else None
    out: dict[str, Path] = {}
    for path in sorted(Path(folder).glob("ex[0-9][0-9]*.ipynb")):
        try:
            ex = exercise_id(path)
        except ValueError:
            continue
        if wanted is None or ex in wanted:
            if ex in out:
                raise ValueError(f"two notebooks for {ex}: {out[ex].name} and {path.name}")
            out[ex] = path
    if wanted is not None and set(out) != wanted:
        raise FileNotFoundError(f"no notebook in {folder} for {sorted(wanted - set(out))}")
    return out


def ensure_tool_path() -> None:
    """nbgrader shells out to ``alembic``: put this interpreter's bin folder first on PATH."""
    bindir = str(Path(sys.executable).parent)
    parts = os.environ.get("PATH", "").split(os.pathsep)
    if parts[:1] != [bindir]:
        os.environ["PATH"] = os.pathsep.join([bindir, *parts])


# what nbgrader writes where a solution was: the code is the same in both editions, the words are not
_STUBS = {
    "en": ("# YOUR CODE HERE\nraise NotImplementedError()", "YOUR ANSWER HERE"),
    "zh": ("# 在这里写你的代码\nraise NotImplementedError()", "在这里写下你的回答"),
}


def nbgrader_config(root: str | os.PathLike, *, timeout: int = 60, max_output_lines: int = 200, edition: str = "en"):
    """A traitlets Config for a course root; ``timeout`` is nbgrader's per-cell timeout (s); ``edition``
    (``"en"``/``"zh"``) picks the language of the stubs that replace solutions."""
    from traitlets.config import Config

    root = Path(root).resolve()
    c = Config()
    c.CourseDirectory.root = str(root)
    c.CourseDirectory.course_id = COURSE_ID
    c.CourseDirectory.db_url = f"sqlite:///{root / 'gradebook.db'}"
    c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback"]
    c.Execute.timeout = int(timeout)
    c.Execute.execute_retries = 0  # a notebook that kills its kernel is not retried
    c.Execute.interrupt_on_timeout = True
    c.Execute.kernel_name = "python3"  # this interpreter's own kernel, whatever kernelspec the notebook names
    c.LimitOutput.max_lines = max_output_lines
    c.LimitOutput.max_traceback = 60
    c.Exchange.root = str(root / "exchange")  # never touch /srv/nbgrader
    code_stub, text_stub = _STUBS.get(edition, _STUBS["en"])
    c.ClearSolutions.code_stub = {"python": code_stub}
    c.ClearSolutions.text_stub = text_stub
    c.merge(kernel_config())  # encrypted kernel sockets where the kernelspec allows it
    return c


def api(root: str | os.PathLike, **config_kwargs: Any):
    """An ``nbgrader.apps.NbGraderAPI`` on ``root`` (logging kept quiet)."""
    import logging

    ensure_tool_path()
    from nbgrader.apps import NbGraderAPI

    (Path(root) / "exchange").mkdir(parents=True, exist_ok=True)
    a = NbGraderAPI(config=nbgrader_config(root, **config_kwargs))
    a.log.setLevel(logging.WARNING)
    return a


def build_course_root(solutions: dict[str, Path], root: str | os.PathLike | None = None) -> tuple[Path, dict[str, str]]:
    """Copy ``solutions`` ({ex: path}) to ``root/source/<ex>/`` and run generate_assignment for each.

    Returns ``(root, {ex: notebook file name})``; ``root`` is a new temp folder when not given.
    Raises RuntimeError with nbgrader's log when generation fails (bad metadata, unclosed markers).
    The stubs are in the solutions' edition (``metadata.tinytf.edition``; all must agree).
    """
    from .editions import edition

    langs = {edition(json.loads(Path(p).read_text(encoding="utf-8"))) for p in solutions.values()}
    if len(langs) > 1:
        raise ValueError(f"solutions of both editions in one course root ({sorted(langs)}): release each folder on its own")
    root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="tinytf-course-"))
    root.mkdir(parents=True, exist_ok=True)
    names: dict[str, str] = {}
    for ex, path in sorted(solutions.items()):
        dest = root / "source" / ex / path.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)
        names[ex] = path.name
    a = api(root, edition=langs.pop() if langs else "en")
    for ex in sorted(solutions):
        result = a.generate_assignment(ex, force=True, create=True)
        if not result.get("success"):
            raise RuntimeError(f"nbgrader generate_assignment {ex} failed:\n{result.get('log', '')}\n{result.get('error', '')}")
    return root, names
