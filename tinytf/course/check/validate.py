"""``tinytf validate NOTEBOOK``: run a student's exercise in a fresh kernel (nbclient), its visible tests and the diagnosis.

Unlike ``nbgrader validate`` (which exits 0 whatever happens and does not notice a deleted test cell), this
compares the notebook with the released version in ``exercises/`` (deleted, renamed or edited test cells are
reported, and the released test runs in their place), reports every test cell, ends the run with the self-check
(:mod:`tinytf.course.check.selfcheck`: the same check and diagnosis, in that kernel, sent back as JSON), and exits
non-zero when anything is wrong. Both front ends print :func:`tinytf.course.check.report.format_report`.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tinytf.language import edition_of

from ...translation import gettext as _
from ..build.release import load_manifest
from ..exercises import exercise_id
from ..ipynb import cell_source, describe_cell, first_line, is_test_cell, kernel_config, nbgrader_meta, read_notebook, skip_slow_imports
from ..messages import say
from .released import find_released, is_source, released_folder, restore_tests
from .report import CellCheck, Report, format_report

__all__ = ["validate", "format_report"]

_MARK = "__TINYTF_DIAGNOSIS__"


@dataclass
class _Run:
    """What :func:`_execute` saw: ``stopped`` maps a cell index to the seconds it ran before it was stopped for time."""

    executed: Any
    diag: dict | None
    fatal: str
    stopped: dict[int, float] = field(default_factory=dict)


def _diag_code(ex: str, skip: list[str]) -> str:
    return (f"from tinytf.course.check.selfcheck import check_json as _tinytf_cj\n"
            f"print({_MARK!r} + _tinytf_cj({ex!r}, skip={skip!r}))")


def _mark_stopped(cell: Any, ran: float, timeout: int) -> None:
    """A cell stopped for time: its ``KeyboardInterrupt`` (the interrupt that stopped it) becomes a ``CellTimeoutError``."""
    outs = [o for o in cell.get("outputs", []) if not (o.get("output_type") == "error" and o.get("ename") == "KeyboardInterrupt")]
    text = _("the cell was stopped after {ran:.0f} s (the limit is {timeout} s per cell)").format(ran=ran, timeout=timeout)
    outs.append({"output_type": "error", "ename": "CellTimeoutError", "evalue": text, "traceback": [f"CellTimeoutError: {text}"]})
    cell["outputs"] = outs


def _execute(nb: dict, ex: str, cwd: Path, timeout: int, notebook_timeout: float) -> _Run:
    """Execute ``nb`` (allow_errors) then the diagnosis, noting each cell stopped for time."""
    skip_slow_imports()
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    os.environ.setdefault("TINYTF_HEADLESS", "1")
    os.environ.setdefault("MPLBACKEND", "Agg")
    node = nbformat.from_dict(nb)
    node.cells = [c for c in node.cells if "self_check(" not in cell_source(c)]  # the diagnosis below replaces it
    # the self-check's verdict in this kernel too: validate and the self-check must agree (tests/test_corpus.py)
    node.cells.append(nbformat.v4.new_code_cell(_diag_code(ex, [])))
    timed_out: set[int] = set()

    def on_error(cell: Any, cell_index: int, execute_reply: dict) -> None:  # nbclient's hook: our error_on_timeout reply
        if execute_reply.get("content", {}).get("ename") == "CellTimeoutError":
            timed_out.add(cell_index)

    limits = {len(node.cells) - 1: max(timeout, 120)}  # the diagnosis reruns the visible tests: it gets longer
    client = NotebookClient(node, timeout=timeout, kernel_name="python3", allow_errors=True, interrupt_on_timeout=True,
                            config=kernel_config(), on_cell_error=on_error,
                            timeout_func=lambda cell: limits.get(next((i for i, c in enumerate(node.cells) if c is cell), -1), timeout),
                            error_on_timeout={"ename": "CellTimeoutError", "evalue": "", "traceback": []},
                            resources={"metadata": {"path": str(cwd)}})
    run = _Run(None, None, "")
    deadline = time.monotonic() + notebook_timeout
    try:
        with client.setup_kernel():
            for i, cell in enumerate(node.cells):
                if time.monotonic() > deadline:
                    run.fatal = (_("the notebook ran for more than {limit:g} s; the remaining cells were not run")
                                 .format(limit=notebook_timeout))
                    break
                if i == len(node.cells) - 1:  # the diagnosis skips the tests already stopped for time
                    skip = [nbgrader_meta(node.cells[j]).get("grade_id") for j in run.stopped if is_test_cell(node.cells[j])]
                    cell.source = _diag_code(ex, [g for g in skip if g])
                started = time.monotonic()
                client.execute_cell(cell, i)
                if i in timed_out:
                    run.stopped[i] = time.monotonic() - started
                    _mark_stopped(cell, run.stopped[i], limits.get(i, timeout))
    except DeadKernelError:
        run.fatal = _("the kernel died (os._exit, a crash, or out of memory); the cells after it did not run")
    except Exception as err:  # noqa: BLE001 - report, do not crash
        run.fatal = _("the notebook could not be run: {error}").format(error=f"{type(err).__name__}: {err}")[:300]
    for out in node.cells[-1].get("outputs", []):
        text = cell_source({"source": out.get("text", "")})
        if _MARK in text:
            try:
                run.diag = json.loads(text.split(_MARK, 1)[1].strip())
            except json.JSONDecodeError:
                run.diag = {"error": _("the diagnosis output could not be read")}
    run.executed = nbformat.from_dict(node)
    return run


def _test_check(gid: str, pts: float, cell: dict | None, where: str, problem: str, lang: str) -> CellCheck:
    """A test cell's outcome from its executed outputs."""
    check = CellCheck(gid, pts, "not-run", problem=problem, where=where)
    if cell is not None and (cell.get("execution_count") is not None or cell.get("outputs")):
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if not errors:
            check.status = "pass"
        else:
            e = errors[-1]
            check.status = {"AssertionError": "fail", "CellTimeoutError": "timeout"}.get(e.get("ename"), "error")
            if e.get("ename") == "NotImplementedError":
                check.message = say("not_implemented", lang)
            else:
                check.message = f"{e.get('ename')}: {first_line(str(e.get('evalue', '')))}".rstrip(": ")
    return check


