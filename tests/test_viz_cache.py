"""The KV-cache widget: curves are tinytf.memory.kv_cache_bytes, capacity lines and fits are right."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.figure import Figure

from tinytf.memory import GiB, kv_cache_bytes
from tinytf.viz import cache as vc
from tinytf.viz._front import figure_or_message


def _line(fig, label):
    return next(line for line in fig.axes[0].get_lines() if line.get_label() == label)


def test_bold_curve_is_the_kv_cache_formula():
    kw = dict(layers=6, heads=8, head_dim=64, dtype="bf16", t_min=128, t_max=8192)
    fig = vc.cache_figure(batch=4, **kw)
    ts, ys = _line(fig, "KV cache, B=4").get_data()
    assert ts[0] == 128 and ts[-1] == 8192
    for t, y in zip(ts, ys):
        assert np.isclose(y * GiB, kv_cache_bytes(4, 6, 8, int(t), 64, "bf16"))
    plt.close(fig)
    # linear in B and in layers: doubling either doubles every point
    for change in ({"batch": 8}, {"batch": 4, "layers": 12}):
        other = vc.cache_figure(**(kw | change))
        ys2 = _line(other, f"KV cache, B={change['batch']}").get_data()[1]
        assert np.allclose(ys2, 2 * ys)
        plt.close(other)


def test_tokens_that_fit_is_the_largest_fitting_context():
    kw = dict(batch=3, layers=5, heads=4, head_dim=32, dtype="fp32")
    cap = 7 * 2**20
    fit = vc.cache_tokens_that_fit(cap, **kw)
    assert kv_cache_bytes(3, 5, 4, fit, 32, "fp32") <= cap < kv_cache_bytes(3, 5, 4, fit + 1, 32, "fp32")
    assert vc.cache_tokens_that_fit(cap, reserved_bytes=cap - 1, **kw) == 0
    assert vc.cache_tokens_that_fit(cap, reserved_bytes=cap // 2, **kw) < fit


def test_capacity_lines_subtract_the_weights_and_mark_the_fit():
    kw = dict(batch=16, layers=32, heads=32, head_dim=128, dtype="fp16", reserved_gib=14.0)
    fig = vc.cache_figure(**kw)
    lines = fig.axes[0].get_lines()
    for cap in vc.CAPACITIES_GIB:
        assert any(np.allclose(line.get_ydata(), cap - 14.0) for line in lines)  # horizontal: capacity minus weights
        fit = vc.cache_tokens_that_fit(cap * GiB, batch=16, layers=32, heads=32, head_dim=128, dtype="fp16",
                                       reserved_bytes=14 * GiB)
        assert any(np.allclose(line.get_xdata(), fit) for line in lines)  # vertical: where B=16 stops fitting
    texts = {t.get_text() for t in fig.axes[0].texts}
    assert any(t.startswith("T ≤ ") for t in texts) and {"B=1", "B=8", "B=64"} <= texts
    plt.close(fig)
    # weights larger than a device leave no line for it
    fig = vc.cache_figure(reserved_gib=100.0)
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert not any(lab.startswith("24 GiB") or lab.startswith("80 GiB") for lab in labels)
    assert any(lab.startswith("141 GiB") for lab in labels)
    plt.close(fig)


def test_bad_arguments_raise_and_the_explorer_falls_back_headless(monkeypatch):
    with pytest.raises(ValueError, match="layers must be positive"):
        vc.cache_figure(layers=0)
    with pytest.raises(ValueError, match="t_min < t_max"):
        vc.cache_figure(t_min=512, t_max=256)
    monkeypatch.setenv("TINYTF_HEADLESS", "1")
    monkeypatch.setattr("IPython.display.display", lambda *a, **k: None)
    fig = vc.cache_explorer(batch=2, layers=4, heads=4, head_dim=64, dtype="fp32", t_max=4096)
    assert isinstance(fig, Figure)
    assert _line(fig, "KV cache, B=2").get_data()[0][-1] == 4096
    plt.close(fig)
    msg = figure_or_message(vc.cache_figure, layers=0)  # the live UI shows the error instead of raising
    assert "layers must be positive" in msg.axes[0].texts[0].get_text()
    plt.close(msg)


def test_kv_heads_divide_the_curve_and_the_window_flattens_it():
    kw = dict(batch=2, layers=8, heads=32, head_dim=128, dtype="fp16", t_min=256, t_max=65536)
    mha = _line(fig := vc.cache_figure(**kw), "KV cache, B=2").get_ydata()
    plt.close(fig)
    for kv in (8, 1):
        fig = vc.cache_figure(kv_heads=kv, **kw)
        ts, ys = _line(fig, "KV cache, B=2").get_data()
        assert np.allclose(ys * (32 // kv), mha)  # exactly heads / kv_heads smaller
        assert "K/V heads=" + str(kv) in fig.axes[0].get_title()
        plt.close(fig)
        fit = vc.cache_tokens_that_fit(24 * GiB, batch=2, layers=8, heads=32, head_dim=128, dtype="fp16", kv_heads=kv)
        assert kv_cache_bytes(2, 8, 32, fit, 128, "fp16", kv_heads=kv) <= 24 * GiB < kv_cache_bytes(2, 8, 32, fit + 1, 128, "fp16",
                                                                                                     kv_heads=kv)
    fig = vc.cache_figure(window=4096, **kw)
    ts, ys = _line(fig, "KV cache, B=2").get_data()
    for t, y in zip(ts, ys):
        assert np.isclose(y * GiB, kv_cache_bytes(2, 8, 32, min(int(t), 4096), 128, "fp16"))
    assert any("every T fits" in line.get_label() for line in fig.axes[0].get_lines())
    plt.close(fig)
    with pytest.raises(ValueError, match="kv_heads=3 does not divide heads=32"):
        vc.cache_figure(kv_heads=3, **kw)


def test_update_in_place_follows_kv_heads_and_window():
    fig = vc.cache_figure(heads=8)
    assert vc.update_cache_figure(fig, heads=8, kv_heads=2, window=8192)
    fresh = vc.cache_figure(heads=8, kv_heads=2, window=8192)
    assert np.allclose(_line(fig, "KV cache, B=1").get_ydata(), _line(fresh, "KV cache, B=1").get_ydata())
    assert fig.axes[0].get_title() == fresh.axes[0].get_title()
    plt.close(fig)
    plt.close(fresh)
    assert vc._optional(3, [1, 2, 4], "= H") == [("= H", None), ("1", 1), ("2", 2), ("3", 3), ("4", 4)]
