"""One ``nbgrader autograde`` of one submission: the process ``tinytf grade`` runs inside the sandbox.

``python PATH/autograde_job.py CONFIG.json EXERCISE STUDENT RESULT.json`` — run by path, not with
``-m``, and importing nothing from ``tinytf``: ``import tinytf`` loads torch and the model code,
seconds per graded notebook that this process does not need. CONFIG.json is the nbgrader traitlets
config (:func:`tinytf.course.nbgrader_root.nbgrader_config`, as JSON); RESULT.json receives
``{"success", "log", "error"}`` from nbgrader.
"""

from __future__ import annotations

import os
import sys

# Run by path, Python put this folder first on sys.path: take it off, or our notebook.py, grade.py …
# would shadow installed modules of those names (Jupyter's ``notebook``) for nbgrader.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import json  # noqa: E402
import logging  # noqa: E402
from pathlib import Path  # noqa: E402

FORKED = "tinytf.course.kernels.ForkedKernelManager"  # what kernel_config names; imported by name it would load torch here


def _kernel_manager(config: dict) -> dict:
    """``config`` with tinytf's forked-kernel manager as a class, loaded from its file (no ``import tinytf``)."""
    client = config.get("NotebookClient", {})
    if client.get("kernel_manager_class") == FORKED:
        import importlib.util

        spec = importlib.util.spec_from_file_location("tinytf_course_kernels", os.path.join(_HERE, "kernels.py"))
        kernels = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(kernels)  # type: ignore[union-attr]
        config = dict(config, NotebookClient=dict(client, kernel_manager_class=kernels.ForkedKernelManager))
    return config


def autograde(config: dict, exercise: str, student: str) -> dict:
    """nbgrader's verdict on ``student``'s ``exercise`` in the course root that ``config`` names."""
    sys.modules.setdefault("rfc3987_syntax", None)  # see tinytf.course.notebook.skip_slow_imports
    from nbgrader.apps import NbGraderAPI
    from traitlets.config import Config

    (Path(config["CourseDirectory"]["root"]) / "exchange").mkdir(parents=True, exist_ok=True)
    api = NbGraderAPI(config=Config(_kernel_manager(config)))
    api.log.setLevel(logging.WARNING)
    result = api.autograde(exercise, student, force=True, create=True)
    return {"success": bool(result.get("success")), "log": (result.get("log") or "")[-4000:],
            "error": (result.get("error") or "")[-4000:]}


def main(argv: list[str]) -> int:
    config_path, exercise, student, result_path = argv
    summary = autograde(json.loads(Path(config_path).read_text(encoding="utf-8")), exercise, student)
    Path(result_path).write_text(json.dumps(summary), encoding="utf-8")
    return 0 if summary["success"] else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
