"""Ring attention (context parallelism): the sequence split across ranks, K/V blocks passed around a ring.

Rank ``r`` keeps the queries of its positions. In ``P`` steps every K/V block visits every rank: at
step ``s`` rank ``r`` holds the block of rank ``(r - s) mod P``, folds it into its running statistics
with chapter 10's online softmax (:func:`tinytf.online_softmax_update`, then
:func:`tinytf.online_softmax_finish`), and passes it on. No rank ever holds more than a
``[T/P, T/P]`` tile of scores (per batch and head), and the result is exact.

Under a causal mask the positions must be *global*: query ``i`` of rank ``r`` sees key ``j`` of the
block it holds iff ``position(j) <= position(i)``. With a contiguous split the last rank does ``P``
tiles of work and rank 0 one; the **zig-zag** layout gives rank ``r`` chunks ``r`` and ``2P - 1 - r``
of ``2P`` equal chunks, which evens the work out. A layout is, per rank, its list of ``(start, stop)``
global ranges; a rank's local tensor is those ranges concatenated in order.

The backward recomputes each tile's weights from the saved log-sum-exp (as :mod:`tinytf.tiled` does)
and sends each K/V block around the ring once more together with its accumulating gradients dK, dV;
one final hop brings every block's dK, dV home.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

from .attention import check_qkv
from .collectives import Comm
from .tiled import online_softmax_finish, online_softmax_update

__all__ = ["Layout", "RingStats", "contiguous_layout", "zigzag_layout", "shard_sequence", "unshard_sequence", "ring_attention"]

Tensor = torch.Tensor
Layout = list[list[tuple[int, int]]]  # layout[rank] = [(start, stop), ...] global positions held by that rank
NEG_INF = float("-inf")


@dataclass
class RingStats:
    """One rank's work: steps, score tiles computed and skipped (wholly in the future), the score
    elements computed per batch and head, and the largest score tile ``[rows, cols]`` it held."""

    steps: int = 0
    tiles: int = 0
    skipped: int = 0
    score_elements: int = 0
    largest_tile: tuple[int, int] = (0, 0)


def contiguous_layout(t: int, world: int) -> Layout:
    """Rank ``r`` holds positions ``r·T/P … (r+1)·T/P`` (``T`` divisible by ``P``)."""
    if t % world:
        raise ValueError(f"T={t} does not split into P={world} equal blocks; pad T to a multiple of {world}")
    n = t // world
    return [[(r * n, (r + 1) * n)] for r in range(world)]


def zigzag_layout(t: int, world: int) -> Layout:
    """``2P`` equal chunks; rank ``r`` holds chunks ``r`` and ``2P - 1 - r`` (``T`` divisible by ``2P``)."""
    if t % (2 * world):
        raise ValueError(f"T={t} does not split into 2P={2 * world} equal chunks; pad T to a multiple of {2 * world}")
    n = t // (2 * world)
    return [[(r * n, (r + 1) * n), ((2 * world - 1 - r) * n, (2 * world - r) * n)] for r in range(world)]


def shard_sequence(x: Tensor, chunks: list[tuple[int, int]], dim: int = -2) -> Tensor:
    """The positions ``chunks`` of ``x`` along ``dim``, concatenated (a rank's local block)."""
    return torch.cat([x.narrow(dim, a, b - a) for a, b in chunks], dim=dim)


def unshard_sequence(parts: list[Tensor], layout: Layout, dim: int = -2) -> Tensor:
    """Put every rank's local block back at its global positions: the inverse of :func:`shard_sequence`."""
    pieces = []
    for part, chunks in zip(parts, layout):
        offsets = [0, *torch.tensor([b - a for a, b in chunks]).cumsum(0).tolist()]
        pieces += [(a, part.narrow(dim, o, b - a)) for (a, b), o in zip(chunks, offsets)]
    return torch.cat([p for _, p in sorted(pieces, key=lambda ap: ap[0])], dim=dim)


def _local_ranges(chunks: list[tuple[int, int]]) -> list[tuple[int, int, int, int]]:
    """``(local_start, local_stop, global_start, global_stop)`` of each chunk of a rank's block."""
    out, o = [], 0
    for a, b in chunks:
        out.append((o, o + b - a, a, b))
        o += b - a
    return out


def _tile_mask(q_range: tuple[int, int], k_range: tuple[int, int], is_causal: bool, device) -> Tensor | None | bool:
    """``False`` if the tile is wholly in the future (skip), ``None`` if all allowed, else ``[tq, tk]`` (True = may attend)."""
    (qa, qb), (ka, kb) = q_range, k_range
    if not is_causal or kb - 1 <= qa:
        return None
    if ka > qb - 1:
        return False
    return torch.arange(ka, kb, device=device)[None, :] <= torch.arange(qa, qb, device=device)[:, None]


def _tiles(q_chunks, k_chunks, is_causal: bool, device, stats: RingStats | None):
    """Every (query chunk, key chunk) pair of one ring step that has something to compute."""
    for i, (qa, qb, gqa, gqb) in enumerate(_local_ranges(q_chunks)):
        for ka, kb, gka, gkb in _local_ranges(k_chunks):
            allowed = _tile_mask((gqa, gqb), (gka, gkb), is_causal, device)
            if allowed is False:
                if stats is not None:
                    stats.skipped += 1
                continue
            if stats is not None:
                stats.tiles += 1
                stats.score_elements += (qb - qa) * (kb - ka)
                if (qb - qa) * (kb - ka) > math.prod(stats.largest_tile):
                    stats.largest_tile = (qb - qa, kb - ka)
            yield i, slice(qa, qb), slice(ka, kb), allowed


def _scores(q_i: Tensor, k_j: Tensor, allowed: Tensor | None) -> Tensor:
    s = q_i @ k_j.transpose(-2, -1)  # [..., tq, d] @ [..., d, tk]: q_i is already scaled
    return s if allowed is None else s.masked_fill(~allowed, NEG_INF)


def _forward(q, k, v, is_causal, scale, layout, comm, stats):
    """The ring forward: P steps of (fold the K/V block held, pass it on); returns out, lse."""
    rank, world = comm.rank, comm.world
    q_ranges = _local_ranges(layout[rank])
    state = [(q.new_full((*q.shape[:-2], b - a, 1), NEG_INF), q.new_zeros((*q.shape[:-2], b - a, 1)),
              q.new_zeros((*q.shape[:-2], b - a, v.size(-1)))) for a, b, _, _ in q_ranges]
    qs = q * scale
    for step in range(world):
        src = (rank - step) % world
        for i, rows, cols, allowed in _tiles(layout[rank], layout[src], is_causal, q.device, stats):
            state[i] = online_softmax_update(*state[i], _scores(qs[..., rows, :], k[..., cols, :], allowed), v[..., cols, :])
        if stats is not None:
            stats.steps += 1
        if step < world - 1:
            k, v = comm.exchange([k, v])
    outs, lses = zip(*(online_softmax_finish(*s) for s in state))
    return torch.cat(outs, dim=-2), torch.cat(lses, dim=-1)


def _backward(q, k, v, out, lse, d_out, is_causal, scale, layout, comm):
    """Recompute each tile's weights from lse; dK, dV travel with their block and come home at the end."""
    rank, world = comm.rank, comm.world
    delta = (d_out * out).sum(-1, keepdim=True)  # D = rowsum(dO ∘ O) [..., Tl, 1]
    lse = lse.masked_fill(lse == NEG_INF, float("inf")).unsqueeze(-1)  # rows that saw nothing: P = 0
    qs, d_q = q * scale, torch.zeros_like(q)
    d_k, d_v = torch.zeros_like(k), torch.zeros_like(v)
    for step in range(world):
        src = (rank - step) % world
        for _, rows, cols, allowed in _tiles(layout[rank], layout[src], is_causal, q.device, None):
            p = (_scores(qs[..., rows, :], k[..., cols, :], allowed) - lse[..., rows, :]).exp()
            d_v[..., cols, :] += p.transpose(-2, -1) @ d_out[..., rows, :]
            d_s = p * (d_out[..., rows, :] @ v[..., cols, :].transpose(-2, -1) - delta[..., rows, :])
            d_q[..., rows, :] += d_s @ k[..., cols, :]
            d_k[..., cols, :] += d_s.transpose(-2, -1) @ qs[..., rows, :]
        if step < world - 1:
            k, v, d_k, d_v = comm.exchange([k, v, d_k, d_v], "backward")
        elif world > 1:
            d_k, d_v = comm.exchange([d_k, d_v], "backward")  # the last hop: home to the block's owner
    return d_q * scale, d_k, d_v


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale, layout, comm, stats):
        out, lse = _forward(q, k, v, is_causal, scale, layout, comm, stats)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.config = (is_causal, scale, layout, comm)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        d_q, d_k, d_v = _backward(q, k, v, out, lse, d_out.contiguous(), *ctx.config)
        return d_q, d_k, d_v, None, None, None, None, None