def validate(path: str | os.PathLike, *, released_dir: str | os.PathLike | None = None, timeout: int = 60,
             notebook_timeout: float = 600) -> Report:
    """Check one exercise notebook; see the module docstring. Never raises for a bad notebook.

    The report speaks the notebook's edition (``metadata.tinytf.edition``) and compares it with the
    released exercise of that edition (``exercises/`` or ``exercises/zh/``, unless ``released_dir``).
    """
    path = Path(path)
    try:
        ex = exercise_id(path)
    except ValueError:
        ex = "?"
    report = Report(str(path), ex)
    try:
        student = read_notebook(path)
    except ValueError as err:
        report.fatal = say("cannot_read", "en", name=path.name, error=err)
        return report
    report.lang = edition_of(student)
    if ex == "?":
        ids = [nbgrader_meta(c).get("grade_id", "") for c in student["cells"]]
        ex = next((i[:4] for i in ids if i and i[:2] == "ex" and i[2:4].isdigit()), "?")
        report.exercise = ex
    folder = released_folder(report.lang, released_dir)
    rel_path = find_released(ex, folder) if ex != "?" else None
    released = json.loads(rel_path.read_text(encoding="utf-8")) if rel_path else None
    if released is None and not is_source(student):
        report.structure.append(say("no_release", report.lang))
    nb, tests = restore_tests(student, released, report, load_manifest(folder))
    previous = os.environ.get("TINYTF_LANG")
    os.environ["TINYTF_LANG"] = report.lang  # the kernel (started below) speaks the notebook's language
    try:
        run = _execute(nb, ex, path.resolve().parent, timeout, notebook_timeout)
    finally:
        if previous is None:
            os.environ.pop("TINYTF_LANG", None)
        else:
            os.environ["TINYTF_LANG"] = previous
    report.fatal = run.fatal
    _read_run(report, run, tests, path, timeout)
    return report


def _read_run(report: Report, run: _Run, tests: list[tuple[str, float]], path: Path, timeout: int) -> None:
    """Fill ``report`` from an executed notebook: test outcomes, errors in the student's cells, cells
    stopped for time (in words: which, how long, what to do) and the diagnosis."""
    executed, diag, lang = run.executed, run.diag, report.lang
    last = len(executed.cells) - 1
    for i, ran in sorted(run.stopped.items()):
        if i != last:
            where = describe_cell(executed.cells, i, lang)
            report.stopped.append(say("stopped", lang, where=where, ran=ran, limit=timeout, path=path))
    cells = {nbgrader_meta(c).get("grade_id"): c for c in executed.cells if nbgrader_meta(c).get("grade_id")}
    for gid, pts in tests:
        cell = cells.get(gid)
        i = next((i for i, c in enumerate(executed.cells) if c is cell), None)
        where = describe_cell(executed.cells, i, lang) if i is not None else ""
        check = _test_check(gid, pts, cell, where, report.problems.get(gid, ""), lang)
        if i in run.stopped:
            check.status, check.message = "timeout", say("stopped_test", lang, ran=run.stopped[i], limit=timeout)
        report.cells.append(check)
    for i, cell in enumerate(executed.cells[:-1]):
        if is_test_cell(cell) or cell.get("cell_type") != "code" or i in run.stopped:
            continue
        for o in cell.get("outputs", []):
            if o.get("output_type") == "error" and o.get("ename") != "NotImplementedError":
                what = f"{describe_cell(executed.cells, i, lang)}: {o.get('ename')}: {first_line(str(o.get('evalue', '')))}"
                report.cell_errors.append(what)
    if last in run.stopped or (diag is not None and str(diag.get("error", "")).startswith("KeyboardInterrupt")):
        ran = run.stopped.get(last, 0.0)
        report.diagnosis_error = say("diagnosis_stopped", lang, ran=ran, limit=max(timeout, 120), path=path)
    elif diag is None:
        report.diagnosis_error = say("no_diagnosis", lang)
    elif "error" in diag:  # the self-check's report words it already
        failed = say("diagnosis_failed", lang, error="")
        error = diag["error"]
        report.diagnosis_error = error if str(error).startswith(failed) else say("diagnosis_failed", lang, error=error)
    else:
        report.findings = list(diag.get("findings", []))
    if diag is not None and "ok" in diag and last not in run.stopped:
        report.self_check_ok = bool(diag["ok"])
