"""The online-softmax stepper: its numbers are the tiled attention's, its grid is the tile statistics'."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

import tinytf
import tinytf.viz
from tinytf.viz import tiled as vt

CASES = [  # (row, T, block_k, block_q, causal): T not a multiple of the blocks, bq != bk, both masks
    (37, 64, 8, None, True),
    (0, 64, 8, None, True),
    (50, 53, 7, 5, True),
    (20, 45, 16, 8, False),
    (44, 45, 6, 9, True),
]


@pytest.mark.parametrize(("row", "T", "block_k", "block_q", "causal"), CASES)
def test_last_step_is_the_tiled_attention_output(row, T, block_k, block_q, causal):
    trace = vt.online_softmax_trace(row, T=T, block_k=block_k, block_q=block_q, causal=causal, d=6, seed=3)
    q, k, v = trace.qkv
    bq = block_k if block_q is None else block_q
    out, lse = tinytf.tiled_attention(q, k, v, is_causal=causal, block_q=bq, block_k=block_k, return_lse=True)
    assert torch.equal(trace.out[-1], out[0, 0, row])  # the same tiles and updates, bit for bit
    torch.testing.assert_close(trace.out[-1], tinytf.scaled_dot_product_attention(q, k, v, is_causal=causal)[0, 0, row])
    torch.testing.assert_close(trace.exact, tinytf.scaled_dot_product_attention(q, k, v, is_causal=causal)[0, 0, row])
    # m and l after the last tile are the row's maximum and its sum of exp(s - m): lse = m + log l
    finite = trace.scores[torch.isfinite(trace.scores)]
    torch.testing.assert_close(trace.m[-1], finite.max())
    torch.testing.assert_close(trace.m[-1] + trace.l[-1].log(), lse[0, 0, row])
    assert torch.all(trace.m[1:] >= trace.m[:-1])  # the running maximum never falls
    # at every step acc / l is the exact attention over the keys seen so far
    torch.testing.assert_close(trace.out, trace.seen)


@pytest.mark.parametrize(("row", "T", "block_k", "block_q", "causal"), CASES)
def test_the_grid_drawn_matches_tile_stats(row, T, block_k, block_q, causal):
    trace = vt.online_softmax_trace(row, T=T, block_k=block_k, block_q=block_q, causal=causal)
    q, k, v = trace.qkv
    _, stats = tinytf.tiled_attention(q, k, v, is_causal=causal, block_q=trace.block_q, block_k=block_k, return_stats=True)
    options = dict(T=T, block_k=block_k, block_q=block_q, causal=causal)
    fig = vt.online_softmax_figure(row, **options)
    for step in (len(trace.tiles), 1):
        assert vt.update_online_softmax_figure(fig, row, step=step, **options)
        grid = np.asarray(vt.recall(fig).grid.get_array())
        assert grid.shape == (stats.q_blocks, stats.k_blocks)
        assert int((grid == vt.GRID_STATES.index("skipped")).sum()) == stats.skipped
        assert int((grid != vt.GRID_STATES.index("skipped")).sum()) == stats.computed
        this_row = grid[row // trace.block_q]
        assert int((this_row == vt.GRID_STATES.index("current tile")).sum()) == 1
        assert int((this_row == vt.GRID_STATES.index("done for this row")).sum()) == step - 1
    plt.close(fig)
    assert len(trace.tiles) == vt.tile_steps(row, T, trace.block_q, block_k, causal)
    if causal and T >= 4 * block_k and trace.block_q == block_k:
        assert stats.skipped > 0.3 * stats.total  # about half of a square causal grid lies in the future


def test_figure_shows_the_step_it_was_asked_for():
    trace = vt.online_softmax_trace(37)
    for step in (1, 3, len(trace.tiles)):
        fig = vt.online_softmax_figure(37, step=step)
        p = vt.recall(fig)
        heights = np.array([b.get_height() for b in p.out_bars])
        np.testing.assert_array_equal(heights, trace.out[step - 1].numpy())
        assert p.m_line.get_ydata()[0] == pytest.approx(float(trace.m[step - 1]))
        assert len(p.lines["m"][1].get_xdata()) == step
        assert f"after key tile {step} of {len(trace.tiles)}" in p.title.get_text()
        plt.close(fig)


def test_update_redraws_in_place_like_a_fresh_figure():
    fig = vt.online_softmax_figure(37, step=2)
    assert vt.update_online_softmax_figure(fig, 12, step=1, causal=False)
    fresh = vt.online_softmax_figure(12, step=1, causal=False)
    a, b = vt.recall(fig), vt.recall(fresh)
    assert a.title.get_text() == b.title.get_text()
    np.testing.assert_array_equal(a.grid.get_array(), b.grid.get_array())
    assert [x.get_height() for x in a.bars] == [x.get_height() for x in b.bars]
    assert not vt.update_online_softmax_figure(fig, 12, T=48)  # another T: a new figure is needed
    with pytest.raises(ValueError, match="step must lie"):
        vt.update_online_softmax_figure(fig, 0, step=3)  # row 0's block computes one tile under causal
    plt.close("all")


def test_bad_options_raise_clear_errors():
    with pytest.raises(ValueError, match="row must lie"):
        vt.online_softmax_trace(64, T=64)
    with pytest.raises(ValueError, match="block_k must be a positive integer"):
        vt.online_softmax_trace(3, block_k=0)
    with pytest.raises(ValueError, match=r"step must lie in \[1, 5\]"):
        vt.online_softmax_figure(37, step=6)


def test_stepper_headless_returns_the_static_figure(monkeypatch):
    monkeypatch.setenv("TINYTF_HEADLESS", "1")
    fig = tinytf.viz.online_softmax_stepper(37, step=2)
    assert isinstance(fig, Figure)
    assert "after key tile 2 of 5" in vt.recall(fig).title.get_text()
    plt.close("all")


def test_stepper_live_keeps_the_step_within_the_rows_tiles(monkeypatch):
    import ipywidgets as widgets

    monkeypatch.setenv("TINYTF_HEADLESS", "0")
    ui = tinytf.viz.online_softmax_stepper(37)
    assert isinstance(ui, widgets.VBox)
    controls = ui.controls
    assert controls["step"].max == controls["step"].value == 5
    controls["row"].value = 3  # the first query block computes one key tile under the causal mask
    assert controls["step"].max == 1 and controls["step"].value == 1
    assert "query row 3" in vt.recall(ui.live.fig).title.get_text()
    controls["causal"].value = False  # no mask: every block computes all 8 key tiles
    assert controls["step"].max == 8
    controls["step"].value = 8
    assert "after key tile 8 of 8" in vt.recall(ui.live.fig).title.get_text()
    assert ui.live.rebuilt == 1  # every change was redrawn in place
    plt.close("all")
