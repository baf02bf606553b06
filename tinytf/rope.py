"""Rotary position embedding (RoPE, Su et al. 2021, "RoFormer"): q and k rotated by their position, v never.

    pair i of a head's first r channels (r = rotary_dim <= d_head) turns by the angle  position · θ_i,
    θ_i = base^(-2i / r),  i = 0 … r/2 - 1   (θ_0 = 1 rad per token: fast; θ_{r/2-1} ≈ 1/base: slow)

    (x_a, x_b) -> (x_a cos φ - x_b sin φ,  x_b cos φ + x_a sin φ)

A rotation keeps lengths and turns q_m and k_n by m·θ and n·θ, so ``q_m · k_n`` depends on ``m - n`` only:
relative positions without a single parameter. Which two channels form pair ``i`` is the **layout**:

    "half"        (GPT-NeoX, Llama, Hugging Face's rotate_half):  channels (i, i + r/2)
    "interleaved" (RoFormer, GPT-J, Meta's complex numbers):      channels (2i, 2i + 1)

Both rotate the same pairs once the channels are renamed, so a checkpoint converts from one to the other by
permuting the rows of ``W_q`` and ``W_k`` inside each head (:func:`interleaved_to_half`); loading one layout's
weights into the other's code runs without an error and computes something else.

Past the trained length (``max_tokens``) the slow pairs turn by angles never seen in training. Three ways to
stretch a trained model (``rope_scaling`` with ``rope_factor = s``): **linear** position interpolation (Chen et al.
2023: every θ_i / s), **ntk**-aware base scaling (base · s^(r/(r-2)): the fast pairs stay, the slow ones are
interpolated) and **yarn** (Peng et al. 2023: NTK-by-parts, pairs that turn more than 32 times in the trained
length kept, fewer than once interpolated, a ramp between, and cos/sin scaled by 0.1·ln s + 1).

The angles are computed in float32 (:func:`rope_tables`): at position 4096 an angle in bfloat16 is off by whole
radians. Tables are cast to the dtype of q and k only when applied, as Hugging Face does.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import ModelConfig
from .translation import gettext as _

__all__ = ["rope_frequencies", "rope_tables", "rotate_half", "rotate_pairs", "apply_rope", "interleaved_to_half",
           "half_order", "RotaryEmbedding"]


def rope_frequencies(rotary_dim: int, base: float = 10000.0, *, scaling: str | None = None, factor: float = 1.0,
                     trained: int | None = None) -> tuple[torch.Tensor, float]:
    """θ ``[rotary_dim / 2]`` (float32, radians per token) and the attention factor that multiplies cos and sin
    (1.0 except for ``"yarn"``). ``scaling``/``factor``: see the module docstring; ``trained`` is the trained
    length (``"yarn"`` needs it to tell fast pairs from slow ones)."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim  # 2i / r
    if scaling == "ntk":
        base = base * factor ** (rotary_dim / (rotary_dim - 2))  # the slowest pair ends up interpolated by exactly `factor`
    theta = 1.0 / base ** exponents  # [r/2]
    if scaling == "linear":
        return theta / factor, 1.0
    if scaling != "yarn" or factor == 1.0:
        return theta, 1.0
    if trained is None:
        raise ValueError(_("rope_scaling='yarn' needs the trained length (trained=max_tokens) to tell fast pairs from slow ones"))

    def pair_turning(turns: float) -> float:  # the pair index i whose θ_i turns `turns` times over `trained` tokens
        return rotary_dim * math.log(trained / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(math.floor(pair_turning(32.0)), 0), min(math.ceil(pair_turning(1.0)), rotary_dim - 1)
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float32) - low) / max(high - low, 1e-3)).clamp(0, 1)  # 0 fast … 1 slow
    return theta * (1 - ramp) + theta / factor * ramp, 0.1 * math.log(factor) + 1.0


