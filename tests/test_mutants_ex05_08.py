"""Exercises 05-08: the generated mutants (tinytf/course/reference/mutants/) as students' notebooks, judged in-process.

Per exercise and edition: every mutant fails a visible or hidden test on every seed and the diagnosis names it
(its pitfall, its title) with the fix that undoes it; the reference and two other correct solutions per task earn
full marks with no finding; the points validate predicts (passing visible tests of tasks without a finding) are
the points the grader gives (visible and hidden parts passing) on every seed. See tests/_mutants.py.
"""

from __future__ import annotations

import _mutants as T
import pytest

pytestmark = pytest.mark.grading  # executes each instructor notebook once per edition: make unit, not make test-fast

EXERCISES = tuple(f"ex{n:02d}" for n in range(5, 8 + 1))


# every task has its mutants and other correct solutions; the families are the solution cells; every mutant fails
# and is named, every correct solution passes (tests/_mutants.py)
test_every_task_has_its_mutants_and_other_correct_solutions, test_the_families_are_the_solution_cells, \
    test_mutants_fail_and_are_named_correct_solutions_pass = T.suite(EXERCISES)
