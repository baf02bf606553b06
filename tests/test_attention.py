"""tinytf.scaled_dot_product_attention: properties, parity with PyTorch, and its errors."""

import math

import pytest
import torch
import torch.nn.functional as F

import tinytf
from tinytf import causal_mask, padding_mask, scaled_dot_product_attention


def rand_qkv(b=2, h=3, tq=5, tk=7, d=8, dv=6, device="cpu", dtype=torch.float32):
    q = torch.randn(b, h, tq, d, device=device, dtype=dtype)
    k = torch.randn(b, h, tk, d, device=device, dtype=dtype)
    v = torch.randn(b, h, tk, dv, device=device, dtype=dtype)
    return q, k, v


def test_weights_rows_sum_to_one_and_shapes(device):
    q, k, v = rand_qkv(device=device)
    out, w = scaled_dot_product_attention(q, k, v, return_weights=True)
    assert out.shape == (2, 3, 5, 6) and w.shape == (2, 3, 5, 7)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 5, device=device))
    assert (w >= 0).all()


def test_matches_formula_written_out(device):
    q, k, v = rand_qkv(b=1, h=1, device=device)
    expected = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1) @ v
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v), expected)


@pytest.mark.parametrize("tq,tk", [(5, 5), (1, 9), (4, 11)])
def test_parity_with_torch_sdpa(device, tq, tk):
    q, k, v = rand_qkv(tq=tq, tk=tk, dv=8, device=device)
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v))
    mask = torch.rand(2, 1, tq, tk, device=device) > 0.3
    mask[..., 0] = True  # every row sees something
    torch.testing.assert_close(
        scaled_dot_product_attention(q, k, v, mask), F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    )
    torch.testing.assert_close(
        scaled_dot_product_attention(q, k, v, scale=0.3), F.scaled_dot_product_attention(q, k, v, scale=0.3)
    )


def test_causal_parity_square(device):
    q, k, v = rand_qkv(tq=6, tk=6, device=device)
    torch.testing.assert_close(
        scaled_dot_product_attention(q, k, v, is_causal=True), F.scaled_dot_product_attention(q, k, v, is_causal=True)
    )


def test_causal_is_end_aligned_when_keys_outnumber_queries(device):
    q, k, v = rand_qkv(tq=2, tk=5, device=device)
    _, w = scaled_dot_product_attention(q, k, v, is_causal=True, return_weights=True)
    assert (w[..., 0, 4] == 0).all() and (w[..., 0, :4] > 0).all()  # query 0 is position 3
    assert (w[..., 1, :] > 0).all()  # the last query sees every key


def test_no_future_leak(device):
    q, k, v = rand_qkv(tq=6, tk=6, device=device)
    out = scaled_dot_product_attention(q, k, v, is_causal=True)
    k2, v2 = k.clone(), v.clone()
    k2[..., 4:, :] += 10 * torch.randn_like(k2[..., 4:, :])
    v2[..., 4:, :] += 10 * torch.randn_like(v2[..., 4:, :])
    out2 = scaled_dot_product_attention(q, k2, v2, is_causal=True)
    torch.testing.assert_close(out[..., :4, :], out2[..., :4, :])
    assert not torch.allclose(out[..., 4:, :], out2[..., 4:, :])


def test_masked_weights_exactly_zero_and_rest_renormalised(device):
    q, k, v = rand_qkv(b=2, h=2, tq=4, tk=4, device=device)
    pad = padding_mask([4, 2], 4, device=device)  # [2, 1, 1, 4]
    _, w = scaled_dot_product_attention(q, k, v, pad, return_weights=True)
    assert (w[1, ..., 2:] == 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 4, device=device))


