"""Generated mutants: every task's plausible single mistakes, written as edits of its reference solution.

For each autograded task (an nbgrader test cell ``exNN_task``) a :class:`Family` holds the reference
solution's code (``source``: the answer cell of ``solutions/exNN_*.ipynb`` without its nbgrader markers; the
tests check that both editions' cells are this program) and its :class:`Mutant` s. A mutant is one mistake a
student makes: a few textual ``edits`` of the reference (``("amax(dim=-1, keepdim=True)", "max()")``), or, for
a task whose answer is a value the notebook measured, a ``bind`` that turns the notebook's value into the wrong
one. It carries what the diagnosis says when a student's code behaves like it: the catalog's pitfall, a
title, evidence that says what the result *is* in terms of the reference (``facts`` fills its fields from the
probe's inputs), and the fix that undoes the edit.

Two users:

- the diagnosis (:func:`explain`): the task's probe runs the student's code and each mutant (planted in a copy
  of the notebook's namespace) on the same deterministic inputs; the mutant whose output is the student's
  names the mistake. When none fits it says so, shows the judge's description of the nearest symptom and
  gives no fix that belongs to another mistake;
- the tests (tests/test_mutants*.py): every mutant, put into the notebook in place of the solution cell,
  fails a visible or hidden test on every seed, and the diagnosis names it and prints its fix; the
  ``correct`` variants (another loop order, einsum, index lists) earn full marks with no finding.

A new exercise adds ``tinytf/course/reference/mutants/exNN.py`` with ``FAMILIES = (Family(...), ...)``
(one per task); :func:`families` finds it by name. A new task of an existing exercise adds a Family there.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from tinytf.checks import Finding, Pitfall, found

from ....translation import N_
from ....translation import gettext as _

__all__ = ["Edit", "Mutant", "Correct", "Family", "families", "family", "mutated", "planted", "signature", "same", "match",
           "explain", "nothing_fits", "SEED"]

Edit = tuple[str, str]
SEED = 20240535  # the probes' deterministic inputs plus one fixed draw of their random ones: student and mutants see the same


@dataclass(frozen=True)
class Mutant:
    """One plausible mistake of a task: ``edits`` of the reference source (each ``old`` occurs exactly once), or
    ``bind(namespace) -> {name: wrong value}`` for a measured answer; what the diagnosis says when it fits.
    ``title``, ``evidence`` and ``fix`` are messages (``N_``) said in the student's language; ``facts(value,
    inputs)`` fills ``evidence``'s named fields from the probe's result and inputs."""

    name: str
    pitfall: Pitfall
    title: str
    evidence: str
    fix: str
    edits: tuple[Edit, ...] = ()
    bind: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    facts: Callable[[Any, dict[str, Any]], dict[str, Any]] | None = None

    @property
    def catalog_fix(self) -> bool:
        """Whether the catalog's one-line fix of ``pitfall`` is the fix that undoes this mutant (its own ``fix`` says it
        too, maybe with more): the finding then prints the catalog's, the single source of that wording."""
        return self.pitfall is not Pitfall.GENERAL and self.pitfall.fix.replace("`", "") in self.fix

    def finding(self, value: Any, inputs: dict[str, Any]) -> Finding:
        """The finding a student whose code behaves like this mutant gets (in the running notebook's language)."""
        evidence = _(self.evidence)
        if self.facts is not None:  # only an evidence with facts has fields (others may quote braces)
            try:
                evidence = evidence.format(**self.facts(value, inputs))
            except Exception:  # noqa: BLE001 - a student's odd value must not cost the diagnosis: the sentence without its facts
                evidence = evidence.split("{", 1)[0].rstrip(" :(")
        return found(self.pitfall, _(self.title), evidence, fix=True if self.catalog_fix else _(self.fix))


@dataclass(frozen=True)
class Correct:
    """Another correct solution of a task (a loop order, einsum, index lists …): ``edits`` of the reference or a ``bind``."""

    name: str
    edits: tuple[Edit, ...] = ()
    bind: Callable[[dict[str, Any]], dict[str, Any]] | None = None