def ring_attention(q: Tensor, k: Tensor, v: Tensor, *, layout: Layout, comm: Comm, is_causal: bool = False,
                   scale: float | None = None, stats: RingStats | None = None) -> Tensor:
    """Attention of this rank's queries over the whole sequence, K/V blocks passed around the ring.

    Args:
        q, k, v: this rank's blocks ``[B, H, T_local, d]`` (the positions ``layout[rank]``, in order).
        layout: every rank's global positions (:func:`contiguous_layout`, :func:`zigzag_layout`).
        comm: the ring (:class:`tinytf.collectives.Comm`); its traffic counts the bytes sent.
        is_causal: query at global position ``p`` sees keys at positions ``<= p``.
        stats: a :class:`RingStats` to fill with this rank's work.

    Returns:
        ``out [B, H, T_local, d]``: the rows of full attention at this rank's positions. Differentiable.
    """
    check_qkv(q, k, v)
    if len(layout) != comm.world:
        raise ValueError(f"layout has {len(layout)} ranks but the group has P={comm.world}")
    sizes = [sum(b - a for a, b in chunks) for chunks in layout]
    if len(set(sizes)) != 1:
        raise ValueError(f"every rank must hold as many positions (the K/V blocks travel in one shape), got {sizes}")
    held = sizes[comm.rank]
    if q.size(-2) != held or k.size(-2) != held:
        raise ValueError(
            f"rank {comm.rank}: q {list(q.shape)} and k {list(k.shape)} must hold the {held} positions of layout[{comm.rank}]"
            f" = {layout[comm.rank]}; cut them with shard_sequence(x, layout[rank])"
        )
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    return _RingAttention.apply(q, k, v, is_causal, scale, layout, comm, stats)
