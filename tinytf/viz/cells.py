"""Numbers written in the cells of a heatmap, drawn from a cache of rendered labels.

A heatmap of ``T x T`` weights shows up to ``T*T`` short labels (``"0.42"``). Drawn as ``T*T``
matplotlib ``Text`` artists, every redraw lays out and rasterises each glyph again (~1.5 ms a
label: most of a live widget's redraw). The labels repeat, though: two decimals of a weight in
``[0, 1]`` are at most 101 strings per colour. :class:`CellLabels` is one artist for all cells; it
renders each distinct (string, colour, font, size, dpi) once, with matplotlib's own text drawing
(the same font, hinting and antialiasing as a ``Text``), and pastes the cached bitmap centred on its
cell in every later draw.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.artist import Artist

from ..translation import gettext

__all__ = ["CellLabels"]

_BITMAPS: dict[tuple, np.ndarray] = {}  # (text, colour, family, size, dpi) -> RGBA [h, w, 4], uint8


def _bitmap(text: str, color: Any, family: tuple, size: float, dpi: float) -> np.ndarray:
    """``text`` drawn centred (ha/va ``"center"``) on a transparent canvas: RGBA ``[h, w, 4]``, uint8."""
    key = (text, str(color), family, size, dpi)
    img = _BITMAPS.get(key)
    if img is None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        px = size * dpi / 72.0
        w, h = 2 * int(px * (len(text) + 2) / 2 + 1), 2 * int(px + 2)  # even: the centre is a pixel corner
        fig = Figure(figsize=(w / dpi, h / dpi), dpi=dpi)
        fig.patch.set_alpha(0.0)
        fig.text(0.5, 0.5, text, ha="center", va="center", fontsize=size, color=color)  # font: rcParams, as for a Text
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        img = _BITMAPS[key] = np.array(canvas.buffer_rgba(), dtype=np.uint8)  # copy: [h, w, 4], top row first
    return img


class CellLabels(Artist):
    """One label centred on each cell ``(row i, column j)`` of an ``[n_rows, n_cols]`` grid in data
    coordinates (cell centres at ``x=j, y=i``, as ``imshow`` places them); ``""`` draws nothing."""

    zorder = 3  # where ax.text puts labels: over the image and patches

    def __init__(self, ax: Any, shape: tuple[int, int], *, fontsize: float = 7) -> None:
        super().__init__()
        self.shape, self.fontsize = (int(shape[0]), int(shape[1])), float(fontsize)
        n = self.shape[0] * self.shape[1]
        self._texts, self._colors = [""] * n, ["black"] * n
        ax.add_artist(self)
        self.set_transform(ax.transData)
        self.set_clip_on(False)  # like ax.text: a label may overhang its cell

    def set_cells(self, texts: Sequence[str], colors: Sequence[Any]) -> None:
        """The labels and colours of all cells, row-major (``n_rows * n_cols`` of each)."""
        n = self.shape[0] * self.shape[1]
        if len(texts) != n or len(colors) != n:
            raise ValueError(gettext("set_cells: need {n} texts and colours for a {shape} grid, got {n_texts} and {n_colors}").format(n=n,
                shape=self.shape, n_texts=len(texts), n_colors=len(colors)))
        self._texts, self._colors = list(texts), list(colors)
        self.stale = True

    def get_cells(self) -> list[tuple[int, int, str, Any]]:
        """``(i, j, text, colour)`` of every cell with a label, row-major."""
        cols = self.shape[1]
        return [(*divmod(k, cols), t, c) for k, (t, c) in enumerate(zip(self._texts, self._colors)) if t]

    def draw(self, renderer: Any) -> None:
        if not self.get_visible():
            return
        import matplotlib

        family = (*matplotlib.rcParams["font.family"], *matplotlib.rcParams["font.sans-serif"])
        cells = self.get_cells()
        if not cells:
            return
        centres = self.get_transform().transform([(j, i) for i, j, _, _ in cells])  # display pixels, y up
        gc = renderer.new_gc()
        gc.set_alpha(self.get_alpha() if self.get_alpha() is not None else 1.0)
        for (x, y), (_, _, text, color) in zip(centres, cells):
            img = _bitmap(text, color, family, self.fontsize, renderer.dpi)
            h, w = img.shape[:2]
            renderer.draw_image(gc, round(x) - w // 2, round(y) - h // 2, img[::-1])
        gc.restore()
        self.stale = False
