"""Grouped-query attention: fewer key/value heads than query heads, shared by groups of queries.

    heads query heads, kv_heads K/V heads, groups = heads / kv_heads query heads per K/V head
    query head h reads K/V head  h // groups          (kv_heads == heads: multi-head attention,
                                                       kv_heads == 1: multi-query attention)

The K/V projections shrink from ``[D, D]`` to ``[kv_heads · d_head, D]`` and so does the KV cache,
by exactly ``heads / kv_heads``. :func:`repeat_kv` widens the K/V heads back to one per query head
for code that wants equal head counts (the explicit and the tiled attention);
``F.scaled_dot_product_attention(..., enable_gqa=True)`` does the same sharing inside the kernel.

:func:`to_grouped_query` turns a trained multi-head model into a grouped-query one by averaging
the K/V projections of each group (the initialisation of Ainslie et al., 2023, "GQA").
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # pragma: no cover
    from .lm import TinyLanguageModel

__all__ = ["check_kv_heads", "repeat_kv", "kv_head_of", "to_grouped_query"]


def check_kv_heads(heads: int, kv_heads: int | None) -> int:
    """The number of K/V heads: ``heads`` when ``kv_heads`` is None; a ``ValueError`` unless it divides ``heads``."""
    if kv_heads is None:
        return heads
    divisors = [g for g in range(1, heads + 1) if heads % g == 0]
    if isinstance(kv_heads, bool) or not isinstance(kv_heads, int) or kv_heads < 1 or heads % kv_heads != 0:
        raise ValueError(
            f"kv_heads={kv_heads!r} does not divide heads={heads}: every K/V head is shared by the same number "
            f"(heads / kv_heads) of query heads. Choose kv_heads among {divisors} "
            f"({heads} = multi-head, 1 = multi-query), or None for multi-head attention."
        )
    return kv_heads


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


def _pool_rows(w: torch.Tensor, dim: int, head_dim: int, kv_from: int, kv_to: int) -> torch.Tensor:
    """Rows ``[W_q; W_k; W_v]`` of a fused ``qkv`` weight ``[D + 2·kv_from·d, ...]`` (or bias) with the
    K and V blocks mean-pooled from ``kv_from`` to ``kv_to`` heads: ``[D + 2·kv_to·d, ...]``."""
    w_q, w_k, w_v = w.split([dim, kv_from * head_dim, kv_from * head_dim])
    pool = kv_from // kv_to

    def pooled(block: torch.Tensor) -> torch.Tensor:
        # [kv_from·d, ...] -> [kv_to, pool, d, ...] -> mean over the heads of each group -> [kv_to·d, ...]
        return block.reshape(kv_to, pool, head_dim, *block.shape[1:]).mean(dim=1).reshape(kv_to * head_dim, *block.shape[1:])

    return torch.cat([w_q, pooled(w_k), pooled(w_v)])


def to_grouped_query(model: TinyLanguageModel, kv_heads: int) -> TinyLanguageModel:
    """A copy of ``model`` with ``kv_heads`` K/V heads, its K/V projections mean-pooled per group.

    The K/V heads that will share one head (consecutive ones: query head ``h`` reads ``h // groups``)
    are averaged, weights and biases; every other parameter is copied. ``kv_heads`` must divide the
    model's current K/V heads (``model.config.n_kv_heads``); equal to them, the copy computes exactly
    what ``model`` does. ``model`` itself is not changed. A short uptraining recovers most of the quality
    the pooling loses (the GQA paper uses 5% of the original training).
    """
    from .lm import TinyLanguageModel

    c = model.config
    kv_from = c.n_kv_heads
    if isinstance(kv_heads, bool) or not isinstance(kv_heads, int) or kv_heads < 1 or kv_from % kv_heads != 0:
        choices = [g for g in range(1, kv_from + 1) if kv_from % g == 0]
        raise ValueError(
            f"to_grouped_query: kv_heads={kv_heads!r} must divide the model's {kv_from} K/V heads (heads={c.heads}) "
            f"so that whole groups are pooled. Choose kv_heads among {choices}."
        )
    p = next(model.parameters())
    new = TinyLanguageModel(c, kv_heads=kv_heads).to(device=p.device, dtype=p.dtype)
    state = copy.deepcopy(model.state_dict())
    head_dim = c.dim // c.heads
    for name, tensor in state.items():
        if ".attn.qkv." in name:
            state[name] = _pool_rows(tensor, c.dim, head_dim, kv_from, kv_heads)
    new.load_state_dict(state)
    new.train(model.training)
    return new
