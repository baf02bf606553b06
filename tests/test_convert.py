"""to_grouped_query (tinytf/convert.py): a multi-head model becomes a grouped-query one by mean-pooling
the K/V projections of each group; everything else is copied and the original is untouched."""

import pytest
import torch

from tinytf import TinyLanguageModel, to_grouped_query
from tinytf.convert import pool_kv_heads


def test_to_grouped_query_with_as_many_heads_is_the_identity():
    torch.manual_seed(2)
    model = TinyLanguageModel(vocab=30, dim=32, heads=4, layers=2, max_tokens=16).eval()
    same = to_grouped_query(model, 4)
    assert same is not model and same.config == model.config
    ids = torch.randint(0, 30, (2, 16))
    torch.testing.assert_close(same(ids), model(ids), atol=0, rtol=0)


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_to_grouped_query_mean_pools_each_group(kv_heads):
    torch.manual_seed(3)
    model = TinyLanguageModel(vocab=30, dim=48, heads=4, layers=2, max_tokens=16)
    before = {n: p.clone() for n, p in model.state_dict().items()}
    gqa = to_grouped_query(model, kv_heads)
    assert gqa.config.n_kv_heads == kv_heads and gqa.training
    assert all(torch.equal(p, before[n]) for n, p in model.state_dict().items())  # the original is untouched
    d, groups = 12, 4 // kv_heads
    for i in range(2):
        for part in ("weight", "bias"):
            src = getattr(model.blocks[i].attn.qkv, part).detach()
            out = getattr(gqa.blocks[i].attn.qkv, part).detach()
            assert torch.equal(out[:48], src[:48])  # W_q copied
            for which in range(2):  # K then V
                heads_src = src[48 + which * 48 : 48 + (which + 1) * 48].unflatten(0, (4, d))  # [4, d, ...]
                heads_out = out[48 + which * kv_heads * d : 48 + (which + 1) * kv_heads * d].unflatten(0, (kv_heads, d))
                for j in range(kv_heads):
                    torch.testing.assert_close(heads_out[j], heads_src[j * groups : (j + 1) * groups].mean(0))
    for name, p in gqa.state_dict().items():
        if ".attn.qkv." not in name:
            assert torch.equal(p, before[name])
    # pooling twice (4 -> 2 -> 1) is pooling once (4 -> 1)
    torch.testing.assert_close(to_grouped_query(to_grouped_query(model, 2), 1).state_dict(), to_grouped_query(model, 1).state_dict())


def test_to_grouped_query_refuses_groups_that_do_not_pool():
    model = TinyLanguageModel(vocab=30, dim=48, heads=6, layers=1, max_tokens=8, kv_heads=3)
    with pytest.raises(ValueError, match=r"kv_heads=2 must divide the model's 3 K/V heads.*\[1, 3\]"):
        to_grouped_query(model, 2)
    assert to_grouped_query(model, 1).config.n_kv_heads == 1


def test_pool_kv_heads_keeps_q_and_averages_consecutive_k_and_v_heads():
    d, dim = 2, 8  # 4 heads of width 2
    w = torch.arange((dim + 2 * 4 * d) * 3, dtype=torch.float64).reshape(dim + 2 * 4 * d, 3)  # [W_q; W_k; W_v] rows
    pooled = pool_kv_heads(w, dim, d, 4, 2)
    assert pooled.shape == (dim + 2 * 2 * d, 3) and torch.equal(pooled[:dim], w[:dim])
    k_heads = w[dim : dim + 4 * d].reshape(4, d, 3)
    torch.testing.assert_close(pooled[dim : dim + 2 * d].reshape(2, d, 3), torch.stack([k_heads[:2].mean(0), k_heads[2:].mean(0)]))
    bias = torch.arange(dim + 2 * 4 * d, dtype=torch.float64)
    assert pool_kv_heads(bias, dim, d, 4, 1).shape == (dim + 2 * d,)


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rope", "alibi", "none"])
def test_to_grouped_query_keeps_the_position_choice(positions):
    torch.manual_seed(3)
    model = TinyLanguageModel(vocab=30, dim=32, heads=4, layers=2, max_tokens=16, positions=positions).eval()
    ids = torch.randint(0, 30, (2, 16))
    same, two = to_grouped_query(model, 4), to_grouped_query(model, 2)
    assert two.config.positions == positions and two.config.n_kv_heads == 2
    torch.testing.assert_close(same(ids), model(ids), atol=0, rtol=0)
    assert two(ids).shape == (2, 16, 30)


def test_to_half_split_computes_the_same_logits_and_a_plain_reload_does_not():
    from tinytf import to_half_split

    torch.manual_seed(4)
    for rotary_dim, kv_heads in ((None, None), (4, 2)):
        model = TinyLanguageModel(vocab=30, dim=32, heads=4, kv_heads=kv_heads, layers=2, max_tokens=16, positions="rope",
                                  rope_layout="interleaved", rotary_dim=rotary_dim).eval()
        ids = torch.randint(0, 30, (2, 16))
        half = to_half_split(model)
        assert half.config.rope_layout == "half"
        torch.testing.assert_close(half(ids), model(ids), atol=1e-5, rtol=1e-5)
        wrong = TinyLanguageModel(half.config).eval()
        wrong.load_state_dict(model.state_dict())  # the interleaved weights in the half-split layout: loads, and is wrong
        assert (wrong(ids) - model(ids)).abs().max() > 1e-2
    with pytest.raises(ValueError, match="nothing to convert"):
        to_half_split(TinyLanguageModel(vocab=30, dim=32, heads=4, layers=1, max_tokens=16))
