"""Tiled attention with an online softmax — FlashAttention-2's algorithm, written in plain PyTorch.

The explicit version builds every score ``[..., Tq, Tk]`` at once. Here the queries are cut into
blocks of ``block_q`` rows and the keys/values into blocks of ``block_k`` rows; one query block
meets one key block at a time, so no score tensor is ever larger than ``[..., block_q, block_k]``.

The softmax of a row needs its maximum and its sum over *all* keys. The online softmax keeps, per
query row, a running maximum ``m``, a running sum ``l = Σ exp(s - m)`` and an accumulator
``acc = Σ exp(s - m) v``. When a new tile raises the maximum from ``m`` to ``m'`` the old sums are
worth ``exp(m - m')`` times less, so ``l`` and ``acc`` are rescaled by that factor
(:func:`online_softmax_update`). After the last tile, ``out = acc / l`` and the log-sum-exp
``lse = m + log l`` (:func:`online_softmax_finish`) — the exact softmax, not an approximation.

The backward (:class:`TiledAttention`) saves only q, k, v, the output and ``lse`` ``[..., Tq]``:
it recomputes each tile's weights ``P = exp(S - lse)`` instead of storing ``[..., Tq, Tk]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

from .attention import check_inputs
from .masks import check_causal_sizes
from .translation import gettext as _

__all__ = [
    "tiled_attention", "online_softmax_update", "online_softmax_finish", "TileStats", "TiledAttention", "keys_needed", "tile_mask",
    "tile_scores",
]

NEG_INF = float("-inf")
Tensor = torch.Tensor


@dataclass
class TileStats:
    """How many ``block_q × block_k`` tiles one call computed, and how many it skipped.

    Under a causal mask a tile whose every key lies in the future of every query in it is never
    computed (``skipped``); for a square ``T × T`` problem that is about half of all tiles.
    """

    block_q: int
    block_k: int
    q_blocks: int  # ceil(Tq / block_q)
    k_blocks: int  # ceil(Tk / block_k)
    computed: int = 0
    skipped: int = 0

    @property
    def total(self) -> int:
        """All ``q_blocks × k_blocks`` tiles of the score grid (computed + skipped)."""
        return self.q_blocks * self.k_blocks


def online_softmax_update(
    m: Tensor, l: Tensor, acc: Tensor, scores: Tensor, v: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Fold one tile of scores into the running statistics of its query rows.

    Args:
        m: ``[..., bq, 1]`` running row maximum (``-inf`` before the first tile).
        l: ``[..., bq, 1]`` running sum of ``exp(score - m)`` (0 before the first tile).
        acc: ``[..., bq, dv]`` running ``Σ exp(score - m) · v`` (0 before the first tile).
        scores: ``[..., bq, bk]`` this tile's scaled scores, ``-inf`` where masked.
        v: ``[..., bk, dv]`` the values of this tile's keys.

    Returns:
        the new ``(m, l, acc)``. Dividing ``acc / l`` at any step gives the exact attention over
        the keys seen so far.
    """
    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))  # [..., bq, 1]
    # A row that has seen only masked keys still has m = -inf; exp(-inf - -inf) would be NaN, so
    # subtract 0 there instead: its p and its correction factor are then exp(-inf) = 0.
    m_safe = m_new.masked_fill(m_new == NEG_INF, 0.0)
    p = (scores - m_safe).exp_()  # [..., bq, bk] unnormalised weights of this tile (exp in place: one tile less)
    alpha = torch.exp(m - m_safe)  # [..., bq, 1] how much the old sums shrink under the new maximum
    l_new = alpha * l + p.sum(dim=-1, keepdim=True)
    acc_new = alpha * acc + p @ v  # rescale the old accumulator, then add this tile's share
    return m_new, l_new, acc_new


def online_softmax_finish(
    m: Tensor, l: Tensor, acc: Tensor
) -> tuple[Tensor, Tensor]:
    """``(out [..., bq, dv], lse [..., bq])`` from the final running statistics.

    The division by ``l`` happens once, after the last tile. A row that could attend to nothing
    has ``l = 0`` and ``acc = 0``: its output is 0 (no NaN) and its ``lse`` is ``-inf``.
    """
    out = acc / l.masked_fill(l == 0, 1.0)
    lse = (m + torch.log(l)).squeeze(-1)  # log Σ exp(score) = m + log Σ exp(score - m)
    return out, lse


def keys_needed(q1: int, t_q: int, t_k: int, is_causal: bool) -> int:
    """Keys ``0 .. end-1`` that the query block ending at row ``q1`` may see (end-aligned causal)."""
    return min(t_k, t_k - t_q + q1) if is_causal else t_k


