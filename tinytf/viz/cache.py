"""KV-cache size as the context grows, against device capacity.

    cache bytes = 2 (K and V) · layers · B · kv_heads · T · d_head · bytes per element

(``kv_heads = H`` for multi-head attention; a grouped-query model stores fewer, a sliding window of
W tokens caps T at W.) :func:`cache_figure` is pure (arguments in, matplotlib Figure out) and
:func:`update_cache_figure` redraws one in place; :func:`cache_explorer` adds ipywidgets controls
(B, layers, H, K/V heads, window, d_head, dtype, memory already taken by the weights) through
:func:`tinytf.viz.interactive_figure`, or shows the static figure when headless.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..memory import GiB, dtype_bytes, format_bytes, kv_cache_bytes
from ..translation import gettext
from ..translation import gettext as _
from ._front import choices, interactive_figure, keep_legend, log_axes, recall, remember

__all__ = ["CAPACITIES_GIB", "cache_tokens_that_fit", "cache_figure", "update_cache_figure", "cache_explorer"]

CAPACITIES_GIB = (24, 80, 141)  # a consumer GPU, an A100/H100 80 GB, an H200
_CAP_COLORS = ("#dd8452", "#b00020", "#8172b2")
_DEFAULTS = {"batch": 1, "layers": 32, "heads": 32, "head_dim": 128, "dtype": "fp16", "reserved_gib": 0.0,
             "kv_heads": None, "window": None,
             "capacities_gib": CAPACITIES_GIB, "batches": (1, 8, 64), "t_min": 256, "t_max": 131072}


def cache_tokens_that_fit(
    capacity_bytes: float, *, batch: int, layers: int, heads: int, head_dim: int, dtype: Any, reserved_bytes: float = 0,
    kv_heads: int | None = None,
) -> int:
    """Largest context T (tokens per sequence) whose cache for ``batch`` sequences fits in
    ``capacity_bytes - reserved_bytes`` (0 when not even one token fits); ``kv_heads`` K/V heads stored."""
    per_token = kv_cache_bytes(batch, layers, heads, 1, head_dim, dtype, kv_heads=kv_heads)  # one more token, every sequence
    return max(0, int((capacity_bytes - reserved_bytes) // per_token))


@dataclass
class _CacheParts:
    """The artists :func:`update_cache_figure` changes, and the structure they were built for."""

    key: tuple  # (context grid, thin batches, capacities)
    ax: Any
    bold: Any
    thin: dict  # batch -> (line, its "B=b" label)
    caps: list  # per capacity: (horizontal line, vertical fit line, fit annotation)


def _cache_data(batch: int, layers: int, heads: int, head_dim: int, dtype: str, reserved_gib: float,
                capacities_gib: Sequence[float], batches: Sequence[int], t_min: int, t_max: int,
                kv_heads: int | None = None, window: int | None = None) -> dict[str, Any]:
    """Every curve, line and text of the figure, computed (and validated) before any artist is touched."""
    import numpy as np

    for name, val in (("batch", batch), ("layers", layers), ("heads", heads), ("head_dim", head_dim)):
        if val < 1:
            raise ValueError(_("{name} must be positive, got {val}").format(name=name, val=val))
    if t_min < 1 or t_max <= t_min:
        raise ValueError(_("need 1 <= t_min < t_max, got t_min={t_min}, t_max={t_max}").format(t_min=t_min, t_max=t_max))
    ts = np.unique(np.geomspace(t_min, t_max, 64).round().astype(int))
    kv = {"kv_heads": kv_heads, "window": window}
    stored = kv_heads or heads
    caps = []
    for cap in capacities_gib:
        fit = cache_tokens_that_fit(cap * GiB, batch=batch, layers=layers, heads=heads, head_dim=head_dim, dtype=dtype,
                                    reserved_bytes=reserved_gib * GiB, kv_heads=kv_heads)
        label = _("{cap:g} GiB").format(cap=cap) + (_(" − {reserved_gib:g} GiB weights").format(reserved_gib=reserved_gib)
                                                    if reserved_gib else "")
        if window is not None and fit >= window:  # the rolling cache of `window` tokens fits: so does every T
            fit, label = None, label + _(" (every T fits: window={window:,})").format(window=window)
        caps.append((cap - reserved_gib, label, fit if fit is not None and t_min <= fit <= t_max else None))
    per_tok = kv_cache_bytes(1, layers, heads, 1, head_dim, dtype, kv_heads=kv_heads)
    last = format_bytes(kv_cache_bytes(batch, layers, heads, int(ts[-1]), head_dim, dtype, **kv))
    saving = _(", {value}× smaller than H={heads}").format(value=heads // stored, heads=heads) if stored != heads else ""
    return {
        "key": (tuple(ts), tuple(sorted(set(batches))), tuple(capacities_gib)),
        "ts": ts,
        "gib": {b: np.array([kv_cache_bytes(b, layers, heads, int(t), head_dim, dtype, **kv) for t in ts]) / GiB
                for b in set(batches) | {batch}},
        "batch": batch,
        "caps": caps,
        "title": (_("layers={layers}, H={heads}, K/V heads={stored}, d_head={head_dim}, {dtype} ({dtype_bytes} B/elem): {format_bytes} "
                    "per token per sequence{saving}\n= 2 (K,V) × {layers} × {stored} × {head_dim} × {dtype_bytes} B").format(
                        layers=layers, heads=heads, stored=stored, head_dim=head_dim, dtype=dtype, dtype_bytes=dtype_bytes(dtype),
                        format_bytes=format_bytes(per_tok), saving=saving)
                  + (_(", at most {window:,} tokens (window)").format(window=window) if window is not None else "")
                  + f"; B={batch} at T={ts[-1]:,}: {last}"),
    }


def _cache_layout(key: tuple) -> tuple[Any, _CacheParts]:
    """Axes, one thin curve per batch, the bold curve, and per capacity a line, a fit line and a label."""
    import matplotlib.pyplot as plt

    ts, batches, capacities = key
    fig, ax = plt.subplots(figsize=(9, 4.6))
    thin = {b: (ax.plot(ts, ts, color="#8c8c8c", lw=0.9, alpha=0.7)[0],
                ax.annotate(f"B={b}", xy=(ts[-1], 1), xytext=(3, 0), textcoords="offset points", fontsize=8,
                            color="#6c6c6c", va="center")) for b in batches}
    bold = ax.plot(ts, ts, color="#4c72b0", lw=2.4)[0]
    caps = [(ax.axhline(1, color=color, ls="--", lw=1.2), ax.axvline(1, color=color, lw=0.9, ls=":"),
             ax.annotate("", xy=(1, 1), xytext=(4, 5), textcoords="offset points", fontsize=8, color=color,
                         bbox={"fc": "white", "ec": "none", "alpha": 0.8, "pad": 1}))
            for _, color in zip(capacities, _CAP_COLORS * 3)]
    log_axes(ax)
    ax.set_xlim(ts[0], ts[-1] * 1.6)
    ax.set_xlabel(gettext("context length T (tokens per sequence)"))
    ax.set_ylabel(gettext("KV cache (GiB)"))
    ax.grid(True, which="major", alpha=0.3)
    return fig, _CacheParts(key, ax, bold, thin, caps)


def _cache_fill(parts: _CacheParts, data: dict[str, Any]) -> None:
    """Put ``data``'s curves, capacity lines, fits, legend and title into the artists."""
    batch, gib, ts = data["batch"], data["gib"], data["ts"]
    for b, (line, label) in parts.thin.items():  # the chosen batch is the bold curve, not a thin one
        line.set_ydata(gib[b])
        label.xy = (ts[-1], gib[b][-1])
        line.set_visible(b != batch)
        label.set_visible(b != batch)
    parts.bold.set_ydata(gib[batch])
    parts.bold.set_label(gettext("KV cache, B={batch}").format(batch=batch))
    for (hline, vline, note), (left, label, fit) in zip(parts.caps, data["caps"]):
        room = left > 0  # weights larger than the device: no line for it
        hline.set_visible(room)
        hline.set_ydata([left, left])
        hline.set_label(label if room else "_" + label)
        vline.set_visible(room and fit is not None)
        note.set_visible(room and fit is not None)
        if room and fit is not None:
            vline.set_xdata([fit, fit])
            note.xy = (fit, left)
            note.set_text(f"T ≤ {fit:,}")
    ax = parts.ax
    ax.relim(visible_only=True)
    ax.autoscale_view(scalex=False)
    ax.set_title(data["title"], fontsize=10, y=1.0)  # y given: no title placement pass at every draw
    keep_legend(ax, [parts.bold] + [h for h, _, _ in parts.caps if h.get_visible()], fontsize=8, loc="upper left")


