"""Per-exercise reference code used by the grader and the self-check.

``tinytf/course/reference/exNN.py`` holds, for exercise NN:
- judges: ``@judge("exNN_…")`` functions (see :mod:`tinytf.course.reference.judging`) that recompute the
  reference from the inputs a hidden test exported with :func:`tinytf.course.reference.judging.record`,
  checked with the shared validators of :mod:`tinytf.course.reference.validators`;
- ``PROBES``: ``{grade_id: probe(namespace, generator) -> (value, inputs)}``, what each hidden test runs: the
  inputs that expose each of the task's pitfalls, always, plus fresh random ones;
- ``diagnose_tasks(namespace, only=None) -> {grade_id: [Finding]}`` and ``diagnose(namespace)`` (its findings
  as one list): the :mod:`tinytf.checks` detectors and named checks of each task, then :func:`explained`: the
  task's mutants (:mod:`.mutants`: the plausible mistakes, generated from the reference solution) say what a
  wrong result is, and the judges decide on fresh inputs. :func:`check_parts` runs one check per student object
  and :func:`call_student` calls the student's code, so that neither a missing name nor a crash escapes;
  :func:`swapped` runs a later task on tinytf's reference for the earlier ones (each task on its own).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from tinytf.checks import Finding, Pitfall

from ...translation import gettext as _
from ..exercises import EXERCISES

__all__ = ["EXERCISES", "Probe", "call_student", "check_parts", "judge_findings", "judge_by_task", "not_implemented", "stub_or",
           "swapped", "with_cause", "explained", "flat"]



def not_implemented(name: str) -> Finding:
    """The finding for a student's ``name`` that still raises ``NotImplementedError``."""
    return Finding(Pitfall.GENERAL, _("{name} is not implemented yet").format(name=name),
                   _("{name} still raises NotImplementedError.").format(name=name),
                   fix=_("replace the raise NotImplementedError line with your code"))


def call_student(name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, Finding | None]:
    """``(fn(*args, **kwargs), None)``, or ``(None, Finding)`` saying that the student's ``name`` is
    not implemented yet or raised; never raises (a student's bug becomes a message)."""
    try:
        return fn(*args, **kwargs), None
    except NotImplementedError:
        return None, not_implemented(name)
    except Exception as err:  # noqa: BLE001 - a student's bug becomes a message
        return None, Finding(Pitfall.GENERAL, _("{name} raises {type}").format(name=name, type=type(err).__name__),
                             _("{name} raised {type}: {err}").format(name=name, type=type(err).__name__, err=err))


def stub_or(name: str, findings: list[Finding]) -> list[Finding]:
    """A :mod:`tinytf.checks` detector's ``findings`` about the student's ``name``; when they say the
    code raised ``NotImplementedError``, the one "not implemented yet" finding instead."""
    if any("NotImplementedError" in f.message for f in findings):
        return [not_implemented(name)]
    return findings


def check_parts(namespace: dict[str, Any], parts: Iterable[tuple[str | Sequence[str], Callable[..., list[Finding]]]]) -> list[Finding]:
    """Run ``check(obj) -> list[Finding]`` on each student object ``namespace[name]`` of
    ``parts = [(name, check), ...]``; with a tuple of names, ``check(*objs)`` runs once all of them
    are defined. A missing name or a check that crashes becomes a Finding; never raises."""
    findings: list[Finding] = []
    for names, check in parts:
        names = (names,) if isinstance(names, str) else tuple(names)
        objs = [namespace.get(name) for name in names]
        missing = [name for name, obj in zip(names, objs) if not callable(obj)]
        findings.extend(Finding(Pitfall.GENERAL, _("{name} is missing").format(name=name),
                                _("the notebook defines no {name}.").format(name=name),
                                fix=_("define {name} in the notebook (keep its name and signature) and run its cell").format(name=name))
                        for name in missing)
        if missing:
            continue
        try:
            findings.extend(check(*objs))
        except Exception as err:  # noqa: BLE001 - the diagnosis itself must never crash the notebook
            findings.append(Finding(Pitfall.GENERAL, _("{names} could not be checked").format(names=names[0]),
                                    f"{type(err).__name__}: {err}"))
    return findings


@contextmanager
def swapped(where: dict[str, Any] | type, **objects: Any) -> Iterator[None]:
    """Bind ``objects`` in ``where`` for the duration, then restore what was there (or remove a name that
    was not): ``where`` is a notebook's globals (a dict) or a student's class (its own attributes, e.g.
    ``__init__``). A later task runs on tinytf's earlier parts, so a mistake in an earlier task costs only
    that task's points."""
    missing = object()
    if isinstance(where, dict):
        own, put, drop = where, where.__setitem__, where.pop
    else:
        own, put, drop = vars(where), lambda name, obj: setattr(where, name, obj), lambda name: delattr(where, name)
    saved = {name: own.get(name, missing) for name in objects}
    for name, obj in objects.items():
        put(name, obj)
    try:
        yield
    finally:
        for name, obj in saved.items():
            if obj is missing:
                drop(name)
            else:
                put(name, obj)


