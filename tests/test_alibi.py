"""tinytf.alibi: the paper's slopes, the bias by distance, its composition with causal, window and padding masks, and
ALiBi attention in a layer (every backend that takes a bias, with the static and the rolling cache)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tinytf
from tinytf.alibi import alibi_bias, alibi_scores_bias, alibi_slopes, allowed_keys


def test_slopes_follow_the_paper():
    assert alibi_slopes(8).tolist() == [2.0 ** -(i + 1) for i in range(8)]  # 1/2, 1/4, …, 1/256
    assert alibi_slopes(4).tolist() == [2.0 ** -(2 * (i + 1)) for i in range(4)]  # 1/4, 1/16, 1/64, 1/256
    six = alibi_slopes(6).tolist()  # 4 heads' slopes, then every other slope of 8 heads': 1/2, 1/8
    assert six == alibi_slopes(4).tolist() + [2.0 ** -1, 2.0 ** -3]
    assert len(alibi_slopes(12)) == 12 and alibi_slopes(1).tolist() == [2.0 ** -8]
    with pytest.raises(ValueError, match="positive number of heads"):
        alibi_slopes(0)


def test_bias_by_distance_and_the_mask_it_composes_with():
    slopes = alibi_slopes(2)
    pos = torch.arange(4)
    bias = alibi_bias(slopes, pos, pos)
    assert bias.shape == (2, 4, 4)
    assert bias[0, 3].tolist() == [-3 / 16, -2 / 16, -1 / 16, 0.0] and bias[1, 3, 0].item() == -3 / 256
    assert torch.equal(allowed_keys(pos, pos), tinytf.causal_mask(4))
    assert torch.equal(allowed_keys(pos, pos, window=2), tinytf.causal_mask(4, window=2))
    end = allowed_keys(torch.arange(5, 7), torch.arange(7))  # queries at 5, 6 over keys 0 … 6: end-aligned
    assert torch.equal(end, tinytf.causal_mask(2, 7))
    pad = tinytf.padding_mask([2, 4], 4, side="left")  # [B, 1, 1, T]
    full = alibi_scores_bias(slopes, pos, pos, mask=pad)
    assert full.shape == (2, 2, 4, 4) and torch.isinf(full[0, :, 3, :2]).all() and full[0, 0, 3, 2].item() == -1 / 16
    ring = torch.tensor([8, 5, 6, 7])  # a rolling cache's keys in slot order
    assert allowed_keys(torch.tensor([8]), ring, window=4).all()


def _manual(attn: tinytf.CausalSelfAttention, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    q, k, v = attn.project(x)
    t = x.size(1)
    bias = alibi_bias(attn.alibi_slopes, torch.arange(t), torch.arange(t))
    scores = q @ tinytf.repeat_kv(k, attn.groups).transpose(-2, -1) / attn.head_dim ** 0.5 + bias
    allowed = tinytf.causal_mask(t, window=attn.window) if mask is None else tinytf.causal_mask(t, window=attn.window) & mask
    out = scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ tinytf.repeat_kv(v, attn.groups)
    return attn.proj(attn.merge_heads(out))


@pytest.mark.parametrize("backend", ["explicit", "sdpa"])
@pytest.mark.parametrize("window", [None, 3])
def test_alibi_attention_is_the_formula(backend, window):
    torch.manual_seed(0)
    cfg = tinytf.ModelConfig(dim=32, heads=4, kv_heads=2, positions="alibi", backend=backend, window=window)
    attn = tinytf.CausalSelfAttention(cfg).eval()
    x = torch.randn(2, 9, 32)
    with torch.no_grad():
        torch.testing.assert_close(attn(x), _manual(attn, x), atol=1e-5, rtol=1e-5)
        pad = tinytf.padding_mask([9, 7], 9)  # no query left with nothing to see, even under the window
        out = attn(x, pad)
        torch.testing.assert_close(out, _manual(attn, x, pad), atol=1e-5, rtol=1e-5)


def test_alibi_in_the_caches_equals_the_full_forward():
    torch.manual_seed(1)
    for window, cache_type in ((None, tinytf.KVCache), (4, tinytf.RollingKVCache)):
        model = tinytf.TinyLanguageModel(vocab=30, dim=32, heads=4, layers=2, max_tokens=16, positions="alibi", window=window).eval()
        ids = torch.randint(0, 30, (2, 24))  # past max_tokens: ALiBi has no table
        with torch.inference_mode():
            full = model(ids)
            cache = cache_type.for_model(model, 2) if window else cache_type.for_model(model, 2, max_tokens=24)
            steps = [model(ids[:, :6], cache=cache)] + [model(ids[:, t : t + 1], cache=cache) for t in range(6, 24)]
        torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_alibi_is_refused_by_the_tiled_backend_and_sdpa_gets_a_float_mask():
    with pytest.raises(ValueError, match="backend='explicit' or 'sdpa' with ALiBi"):
        tinytf.ModelConfig(positions="alibi", backend="tiled")
    slopes = alibi_slopes(2)
    pos = torch.arange(5)
    float_mask = alibi_scores_bias(slopes, pos, pos)
    q, k, v = torch.randn(3, 1, 2, 5, 4).unbind(0)
    ref = tinytf.scaled_dot_product_attention(q, k, v, tinytf.causal_mask(5), bias=alibi_bias(slopes, pos, pos))
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask), ref, atol=1e-6, rtol=1e-6)
