"""The registry of the course's exercises: their ids, the folders of each edition, the repository root.

Every other course module that needs to know which exercises exist imports them from here; this module
imports nothing of :mod:`tinytf.course` in return, so it can sit under all of them without a loop.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["EXERCISES", "EDITION_FOLDERS", "REPO", "REFERENCE_MODULES"]

REPO = Path(__file__).resolve().parents[2]

EXERCISES = ("ex01", "ex02", "ex03", "ex04", "ex05", "ex06", "ex07", "ex08", "ex09", "ex10", "ex11", "ex12")

# (instructor sources, student versions) of each edition; the Chinese twins live in zh/ subfolders
EDITION_FOLDERS = {"en": ("solutions", "exercises"), "zh": ("solutions/zh", "exercises/zh")}

# exercise id -> the module with its judges and diagnose() (tinytf/course/reference/exNN.py)
REFERENCE_MODULES = {ex: f"tinytf.course.reference.{ex}" for ex in EXERCISES}
