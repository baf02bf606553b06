"""generate, sample_next and cache_for (tinytf/generation.py): generation with a cache gives exactly
what recomputation gives, and the cache a model decodes with is built from its config."""

import pytest
import torch

from tinytf import KVCache, ModelConfig, RollingKVCache, TinyLanguageModel, cache_for, generate
from tinytf.generation import sample_next


@pytest.mark.parametrize("backend", ["explicit", "sdpa", "tiled"])
def test_greedy_generation_identical_with_and_without_cache(device, backend):
    torch.manual_seed(1)
    model = TinyLanguageModel(vocab=40, dim=32, heads=4, layers=2, max_tokens=32, backend=backend).to(device)
    prompts = torch.randint(0, 40, (4, 5), device=device)
    a = generate(model, prompts, 20, use_cache=True, temperature=0)
    b = generate(model, prompts, 20, use_cache=False, temperature=0)
    assert a.shape == (4, 25) and torch.equal(a, b)
    assert torch.equal(a[:, :5], prompts)


def test_sampling_is_reproducible_with_a_generator(small_lm, device):
    prompts = torch.randint(0, 40, (2, 3), device=device)
    runs = [generate(small_lm, prompts, 10, top_k=5, generator=torch.Generator(device=device).manual_seed(7)) for _ in range(2)]
    assert torch.equal(runs[0], runs[1])


def test_generate_stops_at_max_tokens_with_a_message(small_lm, device):
    prompts = torch.randint(0, 40, (1, 30), device=device)
    with pytest.warns(UserWarning, match="max_tokens=32"):
        out = generate(small_lm, prompts, 10, temperature=0)
    assert out.shape == (1, 32)
    with pytest.raises(ValueError, match="max_tokens=32"):
        generate(small_lm, torch.randint(0, 40, (1, 33), device=device), 1)


def test_sampled_generation_identical_with_and_without_cache(small_lm, device):
    prompts = torch.randint(0, 40, (3, 4), device=device)
    runs = [
        generate(small_lm, prompts, 15, use_cache=c, temperature=0.8, top_k=10, generator=torch.Generator(device=device).manual_seed(3))
        for c in (True, False)
    ]
    assert torch.equal(runs[0], runs[1])


def test_generate_edge_cases_and_mode(small_lm, device):
    prompts = torch.randint(0, 40, (2, 3), device=device)
    small_lm.train()
    assert torch.equal(generate(small_lm, prompts, 0), prompts)
    assert small_lm.training  # generate switches to eval and back
    with pytest.raises(ValueError, match="max_new_tokens must be >= 0"):
        generate(small_lm, prompts, -1)
    with pytest.raises(ValueError, match="at least one token"):
        generate(small_lm, prompts[:, :0], 3)
    with pytest.raises(ValueError, match=r"ids \[B, T\]"):
        generate(small_lm, prompts[0], 3)


@pytest.mark.parametrize(("fields", "kind", "shape"), [
    ({}, KVCache, (3, 2, 4, 32, 8)),
    ({"kv_heads": 2}, KVCache, (3, 2, 2, 32, 8)),
    ({"window": 5, "kv_heads": 1}, RollingKVCache, (3, 2, 1, 5, 8)),
])
def test_cache_for_reads_the_config(fields, kind, shape):
    model = TinyLanguageModel(ModelConfig(vocab=40, dim=32, heads=4, layers=3, max_tokens=32, **fields)).double()
    cache = cache_for(model, 2)
    assert type(cache) is kind and cache.shape == shape and cache.k.dtype == torch.float64
    model.blocks[0].attn.kv_heads = 99  # the config, not a layer's attributes, sizes the cache
    assert cache_for(model, 2).shape == shape
    if kind is KVCache:
        assert cache_for(model, 2, max_tokens=7).shape == (*shape[:3], 7, shape[4])


def test_sample_next_greedy_top_k_and_temperature():
    torch.manual_seed(0)
    logits = torch.randn(4, 11)
    greedy = logits.argmax(-1, keepdim=True)
    assert torch.equal(sample_next(logits, 0.0), greedy)
    assert torch.equal(sample_next(logits, 1.5, top_k=1, generator=torch.Generator().manual_seed(0)), greedy)
    top3 = logits.topk(3, dim=-1).indices
    draws = torch.cat([sample_next(logits, 2.0, top_k=3, generator=torch.Generator().manual_seed(s)) for s in range(50)], dim=1)
    assert draws.shape == (4, 50) and all(set(draws[b].tolist()) <= set(top3[b].tolist()) for b in range(4))
    assert len(set(draws[0].tolist())) > 1  # sampling, not argmax


