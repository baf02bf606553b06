"""Sliding-window attention and the rolling cache: the same tokens as recomputing under the window mask."""

import warnings

import pytest
import torch
import torch.nn.functional as F

from tinytf import CausalSelfAttention, KVCache, RollingKVCache, TinyLanguageModel, causal_mask, generate
from tinytf.memory import kv_cache_bytes, ledger

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


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kv_heads", [None, 1])
def test_rolling_cache_generation_equals_recomputation_token_for_token(device, backend, kv_heads):
    torch.manual_seed(3)
    window = 6
    model = TinyLanguageModel(vocab=50, dim=32, heads=4, layers=2, max_tokens=64, window=window, kv_heads=kv_heads,
                              backend=backend).to(device)
    prompt = torch.randint(0, 50, (3, 9), device=device)  # longer than the window: the prefill already rolls
    new = 4 * window + 10
    cached = generate(model, prompt, new, temperature=0)  # a RollingKVCache: the model has a window
    recomputed = generate(model, prompt, new, temperature=0, use_cache=False)  # full forward, window mask
    assert cached.shape == (3, 9 + new) and torch.equal(cached, recomputed)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rolling_cache_logits_match_recomputation_with_chunks(device, backend):
    torch.manual_seed(4)
    model = TinyLanguageModel(vocab=50, dim=32, heads=4, layers=3, max_tokens=48, window=5, kv_heads=2,
                              backend=backend).to(device).eval()
    ids = torch.randint(0, 50, (2, 48), device=device)
    rolling, static = RollingKVCache.for_model(model, 2), KVCache.for_model(model, 2)
    with torch.no_grad():
        full = model(ids)
        cuts = [0, 3, 4, 11, 12, 13, 20] + list(range(21, 49))  # prefills of 3, 1, 7, 1, 1, 7 tokens, then decode
        for a, b in zip(cuts, cuts[1:]):
            for cache in (rolling, static):
                torch.testing.assert_close(model(ids[:, a:b], cache=cache), full[:, a:b], atol=1e-5, rtol=1e-5)
    assert rolling.seen == static.seen == 48 and rolling.nbytes() * 48 == static.nbytes() * 5


def test_rolling_cache_memory_stays_flat_over_four_windows():
    torch.manual_seed(5)
    window, layers, kv_heads = 8, 2, 2
    model = TinyLanguageModel(vocab=40, dim=32, heads=4, layers=layers, max_tokens=64, window=window, kv_heads=kv_heads).eval()
    cache = RollingKVCache.for_model(model, 2)
    measured, static_sizes = [], []
    nxt = torch.randint(0, 40, (2, 1))
    with torch.no_grad():
        for step in range(4 * window):
            nxt = model(nxt, cache=cache)[:, -1:].argmax(-1)
            measured.append(sum(t.untyped_storage().nbytes() for t in (cache.k, cache.v)))  # bytes the tensors hold
            static_sizes.append(kv_cache_bytes(2, layers, 4, step + 1, 8, torch.float32, kv_heads=kv_heads))
    assert cache.seen == 4 * window and len(set(measured)) == 1
    assert measured[0] == cache.nbytes() == kv_cache_bytes(2, layers, 4, 10**6, 8, torch.float32, kv_heads=kv_heads, window=window)
    assert static_sizes[-1] == 4 * measured[0]  # a static cache would have grown to four times the rolling one
    assert ledger(model, 2, 4 * window, torch.float32, training=False).kv_cache == measured[0]


def test_rolling_cache_errors_teach():
    windowed = TinyLanguageModel(vocab=20, dim=16, heads=2, layers=1, max_tokens=16, window=4).eval()
    plain = TinyLanguageModel(vocab=20, dim=16, heads=2, layers=1, max_tokens=16).eval()
    with pytest.raises(ValueError, match="needs a model with a sliding window"):
        RollingKVCache.for_model(plain, 1)
    ids = torch.randint(0, 20, (1, 3))
    with pytest.raises(ValueError, match="window=4 needs attention with the same window.*window=None"):
        plain(ids, cache=RollingKVCache(1, 1, 2, 4, 8))
    with pytest.raises(ValueError, match="ring order"):
        windowed.blocks[0].attn(torch.randn(1, 3, 16), torch.ones(1, 1, 1, 3, dtype=torch.bool),
                                cache=RollingKVCache.for_model(windowed, 1))
    with pytest.raises(ValueError, match=r"kv_heads=2, t, d_head=8"):
        RollingKVCache(1, 1, 2, 4, 8).update(0, torch.randn(1, 3, 1, 8), torch.randn(1, 3, 1, 8))
    cache = RollingKVCache.for_model(windowed, 1)
    with torch.no_grad(), pytest.raises(ValueError, match="bound the memory, not the positions"):
        windowed(torch.randint(0, 20, (1, 16)), cache=cache)  # 16 positions: the whole position table
        windowed(torch.randint(0, 20, (1, 1)), cache=cache)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = generate(windowed, ids, 40, temperature=0)
    assert out.shape == (1, 16) and "rolling cache bounds memory to window=4" in str(caught[0].message)
    assert "RollingKVCache(layers=1, B=1, kv_heads=2, window=4, d_head=8, seen=16" in repr(cache)
