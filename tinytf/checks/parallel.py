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
from .findings import Finding, difference_pattern, found, slice_map, tensor_relation
from .probe import crash_finding, quietly

__all__ = ["diagnose_qkv_split", "diagnose_row_parallel", "diagnose_replicated", "diagnose_ring_attention", "qkv_rows"]

_PROBES = ((2, 4, 4, 3), (2, 4, 2, 2), (4, 8, 4, 2), (4, 4, 4, 1))  # (world, heads, kv_heads, d_head): P = 2 and 4, GQA


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> bool:
    return a.shape == b.shape and torch.allclose(a.float(), b.float(), rtol=tol, atol=tol)


def qkv_rows(rows: Sequence[int | None], heads: int, kv_heads: int, d: int) -> str:
    """Rows of a fused ``[W_q; W_k; W_v]`` (``d`` rows per head) in words, in the order given: "W_q of heads 2–3, W_k of
    K/V head 1, W_v of K/V head 1"; a run that covers no whole heads is named by its row numbers; a row of no weight,
    "another row"."""
    parts = (("W_q", 0, heads), ("W_k", heads * d, kv_heads), ("W_v", (heads + kv_heads) * d, kv_heads))

    def part_of(r: int) -> int:
        return next(i for i, (_name, start, n) in enumerate(parts) if start <= r < start + n * d)

    runs: list[list[int]] = []
    for r in rows:
        if r is None or not 0 <= r < (heads + 2 * kv_heads) * d:
            runs.append([-1])
        elif runs and runs[-1][-1] == r - 1 and runs[-1][-1] >= 0 and part_of(runs[-1][-1]) == part_of(r):
            runs[-1].append(r)
        else:
            runs.append([r])
    said = []
    for run in runs:
        if run == [-1]:
            said.append(_("a row of no weight"))
            continue
        name, start, _n = parts[part_of(run[0])]
        first, last = run[0] - start, run[-1] - start
        if first % d == 0 and (last + 1) % d == 0:
            h0, h1 = first // d, (last + 1) // d - 1
            if name == "W_q":
                said.append(_("W_q of heads {h0}–{h1}").format(h0=h0, h1=h1) if h1 > h0 else _("W_q of head {h0}").format(h0=h0))
            else:
                said.append(_("{name} of K/V heads {h0}–{h1}").format(name=name, h0=h0, h1=h1) if h1 > h0
                            else _("{name} of K/V head {h0}").format(name=name, h0=h0))
        else:
            said.append(_("{name} rows {r0}–{r1}").format(name=name, r0=run[0], r1=run[-1]) if len(run) > 1
                        else _("{name} row {r0}").format(name=name, r0=run[0]))
    return _(", ").join(said)


def _labelled(rows: int, cols: int) -> torch.Tensor:
    """A weight whose row ``i`` holds ``i`` (plus a per-column offset): the rows a split returns name themselves."""
    return torch.arange(rows, dtype=torch.float32)[:, None] + torch.linspace(0, 0.5, cols)[None, :]