# ---- positions (chapter 13): cached = recomputed for every choice; past max_tokens with flat memory -------------

POSITIONS = ("learned", "sinusoidal", "rope", "alibi", "none")


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("window", [None, 6])
def test_cached_generation_equals_recomputation_for_every_position_choice(positions, window):
    torch.manual_seed(4)
    backends = ["explicit", "sdpa"] + (["tiled"] if positions != "alibi" else [])
    for backend in backends:
        model = TinyLanguageModel(vocab=40, dim=32, heads=4, kv_heads=2, layers=2, max_tokens=24, window=window,
                                  positions=positions, backend=backend)
        prompts = torch.randint(0, 40, (2, 5))
        a = generate(model, prompts, 19, temperature=0)
        b = generate(model, prompts, 19, temperature=0, use_cache=False)
        assert a.shape == (2, 24) and torch.equal(a, b), (positions, window, backend)


@pytest.mark.parametrize("positions", ["rope", "alibi"])
def test_a_rolling_cache_generates_past_max_tokens_with_flat_memory(positions):
    torch.manual_seed(5)
    model = TinyLanguageModel(vocab=40, dim=32, heads=4, layers=2, max_tokens=16, window=8, positions=positions).eval()
    prompt = torch.randint(0, 40, (1, 4))
    cache = cache_for(model, 1)
    assert isinstance(cache, RollingKVCache)
    sizes, seq = [], prompt
    with torch.inference_mode():
        logits = model(prompt, cache=cache)[:, -1]
        for _ in range(60):  # 64 tokens: four times max_tokens
            nxt = logits.argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], 1)
            sizes.append(cache.k.nbytes + cache.v.nbytes)
            logits = model(nxt, cache=cache)[:, -1]
        full = model(seq)[:, -1]  # recomputation: one forward over all 64 tokens, the window mask in every layer
    assert len(set(sizes)) == 1 and cache.seen == 64
    torch.testing.assert_close(logits, full, atol=1e-4, rtol=1e-4)
    assert torch.equal(seq, generate(model, prompt, 60, temperature=0, use_cache=False))
    assert torch.equal(seq, generate(model, prompt, 60, temperature=0))


def test_one_windowed_rope_layer_needs_only_the_window_to_recompute():
    """Relative positions: the last W tokens alone, renumbered from 0, give the same next token as the whole past."""
    torch.manual_seed(6)
    model = TinyLanguageModel(vocab=40, dim=32, heads=4, layers=1, max_tokens=16, window=8, positions="rope").eval()
    seq = torch.randint(0, 40, (1, 50))
    with torch.no_grad():
        torch.testing.assert_close(model(seq)[:, -1], model(seq[:, -8:])[:, -1], atol=1e-4, rtol=1e-4)


def test_learned_positions_still_stop_at_max_tokens():
    model = TinyLanguageModel(vocab=40, dim=32, heads=4, layers=1, max_tokens=16, window=8)
    with pytest.warns(UserWarning, match="positions='rope' or 'alibi' have no such limit"):
        out = generate(model, torch.randint(0, 40, (1, 4)), 30, temperature=0)
    assert out.shape == (1, 16)


def test_generate_decodes_on_one_thread_by_default_and_restores_the_setting():
    import tinytf.generation

    seen = []
    model = TinyLanguageModel(vocab=40, dim=32, heads=4, layers=1, max_tokens=16).eval()
    real = model.forward
    model.forward = lambda *a, **k: (seen.append(torch.get_num_threads()), real(*a, **k))[1]
    before = torch.get_num_threads()
    prompt = torch.randint(0, 40, (1, 3))
    one = generate(model, prompt, 5, temperature=0)
    assert set(seen) == {1} and torch.get_num_threads() == before
    seen.clear()
    same = generate(model, prompt, 5, temperature=0, threads=None)
    assert set(seen) == {before} and torch.equal(one, same)
    with pytest.raises(ValueError, match="threads must be a positive int or None"):
        generate(model, prompt, 5, threads=0)
    assert tinytf.generation.generate.__kwdefaults__["threads"] == 1
