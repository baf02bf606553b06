"""RollingKVCache (tinytf/rolling.py): a sliding-window model decodes with only ``window`` tokens kept and
gets the same tokens as recomputing under the window mask."""

import warnings

import pytest
import torch

from tinytf import KVCache, RollingKVCache, TinyLanguageModel, generate
from tinytf.memory import kv_cache_bytes, ledger

BACKENDS = ["explicit", "sdpa", "tiled"]


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


def test_attention_tells_a_rolling_cache_by_its_type():
    torch.manual_seed(6)
    plain = TinyLanguageModel(vocab=20, dim=16, heads=2, layers=1, max_tokens=16).eval()
    ids = torch.randint(0, 20, (1, 6))
    static = KVCache.for_model(plain, 1)
    static.window = 4  # an attribute named window does not make a static cache a rolling one
    with torch.no_grad():
        torch.testing.assert_close(plain(ids, cache=static), plain(ids), atol=1e-5, rtol=1e-5)
    assert isinstance(RollingKVCache(1, 1, 2, 4, 8), KVCache)


def test_key_positions_say_where_each_returned_key_is():
    from tinytf import KVCache

    ring = RollingKVCache(1, 1, 1, 4, 2)
    static = KVCache(1, 1, 1, 16, 2)
    kv = torch.zeros(1, 1, 3, 2)
    ring.update(0, kv, kv)
    static.update(0, kv, kv)
    assert ring.key_positions(0, 3).tolist() == [0, 1, 2] == static.key_positions(0, 3).tolist()
    one = torch.zeros(1, 1, 1, 2)
    seen = []
    for _ in range(4):
        ring.update(0, one, one)
        seen.append(ring.key_positions(0, 1).tolist())
    assert seen == [[0, 1, 2, 3], [4, 1, 2, 3], [4, 5, 2, 3], [4, 5, 6, 3]]  # slot s holds the latest p with p % 4 == s
    ring.update(0, kv, kv)  # a prefill of 3 after 7 tokens: the 4 kept ones, then the 3 new, in time order
    assert ring.key_positions(0, 3).tolist() == [3, 4, 5, 6, 7, 8, 9]
