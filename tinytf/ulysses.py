"""Ulysses attention (DeepSpeed-Ulysses, Jacobs et al. 2023): the sequence split traded for a head split.

Rank ``r`` holds positions ``r·T/P … (r+1)·T/P - 1`` (a contiguous layout) of ``q [B, H, T/P, d]`` and
``k, v [B, kv_heads, T/P, d]``. One **all-to-all** per tensor trades the split: rank ``r`` sends head group
``j`` of its positions to rank ``j`` and receives every rank's positions of its own head group, so
afterwards it holds *all* ``T`` positions of heads ``r·H/P … (r+1)·H/P - 1`` — ``[B, H/P, T, d]``::

    [B, H, T/P, d] --all-to-all--> [B, H/P, T, d] --attention (whole heads)--> [B, H/P, T, d] --all-to-all--> [B, H, T/P, d]

Attention then runs on whole sequences of whole heads (any kernel; causal masking needs no global
offsets), and one more all-to-all trades the output back. Each all-to-all sends ``(P - 1)/P`` of the
rank's tensor, so a layer's forward sends ``(P - 1)/P² · B·T·s · (2·H + 2·kv_heads)·d`` bytes per rank —
``4 (P - 1)/P² · B·T·D·s`` for multi-head attention, *falling* with ``P``. The backward sends the same
(each all-to-all's gradient is the inverse all-to-all). The price: the heads are what is split, so
``H`` must be divisible by ``P`` (``H >= P``); K/V heads fewer than ``P`` are repeated up to ``P`` first
(each rank needs the one its query heads read), which sends ``P / kv_heads`` times their bytes.

**Positions** (chapter 13): RoPE rotates q and k at their *global* positions ``r·T/P …`` before the first
all-to-all (a rotated key keeps its rotation when it travels); ALiBi's bias is added after it, where the rank
holds positions ``0 … T - 1`` of its head group, with those heads' slopes (``slopes.chunk(P)[r]``).
"""

from __future__ import annotations

import torch

from .alibi import alibi_bias, allowed_keys, check_alibi
from .attention import check_qkv, scaled_dot_product_attention
from .collectives import Comm, conjugate_exchange
from .config import check_kv_heads
from .grouped import repeat_kv
from .masks import check_causal_window
from .translation import gettext as _

__all__ = ["seq_to_heads", "heads_to_seq", "ulysses_attention", "ulysses_kv_heads"]

Tensor = torch.Tensor


