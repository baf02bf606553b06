"""Export a result from inside a graded notebook so a clean process can judge it.

Hidden test cells call ``record(grade_id, value, **inputs)``. During grading the environment
variable ``TINYTF_RECORD_DIR`` names a folder; each call saves ``{"value": value, "inputs": inputs}``
to ``<dir>/<grade_id>.pt`` with ``torch.save``. The grader later loads it (``weights_only=True``)
in a fresh interpreter and asks the judge registered for ``grade_id`` (see
:mod:`tinytf.course.judges`) whether ``value`` is right for ``inputs``. A student who monkeypatches
``torch.allclose`` or the test helpers inside their own kernel cannot reach that process.
Outside grading (``TINYTF_RECORD_DIR`` unset) ``record`` does nothing.

Each record also lists the checking functions that were no longer the originals when it was written
(``"interference"``: ``torch.allclose`` replaced, say). The grader calls a result ``tampered`` only on
such evidence; a wrong result without it is simply ``failed``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

__all__ = ["record", "load_records", "interference", "to_plain", "RECORD_ENV"]

RECORD_ENV = "TINYTF_RECORD_DIR"
_SAFE = re.compile(r"^[A-Za-z0-9_.-]+$")
# the functions a test cell's verdict rests on; replacing one in the kernel is evidence of interference
_WATCHED = ("torch.allclose", "torch.equal", "torch.isclose", "torch.testing.assert_close", "torch.Tensor.allclose",
            "torch.Tensor.equal", "math.isclose", "builtins.isinstance", "builtins.float", "builtins.abs")


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
        changed.append("tinytf.course.record.record")
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
