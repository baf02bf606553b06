"""KVCache: preallocated buffers written in place; decoding with it gives exactly what recomputation gives."""

import pytest
import torch

from tinytf import CausalSelfAttention, KVCache, TinyLanguageModel, generate
from tinytf.config import BACKENDS


@pytest.mark.parametrize("backend", ["explicit", "sdpa", "tiled"])
def test_decode_logits_match_recomputation_every_step(device, backend):
    torch.manual_seed(0)
    model = TinyLanguageModel(vocab=40, dim=32, heads=4, layers=3, max_tokens=32, backend=backend).to(device).eval()
    ids = torch.randint(0, 40, (3, 20), device=device)
    cache = KVCache.for_model(model, batch=3)
    with torch.no_grad():
        full = model(ids)
        pre = model(ids[:, :8], cache=cache)  # prefill
        torch.testing.assert_close(pre, full[:, :8], atol=1e-5, rtol=1e-5)
        for t in range(8, 20):  # one decode step per token
            step = model(ids[:, t : t + 1], cache=cache)
            torch.testing.assert_close(step[:, 0], full[:, t], atol=1e-5, rtol=1e-5)
    assert cache.lengths == [20, 20, 20] and cache.seen == 20


def test_cache_is_preallocated_and_written_in_place(small_lm):
    cache = KVCache.for_model(small_lm, batch=2)
    ptr = cache.k.data_ptr()
    with torch.no_grad():
        small_lm(torch.randint(0, 40, (2, 4)), cache=cache)
        small_lm(torch.randint(0, 40, (2, 1)), cache=cache)
    assert cache.k.data_ptr() == ptr and cache.shape == (3, 2, 4, 32, 8)
    assert cache.nbytes() == 2 * 3 * 2 * 4 * 32 * 8 * 4


def test_cache_overflow_and_shape_errors(small_lm):
    cache = KVCache(3, 2, 4, 6, 8)
    with pytest.raises(ValueError, match=r"overflow.*holds 6 tokens.*4 are written.*3 more"):
        cache.update(0, torch.zeros(2, 4, 4, 8), torch.zeros(2, 4, 4, 8))
        cache.update(0, torch.zeros(2, 4, 3, 8), torch.zeros(2, 4, 3, 8))
    with pytest.raises(ValueError, match=r"\[B=2, kv_heads=4, t, d_head=8\].*\[3, 4, 1, 8\]"):
        cache.update(1, torch.zeros(3, 4, 1, 8), torch.zeros(3, 4, 1, 8))
    small = KVCache.for_model(small_lm, batch=1, max_tokens=4)
    with torch.no_grad():
        with pytest.raises(ValueError, match="overflow"):
            small_lm(torch.randint(0, 40, (1, 5)), cache=small)
    with pytest.raises(ValueError, match=r"torch.float32 .* torch.float64.*for_model"):
        KVCache(3, 2, 4, 6, 8).update(0, torch.zeros(2, 4, 1, 8, dtype=torch.float64), torch.zeros(2, 4, 1, 8, dtype=torch.float64))
    wrong_batch = KVCache.for_model(small_lm, batch=2)
    with pytest.raises(ValueError, match="B=2"):
        small_lm(torch.randint(0, 40, (3, 2)), cache=wrong_batch)


def test_reset_cache_gives_the_same_logits_as_a_fresh_one(small_lm, device):
    a, b = torch.randint(0, 40, (2, 2, 6), device=device)
    cache = KVCache.for_model(small_lm, batch=2)
    with torch.no_grad():
        small_lm(a, cache=cache)
        cache.reset()
        assert cache.seen == 0
        reused = small_lm(b, cache=cache)
        torch.testing.assert_close(reused, small_lm(b))


def test_decode_step_weights_cover_every_cached_key(device):
    torch.manual_seed(2)
    attn = CausalSelfAttention(16, 2, 12).to(device).eval()
    cache = KVCache(1, 2, 2, 12, 8, device=device)
    x = torch.randn(2, 6, 16, device=device)
    with torch.no_grad():
        full, w_full = attn(x, return_weights=True)
        attn(x[:, :5], cache=cache)
        fast = attn(x[:, 5:], cache=cache)  # decode fast path (fused kernel)
        cache.lengths = [5]
        slow, w = attn(x[:, 5:], cache=cache, return_weights=True)  # explicit path, same step
    torch.testing.assert_close(fast, full[:, 5:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(slow, fast, atol=1e-5, rtol=1e-5)
    assert w.shape == (2, 2, 1, 6) and (w > 0).all()  # one query sees all 6 keys, none masked
    torch.testing.assert_close(w, w_full[:, :, 5:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kv_heads", [2, 1])
def test_cache_stores_kv_heads_and_decoding_matches_recomputation(device, backend, kv_heads):
    torch.manual_seed(kv_heads)
    model = TinyLanguageModel(vocab=40, dim=32, heads=4, layers=2, max_tokens=24, backend=backend,
                              kv_heads=kv_heads).to(device).eval()
    ids = torch.randint(0, 40, (3, 18), device=device)
    cache = KVCache.for_model(model, batch=3)
    assert cache.shape == (2, 3, kv_heads, 24, 8)
    mha = KVCache.for_model(TinyLanguageModel(vocab=40, dim=32, heads=4, layers=2, max_tokens=24), batch=3)
    assert mha.nbytes() == cache.nbytes() * (4 // kv_heads)
    with torch.no_grad():
        full = model(ids)
        torch.testing.assert_close(model(ids[:, :6], cache=cache), full[:, :6], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(model(ids[:, 6:9], cache=cache), full[:, 6:9], atol=1e-5, rtol=1e-5)  # chunk
        for t in range(9, 18):
            torch.testing.assert_close(model(ids[:, t : t + 1], cache=cache)[:, 0], full[:, t], atol=1e-5, rtol=1e-5)
    prompt = ids[:, :4]
    assert torch.equal(generate(model, prompt, 16, temperature=0), generate(model, prompt, 16, temperature=0, use_cache=False))