def tile_mask(
    mask: Tensor | None, is_causal: bool, rows: tuple[int, int], cols: tuple[int, int], offset: int,
    device: torch.device,
) -> Tensor | None:
    """The allowed-positions tile ``[..., bq, bk]`` (True = may attend), or None if all allowed.

    ``mask`` is sliced (its size-1 broadcast axes are kept whole); the causal part is built for
    this tile only: query ``i`` (absolute position ``offset + i``) sees key ``j`` iff ``j <= offset + i``.
    """
    (q0, q1), (k0, k1) = rows, cols
    allowed = None
    if mask is not None:
        r = slice(q0, q1) if mask.size(-2) > 1 else slice(None)
        c = slice(k0, k1) if mask.size(-1) > 1 else slice(None)
        allowed = mask[..., r, c]
    if is_causal and k1 - 1 > offset + q0:  # only tiles that cross the diagonal need the causal mask
        q_pos = torch.arange(q0, q1, device=device) + offset
        causal = torch.arange(k0, k1, device=device)[None, :] <= q_pos[:, None]  # [bq, bk]
        allowed = causal if allowed is None else allowed & causal
    return allowed


def tile_scores(q_i: Tensor, k_j: Tensor, allowed: Tensor | None) -> Tensor:
    """One tile of scores ``[..., bq, bk]`` from an already scaled query block, ``-inf`` where not allowed."""
    s = q_i @ k_j.transpose(-2, -1)  # [..., bq, d] @ [..., d, bk] -> [..., bq, bk]
    return s if allowed is None else s.masked_fill_(~allowed, NEG_INF)  # mask BEFORE the softmax (in place: a fresh tile)


def _forward(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, scale: float, stats: TileStats
) -> tuple[Tensor, Tensor]:
    """FlashAttention-2 forward: for each query block, stream the key/value blocks through it.

    q ``[..., Tq, d]``, k ``[..., Tk, d]``, v ``[..., Tk, dv]`` -> out ``[..., Tq, dv]``, lse ``[..., Tq]``.
    """
    t_q, t_k, bq, bk = q.size(-2), k.size(-2), stats.block_q, stats.block_k
    out = q.new_empty(*q.shape[:-1], v.size(-1))
    lse = q.new_empty(q.shape[:-1])
    for q0 in range(0, t_q, bq):
        q1 = min(q0 + bq, t_q)
        q_i = q[..., q0:q1, :] * scale  # scale the [bq, d] query block, not every [bq, bk] tile
        m = q.new_full((*q.shape[:-2], q1 - q0, 1), NEG_INF)  # [..., bq, 1]
        l = torch.zeros_like(m)  # running sum, named l as in the FlashAttention paper
        acc = q.new_zeros(*q.shape[:-2], q1 - q0, v.size(-1))  # [..., bq, dv]
        end = keys_needed(q1, t_q, t_k, is_causal)  # key blocks from `end` on are wholly in the future
        for k0 in range(0, end, bk):
            k1 = min(k0 + bk, t_k)
            allowed = tile_mask(mask, is_causal, (q0, q1), (k0, k1), t_k - t_q, q.device)
            s = tile_scores(q_i, k[..., k0:k1, :], allowed)
            m, l, acc = online_softmax_update(m, l, acc, s, v[..., k0:k1, :])
            stats.computed += 1
        stats.skipped += stats.k_blocks - math.ceil(end / bk)
        out[..., q0:q1, :], lse[..., q0:q1] = online_softmax_finish(m, l, acc)
    return out, lse


