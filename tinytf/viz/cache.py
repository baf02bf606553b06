"""KV-cache size as the context grows, against device capacity.

    cache bytes = 2 (K and V) · layers · B · H · T · d_head · bytes per element

:func:`cache_figure` is pure (arguments in, matplotlib Figure out); :func:`cache_explorer` adds
ipywidgets controls (B, layers, H, d_head, dtype, memory already taken by the weights) through
:func:`tinytf.viz.interactive_figure`, or shows the static figure when headless.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..memory import GiB, dtype_bytes, format_bytes, kv_cache_bytes
from ._front import interactive_figure

__all__ = ["CAPACITIES_GIB", "cache_tokens_that_fit", "cache_figure", "cache_explorer"]

CAPACITIES_GIB = (24, 80, 141)  # a consumer GPU, an A100/H100 80 GB, an H200
_CAP_COLORS = ("#dd8452", "#b00020", "#8172b2")


def cache_tokens_that_fit(
    capacity_bytes: float, *, batch: int, layers: int, heads: int, head_dim: int, dtype: Any, reserved_bytes: float = 0
) -> int:
    """Largest context T (tokens per sequence) whose cache for ``batch`` sequences fits in
    ``capacity_bytes - reserved_bytes`` (0 when not even one token fits)."""
    per_token = kv_cache_bytes(batch, layers, heads, 1, head_dim, dtype)  # bytes for one more token in every sequence
    return max(0, int((capacity_bytes - reserved_bytes) // per_token))


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
) -> Any:
    """Cache GiB against context T (log–log) for ``batch`` (bold) and for each of ``batches`` (thin),
    with one horizontal line per device capacity minus ``reserved_gib`` (memory the weights already
    take) and, on each, the largest T that fits for ``batch`` marked by a vertical line."""
    import matplotlib.pyplot as plt
    import numpy as np

    for name, val in (("batch", batch), ("layers", layers), ("heads", heads), ("head_dim", head_dim)):
        if val < 1:
            raise ValueError(f"{name} must be positive, got {val}")
    if t_min < 1 or t_max <= t_min:
        raise ValueError(f"need 1 <= t_min < t_max, got t_min={t_min}, t_max={t_max}")
    ts = np.unique(np.geomspace(t_min, t_max, 64).round().astype(int))

    def gib(b: int) -> np.ndarray:
        return np.array([kv_cache_bytes(b, layers, heads, int(t), head_dim, dtype) for t in ts]) / GiB

    fig, ax = plt.subplots(figsize=(9, 4.6))
    for b in sorted(set(batches) - {batch}):
        ax.plot(ts, gib(b), color="#8c8c8c", lw=0.9, alpha=0.7)
        ax.annotate(f"B={b}", xy=(ts[-1], gib(b)[-1]), xytext=(3, 0), textcoords="offset points", fontsize=8, color="#6c6c6c",
                    va="center")
    ax.plot(ts, gib(batch), color="#4c72b0", lw=2.4, label=f"KV cache, B={batch}")
    for cap, color in zip(capacities_gib, _CAP_COLORS * 3):
        left = cap - reserved_gib
        if left <= 0:
            continue
        label = f"{cap:g} GiB" + (f" − {reserved_gib:g} GiB weights" if reserved_gib else "")
        ax.axhline(left, color=color, ls="--", lw=1.2, label=label)
        fit = cache_tokens_that_fit(cap * GiB, batch=batch, layers=layers, heads=heads, head_dim=head_dim, dtype=dtype,
                                    reserved_bytes=reserved_gib * GiB)
        if t_min <= fit <= t_max:
            ax.axvline(fit, color=color, lw=0.9, ls=":")
            ax.annotate(f"T ≤ {fit:,}", xy=(fit, left), xytext=(4, 5), textcoords="offset points", fontsize=8, color=color,
                        bbox={"fc": "white", "ec": "none", "alpha": 0.8, "pad": 1})
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlim(ts[0], ts[-1] * 1.6)
    ax.set_xlabel("context length T (tokens per sequence)")
    ax.set_ylabel("KV cache (GiB)")
    ax.grid(True, which="major", alpha=0.3)
    per_tok = kv_cache_bytes(1, layers, heads, 1, head_dim, dtype)
    ax.set_title(
        f"layers={layers}, H={heads}, d_head={head_dim}, {dtype} ({dtype_bytes(dtype)} B/elem): "
        f"{format_bytes(per_tok)} per token per sequence\n"
        f"= 2 (K,V) × {layers} × {heads} × {head_dim} × {dtype_bytes(dtype)} B; "
        f"B={batch} at T={ts[-1]:,}: {format_bytes(kv_cache_bytes(batch, layers, heads, int(ts[-1]), head_dim, dtype))}",
        fontsize=10,
    )
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def _figure_or_message(**options: Any) -> Any:
    try:
        return cache_figure(**options)
    except ValueError as err:
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 1.2))
        ax.axis("off")
        ax.text(0.0, 0.5, f"cannot draw: {err}", wrap=True, va="center", fontsize=9, color="#b00020")
        return fig


def cache_explorer(
    *,
    batch: int = 1,
    layers: int = 32,
    heads: int = 32,
    head_dim: int = 128,
    dtype: str = "fp16",
    reserved_gib: float = 0.0,
    **fixed: Any,
) -> Any:
    """Interactive :func:`cache_figure`: B, layers, H, d_head, dtype and the GiB the weights take.
    Other :func:`cache_figure` arguments (``capacities_gib``, ``batches``, ``t_min``, ``t_max``) go
    through ``fixed``. Live in JupyterLab (returns the widget box); headless it shows and returns
    the static figure."""
    import ipywidgets as widgets

    def choices(default: int, options: Sequence[int]) -> list[int]:
        return sorted(set(options) | {default})

    controls = {
        "batch": widgets.Dropdown(options=choices(batch, [1, 2, 4, 8, 16, 32, 64, 128, 256]), value=batch, description="B",
                                  layout=widgets.Layout(width="140px")),
        "layers": widgets.IntSlider(value=layers, min=1, max=max(96, layers), description="layers", continuous_update=False),
        "heads": widgets.Dropdown(options=choices(heads, [1, 2, 4, 8, 16, 32, 64]), value=heads, description="H",
                                  layout=widgets.Layout(width="130px")),
        "head_dim": widgets.Dropdown(options=choices(head_dim, [32, 64, 128, 256]), value=head_dim, description="d_head",
                                     layout=widgets.Layout(width="150px")),
        "dtype": widgets.ToggleButtons(options=["fp32", "bf16", "fp16"], value=dtype, description="dtype",
                                       style={"button_width": "50px"}),
        "reserved_gib": widgets.FloatSlider(value=reserved_gib, min=0.0, max=140.0, step=1.0, description="weights GiB",
                                            continuous_update=False),
    }
    return interactive_figure(_figure_or_message, controls, fixed=fixed)
