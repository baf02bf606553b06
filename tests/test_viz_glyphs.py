"""tinytf.viz.glyphs: the glyph-caching canvas draws exactly the pixels of matplotlib's Agg canvas."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402

from tinytf.viz import glyphs  # noqa: E402
from tinytf.viz.fonts import find_cjk_font, use_cjk_font  # noqa: E402


def _figure(labels: list[str]) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(4, 3), dpi=100)
    ax.plot([0, 1, 2], [1, 0, 2], label=labels[0])
    ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right")
    ax.set_title("weights · 0.42 = x²", fontsize=9)
    ax.legend(fontsize=7)
    ax.text(0.37, 0.61, "0.13", transform=ax.transAxes, fontsize=7, color="white")
    ax.text(0.05, 0.2, f"{labels[1]}\n{labels[2]} (two lines: the line gap)", transform=ax.transAxes, fontsize=8)
    return fig


def _pixels(canvas: FigureCanvasAgg) -> np.ndarray:
    canvas.draw()
    return np.array(canvas.buffer_rgba())


@pytest.mark.skipif(not glyphs.SUPPORTED, reason="this matplotlib has no glyph-by-glyph Agg text path")
@pytest.mark.parametrize("labels", [["the", "cat", "sat"], ["猫", "坐", "垫子"]])
def test_cached_glyphs_give_the_same_pixels_as_agg(labels):
    if any(ord(c) > 0x2E80 for w in labels for c in w) and find_cjk_font() is None:
        pytest.skip("no CJK font installed")
    use_cjk_font(labels)
    fig = _figure(labels)
    stock = _pixels(FigureCanvasAgg(fig))
    cached = glyphs.GlyphCacheCanvas(fig)
    glyphs._METRICS.clear()
    first, second = _pixels(cached), _pixels(cached)  # second: every glyph (and line metric) from the cache
    assert glyphs._METRICS, "Text asks the canvas's renderer for the line metrics it caches"
    assert stock.shape == first.shape == second.shape
    assert (stock != 255).any()  # something was drawn
    assert np.array_equal(first, stock) and np.array_equal(second, stock)
    plt.close(fig)


def test_the_canvas_adopts_the_figure_and_keeps_its_renderer():
    fig = _figure(["a", "b", "c"])
    canvas = glyphs.GlyphCacheCanvas(fig)
    assert fig.canvas is canvas
    assert canvas.get_renderer() is canvas.get_renderer()  # one renderer while size and dpi stay
    fig.set_dpi(50)
    assert isinstance(canvas.get_renderer(), glyphs._GlyphCacheRenderer) and canvas.get_renderer().dpi == 50
    plt.close(fig)
