"""Where attention stops being finite: dtype × head width × activation scale.

Pure part: :func:`finite_figure` draws, for fp32, bf16 and fp16 side by side, the map of
:func:`tinytf.precision.finite_map` (scores and softmax weights finite, weights not finite, scores not
finite) over head widths ``d`` and activation scales ``σ`` (q, k = σ · N(0, 1)), with the boundaries
the formulas predict drawn over it; :func:`update_finite_figure` redraws it in place.

Front end: :func:`finite_explorer` (scaling, softmax with or without the max, T) through
:func:`tinytf.viz.interactive_figure`; the static figure when headless.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..precision import FINITE_STATES, SCALINGS, finite_map, overflow_limit
from ..translation import N_
from ..translation import gettext as _
from ._front import interactive_figure, recall, remember

__all__ = ["finite_figure", "update_finite_figure", "finite_explorer", "WIDTHS", "SCALES", "DTYPES", "predicted_boundaries"]

WIDTHS = (16, 32, 64, 128, 256)
SCALES = tuple(2.0 ** (i / 3) for i in range(-3, 25))  # σ = 0.5 … 256, three steps per octave
DTYPES = ("fp32", "bf16", "fp16")
_COLORS = ("#d9f0d3", "#fdae61", "#d7191c")  # finite, weights not finite, scores not finite
# k^T, not kᵀ: the CJK fonts of the Chinese edition have no modifier-letter T
_SCALING_WORDS = {"none": N_("no 1/sqrt(d)"), "after": N_("(q @ k^T) / sqrt(d)"), "before": N_("(q / sqrt(d)) @ k^T")}


@functools.lru_cache(maxsize=64)
def _map(dtype: str, widths: tuple[int, ...], scales: tuple[float, ...], scaling: str, safe: bool, tokens: int) -> Any:
    return finite_map(dtype, widths, scales, scaling=scaling, safe_softmax=safe, tokens=tokens).numpy()


@functools.lru_cache(maxsize=64)
def _peak(d: int, tokens: int) -> float:
    """``max |q0 k0ᵀ|`` of finite_map's seeded unit-normal inputs for width ``d`` (seed 0, one head)."""
    g = torch.Generator().manual_seed(0)
    q0, k0 = torch.randn(1, 1, tokens, d, generator=g), torch.randn(1, 1, tokens, d, generator=g)
    return (q0.double() @ k0.double().transpose(-2, -1)).abs().max().item()


def predicted_boundaries(dtype: str, widths: Sequence[int], scaling: str, tokens: int) -> tuple[list[float], list[float]]:
    """Per width, the predicted ``σ`` where the scores overflow (``sqrt(limit · c / max|q0 k0ᵀ|)``, c = sqrt(d) when q
    is scaled first) and where ``exp`` of the largest scaled score overflows without the max (``ln(limit)``)."""
    limit = overflow_limit(dtype)
    scores, weights = [], []
    for d in widths:
        peak, scale = _peak(d, tokens), (1.0 if scaling == "none" else 1 / math.sqrt(d))
        scores.append(math.sqrt(limit * (math.sqrt(d) if scaling == "before" else 1.0) / peak))
        weights.append(math.sqrt(math.log(limit) / (peak * scale)))
    return scores, weights


@dataclass
class _Parts:
    key: tuple
    meshes: list
    score_lines: list
    weight_lines: list
    titles: list
    suptitle: Any


def _edges(values: Sequence[float]) -> list[float]:
    """Cell edges on a log axis: geometric midpoints, extended half a step at both ends."""
    logs = [math.log(v) for v in values]
    mids = [(a + b) / 2 for a, b in zip(logs, logs[1:])]
    return [math.exp(x) for x in [2 * logs[0] - mids[0], *mids, 2 * logs[-1] - mids[-1]]]


