"""An instructor notebook's own code run in-process and judged (tests/test_reference_exNN.py): one loader
(:func:`notebook_cells`), one runner (:func:`run_cells`), and the judge's verdicts (:func:`accepts`, :func:`rejects`)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import nbformat
from _coursekit import REPO_ROOT


def notebook_cells(notebook: str) -> dict[str, Any]:
    """Every cell of ``solutions/<notebook>`` in order, keyed by its nbgrader ``grade_id`` (by its cell id
    where it has no nbgrader metadata); nbformat nodes: ``cell.source`` is a string."""
    nb = nbformat.read(REPO_ROOT / "solutions" / notebook, as_version=4)
    return {c.metadata["nbgrader"]["grade_id"] if "nbgrader" in c.metadata else c.id: c for c in nb.cells}


def instructor_cells(notebook: str) -> dict[str, Any]:
    """``{grade_id: cell}`` of the cells of ``solutions/<notebook>`` that carry nbgrader metadata."""
    return {gid: c for gid, c in notebook_cells(notebook).items() if "nbgrader" in c.metadata}


def run_cells(cells: dict[str, Any], grade_ids: Iterable[str] | None = None, space: dict | None = None, *,
              sources: dict[str, str] | None = None, failures: dict[str, str | None] | None = None) -> dict:
    """Execute the code cells ``grade_ids`` of ``cells`` (default: every code cell, in order) in ``space``
    (a fresh ``__main__`` namespace with the parameters ``device="cpu"``, ``fast=True`` by default); the space.

    ``sources``: ``{grade_id: code}`` run instead of those cells' own (a student's answers, a corpus case).
    ``failures``: when given, a cell that raises does not stop the run (as in nbgrader: later cells still run);
    ``failures[grade_id]`` is then ``None`` or ``"ExceptionType: message"`` for every cell run."""
    space = {"__name__": "__main__", "device": "cpu", "fast": True} if space is None else space
    ids = [gid for gid, c in cells.items() if c.cell_type == "code"] if grade_ids is None else grade_ids
    for gid in ids:
        code = compile((sources or {}).get(gid, cells[gid].source), f"<{gid}>", "exec")
        if failures is None:
            exec(code, space)  # noqa: S102 - our own notebook code
            continue
        try:
            exec(code, space)  # noqa: S102 - our own notebook code, or a corpus case's
            failures[gid] = None
        except Exception as err:  # noqa: BLE001 - a failing cell is a verdict, as in nbgrader
            failures[gid] = f"{type(err).__name__}: {err}"
    return space


def rejects(gid: str, value: Any, inputs: Any, *words: str) -> str:
    """Assert that ``gid``'s judge rejects ``value`` with a message that holds every one of ``words`` and
    shows the student no traceback and no hidden test; the message."""
    from tinytf.course.reference.judging import run_judge

    ok, msg = run_judge(gid, value, inputs)
    assert not ok, f"{gid}: the judge accepted a wrong answer"
    assert msg and "Traceback" not in msg and "HIDDEN" not in msg, msg
    assert all(w in msg for w in words), msg
    return msg


def hidden_part(cell: Any) -> str:
    return cell.source.split("### BEGIN HIDDEN TESTS")[1].split("### END HIDDEN TESTS")[0]


def graded_points(cells: dict[str, Any]) -> dict[str, float]:
    """``{grade_id: points}`` of every graded cell (tests and written answers)."""
    return {gid: c.metadata["nbgrader"].get("points", 0) for gid, c in cells.items() if c.metadata["nbgrader"].get("grade")}


def assert_hidden_tests_use_their_probes(cells: dict[str, Any], tests: tuple[str, ...], probes: dict, probes_alias: str) -> None:
    """Every test cell has a judge and a probe, and its hidden part records once, through ``judged_record``, on
    fresh inputs from that probe."""
    from tinytf.course.reference.judging import JUDGES, load_all

    load_all()
    graded = [gid for gid, c in cells.items() if c.metadata["nbgrader"].get("grade") and c.cell_type == "code"]
    assert sorted(graded) == sorted(tests) == sorted(probes)
    assert all(gid in JUDGES for gid in tests)
    for gid in tests:
        hidden = hidden_part(cells[gid])
        assert hidden.count("record(") == 1 and f'judged_record("{gid}"' in hidden, gid
        assert ".seed()" in hidden and f'PROBES["{gid}"]' in hidden.replace(probes_alias, "PROBES"), f"{gid}: fresh inputs from its probe"


def record_tests(ns: dict, cells: dict[str, Any], tests: tuple[str, ...], folder: Path) -> dict[str, dict]:
    """Run every test cell (visible and hidden parts) in ``ns`` with recording into ``folder``; the records."""
    import pytest

    from tinytf.course.reference.judging import RECORD_ENV, load_records

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(RECORD_ENV, str(folder))
        run_cells(cells, tests, ns)
    found = load_records(folder)
    assert sorted(found) == sorted(tests)
    return found


def accepts(gid: str, value: Any, inputs: Any) -> None:
    """Assert that ``gid``'s judge accepts ``value`` on ``inputs``."""
    from tinytf.course.reference.judging import run_judge

    ok, msg = run_judge(gid, value, inputs)
    assert ok, f"{gid}: {msg}"


def assert_judges_accept(records: dict[str, dict]) -> None:
    for gid, rec in records.items():
        accepts(gid, rec["value"], rec["inputs"])



def assert_probes_pass(ns: dict, probes: dict) -> None:
    """Every probe's fresh inputs (seed 7), run on the solution in ``ns``, satisfy its test's judge."""
    import torch

    assert probes
    for gid, probe in probes.items():
        accepts(gid, *probe(ns, torch.Generator().manual_seed(7)))
