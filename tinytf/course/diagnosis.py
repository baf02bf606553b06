"""The diagnosis of an exercise as JSON: ``tinytf.course.reference.exNN.diagnose`` run on the student's
functions, its findings (:mod:`tinytf.checks`) as data. The self-check (:mod:`tinytf.course.selfcheck`)
reads it in the kernel; ``tinytf validate`` (:mod:`tinytf.course.validate`) receives it through the
self-check's verdict at the end of its run."""

from __future__ import annotations

import importlib
import json
from typing import Any

from .exercises import REFERENCE_MODULES

__all__ = ["diagnose_json", "finding_json"]


def finding_json(f: Any) -> dict[str, Any]:
    """One finding as JSON: pitfall, title, message, and its own ``fix`` when it has one."""
    out = {"pitfall": int(getattr(f, "pitfall", 0)), "title": str(getattr(f, "title", f)), "message": str(getattr(f, "message", ""))}
    if getattr(f, "fix", ""):
        out["fix"] = str(f.fix)
    return out


def diagnose_json(exercise: str, namespace: dict | None = None) -> str:
    """JSON ``{"findings": [...]}`` (or ``{"error": ...}``) from ``reference.<exercise>.diagnose``."""
    try:
        if namespace is None:
            import __main__

            namespace = vars(__main__)
        mod = importlib.import_module(REFERENCE_MODULES[exercise]) if exercise in REFERENCE_MODULES else None
        fn = getattr(mod, "diagnose", None)
        if fn is None:
            return json.dumps({"findings": [], "note": f"no diagnosis is available for {exercise}"})
        findings = fn(namespace)
        return json.dumps({"findings": [finding_json(f) for f in findings]})
    except BaseException as err:  # noqa: BLE001 - never raise into the notebook
        return json.dumps({"error": f"{type(err).__name__}: {err}"[:500]})