def cache_figure(
    *,
    batch: int = 1,
    layers: int = 32,
    heads: int = 32,
    head_dim: int = 128,
    dtype: str = "fp16",
    reserved_gib: float = 0.0,
    capacities_gib: Sequence[float] = CAPACITIES_GIB,
    batches: Sequence[int] = (1, 8, 64),
    t_min: int = 256,
    t_max: int = 131072,
    kv_heads: int | None = None,
    window: int | None = None,
) -> Any:
    """Cache GiB against context T (log–log) for ``batch`` (bold) and for each of ``batches`` (thin),
    with one horizontal line per device capacity minus ``reserved_gib`` (memory the weights already
    take) and, on each, the largest T that fits for ``batch`` marked by a vertical line.
    ``kv_heads``: K/V heads stored (grouped-query; None = ``heads``); ``window``: a rolling cache of
    that many tokens (the curves go flat at T = window, and a capacity that holds it fits every T)."""
    data = _cache_data(batch, layers, heads, head_dim, dtype, reserved_gib, capacities_gib, batches, t_min, t_max,
                       kv_heads, window)
    fig, parts = _cache_layout(data["key"])
    _cache_fill(parts, data)
    fig.tight_layout()
    return remember(fig, parts)


def update_cache_figure(fig: Any, **options: Any) -> bool:
    """Redraw a :func:`cache_figure` in place for new keyword values (its keywords, same defaults).

    Returns False, leaving ``fig`` unchanged, when the context grid, ``batches`` or capacities
    differ or ``fig`` is no :func:`cache_figure`; raises ``ValueError`` like it, before any change."""
    data = _cache_data(**(_DEFAULTS | options))
    parts = recall(fig)
    if not isinstance(parts, _CacheParts) or parts.key != data["key"]:
        return False
    _cache_fill(parts, data)
    return True


