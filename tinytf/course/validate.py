"""``tinytf validate NOTEBOOK``: run a student's exercise, its visible tests and the pitfall diagnosis.

Unlike ``nbgrader validate`` (which exits 0 whatever happens and does not notice a deleted test
cell), this compares the notebook with the released version in ``exercises/``: deleted, renamed or
edited test cells are reported (and the released test is run in their place), every test cell is
reported pass/fail with its message, the student's functions are diagnosed in the same kernel by
``tinytf.course.reference.exNN.diagnose`` (findings from :mod:`tinytf.checks`, sent back as JSON),
and the exit status is non-zero when anything is wrong.

``self_check("exNN")`` is the one-line last cell of every exercise: the same diagnosis inside the
running kernel, printed in plain language. It never raises.
"""

from __future__ import annotations

import copy
import importlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tinytf.language import edition_of

from .messages import say
from .nbgrader_root import REPO, exercise_id
from .notebook import cell_source, describe_cell, first_line, is_test_cell, kernel_config, nbgrader_meta, read_notebook
from .release import EDITION_FOLDERS, earlier_release, load_manifest

__all__ = [
    "CellCheck", "Report", "is_source", "validate", "format_report", "self_check", "diagnose_json", "find_released",
    "released_folder", "restore_tests",
]

_MARK = "__TINYTF_DIAGNOSIS__"


@dataclass
class CellCheck:
    """One test cell: ``status`` is pass / fail / error / timeout / not-run."""

    grade_id: str
    points: float
    status: str
    message: str = ""
    problem: str = ""  # "deleted", "renamed", "edited" or ""
    where: str = ""  # how to find it in JupyterLab: "cell 9 (under \"Task 1b — scaling\")"


@dataclass
class Report:
    path: str
    exercise: str
    cells: list[CellCheck] = field(default_factory=list)
    structure: list[str] = field(default_factory=list)  # deleted / edited / stripped cells
    cell_errors: list[str] = field(default_factory=list)  # errors in the student's own cells
    findings: list[dict[str, Any]] = field(default_factory=list)
    diagnosis_error: str = ""
    fatal: str = ""  # the notebook could not be read or run at all
    problems: dict[str, str] = field(default_factory=dict)  # grade_id -> "deleted" / "edited"
    self_check_ok: bool | None = None  # the in-kernel self-check's verdict at the end of validate's run
    lang: str = "en"  # the notebook's edition (metadata.tinytf.edition): the report speaks it
    stopped: list[str] = field(default_factory=list)  # cells stopped for time, said in words
    notes: list[str] = field(default_factory=list)  # said, but nothing wrong (a test from an earlier release)
    source: bool = False  # an instructor source (solutions/): its own tests, hidden ones too, ran as written

    @property
    def ok(self) -> bool:
        """True when the notebook ran (no cell stopped for time), every visible test passed and nothing was deleted or edited."""
        return (not self.fatal and not self.structure and not self.stopped and all(c.status == "pass" for c in self.cells)
                and not self.findings)


def find_released(ex: str, released_dir: Path) -> Path | None:
    """The released notebook of exercise ``ex`` in ``released_dir`` (``exNN_*.ipynb``), or None."""
    hits = sorted(released_dir.glob(f"{ex}_*.ipynb")) + sorted(released_dir.glob(f"{ex}.ipynb"))
    return hits[0] if hits else None


def is_source(nb: dict) -> bool:
    """An instructor source (``solutions/``), not a student's copy: a solution cell still holds nbgrader's
    ``### BEGIN SOLUTION`` region (release replaces every one of them by ``raise NotImplementedError()``)."""
    return any(nbgrader_meta(c).get("solution") and "### BEGIN SOLUTION" in cell_source(c) for c in nb.get("cells", []))


