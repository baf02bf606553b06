"""Memory curves as the context grows: the :func:`tinytf.memory.ledger` components stacked against T.

:func:`memory_figure` is pure (arguments in, matplotlib Figure out); :func:`memory_explorer` adds
ipywidgets controls (B, H, D, layers, dtype, training vs inference, explicit, fused or tiled attention,
device capacity) through :func:`tinytf.viz.interactive_figure`, or shows the static figure when
headless. Measured points (bytes at some T) can be overlaid on the predicted total.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..lm import ModelConfig
from ..memory import ATTENTION_PATHS, GiB, Ledger, dtype_bytes, format_bytes, ledger
from ..translation import N_
from ..translation import gettext as _
from ._front import choices, interactive_figure, keep_legend, log_axes, recall, remember

__all__ = ["token_grid", "memory_curves", "capacity_crossing", "memory_figure", "update_memory_figure", "memory_explorer", "CAPACITIES_GIB"]

CAPACITIES_GIB = (24, 80, 141)  # a consumer GPU, an A100/H100 80 GB, an H200
COLORS = {
    "parameters": "#4c72b0", "gradients": "#55a868", "optimizer_state": "#8172b2", "master_weights": "#64b5cd",
    "hidden": "#ccb974", "ffn": "#dd8452", "attention": "#c44e52", "logits": "#937860", "other": "#8c8c8c",
    "kv_cache": "#da8bc3",
}
_DEFAULTS = {"batch": 8, "heads": 16, "dim": 1024, "layers": 24, "vocab": 32000, "expansion": 4, "dtype": "bf16",
             "mode": "training", "attention": "explicit", "optimizer": "adamw", "mixed_precision": False, "capacity_gib": 80,
             "t_min": 128, "t_max": 131072, "measured": None, "measured_label": "measured"}

# the ledger's components as the stacked bands' legend names them (Ledger.COMPONENTS, "_" as a space)
_BANDS = (N_("parameters"), N_("gradients"), N_("optimizer state"), N_("master weights"), N_("hidden"), N_("ffn"), N_("attention"),
          N_("logits"), N_("other"), N_("kv cache"))


def token_grid(t_min: int = 128, t_max: int = 131072, per_octave: int = 4) -> list[int]:
    """Context lengths from ``t_min`` to ``t_max``, ``per_octave`` points per doubling (even integers)."""
    if t_min < 2 or t_max <= t_min:
        raise ValueError(_("need 2 <= t_min < t_max, got t_min={t_min}, t_max={t_max}").format(t_min=t_min, t_max=t_max))
    out, k = [], 0
    while True:
        t = int(round(t_min * 2 ** (k / per_octave) / 2) * 2)
        if t > t_max:
            break
        if not out or t != out[-1]:
            out.append(t)
        k += 1
    return out


def memory_curves(config: ModelConfig, batch: int, tokens: Sequence[int], dtype: Any, **ledger_kwargs: Any) -> list[Ledger]:
    """One :class:`tinytf.memory.Ledger` per context length (a model whose position table has T rows)."""
    return [ledger(ModelConfig(config.vocab, config.dim, config.heads, config.layers, t, config.expansion), batch, t, dtype,
                   **ledger_kwargs) for t in tokens]


def capacity_crossing(ledgers: Sequence[Ledger], capacity_bytes: float) -> int | None:
    """The first context length whose predicted total exceeds ``capacity_bytes`` (None if none does)."""
    for led in ledgers:
        if led.total > capacity_bytes:
            return led.tokens
    return None


@dataclass
class _MemoryParts:
    """The artists :func:`update_memory_figure` changes, and the structure they were built for."""

    key: tuple  # (context grid, components shown, measured points, their label)
    ax: Any
    stacks: list  # one FillBetweenPolyCollection per component
    total: Any
    capacity: Any
    cross: Any
    cross_note: Any


def _memory_data(batch: int, heads: int, dim: int, layers: int, vocab: int, expansion: int, dtype: str, mode: str,
                 attention: str, optimizer: str, mixed_precision: bool, capacity_gib: float, t_min: int, t_max: int,
                 measured: Sequence[tuple[int, float]] | None, measured_label: str) -> dict[str, Any]:
    """The ledger curves and every text of the figure, computed (and validated) before drawing."""
    import numpy as np

    if mode not in ("training", "inference"):
        raise ValueError(_("mode must be 'training' or 'inference', got {mode!r}").format(mode=mode))
    if dim % heads:
        raise ValueError(_("dim={dim} is not divisible by heads={heads}: pick heads among the divisors of {dim}").format(dim=dim,
            heads=heads))
    config = ModelConfig(vocab, dim, heads, layers, t_max, expansion)
    ts = token_grid(t_min, t_max)
    kwargs = {"training": mode == "training", "attention": attention}
    if mode == "training":
        kwargs |= {"optimizer": optimizer, "mixed_precision": mixed_precision}
    leds = memory_curves(config, batch, ts, dtype, **kwargs)
    names = tuple(n for n in Ledger.COMPONENTS if any(getattr(led, n) for led in leds))
    stacks = np.array([[getattr(led, n) / GiB for led in leds] for n in names])
    what = _("{mode}, {attention} attention, {dtype} ({dtype_bytes} B/elem)").format(mode=_(mode), attention=attention, dtype=dtype,
        dtype_bytes=dtype_bytes(dtype)) + (_(", mixed precision") if mixed_precision else "")
    last = leds[-1]
    points = tuple((int(t), float(b)) for t, b in measured) if measured else ()
    return {
        "key": (tuple(ts), names, points, measured_label),
        "ts": ts, "tops": stacks.cumsum(axis=0), "totals": stacks.sum(axis=0), "capacity_gib": capacity_gib,
        "cross": capacity_crossing(leds, capacity_gib * GiB),
        "title": _("B={batch}, H={heads}, D={dim}, layers={layers}, V={vocab}: {what}\nat T={last_tokens:,}: total {format_bytes}, "
                   "attention {format_bytes2}").format(batch=batch, heads=heads, dim=dim, layers=layers, vocab=vocab, what=what,
                       last_tokens=last.tokens, format_bytes=format_bytes(last.total), format_bytes2=format_bytes(last.attention)),
    }


def _memory_layout(key: tuple) -> tuple[Any, _MemoryParts]:
    """Axes, one band per component, the total, the capacity and crossing lines, the measured points."""
    import matplotlib.pyplot as plt

    ts, names, points, measured_label = key
    fig, ax = plt.subplots(figsize=(9, 4.8))
    stacks = [ax.fill_between(ts, 0, 1, facecolor=COLORS[n], alpha=0.85, label=_(n.replace("_", " "))) for n in names]
    total = ax.plot(ts, ts, color="black", lw=1.2, label=_("total (ledger)"))[0]
    capacity = ax.axhline(1, color="#b00020", ls="--", lw=1.3)
    cross = ax.axvline(ts[0], color="#b00020", lw=0.8, alpha=0.7)
    note = ax.annotate("", xy=(ts[0], 1), xytext=(6, 8), textcoords="offset points", color="#b00020", fontsize=9)
    if points:
        mt, mb = zip(*points)
        ax.scatter(mt, [b / GiB for b in mb], color="black", marker="x", s=50, zorder=5, label=measured_label)
    log_axes(ax)
    ax.set_xlim(ts[0], ts[-1])
    ax.set_xlabel(_("context length T (tokens)"))
    ax.set_ylabel(_("GiB (stacked)"))
    ax.grid(True, which="major", alpha=0.3)
    return fig, _MemoryParts(key, ax, stacks, total, capacity, cross, note)


def _memory_fill(parts: _MemoryParts, data: dict[str, Any]) -> None:
    """Put ``data``'s bands, total, capacity, crossing, limits, legend and title into the artists."""
    import numpy as np

    ts, tops, totals, cap, cross = data["ts"], data["tops"], data["totals"], data["capacity_gib"], data["cross"]
    bottoms = np.vstack([np.zeros_like(tops[:1]), tops[:-1]])
    for band, lo, hi in zip(parts.stacks, bottoms, tops):
        band.set_data(ts, lo, hi)
    parts.total.set_ydata(totals)
    parts.capacity.set_ydata([cap, cap])
    parts.capacity.set_label(_("device capacity {cap:g} GiB").format(cap=cap))
    parts.cross.set_visible(cross is not None)
    parts.cross_note.set_visible(cross is not None)
    if cross is not None:
        parts.cross.set_xdata([cross, cross])
        parts.cross_note.xy = (cross, cap)
        parts.cross_note.set_text(_("exceeds {cap:g} GiB\nat T ≈ {cross:,}").format(cap=cap, cross=cross))
    ax = parts.ax
    ax.set_ylim(max(totals.min() / 50, 1e-6), max(totals.max(), cap) * 3)
    ax.set_title(data["title"], fontsize=10, y=1.0)  # y given: no title placement pass at every draw
    keep_legend(ax, fontsize=7, loc="upper left", ncol=2)


