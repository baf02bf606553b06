"""tinytf.viz.positions: RoPE's long-range decay, computed from the rotation, and its figure (headless: static)."""

from __future__ import annotations

import matplotlib
import numpy as np

from tinytf.viz.positions import rope_decay, rope_decay_explorer, rope_decay_figure

matplotlib.use("Agg")


def test_the_decay_starts_at_one_and_falls_slower_for_a_larger_base():
    distances = np.array([0, 1, 16, 256, 4096])
    for base in (100.0, 10_000.0, 500_000.0):
        bound, aligned = rope_decay(distances, base, 128)
        assert bound[0] == 1.0 and aligned[0] == 1.0
        assert bound[1] < 1.0 and aligned[1] < 1.0
    near, far = rope_decay(distances, 10_000.0)[1], rope_decay(distances, 500_000.0)[1]
    assert far[3] > near[3] + 0.1  # a larger base turns slower: the scores at 256 tokens stay higher


def test_the_figure_and_its_static_fallback(monkeypatch):
    import matplotlib.pyplot as plt

    fig = rope_decay_figure(base=10_000.0, compare=(100.0, 10_000.0, 500_000.0))
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert len(labels) == 1 + 2 + 1 + 1  # two other bases, the bound, the aligned score, the zero line
    assert any("500,000" in label for label in labels) and fig.axes[0].get_xscale() == "log"
    plt.close(fig)
    monkeypatch.setenv("TINYTF_HEADLESS", "1")
    static = rope_decay_explorer(base=10_000.0)
    assert hasattr(static, "axes")  # headless: the figure itself
    plt.close(static)