@dataclass(frozen=True)
class Family:
    """A task's reference solution and its mutants.

    ``task``: the test cell's grade id; ``cell``: the answer cell's grade id; ``source``: the answer cell's code;
    ``subject``: what a student calls it (``"softmax_by_hand"``). ``signature(namespace, generator) -> (value,
    inputs)`` is what is compared (default: the task's probe); ``same(a, b)`` compares two values (default:
    :func:`same`). ``reruns``: the ids of later notebook cells that compute what the task's test reads from the
    answer (the tests rerun them after planting a mutant); ``affects``: the other tasks whose tests or probes also
    call this answer (the tests judge those again for each variant; the rest keep the reference's verdicts)."""

    task: str
    cell: str
    subject: str
    source: str
    mutants: tuple[Mutant, ...]
    correct: tuple[Correct, ...] = ()
    signature: Callable[[dict[str, Any], torch.Generator], tuple[Any, dict[str, Any]]] | None = None
    same: Callable[[Any, Any], bool] | None = None
    reruns: tuple[str, ...] = ()
    affects: tuple[str, ...] = ()


def families(exercise: str) -> dict[str, Family]:
    """``{task: Family}`` of ``exercise`` (``"ex01"``) from ``tinytf.course.reference.mutants.<exercise>``; ``{}`` when
    it has none."""
    try:
        mod = importlib.import_module(f"{__name__}.{exercise}")
    except ModuleNotFoundError as err:
        if err.name != f"{__name__}.{exercise}":
            raise
        return {}
    return {f.task: f for f in mod.FAMILIES}


def family(task: str) -> Family | None:
    """The Family of test cell ``task`` (``"ex01_softmax"``), or None."""
    return families(task.split("_", 1)[0]).get(task)


def mutated(source: str, edits: Iterable[Edit]) -> str:
    """``source`` with each ``(old, new)`` of ``edits`` applied; every ``old`` must occur exactly once."""
    for old, new in edits:
        n = source.count(old)
        if n != 1:
            raise ValueError(f"the edit {old!r} occurs {n} times in the reference source, not once")
        source = source.replace(old, new)
    return source


_CODE: dict[tuple[str, str], Any] = {}


def planted(namespace: dict[str, Any], fam: Family, variant: Mutant | Correct | None = None) -> dict[str, Any]:
    """A copy of the notebook's ``namespace`` in which the answer cell is ``variant`` (None: the reference): its
    edited source run there (the way a student's cell runs), then its ``bind``. The notebook itself is untouched."""
    ns = dict(namespace)
    edits = variant.edits if variant is not None else ()
    bind = variant.bind if variant is not None else None
    if edits or bind is None:
        key = (fam.task, variant.name if variant is not None else "")
        if key not in _CODE:
            _CODE[key] = compile(mutated(fam.source, edits), f"<{fam.task}:{key[1] or 'reference'}>", "exec")
        exec(_CODE[key], ns)  # noqa: S102 - tinytf's own reference code, edited
    if bind is not None:
        ns.update(bind(ns))
    return ns


def signature(fam: Family, probe: Callable[..., tuple[Any, dict[str, Any]]] | None, namespace: dict[str, Any],
              seed: int = SEED) -> tuple[Any, dict[str, Any]]:
    """``(value, inputs)`` of the family's signature (or ``probe``) on ``namespace``, with the generator and the global
    random state both seeded by ``seed``: two namespaces compared this way see the same inputs."""
    fn = fam.signature or probe
    if fn is None:
        raise ValueError(f"{fam.task}: no signature and no probe")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return fn(namespace, torch.Generator().manual_seed(seed))