@quietly
def diagnose_qkv_split(fn: Callable[..., torch.Tensor]) -> list[Finding]:
    """Diagnose ``fn(weight [(H + 2·kv)·d, D], rank, world, heads, kv_heads) -> rank's rows`` on P = 2 and 4,
    with and without grouped-query heads. Names ``QKV_SPLIT_ONE_PIECE`` when it returns ``weight.chunk(P)[rank]``;
    otherwise says which rows each wrong rank got, and which it should get."""
    for world, heads, kv, d in _PROBES:
        w = _labelled((heads + 2 * kv) * d, 6)
        wrong = []
        for rank in range(world):
            try:
                got = fn(w.clone(), rank, world, heads, kv)
            except Exception as exc:  # noqa: BLE001 - student code may raise anything
                where = _("for rank {rank} of P={world}, heads={heads}, kv_heads={kv}, d_head={d}").format(
                    rank=rank, world=world, heads=heads, kv=kv, d=d)
                return [crash_finding(_("the split {where}").format(where=where), exc)]
            right = shard_qkv(w, rank, world, heads, kv)
            if not (isinstance(got, torch.Tensor) and _close(got, right, 0)):
                wrong.append((rank, got, right))
        if not wrong:
            continue
        where = _("for P={world}, heads={heads}, kv_heads={kv}, d_head={d} (weight {w_shape})").format(
            world=world, heads=heads, kv=kv, d=d, w_shape=list(w.shape))
        if all(isinstance(g, torch.Tensor) and _close(g, w.chunk(world)[r], 0) for r, g, _right in wrong):
            rank = wrong[0][0]
            return [found(Pitfall.QKV_SPLIT_ONE_PIECE, _("the fused QKV weight was cut in one piece"),
                          _("rank {rank} got rows {first}…{last} of [W_q; W_k; W_v] ({rows}): the Q rows of some heads and the K rows "
                            "of others.").format(rank=rank, first=rank * w.size(0) // world, last=(rank + 1) * w.size(0) // world - 1,
                                                 rows=qkv_rows(range(rank * w.size(0) // world, (rank + 1) * w.size(0) // world),
                                                               heads, kv, d)),
                          where=_("Seen {where}.").format(where=where))]
        said = []
        for rank, got, right in wrong:
            mine = (qkv_rows(slice_map(got, w, 0), heads, kv, d) if isinstance(got, torch.Tensor) and got.dim() == 2
                    else (list(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__))
            said.append(_("rank {rank} got {mine} ({shape}), should get {want} ({right_shape})").format(
                rank=rank, mine=mine, shape=list(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__,
                want=qkv_rows(slice_map(right, w, 0), heads, kv, d), right_shape=list(right.shape)))
        return [Finding(Pitfall.GENERAL, _("not rank r's rows of W_q, W_k and W_v"),
                        _("{where}: {said}.").format(where=where, said="; ".join(said)))]
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
    if agree:
        base = reference - (0 if bias is None else bias)
        how = tensor_relation(outputs[0] - (0 if bias is None else bias), base)
        if how:
            return [found(Pitfall.GENERAL, _("the row-parallel sum is scaled"),
                          _("every rank holds the same output, and without the bias it is {how} (P = {world}): the all-reduced "
                            "sum itself is off by that factor.").format(how=how, world=world),
                          fix=_("use the all-reduced sum as it is: comm.all_reduce(x @ weight.T) + bias, with no factor"))]
        if bias is not None and _close(outputs[0], base):
            return [found(Pitfall.GENERAL, _("the row-parallel bias is missing"),
                          _("every rank holds the single-process output without its bias."),
                          fix=_("add the bias once, after the all-reduce"))]
    worst = max((o - reference).abs().max().item() for o in outputs)
    pattern = difference_pattern(outputs[bad[0]], reference)
    return [Finding(Pitfall.GENERAL, _("the tensor-parallel output is wrong"),
                    _("ranks {bad} differ from the single-process output (max |difference| {worst:.2e}{pattern}); the ranks {agree}, "
                      "and neither a partial sum, extra biases nor a factor explains it.").format(
                        bad=bad, worst=worst, pattern=f"; {pattern}" if pattern else "",
                        agree=_("agree with each other") if agree else _("differ from each other")))]


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


def _offset_mask(t: int, offset: int) -> torch.Tensor:
    """``[T, T]``: key j is seen by query i iff j <= i + offset (offset 0: the causal mask)."""
    i = torch.arange(t)[:, None]
    return torch.arange(t)[None, :] <= i + offset


def diagnose_ring_attention(outputs: Sequence[torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            layout: Layout) -> list[Finding]:
    """``outputs[r]``: rank ``r``'s causal ring-attention rows (positions ``layout[r]``) for the full ``q, k, v``
    ``[B, H, T, d]``. Names ``RING_LOCAL_OFFSET`` when they equal attention with each block's positions from 0,
    ``CAUSAL_OFF_BY_ONE`` when the mask sits one diagonal off (each query misses its own key, or sees the next one);
    otherwise it says where the rows differ, and gives no fix that belongs to another mistake."""
    got = unshard_sequence(list(outputs), layout)
    right = scaled_dot_product_attention(q, k, v, is_causal=True)
    if _close(got, right):
        return []
    t = q.size(-2)
    local = scaled_dot_product_attention(q, k, v, _local_offset_mask(layout, t).to(q.device))
    if _close(got, local):
        return [found(Pitfall.RING_LOCAL_OFFSET, _("the causal mask uses local positions"),
                      _("the outputs equal attention in which every K/V block's keys (and every rank's queries) start at "
                      "position 0: blocks from the future are seen, blocks from the past are half hidden."))]
    rows = ~torch.isnan(got).any(dim=-1)  # [B, H, T]: a query that saw nothing in its first block comes out NaN
    for offset in (-1, 1):
        shifted = scaled_dot_product_attention(q, k, v, _offset_mask(t, offset).to(q.device)).nan_to_num(0.0)
        if _close(got, shifted, 1e-4) or (offset < 0 and int((~rows).sum()) <= rows.numel() // t * len(layout)
                                          and _close(got[rows], shifted[rows], 1e-4)):
            said = (_("the causal mask sits one diagonal too low: query i sees keys 0 … i - 1, never its own key (a query left "
                      "with nothing in its first block comes out NaN)") if offset < 0 else
                    _("the causal mask sits one diagonal too high: query i also sees key i + 1, the next position"))
            return [found(Pitfall.CAUSAL_OFF_BY_ONE, _("the ring's causal mask is on the wrong diagonal"), said + ".",
                          fix=_("block key j for query i exactly when position(j) > position(i): masked_fill(pos_k > pos_q, -inf)"))]
    worst = (got - right).abs().nan_to_num(float("inf")).max().item()
    pattern = difference_pattern(got, right, ("B", "H", "T", "d"))
    return [Finding(Pitfall.GENERAL, _("ring attention differs from full attention"),
                    _("max |ring - full causal attention| = {worst:.2e}{pattern}; neither local positions nor a mask one diagonal "
                      "off explains it.").format(worst=worst, pattern=f"; {pattern}" if pattern else ""))]
