"""Ring attention (context parallelism): the sequence split across ranks, K/V blocks passed around a ring.

Rank ``r`` keeps the queries of its positions. In ``P`` steps every K/V block visits every rank: at
step ``s`` rank ``r`` holds the block of rank ``(r - s) mod P``, folds it into its running statistics
with chapter 10's online softmax (:func:`tinytf.online_softmax_update`, then
:func:`tinytf.online_softmax_finish`), and passes it on. No rank ever holds more than a
``[T/P, T/P]`` tile of scores (per batch and head), and the result is exact.

Under a causal mask the positions must be *global*: query ``i`` of rank ``r`` sees key ``j`` of the
block it holds iff ``position(j) <= position(i)``. With a contiguous split the last rank does ``P``
tiles of work and rank 0 one; the **zig-zag** layout gives rank ``r`` chunks ``r`` and ``2P - 1 - r``
of ``2P`` equal chunks, which evens the work out (layouts: :mod:`tinytf.layouts`, re-exported here).

The backward recomputes each tile's weights from the saved log-sum-exp (as :mod:`tinytf.tiled` does)
and sends each K/V block around the ring once more together with its accumulating gradients dK, dV;
one final hop brings every block's dK, dV home.

**Grouped-query K/V** (chapter 11): ``k``, ``v`` may hold fewer heads than ``q`` (``kv_heads`` dividing
``heads``). The ring then passes the *narrow* blocks ``[B, kv_heads, T/P, d]`` — ``kv_heads / heads`` of
the bytes — and each query head meets its K/V head ``h // (heads / kv_heads)`` on arrival.

**Positions** (chapter 13). RoPE needs nothing here: each rank rotates its q and k at their *global*
positions (:func:`layout_positions`) before the ring, and a rotated key keeps its rotation wherever it
travels. ALiBi's bias ``-m_h·(p_i - p_j)`` is added inside every tile from the global positions of its rows
and columns (``slopes``), and a sliding ``window`` is part of each tile's mask; a tile that the causal mask
or the window leaves empty is skipped.

**Overlap** (``overlap=True``): a double buffer. At each step the rank posts the next exchange
(:meth:`tinytf.collectives.Comm.post_exchange`: send the block it holds, receive into the spare buffer),
folds in the block it holds *while* the transfer runs, and only then waits. The buffer just sent
becomes the spare of the next step; the rank's own ``k``, ``v`` (kept for the backward) are never
received into. The result is the same to the bit as the blocking ring's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

from .alibi import alibi_bias, allowed_keys, check_alibi
from .attention import check_qkv
from .collectives import Comm
from .config import check_kv_heads
from .layouts import (
    Layout,
    causal_scores,
    contiguous_layout,
    layout_positions,
    local_ranges,
    shard_sequence,
    unshard_sequence,
    zigzag_layout,
)
from .masks import check_causal_window
from .tiled import online_softmax_finish, online_softmax_update
from .translation import gettext as _

__all__ = ["Layout", "RingStats", "contiguous_layout", "zigzag_layout", "shard_sequence", "unshard_sequence", "layout_positions",
           "ring_attention", "causal_scores"]

Tensor = torch.Tensor
NEG_INF = float("-inf")


@dataclass
class RingStats:
    """One rank's work: steps, score tiles computed and skipped (wholly in the future or beyond the window), the score
    elements computed per batch and head (whole tiles, as this ring computes them), the elements among
    them that the causal mask allows (what a finely tiled kernel would compute), and the largest score
    tile ``[rows, cols]`` it held."""

    steps: int = 0
    tiles: int = 0
    skipped: int = 0
    score_elements: int = 0
    allowed_elements: int = 0
    largest_tile: tuple[int, int] = (0, 0)


def _tile_mask(q_range: tuple[int, int], k_range: tuple[int, int], is_causal: bool, window: int | None,
               device) -> Tensor | None | bool:
    """``False`` if no query of the tile may see any of its keys (skip), ``None`` if every query may see every key,
    else ``[tq, tk]`` (True = may attend): key position <= query position, and less than ``window`` behind it."""
    (qa, qb), (ka, kb) = q_range, k_range
    nearest, farthest = qa - (kb - 1), (qb - 1) - ka  # the smallest and the largest query - key distance in the tile
    if not is_causal:
        return None
    if farthest < 0 or (window is not None and nearest >= window):
        return False
    if nearest >= 0 and (window is None or farthest < window):
        return None
    return allowed_keys(torch.arange(qa, qb, device=device), torch.arange(ka, kb, device=device), window=window)


def _tiles(q_chunks, k_chunks, masking: tuple, device, stats: RingStats | None):
    """Every (query chunk, key chunk) pair of one ring step that has something to compute, with its mask and
    its ALiBi bias ``[kv, g, tq, tk]`` (None without ALiBi). ``masking``: ``(is_causal, window, slopes [kv, g])``."""
    is_causal, window, slopes = masking
    for i, (qa, qb, gqa, gqb) in enumerate(local_ranges(q_chunks)):
        for ka, kb, gka, gkb in local_ranges(k_chunks):
            allowed = _tile_mask((gqa, gqb), (gka, gkb), is_causal, window, device)
            if allowed is False:
                if stats is not None:
                    stats.skipped += 1
                continue
            if stats is not None:
                stats.tiles += 1
                stats.score_elements += (qb - qa) * (kb - ka)
                stats.allowed_elements += (qb - qa) * (kb - ka) if allowed is None else int(allowed.sum())
                if (qb - qa) * (kb - ka) > math.prod(stats.largest_tile):
                    stats.largest_tile = (qb - qa, kb - ka)
            bias = None if slopes is None else alibi_bias(slopes.flatten(), torch.arange(gqa, gqb, device=device),
                                                          torch.arange(gka, gkb, device=device)).unflatten(0, slopes.shape)
            yield i, slice(qa, qb), slice(ka, kb), allowed, bias


def _scores(q_i: Tensor, k_j: Tensor, allowed: Tensor | None, bias: Tensor | None) -> Tensor:
    s = q_i @ k_j.transpose(-2, -1)  # [..., tq, d] @ [..., d, tk]: q_i is already scaled
    s = s if bias is None else s + bias.to(s.dtype)  # ALiBi: -m_h · (global query position - global key position)
    return s if allowed is None else s.masked_fill(~allowed, NEG_INF)


def _by_group(t: Tensor, kv_heads: int) -> Tensor:
    """``[B, H, T, x] -> [B, kv, H/kv, T, x]``: query heads grouped under the K/V head they read."""
    return t.unflatten(-3, (kv_heads, t.size(-3) // kv_heads))


def _spare(held: list[Tensor], first: bool) -> list[Tensor] | None:
    """After a step, the buffer just sent may receive the step after next — unless it is the rank's own
    ``k``, ``v`` (autograd keeps them for the backward)."""
    return None if first else held


def _forward(q, k, v, masking, scale, layout, comm, stats, overlap):
    """The ring forward: P steps of (fold the K/V block held, pass it on); returns out, lse."""
    rank, world, kv = comm.rank, comm.world, k.size(-3)
    qs = _by_group(q * scale, kv)  # [B, kv, g, Tl, d]
    q_ranges = local_ranges(layout[rank])
    state = [(qs.new_full((*qs.shape[:-2], b - a, 1), NEG_INF), qs.new_zeros((*qs.shape[:-2], b - a, 1)),
              qs.new_zeros((*qs.shape[:-2], b - a, v.size(-1)))) for a, b, _, _ in q_ranges]
    held, spare = [k, v], None
    for step in range(world):
        last, src = step == world - 1, (rank - step) % world
        pending = None
        if overlap and not last:  # the next block travels while this one is folded in
            spare = spare or [torch.empty_like(t, memory_format=torch.contiguous_format) for t in (k, v)]
            pending = comm.post_exchange(held, spare)
        k_j, v_j = (t.unsqueeze(-3) for t in held)  # [B, kv, 1, Tl, d]: shared by the g query heads
        for i, rows, cols, allowed, bias in _tiles(layout[rank], layout[src], masking, q.device, stats):
            s = _scores(qs[..., rows, :], k_j[..., cols, :], allowed, bias)
            state[i] = online_softmax_update(*state[i], s, v_j[..., cols, :])
        if stats is not None:
            stats.steps += 1
        if not last:
            arrived = pending.wait() if pending else comm.exchange(held)
            spare, held = _spare(held, step == 0), arrived
    outs, lses = zip(*(online_softmax_finish(*s) for s in state))
    return torch.cat(outs, dim=-2).flatten(-4, -3), torch.cat(lses, dim=-1).flatten(-3, -2)


def _backward(q, k, v, out, lse, d_out, masking, scale, layout, comm, overlap):
    """Recompute each tile's weights from lse; dK, dV travel with their block and come home at the end."""
    rank, world, kv = comm.rank, comm.world, k.size(-3)
    qs, d_out, out = _by_group(q * scale, kv), _by_group(d_out, kv), _by_group(out, kv)  # [B, kv, g, Tl, ·]
    delta = (d_out * out).sum(-1, keepdim=True)  # D = rowsum(dO ∘ O) [..., Tl, 1]
    lse = _by_group(lse.unsqueeze(-1), kv)
    lse = lse.masked_fill(lse == NEG_INF, float("inf"))  # rows that saw nothing: P = 0
    d_q, d_k, d_v = torch.zeros_like(qs), torch.zeros_like(k), torch.zeros_like(v)
    spare = None
    for step in range(world):
        last, src = step == world - 1, (rank - step) % world
        pending = None
        if overlap and not last:  # K, V of the next step travel meanwhile; dK, dV only once this step added to them
            spare = spare or [torch.empty_like(t, memory_format=torch.contiguous_format) for t in (k, v)]
            pending = comm.post_exchange([k, v], spare, "backward")
        k_j, v_j = k.unsqueeze(-3), v.unsqueeze(-3)
        for _i, rows, cols, allowed, bias in _tiles(layout[rank], layout[src], masking, q.device, None):
            p = (_scores(qs[..., rows, :], k_j[..., cols, :], allowed, bias) - lse[..., rows, :]).exp()  # [B, kv, g, tq, tk]
            d_v[..., cols, :] += (p.transpose(-2, -1) @ d_out[..., rows, :]).sum(-3)  # summed over the group's query heads
            d_s = p * (d_out[..., rows, :] @ v_j[..., cols, :].transpose(-2, -1) - delta[..., rows, :])
            d_q[..., rows, :] += d_s @ k_j[..., cols, :]
            d_k[..., cols, :] += (d_s.transpose(-2, -1) @ qs[..., rows, :]).sum(-3)
        if last:
            if world > 1:
                d_k, d_v = comm.exchange([d_k, d_v], "backward")  # the last hop: home to the block's owner
        elif pending:
            arrived = pending.wait()
            d_k, d_v = comm.exchange([d_k, d_v], "backward")
            spare, (k, v) = _spare([k, v], step == 0), arrived
        else:
            k, v, d_k, d_v = comm.exchange([k, v, d_k, d_v], "backward")
    return (d_q * scale).flatten(-4, -3), d_k, d_v


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, masking, scale, layout, comm, stats, overlap):
        out, lse = _forward(q, k, v, masking, scale, layout, comm, stats, overlap)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.config = (masking, scale, layout, comm, overlap)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        d_q, d_k, d_v = _backward(q, k, v, out, lse, d_out.contiguous(), *ctx.config)
        return d_q, d_k, d_v, None, None, None, None, None, None


