"""Per-exercise reference code used by the grader and the self-check.

``tinytf/course/reference/exNN.py`` holds, for exercise NN:
- judges: ``@judge("exNN_…")`` functions (see :mod:`tinytf.course.judges`) that recompute the
  reference from the inputs a hidden test exported with :func:`tinytf.course.record.record`;
- ``diagnose(namespace: dict) -> list[tinytf.checks.Finding]`` (optional): run the
  :mod:`tinytf.checks` detectors on the student's functions found in ``namespace`` and say which
  pitfall is wrong, in plain language.
"""

EXERCISES = ("ex01", "ex02", "ex03", "ex04", "ex05", "ex06", "ex07", "ex08")
