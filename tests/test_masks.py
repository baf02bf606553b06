"""tinytf.causal_mask (with and without a sliding window) and tinytf.padding_mask."""

import pytest
import torch

from tinytf import causal_mask, padding_mask


def test_causal_mask_square_is_lower_triangular():
    m = causal_mask(4)
    assert m.dtype == torch.bool and m.shape == (4, 4)
    assert torch.equal(m, ~torch.triu(torch.ones(4, 4, dtype=torch.bool), diagonal=1))
    assert m.diagonal().all()  # a token may attend to itself


def test_causal_mask_end_aligned():
    m = causal_mask(2, 5)
    assert m.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    assert causal_mask(1, 7).all()  # a decode step sees the whole cache


def test_causal_mask_t1():
    assert causal_mask(1).tolist() == [[True]]


def test_causal_mask_errors():
    with pytest.raises(ValueError, match="t_k >= t_q"):
        causal_mask(5, 3)
    with pytest.raises(ValueError, match="positive"):
        causal_mask(0)


def test_padding_mask_right_and_left():
    m = padding_mask([3, 1], 4)
    assert m.shape == (2, 1, 1, 4) and m.dtype == torch.bool
    assert m[:, 0, 0].tolist() == [[True, True, True, False], [True, False, False, False]]
    m = padding_mask(torch.tensor([3, 1]), 4, side="left")
    assert m[:, 0, 0].tolist() == [[False, True, True, True], [False, False, False, True]]


def test_padding_mask_errors():
    with pytest.raises(ValueError, match=r"\[0, 4\]"):
        padding_mask([5], 4)
    with pytest.raises(ValueError, match="1-D"):
        padding_mask([[1, 2]], 4)
    with pytest.raises(ValueError, match="side"):
        padding_mask([1], 4, side="middle")


@pytest.mark.parametrize("t_q,t_k", [(1, 1), (5, 5), (3, 9), (1, 7), (8, 8)])
@pytest.mark.parametrize("window", [1, 2, 3, 7, 20])
def test_window_mask_is_the_last_window_keys_end_aligned(t_q, t_k, window):
    mask = causal_mask(t_q, t_k, window=window)
    for i in range(t_q):
        pos = t_k - t_q + i  # the query's absolute position
        assert mask[i].nonzero().flatten().tolist() == list(range(max(0, pos - window + 1), pos + 1))
    assert mask.sum(-1).max() <= window
    if window >= t_k:
        assert torch.equal(mask, causal_mask(t_q, t_k))
    if window == 1:
        assert torch.equal(mask, torch.eye(t_k, dtype=torch.bool)[t_k - t_q :])


def test_window_must_be_a_positive_integer():
    for bad in (0, -3, True, 2.5):
        with pytest.raises(ValueError, match="window must be a positive integer"):
            causal_mask(4, window=bad)