def restore_tests(student: dict, released: dict | None, report: Report,
                  manifest: dict | None = None) -> tuple[dict, list[tuple[str, float]]]:
    """The notebook to execute (released tests restored) and the ``(grade_id, points)`` to report on.

    An instructor source (:func:`is_source`) is checked as a source: its own test cells, hidden tests
    included, run as written, and none is compared with the release. A test cell that differs from
    today's release but matches an earlier one (``manifest``: :func:`tinytf.course.release.load_manifest`)
    is not edited: today's version runs, and a note says so.
    """
    nb = copy.deepcopy(student)
    for cell in nb["cells"]:
        cell["source"] = cell_source(cell)
    report.source = is_source(nb)
    if released is None or report.source:
        tests = [(nbgrader_meta(c)["grade_id"], float(nbgrader_meta(c).get("points", 0))) for c in nb["cells"] if is_test_cell(c)]
        return nb, tests
    rel_cells = released["cells"]
    tests = [(nbgrader_meta(c)["grade_id"], float(nbgrader_meta(c).get("points", 0))) for c in rel_cells if is_test_cell(c)]
    if rel_cells and not any(nbgrader_meta(c) for c in nb["cells"]):
        report.structure.append(say("stripped", report.lang))
    by_id = {nbgrader_meta(c).get("grade_id"): c for c in nb["cells"] if nbgrader_meta(c).get("grade_id")}
    for i, rel in enumerate(rel_cells):
        gid = nbgrader_meta(rel).get("grade_id")
        if not gid or not nbgrader_meta(rel).get("locked"):
            continue
        mine = by_id.get(gid)
        if mine is None:
            if is_test_cell(rel):
                report.structure.append(say("deleted", report.lang, gid=gid))
                report.problems[gid] = "deleted"
            # put the released cell back after its predecessor so the run matches grading
            before = [nbgrader_meta(c).get("grade_id") for c in rel_cells[:i]]
            prev = next((g for g in reversed(before) if g in by_id), None)
            idx = next((j + 1 for j, c in enumerate(nb["cells"]) if prev and nbgrader_meta(c).get("grade_id") == prev), len(nb["cells"]))
            restored = copy.deepcopy(rel)
            restored["source"] = cell_source(rel)
            nb["cells"].insert(idx, restored)
            by_id[gid] = restored
        elif cell_source(mine).strip() != cell_source(rel).strip():
            if is_test_cell(rel) and earlier_release(manifest or {}, report.exercise, gid, cell_source(mine)):
                report.notes.append(say("earlier_release", report.lang, gid=gid, ex=report.exercise))
                report.problems[gid] = "earlier release"
            elif is_test_cell(rel):
                report.structure.append(say("edited", report.lang, gid=gid))
                report.problems[gid] = "edited"
            mine["source"] = cell_source(rel)
    return nb, tests


def _finding_json(f: Any) -> dict[str, Any]:
    """One finding as JSON: pitfall, title, message, and its own ``fix``/``fix_zh`` when it has one."""
    out = {"pitfall": int(getattr(f, "pitfall", 0)), "title": str(getattr(f, "title", f)), "message": str(getattr(f, "message", ""))}
    for key in ("fix", "fix_zh"):
        if getattr(f, key, ""):
            out[key] = str(getattr(f, key))
    return out


def diagnose_json(exercise: str, namespace: dict | None = None) -> str:
    """JSON ``{"findings": [...]}`` (or ``{"error": ...}``) from ``reference.<exercise>.diagnose``."""
    try:
        if namespace is None:
            import __main__

            namespace = vars(__main__)
        try:
            mod = importlib.import_module(f"tinytf.course.reference.{exercise}")
        except ModuleNotFoundError as err:
            if err.name != f"tinytf.course.reference.{exercise}":
                raise
            mod = None
        fn = getattr(mod, "diagnose", None)
        if fn is None:
            return json.dumps({"findings": [], "note": f"no diagnosis is available for {exercise}"})
        findings = fn(namespace)
        return json.dumps({"findings": [_finding_json(f) for f in findings]})
    except BaseException as err:  # noqa: BLE001 - never raise into the notebook
        return json.dumps({"error": f"{type(err).__name__}: {err}"[:500]})


@dataclass
class _Run:
    """What :func:`_execute` saw: ``stopped`` maps a cell index to the seconds it ran before it was stopped for time."""

    executed: Any
    diag: dict | None
    fatal: str
    stopped: dict[int, float] = field(default_factory=dict)


def _diag_code(ex: str, skip: list[str]) -> str:
    return (f"from tinytf.course.selfcheck import check_json as _tinytf_cj\n"
            f"print({_MARK!r} + _tinytf_cj({ex!r}, skip={skip!r}))")


def _mark_stopped(cell: Any, ran: float, timeout: int) -> None:
    """A cell stopped for time: its ``KeyboardInterrupt`` (the interrupt that stopped it) becomes a ``CellTimeoutError``."""
    outs = [o for o in cell.get("outputs", []) if not (o.get("output_type") == "error" and o.get("ename") == "KeyboardInterrupt")]
    text = f"the cell was stopped after {ran:.0f} s (the limit is {timeout} s per cell)"
    outs.append({"output_type": "error", "ename": "CellTimeoutError", "evalue": text, "traceback": [f"CellTimeoutError: {text}"]})
    cell["outputs"] = outs


def _execute(nb: dict, ex: str, cwd: Path, timeout: int, notebook_timeout: float) -> _Run:
    """Execute ``nb`` (allow_errors) then the diagnosis, noting each cell stopped for time."""
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
                    run.fatal = f"the notebook ran for more than {notebook_timeout:g} s; the remaining cells were not run"
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
        run.fatal = "the kernel died (os._exit, a crash, or out of memory); the cells after it did not run"
    except Exception as err:  # noqa: BLE001 - report, do not crash
        run.fatal = f"the notebook could not be run: {type(err).__name__}: {err}"[:300]
    for out in node.cells[-1].get("outputs", []):
        text = cell_source({"source": out.get("text", "")})
        if _MARK in text:
            try:
                run.diag = json.loads(text.split(_MARK, 1)[1].strip())
            except json.JSONDecodeError:
                run.diag = {"error": "the diagnosis output could not be read"}
    run.executed = nbformat.from_dict(node)
    return run


