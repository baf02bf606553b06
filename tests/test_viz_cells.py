"""tinytf.viz.cells: one artist writes a label centred on each heatmap cell."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402

from tinytf.viz.cells import CellLabels  # noqa: E402


def _drawn(texts: list[str]) -> tuple[np.ndarray, plt.Axes]:
    fig, ax = plt.subplots(figsize=(3, 3), dpi=100)
    ax.imshow(np.zeros((2, 2)), cmap="gray_r", vmin=0, vmax=1)  # white cells
    cells = CellLabels(ax, (2, 2), fontsize=9)
    cells.set_cells(texts, ["black"] * 4)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.array(canvas.buffer_rgba())[..., :3].min(-1), ax


def test_each_label_is_drawn_centred_on_its_cell():
    img, ax = _drawn(["0.25", "", "", "1.00"])
    h = img.shape[0]
    for (i, j), written in {(0, 0): True, (0, 1): False, (1, 0): False, (1, 1): True}.items():
        x, y = ax.transData.transform((j, i))
        x, y = int(round(x)), int(round(h - y))  # image rows run downwards
        box = img[y - 12:y + 12, x - 25:x + 25]
        ink = np.argwhere(box < 128)
        assert bool(len(ink)) == written, (i, j)
        if written:
            cy, cx = ink.mean(axis=0)
            assert abs(cy - 12) < 3 and abs(cx - 25) < 3  # the ink is centred on the cell centre
    plt.close("all")


def test_get_cells_lists_the_labelled_cells_and_set_cells_checks_the_count():
    fig, ax = plt.subplots()
    cells = CellLabels(ax, (2, 3))
    cells.set_cells(["a", "", "b", "", "", "c"], ["k", "k", "w", "k", "k", "k"])
    assert cells.get_cells() == [(0, 0, "a", "k"), (0, 2, "b", "w"), (1, 2, "c", "k")]
    with pytest.raises(ValueError, match="need 6 texts"):
        cells.set_cells(["a"], ["k"])
    plt.close(fig)
