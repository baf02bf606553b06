"""The self-check, the last cell of every exercise: ``tinytf validate``'s check, inside the running kernel.

A student has two ways to check work and they must never disagree, so this is the same check with
the same words (:func:`tinytf.course.check.report.format_report`):

- the saved notebook is compared with the released exercise of its edition: deleted, renamed or
  edited test cells are reported, and the released version of each test is what runs;
- every visible test cell runs again here, on the functions as they are now in this kernel;
- the functions are diagnosed (``tinytf.course.reference.exNN.diagnose``: the pitfall catalog).

``tinytf validate`` runs the notebook in a fresh kernel and asks this module for the same verdict at
the end (:func:`check_json`); ``tests/test_corpus.py`` checks that both say OK or both say FAILED for
every case of the student corpus. Nothing here raises into the notebook.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tinytf.language import notebook_language

from ...translation import gettext as _
from ..build.release import load_manifest
from ..exercises import REFERENCE_MODULES, REPO
from ..ipynb import cell_source, describe_cell, first_line, nbgrader_meta, read_notebook
from ..messages import say
from .released import find_released, is_source, released_folder, restore_tests
from .report import CellCheck, Report, format_report

__all__ = ["finding_json", "diagnose", "in_kernel_check", "check_json", "self_check"]


def finding_json(f: Any) -> dict[str, Any]:
    """One finding (:class:`tinytf.checks.Finding`) as plain data: pitfall, title, message, and its own ``fix`` when it has one."""
    out = {"pitfall": int(getattr(f, "pitfall", 0)), "title": str(getattr(f, "title", f)), "message": str(getattr(f, "message", ""))}
    if getattr(f, "fix", ""):
        out["fix"] = str(f.fix)
    return out


def diagnose(exercise: str, namespace: dict[str, Any]) -> list[dict[str, Any]]:
    """The findings of ``reference.<exercise>.diagnose`` on the student's functions in ``namespace``, as
    :func:`finding_json` dicts (none for an exercise without a diagnosis). Raises what the diagnosis raises."""
    module = importlib.import_module(REFERENCE_MODULES[exercise]) if exercise in REFERENCE_MODULES else None
    fn = getattr(module, "diagnose", None)
    return [finding_json(f) for f in fn(namespace)] if fn is not None else []


def _saved_notebook(exercise: str) -> Path | None:
    """The file of the notebook this kernel runs: JupyterLab's session, else the one ``exercise``
    notebook in the working folder (where Lab, nbval, papermill and validate start the kernel)."""
    session = os.environ.get("JPY_SESSION_NAME", "")
    for cand in (Path(session), Path.cwd() / Path(session).name) if session.endswith(".ipynb") else ():
        if cand.is_file() and cand.name.startswith(exercise):
            return cand
    found = sorted(Path.cwd().glob(f"{exercise}_*.ipynb"))
    return found[0] if len(found) == 1 else None


def _run_test(source: str, namespace: dict[str, Any]) -> tuple[str, str]:
    """Run one test cell's code in ``namespace`` (its prints hidden): ``(status, message)``."""
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            exec(compile(source, "<test cell>", "exec"), namespace)  # noqa: S102 - the released test cell
    except AssertionError as err:
        return "fail", f"AssertionError: {first_line(str(err))}".rstrip(": ")
    except NotImplementedError:
        return "error", "not_implemented"
    except Exception as err:  # noqa: BLE001 - a failing test is a result, not a crash
        return "error", f"{type(err).__name__}: {first_line(str(err))}".rstrip(": ")
    return "pass", ""


def in_kernel_check(exercise: str, namespace: dict[str, Any] | None = None, lang: str | None = None,
                    skip: Iterable[str] = ()) -> Report:
    """The :class:`~tinytf.course.check.report.Report` of this kernel: structure, visible tests, diagnosis.

    ``skip``: test cells not to rerun (validate stopped them for time; the diagnosis runs on what was defined).
    """
    if namespace is None:
        import __main__

        namespace = vars(__main__)
    lang = lang or notebook_language()
    path = _saved_notebook(exercise)
    report = Report(str(path.relative_to(REPO) if path and path.is_relative_to(REPO) else path or exercise), exercise, lang=lang)
    rel_path = report.released = find_released(exercise, released_folder(lang, None))
    released = json.loads(rel_path.read_text(encoding="utf-8")) if rel_path else None
    student = read_notebook(path) if path else (released or {"cells": []})
    if path is None:
        report.structure.append(say("no_saved", lang, ex=exercise))
    if released is None and not (path and is_source(student)):
        report.structure.append(say("no_release", lang))
    nb, tests = restore_tests(student, released, report, load_manifest(released_folder(lang, None)))
    index = {nbgrader_meta(c).get("grade_id"): i for i, c in enumerate(nb["cells"])}
    skip = set(skip)
    for gid, pts in tests:
        source = cell_source(nb["cells"][index[gid]]) if gid in index else ""
        status, message = ("timeout", say("stopped_skipped", lang)) if gid in skip else _run_test(source, namespace)
        message = say("not_implemented", lang) if message == "not_implemented" else message
        where = describe_cell(nb["cells"], index[gid], lang) if gid in index else ""
        report.cells.append(CellCheck(gid, pts, status, message, report.problems.get(gid, ""), where))
    try:
        report.findings = diagnose(exercise, namespace)
    except Exception as err:  # noqa: BLE001 - a diagnosis that crashes is reported, never raised into the notebook
        report.diagnosis_error = say("diagnosis_failed", lang, error=f"{type(err).__name__}: {err}"[:500])
    return report


def check_json(exercise: str, skip: Iterable[str] = ()) -> str:
    """JSON for ``tinytf validate``: the diagnosis and this check's own verdict, ``{"findings", "ok",
    "tests"}`` (or ``{"error"}``); ``skip``: test cells validate stopped for time (not rerun)."""
    try:
        r = in_kernel_check(exercise, skip=skip)
        if r.diagnosis_error:
            return json.dumps({"error": r.diagnosis_error, "ok": False, "tests": {c.grade_id: c.status for c in r.cells}})
        return json.dumps({"findings": r.findings, "ok": r.ok, "tests": {c.grade_id: c.status for c in r.cells}})
    except BaseException as err:  # noqa: BLE001 - never raise into the notebook
        return json.dumps({"error": f"{type(err).__name__}: {err}"[:500]})


def self_check(exercise: str) -> None:
    """Print this kernel's check of ``exercise`` in the notebook's language; never raises (an interrupt
    — the stop button, or a time limit — is said in words)."""
    started = time.monotonic()
    try:
        report = in_kernel_check(exercise)
        if report.released is None and importlib.util.find_spec(f"tinytf.course.reference.{exercise}") is None:
            error = _("there is no exercise {exercise}").format(exercise=exercise)
            print(say("sc_error", report.lang, ex=exercise, error=error))
            return
        print(format_report(report, title=say("sc_title", report.lang, ex=exercise)))
        folder = released_folder(report.lang, None)
        where = (folder / (report.released.name if report.released else f"{exercise}_….ipynb")).relative_to(REPO).as_posix()
        print(say("sc_full", report.lang, where=where))
    except KeyboardInterrupt:
        print(say("sc_interrupted", notebook_language(), ex=exercise, ran=time.monotonic() - started))
    except BaseException as err:  # noqa: BLE001 - the last cell of an exercise must never fail
        print(say("sc_error", notebook_language(), ex=exercise, error=f"{type(err).__name__}: {first_line(str(err))}"))
