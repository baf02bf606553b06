"""``tinytf release``: the student notebooks in ``exercises/`` from the instructor ones in ``solutions/``.

nbgrader's ``generate_assignment`` does the work (solution regions -> ``raise NotImplementedError()``,
hidden tests removed, cells locked, checksums) inside a temporary course root with one assignment
per exercise (see :mod:`tinytf.course.nbgrader_root`). The result is written with sorted keys,
stable cell ids and a final newline, so releasing twice gives byte-identical files.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from .nbgrader_root import REPO, build_course_root, find_notebooks
from .notebook import dumps_notebook, load_json, write_atomic

__all__ = ["release", "release_editions", "released_text", "EDITION_FOLDERS"]

# (instructor sources, student versions) of each edition; the Chinese twins live in zh/ subfolders
EDITION_FOLDERS = {"en": ("solutions", "exercises"), "zh": ("solutions/zh", "exercises/zh")}


def released_text(root: Path, ex: str, name: str) -> str:
    """The deterministic text of ``root/release/<ex>/<name>``."""
    return dumps_notebook(load_json(root / "release" / ex / name))


def release(
    solutions: str | Path = REPO / "solutions",
    out: str | Path = REPO / "exercises",
    exercises: Iterable[str] | None = None,
    *,
    prune: bool | None = None,
) -> list[Path]:
    """Generate the student version of each ``solutions/exNN_*.ipynb`` into ``out``; return the paths.

    ``exercises`` limits it to some ids (``["ex01"]``). ``prune`` (default: when releasing all)
    removes ``out/exNN_*.ipynb`` files that no longer have a solution. Files whose content is
    unchanged are not rewritten.
    """
    sols = find_notebooks(solutions, exercises)
    if not sols:
        raise FileNotFoundError(f"no exNN_*.ipynb notebooks in {solutions}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="tinytf-release-"))
    try:
        root, names = build_course_root(sols, tmp / "course")
        written = []
        for ex, name in sorted(names.items()):
            text = released_text(root, ex, name)
            dest = out / name
            if not dest.exists() or dest.read_text(encoding="utf-8") != text:
                write_atomic(dest, text)
            written.append(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if prune if prune is not None else exercises is None:
        keep = {p.name for p in written}
        for stale in out.glob("ex[0-9][0-9]*.ipynb"):
            if stale.name not in keep:
                stale.unlink()
    return written


def release_editions(repo: str | Path = REPO, exercises: Iterable[str] | None = None) -> list[Path]:
    """:func:`release` for every edition whose ``solutions`` folder exists: ``solutions/`` ->
    ``exercises/`` and ``solutions/zh/`` -> ``exercises/zh/``. Each edition is released on its own
    (nbgrader's checksums cover the comments, which the Chinese twins translate)."""
    repo = Path(repo)
    written: list[Path] = []
    for src, out in EDITION_FOLDERS.values():
        if find_notebooks(repo / src):
            written += release(repo / src, repo / out, exercises)
    return written
