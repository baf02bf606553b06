"""The generated mutants (tinytf/course/reference/mutants/) run as students' notebooks, in-process, without a kernel.

One :class:`Notebook` per exercise and edition: the instructor notebook executed once, cell by cell, in one
``__main__`` namespace (its test cells and self-check left out), the way a kernel runs it. :meth:`Notebook.planted`
puts a variant in: the answer cell of that edition with the variant's edits (or the variant's ``bind``), then
the later cells that compute what the task's test reads; afterwards the namespace is restored. Then:

- :meth:`Notebook.visible`: the test cell as released (its hidden region cut), run in the namespace;
- :meth:`Notebook.hidden`: what the hidden test does (its probe on a seed, then the grader's judge);
- :meth:`Notebook.diagnose`: the exercise's ``diagnose_tasks`` (what validate and the self-check print).

Exercise 11's visible tests start two real gloo processes (``on_processes``); here they run the same job on two
simulated ranks in this process (``on_threads``): the computation is the same, the process start-up is not.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import matplotlib
import nbformat
import torch

from tinytf.course.exercises import REFERENCE_MODULES
from tinytf.course.reference import mutants as M
from tinytf.course.reference.judging import run_judge

matplotlib.use("Agg")

ROOT = Path(__file__).resolve().parents[1]
SEEDS = (0, 1, 2, 3, 20240535)  # five seeds of the hidden tests' fresh inputs
EDITIONS = {"en": ROOT / "solutions", "zh": ROOT / "solutions" / "zh"}


def cell_key(cell: Any) -> str:
    return cell.metadata.get("nbgrader", {}).get("grade_id") or cell.id


def answer_code(source: str) -> str:
    """An answer cell's code without its nbgrader markers (what :data:`Family.source` holds)."""
    return "\n".join(line for line in source.split("\n") if line.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION"))


def visible_code(source: str) -> str:
    """A test cell as nbgrader releases it: the hidden region cut."""
    if "### BEGIN HIDDEN TESTS" not in source:
        return source
    head, rest = source.split("### BEGIN HIDDEN TESTS", 1)
    return head.rstrip(" ") + rest.split("### END HIDDEN TESTS", 1)[1].lstrip("\n")


def _threads(job: str, fn: Any, world: int, *args: Any, **kw: Any) -> list[torch.Tensor]:
    from tinytf.course.reference.ex11_ranks import on_threads

    kw.pop("timeout_s", None)
    return on_threads(job, fn, world, *args)


class Notebook:
    """The instructor notebook of ``ex`` in ``edition``, executed once (test cells and self-check left out)."""

    def __init__(self, ex: str, edition: str) -> None:
        (path,) = EDITIONS[edition].glob(f"{ex}_*.ipynb")
        self.ex, self.edition = ex, edition
        self.cells = {cell_key(c): c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"}
        self.module = importlib.import_module(REFERENCE_MODULES[ex])
        self.probes = self.module.PROBES
        self.families = M.families(ex)
        self.tests = [k for k, c in self.cells.items() if c.metadata.get("nbgrader", {}).get("grade")
                      and not c.metadata["nbgrader"].get("solution")]
        self.points = {k: float(self.cells[k].metadata["nbgrader"].get("points", 0)) for k in self.tests}
        self.ns: dict[str, Any] = {"__name__": "__main__"}
        with torch.random.fork_rng(devices=[]):
            for key, cell in self.cells.items():
                if key in self.tests or "self_check(" in cell.source:
                    continue
                self._run(cell.source, key)
                if ex == "ex11" and "on_processes" in self.ns:
                    self.ns["on_processes"] = _threads

    def _run(self, source: str, name: str) -> None:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            exec(compile(source, f"<{self.ex}:{name}>", "exec"), self.ns)  # noqa: S102 - our notebook's code

    def answer(self, fam: M.Family, variant: M.Mutant | M.Correct | None = None) -> str:
        """This edition's answer cell of ``fam`` with ``variant``'s edits applied (each must occur once)."""
        return M.mutated(answer_code(self.cells[fam.cell].source), variant.edits if variant is not None else ())

    @contextlib.contextmanager
    def planted(self, fam: M.Family, variant: M.Mutant | M.Correct | None) -> Iterator[dict[str, Any]]:
        """The namespace with ``variant`` as the answer of ``fam`` (and its later cells rerun); restored afterwards."""
        saved = dict(self.ns)
        contents = {name: t.detach().clone() for name, t in saved.items() if isinstance(t, torch.Tensor)}  # a mutant may edit in place
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                if variant is not None and (variant.edits or variant.bind is None):  # None: the reference, as executed
                    self._run(self.answer(fam, variant), fam.cell)
                if variant is not None and variant.bind is not None:
                    self.ns.update(variant.bind(self.ns))
                self._rerun(fam, variant)
            yield self.ns
        finally:
            self.ns.clear()
            self.ns.update(saved)
            with torch.no_grad():
                for name, t in contents.items():
                    if not torch.equal(saved[name], t):  # only what a variant changed (an expanded view cannot be written)
                        saved[name].copy_(t)

    def _rerun(self, fam: M.Family, variant: M.Mutant | M.Correct | None) -> None:
        """Run the later cells of ``fam.reruns`` (the training run, the benchmark, the checkpoint) on the planted answer.
        They are one program in both editions (the twin rule): what the first edition's run bound is reused, copied, by
        the other, so that a 200-step training run is not repeated per edition."""
        if not fam.reruns:
            return
        key = (self.ex, fam.task, "reference" if variant is None else variant.name)
        if key not in _RERUNS:
            before = dict(self.ns)
            for cell in fam.reruns:
                try:
                    self._run(self.cells[cell].source, cell)
                except Exception:  # noqa: BLE001 - a later cell that fails on a wrong answer, as in a kernel
                    pass
            _RERUNS[key] = copy.deepcopy({k: v for k, v in self.ns.items() if k not in before or v is not before[k]})
        self.ns.update(copy.deepcopy(_RERUNS[key]))

    def visible(self, task: str) -> str | None:
        """``None`` when the released test cell ``task`` passes in the namespace, else ``"Type: message"``."""
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(1)
                self._run(visible_code(self.cells[task].source), task)
        except Exception as err:  # noqa: BLE001 - a failing test is a verdict
            return f"{type(err).__name__}: {err}"
        return None

    def graded(self, task: str) -> str | None:
        """The whole test cell, visible and hidden parts, as the grader runs it (the hidden part draws its own fresh
        seed); ``None`` when it passes, else ``"Type: message"``."""
        try:
            self._run(self.cells[task].source, task)
        except Exception as err:  # noqa: BLE001 - a failing test cell earns no points
            return f"{type(err).__name__}: {err}"
        return None

    def hidden(self, task: str, seed: int) -> str | None:
        """``None`` when the hidden test of ``task`` (its probe on ``seed``, then the judge) passes, else why not."""
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                value, inputs = self.probes[task](self.ns, torch.Generator().manual_seed(seed))
        except Exception as err:  # noqa: BLE001 - the hidden test cell raises: the task earns nothing
            return f"{type(err).__name__}: {err}"
        ok, message = run_judge(task, value, inputs)
        return None if ok else message

    def diagnose(self, only: list[str] | None = None) -> dict[str, list[Any]]:
        """``{task: findings}`` of the exercise's diagnosis on the namespace as it is (the judges' fresh draw seeded), for
        every task or ``only`` these."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return self.module.diagnose_tasks(self.ns, only=only)


_CACHE: dict[tuple[str, str], Notebook] = {}
_RERUNS: dict[tuple[str, str, str], dict[str, Any]] = {}


def notebook(ex: str, edition: str) -> Notebook:
    """The executed notebook of ``ex`` in ``edition``, built once per test process."""
    if (ex, edition) not in _CACHE:
        _CACHE[(ex, edition)] = Notebook(ex, edition)
    return _CACHE[(ex, edition)]


_HIDDEN: dict[tuple[str, str, str, int], str | None] = {}  # the hidden tests are one program in both editions


def verdict(nb: Notebook, fam: M.Family, variant: M.Mutant | M.Correct | None) -> dict[str, Any]:
    """What the grader and the diagnosis say of ``variant`` planted as the answer of ``fam``: ``visible`` and ``hidden``
    (``{task: None or the failure}``, hidden per seed of :data:`SEEDS`) and ``findings`` (``{task: [Finding]}``) for every
    test cell. The tasks that read this answer (its own and ``fam.affects``) are judged and diagnosed again; the others
    keep the reference notebook's verdicts (:func:`baseline`)."""
    base = baseline(nb)
    tasks = [fam.task, *fam.affects]
    name = "reference" if variant is None else variant.name
    with nb.planted(fam, variant):
        visible = {t: nb.visible(t) for t in tasks}
        hidden = {}
        for t in tasks:
            hidden[t] = []
            for seed in SEEDS:
                key = (fam.task, name, t, seed)
                if key not in _HIDDEN:
                    _HIDDEN[key] = nb.hidden(t, seed)
                hidden[t].append(_HIDDEN[key])
        findings = nb.diagnose(only=tasks)
    return {"visible": {**base["visible"], **visible}, "hidden": {**base["hidden"], **hidden}, "findings": {**base["findings"], **findings}}


_BASE: dict[tuple[str, str], dict[str, Any]] = {}


def baseline(nb: Notebook) -> dict[str, Any]:
    """The reference notebook's verdicts on every test cell (visible, hidden on each seed, findings)."""
    if (nb.ex, nb.edition) not in _BASE:
        _BASE[(nb.ex, nb.edition)] = {"visible": {t: nb.visible(t) for t in nb.tests},
                                      "hidden": {t: [nb.hidden(t, s) for s in SEEDS] for t in nb.tests}, "findings": nb.diagnose()}
    return _BASE[(nb.ex, nb.edition)]


def points(nb: Notebook, v: dict[str, Any]) -> tuple[list[float], float]:
    """``(graded, predicted)``: the points the grader gives on each seed (a test cell earns its points when its visible
    and its hidden part pass), and the points validate predicts (a passing visible test of a task the diagnosis has no
    finding for)."""
    tasks = list(v["visible"])
    graded = [sum(nb.points[t] for t in tasks if v["visible"][t] is None and v["hidden"][t][i] is None) for i in range(len(SEEDS))]
    predicted = sum(nb.points[t] for t in tasks if v["visible"][t] is None and not v["findings"].get(t))
    return graded, predicted


FEWER = {  # tasks that allow fewer than five plausible mistakes, and why
    "ex09_memory": (2, "the same tiled_forward as ex09_tiled (whose mistakes are its own); what only memory shows is holding "
                       "every score at once: the whole matrix, or every tile kept"),
}


VISIBLE_ONLY = {  # mutants only the visible test can catch, and why
    "ex06_bench/str_keys": "the hidden test reads the results through JSON, whose keys are strings either way",
}


def check_cover(ex: str) -> None:
    """Every autograded task of ``ex`` has a family: at least five mutants (or the reason in :data:`FEWER`), two other
    correct solutions, distinct names."""
    nb = notebook(ex, "en")
    assert sorted(nb.families) == sorted(nb.tests) == sorted(nb.probes), (sorted(nb.families), sorted(nb.tests))
    for task, fam in nb.families.items():
        assert len(fam.mutants) >= FEWER.get(task, (5,))[0], f"{task}: {len(fam.mutants)} mutants"
        assert len(fam.correct) >= 2, f"{task}: two other correct solutions"
        names = [m.name for m in (*fam.mutants, *fam.correct)]
        assert len(names) == len(set(names)), names


def _strip(tree: Any) -> str:
    """The program of a parsed cell, docstrings dropped."""
    import ast

    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Module)) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def check_sources(ex: str, edition: str) -> None:
    """Each family's reference source is the program of the English answer cell (docstrings and comments aside), every
    variant's edits apply to the cell exactly as to the source, and in the Chinese edition every variant of the cell is
    the twin of the English one (:func:`tinytf.course.build.editions.code_difference`: the same program, the text aside)."""
    import ast

    from tinytf.course.build.editions import code_difference

    nb, en = notebook(ex, edition), notebook(ex, "en")
    for task, fam in nb.families.items():
        assert _strip(ast.parse(answer_code(en.cells[fam.cell].source))) == _strip(ast.parse(fam.source)), (
            f"{task}: the family's source is not {fam.cell}'s program")
        for variant in (None, *fam.mutants, *fam.correct):
            name = "reference" if variant is None else variant.name
            mine, english = nb.answer(fam, variant), en.answer(fam, variant)
            if variant is not None and variant.edits:
                assert _strip(ast.parse(english)) == _strip(ast.parse(M.mutated(fam.source, variant.edits))), (
                    f"{task}/{name}: the edits change the cell and the source differently")
            assert code_difference(english, mine) is None, f"{task}/{name}: {code_difference(english, mine)}"