def memory_figure(
    *,
    batch: int = 8,
    heads: int = 16,
    dim: int = 1024,
    layers: int = 24,
    vocab: int = 32000,
    expansion: int = 4,
    dtype: str = "bf16",
    mode: str = "training",
    attention: str = "explicit",
    optimizer: str = "adamw",
    mixed_precision: bool = False,
    capacity_gib: float = 80,
    t_min: int = 128,
    t_max: int = 131072,
    measured: Sequence[tuple[int, float]] | None = None,
    measured_label: str = "measured",
) -> Any:
    """Stacked ledger components (GiB) against T on log–log axes, the device capacity as a line,
    the first T whose total crosses it marked, and ``measured`` points ``[(T, bytes), ...]`` overlaid.

    ``mode`` is ``"training"`` (a full AdamW step) or ``"inference"`` (a no-grad prefill with a KV
    cache of T tokens). Raises ``ValueError`` for an impossible configuration (``dim % heads``).
    :func:`update_memory_figure` redraws it for new values.
    """
    data = _memory_data(batch, heads, dim, layers, vocab, expansion, dtype, mode, attention, optimizer, mixed_precision,
                        capacity_gib, t_min, t_max, measured, measured_label)
    fig, parts = _memory_layout(data["key"])
    _memory_fill(parts, data)
    fig.tight_layout()
    return remember(fig, parts)


