"""nbgrader course roots over our flat layout: ONE nbgrader assignment PER EXERCISE (``exNN`` holds
``exNN_name.ipynb``), so a root is ``gradebook.db``, ``source/ex01/ex01_by_hand.ipynb`` (from solutions/),
``release/…`` (generate_assignment), ``submitted/<student>/…``, ``autograded/<student>/…`` and ``feedback/…``.

:func:`cached_course_root` keeps built roots under ``build/course-roots/<key>/``, keyed by a hash of the
solutions, the released copies, tinytf's source and nbgrader's version: a grading run (or a test session)
builds each edition's root once, and any edit to those inputs rebuilds it. Everything is configured
programmatically (no ``nbgrader_config.py`` is read).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..exercises import REPO, exercise_id, find_notebooks
from ..ipynb import kernel_config

__all__ = ["SUPPORT_FILES", "COURSE_ID", "nbgrader_config", "api", "ensure_tool_path", "build_course_root", "course_root_key",
           "cached_course_root"]

COURSE_ID = "tinytf"
SUPPORT_FILES = ("matplotlibrc",)  # a solutions folder's files its exercises need (the CJK font of zh figures)
PACKAGE = Path(__file__).resolve().parents[2]  # tinytf/: its source is part of a cached root's key
CACHE = REPO / "build" / "course-roots"
_KEEP = 12  # cached roots kept (the most recently used)


def ensure_tool_path() -> None:
    """nbgrader shells out to ``alembic``: put this interpreter's bin folder first on PATH."""
    bindir = str(Path(sys.executable).parent)
    parts = os.environ.get("PATH", "").split(os.pathsep)
    if parts[:1] != [bindir]:
        os.environ["PATH"] = os.pathsep.join([bindir, *parts])


@functools.cache
def alembic_head() -> str:
    """The newest revision of nbgrader's gradebook schema (what ``alembic heads`` prints), read from the
    migration scripts nbgrader ships, in this process (0.1 s instead of a 4 s ``alembic`` subprocess)."""
    import nbgrader
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(Path(nbgrader.__file__).parent / "alembic"))
    return ScriptDirectory.from_config(config).get_current_head()


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
    c.Execute.shutdown_kernel = "immediate"  # every output is in; a graceful shutdown only waits (1-3 s)
    # nbgrader raises when a cell's output arrives more than iopub_timeout seconds after its reply (nbclient's
    # default: 4 s); on a busy machine that turned a correct cell into "error". The cell timeout bounds it instead.
    c.Execute.iopub_timeout = max(int(timeout), 4)
    c.Execute.kernel_name = "python3"  # this interpreter's own kernel, whatever kernelspec the notebook names
    c.LimitOutput.max_lines = max_output_lines
    c.LimitOutput.max_traceback = 60
    c.Exchange.root = str(root / "exchange")  # never touch /srv/nbgrader
    code_stub, text_stub = _STUBS.get(edition, _STUBS["en"])
    c.ClearSolutions.code_stub = {"python": code_stub}
    c.ClearSolutions.text_stub = text_stub
    c.merge(kernel_config())  # IPC sockets of its own, encrypted where the kernelspec allows it
    return c


def api(root: str | os.PathLike, **config_kwargs: Any):
    """An ``nbgrader.apps.NbGraderAPI`` on ``root`` (logging kept quiet)."""
    import logging

    ensure_tool_path()
    import nbgrader.api
    from nbgrader.apps import NbGraderAPI

    # a new gradebook asks `alembic heads` for a constant in a new interpreter (4 s, every course root and release)
    nbgrader.api.get_alembic_version = alembic_head

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
        for name in SUPPORT_FILES:  # nbgrader releases an assignment folder's other files with it
            if (Path(path).parent / name).is_file():
                shutil.copyfile(Path(path).parent / name, dest.parent / name)
        names[ex] = path.name
    a = api(root, edition=langs.pop() if langs else "en")
    for ex in sorted(solutions):
        result = a.generate_assignment(ex, force=True, create=True)
        if not result.get("success"):
            raise RuntimeError(f"nbgrader generate_assignment {ex} failed:\n{result.get('log', '')}\n{result.get('error', '')}")
    return root, names


