"""Exercise 3 — one, two or four heads: judges for the hidden tests and the self-check diagnosis.

Student functions: ``mha_parameter_count(dim, heads, bias=True) -> int``,
``time_forward(module, x, repeats=20, warmup=3) -> float`` (median seconds),
``per_head_weights(mha, x) -> [B, H, T, T]``, and the ``results`` dict of the experiment.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from tinytf.checks import Finding, Pitfall, found

from ...translation import gettext
from . import Probe, call_student, check_parts, explained, flat
from .ex03_timing import diagnose_timing, timing_problem, timing_record
from .judging import judge
from .validators import close, differs, has_keys, how_off, seconds, shape_of, shapes

__all__ = ["maps_sum_to_one", "PROBES", "timing_problem", "timing_record", "reference_parameter_count", "reference_head_weights",
           "diagnose", "diagnose_tasks", "beside_time"]


def reference_parameter_count(dim: int, heads: int, bias: bool = True) -> int:
    """Parameters of ``tinytf.MultiHeadAttention(dim, heads, bias=bias)``, counted from the module."""
    from tinytf import MultiHeadAttention, count_parameters

    return count_parameters(MultiHeadAttention(dim, heads, bias=bias))


def reference_head_weights(x: torch.Tensor, heads: int, qkv_weight: torch.Tensor, qkv_bias: torch.Tensor | None) -> torch.Tensor:
    """Per-head self-attention weights ``[B, H, T, T]`` of a MultiHeadAttention with these ``qkv`` weights."""
    from tinytf import MultiHeadAttention

    dim = x.size(-1)
    mha = MultiHeadAttention(dim, heads, bias=qkv_bias is not None)
    with torch.no_grad():
        mha.qkv.weight.copy_(qkv_weight)
        if qkv_bias is not None:
            mha.qkv.bias.copy_(qkv_bias)
        return mha(x.float(), return_weights=True)[1]


# ---- judges ---------------------------------------------------------------------------------------


@judge("ex03_param_count")
def _judge_param_count(value: Any, cases: list) -> None:
    assert isinstance(value, list) and len(value) == len(cases), gettext("mha_parameter_count: one count per case expected")
    for (dim, heads, bias), n in zip(cases, value):
        assert isinstance(n, int) and not isinstance(n, bool), gettext("mha_parameter_count must return an int")
        assert n == reference_parameter_count(int(dim), int(heads), bool(bias)), gettext("mha_parameter_count gives a wrong count")


@judge("ex03_timing")
def _judge_timing(value: Any, sleep_s: float, repeats: int) -> None:
    problem = timing_problem(value, repeats)
    assert problem is None, problem


@judge("ex03_head_maps")
def _judge_head_maps(value: Any, x: torch.Tensor, heads: int, qkv_weight: torch.Tensor, qkv_bias: Any = None) -> None:
    expected = reference_head_weights(x, int(heads), qkv_weight.float(), None if qkv_bias is None else qkv_bias.float())
    assert isinstance(value, torch.Tensor) and tuple(value.shape) == tuple(expected.shape), (
        gettext("per_head_weights must return [B, H, T, T] = {expected_shape}").format(expected_shape=list(expected.shape))
    )
    close(value, expected, "per_head_weights(mha, x)", given=shapes(x=x, heads=int(heads)),
          reference=gettext("the softmax of each head's q kᵀ / sqrt(d_head)"))


def maps_sum_to_one(per_head_weights: Any, dim: int, heads: int, x: torch.Tensor) -> bool:
    """Whether the student's ``per_head_weights`` (Task 3c) gives rows that sum to one on a fresh
    ``tinytf.MultiHeadAttention(dim, heads)``: when it does not, Task 3d's results cannot either, and only
    Task 3c loses points for it."""
    from tinytf import MultiHeadAttention

    with torch.no_grad():
        w = per_head_weights(MultiHeadAttention(int(dim), int(heads)).to(x.device), x)
    return bool(isinstance(w, torch.Tensor) and torch.isfinite(w).all()
                and torch.allclose(w.sum(-1), torch.ones_like(w.sum(-1)), atol=1e-4))


@judge("ex03_results")
def _judge_results(value: Any, heads: list, dim: int, x: torch.Tensor, formula: list | None = None, maps_sum_to_one: bool = True,
                   beside_s: list | None = None) -> None:
    """``formula``: the student's mha_parameter_count per head count, ``maps_sum_to_one``: whether the student's
    per_head_weights gives rows that sum to one (a wrong Task 3a or 3c costs that task only); ``beside_s``: the median
    forward time of each head count's module measured by the probe beside the record (times are compared as ratios)."""
    assert isinstance(value, dict) and sorted(value) == sorted(str(h) for h in heads), gettext("results must have one entry per head count")
    b, t, _ = x.shape
    for i, h in enumerate(heads):
        r = value[str(h)]
        has_keys(r, ("params", "time_s", "weights"), f"results[{h}]")
        allowed = {reference_parameter_count(int(dim), int(h))} | ({formula[i]} if formula and len(formula) == len(heads) else set())
        assert r["params"] in allowed, gettext("results[{h}]['params'] is neither the module's count nor your mha_parameter_count({dim}, "
                                               "{h})").format(h=h, dim=dim)
        took = seconds(r["time_s"], f"results[{h}]['time_s']")
        assert took < 1.0, gettext("results[{h}]['time_s'] is implausible").format(h=h)
        if beside_s and len(beside_s) == len(heads) and float(beside_s[i]) > 0:
            ratio = took / float(beside_s[i])
            assert 1 / BESIDE <= ratio <= BESIDE, gettext(
                "results[{h}]['time_s'] = {took:.3g} s is {ratio:.3g} times the forward time measured beside it ({beside:.3g} s): "
                "store seconds per call (time_forward's value)").format(h=h, took=took, ratio=ratio, beside=float(beside_s[i]))
        w = r["weights"]
        assert isinstance(w, torch.Tensor) and tuple(w.shape) == (b, int(h), t, t), gettext("results[{h}]['weights'] must be [B, {h}, T, "
                                                                                            "T]").format(h=h)
        assert not maps_sum_to_one or bool(torch.isfinite(w).all()) and torch.allclose(w.sum(-1), torch.ones(b, int(h), t), atol=1e-4), (
            gettext("results[{h}]['weights']: rows must sum to one").format(h=h)
        )


