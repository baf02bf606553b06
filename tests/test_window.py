"""Sliding-window attention: the window mask, and the same results as PyTorch on every backend (the rolling
cache that decodes such a model is tested in test_rolling.py)."""

import pytest
import torch
import torch.nn.functional as F

from tinytf import CausalSelfAttention, TinyLanguageModel, causal_mask

BACKENDS = ["explicit", "sdpa", "tiled"]


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
    with pytest.raises(ValueError, match="window must be a positive integer"):
        TinyLanguageModel(window=0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kv_heads", [None, 2])
def test_windowed_attention_matches_pytorch_on_every_backend(device, backend, kv_heads):
    torch.manual_seed(1)
    attn = CausalSelfAttention(32, 4, 40, kv_heads=kv_heads, window=5, backend=backend).to(device).eval()
    x = torch.randn(2, 40, 32, device=device)
    q, k, v = attn.project(x)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(40, window=5, device=device), enable_gqa=True)
    with torch.no_grad():
        torch.testing.assert_close(attn(x), attn.proj(attn.merge_heads(want)))
        full = CausalSelfAttention(32, 4, 40, kv_heads=kv_heads, backend=backend).to(device).eval()
        full.load_state_dict(attn.state_dict())
        assert not torch.allclose(full(x), attn(x))  # the window changes the output
        torch.testing.assert_close(full(x[:, :5]), attn(x[:, :5]))  # ... not while T <= window


def test_windowed_lm_backends_agree_across_tiles(device):
    """T = 150 spans three 64-row tiles of the tiled backend; window 70 crosses tile borders."""
    torch.manual_seed(2)
    models = [TinyLanguageModel(vocab=30, dim=32, heads=4, layers=2, max_tokens=150, window=70, backend=be).to(device).eval()
              for be in BACKENDS]
    for m in models[1:]:
        m.load_state_dict(models[0].state_dict())
    ids = torch.randint(0, 30, (2, 150), device=device)
    with torch.no_grad():
        outs = [m(ids) for m in models]
    for other in outs[1:]:
        torch.testing.assert_close(other, outs[0], atol=1e-5, rtol=1e-5)
