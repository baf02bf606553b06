"""Diagnoses for chapter 12's pitfalls: attention split across processes.

Each works on what a multi-process job hands back (every rank's result, gathered in one process), or on a
function it can call for simulated ranks in one process:

* ``diagnose_qkv_split(fn)``: is ``fn(weight, rank, world, heads, kv_heads)`` the per-Q/K/V, per-head split
  of a fused ``qkv`` weight (:func:`tinytf.shard_qkv`), or one plain slice of it?
* ``diagnose_row_parallel(outputs, reference, bias)``: every rank's output of a row-parallel layer against
  the single-process one: a partial sum (the all-reduce forgotten) or ``P`` biases (added before it)?
* ``diagnose_replicated(tensors)``: a tensor every rank should hold identically (after dropout on the
  residual branch) that differs between ranks — unsynchronised RNG.
* ``diagnose_ring_attention(outputs, q, k, v, layout)``: ring attention's per-rank outputs against full
  causal attention, and against the same with each block's positions counted from 0 (local offsets).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..attention import scaled_dot_product_attention
from ..parallel import shard_qkv
from ..ring import Layout, unshard_sequence
from ..translation import N_
from ..translation import gettext as _
from .catalog import Pitfall
from .findings import Finding, found
from .probe import crash_finding, quietly

__all__ = ["diagnose_qkv_split", "diagnose_row_parallel", "diagnose_replicated", "diagnose_ring_attention"]

_PROBES = ((2, 4, 4, 3), (2, 4, 2, 2), (4, 8, 4, 2), (4, 4, 4, 1))  # (world, heads, kv_heads, d_head): P = 2 and 4, GQA


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> bool:
    return a.shape == b.shape and torch.allclose(a.float(), b.float(), rtol=tol, atol=tol)


@quietly
def diagnose_qkv_split(fn: Callable[..., torch.Tensor]) -> list[Finding]:
    """Diagnose ``fn(weight [(H + 2·kv)·d, D], rank, world, heads, kv_heads) -> rank's rows`` on P = 2 and 4,
    with and without grouped-query heads. Names ``QKV_SPLIT_ONE_PIECE`` when it returns ``weight.chunk(P)[rank]``."""
    for world, heads, kv, d in _PROBES:
        w = torch.randn((heads + 2 * kv) * d, 6)
        for rank in range(world):
            where = (_("for rank {rank} of P={world}, heads={heads}, kv_heads={kv}, d_head={d} (weight {w_shape})")
                .format(rank=rank, world=world, heads=heads, kv=kv, d=d, w_shape=list(w.shape)))
            try:
                got = fn(w, rank, world, heads, kv)
            except Exception as exc:  # noqa: BLE001 - student code may raise anything
                return [crash_finding(_("the split {where}").format(where=where), exc)]
            right = shard_qkv(w, rank, world, heads, kv)
            if isinstance(got, torch.Tensor) and _close(got, right, 0):
                continue
            if isinstance(got, torch.Tensor) and _close(got, w.chunk(world)[rank], 0):
                return [found(Pitfall.QKV_SPLIT_ONE_PIECE, _("the fused QKV weight was cut in one piece"),
                              _("rank {rank} got rows {first}…{last} of [W_q; W_k; W_v]: the Q rows of some heads and the K rows of "
                                "others.").format(rank=rank, first=rank * w.size(0) // world, last=(rank + 1) * w.size(0) // world - 1),
                              where=_("Seen {where}.").format(where=where))]
            shape = list(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            return [Finding(Pitfall.GENERAL, _("not rank r's rows of W_q, W_k and W_v"),
                            _("{where}: got {shape}, expected {right_shape}: the W_q rows of heads {value}…{value2}, then the W_k and "
                              "W_v rows of K/V heads {value3}…{value4}.")
                                  .format(where=where, shape=shape, right_shape=list(right.shape), value=rank * heads // world,
                                      value2=(rank + 1) * heads // world - 1, value3=rank * kv // world,
                                      value4=(rank + 1) * kv // world - 1))]
    return []


def diagnose_row_parallel(outputs: Sequence[torch.Tensor], reference: torch.Tensor,
                          bias: torch.Tensor | None = None) -> list[Finding]:
    """Every rank's output of a row-parallel layer (``outputs[r]``) against the single-process ``reference``.

    Names ``FORGOTTEN_ALL_REDUCE`` when the ranks differ and their sum (less the extra biases) is the reference,
    ``BIAS_BEFORE_ALL_REDUCE`` when every rank holds ``reference + (P - 1) · bias``."""
    world = len(outputs)
    bad = [r for r, o in enumerate(outputs) if not _close(o, reference)]
    if not bad:
        return []
    extra = 0 if bias is None else (world - 1) * bias
    agree = all(_close(o, outputs[0]) for o in outputs)
    offsets = (0,) if bias is None else (0, extra, -bias)  # the bias once per rank, P times, or not at all
    if not agree and any(_close(sum(outputs) - e, reference) for e in offsets):
        return [found(Pitfall.FORGOTTEN_ALL_REDUCE, _("each rank holds a partial sum"),
                      _("the {world} ranks' outputs differ, and their sum is the single-process output: the row-parallel layer's "
                        "all-reduce is missing.").format(world=world))]
    if agree and bias is not None and _close(outputs[0] - extra, reference):
        return [found(Pitfall.BIAS_BEFORE_ALL_REDUCE, _("the bias is added {world} times").format(world=world),
                      _("every rank's output is the reference plus (P - 1) = {value} biases: each rank added the bias before the "
                        "all-reduce summed them.").format(value=world - 1))]
    worst = max((o - reference).abs().max().item() for o in outputs)
    return [found(Pitfall.GENERAL, _("the tensor-parallel output is wrong"),
                  _("ranks {bad} differ from the single-process output (max |difference| {worst:.2e}), and neither a partial "
                    "sum nor extra biases explain it.").format(bad=bad, worst=worst),
                  fix=_("check how the weights were split (diagnose_qkv_split)"))]


def diagnose_replicated(tensors: Sequence[torch.Tensor], what: str = N_("the activation")) -> list[Finding]:
    """``tensors[r]``: what rank ``r`` holds of a tensor that every rank should hold identically. Names
    ``DROPOUT_RNG_UNSYNCED`` when they differ."""
    diff = max((t - tensors[0]).abs().max().item() for t in tensors)
    if diff == 0:
        return []
    return [found(Pitfall.DROPOUT_RNG_UNSYNCED, _("replicated activations differ between ranks"),
                  _("{what} should be the same on all {n_tensors} ranks but differs by up to {diff:.2e}: a random operation (dropout on "
                    "the residual branch) drew different numbers on different ranks.")
                        .format(what=_(what), n_tensors=len(tensors), diff=diff))]


def _local_offset_mask(layout: Layout, t: int) -> torch.Tensor:
    """``[T, T]``: what ring attention allows when every block's positions are counted from 0."""
    local = torch.empty(t, dtype=torch.long)
    for chunks in layout:
        o = 0
        for a, b in chunks:
            local[a:b] = torch.arange(o, o + b - a)
            o += b - a
    return local[None, :] <= local[:, None]