def _edition_folder(solutions_dir: Path, edition: str) -> Path:
    return solutions_dir if edition == "en" else solutions_dir / edition


def course_root_key(solutions: dict[str, Path], released: str | os.PathLike | None = None,
                    source: str | os.PathLike = PACKAGE) -> str:
    """A hash of what a course root is built from: each solution notebook (name and bytes), the
    released copies of the same names in ``released``, every ``*.py`` of tinytf's ``source`` and
    nbgrader's version."""
    from importlib.metadata import version

    h = hashlib.sha256(f"nbgrader {version('nbgrader')}\n".encode())
    for ex, path in sorted(solutions.items()):
        h.update(f"solution {ex} {Path(path).name}\n".encode() + Path(path).read_bytes())
        for name in SUPPORT_FILES:
            if (Path(path).parent / name).is_file():
                h.update(f"support {name}\n".encode() + (Path(path).parent / name).read_bytes())
        copy = Path(released) / Path(path).name if released else None
        if copy is not None and copy.is_file():
            h.update(f"released {copy.name}\n".encode() + copy.read_bytes())
    manifest = Path(released) / "releases.json" if released else None
    if manifest is not None and manifest.is_file():  # every release's test cells (tinytf.course.build.release)
        h.update(b"releases.json\n" + manifest.read_bytes())
    for py in sorted(Path(source).rglob("*.py")):
        h.update(f"source {py.relative_to(source).as_posix()}\n".encode() + py.read_bytes())
    return h.hexdigest()[:24]


def _prune(cache: Path, keep: int) -> None:
    roots = sorted((p for p in cache.iterdir() if p.is_dir() and not p.name.startswith(".")), key=lambda p: p.stat().st_mtime)
    for old in roots[:-keep] if len(roots) > keep else []:
        shutil.rmtree(old, ignore_errors=True)


def cached_course_root(solutions_dir: str | os.PathLike = REPO / "solutions", exercises: Iterable[str] | None = None,
                       edition: str = "en", *, released: str | os.PathLike | None = None,
                       cache: str | os.PathLike = CACHE) -> Path:
    """The course root of ``edition``'s solutions (``solutions_dir`` for ``"en"``, ``solutions_dir/zh``
    for ``"zh"``), optionally only ``exercises``, with ``released/<name>`` copied to
    ``released-earlier/`` (``released``: that edition's folder of student versions).

    Built once into ``cache/<key>/`` (:func:`course_root_key`) and reused while no solution, released
    copy, tinytf source file or the nbgrader version changes; a change gets a new key, so a new root.
    Callers only read the root (jobs copy its ``gradebook.db``). Concurrent builders are safe: each
    builds in a private folder and renames it into place; the first one wins.
    """
    sols = find_notebooks(_edition_folder(Path(solutions_dir), edition), exercises)
    if not sols:
        raise FileNotFoundError(f"no exNN_*.ipynb in {_edition_folder(Path(solutions_dir), edition)}")
    cache = Path(cache)
    root = cache / course_root_key(sols, released)
    if (root / "gradebook.db").is_file():
        os.utime(root)  # recently used: kept by _prune
        return root
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=cache))
    try:
        build_course_root(sols, tmp)
        for path in sols.values():
            if released and (Path(released) / path.name).is_file():
                (tmp / "released-earlier").mkdir(exist_ok=True)
                shutil.copyfile(Path(released) / path.name, tmp / "released-earlier" / path.name)
        if released and (Path(released) / "releases.json").is_file():  # every release's test cells
            (tmp / "released-earlier").mkdir(exist_ok=True)
            shutil.copyfile(Path(released) / "releases.json", tmp / "released-earlier" / "releases.json")
        try:
            os.rename(tmp, root)
        except OSError:  # another process put the same root in place first
            if not (root / "gradebook.db").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _prune(cache, _KEEP)
    return root