def rope_tables(positions: torch.Tensor, theta: torch.Tensor, layout: str = "half",
                attention_factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin ``[*positions.shape, r]`` in float32 for integer ``positions`` (any shape) and θ ``[r / 2]``.

    The angle of pair i is ``position · θ_i``, laid out as the pairs are: ``[φ_0 … φ_{r/2-1}, φ_0 … φ_{r/2-1}]`` for
    ``"half"``, ``[φ_0, φ_0, φ_1, φ_1, …]`` for ``"interleaved"``."""
    angles = positions.to(torch.float32)[..., None] * theta.to(device=positions.device, dtype=torch.float32)  # [..., r/2]
    angles = torch.cat([angles, angles], dim=-1) if layout == "half" else angles.repeat_interleave(2, dim=-1)  # [..., r]
    return angles.cos() * attention_factor, angles.sin() * attention_factor


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x_a, x_b] -> [-x_b, x_a]`` over the last axis split in two halves: a quarter turn of every pair (i, i + r/2)."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """``[x_0, x_1, x_2, x_3, …] -> [-x_1, x_0, -x_3, x_2, …]``: a quarter turn of every pair (2i, 2i + 1)."""
    pairs = x.unflatten(-1, (-1, 2))  # [..., r/2, 2]
    return torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "half") -> torch.Tensor:
    """``x [..., T, d]`` with its first ``r`` channels rotated: ``x·cos + quarter_turn(x)·sin``; the other ``d - r``
    channels pass unchanged (partial rotary). ``cos``, ``sin`` ``[T, r]`` (or broadcastable, e.g. ``[B, 1, T, r]``)
    from :func:`rope_tables`, cast here to x's dtype."""
    r = cos.size(-1)
    if r > x.size(-1) or r % 2:
        raise ValueError(_("apply_rope: the tables rotate {r} channels but x {x_shape} has {d} per head: build them with an even "
                           "rotary_dim <= d_head").format(r=r, x_shape=list(x.shape), d=x.size(-1)))
    turn = rotate_half if layout == "half" else rotate_pairs
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    if r == x.size(-1):
        return x * cos + turn(x) * sin
    x_rot, x_pass = x[..., :r], x[..., r:]
    return torch.cat([x_rot * cos + turn(x_rot) * sin, x_pass], dim=-1)


def half_order(head_dim: int, rotary_dim: int | None = None) -> torch.Tensor:
    """Channel order ``[head_dim]`` that turns an interleaved head into a half-split one: ``[0, 2, 4, …, r-2, 1, 3, …, r-1,
    r, …, d-1]`` (new channel c reads old channel ``order[c]``); the channels past ``rotary_dim`` keep their place."""
    r = head_dim if rotary_dim is None else rotary_dim
    return torch.cat([torch.arange(0, r, 2), torch.arange(1, r, 2), torch.arange(r, head_dim)])


def interleaved_to_half(w: torch.Tensor, heads: int, head_dim: int, rotary_dim: int | None = None) -> torch.Tensor:
    """Rows of a projection ``[heads·d_head, ...]`` (a ``W_q`` or ``W_k`` block, weight or bias) trained with the
    interleaved layout, permuted inside every head by :func:`half_order`: the half-split layout then computes exactly
    the same attention. (Llama's conversion script from Meta's checkpoints does this permutation.)"""
    if w.size(0) != heads * head_dim:
        raise ValueError(_("interleaved_to_half: expected {n} rows (heads={heads} · d_head={head_dim}), got {w_shape}")
                         .format(n=heads * head_dim, heads=heads, head_dim=head_dim, w_shape=list(w.shape)))
    order = half_order(head_dim, rotary_dim).to(w.device)
    return w.unflatten(0, (heads, head_dim))[:, order].flatten(0, 1)


class RotaryEmbedding(nn.Module):
    """Rotates q ``[B, H, T, d]`` and k ``[B, kv_heads, T, d]`` at their absolute positions (a config's RoPE fields).

    Holds no parameters and no state_dict entries: θ and the cos/sin tables are float32 attributes, built for the
    first positions asked for and grown (doubling) when a longer sequence comes, on the device of the input; so
    ``model.to(torch.bfloat16)`` never lowers the precision of the angles."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.layout, self.rotary_dim = config.rope_layout, config.rotary_width
        self.theta, self.attention_factor = rope_frequencies(config.rotary_width, config.rope_base, scaling=config.rope_scaling,
                                                             factor=config.rope_factor, trained=config.max_tokens)
        self._cos = self._sin = torch.empty(0, config.rotary_width)

    def tables(self, start: int, t: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin ``[t, r]`` (float32) of positions ``start … start + t - 1``: slices of the cached tables."""
        if self._cos.size(0) < start + t or self._cos.device != device:
            n = 1 << max(start + t - 1, 63).bit_length()  # a power of two >= start + t, at least 64
            with torch.inference_mode(False):  # plain tensors, usable later by autograd even if first built in inference
                self._cos, self._sin = rope_tables(torch.arange(n, device=device), self.theta, self.layout, self.attention_factor)
        return self._cos[start : start + t], self._sin[start : start + t]

    def forward(self, q: torch.Tensor, k: torch.Tensor, start: int = 0,
                positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k rotated at positions ``start … start + T - 1`` (a decode step after ``past`` cached tokens: ``start = past``),
        at ``positions`` ``[T]`` (the same for every sequence, in any order: e.g. the global positions of a rank's share
        of a split sequence, :func:`tinytf.layout_positions`), or at ``positions`` ``[B, T]`` (one row per sequence, e.g.
        a left-padded batch)."""
        if positions is None:
            cos, sin = self.tables(start, q.size(-2), q.device)  # [T, r]
        elif positions.dim() == 1:  # rows of the cached tables: the very numbers a single process rotates by
            cos, sin = (t[positions] for t in self.tables(0, int(positions.max()) + 1, q.device))  # [T, r]
        else:
            cos, sin = rope_tables(positions, self.theta, self.layout, self.attention_factor)  # [B, T, r]
            cos, sin = cos[:, None], sin[:, None]  # [B, 1, T, r]: the same for every head
        both = apply_rope(torch.cat([q, k], dim=1), cos, sin, self.layout)  # the same angles for q and k: one rotation
        return both.split([q.size(1), k.size(1)], dim=1)

    def extra_repr(self) -> str:
        return f"rotary_dim={self.rotary_dim}, layout={self.layout!r}"
