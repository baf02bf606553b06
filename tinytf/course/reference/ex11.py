"""Exercise 11 — attention across processes: the QKV split, the row-parallel projection, ring attention's merge,
Ulysses' all-to-all.

Student code: ``split_qkv(weight, rank, world, heads, kv_heads)`` (part A), ``row_parallel(x, weight, bias,
comm)`` (part B), ``merge_block(m, l, acc, q, k, v, q_start, k_start)`` (part C) and ``seq_to_heads(x, comm)``
(part D). Each visible check runs
a real 2-process gloo job (:func:`tinytf.course.reference.ex11_ranks.on_processes`, the student's function
shipped by value to the spawned processes). The hidden tests call the probes below — fresh shapes, ``P = 2``
and ``P = 4`` ranks simulated in one process (:func:`~tinytf.course.reference.ex11_ranks.on_threads`) — and
hand every rank's result to the judge, in the notebook and again in the grader's clean process. The judges
compare with tinytf (:func:`tinytf.shard_qkv`, one process's linear layer, full causal attention) and name
chapter 12's pitfalls through :mod:`tinytf.checks.parallel` (and, for part D, by comparing with the attention an
all-to-all with the sequence and head axes swapped produces).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F

from tinytf.checks import Finding, Pitfall, found
from tinytf.checks.findings import difference_pattern, slice_map
from tinytf.checks.parallel import qkv_rows

from ...translation import gettext as _
from . import Probe, call_student, check_parts, explained, flat, stub_or
from .ex11_ranks import on_threads
from .judging import judge
from .validators import float_inputs, tensor

__all__ = ["reference_split_qkv", "reference_row_parallel", "reference_merge_block", "reference_seq_to_heads", "diagnose",
           "diagnose_tasks", "PROBES", "WORLDS"]

WORLDS = (2, 4)  # the hidden tests' numbers of ranks


def reference_split_qkv(weight: torch.Tensor, rank: int, world: int, heads: int, kv_heads: int) -> torch.Tensor:
    """Rank ``rank``'s rows of the fused ``[W_q; W_k; W_v]`` (:func:`tinytf.shard_qkv`)."""
    from tinytf.parallel import shard_qkv

    return shard_qkv(weight, rank, world, heads, kv_heads)


def reference_row_parallel(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, comm: Any) -> torch.Tensor:
    """``x [..., in/P] @ weight [out, in/P]ᵀ``, all-reduced over the ranks, then ``+ bias`` once."""
    return comm.all_reduce(F.linear(x, weight)) + bias


