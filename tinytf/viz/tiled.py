"""The online-softmax stepper: one query row of :func:`tinytf.tiled_attention`, one key tile at a time.

Pure part (testable without a browser):

* :func:`online_softmax_trace` (in :mod:`tinytf.viz.softmax_trace`, re-exported here) runs the
  tiled forward for the query block that holds ``row`` on seeded q, k, v ``[1, 1, T, d]`` — the same
  tiles, masks and updates as :func:`tinytf.tiled_attention` — and records the row's running
  maximum ``m``, running sum ``l`` and output ``acc / l`` after every key tile, next to the exact
  answer and the grid of computed/skipped tiles;
* :func:`online_softmax_figure` draws one step of it: the row's scores with the tiles seen so far,
  ``m`` and ``l`` per step, the output row against the exact one, the error per step, and the
  tile grid; :func:`update_online_softmax_figure` redraws it in place.

Front end: :func:`online_softmax_stepper` (row slider, step slider with a play button, causal
toggle) through :func:`tinytf.viz.interactive_figure`; the static figure when headless.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..translation import N_
from ..translation import gettext as _
from ._front import interactive_figure, recall, remember
from .softmax_trace import SoftmaxTrace, check_row, online_softmax_trace, tile_steps

__all__ = ["SoftmaxTrace", "online_softmax_trace", "tile_steps", "online_softmax_figure", "update_online_softmax_figure",
           "online_softmax_stepper", "GRID_STATES"]

# the tile grid's cell states, in colour-map order
GRID_STATES = (N_("skipped"), N_("computed (other query blocks)"), N_("done for this row"), N_("current tile"), N_("still to come"))
_GRID_COLORS = ("#eeeeee", "#c6d7ea", "#4c72b0", "#dd8452", "#9fb7d6")
_FLOOR = 1e-10  # errors of exactly 0 are drawn here on the log axis


@dataclass
class _StepperParts:
    """The artists :func:`update_online_softmax_figure` changes, and the structure they were built for."""

    key: tuple  # (T, block_q, block_k, d): another value needs another figure
    axes: dict
    bars: Any  # [T] score bars
    masked: Any  # crosses at the masked keys
    skipped: Any  # the shaded span of keys in skipped tiles
    m_line: Any
    lines: dict  # name -> (faded full trajectory, solid up to the step)
    out_bars: Any  # [d]
    exact_pts: Any
    now: list  # vertical "current step" lines on the per-step axes
    grid: Any
    grid_box: Any  # outline of the row's query block
    title: Any


def _layout(key: tuple) -> tuple[Any, _StepperParts]:
    """Five axes: scores (top, wide), tile grid (top right), m and l, output row, error (bottom)."""
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch, Rectangle

    t, bq, bk, d = key
    fig = plt.figure(figsize=(13, 7))
    gs = fig.add_gridspec(2, 3, width_ratios=(1, 1, 0.9), left=0.06, right=0.85, bottom=0.08, top=0.88, wspace=0.38, hspace=0.4)
    ax = {"scores": fig.add_subplot(gs[0, :2]), "grid": fig.add_subplot(gs[0, 2]), "stats": fig.add_subplot(gs[1, 0]),
          "out": fig.add_subplot(gs[1, 1]), "err": fig.add_subplot(gs[1, 2])}
    ax["l"] = ax["stats"].twinx()
    bars = ax["scores"].bar(range(t), np.zeros(t), width=0.8)
    masked = ax["scores"].scatter([], [], marker="x", color="#8c8c8c", s=18, label=_("masked (future) key"))
    skipped = ax["scores"].axvspan(t, t, color="#eeeeee", zorder=0, label=_("keys of skipped tiles"))
    m_line = ax["scores"].axhline(0, color="#c44e52", ls="--", lw=1.2, label=_("running max m"))
    for b in range(0, t + 1, bk):
        ax["scores"].axvline(b - 0.5, color="#8c8c8c", lw=0.6, alpha=0.6)
    ax["scores"].set(xlim=(-0.5, t - 0.5), xlabel=_("key position (grey lines: tile boundaries)"), ylabel=_("scaled score"))
    ax["scores"].legend(handles=[Patch(color=_GRID_COLORS[2], label=_("keys seen")), Patch(color=_GRID_COLORS[3], label=_("current tile")),
                                 Patch(color=_GRID_COLORS[4], label=_("still to come")), masked, skipped, m_line], fontsize=7, ncol=6,
                        loc="lower left", bbox_to_anchor=(0.0, 1.0), frameon=False)
    lines = {"m": ax["stats"].plot([], [], color="#c44e52", alpha=0.25)[0], "l": ax["l"].plot([], [], color="#55a868", alpha=0.25)[0],
             "err": ax["err"].plot([], [], color="#4c72b0", alpha=0.25)[0], "seen": ax["err"].plot([], [], color="#dd8452", alpha=0.25)[0]}
    labels = {"m": _("m (running max)"), "l": _("l (running sum)"), "err": _("vs the exact answer"), "seen": _("vs attention over keys "
                                                                                                               "seen so far")}
    colors = {"m": "#c44e52", "l": "#55a868", "err": "#4c72b0", "seen": "#dd8452"}
    target = {"m": ax["stats"], "l": ax["l"], "err": ax["err"], "seen": ax["err"]}
    lines = {n: (faded, target[n].plot([], [], marker="o", color=colors[n], ms=4, label=labels[n], ls="--" if n == "seen" else "-")[0])
             for n, faded in lines.items()}
    ax["stats"].set(xlabel=_("key tiles processed"), ylabel="m")
    ax["l"].set_ylabel("l")
    ax["stats"].legend(handles=[lines["m"][1], lines["l"][1]], fontsize=7, loc="lower right")
    ax["err"].set(yscale="log", xlabel=_("key tiles processed"), ylabel=_("max |acc/l − target| (0 drawn at {FLOOR:g})").format(
        FLOOR=_FLOOR))
    ax["err"].legend(fontsize=7, loc="lower left")
    out_bars = ax["out"].bar(range(d), np.zeros(d), color="#4c72b0", label=_("acc / l now"))
    exact_pts = ax["out"].scatter(range(d), np.zeros(d), marker="_", s=300, color="black", zorder=3, label=_("exact output"))
    ax["out"].axhline(0, color="black", lw=0.6)
    ax["out"].set(xlabel=_("output feature"), ylabel=_("value"), xticks=range(d))
    ax["out"].legend(fontsize=7, loc="lower left")
    now = [a.axvline(1, color="#8c8c8c", lw=0.8) for a in (ax["stats"], ax["err"])]
    nq, nk = math.ceil(t / bq), math.ceil(t / bk)
    grid = ax["grid"].imshow(np.zeros((nq, nk)), cmap=ListedColormap(_GRID_COLORS), vmin=-0.5, vmax=len(GRID_STATES) - 0.5)
    box = ax["grid"].add_patch(Rectangle((-0.5, -0.5), nk, 1, fill=False, edgecolor="black", lw=1.5))
    ax["grid"].set(xlabel=_("key block ({bk} keys)").format(bk=bk), ylabel=_("query block ({bq} rows)").format(bq=bq))
    ax["grid"].legend(handles=[Patch(color=c, label=s) for c, s in zip(_GRID_COLORS, map(_, GRID_STATES))], fontsize=7,
                      loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    title = fig.suptitle("", fontsize=10, y=0.995)
    return fig, _StepperParts(key, ax, bars, masked, skipped, m_line, lines, out_bars, exact_pts, now, grid, box, title)


def _grid_states(trace: SoftmaxTrace, step: int) -> Any:
    """The tile grid as indices into :data:`GRID_STATES` ``[q_blocks, k_blocks]``."""
    states = trace.grid.long()  # 0 skipped, 1 computed
    qb = trace.row // trace.block_q
    for j in range(len(trace.tiles)):
        states[qb, j] = 2 if j < step - 1 else 3 if j == step - 1 else 4
    return states.numpy()


def _fill(parts: _StepperParts, trace: SoftmaxTrace, step: int) -> None:
    """Put ``trace`` at ``step`` (tiles processed, 1 … n) into the artists."""
    import numpy as np

    n, s = len(trace.tiles), trace.scores.numpy()
    k0, k1 = trace.tiles[step - 1]
    ok = np.isfinite(s)
    for j, bar in enumerate(parts.bars):
        bar.set_height(s[j] if ok[j] else 0.0)
        bar.set_color(_GRID_COLORS[2] if j < k0 else _GRID_COLORS[3] if j < k1 else _GRID_COLORS[4])
    parts.masked.set_offsets(np.c_[np.nonzero(~ok)[0], np.zeros((~ok).sum())])
    end = trace.tiles[-1][1]
    parts.skipped.set_x(end - 0.5)
    parts.skipped.set_width(len(s) - end)
    m, out = float(trace.m[step - 1]), trace.out[step - 1].numpy()
    parts.m_line.set_ydata([m, m])
    parts.axes["scores"].set_ylim(min(s[ok].min(), 0) - 0.3, s[ok].max() + 0.6)
    xs = np.arange(1, n + 1)
    err = np.maximum((trace.out - trace.exact).abs().amax(-1).numpy(), _FLOOR)
    seen = np.maximum((trace.out - trace.seen).abs().amax(-1).numpy(), _FLOOR)
    for name, ys in (("m", trace.m.numpy()), ("l", trace.l.numpy()), ("err", err), ("seen", seen)):
        faded, solid = parts.lines[name]
        faded.set_data(xs, ys)
        solid.set_data(xs[:step], ys[:step])
    for a, ys in ((parts.axes["stats"], trace.m.numpy()), (parts.axes["l"], trace.l.numpy())):
        pad = 0.1 * (ys.max() - ys.min()) + 0.05
        a.set(xlim=(0.5, n + 0.5), ylim=(ys.min() - pad, ys.max() + pad))
    parts.axes["err"].set(xlim=(0.5, n + 0.5), ylim=(_FLOOR / 3, max(err.max(), seen.max()) * 3))
    for line in parts.now:
        line.set_xdata([step, step])
    for bar, y in zip(parts.out_bars, out):
        bar.set_height(y)
    parts.exact_pts.set_offsets(np.c_[np.arange(len(out)), trace.exact.numpy()])
    both = np.r_[trace.out.numpy().ravel(), trace.exact.numpy()]
    parts.axes["out"].set_ylim(min(both.min(), 0) * 1.15 - 0.05, max(both.max(), 0) * 1.15 + 0.05)
    parts.grid.set_data(_grid_states(trace, step))
    parts.grid_box.set_y(trace.row // trace.block_q - 0.5)
    st = trace.stats
    parts.axes["grid"].set_title(_("{st_computed} computed, {st_skipped} skipped of {st_total} tiles").format(st_computed=st.computed,
        st_skipped=st.skipped, st_total=st.total), fontsize=9, y=1.0)
    parts.title.set_text(_("query row {trace_row} ({value}): after key tile {step} of {n} (keys {k0}–{value2}): m = {m:.3f}, l = "
                           "{trace_l:.3f}, max |acc/l − exact| = {value_abs_max:.2e}").format(trace_row=trace.row,
                               value=_('causal') if trace.causal else _('no mask'), step=step, n=n, k0=k0, value2=k1 - 1, m=m,
                               trace_l=float(trace.l[step - 1]), value_abs_max=float((trace.out[step - 1] - trace.exact).abs().max())))


def _step(trace: SoftmaxTrace, step: int | None) -> int:
    n = len(trace.tiles)
    step = n if step is None else step
    if not 1 <= step <= n:
        raise ValueError(_("step must lie in [1, {n}]: query row {trace_row}'s block computes {n} key tiles, got step={step}").format(
            n=n, trace_row=trace.row, step=step))
    return step


def online_softmax_figure(row: int = 37, *, step: int | None = None, T: int = 64, block_k: int = 8, block_q: int | None = None,
                          causal: bool = True, d: int = 8, seed: int = 0) -> Any:
    """One step of the online softmax for query row ``row`` (a matplotlib Figure; nothing is shown).

    ``step`` = key tiles processed so far, 1 … n (default n: the finished row). See
    :func:`online_softmax_trace` for the other options; :func:`update_online_softmax_figure` redraws it.
    """
    trace = online_softmax_trace(row, T=T, block_k=block_k, block_q=block_q, causal=causal, d=d, seed=seed)
    step = _step(trace, step)
    fig, parts = _layout((T, trace.block_q, block_k, d))
    _fill(parts, trace, step)  # the layout is fixed by the grid spec: no tight_layout pass (it costs more than the drawing)
    return remember(fig, parts)


def update_online_softmax_figure(fig: Any, row: int = 37, *, step: int | None = None, T: int = 64, block_k: int = 8,
                                 block_q: int | None = None, causal: bool = True, d: int = 8, seed: int = 0) -> bool:
    """Redraw an :func:`online_softmax_figure` in place (same keywords).

    Returns False, leaving ``fig`` unchanged, when ``T``, the blocks or ``d`` differ or ``fig`` is no
    stepper figure; raises ``ValueError`` like :func:`online_softmax_figure`, before any change.
    """
    trace = online_softmax_trace(row, T=T, block_k=block_k, block_q=block_q, causal=causal, d=d, seed=seed)
    step = _step(trace, step)
    parts = recall(fig)
    if not isinstance(parts, _StepperParts) or parts.key != (T, trace.block_q, block_k, d):
        return False
    _fill(parts, trace, step)
    return True


def online_softmax_stepper(row: int = 37, *, step: int | None = None, T: int = 64, block_k: int = 8, block_q: int | None = None,
                           causal: bool = True, d: int = 8, seed: int = 0) -> Any:
    """Interactive :func:`online_softmax_figure`: query row, key tiles processed (slider + play), causal.

    In JupyterLab this shows live controls and returns the ipywidgets container; when headless
    (``TINYTF_HEADLESS=1``, papermill, nbval, CI) it shows the static figure and returns it.
    """
    import ipywidgets as widgets

    bq = block_k if block_q is None else block_q
    check_row(row, T, bq, block_k, d)
    n = tile_steps(row, T, bq, block_k, causal)
    step = _step(online_softmax_trace(row, T=T, block_k=block_k, block_q=bq, causal=causal, d=d, seed=seed), step)
    controls = {
        "row": widgets.IntSlider(value=row, min=0, max=T - 1, description=_("query row"), continuous_update=False),
        "step": widgets.IntSlider(value=step, min=1, max=n, description=_("key tiles"), continuous_update=False),
        "causal": widgets.Checkbox(value=causal, description=_("causal mask")),
    }
    play = widgets.Play(value=step, min=1, max=n, interval=800, description=_("play"))
    widgets.jslink((play, "value"), (controls["step"], "value"))

    def sync_steps(_change: dict) -> None:  # the row's block decides how many tiles there are; runs before the redraw
        steps = tile_steps(controls["row"].value, T, bq, block_k, controls["causal"].value)
        controls["step"].max = play.max = steps

    for name in ("row", "causal"):
        controls[name].observe(sync_steps, names="value")
    return interactive_figure(online_softmax_figure, controls, fixed={"T": T, "block_k": block_k, "block_q": bq, "d": d, "seed": seed},
                              update_fn=update_online_softmax_figure, layout=lambda boxes: widgets.HBox([play, *boxes]))