BESIDE = 30.0
"""A recorded time within ``1/BESIDE … BESIDE`` times the same forward call timed beside it: loaded-machine noise (a
few times) passes, milliseconds (1000 times) do not."""


def beside_time(module: Any, x: torch.Tensor, calls: int = 7) -> float:
    """Median seconds of ``module(x)`` over ``calls`` calls after two warm-up calls (no autograd): the probe's own
    measurement, beside the student's."""
    import time

    with torch.no_grad():
        for _ in range(2):
            module(x)
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            module(x)
            times.append(time.perf_counter() - start)
    return sorted(times)[calls // 2]


# ---- self-check diagnosis -------------------------------------------------------------------------


def _diagnose_count(fn: Any) -> list[Finding]:
    cases = [(16, 1, True), (16, 4, True), (24, 2, False), (32, 8, True)]
    for dim, heads, bias in cases:
        n, problem = call_student("mha_parameter_count", fn, dim, heads, bias=bias)
        if problem:
            return [problem]
        want = reference_parameter_count(dim, heads, bias)
        if n == want:
            continue
        hints = {  # what the count holds: (evidence, fix)
            4 * dim * dim: (gettext("that is the weights only"),
                            gettext("with bias=True add one bias per output of each Linear: 3D + D")),
            3 * dim * dim + 3 * dim: (gettext("that is qkv only"), gettext("add the output projection proj (D -> D): D·D + D")),
            4 * dim * dim + 4 * dim: (gettext("those are the bias terms that bias=False leaves out"),
                                      gettext("with bias=False count the weights only: 4·D·D")),
            (4 * dim * dim + (4 * dim if bias else 0)) // heads: (
                gettext("the count is divided by the head count"),
                gettext("do not divide by heads: the heads share the D x 3D projection, each uses a slice")),
        }
        evidence, fix = hints.get(n, ("", gettext("count qkv: weight [3D, D] + bias [3D], and proj: weight [D, D] + bias [D]")))
        how = how_off(n, want) if isinstance(n, int) else ""
        return [found(Pitfall.GENERAL, gettext("mha_parameter_count gives a wrong count"),
                      gettext("dim={dim}, heads={heads}, bias={bias}: got {n!r}, the module has {want}{how}{evidence}.").format(
                          dim=dim, heads=heads, bias=bias, n=n, want=want, how=how,
                          evidence=gettext("; {evidence}").format(evidence=evidence) if evidence else ""),
                      fix=fix)]
    return []