def _seq_to_heads(x: Tensor, comm: Comm, phase: str) -> Tensor:
    p = comm.world
    chunks = x.unflatten(1, (p, x.size(1) // p)).movedim(1, 0)  # [P, B, h/P, n, d]: head group j, for rank j
    got = comm.all_to_all(chunks.contiguous(), phase)  # [P, B, h/P, n, d]: chunk i = rank i's positions
    return got.movedim(0, 2).flatten(2, 3)  # [B, h/P, P, n, d] -> [B, h/P, P·n = T, d], positions in order


def _heads_to_seq(x: Tensor, comm: Comm, phase: str) -> Tensor:
    p = comm.world
    chunks = x.unflatten(2, (p, x.size(2) // p)).movedim(2, 0)  # [P, B, h/P, n, d]: rank j's positions, for rank j
    got = comm.all_to_all(chunks.contiguous(), phase)  # [P, B, h/P, n, d]: chunk i = head group i
    return got.movedim(0, 1).flatten(1, 2)  # [B, P, h/P, n, d] -> [B, h, n, d], heads in order


def seq_to_heads(x: Tensor, comm: Comm) -> Tensor:
    """``[B, h, T/P, d]`` (this rank's positions, every head) -> ``[B, h/P, T, d]`` (every position, this rank's
    heads): one all-to-all. Differentiable (the gradient takes the inverse all-to-all)."""
    if x.dim() != 4 or x.size(1) % comm.world:
        raise ValueError(_("seq_to_heads takes [B, heads, T/P, d] with heads divisible by P={world}, got {shape}: Ulysses splits "
                           "the heads, so it needs heads >= P").format(world=comm.world, shape=list(x.shape)))
    return conjugate_exchange(x, comm, _seq_to_heads, _heads_to_seq)


def heads_to_seq(x: Tensor, comm: Comm) -> Tensor:
    """``[B, h/P, T, d]`` -> ``[B, h, T/P, d]``: the inverse of :func:`seq_to_heads` (one all-to-all)."""
    if x.dim() != 4 or x.size(2) % comm.world:
        raise ValueError(_("heads_to_seq takes [B, heads/P, T, d] with T divisible by P={world}, got {shape}").format(
            world=comm.world, shape=list(x.shape)))
    return conjugate_exchange(x, comm, _heads_to_seq, _seq_to_heads)


def ulysses_kv_heads(kv_heads: int, world: int) -> int:
    """The K/V heads that travel: ``kv_heads`` when ``P`` divides it, else ``P`` (each repeated ``P / kv_heads``
    times so that every rank receives the one its query heads read). ``ValueError`` when neither divides."""
    if kv_heads % world == 0:
        return kv_heads
    if world % kv_heads == 0:
        return world
    raise ValueError(_("kv_heads={kv_heads} and P={world}: one must divide the other for Ulysses to give every rank whole K/V "
                       "heads").format(kv_heads=kv_heads, world=world))


def ulysses_attention(q: Tensor, k: Tensor, v: Tensor, *, comm: Comm, is_causal: bool = False,
                      scale: float | None = None, slopes: Tensor | None = None, window: int | None = None) -> Tensor:
    """Attention of this rank's positions over the whole sequence by trading the sequence split for a head split.

    Args:
        q: ``[B, H, T/P, d]``, this rank's positions ``r·T/P …`` (contiguous layout) of every query head; with RoPE
            already rotated at those global positions (as k).
        k, v: ``[B, kv_heads, T/P, d]`` the same positions' keys and values (``kv_heads`` divides ``H``).
        comm: the group (:class:`tinytf.collectives.Comm`); its traffic counts the all-to-alls' bytes.
        is_causal: query at global position ``p`` sees keys at ``<= p``.
        slopes: ALiBi's slope of every query head ``[H]`` (causal only); window: sliding-window attention (causal only).

    Returns:
        ``[B, H, T/P, d]``: the rows of full attention at this rank's positions. Differentiable.
    """
    world = comm.world
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(_("Ulysses attention takes [B, H, T/P, d] blocks, got q {q}, k {k}, v {v}").format(
            q=list(q.shape), k=list(k.shape), v=list(v.shape)))
    heads, kv = q.size(1), check_kv_heads(q.size(1), k.size(1))
    if heads % world:
        raise ValueError(_("Ulysses splits the heads across the ranks: heads={heads} is not divisible by P={world}. Use P among "
                           "the divisors of heads, or the ring (which splits the sequence only)").format(heads=heads, world=world))
    check_qkv(q[:, :kv], k, v)
    check_alibi(slopes, heads, is_causal, "ulysses_attention")
    window = check_causal_window(window, is_causal)
    travel = ulysses_kv_heads(kv, world)
    if travel != kv:
        k, v = repeat_kv(k, travel // kv), repeat_kv(v, travel // kv)  # [B, P, T/P, d]: one K/V head per rank
    q_h, k_h, v_h = (seq_to_heads(t, comm) for t in (q, k, v))  # [B, H/P, T, d], [B, travel/P, T, d]
    groups, mask, bias = q_h.size(1) // k_h.size(1), None, None
    if slopes is not None or window is not None:  # every position 0 … T - 1 of this rank's heads: the masks of one process
        pos = torch.arange(q_h.size(-2), device=q.device)
        mask, is_causal = allowed_keys(pos, pos, window=window), False
        bias = None if slopes is None else alibi_bias(slopes.chunk(world)[comm.rank], pos, pos)[None]  # [1, H/P, T, T]
    out = scaled_dot_product_attention(q_h, repeat_kv(k_h, groups), repeat_kv(v_h, groups), mask, is_causal=is_causal, scale=scale,
                                       bias=bias)
    return heads_to_seq(out, comm)
