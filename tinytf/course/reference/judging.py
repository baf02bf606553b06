"""How a test cell's result is judged: recorded in the student's kernel, judged again in a clean process.

A hidden test ends with ``judged_record(grade_id, value, **inputs)``: it runs the judge registered for
``grade_id`` on the value (as the grader will see it, on the CPU) and raises ``AssertionError`` with the
judge's message when it rejects — so a wrong answer fails its own test cell with the same words — and
otherwise :func:`record` s it. During grading the environment variable ``TINYTF_RECORD_DIR`` names a
folder; :func:`record` saves ``{"value", "inputs", "interference"}`` to ``<dir>/<grade_id>.pt``
(``torch.save``), and the grader's judging process loads it (``weights_only=True``, :func:`load_records`)
and asks the judge again (:func:`run_judge`), where a student who monkeypatches ``torch.allclose`` or the
test helpers inside their own kernel cannot reach. Outside grading ``record`` does nothing.

A judge is registered for an autograded test cell's nbgrader ``grade_id`` by the exercise's reference
module (``tinytf/course/reference/exNN.py``)::

    @judge("ex01_weights")
    def _(value, q, k, v):                 # the inputs passed to record(...)
        assert torch.allclose(value, reference(q, k, v), atol=1e-5), "weights differ from the reference"

It returns None when the value is right and raises ``AssertionError`` (a short, student-safe message)
when it is wrong, recomputing the reference from the inputs and trusting nothing else the notebook made.

Each record also lists the checking functions that were no longer the originals when it was written
(``"interference"``: ``torch.allclose`` replaced, say; the originals are taken when the notebook's locked
set-up cell imports this module). The grader calls a result ``tampered`` only on such evidence.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..exercises import REFERENCE_MODULES

__all__ = ["judge", "JUDGES", "run_judge", "load_all", "record", "judged_record", "load_records", "interference", "to_plain",
           "RECORD_ENV"]

JUDGES: dict[str, Callable[..., None]] = {}
RECORD_ENV = "TINYTF_RECORD_DIR"
_SAFE = re.compile(r"^[A-Za-z0-9_.-]+$")
# the functions a test cell's verdict rests on; replacing one in the kernel is evidence of interference
_WATCHED = ("torch.allclose", "torch.equal", "torch.isclose", "torch.testing.assert_close", "torch.Tensor.allclose",
            "torch.Tensor.equal", "math.isclose", "builtins.isinstance", "builtins.float", "builtins.abs")


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


def _resolve(dotted: str) -> Any:
    import builtins
    import math

    roots = {"torch": torch, "math": math, "builtins": builtins}
    head, *rest = dotted.split(".")
    obj: Any = roots[head]
    for part in rest:
        obj = getattr(obj, part, None)
    return obj


_ORIGINAL = {name: _resolve(name) for name in _WATCHED}  # taken when the locked set-up cell imports this module


def interference() -> list[str]:
    """The watched checking functions (and ``record`` itself) that have been replaced since import."""
    changed = [name for name in _WATCHED if _resolve(name) is not _ORIGINAL[name]]
    if globals().get("record") is not _RECORD:
        changed.append("tinytf.course.reference.judging.record")
    return changed


def to_plain(x: Any) -> Any:
    """Tensors are detached and moved to the CPU; containers are rebuilt as plain ones."""
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu").clone()
    if isinstance(x, dict):
        return {str(k): to_plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_plain(v) for v in x]
    if x is None:
        return x
    for kind in (bool, int, float, str):  # subclasses (e.g. torch.__version__) become the plain type,
        if isinstance(x, kind):  # which torch.load(weights_only=True) accepts
            return kind(x)
    raise TypeError(f"record: cannot export a value of type {type(x).__name__}; pass tensors, numbers, strings, lists or dicts")


def record(grade_id: str, value: Any, **inputs: Any) -> None:
    """Save ``value`` (and the ``inputs`` it was computed from) for the clean-process judge."""
    folder = os.environ.get(RECORD_ENV)
    if not folder:
        return
    if not _SAFE.match(grade_id):
        raise ValueError(f"record: grade_id must be letters, digits, '_', '.', '-', got {grade_id!r}")
    path = Path(folder) / f"{grade_id}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"value": to_plain(value), "inputs": to_plain(inputs), "interference": interference()}, tmp)
    os.replace(tmp, path)


_RECORD = record


def judged_record(grade_id: str, value: Any, **inputs: Any) -> None:
    """Assert that the judge of ``grade_id`` accepts ``value`` for ``inputs``, then :func:`record` them."""
    passed, message = run_judge(grade_id, to_plain(value), to_plain(inputs))
    assert passed, message
    _RECORD(grade_id, value, **inputs)


def load_records(folder: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """``{grade_id: {"value": ..., "inputs": {...}}}`` for every record in ``folder`` (safe load)."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(Path(folder).glob("*.pt")):
        try:
            data = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:  # noqa: BLE001 - a corrupt record is judged as missing
            continue
        if isinstance(data, dict) and "value" in data and isinstance(data.get("inputs"), dict):
            out[path.stem] = data
    return out
