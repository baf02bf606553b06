"""Exercises 09-11 and every later one: the generated mutants (tinytf/course/reference/mutants/) as students' notebooks,
judged in-process.

Per exercise and edition: every mutant fails a visible or hidden test on every seed and the diagnosis names it
(its pitfall, its title) with the fix that undoes it; the reference and two other correct solutions per task earn
full marks with no finding; the points validate predicts (passing visible tests of tasks without a finding) are
the points the grader gives (visible and hidden parts passing) on every seed. See tests/_mutants.py.
"""

from __future__ import annotations

import _mutants as T
import pytest

from tinytf.course.exercises import EXERCISES as ALL

pytestmark = pytest.mark.grading  # executes each instructor notebook once per edition: make unit, not make test-fast

EXERCISES = tuple(ex for ex in ALL if ex >= "ex09")  # and every exercise added after them: each needs its mutants


@pytest.mark.parametrize("ex", EXERCISES)
def test_every_task_has_its_mutants_and_other_correct_solutions(ex, monkeypatch):
    monkeypatch.setenv("TINYTF_DEVICE", "cpu")
    T.check_cover(ex)


@pytest.mark.parametrize("edition", list(T.EDITIONS))
@pytest.mark.parametrize("ex", EXERCISES)
def test_the_families_are_the_solution_cells(ex, edition, monkeypatch):
    monkeypatch.setenv("TINYTF_DEVICE", "cpu")
    T.check_sources(ex, edition)


@pytest.mark.parametrize("edition", list(T.EDITIONS))
@pytest.mark.parametrize("ex", EXERCISES)
def test_mutants_fail_and_are_named_correct_solutions_pass(ex, edition, monkeypatch):
    monkeypatch.setenv("TINYTF_DEVICE", "cpu")
    monkeypatch.setenv("TINYTF_LANG", edition)
    problems = T.check_variants(ex, edition)
    assert not problems, "\n".join(problems)