def _said(finding: Any) -> str:
    """What a Chinese student reads of ``finding`` (title, evidence, fix)."""
    import json

    from tinytf.course.check.report import finding_lines
    from tinytf.course.check.selfcheck import finding_json

    return "\n".join(finding_lines(json.loads(json.dumps(finding_json(finding))), "zh"))


def _latin_sentences(text: str) -> list[str]:
    from test_translation import _latin_sentences as latin

    return latin(text)


def pitfalls_named(message: str | None) -> set[int]:
    """The pitfall numbers a test's message names: "(pitfall 30)", "(pitfalls 32, 33)", "（陷阱 32、33）"."""
    import re

    groups = re.findall(r"(?:pitfalls?|陷阱)\s*(\d+(?:\s*(?:,|、|，|and|和)\s*\d+)*)", message or "")
    return {int(n) for g in groups for n in re.findall(r"\d+", g)}


def check_variants(ex: str, edition: str) -> list[str]:
    """Every mutant fails a test on every seed and is named with its own fix; every correct variant earns full marks
    with no finding; validate's predicted points are the grader's on every seed. Returns the problems (empty: none)."""
    import os

    from tinytf.checks.findings import fix_sentence
    from tinytf.translation import gettext as _

    os.environ["TINYTF_LANG"] = edition
    nb = notebook(ex, edition)
    total = sum(nb.points.values())
    problems = []
    base = baseline(nb)
    wrong = {t: (v, [h for h in base["hidden"][t] if h], base["findings"][t]) for t, v in base["visible"].items()
             if v or any(base["hidden"][t]) or base["findings"][t]}
    if wrong:
        problems.append(f"the reference notebook fails or has findings: {wrong}")
    for task, fam in nb.families.items():
        for variant in (None, *fam.correct, *fam.mutants):
            name = f"{task}/{'reference' if variant is None else variant.name}"
            v = verdict(nb, fam, variant)
            graded, predicted = points(nb, v)
            if any(g != predicted for g in graded):
                problems.append(f"{name}: validate predicts {predicted} points, the grader gives {graded} on the seeds {SEEDS}; "
                                f"findings {[str(f) for fs in v['findings'].values() for f in fs]}")
            if not isinstance(variant, M.Mutant):
                if graded != [total] * len(SEEDS) or any(v["findings"].values()):
                    problems.append(f"{name}: a correct solution got {graded} of {total} and findings "
                                    f"{[str(f) for fs in v['findings'].values() for f in fs]}")
                continue
            failed = [v["visible"][task] is not None or v["hidden"][task][i] is not None for i in range(len(SEEDS))]
            if not all(failed):
                problems.append(f"{name}: passes its tests on the seeds {[s for s, f in zip(SEEDS, failed) if not f]}")
            hidden = [v["hidden"][task][i] is not None for i in range(len(SEEDS))]
            if not all(hidden) and name not in VISIBLE_ONLY:  # the hidden test's fixed inputs expose it, whatever the seed
                problems.append(f"{name}: its hidden test passes on the seeds {[s for s, f in zip(SEEDS, hidden) if not f]}")
            if edition == "en" and variant is fam.mutants[0]:  # fam.affects is complete: the whole diagnosis agrees
                with nb.planted(fam, variant):
                    everywhere = nb.diagnose()
                stray = {t: [str(f) for f in fs] for t, fs in everywhere.items() if fs and t not in (task, *fam.affects)}
                if stray:
                    problems.append(f"{name}: findings on tasks outside {(task, *fam.affects)} (add them to the family's affects): {stray}")
            named = pitfalls_named(v["visible"][task])  # a visible message names no other mistake's pitfall
            if named and int(variant.pitfall) not in named:
                problems.append(f"{name}: its visible test names pitfall {sorted(named)}, not its own ({int(variant.pitfall)}): "
                                f"{v['visible'][task][:200]}")
            mine = v["findings"].get(task, [])
            fix = "" if variant.catalog_fix else _(variant.fix)  # "": the catalog's fix, printed by the finding's message
            if not any(f.pitfall == variant.pitfall and f.title == _(variant.title) and f.fix == fix
                       and (fix or f.text.endswith(fix_sentence(_(variant.pitfall.fix)))) for f in mine):
                problems.append(f"{name}: the diagnosis does not name it with its fix: {[str(f) for f in mine]}")
            if edition == "zh":
                english = [s for f in mine for s in _latin_sentences(_said(f))]
                if english:
                    problems.append(f"{name}: English in the Chinese diagnosis: {english}")
    return problems


