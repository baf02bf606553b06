"""Sinusoidal positions (Vaswani et al. 2017): a fixed table added to the token embeddings, nothing learned.

    PE[p, 2i] = sin(p / 10000^(2i/D)),   PE[p, 2i + 1] = cos(p / 10000^(2i/D))

Every pair of channels is a point on a circle that turns with the position at its own speed, so ``PE[p + k]`` is
a rotation of ``PE[p]`` that depends on ``k`` only (the idea RoPE later applies to q and k themselves). The table
can be computed for any position; a model trained on ``max_tokens`` positions has still never *seen* the later ones.
"""

from __future__ import annotations

import torch
from torch import nn

from .translation import gettext as _

__all__ = ["sinusoidal_table", "SinusoidalPositions"]


def sinusoidal_table(positions: torch.Tensor, dim: int, base: float = 10000.0) -> torch.Tensor:
    """``[*positions.shape, dim]`` float32: sin on the even channels, cos on the odd ones (``dim`` even)."""
    if dim % 2:
        raise ValueError(_("sinusoidal positions pair the channels (sin, cos): dim must be even, got dim={dim}").format(dim=dim))
    theta = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim)  # [D/2]
    angles = positions.to(torch.float32)[..., None] * theta  # [..., D/2]
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)  # [..., D]: sin, cos, sin, cos, …


class SinusoidalPositions(nn.Module):
    """``positions [T] or [B, T] -> [T, D] or [B, T, D]`` from a cached float32 table (no parameters, no state_dict
    entries), grown (doubling) when a later position is asked for."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self._table = sinusoidal_table(torch.arange(64), dim)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        last = int(positions.max()) if positions.numel() else 0
        if self._table.size(0) <= last or self._table.device != positions.device:
            with torch.inference_mode(False):  # a plain tensor, usable by autograd later
                self._table = sinusoidal_table(torch.arange(1 << max(last, 63).bit_length(), device=positions.device), self.dim)
        return self._table[positions]

    def extra_repr(self) -> str:
        return f"dim={self.dim}"