def _layout(widths: tuple[int, ...], scales: tuple[float, ...]) -> tuple[Any, _Parts]:
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    fig, axes = plt.subplots(1, len(DTYPES), figsize=(13, 3.6), sharey=True)
    fig.subplots_adjust(left=0.06, right=0.98, top=0.82, bottom=0.24, wspace=0.08)
    xs, ys = _edges(scales), np.arange(len(widths) + 1) - 0.5
    meshes, score_lines, weight_lines, titles = [], [], [], []
    for ax in axes:
        meshes.append(ax.pcolormesh(xs, ys, np.zeros((len(widths), len(scales))), cmap=ListedColormap(_COLORS), vmin=-0.5, vmax=2.5))
        score_lines.append(ax.plot([], [], "k--", lw=1.4)[0])
        weight_lines.append(ax.plot([], [], "k:", lw=1.6)[0])
        ax.set_xscale("log", base=2)
        ax.set_xlabel(_("activation scale σ (q, k = σ · N(0, 1))"))
        titles.append(ax.set_title(""))
    axes[0].set_yticks(range(len(widths)), [str(w) for w in widths])
    axes[0].set_ylabel(_("head width d"))
    handles = [Patch(color=c, label=_(s)) for c, s in zip(_COLORS, FINITE_STATES)]
    handles += [Line2D([], [], color="k", ls="--", label=_("predicted: q @ k^T overflows")),
                Line2D([], [], color="k", ls=":", label=_("predicted: exp overflows without the max"))]
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.0), ncol=5, fontsize=8, frameon=False)
    return fig, _Parts((widths, scales), meshes, score_lines, weight_lines, titles, fig.suptitle("", fontsize=10))


def _fill(parts: _Parts, scaling: str, safe: bool, tokens: int) -> None:
    widths, scales = parts.key
    rows = range(len(widths))
    for i, dtype in enumerate(DTYPES):
        grid = _map(dtype, widths, scales, scaling, safe, tokens)
        parts.meshes[i].set_array(grid.ravel())
        scores, weights = predicted_boundaries(dtype, widths, scaling, tokens)
        inside = [(s, r) for s, r in zip(scores, rows) if s <= scales[-1]]
        parts.score_lines[i].set_data([s for s, _r in inside], [r for _s, r in inside])
        shown = [] if safe else [(w, r) for w, r in zip(weights, rows) if w <= scales[-1]]
        parts.weight_lines[i].set_data([w for w, _r in shown], [r for _w, r in shown])
        finite = int((grid == 0).sum())
        parts.titles[i].set_text(_("{dtype}: {finite} of {cells} cells finite").format(dtype=dtype, finite=finite, cells=grid.size))
    softmax = _("softmax (max subtracted)") if safe else _("softmax without the max")
    parts.suptitle.set_text(_("where attention stops being finite: scores {scaling}, {softmax}, T = {tokens}").format(
        scaling=_(_SCALING_WORDS[scaling]), softmax=softmax, tokens=tokens))


def _check(scaling: str, tokens: int) -> None:
    if scaling not in SCALINGS:
        raise ValueError(_("scaling must be one of {scalings}, got {scaling!r}").format(scalings=SCALINGS, scaling=scaling))
    if tokens < 2:
        raise ValueError(_("tokens must be at least 2, got {tokens}").format(tokens=tokens))


def finite_figure(scaling: str = "after", safe_softmax: bool = False, tokens: int = 128, *, widths: Sequence[int] = WIDTHS,
                  scales: Sequence[float] = SCALES) -> Any:
    """The finite/not-finite maps of fp32, bf16 and fp16 side by side (a matplotlib Figure; nothing is shown)."""
    _check(scaling, tokens)
    fig, parts = _layout(tuple(widths), tuple(scales))
    _fill(parts, scaling, safe_softmax, tokens)
    return remember(fig, parts)


def update_finite_figure(fig: Any, scaling: str = "after", safe_softmax: bool = False, tokens: int = 128, *,
                         widths: Sequence[int] = WIDTHS, scales: Sequence[float] = SCALES) -> bool:
    """Redraw a :func:`finite_figure` in place; False (``fig`` unchanged) when the widths or scales differ."""
    _check(scaling, tokens)
    parts = recall(fig)
    if not isinstance(parts, _Parts) or parts.key != (tuple(widths), tuple(scales)):
        return False
    _fill(parts, scaling, safe_softmax, tokens)
    return True


def finite_explorer(scaling: str = "after", safe_softmax: bool = False, tokens: int = 128, **fixed: Any) -> Any:
    """Interactive :func:`finite_figure`: how the scores are scaled, the softmax with or without the max, T.
    Live in JupyterLab (returns the widget box); headless it shows and returns the static figure."""
    import ipywidgets as widgets

    controls = {
        "scaling": widgets.ToggleButtons(options=[(_(_SCALING_WORDS[s]), s) for s in SCALINGS], value=scaling,
                                         description=_("scores"), style={"button_width": "150px"}),
        "safe_softmax": widgets.ToggleButtons(options=[(_("without the max"), False), (_("max subtracted"), True)],
                                              value=safe_softmax, description="softmax", style={"button_width": "120px"}),
        "tokens": widgets.Dropdown(options=sorted({32, 128, 256, tokens}), value=tokens, description="T",
                                   layout=widgets.Layout(width="130px")),
    }
    return interactive_figure(finite_figure, controls, fixed=fixed, update_fn=update_finite_figure)