def update_memory_figure(fig: Any, **options: Any) -> bool:
    """Redraw a :func:`memory_figure` in place for new keyword values (its keywords, same defaults).

    Returns False, leaving ``fig`` unchanged, when the context grid, the components shown (say,
    training vs inference) or the measured points differ, or ``fig`` is no :func:`memory_figure`;
    raises ``ValueError`` like it, before any change."""
    data = _memory_data(**(_DEFAULTS | options))
    parts = recall(fig)
    if not isinstance(parts, _MemoryParts) or parts.key != data["key"]:
        return False
    _memory_fill(parts, data)
    return True


def memory_explorer(
    *,
    batch: int = 8,
    heads: int = 16,
    dim: int = 1024,
    layers: int = 24,
    dtype: str = "bf16",
    mode: str = "training",
    attention: str = "explicit",
    capacity_gib: float = 80,
    **fixed: Any,
) -> Any:
    """Interactive :func:`memory_figure`: B, H, D, layers, dtype, training/inference, explicit/fused,
    device capacity. Other :func:`memory_figure` arguments (``vocab``, ``measured``, ``t_min``,
    ``t_max``, ...) are passed through ``fixed``. Live in JupyterLab (returns the widget box);
    headless it shows and returns the static figure."""
    import ipywidgets as widgets

    capacities = sorted(set(CAPACITIES_GIB) | {capacity_gib})
    controls = {
        "batch": widgets.Dropdown(options=choices(batch, [1, 2, 4, 8, 16, 32, 64]), value=batch, description="B",
                                  layout=widgets.Layout(width="130px")),
        "heads": widgets.Dropdown(options=choices(heads, [1, 2, 4, 8, 12, 16, 32, 64]), value=heads, description="H",
                                  layout=widgets.Layout(width="130px")),
        "dim": widgets.Dropdown(options=choices(dim, [64, 256, 512, 768, 1024, 2048, 4096, 8192]), value=dim, description="D",
                                layout=widgets.Layout(width="150px")),
        "layers": widgets.IntSlider(value=layers, min=1, max=max(96, layers), description=_("layers"), continuous_update=False),
        "dtype": widgets.ToggleButtons(options=["fp32", "bf16", "fp16"], value=dtype, description=_("dtype"),
                                       style={"button_width": "50px"}),
        "mode": widgets.ToggleButtons(options=[(_("training"), "training"), (_("inference"), "inference")],
                                      value=mode, description=_("mode"),
                                      style={"button_width": "80px"}),
        "attention": widgets.ToggleButtons(options=list(ATTENTION_PATHS), value=attention, description=_("attention"),
                                           style={"button_width": "70px"}),
        "capacity_gib": widgets.Dropdown(options=capacities, value=capacity_gib, description="GiB",
                                         layout=widgets.Layout(width="130px")),
    }
    return interactive_figure(memory_figure, controls, fixed=fixed, update_fn=update_memory_figure)
