"""The registry of the course's exercises: their ids, the folders of each edition, the repository root.

Every other course module that needs to know which exercises exist imports them from here; this module
imports nothing of :mod:`tinytf.course` in return, so it can sit under all of them without a loop.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

__all__ = ["EXERCISES", "EDITION_FOLDERS", "REPO", "REFERENCE_MODULES", "exercise_id", "find_notebooks"]

REPO = Path(__file__).resolve().parents[2]

EXERCISES = ("ex01", "ex02", "ex03", "ex04", "ex05", "ex06", "ex07", "ex08", "ex09", "ex10", "ex11", "ex12")

# (instructor sources, student versions) of each edition; the Chinese twins live in zh/ subfolders
EDITION_FOLDERS = {"en": ("solutions", "exercises"), "zh": ("solutions/zh", "exercises/zh")}

# exercise id -> the module with its judges and diagnose() (tinytf/course/reference/exNN.py)
REFERENCE_MODULES = {ex: f"tinytf.course.reference.{ex}" for ex in EXERCISES}

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