def _diagnose_maps(fn: Any) -> list[Finding]:
    from tinytf import MultiHeadAttention

    g = torch.Generator().manual_seed(3)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        mha = MultiHeadAttention(24, 4)
    x = torch.randn(2, 5, 24, generator=g) * 2
    with torch.no_grad():
        w, problem = call_student("per_head_weights", fn, mha, x)
        if problem:
            return [problem]
        ref = mha(x, return_weights=True)[1]
        if not isinstance(w, torch.Tensor) or tuple(w.shape) != tuple(ref.shape):
            return [found(Pitfall.ORIENTATION, gettext("per_head_weights returns the wrong shape"),
                          gettext("expected [B, H, T, T] = {ref_shape}, got {w}.").format(ref_shape=list(ref.shape), w=shape_of(w)),
                          fix=gettext("split the heads with view(B, T, H, d_head).transpose(1, 2), then "
                                      "softmax(q @ k.transpose(-2, -1) / sqrt(d_head), dim=-1)"))]
        if torch.allclose(w, ref, atol=1e-5):
            return []
        q, k, _ = mha.qkv(x).chunk(3, dim=-1)
        b, t, d, h = 2, 5, 24, 4
        qh = q.view(b, t, h, d // h).transpose(1, 2)
        kh = k.view(b, t, h, d // h).transpose(1, 2)
        raw = qh @ kh.transpose(-2, -1)
        by_sqrt = gettext("divide the scores by math.sqrt(mha.head_dim), one head's width")
        dh = d // h
        variants = [  # (weights, pitfall, title, evidence, fix)
            (raw.softmax(-1), Pitfall.SCALE, gettext("missing scaling"), gettext("the scores are not scaled at all."), by_sqrt),
            ((raw / dh).softmax(-1), Pitfall.SCALE, gettext("scores divided by d_head instead of sqrt(d_head)"),
             gettext("with d_head = {value} the scale is 1/sqrt(d_head) = 1/{math_sqrt:.3g}, not 1/d_head = 1/{value}.").format(
                 value=dh, math_sqrt=math.sqrt(dh)), by_sqrt),
            ((raw / d).softmax(-1), Pitfall.SCALE, gettext("scores divided by the model width D"),
             gettext("the scale is 1/sqrt(d_head) = 1/{root:.3g} with d_head = mha.head_dim, not 1/D = 1/{d}.").format(
                 root=math.sqrt(dh), d=d), by_sqrt),
            ((raw / math.sqrt(d)).softmax(-1), Pitfall.SCALE, gettext("scaled by the model width"),
             gettext("the scale is 1/sqrt(d_head) = 1/{root:.3g} (one head's width), not 1/sqrt(D) = 1/{root_d:.3g}.").format(
                 root=math.sqrt(dh), root_d=math.sqrt(d)), by_sqrt),
            ((raw / math.sqrt(dh)).softmax(-2), Pitfall.ORIENTATION, gettext("softmax over the wrong axis"),
             gettext("each column sums to one, not each row: the softmax ran over the queries."),
             gettext("normalise over the keys, the last axis: softmax(dim=-1)")),
            ((q.reshape(b, h, t, dh) @ k.reshape(b, h, t, dh).transpose(-2, -1) / math.sqrt(dh)).softmax(-1),
             Pitfall.VIEW_AFTER_TRANSPOSE, gettext("heads split with the wrong reshape"),
             gettext("view(B, H, T, d_head) of a [B, T, D] tensor mixes tokens and channels."),
             gettext("split with view(B, T, H, d_head).transpose(1, 2)")),
        ]
        for cand, pitfall, title, evidence, fix in variants:
            if torch.allclose(w, cand, atol=1e-5):
                return [found(pitfall, gettext("per_head_weights: {title}").format(title=title), evidence, fix=fix)]
        return [found(Pitfall.GENERAL, gettext("per_head_weights gives wrong weights"),
                      differs("per_head_weights(mha, x)", w, ref, gettext("MultiHeadAttention({d}, {h}) and x {x_shape}").format(
                          d=d, h=h, x_shape=list(x.shape))) + ".",
                      fix=gettext("compare with mha(x, return_weights=True)[1] and print each intermediate shape"))]


# ---- the judges on fresh inputs (the self-check's copy of the grader's verdict) ------------------


def _probe_count(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    """Two fixed cases (several heads, bias on and off: a count that ignores either shows on every draw), then fresh ones."""
    cases = [[16, 4, True], [24, 2, False]]
    for _ in range(4):
        dim = 4 * int(torch.randint(2, 13, (1,), generator=gen))
        heads = [h for h in (1, 2, 4, 8) if dim % h == 0][int(torch.randint(0, 3, (1,), generator=gen))]
        cases.append([dim, heads, bool(torch.randint(0, 2, (1,), generator=gen))])
    return [ns["mha_parameter_count"](d, h, bias=b) for d, h, b in cases], {"cases": cases}


def _probe_timing(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    reps, sleep_s = int(torch.randint(5, 9, (1,), generator=gen)), 0.001 * int(torch.randint(2, 4, (1,), generator=gen))
    return timing_record(ns["time_forward"], reps, sleep_s), {"sleep_s": sleep_s, "repeats": reps}


def _probe_maps(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    from tinytf import MultiHeadAttention

    heads = [2, 4][int(torch.randint(0, 2, (1,), generator=gen))]
    dim = heads * int(torch.randint(2, 6, (1,), generator=gen))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
        mha = MultiHeadAttention(dim, heads)
    x = torch.randn(2, int(torch.randint(3, 9, (1,), generator=gen)), dim, generator=gen)
    with torch.no_grad():
        value = ns["per_head_weights"](mha, x)
    return value, {"x": x, "heads": heads, "qkv_weight": mha.qkv.weight.detach(), "qkv_bias": mha.qkv.bias.detach()}


def _probe_results(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    """The notebook's own ``results`` (its experiment is not rerun), exported as the hidden test does, with each head
    count's forward time measured beside it."""
    from tinytf import MultiHeadAttention

    results, heads = ns["results"], ns["HEADS"]
    value = {str(h): {"params": results[h]["params"], "time_s": float(results[h]["time_s"]), "weights": results[h]["weights"]}
             for h in heads}
    formula = [ns["mha_parameter_count"](ns["DIM"], h) for h in heads]
    with torch.random.fork_rng(devices=[]):
        rows_ok = maps_sum_to_one(ns["per_head_weights"], ns["DIM"], heads[0], ns["x"])
        beside = [beside_time(MultiHeadAttention(ns["DIM"], h).to(ns["x"].device), ns["x"]) for h in heads]
    return value, {"heads": list(heads), "dim": ns["DIM"], "x": ns["x"], "formula": formula, "maps_sum_to_one": rows_ok,
                   "beside_s": beside}


PROBES: dict[str, Probe] = {"ex03_param_count": _probe_count, "ex03_timing": _probe_timing, "ex03_head_maps": _probe_maps,
                            "ex03_results": _probe_results}
TASKS = {"ex03_param_count": ("mha_parameter_count", _diagnose_count), "ex03_timing": ("time_forward", diagnose_timing),
         "ex03_head_maps": ("per_head_weights", _diagnose_maps)}


def diagnose_tasks(namespace: dict[str, Any], only: Iterable[str] | None = None) -> dict[str, list[Finding]]:
    """``{grade_id: findings}`` about the student's ex03 code in ``namespace``: the named problems, the task's mutants
    (:mod:`.mutants.ex03`), then the grader's judges on fresh inputs for every task without one. Never raises."""
    by_task: dict[str, Any] = {gid: (lambda part=part: check_parts(namespace, [part])) for gid, part in TASKS.items()}
    if "results" not in namespace:
        by_task["ex03_results"] = [Finding(Pitfall.GENERAL, gettext("results is missing"), gettext("the notebook holds no results."),
                                           fix=gettext("run Task 3d's cell to fill results"))]
    return explained(namespace, PROBES, by_task, only=only)


def diagnose(namespace: dict[str, Any]) -> list[Finding]:
    """Findings about the student's ex03 code in ``namespace`` (empty when all looks right); see :func:`diagnose_tasks`."""
    return flat(diagnose_tasks(namespace))
