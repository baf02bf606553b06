"""The finite-map widget: its cells are tinytf.precision.finite_map's, its boundary lines the formulas', and it
falls back to the static figure headless."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.figure import Figure

from tinytf.precision import finite_map, score_overflow
from tinytf.viz import precision as vp

WIDTHS, SCALES = (16, 64), tuple(2.0 ** (i / 2) for i in range(-2, 16))  # σ = 0.5 … 181


def _grid(fig, panel):
    return np.asarray(vp.recall(fig).meshes[panel].get_array()).reshape(len(WIDTHS), len(SCALES))


def test_the_cells_drawn_are_finite_map_and_the_titles_count_them():
    fig = vp.finite_figure("after", False, 32, widths=WIDTHS, scales=SCALES)
    assert len(fig.axes) == 3
    for panel, dtype in enumerate(vp.DTYPES):
        want = finite_map(dtype, WIDTHS, SCALES, scaling="after", safe_softmax=False, tokens=32).numpy()
        assert (_grid(fig, panel) == want).all()
        assert f"{int((want == 0).sum())} " in vp.recall(fig).titles[panel].get_text()
    assert vp.update_finite_figure(fig, "before", True, 32, widths=WIDTHS, scales=SCALES)
    assert (_grid(fig, 2) == finite_map("fp16", WIDTHS, SCALES, scaling="before", tokens=32).numpy()).all()
    assert len(vp.recall(fig).weight_lines[2].get_xdata()) == 0  # the softmax line only without the max
    assert not vp.update_finite_figure(fig, widths=(16,), scales=SCALES)  # another grid needs another figure
    plt.close(fig)


def test_the_predicted_score_boundary_is_where_the_sweep_finds_it():
    scores, weights = vp.predicted_boundaries("fp16", [64], "after", 128)
    found = score_overflow(64, scaling="after", tokens=128, heads=1)
    assert abs(scores[0] / found.found - 1) < 2e-3
    assert weights[0] < scores[0]  # a softmax without the max breaks long before the scores overflow


def test_bad_options_raise_before_drawing():
    with pytest.raises(ValueError, match="scaling must be one of"):
        vp.finite_figure("later")
    with pytest.raises(ValueError, match="tokens must be at least 2"):
        vp.finite_figure(tokens=1)


def test_headless_explorer_shows_the_static_figure(monkeypatch, capsys):
    monkeypatch.setenv("TINYTF_HEADLESS", "1")
    fig = vp.finite_explorer(tokens=32, widths=WIDTHS, scales=SCALES)
    assert isinstance(fig, Figure) and "static figure" in capsys.readouterr().out


def test_live_explorer_redraws_one_figure_in_an_image(monkeypatch):
    import ipywidgets

    monkeypatch.setenv("TINYTF_HEADLESS", "0")
    monkeypatch.setattr("IPython.display.display", lambda obj, **kw: None)
    ui = vp.finite_explorer(tokens=32, widths=WIDTHS, scales=SCALES)
    assert set(ui.controls) == {"scaling", "safe_softmax", "tokens"} and isinstance(ui.image, ipywidgets.Image)
    fig, png = ui.live.fig, ui.image.value
    ui.controls["scaling"].value = "before"
    ui.controls["safe_softmax"].value = True
    assert ui.live.fig is fig and ui.live.rebuilt == 1 and ui.image.value != png
    assert (_grid(fig, 2) == finite_map("fp16", WIDTHS, SCALES, scaling="before", tokens=32).numpy()).all()
    plt.close("all")