def ring_attention(q: Tensor, k: Tensor, v: Tensor, *, layout: Layout, comm: Comm, is_causal: bool = False,
                   scale: float | None = None, stats: RingStats | None = None, overlap: bool = False,
                   slopes: Tensor | None = None, window: int | None = None) -> Tensor:
    """Attention of this rank's queries over the whole sequence, K/V blocks passed around the ring.

    Args:
        q: this rank's queries ``[B, H, T_local, d]`` (the positions ``layout[rank]``, in order; with RoPE already
            rotated at those global positions, :func:`layout_positions`, as k too).
        k, v: this rank's keys and values ``[B, kv_heads, T_local, d]``; ``kv_heads`` divides ``H``
            (grouped-query: the ring then sends the narrow blocks).
        layout: every rank's global positions (:func:`contiguous_layout`, :func:`zigzag_layout`).
        comm: the ring (:class:`tinytf.collectives.Comm`); its traffic counts the bytes sent.
        is_causal: query at global position ``p`` sees keys at positions ``<= p``.
        stats: a :class:`RingStats` to fill with this rank's work.
        overlap: post each step's transfer before computing with the block held (a double buffer),
            and wait for it after; the same result as the blocking ring.
        slopes: ALiBi's slope of every query head ``[H]`` (:func:`tinytf.alibi_slopes`; causal only): each score
            gets ``-m_h · (p_i - p_j)`` from the global positions of query and key.
        window: sliding-window attention (causal only): query at ``p`` sees keys ``p - window + 1 … p``.

    Returns:
        ``out [B, H, T_local, d]``: the rows of full attention at this rank's positions. Differentiable.
    """
    _check_heads(q, k, v)
    if len(layout) != comm.world:
        raise ValueError(_("layout has {n} ranks but the group has P={world}: make the layout for P={world}").format(
            n=len(layout), world=comm.world))
    sizes = [sum(b - a for a, b in chunks) for chunks in layout]
    if len(set(sizes)) != 1:
        raise ValueError(_("every rank must hold as many positions (the K/V blocks travel in one shape), got {sizes}: cut T into P "
                           "equal parts").format(sizes=sizes))
    held = sizes[comm.rank]
    if q.size(-2) != held or k.size(-2) != held:
        raise ValueError(_(
            "rank {rank}: q {q} and k {k} must hold the {held} positions of layout[{rank}] = {chunks}; cut them with "
            "shard_sequence(x, layout[rank])").format(rank=comm.rank, q=list(q.shape), k=list(k.shape), held=held,
                                                      chunks=layout[comm.rank])
        )
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    check_alibi(slopes, q.size(1), is_causal, "ring_attention")
    masking = (is_causal, check_causal_window(window, is_causal), None if slopes is None else slopes.reshape(k.size(1), -1))  # [kv, g]
    return _RingAttention.apply(q, k, v, masking, scale, layout, comm, stats, overlap)


def _check_heads(q: Tensor, k: Tensor, v: Tensor) -> None:
    """q ``[B, H, T, d]``, k and v ``[B, kv_heads, T, d]`` with ``kv_heads`` dividing ``H``."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(_("ring attention takes [B, H, T_local, d] blocks, got q {q}, k {k}, v {v}: give each rank its block of "
                           "all four dimensions").format(q=list(q.shape), k=list(k.shape), v=list(v.shape)))
    check_kv_heads(q.size(1), k.size(1))
    check_qkv(q[:, : k.size(1)], k, v)

