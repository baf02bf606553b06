"""The attention explorer: the pure figure function and its front end (headless and live)."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

import tinytf.viz
from tinytf.viz import attention as att


def pixels(fig: Figure) -> np.ndarray:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=60)
    plt.close(fig)
    return plt.imread(io.BytesIO(buf.getvalue()))


def heatmap(fig: Figure):
    ax = fig.axes[0]
    return ax, ax.images[0]


def hatched(ax) -> list[Rectangle]:
    """The hatched cells that are drawn (one patch per cell exists; the mask decides which show)."""
    return [p for p in ax.get_children() if isinstance(p, Rectangle) and p.get_hatch() and p.get_visible()]


@pytest.mark.parametrize(
    ("sentence", "tokenizer", "expected"),
    [("the cat sat on the mat", "words", ["the", "cat", "sat", "on", "the", "mat"]), ("hi you", "chars", ["h", "i", "␣", "y", "o", "u"])],
)
def test_labels_are_the_tokens_on_both_axes(sentence, tokenizer, expected):
    fig = att.attention_figure(sentence, tokenizer=tokenizer, mask="none")
    ax, _ = heatmap(fig)
    assert isinstance(fig, Figure)
    assert [t.get_text() for t in ax.get_xticklabels()] == expected
    assert [t.get_text() for t in ax.get_yticklabels()] == expected
    plt.close(fig)


def test_padding_pads_to_the_requested_length():
    fig = att.attention_figure("a b c", mask="padding", pad_to=5)
    ax, _ = heatmap(fig)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c", att.PAD, att.PAD]
    plt.close(fig)
    with pytest.raises(ValueError, match="pad_to"):
        att.attention_figure("a b c", mask="padding", pad_to=2)


@pytest.mark.parametrize("mask", att.MASKS)
def test_masked_cells_are_drawn_distinctly(mask):
    tokens, weights, allowed, _ = att.explorer_weights("one two three four", mask=mask, heads=3)
    fig = att.attention_figure("one two three four", mask=mask, heads=3, head=1)
    ax, im = heatmap(fig)
    blocked = ~allowed.numpy()
    data = im.get_array()
    # blocked cells are masked out of the colour scale (drawn in the 'bad' grey) and hatched
    assert np.array_equal(np.ma.getmaskarray(data), blocked)
    assert len(hatched(ax)) == int(blocked.sum())
    assert {(round(p.get_x() + 0.5), round(p.get_y() + 0.5)) for p in hatched(ax)} == {(j, i) for i, j in zip(*np.nonzero(blocked))}
    cmap = im.get_cmap()  # the grey for blocked cells is no colour a real weight can take
    lut = cmap(np.linspace(0.0, 1.0, 256))[:, :3]
    assert np.abs(lut - np.asarray(cmap.get_bad()[:3])).sum(1).min() > 0.3
    plt.close(fig)
    # and the weights behind them: zero where blocked, rows with something to see sum to 1
    assert torch.all(weights[:, ~allowed] == 0)
    live = allowed.any(-1)
    torch.testing.assert_close(weights.sum(-1)[:, live], torch.ones(3, int(live.sum())))


def test_mask_kinds_block_what_they_say():
    t = 4
    _, _, none, _ = att.explorer_weights("a b c d", mask="none")
    _, _, causal, _ = att.explorer_weights("a b c d", mask="causal")
    toks, _, padding, _ = att.explorer_weights("a b c d", mask="padding", pad_to=6)
    _, _, both, _ = att.explorer_weights("a b c d", mask="both", pad_to=6)
    assert none.all()
    assert torch.equal(causal, torch.ones(t, t, dtype=torch.bool).tril())
    is_pad = torch.tensor([w == att.PAD for w in toks])
    assert torch.equal(padding, ~is_pad[None, :].expand(6, 6))
    assert torch.equal(both, padding & torch.ones(6, 6, dtype=torch.bool).tril())


def test_left_padding_under_causal_gives_zero_rows_not_nan():
    toks, weights, allowed, _ = att.explorer_weights("a b c", mask="both", pad_to=5, pad_side="left")
    assert toks[:2] == [att.PAD, att.PAD]
    assert not allowed[:2].any()
    assert torch.isfinite(weights).all()
    assert torch.all(weights[:, :2] == 0)


def test_same_options_same_picture_and_different_options_different_pictures():
    base = dict(sentence="the cat sat on the mat", heads=2, head=0, mask="causal", scaling="1/sqrt(d)")
    ref = pixels(att.attention_figure(**base))
    assert np.array_equal(ref, pixels(att.attention_figure(**base)))  # deterministic
    for change in ({"mask": "none"}, {"scaling": "none"}, {"head": 1}, {"heads": 4}, {"sentence": "the dog sat on the mat"}):
        other = pixels(att.attention_figure(**(base | change)))
        assert other.shape != ref.shape or not np.array_equal(other, ref), change


def test_scaling_options_order_sharpness():
    def entropy(w):
        return -(w.clamp_min(1e-12).log() * w).sum(-1).mean().item()

    opts = dict(mask="none", heads=2)
    _, w_sqrt, _, s_sqrt = att.explorer_weights(**opts, scaling="1/sqrt(d)")
    _, w_none, _, s_none = att.explorer_weights(**opts, scaling="none")
    _, w_t1, _, s_t1 = att.explorer_weights(**opts, scaling="temperature", temperature=1.0)
    _, w_hot, _, _ = att.explorer_weights(**opts, scaling="temperature", temperature=4.0)
    assert s_none == 1.0 and s_sqrt == pytest.approx(1 / 12**0.5)
    torch.testing.assert_close(w_t1, w_sqrt)  # temperature 1 is the standard scaling
    assert entropy(w_none) < entropy(w_sqrt) < entropy(w_hot)  # larger scale -> sharper softmax


def test_explorer_does_not_depend_on_the_global_seed():
    tokens, weights, allowed, _ = att.explorer_weights("x y z w", mask="causal", heads=4)
    torch.manual_seed(123)  # the explorer must not depend on the global seed
    _, again, _, _ = att.explorer_weights("x y z w", mask="causal", heads=4)
    assert torch.equal(weights, again)
    assert weights.shape == (4, len(tokens), len(tokens))


def test_bad_options_raise_clear_errors():
    with pytest.raises(ValueError, match="head must lie"):
        att.attention_figure(heads=2, head=2)
    with pytest.raises(ValueError, match="not divisible"):
        att.explorer_weights(heads=5)
    with pytest.raises(ValueError, match="empty"):
        att.explorer_weights("   ")
    with pytest.raises(ValueError, match="mask must be"):
        att.explorer_weights(mask="future")
    with pytest.raises(ValueError, match="temperature"):
        att.explorer_weights(scaling="temperature", temperature=0.0)


def test_explorer_headless_returns_the_static_figure(monkeypatch):
    monkeypatch.setenv("TINYTF_HEADLESS", "1")
    fig = tinytf.viz.attention_explorer("a b c", mask="padding")
    assert isinstance(fig, Figure)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["a", "b", "c", att.PAD, att.PAD]


def test_explorer_live_wires_controls_to_the_figure(monkeypatch):
    import ipywidgets as widgets

    monkeypatch.setenv("TINYTF_HEADLESS", "0")
    ui = tinytf.viz.attention_explorer("a b c", heads=8, head=5)
    assert isinstance(ui, widgets.VBox)
    controls = {w.description: w for w in ui.children[0].children}
    assert {"sentence", "tokens", "mask", "scaling", "temperature", "heads", "head"} <= set(controls)
    fig = ui.live.fig
    assert fig.axes[0].get_title().startswith("head 5 of 8")
    controls["mask"].value = "both"  # padding: two more tokens, so a new figure
    _, _, allowed, _ = att.explorer_weights("a b c", mask="both", heads=8)
    assert np.array_equal(np.ma.getmaskarray(heatmap(ui.live.fig)[1].get_array()), ~allowed.numpy())
    controls["heads"].value = 2  # head must follow: its slider shrinks to [0, 1]
    assert controls["head"].max == 1 and ui.live.fig.axes[0].get_title().startswith("head 1 of 2")
    n = ui.live.rebuilt
    controls["sentence"].value = ""  # an invalid choice shows a message instead of raising
    assert ui.live.rebuilt == n + 1 and "empty" in ui.live.fig.axes[0].texts[0].get_text()
    plt.close("all")


def test_explorer_rejects_impossible_head_counts():
    with pytest.raises(ValueError, match="heads must be one of"):
        tinytf.viz.attention_explorer(heads=5)
