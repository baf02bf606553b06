"""tinytf.causal_mask and tinytf.padding_mask."""

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