def same(a: Any, b: Any) -> bool:
    """Whether two results agree: tensors of one shape and kind close to float32 rounding (NaN where NaN), floats close,
    containers entry by entry, anything else equal (an int is not a float)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape:
            return False
        if a.dtype == torch.bool or b.dtype == torch.bool or not (a.is_floating_point() and b.is_floating_point()):
            return a.dtype == b.dtype and bool(torch.equal(a.cpu(), b.cpu()))
        return bool(torch.allclose(a.detach().double().cpu(), b.detach().double().cpu(), rtol=1e-4, atol=1e-5, equal_nan=True))
    if isinstance(a, dict) or isinstance(b, dict):
        return isinstance(a, dict) and isinstance(b, dict) and set(a) == set(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b)
                and all(same(x, y) for x, y in zip(a, b)))
    if isinstance(a, float) or isinstance(b, float):  # an int where a float is (or the reverse) is a different result
        if type(a) is not type(b):
            return False
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)
    return type(a) is type(b) and a == b


def _run(fam: Family, probe: Callable[..., Any] | None, namespace: dict[str, Any]) -> tuple[Any, dict[str, Any], str | None]:
    """``(value, inputs, None)``, or ``(None, {}, "Type: message")`` when the code raises (NotImplementedError propagates)."""
    try:
        value, inputs = signature(fam, probe, namespace)
    except NotImplementedError:
        raise
    except Exception as err:  # noqa: BLE001 - a crash is a result too: the same crash on the same inputs is the same mistake
        return None, {}, re.sub(r"(/[^\s'\"/]+)+/?", "<path>", f"{type(err).__name__}: {err}")  # temporary files' names aside
    return value, inputs, None


def match(namespace: dict[str, Any], fam: Family, probe: Callable[..., Any] | None) -> tuple[Mutant | None, Any, dict[str, Any]]:
    """``(the mutant whose result is the student's or None, the student's value, the inputs)``. A student's code that
    raises matches a mutant that raises the same error on the same inputs; NotImplementedError and a missing name
    (KeyError of the probe) propagate, for the named checks to report."""
    value, inputs, crash = _run(fam, probe, namespace)
    if crash is not None and crash.startswith("KeyError"):
        raise KeyError(crash)
    if crash is not None and _run(fam, probe, planted(namespace, fam))[2] == crash:
        raise RuntimeError(crash)  # the reference crashes the same way here: the notebook lacks something, no mistake explains it
    compare = fam.same or same
    for m in fam.mutants:
        try:
            theirs, _, their_crash = _run(fam, probe, planted(namespace, fam, m))
        except Exception:  # noqa: BLE001 - a mutant that cannot even be planted fits no student
            continue
        if crash is not None or their_crash is not None:
            if crash == their_crash:
                return m, value, inputs
            continue
        if compare(value, theirs):
            return m, value, inputs
    if crash is not None:
        raise RuntimeError(crash)  # a crash no mutant explains: the named checks report it
    return None, value, inputs


NOTHING_FITS_FIX = N_("work out the task's result by hand on a tiny input and compare it with yours, step by step")


def nothing_fits(fam: Family, symptom: str) -> Finding:
    """The finding when the judge rejects a result that none of the family's mutants explains: it says so, shows the
    judge's description of the symptom, and gives a fix that belongs to no particular mistake."""
    return found(Pitfall.GENERAL, _("{subject}: a mistake none of the known ones explains").format(subject=fam.subject),
                 _("None of the {n} mistakes this check knows for {subject} gives your result. The nearest symptom: {symptom}").format(
                     n=len(fam.mutants), subject=fam.subject, symptom=symptom.rstrip(".")),
                 fix=_(NOTHING_FITS_FIX))


def explain(namespace: dict[str, Any], task: str, probe: Callable[..., Any] | None, named: list[Finding]) -> list[Finding]:
    """A task's findings: the mutant that fits the student's code when one does (it replaces the named checks'
    findings: it says what the result is and prints the fix that undoes it); else the named checks' findings;
    else, when the judge rejects the student's result on the deterministic inputs, :func:`nothing_fits`.
    The student's code failing to run (not implemented, missing, raising) is left to the named checks. Never raises."""
    from ..judging import run_judge

    fam = family(task)
    if fam is None:
        return named
    try:
        mutant, value, inputs = match(namespace, fam, probe)
    except Exception:  # noqa: BLE001 - not implemented, missing or crashing: the named checks say which
        return named
    if mutant is not None:
        return [mutant.finding(value, inputs)]
    if named:
        return named
    try:
        if fam.signature is not None:  # the judge reads what the probe records, not the family's signature
            value, inputs = signature(Family(fam.task, fam.cell, fam.subject, fam.source, ()), probe, namespace)
        passed, message = run_judge(task, value, inputs)
    except NotImplementedError:
        return []  # the probe leaves this task to the notebook's own run (not run yet): nothing to judge here
    except Exception as err:  # noqa: BLE001
        passed, message = False, f"{type(err).__name__}: {err}"
    return [] if passed else [nothing_fits(fam, message)]
