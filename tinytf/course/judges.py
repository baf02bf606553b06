"""Reference judges for exported exercise results, run in a clean process by the grader.

A judge is registered for an autograded test cell's nbgrader ``grade_id``::

    @judge("ex01_weights")
    def _(value, q, k, v):                 # the inputs passed to record(...)
        expected = reference(q, k, v)
        assert torch.allclose(value, expected, atol=1e-5), "weights differ from the reference"

A judge returns None when the value is right and raises ``AssertionError`` (with a short,
student-safe message) when it is wrong. It must recompute the reference from the inputs with
tinytf/torch, never trust anything else the notebook produced.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from .exercises import REFERENCE_MODULES

__all__ = ["judge", "JUDGES", "run_judge", "load_all"]

JUDGES: dict[str, Callable[..., None]] = {}


def judge(grade_id: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register ``fn(value, **inputs)`` as the judge of test cell ``grade_id``."""

    def register(fn: Callable[..., None]) -> Callable[..., None]:
        if grade_id in JUDGES:
            raise ValueError(f"a judge for {grade_id!r} is already registered")
        JUDGES[grade_id] = fn
        return fn

    return register


def load_all() -> dict[str, Callable[..., None]]:
    """Import every exercise's reference module (:data:`tinytf.course.exercises.REFERENCE_MODULES`) so its
    judges register; return JUDGES. The modules import this one for :func:`judge`, so they are loaded by
    name here, not imported at the top (which would be a loop)."""
    for name in REFERENCE_MODULES.values():
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name != name:
                raise
    return JUDGES


def run_judge(grade_id: str, value: Any, inputs: dict[str, Any]) -> tuple[bool, str]:
    """``(passed, message)`` from the judge for ``grade_id``; a judge that crashes fails."""
    fn = load_all().get(grade_id)
    if fn is None:
        return True, "no judge registered"
    try:
        fn(value, **inputs)
    except AssertionError as err:
        return False, str(err) or "wrong result"
    except Exception as err:  # noqa: BLE001 - a malformed export is a failure, not a crash
        return False, f"{type(err).__name__}: {err}"
    return True, "ok"
