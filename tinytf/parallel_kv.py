"""Fewer K/V heads than tensor-parallel ranks: which K/V head a rank holds, and the replicas' gradients.

With ``kv_heads < P`` (``P`` a multiple of ``kv_heads``) each K/V head is **replicated** on ``P / kv_heads``
ranks, as vLLM and TensorRT-LLM do: rank ``r`` holds the one its query heads read, ``r // (P / kv_heads)``.
The forward stays exact; the group holds ``P / kv_heads`` copies of the K/V weights and cache; and in
training each replica's K/V weight gradient is a partial sum over its own query heads, which
:func:`reduce_replicated_kv_grads` adds up (:class:`tinytf.TensorParallelAttention` is the module it acts on).
"""

from __future__ import annotations

from typing import Any

__all__ = ["kv_heads_per_rank", "kv_replicas", "reduce_replicated_kv_grads"]


def kv_heads_per_rank(kv_heads: int, world: int) -> int:
    """K/V heads one rank holds: ``kv_heads / P``, or 1 when ``kv_heads < P`` (replicated)."""
    return max(kv_heads // world, 1)


def kv_replicas(kv_heads: int, world: int) -> int:
    """How many ranks hold each K/V head: 1, or ``P / kv_heads`` when ``kv_heads < P``."""
    return max(world // kv_heads, 1)


def reduce_replicated_kv_grads(attn: Any) -> None:
    """Sum the K/V weight (and bias) gradients over the ranks that replicate each K/V head (``kv_heads < P``).

    Each replica's gradient holds only its own query heads' share. Every rank writes its K/V rows' gradient
    into slot ``head`` of a zero buffer ``[kv_heads, rows]``; one all-reduce over the group (phase
    ``"weight_grad"``) leaves in each slot the sum over that head's replicas. No-op when nothing is replicated.
    """
    if attn.kv_heads >= attn.world:
        return
    head, rows = attn.rank // kv_replicas(attn.kv_heads, attn.world), attn.local_heads * attn.head_dim
    for p in (attn.qkv_weight, attn.qkv_bias):
        if p is None or p.grad is None:
            continue
        mine = p.grad[rows:]  # [2·d, ...]: this rank's K and V rows (one K/V head)
        buffer = mine.new_zeros((attn.kv_heads, *mine.shape))
        buffer[head] = mine
        attn.comm.all_reduce(buffer, "weight_grad")
        mine.copy_(buffer[head])