def test_fully_masked_row_is_zero_not_nan(device):
    """Left padding under a causal mask: the pad query can see nothing."""
    q, k, v = rand_qkv(b=1, h=1, tq=4, tk=4, device=device)
    q.requires_grad_(True)
    mask = padding_mask([3], 4, side="left", device=device) & causal_mask(4, device=device)
    out, w = scaled_dot_product_attention(q, k, v, mask, return_weights=True)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    assert (out[..., 0, :] == 0).all() and (w[..., 0, :] == 0).all()
    torch.testing.assert_close(w[..., 1:, :].sum(-1), torch.ones(1, 1, 3, device=device))
    out.sum().backward()
    assert torch.isfinite(q.grad).all()
    # PyTorch's fused kernel makes the same choice (safe softmax) on this input
    ref = F.scaled_dot_product_attention(q.detach(), k, v, attn_mask=mask)
    torch.testing.assert_close(out.detach(), ref)


def test_scaling_keeps_logit_spread_constant():
    torch.manual_seed(1)
    spreads = []
    for d in (16, 256):
        q, k = torch.randn(1, 1, 256, d), torch.randn(1, 1, 256, d)
        spreads.append((q @ k.transpose(-2, -1) / math.sqrt(d)).std().item())
    assert abs(spreads[0] - spreads[1]) < 0.2 and abs(spreads[0] - 1) < 0.2


@pytest.mark.parametrize(
    "q_shape,k_shape,v_shape,needle",
    [
        ((2, 5, 8), (2, 7, 4), (2, 7, 6), "same width d"),
        ((2, 5, 8), (2, 7, 8), (2, 6, 6), "same number of positions"),
        ((2, 5, 8), (3, 7, 8), (3, 7, 6), "leading"),
        ((8,), (7, 8), (7, 6), "at least 2-D"),
    ],
)
def test_bad_qkv_shapes_raise_value_error_naming_shapes(q_shape, k_shape, v_shape, needle):
    q, k, v = torch.randn(q_shape), torch.randn(k_shape), torch.randn(v_shape)
    with pytest.raises(ValueError, match=needle) as err:
        scaled_dot_product_attention(q, k, v)
    assert str(list(q_shape)) in str(err.value) or str(list(k_shape)) in str(err.value)


def test_padding_mask_of_rank_two_on_4d_scores_is_caught():
    q, k, v = rand_qkv(b=2, h=2, tq=4, tk=4)
    flat = torch.tensor([[True, True, True, True], [True, True, False, False]])  # [B, T]
    with pytest.raises(ValueError, match=r"\[B, 1, 1, T\]") as err:
        scaled_dot_product_attention(q, k, v, flat)
    assert "[2, 4]" in str(err.value) and "[2, 2, 4, 4]" in str(err.value)
    # the fix the message names works
    out = scaled_dot_product_attention(q, k, v, flat[:, None, None, :])
    assert out.shape == (2, 2, 4, 6)


def test_wrong_dtype_mask_raises():
    q, k, v = rand_qkv(tq=4, tk=4)
    with pytest.raises(ValueError, match="torch.bool") as err:
        scaled_dot_product_attention(q, k, v, torch.ones(4, 4))
    assert "[4, 4]" in str(err.value)


def test_mask_of_too_high_rank_raises():
    q, k, v = rand_qkv(tq=4, tk=4)
    with pytest.raises(ValueError, match="rank 5"):
        scaled_dot_product_attention(q, k, v, torch.ones(1, 1, 1, 4, 4, dtype=torch.bool))


def test_public_api_is_exported():
    for name in tinytf.__all__:
        assert hasattr(tinytf, name), name
        assert getattr(tinytf, name).__doc__, f"{name} needs a docstring"


@pytest.mark.cuda
def test_cuda_half_parity(cuda):
    q, k, v = rand_qkv(device=cuda, dtype=torch.float16, tq=64, tk=64, dv=8)
    torch.testing.assert_close(
        scaled_dot_product_attention(q, k, v, is_causal=True),
        F.scaled_dot_product_attention(q, k, v, is_causal=True),
        atol=2e-3,
        rtol=2e-3,
    )
