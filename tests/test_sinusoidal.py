"""tinytf.sinusoidal: Vaswani et al.'s table, its offsets as rotations, and the cached module."""

from __future__ import annotations

import math

import pytest
import torch

from tinytf.sinusoidal import SinusoidalPositions, sinusoidal_table


def test_the_formula():
    table = sinusoidal_table(torch.arange(6), 8)
    assert table.shape == (6, 8) and table.dtype == torch.float32
    p, i = 5, 2
    assert table[p, 2 * i].item() == pytest.approx(math.sin(p / 10000 ** (2 * i / 8)), abs=1e-6)
    assert table[p, 2 * i + 1].item() == pytest.approx(math.cos(p / 10000 ** (2 * i / 8)), abs=1e-6)
    assert table[0, 0::2].abs().max() == 0 and (table[0, 1::2] == 1).all()
    with pytest.raises(ValueError, match="dim must be even"):
        sinusoidal_table(torch.arange(3), 7)


def test_an_offset_is_a_rotation_of_each_pair():
    table = sinusoidal_table(torch.arange(200), 16).double().unflatten(-1, (8, 2))  # [T, pairs, (sin, cos)]
    k = 7
    theta = 1.0 / 10000 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    c, s = torch.cos(k * theta), torch.sin(k * theta)
    for p in (0, 50, 150):
        sin_p, cos_p = table[p].unbind(-1)
        turned = torch.stack([sin_p * c + cos_p * s, cos_p * c - sin_p * s], -1)  # sin(a+b), cos(a+b)
        torch.testing.assert_close(turned, table[p + k], atol=1e-5, rtol=0)


def test_the_module_grows_its_table():
    pe = SinusoidalPositions(8)
    out = pe(torch.tensor([[0, 1], [300, 301]]))
    assert out.shape == (2, 2, 8) and pe._table.size(0) == 512
    torch.testing.assert_close(out[1], sinusoidal_table(torch.tensor([300, 301]), 8))
    assert list(pe.parameters()) == [] and pe.state_dict() == {}