Probe = Callable[[dict[str, Any], Any], tuple[Any, dict[str, Any]]]


def judge_by_task(namespace: dict[str, Any], probes: dict[str, Probe], *, seed: int | None = None,
                  covered: Iterable[str] = ()) -> dict[str, list[Finding]]:
    """The grader's judgement on the student's own machine, per test cell: for each ``grade_id`` in ``probes``
    (not in ``covered``: a named pitfall already explains that task), ``probes[grade_id](namespace, generator)``
    calls the student's code on the probe's deterministic inputs plus fresh random ones and returns
    ``(value, inputs)``; the same judge the grader runs (:mod:`tinytf.course.reference.judging`) then decides. A rejection
    becomes a Finding quoting the judge's message. Never raises.
    """
    import torch

    from .judging import run_judge

    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ()).item()) if seed is None else seed)
    skip = set(covered)
    found_by: dict[str, list[Finding]] = {}
    for grade_id, probe in probes.items():
        if grade_id in skip:
            continue
        try:
            value, inputs = probe(namespace, gen)
        except NotImplementedError:
            continue  # the diagnosis already says "not implemented yet"
        except Exception as err:  # noqa: BLE001 - a student's crash on fresh inputs is the finding
            found_by[grade_id] = [Finding(Pitfall.GENERAL, _("{grade_id} fails on fresh inputs").format(grade_id=grade_id),
                                          f"{type(err).__name__}: {err}")]
            continue
        passed, message = run_judge(grade_id, value, inputs)
        if not passed:
            found_by[grade_id] = [Finding(Pitfall.GENERAL, _("{grade_id} would not earn its points").format(grade_id=grade_id), message)]
    return found_by


def judge_findings(namespace: dict[str, Any], probes: dict[str, Probe], *, seed: int | None = None,
                   covered: Iterable[str] = ()) -> list[Finding]:
    """:func:`judge_by_task`'s findings as one list (in the order of ``probes``)."""
    return flat(judge_by_task(namespace, probes, seed=seed, covered=covered))


def flat(by_task: dict[str, list[Finding]]) -> list[Finding]:
    """Every task's findings, one list, in the order of the tasks."""
    return [f for fs in by_task.values() for f in fs]


Named = Callable[[], list[Finding]] | list[Finding]


def explained(namespace: dict[str, Any], probes: dict[str, Probe], named: dict[str, Named], *,
              only: Iterable[str] | None = None, seed: int | None = None) -> dict[str, list[Finding]]:
    """Each task's findings explained by its mutants (:func:`.mutants.explain`: the plausible mistake whose result is the
    student's, else the task's named checks' findings ``named[grade_id]`` — a list, or a function that computes it —,
    else a judged "nothing fits"), then the judges on fresh inputs for every task still without a finding:
    ``{grade_id: findings}`` over every task, or over ``only`` (the named checks of the others are not run)."""
    from .mutants import explain

    chosen = None if only is None else set(only)
    tasks = [gid for gid in dict.fromkeys([*probes, *named]) if chosen is None or gid in chosen]
    out = {}
    for gid in tasks:
        check = named.get(gid, [])
        out[gid] = explain(namespace, gid, probes.get(gid), list(check() if callable(check) else check))
    judged = judge_by_task(namespace, {gid: p for gid, p in probes.items() if gid in out}, seed=seed,
                           covered=[gid for gid, fs in out.items() if fs])
    return {gid: out[gid] + judged.get(gid, []) for gid in tasks}


def with_cause(findings: list[Finding], grade_id: str, cause: str, *, every: bool = False) -> list[Finding]:
    """``findings`` (from :func:`judge_findings`) with ``cause`` added to the message of ``grade_id``'s
    finding (``every``: to each of ``findings``, all about that task): a later task's failure that an earlier task
    explains says so."""
    import dataclasses

    def caused(f: Finding) -> Finding:
        for lang in ("en", "zh"):  # the fix sentence begins with " Fix: " or its Chinese
            mark = _(" Fix: {fix}.", lang).split("{fix}", 1)[0]
            if mark in f.message:
                evidence, fix = f.message.split(mark, 1)
                return dataclasses.replace(f, message=f"{evidence} — {cause}{mark}{fix}")
        return dataclasses.replace(f, message=f"{f.message} — {cause}")

    return [caused(f) if every or f.title.startswith(f"{grade_id} ") else f for f in findings]