def _optional(value: int | None, options: Sequence[int], none_label: str) -> list[tuple[str, int | None]]:
    """Dropdown ``(label, value)`` pairs: ``none_label`` for None, then ``options`` (and ``value``), sorted."""
    numbers = choices(value, options) if value is not None else sorted(options)
    return [(none_label, None)] + [(f"{n:,}", n) for n in numbers]


def cache_explorer(
    *,
    batch: int = 1,
    layers: int = 32,
    heads: int = 32,
    head_dim: int = 128,
    dtype: str = "fp16",
    reserved_gib: float = 0.0,
    kv_heads: int | None = None,
    window: int | None = None,
    **fixed: Any,
) -> Any:
    """Interactive :func:`cache_figure`: B, layers, H, K/V heads (None = H), window (None = off),
    d_head, dtype and the GiB the weights take.
    Other :func:`cache_figure` arguments (``capacities_gib``, ``batches``, ``t_min``, ``t_max``) go
    through ``fixed``. Live in JupyterLab (returns the widget box); headless it shows and returns
    the static figure."""
    import ipywidgets as widgets

    controls = {
        "batch": widgets.Dropdown(options=choices(batch, [1, 2, 4, 8, 16, 32, 64, 128, 256]), value=batch, description="B",
                                  layout=widgets.Layout(width="140px")),
        "layers": widgets.IntSlider(value=layers, min=1, max=max(96, layers), description=_("layers"), continuous_update=False),
        "heads": widgets.Dropdown(options=choices(heads, [1, 2, 4, 8, 16, 32, 64]), value=heads, description="H",
                                  layout=widgets.Layout(width="130px")),
        "kv_heads": widgets.Dropdown(options=_optional(kv_heads, [1, 2, 4, 8, 16, 32, 64], "= H"), value=kv_heads,
                                     description=_("K/V heads"), layout=widgets.Layout(width="170px")),
        "window": widgets.Dropdown(options=_optional(window, [1024, 4096, 8192, 32768], _("off")), value=window,
                                   description=_("window"), layout=widgets.Layout(width="170px")),
        "head_dim": widgets.Dropdown(options=choices(head_dim, [32, 64, 128, 256]), value=head_dim, description="d_head",
                                     layout=widgets.Layout(width="150px")),
        "dtype": widgets.ToggleButtons(options=["fp32", "bf16", "fp16"], value=dtype, description=_("dtype"),
                                       style={"button_width": "50px"}),
        "reserved_gib": widgets.FloatSlider(value=reserved_gib, min=0.0, max=140.0, step=1.0, description=_("weights GiB"),
                                            continuous_update=False),
    }
    return interactive_figure(cache_figure, controls, fixed=fixed, update_fn=update_cache_figure)