def released_folder(lang: str, released_dir: str | os.PathLike | None) -> Path:
    """Where the released version of a notebook of edition ``lang`` is: ``exercises/`` or ``exercises/zh/``."""
    if released_dir:
        return Path(released_dir)
    return REPO / EDITION_FOLDERS.get(lang, EDITION_FOLDERS["en"])[1]


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


def _finding_lines(f: dict[str, Any], lang: str) -> list[str]:
    """One diagnosed finding as two or three lines: the pitfall's name, the evidence, the fix.

    The fix is the finding's own (``f["fix"]``, in Chinese ``f["fix_zh"]``) when it has one, else the
    catalog's for its pitfall. In Chinese the name is the catalog's Chinese one; the evidence (shapes,
    numbers, the inputs that show it) is kept as the diagnosis wrote it.
    """
    from tinytf.checks.catalog import Pitfall

    try:
        pitfall = Pitfall(int(f["pitfall"]))
    except ValueError:  # a number the catalog does not know (a newer diagnosis)
        return [f"  x [pitfall {f['pitfall']}] {f['title']}", f"      {f['message']}"]
    own = str(f.get("fix") or "")
    evidence = str(f["message"]).split(" Fix: ", 1)[0]
    if lang != "zh":
        head = f"  x [{pitfall.label()}] {f['title']}"
        return [head, f"      {evidence}", "      " + say("fix", lang, fix=own)] if own else [head, f"      {f['message']}"]
    lines = [f"  x [{pitfall.label('zh')}] {f['title']}"]
    if own:
        return [*lines, "      " + say("evidence", "zh", message=evidence), "      " + say("fix", "zh", fix=f.get("fix_zh") or own)]
    if pitfall is Pitfall.GENERAL:
        return [*lines, "      " + say("evidence", "zh", message=f["message"])]
    # the English fix is replaced by the catalog's Chinese one
    return [*lines, "      " + say("evidence", "zh", message=evidence), "      " + say("fix", "zh", fix=pitfall.entry.fix_zh)]


def format_report(r: Report, title: str | None = None) -> str:
    """The plain-language text ``tinytf validate`` (and, with its own ``title``, the self-check) prints,
    in the notebook's language."""
    lang = r.lang
    lines = [title or say("header", lang, path=r.path, ex=r.exercise)]
    if r.fatal and not r.cells:
        return "\n".join([*lines, f"  x {r.fatal}", say("result_failed", lang)])
    for s in r.structure:
        lines.append(f"  ! {s}")
    for s in r.notes:
        lines.append(f"  i {s}")
    lines.append(say("tests_source" if r.source else "tests", lang))
    en_labels = {"pass": "PASS", "fail": "FAIL", "error": "ERROR", "timeout": "TIMEOUT", "not-run": "NOT RUN"}
    zh_labels = {"pass": "通过", "fail": "未通过", "error": "出错", "timeout": "超时", "not-run": "未运行"}
    labels = zh_labels if lang == "zh" else en_labels
    for c in r.cells:
        zh_problem = {"deleted": "已删除", "edited": "已修改", "earlier release": "早期版本"}
        problem = zh_problem.get(c.problem, c.problem) if lang == "zh" else c.problem
        extra = f" [{problem}]" if problem else ""
        msg = f"  {c.message}" if c.message else ""
        pts = say("points", lang, pts=c.points)
        if lang == "zh":
            lines.append(f"  {labels[c.status]:<4} {c.grade_id}（{pts}{'，' + c.where if c.where else ''}）{extra}{msg}")
        else:
            lines.append(f"  {labels[c.status]:<7} {c.grade_id} ({pts}{', ' + c.where if c.where else ''}){extra}{msg}")
    for e in r.cell_errors:
        lines.append("  ! " + say("cell_error", lang, what=e))
    for e in r.stopped:
        lines.append("  ! " + e)
    if r.fatal:
        lines.append(f"  x {r.fatal}")
    lines.append(say("diagnosis", lang))
    if r.diagnosis_error:
        lines.append(f"  {r.diagnosis_error}")
    elif not r.findings:
        lines.append("  " + say("no_pitfall", lang))
    else:
        for f in r.findings:
            lines += _finding_lines(f, lang)
    verdict = say("verdict_ok" if r.ok else "verdict_failed", lang)
    lines.append(say("result", lang, verdict=verdict, passed=sum(c.status == "pass" for c in r.cells), total=len(r.cells),
                     pts=sum(c.points for c in r.cells if c.status == "pass"), max=sum(c.points for c in r.cells)))
    return "\n".join(lines)


def self_check(exercise: str) -> None:
    """The last cell of every exercise (kept here for notebooks released before
    :mod:`tinytf.course.selfcheck`): see :func:`tinytf.course.selfcheck.self_check`."""
    from .selfcheck import self_check as run

    run(exercise)