def reference_merge_block(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                          v: torch.Tensor, q_start: int, k_start: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One causal K/V block folded into the running ``(m, l, acc)`` (:func:`tinytf.online_softmax_update`),
    the mask on global positions ``q_start + i >= k_start + j``."""
    from tinytf.tiled import online_softmax_update

    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    pos_q = torch.arange(q.size(-2), device=q.device)[:, None] + q_start
    pos_k = torch.arange(k.size(-2), device=q.device)[None, :] + k_start
    return online_softmax_update(m, l, acc, scores.masked_fill(pos_k > pos_q, float("-inf")), v)


def reference_seq_to_heads(x: torch.Tensor, comm: Any) -> torch.Tensor:
    """``[B, H, n, d]`` (this rank's positions) -> ``[B, H/P, P·n, d]``: one all-to-all (:func:`tinytf.ulysses.seq_to_heads`)."""
    from tinytf.ulysses import seq_to_heads

    return seq_to_heads(x, comm)


def _head_group(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, world: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(right, swapped)`` for rank ``rank``: causal attention of its head group over every position ``[B, H/P, T, d]``,
    and what an all-to-all that lays the received blocks along the heads gives: each rank's block of positions
    attending only to itself, ``[B, P·H/P, T/P, d]`` (source rank outer, head inner)."""
    h, n = q.size(1) // world, q.size(-2) // world
    group = [z[:, rank * h:(rank + 1) * h] for z in (q, k, v)]
    right = F.scaled_dot_product_attention(*group, is_causal=True)
    swapped = torch.cat([F.scaled_dot_product_attention(*(z[..., i * n:(i + 1) * n, :] for z in group), is_causal=True)
                         for i in range(world)], dim=1)
    return right, swapped


def _ulysses_problem(outs: list[Any], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, where: str) -> Finding | None:
    """The finding for rank outputs of the Ulysses job: ``None`` when every rank holds its head group's causal attention."""
    world = len(outs)
    for r, got in enumerate(outs):
        right, swapped = _head_group(q, k, v, world, r)
        if isinstance(got, torch.Tensor) and got.shape == right.shape and torch.allclose(got.float(), right, atol=1e-5):
            continue
        if isinstance(got, torch.Tensor) and got.shape == swapped.shape and torch.allclose(got.float(), swapped, atol=1e-5):
            return found(Pitfall.ULYSSES_AXES_SWAPPED, _("the received chunks were laid along the heads"),
                         _("rank {r} returned {shape} instead of [B, H/P, T, d] = {want}: every block of positions attended only to "
                           "itself, the blocks side by side as if they were heads.").format(r=r, shape=list(got.shape),
                                                                                          want=list(right.shape)), where=where)
        first, last = r * q.size(1) // world, (r + 1) * q.size(1) // world - 1
        if isinstance(got, torch.Tensor) and got.shape == right.shape:  # the shape is right: say what differs, not the shapes
            return Finding(Pitfall.GENERAL, _("not this rank's head group over every position"),
                           _("{where}: rank {r} returned the right shape {shape}, but not causal attention of heads {first}…{last} "
                             "over all {t} positions in order: {pattern}.").format(
                               where=where, r=r, shape=list(got.shape), first=first, last=last, t=q.size(-2),
                               pattern=difference_pattern(got.float(), right, ("B", "H/P", "T", "d"))))
        shape = list(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        return Finding(Pitfall.GENERAL, _("not this rank's head group over every position"),
                       _("{where}: rank {r} returned {shape}; expected {want}, causal attention of heads {first}…{last} over all "
                         "{t} positions in order.").format(where=where, r=r, shape=shape, want=list(right.shape),
                                                           first=first, last=last, t=q.size(-2)))
    return None


def _per_world(value: Any, what: str) -> dict[str, list]:
    assert isinstance(value, dict) and all(f"P{p}" in value for p in WORLDS), _("{what}: expected results for P = {WORLDS}").format(
        what=what, WORLDS=WORLDS)
    for p in WORLDS:
        assert isinstance(value[f"P{p}"], list) and len(value[f"P{p}"]) == p, _("{what}: expected {p} ranks' results for P = {p}").format(
            what=what, p=p)
    return value


def _named(findings: list[Finding], where: str) -> None:
    """Fail with the named pitfall (or the general finding) a :mod:`tinytf.checks.parallel` diagnosis gave."""
    if findings:
        f = findings[0]
        name = f.pitfall.label() if f.pitfall is not Pitfall.GENERAL else f.title
        raise AssertionError(f"{where}: {name} — {f.message}")


# ---- judges ---------------------------------------------------------------------------------------


@judge("ex11_split")
def _judge_split(value: Any, weight: torch.Tensor, heads: int, kv_heads: int) -> None:
    (weight,) = float_inputs(weight)
    value = _per_world(value, "split_qkv")
    for p in WORLDS:
        for r, got in enumerate(value[f"P{p}"]):
            want = reference_split_qkv(weight, r, p, int(heads), int(kv_heads))
            call = f"split_qkv(weight {list(weight.shape)}, rank={r}, world={p}, heads={heads}, kv_heads={kv_heads})"
            got = tensor(got, want.shape, call)
            if torch.equal(got, weight.chunk(p)[r]) and not torch.equal(got, want):
                raise AssertionError(_("{call} is rows {value}…{value2} of the fused [W_q; W_k; W_v] — "
                                       "{Pitfall_QKV_SPLIT_ONE_PIECE_label}: take rank {r}'s heads from each of W_q, W_k and W_v").format(
                                           call=call, value=r * weight.size(0) // p, value2=(r + 1) * weight.size(0) // p - 1,
                                           Pitfall_QKV_SPLIT_ONE_PIECE_label=Pitfall.QKV_SPLIT_ONE_PIECE.label(), r=r))
            d = weight.size(0) // (int(heads) + 2 * int(kv_heads))
            assert torch.equal(got, want), (_("{call} holds {mine}; rank {r}'s rows are {want}").format(
                call=call, r=r, mine=qkv_rows(slice_map(got, weight, 0), int(heads), int(kv_heads), d),
                want=qkv_rows(slice_map(want, weight, 0), int(heads), int(kv_heads), d)))


@judge("ex11_row")
def _judge_row(value: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> None:
    from tinytf.checks import diagnose_row_parallel

    x, weight, bias = float_inputs(x, weight, bias)
    value = _per_world(value, "row_parallel")
    reference = F.linear(x, weight, bias)
    for p in WORLDS:
        outs = [tensor(o, reference.shape, _("row_parallel on rank {r} of P={p}").format(r=r, p=p)) for r, o in enumerate(value[f"P{p}"])]
        _named(diagnose_row_parallel(outs, reference, bias), _("row_parallel on P={p} ranks (x {x_shape}, weight {weight_shape})").format(
            p=p, x_shape=list(x.shape), weight_shape=list(weight.shape)))


@judge("ex11_ring")
def _judge_ring(value: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    from tinytf.checks import diagnose_ring_attention
    from tinytf.ring import contiguous_layout

    q, k, v = float_inputs(q, k, v)
    value = _per_world(value, "merge_block")
    for p in WORLDS:
        n = q.size(-2) // p
        outs = [tensor(o, (*q.shape[:-2], n, v.size(-1)), _("ring attention on rank {r} of P={p}").format(r=r, p=p))
                for r, o in enumerate(value[f"P{p}"])]
        _named(diagnose_ring_attention(outs, q, k, v, contiguous_layout(q.size(-2), p)),
               _("causal ring attention with your merge_block on P={p} ranks (q {q_shape})").format(p=p, q_shape=list(q.shape)))


@judge("ex11_ulysses")
def _judge_ulysses(value: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    q, k, v = float_inputs(q, k, v)
    value = _per_world(value, "seq_to_heads")
    for p in WORLDS:
        where = _("causal attention after your seq_to_heads on P={p} ranks (q {q_shape})").format(p=p, q_shape=list(q.shape))
        problem = _ulysses_problem(value[f"P{p}"], q, k, v, where)
        if problem is not None:
            name = problem.pitfall.label() if problem.pitfall is not Pitfall.GENERAL else problem.title
            raise AssertionError(f"{name} — {problem.message}")


# ---- probes: the judges' inputs, drawn afresh (by the hidden tests and by the self-check) ---------


def _size(gen: torch.Generator, lo: int, hi: int) -> int:
    return int(torch.randint(lo, hi, (), generator=gen))


def _probe_split(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    kv_heads = 4  # divisible by P = 2 and 4; heads = 8 or 12 makes it grouped-query (the K/V rows are fewer): on every draw
    heads = kv_heads * _size(gen, 2, 4)
    weight = torch.randn((heads + 2 * kv_heads) * _size(gen, 1, 4), _size(gen, 2, 7), generator=gen)
    fn = ns["split_qkv"]
    value = {f"P{p}": [fn(weight.clone(), r, p, heads, kv_heads) for r in range(p)] for p in WORLDS}
    return value, {"weight": weight, "heads": heads, "kv_heads": kv_heads}


def _probe_row(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    x = torch.randn(_size(gen, 1, 3), _size(gen, 2, 6), 4 * _size(gen, 1, 4), generator=gen)  # [B, T, in], in % 4 == 0
    weight = torch.randn(_size(gen, 2, 9), x.size(-1), generator=gen)
    bias = torch.randn(weight.size(0), generator=gen) + 1.0  # far from 0: a bias added P times shows
    value = {f"P{p}": on_threads("row", ns["row_parallel"], p, x, weight, bias) for p in WORLDS}
    return value, {"x": x, "weight": weight, "bias": bias}


def _probe_ring(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    b, h, t, d = _size(gen, 1, 3), _size(gen, 1, 3), 4 * _size(gen, 1, 4), _size(gen, 2, 7)
    q, k, v = (torch.randn(b, h, t, d, generator=gen) for _ in range(3))
    value = {f"P{p}": on_threads("ring", ns["merge_block"], p, q, k, v) for p in WORLDS}
    return value, {"q": q, "k": k, "v": v}


def _probe_ulysses(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    # on every draw, for P = 2 and 4: H / P >= 2 heads per rank (a round-robin deal differs from contiguous groups), n = T / P
    # >= 4 positions per rank and divisible by P (positions interleaved or split again show)
    b, h, t, d = _size(gen, 1, 3), 8 * _size(gen, 1, 3), 16 * _size(gen, 1, 3), _size(gen, 2, 6)
    q, k, v = (torch.randn(b, h, t, d, generator=gen) for _ in range(3))
    value = {f"P{p}": on_threads("ulysses", ns["seq_to_heads"], p, q, k, v) for p in WORLDS}
    return value, {"q": q, "k": k, "v": v}


PROBES: dict[str, Probe] = {"ex11_split": _probe_split, "ex11_row": _probe_row, "ex11_ring": _probe_ring,
                            "ex11_ulysses": _probe_ulysses}


# ---- self-check diagnosis -------------------------------------------------------------------------


def _diagnose_row(fn: Any) -> list[Finding]:
    from tinytf.checks import diagnose_row_parallel

    gen = torch.Generator().manual_seed(11)
    x, weight, bias = torch.randn(2, 3, 8, generator=gen), torch.randn(5, 8, generator=gen), torch.randn(5, generator=gen) + 1.0
    outs, err = call_student("row_parallel", on_threads, "row", fn, 2, x, weight, bias)
    if err is not None:
        return [err]
    return diagnose_row_parallel(outs, F.linear(x, weight, bias), bias)


def _diagnose_ring(fn: Any) -> list[Finding]:
    from tinytf.checks import diagnose_ring_attention
    from tinytf.ring import contiguous_layout

    gen = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(1, 2, 8, 4, generator=gen) for _ in range(3))
    outs, err = call_student("merge_block", on_threads, "ring", fn, 2, q, k, v)
    if err is not None:
        return [err]
    return diagnose_ring_attention(outs, q, k, v, contiguous_layout(8, 2))


def _diagnose_ulysses(fn: Any) -> list[Finding]:
    gen = torch.Generator().manual_seed(13)
    q, k, v = (torch.randn(1, 4, 8, 3, generator=gen) for _ in range(3))
    outs, err = call_student("seq_to_heads", on_threads, "ulysses", fn, 2, q, k, v)
    if err is not None:
        return [err]
    problem = _ulysses_problem(outs, q, k, v, _("on 2 simulated ranks, q {shape}").format(shape=list(q.shape)))
    return [] if problem is None else [problem]


def diagnose_tasks(namespace: dict[str, Any], only: Iterable[str] | None = None) -> dict[str, list[Finding]]:
    """``{grade_id: findings}`` about the student's ex11 code in ``namespace``: the named checks of :mod:`tinytf.checks.parallel`,
    the task's mutants (:mod:`.mutants.ex11`), then the judges on fresh inputs for every task without a finding. Never raises."""
    from tinytf.checks import diagnose_qkv_split

    return explained(namespace, PROBES, {
        "ex11_split": lambda: check_parts(namespace, [("split_qkv", lambda fn: stub_or("split_qkv", diagnose_qkv_split(fn)))]),
        "ex11_row": lambda: check_parts(namespace, [("row_parallel", _diagnose_row)]),
        "ex11_ring": lambda: check_parts(namespace, [("merge_block", _diagnose_ring)]),
        "ex11_ulysses": lambda: check_parts(namespace, [("seq_to_heads", _diagnose_ulysses)])}, only=only)


def diagnose(namespace: dict[str, Any]) -> list[Finding]:
    """Findings about the student's ex11 code in ``namespace`` (empty when all looks right); see :func:`diagnose_tasks`."""
    return flat(diagnose_tasks(namespace))
