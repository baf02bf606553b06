"""Grouped-query attention: fewer key/value heads than query heads, shared by groups of queries.

    heads query heads, kv_heads K/V heads, groups = heads / kv_heads query heads per K/V head
    query head h reads K/V head  h // groups          (kv_heads == heads: multi-head attention,
                                                       kv_heads == 1: multi-query attention)

The K/V projections shrink from ``[D, D]`` to ``[kv_heads · d_head, D]`` and so does the KV cache,
by exactly ``heads / kv_heads``. :func:`repeat_kv` widens the K/V heads back to one per query head
for code that wants equal head counts (the explicit and the tiled attention);
``F.scaled_dot_product_attention(..., enable_gqa=True)`` does the same sharing inside the kernel.

The number of K/V heads is validated by :func:`tinytf.config.check_kv_heads`; turning a trained
multi-head model into a grouped-query one is :func:`tinytf.convert.to_grouped_query`.
"""

from __future__ import annotations

import torch

from .config import check_kv_heads

__all__ = ["repeat_kv", "kv_head_of"]


def kv_head_of(h: int, heads: int, kv_heads: int) -> int:
    """The K/V head that query head ``h`` reads: ``h // (heads // kv_heads)`` (consecutive groups)."""
    return h // (heads // check_kv_heads(heads, kv_heads))


def repeat_kv(kv: torch.Tensor, groups: int) -> torch.Tensor:
    """``[B, kv_heads, T, d] -> [B, kv_heads · groups, T, d]``: each K/V head once per query head of its group.

    ``repeat_interleave`` (``k0 k0 k1 k1``), not ``repeat`` (``k0 k1 k0 k1``): query head ``h`` must
    meet K/V head ``h // groups``. ``repeat`` would give it head ``h % kv_heads`` — the same shapes,
    silently different attention.
    """
    return kv if groups == 1 else kv.repeat_interleave(groups, dim=-3)
