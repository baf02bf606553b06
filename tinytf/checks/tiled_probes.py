"""Inputs for the tiled-attention diagnoses: scores whose row maximum sits in the first key tile or grows
tile after tile, masks whose first key tile or whole rows are blocked, and the references.

A query row's maximum decides whether the online softmax must rescale: when the first tile already
holds it, ``exp(m - m_new) = 1`` and code that forgets the rescaling is still right; when every later
tile raises it, that code is wrong. Probing both tells the mistakes apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..attention import scaled_dot_product_attention
from ..masks import causal_mask
from ..translation import N_
from ..translation import gettext as _

__all__ = ["TiledProbe", "ordered_qkv", "reference", "causal_reference", "tile_count", "left_padding", "empty_rows"]

# the kinds of probe, named in every finding's "where"
_KINDS = (N_("one tile"), N_("falling"), N_("rising"), N_("random"), N_("padding"), N_("left padding"), N_("empty rows"))


@dataclass
class TiledProbe:
    """One call: q ``[B, H, Tq, d]``, k ``[B, H, Tk, d]``, v ``[B, H, Tk, dv]``, mask (or None) and the tile sizes."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    mask: torch.Tensor | None
    block_q: int
    block_k: int
    kind: str  # one of _KINDS (data; said in the student's language by where())

    def where(self) -> str:
        m = _(", mask {mask_shape}").format(mask_shape=list(self.mask.shape)) if self.mask is not None else ""
        return (_("for q {q_shape}, k {k_shape}{m}, block_q={block_q}, block_k={block_k} ({kind})")
            .format(q_shape=list(self.q.shape), k_shape=list(self.k.shape), m=m, block_q=self.block_q, block_k=self.block_k,
                kind=_(self.kind)))


def ordered_qkv(shape: tuple[int, int, int, int, int, int], gen: torch.Generator, order: str) -> tuple[torch.Tensor, ...]:
    """q, k, v of ``shape = (B, H, Tq, Tk, d, dv)`` whose scores rise (``order="rising"``: every later key
    scores higher for every query, so each key tile raises the row maximum) or fall (``"falling"``: the
    first key scores highest) along the keys, plus a little noise; ``"random"``: plain ``randn``."""
    b, h, tq, tk, d, dv = shape
    q, k, v = torch.randn(b, h, tq, d, generator=gen), torch.randn(b, h, tk, d, generator=gen), torch.randn(b, h, tk, dv, generator=gen)
    if order == "random":
        return q, k, v
    q, k = q * 0.05, k * 0.05  # the noise
    q[..., 0] = 1.0 + torch.rand(b, h, tq, generator=gen)  # every query points the same way, a_i in [1, 2)
    ramp = torch.linspace(-3.0, 3.0, tk) * math.sqrt(d)  # score_ij ~ a_i * ramp_j / sqrt(d)
    k[..., 0] = ramp if order == "rising" else ramp.flip(0)
    return q, k, v


def reference(p: TiledProbe) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(d), masked) v ``[B, H, Tq, dv]``; a row that may see nothing is zeros."""
    return scaled_dot_product_attention(p.q, p.k, p.v, p.mask)


def causal_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """End-aligned causal attention ``[B, H, Tq, dv]`` (query i sees keys ``0 .. Tk - Tq + i``)."""
    return scaled_dot_product_attention(q, k, v, causal_mask(q.size(-2), k.size(-2)))


def tile_count(t_q: int, t_k: int, block_q: int, block_k: int) -> int:
    """Tiles a causal tiled attention computes: per query block, the key blocks before ``Tk - Tq + q1``."""
    total = 0
    for q0 in range(0, t_q, block_q):
        end = min(t_k, t_k - t_q + min(q0 + block_q, t_q))
        total += math.ceil(end / block_k)
    return total


def left_padding(b: int, tk: int, blocked: int) -> torch.Tensor:
    """A key mask ``[B, 1, 1, Tk]`` that blocks the first ``blocked`` keys of every sequence (left padding)."""
    allowed = torch.ones(b, 1, 1, tk, dtype=torch.bool)
    allowed[..., :blocked] = False
    return allowed


def empty_rows(b: int, tq: int, tk: int, gen: torch.Generator) -> torch.Tensor:
    """A mask ``[B, 1, Tq, Tk]`` (random, every row allowed something) with some query rows blocked entirely."""
    allowed = torch.rand(b, 1, tq, tk, generator=gen) < 0.6
    allowed[..., 0] = True
    allowed[:, :, ::3, :] = False  # rows 0, 3, 6, ... may see nothing: their output must be zeros
    return allowed
