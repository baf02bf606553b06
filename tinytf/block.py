"""The Transformer block: attention routes information between positions, the FFN transforms
each position on its own, and two residual paths carry the input around both.

    pre-norm  (modern decoders):  x = x + attn(norm1(x));  x = x + ffn(norm2(x))
    post-norm (2017 paper):       x = norm1(x + attn(x));  x = norm2(x + ffn(x))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from .heads import CausalSelfAttention

if TYPE_CHECKING:  # pragma: no cover
    from .kvcache import KVCache

__all__ = ["TransformerBlock", "NORMS"]

NORMS = ("pre", "post")


def _check_norm(norm: str) -> None:
    if norm not in NORMS:
        raise ValueError(f"norm must be 'pre' or 'post', got {norm!r}")


class TransformerBlock(nn.Module):
    """Causal Transformer block ``[B, T, D] -> [B, T, D]`` with submodules ``norm1``, ``attn``,
    ``norm2``, ``ffn`` (``Sequential(Linear(D, eD), GELU, Linear(eD, D))``).

    ``bias=False`` drops the bias vectors of every Linear layer (``attn.qkv``, ``attn.proj`` and
    the two of ``ffn``); the LayerNorms keep theirs. ``kv_heads`` and ``window`` go to
    :class:`tinytf.CausalSelfAttention` (grouped-query and sliding-window attention).
    """

    def __init__(
        self,
        dim: int = 64,
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
        _check_norm(norm)
        if expansion < 1:
            raise ValueError(f"expansion must be a positive integer, got {expansion}")
        self.norm_position = norm
        self.norm1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(
            dim, heads, max_tokens, kv_heads=kv_heads, window=window, bias=bias, dropout=dropout, backend=backend
        )
        self.norm2 = nn.LayerNorm(dim)
        hidden = expansion * dim
        self.ffn = nn.Sequential(nn.Linear(dim, hidden, bias=bias), nn.GELU(), nn.Linear(hidden, dim, bias=bias))  # D -> eD -> D
        self.drop = nn.Dropout(dropout)  # on each residual branch's output

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        cache: KVCache | None = None,
        layer: int = 0,
    ) -> torch.Tensor:
        """x ``[B, T, D]`` -> ``[B, T, D]``; ``mask``/``cache``/``layer`` are passed to ``attn``."""
        if self.norm_position == "pre":
            x = x + self.drop(self.attn(self.norm1(x), mask, cache=cache, layer=layer))
            x = x + self.drop(self.ffn(self.norm2(x)))
        else:
            x = self.norm1(x + self.drop(self.attn(x, mask, cache=cache, layer=layer)))
            x = self.norm2(x + self.drop(self.ffn(x)))
        return x