def _backward(
    q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, d_out: Tensor, d_lse: Tensor | None,
    mask: Tensor | None, is_causal: bool, scale: float, bq: int, bk: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """FlashAttention-2 backward: recompute each tile's weights from ``lse``, never store them.

    With ``P = exp(S - lse)`` (the forward's weights), ``D = rowsum(dO ∘ O)`` ``[..., Tq]``:
    ``dV += Pᵀ dO``, ``dP = dO Vᵀ``, ``dS = P ∘ (dP - D)``, ``dQ += dS K · scale``, ``dK += dSᵀ (Q · scale)``.
    A gradient on ``lse`` adds ``P · d_lse`` to ``dS``, i.e. it enters as ``D - d_lse``.
    The loops run query-outer like the forward; FA-2's GPU kernel runs key-outer so that dK, dV stay
    on chip — in PyTorch, where every slice lives in the same memory, both orders cost the same.
    """
    t_q, t_k = q.size(-2), k.size(-2)
    d_q, d_k, d_v = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    delta = (d_out * out).sum(dim=-1)  # D [..., Tq]
    if d_lse is not None:
        delta = delta - d_lse
    lse = lse.masked_fill(lse == NEG_INF, float("inf"))  # rows that saw nothing: P = exp(s - inf) = 0
    for q0 in range(0, t_q, bq):
        q1 = min(q0 + bq, t_q)
        q_i, do_i = q[..., q0:q1, :] * scale, d_out[..., q0:q1, :]
        lse_i, delta_i = lse[..., q0:q1, None], delta[..., q0:q1, None]  # [..., bq, 1]
        for k0 in range(0, keys_needed(q1, t_q, t_k, is_causal), bk):
            k1 = min(k0 + bk, t_k)
            k_j, v_j = k[..., k0:k1, :], v[..., k0:k1, :]
            allowed = tile_mask(mask, is_causal, (q0, q1), (k0, k1), t_k - t_q, q.device)
            p = (tile_scores(q_i, k_j, allowed) - lse_i).exp_()  # [..., bq, bk] the forward's weights, recomputed
            d_v[..., k0:k1, :] += p.transpose(-2, -1) @ do_i
            d_s = (do_i @ v_j.transpose(-2, -1)).sub_(delta_i).mul_(p)  # dS = P ∘ (dP - D), in place
            d_q[..., q0:q1, :] += d_s @ k_j
            d_k[..., k0:k1, :] += d_s.transpose(-2, -1) @ q_i  # q_i is already scaled
        d_q[..., q0:q1, :] *= scale
    return d_q, d_k, d_v


class TiledAttention(torch.autograd.Function):
    """``autograd.Function`` around the tiled forward and backward.

    Saves q, k, v, out ``[..., Tq, dv]``, lse ``[..., Tq]`` and the (optional) mask — memory O(T) on
    top of the inputs — and recomputes the score tiles in backward. Returns ``(out, lse)``.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, scale: float,
                stats: TileStats) -> tuple[Tensor, Tensor]:
        """Run the tiled forward; keep q, k, v, out, lse and the mask for backward."""
        out, lse = _forward(q, k, v, mask, is_causal, scale, stats)
        ctx.save_for_backward(q, k, v, out, lse, mask)
        ctx.config = (is_causal, scale, stats.block_q, stats.block_k)
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out: Tensor, d_lse: Tensor | None) -> tuple[Tensor | None, ...]:
        """dq, dk, dv from the saved tensors (None for the non-tensor arguments)."""
        q, k, v, out, lse, mask = ctx.saved_tensors
        d_q, d_k, d_v = _backward(q, k, v, out, lse, d_out, d_lse, mask, *ctx.config)
        return d_q, d_k, d_v, None, None, None, None


def _check_blocks(block_q: int, block_k: int) -> None:
    for name, b in (("block_q", block_q), ("block_k", block_k)):
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ValueError(
                _("{name} must be a positive integer (a tile holds block_q × block_k scores), got {name}={b!r}. Use e.g. block_q=64, "
                  "block_k=64; T need not be a multiple of the block size.").format(name=name, b=b)
            )


def tiled_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    block_q: int = 64,
    block_k: int = 64,
    return_lse: bool = False,
    return_stats: bool = False,
):
    """Scaled dot-product attention computed tile by tile (same contract as the explicit version).

    Args:
        q: ``[..., Tq, d]`` queries;  k: ``[..., Tk, d]`` keys;  v: ``[..., Tk, dv]`` values.
        mask: bool, broadcastable to ``[..., Tq, Tk]``, **True = may attend**.
        is_causal: also block the future, end-aligned when ``Tk > Tq`` (as :func:`tinytf.causal_mask`);
            tiles wholly in the future are skipped.
        scale: multiplies the scores; defaults to ``1 / sqrt(d)``.
        block_q, block_k: tile size; ``Tq``/``Tk`` need not be multiples of it.
        return_lse: also return the log-sum-exp of each row's scores ``[..., Tq]`` (``-inf`` for a row
            with nothing to attend to); it is differentiable.
        return_stats: also return a :class:`TileStats` (tiles computed and skipped).

    Returns:
        ``out [..., Tq, dv]``, followed by ``lse`` and/or the stats when asked for, in that order.
        A row that may see nothing gets a zero output (and zero gradients), never NaN.
    """
    check_inputs(q, k, v, mask)
    _check_blocks(block_q, block_k)
    t_q, t_k = q.size(-2), k.size(-2)
    if is_causal:
        check_causal_sizes(t_q, t_k)
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    stats = TileStats(block_q, block_k, math.ceil(t_q / block_q), math.ceil(t_k / block_k))
    out, lse = TiledAttention.apply(q, k, v, mask, is_causal, scale, stats)
    extra = ((lse,) if return_lse else ()) + ((stats,) if return_stats else ())
    return (out, *extra) if extra else out