def suite(exercises: tuple[str, ...]) -> tuple[Any, Any, Any]:
    """The three checks of a range of exercises, each parametrised over ``exercises`` (and the editions): a test file
    binds them to its own names. The exercises are split over several files so that xdist's ``--dist loadfile`` gives
    the ranges to different workers."""
    import pytest

    @pytest.mark.parametrize("ex", exercises)
    def cover(ex: str, monkeypatch: Any) -> None:
        monkeypatch.setenv("TINYTF_DEVICE", "cpu")
        check_cover(ex)

    @pytest.mark.parametrize("edition", list(EDITIONS))
    @pytest.mark.parametrize("ex", exercises)
    def sources(ex: str, edition: str, monkeypatch: Any) -> None:
        monkeypatch.setenv("TINYTF_DEVICE", "cpu")
        check_sources(ex, edition)

    @pytest.mark.parametrize("edition", list(EDITIONS))
    @pytest.mark.parametrize("ex", exercises)
    def variants(ex: str, edition: str, monkeypatch: Any) -> None:
        monkeypatch.setenv("TINYTF_DEVICE", "cpu")
        monkeypatch.setenv("TINYTF_LANG", edition)
        problems = check_variants(ex, edition)
        assert not problems, "\n".join(problems)

    return cover, sources, variants