def diagnose_ring_attention(outputs: Sequence[torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            layout: Layout) -> list[Finding]:
    """``outputs[r]``: rank ``r``'s causal ring-attention rows (positions ``layout[r]``) for the full ``q, k, v``
    ``[B, H, T, d]``. Names ``RING_LOCAL_OFFSET`` when they equal attention with each block's positions from 0."""
    got = unshard_sequence(list(outputs), layout)
    right = scaled_dot_product_attention(q, k, v, is_causal=True)
    if _close(got, right):
        return []
    local = scaled_dot_product_attention(q, k, v, _local_offset_mask(layout, q.size(-2)).to(q.device))
    if _close(got, local):
        return [found(Pitfall.RING_LOCAL_OFFSET, _("the causal mask uses local positions"),
                      _("the outputs equal attention in which every K/V block's keys (and every rank's queries) start at "
                      "position 0: blocks from the future are seen, blocks from the past are half hidden."))]
    return [found(Pitfall.GENERAL, _("ring attention differs from full attention"),
                  _("max |ring - full causal attention| = {value_abs_max_item:.2e}.")
                  .format(value_abs_max_item=(got - right).abs().max().item()),
                  fix=_("check the online-softmax merge of each arriving block: alpha = exp(m - m_new) on l and acc"))]
