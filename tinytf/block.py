"""The Transformer block: attention routes information between positions, the FFN transforms
each position on its own, and two residual paths carry the input around both.

    pre-norm  (modern decoders):  x = x + attn(norm1(x));  x = x + ffn(norm2(x))
    post-norm (2017 paper):       x = norm1(x + attn(x));  x = norm2(x + ffn(x))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from .config import ModelConfig, module_config
from .heads import CausalSelfAttention

if TYPE_CHECKING:  # pragma: no cover
    from .kvcache import KVCache

__all__ = ["TransformerBlock"]

class TransformerBlock(nn.Module):
    """Causal Transformer block ``[B, T, D] -> [B, T, D]`` with submodules ``norm1``, ``attn``,
    ``norm2``, ``ffn`` (``Sequential(Linear(D, eD), GELU, Linear(eD, D))``).

    ``bias=False`` drops the bias vectors of every Linear layer (``attn.qkv``, ``attn.proj`` and
    the two of ``ffn``); the LayerNorms keep theirs. ``kv_heads`` and ``window`` go to
    :class:`tinytf.CausalSelfAttention` (grouped-query and sliding-window attention).

    ``TransformerBlock(config)`` builds the block of a :class:`tinytf.ModelConfig` (``dim``, ``heads``,
    ``max_tokens``, ``expansion``, ``norm``, ``dropout``, ``backend``, ``bias``, ``kv_heads``, ``window``, and RoPE or
    ALiBi positions, which act inside attention);
    ``TransformerBlock(dim=64, heads=4, ...)`` makes that config from the keywords (and validates them).
    """

    def __init__(
        self,
        dim: int | ModelConfig = 64,
        heads: int = 4,
        max_tokens: int = 128,
        expansion: int = 4,
        *,
        norm: str = "pre",
        dropout: float = 0.0,
        backend: str = "explicit",
        bias: bool = True,
        kv_heads: int | None = None,
        window: int | None = None,
    ) -> None:
        super().__init__()
        c = module_config(TransformerBlock.__init__, dim, dict(
            heads=heads, max_tokens=max_tokens, expansion=expansion, norm=norm, dropout=dropout, backend=backend, bias=bias,
            kv_heads=kv_heads, window=window))
        self.norm_position = c.norm
        self.norm1 = nn.LayerNorm(c.dim)
        self.attn = CausalSelfAttention(c)
        self.norm2 = nn.LayerNorm(c.dim)
        hidden = c.expansion * c.dim
        self.ffn = nn.Sequential(nn.Linear(c.dim, hidden, bias=c.bias), nn.GELU(), nn.Linear(hidden, c.dim, bias=c.bias))  # D -> eD -> D
        self.drop = nn.Dropout(c.dropout)  # on each residual branch's output

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        cache: KVCache | None = None,
        layer: int = 0,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x ``[B, T, D]`` -> ``[B, T, D]``; ``mask``/``cache``/``layer``/``positions`` are passed to ``attn``."""
        if self.norm_position == "pre":
            x = x + self.drop(self.attn(self.norm1(x), mask, cache=cache, layer=layer, positions=positions))
            x = x + self.drop(self.ffn(self.norm2(x)))
        else:
            x = self.norm1(x + self.drop(self.attn(x, mask, cache=cache, layer=layer, positions=positions)))
            x = self.norm2(x + self.drop(self.ffn(x)))
        return x
