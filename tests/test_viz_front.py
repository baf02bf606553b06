"""The shared widget front end: in-place updates equal fresh figures, the live widget keeps one
figure across control changes, and the static (headless) fallback still renders. No timings here:
redraw speed is measured by ``make bench`` (benchmarks/widgets.py)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from tinytf.viz import _front
from tinytf.viz import attention as att
from tinytf.viz import cache as vc
from tinytf.viz import memory as mem
from tinytf.viz import tiled as vt
from tinytf.viz.cells import CellLabels

S = "the cat sat on the mat"

# (figure function, its updater, first options, new options with the same structure, options needing a rebuild)
CASES = {
    "attention": (att.attention_figure, att.update_attention_figure, dict(sentence=S, mask="none"),
                  dict(sentence=S, mask="causal", head=1, scaling="temperature", temperature=3.0), dict(sentence=S + " today")),
    "cache": (vc.cache_figure, vc.update_cache_figure, dict(batch=1), dict(batch=8, layers=12, reserved_gib=90.0, dtype="fp32"),
              dict(t_max=4096)),
    "memory": (mem.memory_figure, mem.update_memory_figure, dict(layers=4, t_max=8192),
               dict(layers=8, batch=2, capacity_gib=24, dtype="fp32", t_max=8192), dict(mode="inference", t_max=8192)),
}


def _arr(x) -> list:
    a = np.ma.filled(np.ma.asarray(x, dtype=float), np.inf)  # masked (and NaN) as inf: comparable with ==
    return np.where(np.isnan(a), np.inf, a).round(12).tolist()


def signature(fig: Figure) -> list:
    """Everything drawn, as plain data: images (with their masks), lines, filled areas, texts,
    patches, limits, scales, title and legend (only what is visible)."""
    out = []
    for ax in fig.axes:
        vis = [a for a in ax.get_children() if a.get_visible()]
        out.append({
            "images": [(_arr(im.get_array()), np.ma.getmaskarray(im.get_array()).tolist()) for im in ax.images],
            "lines": [(_arr(ln.get_xdata()), _arr(ln.get_ydata()), ln.get_label()) for ln in ax.lines if ln in vis],
            "areas": [[_arr(p.vertices) for p in c.get_paths()] for c in ax.collections if c in vis],
            "texts": [(t.get_text(), t.get_position(), getattr(t, "xy", None), t.get_color()) for t in ax.texts if t in vis],
            "cells": [a.get_cells() for a in vis if isinstance(a, CellLabels)],  # numbers in heatmap cells
            "patches": [(p.get_xy(), p.get_hatch()) for p in vis if isinstance(p, Rectangle) and p is not ax.patch],
            "limits": (ax.get_xlim(), ax.get_ylim(), ax.get_xscale(), ax.get_yscale()),
            "title": ax.get_title(),
            "ticks": [t.get_text() for t in ax.get_xticklabels() + ax.get_yticklabels()],
            "legend": [t.get_text() for t in ax.get_legend().get_texts()] if ax.get_legend() else None,
        })
    return out


@pytest.mark.parametrize("name", CASES)
def test_update_changes_the_same_figure_to_what_a_fresh_one_shows(name):
    build, update, first, new, _ = CASES[name]
    fig = build(**first)
    before, artists = signature(fig), list(fig.axes[0].get_children())
    assert update(fig, **new) is True
    after = signature(fig)
    assert after != before  # the data changed ...
    fresh = build(**new)
    assert after == signature(fresh)  # ... to exactly what a freshly built figure shows
    main = fig.axes[0]
    kept = {id(a) for a in artists}
    assert all(id(a) in kept for a in [*main.images, *main.lines])  # the same image and lines, updated, none added
    plt.close(fig)
    plt.close(fresh)


@pytest.mark.parametrize("name", CASES)
def test_a_different_structure_asks_for_a_rebuild_and_leaves_the_figure_alone(name):
    build, update, first, _, other = CASES[name]
    fig = build(**first)
    before = signature(fig)
    assert update(fig, **other) is False
    assert signature(fig) == before
    assert update(plt.figure(), **first) is False  # a figure the function did not build
    plt.close("all")


def test_invalid_options_raise_before_touching_the_figure():
    fig = vc.cache_figure()
    before = signature(fig)
    with pytest.raises(ValueError, match="layers must be positive"):
        vc.update_cache_figure(fig, layers=0)
    with pytest.raises(ValueError, match="head must lie"):
        att.update_attention_figure(att.attention_figure(S), sentence=S, head=5)
    assert signature(fig) == before
    plt.close("all")


def test_live_figure_updates_in_place_and_rebuilds_only_when_it_must():
    live = _front.LiveFigure(att.attention_figure, att.update_attention_figure)
    fig = live.redraw(sentence=S, mask="none")
    assert live.redraw(sentence=S, mask="causal", head=1) is fig and live.rebuilt == 1
    assert signature(fig) == signature(att.attention_figure(S, mask="causal", head=1))
    longer = live.redraw(sentence=S + " today", mask="causal")  # 7 tokens: a new figure
    assert longer is not fig and live.rebuilt == 2
    message = live.redraw(sentence="  ")  # an error becomes a message figure ...
    assert "cannot draw" in message.axes[0].texts[0].get_text() and live.rebuilt == 3
    assert live.redraw(sentence=S) is not message and live.rebuilt == 4  # ... replaced by a real one when fixed
    plt.close("all")


@pytest.mark.parametrize(("explorer", "kwargs", "control", "value"), [
    (att.attention_explorer, {"sentence": S, "mask": "none"}, "head", 1),
    (mem.memory_explorer, {"layers": 2, "t_max": 4096}, "layers", 6),
    (vc.cache_explorer, {"layers": 8}, "reserved_gib", 30.0),
])
def test_live_widget_keeps_one_figure_across_control_changes(monkeypatch, explorer, kwargs, control, value):
    monkeypatch.setenv("TINYTF_HEADLESS", "0")
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj, **kw: shown.append(obj))
    ui = explorer(**kwargs)
    fig, before, png = ui.live.fig, signature(ui.live.fig), ui.image.value
    assert shown == [ui] and png[:8] == b"\x89PNG\r\n\x1a\n"  # the widget is displayed once, the figure is its Image
    ui.controls[control].value = value
    assert ui.live.fig is fig and ui.live.rebuilt == 1 and signature(fig) != before
    assert shown == [ui] and ui.image.value[:8] == b"\x89PNG\r\n\x1a\n" and ui.image.value != png  # one new PNG
    assert plt.fignum_exists(fig.number) is False  # kept out of pyplot: the inline backend will not show it twice
    plt.close("all")


@pytest.mark.parametrize("explorer", [att.attention_explorer, mem.memory_explorer, vc.cache_explorer, vt.online_softmax_stepper])
def test_live_widget_has_no_output_widget(monkeypatch, explorer):
    """nbclient answers an Output widget's outputs on the shell socket mid-cell, which can hang papermill
    under load (tests/test_viz_live.py): the live widgets show their figure in an Image widget instead."""
    import ipywidgets

    monkeypatch.setenv("TINYTF_HEADLESS", "0")
    monkeypatch.setattr("IPython.display.display", lambda obj, **kw: None)
    ui = explorer()

    def tree(w):
        yield w
        for child in getattr(w, "children", ()):
            yield from tree(child)

    widgets = list(tree(ui))
    assert len(widgets) >= 3 and ui.image in widgets and isinstance(ui.image, ipywidgets.Image)
    assert not any(isinstance(w, ipywidgets.Output) for w in widgets)
    plt.close("all")


@pytest.mark.parametrize("explorer", [att.attention_explorer, mem.memory_explorer, vc.cache_explorer])
def test_static_fallback_still_renders(monkeypatch, explorer):
    monkeypatch.setenv("TINYTF_HEADLESS", "1")
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj, **kw: shown.append(obj))
    fig = explorer()
    assert isinstance(fig, Figure) and shown == [fig]
    assert _front.render_png(fig)[:4] == b"\x89PNG"
    plt.close("all")


def test_choices_and_figure_or_message():
    assert _front.choices(3, [1, 2, 4]) == [1, 2, 3, 4] and _front.choices(2, [1, 2]) == [1, 2]
    msg = _front.figure_or_message(vc.cache_figure, layers=0)
    assert "layers must be positive" in msg.axes[0].texts[0].get_text()
    assert isinstance(_front.figure_or_message(vc.cache_figure, layers=2), Figure)
    plt.close("all")


def test_blitted_redraw_is_pixel_identical_to_a_full_draw_of_a_fresh_figure():
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from tinytf.viz import attention
    from tinytf.viz._front import render_png

    def full(fig):
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        return np.asarray(canvas.buffer_rgba()).copy()

    fig = attention.attention_figure()
    render_png(fig)  # draws and caches the background
    for head, mask, scaling in [(1, "causal", "none"), (0, "none", "1/sqrt(d)"), (1, "causal", "temperature")]:
        assert attention.update_attention_figure(fig, head=head, mask=mask, scaling=scaling)
        render_png(fig)  # background restored, only the changing artists drawn
        blitted = np.asarray(fig.canvas.buffer_rgba()).copy()
        fresh = full(attention.attention_figure(head=head, mask=mask, scaling=scaling))
        assert blitted.shape == fresh.shape and np.array_equal(blitted, fresh), (head, mask, scaling)


def test_keep_legend_reuses_a_legend_for_the_same_handles_and_rebuilds_for_others():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tinytf.viz._front import keep_legend

    fig, ax = plt.subplots()
    a, = ax.plot([0, 1], label="a")
    b, = ax.plot([1, 0], label="b")
    first = keep_legend(ax, [a, b])
    a.set_label("a, renamed")
    again = keep_legend(ax, [a, b])
    assert again is first and [t.get_text() for t in again.get_texts()] == ["a, renamed", "b"]
    other = keep_legend(ax, [b])
    assert other is not first and [t.get_text() for t in other.get_texts()] == ["b"] and ax.get_legend() is other
    assert [t.get_text() for t in keep_legend(ax).get_texts()] == ["a, renamed", "b"]  # default: every labelled artist
    plt.close(fig)


@pytest.mark.parametrize("channels", [3, 4])
def test_png_bytes_decodes_to_the_same_pixels(channels):
    """The widgets' PNG encoder is lossless: PIL reads back every pixel, in RGB and in RGBA."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    pixels = np.full((37, 53, channels), 255, np.uint8)
    pixels[5:20, 3:40] = rng.integers(0, 256, (15, 37, channels), dtype=np.uint8)  # noise beside flat colour
    pixels[25:, :, 0] = np.arange(53, dtype=np.uint8) * 5  # a ramp: Sub-filter differences that wrap around 256
    data = _front.png_bytes(pixels)
    back = np.asarray(Image.open(io.BytesIO(data)))
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and back.shape == pixels.shape and np.array_equal(back, pixels)
