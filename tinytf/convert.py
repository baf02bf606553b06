"""Conversions that build a new model from a trained one: multi-head -> grouped-query attention, and a RoPE
model's interleaved layout -> the half-split one.

    qkv rows [W_q; W_k; W_v]:  [D + 2·kv_from·d, D]  --mean over each group of K/V heads-->  [D + 2·kv_to·d, D]
    W_q, W_k rows of each head: channels (0, 1), (2, 3), …  --permuted-->  (0, r/2), (1, r/2 + 1), …

:func:`to_grouped_query` averages the K/V projections of the heads that will share one K/V head (the
initialisation of Ainslie et al., 2023, "GQA"); :func:`pool_kv_heads` is that pooling for one fused
``qkv`` weight or bias. The head mapping itself (query head ``h`` reads K/V head ``h // groups``) is
:mod:`tinytf.grouped`'s.
"""

from __future__ import annotations

import copy
import dataclasses

import torch

from .lm import TinyLanguageModel
from .rope import interleaved_to_half

__all__ = ["to_grouped_query", "pool_kv_heads", "to_half_split"]


def pool_kv_heads(w: torch.Tensor, dim: int, head_dim: int, kv_from: int, kv_to: int) -> torch.Tensor:
    """Rows ``[W_q; W_k; W_v]`` of a fused ``qkv`` weight ``[D + 2·kv_from·d, ...]`` (or bias) with the
    K and V blocks mean-pooled from ``kv_from`` to ``kv_to`` heads: ``[D + 2·kv_to·d, ...]``.

    Consecutive heads are pooled (``kv_from / kv_to`` per group), the grouping of :func:`tinytf.grouped.kv_head_of`."""
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
    for name, tensor in state.items():
        if ".attn.qkv." in name:
            state[name] = pool_kv_heads(tensor, c.dim, c.head_dim, kv_from, kv_heads)
    new.load_state_dict(state)
    new.train(model.training)
    return new


def to_half_split(model: TinyLanguageModel) -> TinyLanguageModel:
    """A copy of a RoPE ``model`` built with ``rope_layout="interleaved"`` (RoFormer, GPT-J) that uses the half-split
    layout (GPT-NeoX, Llama) and computes the same logits: the rows of ``W_q`` and ``W_k`` (weights and biases) are
    permuted inside every head by :func:`tinytf.rope.half_order`; ``W_v`` and everything else are copied. Loading the
    weights without the permutation runs without an error and computes something else (chapter 13's pitfall)."""
    c = model.config
    if c.positions != "rope" or c.rope_layout != "interleaved":
        raise ValueError(f"to_half_split converts a RoPE model with rope_layout='interleaved'; this one has positions={c.positions!r}"
                         + (f", rope_layout={c.rope_layout!r}" if c.positions == "rope" else "") + ": there is nothing to convert.")
    p = next(model.parameters())
    new = TinyLanguageModel(dataclasses.replace(c, rope_layout="half")).to(device=p.device, dtype=p.dtype)
    state = copy.deepcopy(model.state_dict())
    kv_dim = c.n_kv_heads * c.head_dim
    for name, tensor in state.items():
        if ".attn.qkv." in name:
            w_q, w_k, w_v = tensor.split([c.dim, kv_dim, kv_dim])
            state[name] = torch.cat([interleaved_to_half(w_q, c.heads, c.head_dim, c.rotary_dim),
                                     interleaved_to_half(w_k, c.n_kv_heads, c.head_dim, c.rotary_dim), w_v])
    new.load_state_dict(state)
    new.train(model.training)
    return new
