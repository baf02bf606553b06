"""The memory-curve widget: the pure figure agrees with the ledger; the front end falls back headless."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.figure import Figure

import tinytf
from tinytf.memory import GiB
from tinytf.viz import memory as mem


def test_token_grid_doubles_every_octave():
    ts = mem.token_grid(128, 4096, per_octave=4)
    assert ts[0] == 128 and ts[-1] == 4096 and ts == sorted(set(ts))
    assert all(b == 2 * a for a, b in zip(ts[::4], ts[4::4]))
    with pytest.raises(ValueError):
        mem.token_grid(512, 256)


def test_stacked_total_is_the_ledger_total_and_capacity_crossing_is_marked():
    kw = dict(batch=4, heads=8, dim=512, layers=6, vocab=1000, dtype="bf16", mode="training", attention="explicit",
              capacity_gib=24, t_min=256, t_max=16384)
    fig = mem.memory_figure(**kw)
    ax = fig.axes[0]
    total_line = next(line for line in ax.get_lines() if line.get_label() == "total (ledger)")
    ts, totals = total_line.get_data()
    cfg = tinytf.ModelConfig(1000, 512, 8, 6, 16384, 4)
    for t, y in zip(ts, totals):
        led = tinytf.ledger(tinytf.ModelConfig(cfg.vocab, cfg.dim, cfg.heads, cfg.layers, int(t), 4), 4, int(t), "bf16")
        assert np.isclose(y, led.total / GiB)
    cross = mem.capacity_crossing(mem.memory_curves(cfg, 4, mem.token_grid(256, 16384), "bf16"), 24 * GiB)
    assert cross is not None
    verticals = [line for line in ax.get_lines() if len(set(line.get_xdata())) == 1]
    assert any(line.get_xdata()[0] == cross for line in verticals)
    assert any(np.allclose(line.get_ydata(), 24) for line in ax.get_lines())  # the capacity line
    plt.close(fig)


def test_fused_attention_and_inference_change_the_components():
    kw = dict(batch=2, heads=4, dim=256, layers=2, vocab=500, t_min=128, t_max=2048)
    labels = {}
    for mode in ("training", "inference"):
        for attention in ("explicit", "sdpa", "tiled"):
            fig = mem.memory_figure(mode=mode, attention=attention, **kw)
            labels[mode, attention] = {t.get_text() for t in fig.axes[0].get_legend().get_texts()}
            plt.close(fig)
    assert "attention" in labels["training", "explicit"] and "attention" not in labels["training", "sdpa"]
    assert "attention" in labels["training", "tiled"]  # its saved output and lse
    assert "optimizer state" in labels["training", "sdpa"] and "optimizer state" not in labels["inference", "sdpa"]
    assert "kv cache" in labels["inference", "explicit"] and "kv cache" not in labels["training", "explicit"]


def test_measured_points_are_overlaid_where_given():
    pts = [(256, 3 * 2**20), (512, 9 * 2**20)]
    fig = mem.memory_figure(batch=1, heads=2, dim=32, layers=1, vocab=50, t_min=128, t_max=1024, measured=pts, capacity_gib=24)
    offsets = fig.axes[0].collections[-1].get_offsets()
    assert np.allclose(offsets, [(t, b / GiB) for t, b in pts])
    plt.close(fig)


def test_bad_configuration_raises_and_the_explorer_shows_a_message(monkeypatch):
    with pytest.raises(ValueError, match="divisible"):
        mem.memory_figure(dim=100, heads=3)
    monkeypatch.setenv("TINYTF_HEADLESS", "1")
    fig = mem.memory_explorer(dim=1024, heads=16, layers=2, t_max=4096)
    assert isinstance(fig, Figure) and fig.axes[0].get_xscale() == "log"
    plt.close(fig)


def test_the_explorer_builds_live_controls(monkeypatch):
    monkeypatch.setenv("TINYTF_HEADLESS", "0")
    import ipywidgets as widgets

    ui = mem.memory_explorer(batch=2, heads=4, dim=256, layers=2, t_max=2048)
    assert isinstance(ui, widgets.VBox)
    descriptions = {w.description for w in ui.children[0].children}
    assert {"B", "H", "D", "layers", "dtype", "mode", "attention", "GiB"} <= descriptions
    plt.close("all")
