"""RoPE's long-range decay (RoFormer, Su et al. 2021, figure 2), drawn from the rotation itself, and its widget.

For a query and a key that are the same vector of ones, the rotated score ``q_m · k_n`` is
``Σ_i 2 cos((m - n) θ_i)``: every pair turns by its own angle per token, and the further apart two tokens are,
the less the turns agree. RoFormer bounds the score of any q, k by ``max_j |h_{j+1} - h_j| · Σ_j |S_j|`` with
``S_j = Σ_{i<j} e^{i (m-n) θ_i}``; the figure draws ``Σ_j |S_j|`` divided by its value at distance 0 (the relative
upper bound) next to the score of aligned q and k (also 1 at distance 0), both against the distance ``m - n``.
A larger base turns the slow pairs slower: the decay stretches to longer distances.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..rope import rope_frequencies
from ..translation import gettext as _
from ._front import choices, interactive_figure

__all__ = ["rope_decay", "rope_decay_figure", "rope_decay_explorer"]

BASES = (100.0, 1000.0, 10000.0, 100000.0, 500000.0)


def rope_decay(distances: np.ndarray, base: float = 10000.0, rotary_dim: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """``(bound, aligned)`` over ``distances`` ``[N]``: RoFormer's upper bound ``Σ_j |S_j|`` over its value at distance 0, and
    the score of aligned q = k = ones, ``(2/r) Σ_i cos(distance · θ_i)``; both are 1 at distance 0."""
    theta = rope_frequencies(rotary_dim, base)[0].double().numpy()  # [r/2]
    turns = np.exp(1j * np.outer(distances, theta))  # [N, r/2]
    partial = np.cumsum(turns, axis=1)  # S_1 … S_{r/2}
    half = rotary_dim // 2
    bound = np.abs(partial).sum(axis=1) / (half * (half + 1) / 2)  # at distance 0, |S_j| = j: Σ_j j
    aligned = turns.real.sum(axis=1) / (rotary_dim // 2)
    return bound, aligned


def rope_decay_figure(*, base: float = 10000.0, rotary_dim: int = 128, max_distance: int = 4096,
                      compare: Sequence[float] = (10000.0,)) -> Any:
    """The two curves of :func:`rope_decay` for ``base`` (bold) and the relative bound of each base of ``compare``
    (thin), against the distance on a log axis up to ``max_distance``."""
    import matplotlib.pyplot as plt

    distances = np.unique(np.round(np.geomspace(1, max_distance, 400)).astype(int))
    fig, ax = plt.subplots(figsize=(7.2, 3.6))
    others = [b for b in compare if b != base]
    for other, color in zip(others, ("tab:green", "tab:purple", "tab:orange", "tab:brown", "tab:olive")):
        ax.plot(distances, rope_decay(distances, other, rotary_dim)[0], lw=1, alpha=0.7, color=color,
                label=_("upper bound, base {base:,.0f}").format(base=other))
    bound, aligned = rope_decay(distances, base, rotary_dim)
    ax.plot(distances, bound, lw=2.2, color="tab:red", label=_("upper bound, base {base:,.0f}").format(base=base))
    ax.plot(distances, aligned, lw=1.0, color="black", ls="--", label=_("score of aligned q, k (base {base:,.0f})").format(base=base))
    ax.set_xscale("log")
    ax.axhline(0, color="grey", lw=0.6)
    ax.set(xlabel=_("relative distance m - n (tokens)"), ylabel=_("relative score"),
           title=_("RoPE's long-range decay (d = {d})").format(d=rotary_dim))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return fig


def rope_decay_explorer(*, base: float = 10000.0, rotary_dim: int = 128, **fixed: Any) -> Any:
    """Interactive :func:`rope_decay_figure`: the base (dropdown) and the rotary width. Headless: the static figure."""
    import ipywidgets as widgets

    controls = {
        "base": widgets.Dropdown(options=[(f"{b:,.0f}", b) for b in choices(base, BASES)], value=base, description=_("base"),
                                 layout=widgets.Layout(width="200px")),
        "rotary_dim": widgets.Dropdown(options=choices(rotary_dim, [16, 32, 64, 128, 256]), value=rotary_dim, description="d",
                                       layout=widgets.Layout(width="150px")),
    }
    return interactive_figure(rope_decay_figure, controls, fixed=fixed)
