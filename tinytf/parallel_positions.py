"""Positions in a block whose heads are split across ranks (tensor and sequence parallelism; chapters 12 and 13).

A tensor-parallel rank sees every position of the sequence and ``H/P`` of the heads, so its positions need no
offset and only ALiBi needs to know *which* heads it holds:

    RoPE         the block's own rotation (the same for every head) at positions 0 … T - 1
    ALiBi        the slopes of the rank's heads, ``slopes.chunk(P)[r]`` (:func:`local_slopes`), on the causal band
    learned,     added to the embeddings before the first block: every rank adds all ``T`` rows (x is whole);
    sinusoidal   under sequence parallelism, where x is split, rank ``r`` adds rows ``r·T/P … (r+1)·T/P - 1``

Sequence parallelism all-gathers the sequence before attention (:mod:`tinytf.sequence_parallel`), so inside
attention the same holds there. When the *sequence* is split instead (the ring, Ulysses), positions are global
offsets: :mod:`tinytf.context_parallel`.
"""

from __future__ import annotations

import torch
from torch import nn

from .alibi import alibi_bias, allowed_keys, check_alibi
from .attention import scaled_dot_product_attention
from .grouped import repeat_kv
from .masks import causal_mask

__all__ = ["local_attention", "local_slopes", "mesh_rank"]

Tensor = torch.Tensor


def local_slopes(attn: nn.Module, rank: int, world: int) -> Tensor | None:
    """ALiBi slopes ``[H/P]`` of rank ``rank``'s query heads (``H/P`` consecutive heads), or None without ALiBi."""
    slopes = getattr(attn, "alibi_slopes", None)
    return None if slopes is None else slopes.chunk(world)[rank]


def mesh_rank(weight: Tensor) -> int:
    """This rank's place on the device mesh of a parameter that ``parallelize_module`` made a DTensor (0 for a plain
    tensor: nothing was split)."""
    mesh = getattr(weight, "device_mesh", None)
    return 0 if mesh is None else mesh.get_local_rank()


def local_attention(qkv: Tensor, d: int, heads: int, kv_heads: int, groups: int, mask: Tensor | None,
                    is_causal: bool, window: int | None, *, rope: nn.Module | None = None,
                    slopes: Tensor | None = None) -> Tensor:
    """Attention over the heads one rank holds: ``qkv [B, T, (heads + 2·kv_heads)·d]`` (this rank's
    ``[q; k; v]``) -> ``[B, T, heads·d]`` (its heads merged, in head order). ``rope``: the block's
    :class:`tinytf.rope.RotaryEmbedding` (the same rotation for every head); ``slopes``: ALiBi's slopes of this
    rank's heads ``[heads]`` (:func:`local_slopes`; causal attention only)."""
    b, t, _ = qkv.shape
    check_alibi(slopes, heads, is_causal, "local_attention")
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    q, k, v = (z.view(b, t, -1, d).transpose(1, 2) for z in (q, k, v))  # [B, heads of this rank, T, d]
    if rope is not None:
        q, k = rope(q, k)  # positions 0 … T - 1, as in the single-process block
    bias = None
    if slopes is not None:  # ALiBi: the causal (window) mask and the bias from positions
        pos = torch.arange(t, device=qkv.device)
        band, bias = allowed_keys(pos, pos, window=window), alibi_bias(slopes, pos, pos)
        mask, is_causal = (band if mask is None else mask & band), False
    elif is_causal and window is not None:
        band = causal_mask(t, window=window, device=qkv.device)
        mask, is_causal = (band if mask is None else mask & band), False
    out = scaled_dot_product_attention(q, repeat_kv(k, groups), repeat_kv(v, groups), mask, is_causal=is_causal, bias=bias)
    return out.transpose(1, 2).reshape(b, t, heads * d)
