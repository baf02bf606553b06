"""Per-exercise reference code used by the grader and the self-check.

``tinytf/course/reference/exNN.py`` holds, for exercise NN:
- judges: ``@judge("exNN_…")`` functions (see :mod:`tinytf.course.judges`) that recompute the
  reference from the inputs a hidden test exported with :func:`tinytf.course.record.record`;
- ``diagnose(namespace: dict) -> list[tinytf.checks.Finding]`` (optional): run the
  :mod:`tinytf.checks` detectors on the student's functions found in ``namespace`` and say which
  pitfall is wrong, in plain language.
"""

EXERCISES = ("ex01", "ex02", "ex03", "ex04", "ex05", "ex06", "ex07", "ex08")


def call_student(name: str, fn, *args, **kwargs):
    """``(fn(*args, **kwargs), None)``, or ``(None, Finding)`` saying that the student's ``name`` is
    not implemented yet or raised; never raises (a student's bug becomes a message)."""
    from tinytf.checks import Finding

    try:
        return fn(*args, **kwargs), None
    except NotImplementedError:
        return None, Finding(0, f"{name} is not implemented yet",
                             f"{name} still raises NotImplementedError: replace that line with your code.")
    except Exception as err:  # noqa: BLE001 - a student's bug becomes a message
        return None, Finding(0, f"{name} raises {type(err).__name__}", f"{name} raised {type(err).__name__}: {err}")


def check_parts(namespace: dict, parts) -> list:
    """Run ``check(obj) -> list[Finding]`` on each student object ``namespace[name]`` of
    ``parts = [(name, check), ...]``: a missing name or a check that crashes becomes a Finding; never raises."""
    from tinytf.checks import Finding

    findings: list = []
    for name, check in parts:
        obj = namespace.get(name)
        if not callable(obj):
            findings.append(Finding(0, f"{name} is missing", f"Define {name} in the notebook (keep its name and signature)."))
            continue
        try:
            findings.extend(check(obj))
        except Exception as err:  # noqa: BLE001 - the diagnosis itself must never crash the notebook
            findings.append(Finding(0, f"{name} could not be checked", f"{type(err).__name__}: {err}"))
    return findings
