"""Exercises 01-04: the generated mutants (tinytf/course/reference/mutants/) as students' notebooks, judged in-process.

Per exercise and edition: every mutant fails a visible or hidden test on every seed and the diagnosis names it
(its pitfall, its title) with the fix that undoes it; the reference and two other correct solutions per task earn
full marks with no finding; the points validate predicts (passing visible tests of tasks without a finding) are
the points the grader gives (visible and hidden parts passing) on every seed. See tests/_mutants.py.
"""

from __future__ import annotations

import _mutants as T
import pytest

pytestmark = pytest.mark.grading  # executes each instructor notebook once per edition: make unit, not make test-fast

EXERCISES = tuple(f"ex{n:02d}" for n in range(1, 4 + 1))


# every task has its mutants and other correct solutions; the families are the solution cells; every mutant fails
# and is named, every correct solution passes (tests/_mutants.py)
test_every_task_has_its_mutants_and_other_correct_solutions, test_the_families_are_the_solution_cells, \
    test_mutants_fail_and_are_named_correct_solutions_pass = T.suite(EXERCISES)


def test_the_global_max_softmax_fails_every_grading(monkeypatch):
    """Issue 35, section 1: a softmax that subtracts the maximum of the whole tensor passes the visible checks, and its
    hidden test used to draw inputs that exposed it only sometimes (the same notebook graded 0, 0, 4 and 0 of 4).
    Now the test cell, hidden part and all, each run on its own fresh seed, fails every time, with the same message."""
    monkeypatch.setenv("TINYTF_DEVICE", "cpu")
    nb = T.notebook("ex01", "en")
    fam = nb.families["ex01_softmax"]
    [mutant] = [m for m in fam.mutants if m.name == "global_max"]
    with nb.planted(fam, mutant):
        assert nb.visible("ex01_softmax") is None, "the visible checks pass: only the hidden part can catch it"
        runs = [nb.graded("ex01_softmax") for _ in range(6)]
    assert all(r and r.startswith("AssertionError") for r in runs), runs
    assert len({r.split(" — ")[0] for r in runs}) == 1, runs  # the same failure every time (the row that overflows)
