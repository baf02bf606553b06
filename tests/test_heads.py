"""MultiHeadAttention and CausalSelfAttention."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tinytf import CausalSelfAttention, MultiHeadAttention, causal_mask, count_parameters, padding_mask
from tinytf.config import BACKENDS


def torch_mha_from(ours: MultiHeadAttention) -> nn.MultiheadAttention:
    ref = nn.MultiheadAttention(ours.dim, ours.heads, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(ours.qkv.weight)
        ref.in_proj_bias.copy_(ours.qkv.bias)
        ref.out_proj.weight.copy_(ours.proj.weight)
        ref.out_proj.bias.copy_(ours.proj.bias)
    return ref.eval()


@pytest.mark.parametrize("backend", ["explicit", "sdpa", "tiled"])
def test_matches_nn_multiheadattention_self(device, backend):
    ours = MultiHeadAttention(16, 4, backend=backend).to(device).eval()
    ref = torch_mha_from(ours).to(device)
    x = torch.randn(3, 7, 16, device=device)
    expected, _ = ref(x, x, x, need_weights=False)
    torch.testing.assert_close(ours(x), expected)
    # causal: nn.MultiheadAttention's attn_mask uses True = *blocked*, ours True = may attend
    allowed = causal_mask(7, device=device)
    expected, _ = ref(x, x, x, attn_mask=~allowed, need_weights=False)
    torch.testing.assert_close(ours(x, is_causal=True), expected)
    torch.testing.assert_close(ours(x, mask=allowed), expected)


def test_matches_nn_multiheadattention_cross_with_padding(device):
    ours = MultiHeadAttention(16, 2).to(device).eval()
    ref = torch_mha_from(ours).to(device)
    x, ctx = torch.randn(2, 3, 16, device=device), torch.randn(2, 9, 16, device=device)
    pad = padding_mask([9, 5], 9, device=device)  # [B, 1, 1, Tk]
    expected, w_ref = ref(x, ctx, ctx, key_padding_mask=~pad[:, 0, 0], need_weights=True, average_attn_weights=False)
    out, w = ours(x, context=ctx, mask=pad, return_weights=True)
    assert out.shape == (2, 3, 16) and w.shape == (2, 2, 3, 9)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(w, w_ref)


def test_backends_agree_with_masks_and_cross(device):
    torch.manual_seed(3)
    a = MultiHeadAttention(32, 4).to(device).eval()
    b = MultiHeadAttention(32, 4, backend="sdpa").to(device).eval()
    b.load_state_dict(a.state_dict())
    x, ctx = torch.randn(2, 5, 32, device=device), torch.randn(2, 8, 32, device=device)
    pad = padding_mask([8, 3], 8, device=device)
    torch.testing.assert_close(a(x, ctx, pad), b(x, ctx, pad))
    torch.testing.assert_close(a(x, is_causal=True), b(x, is_causal=True))
    torch.testing.assert_close(a(x, ctx, is_causal=True), b(x, ctx, is_causal=True))  # end-aligned for both


def test_three_backends_agree_on_outputs_and_gradients(device):
    """explicit, sdpa and tiled: self-, cross- and causal attention, padding with an empty row."""
    torch.manual_seed(4)
    mods = {name: MultiHeadAttention(32, 4, backend=name).to(device) for name in ("explicit", "sdpa", "tiled")}
    for m in mods.values():
        m.load_state_dict(mods["explicit"].state_dict())
    x, ctx = torch.randn(2, 70, 32, device=device), torch.randn(2, 90, 32, device=device)  # T > the 64-row tiles
    pad = padding_mask([90, 31], 90, device=device)
    left = padding_mask([70, 40], 70, side="left", device=device)  # with is_causal: empty rows in sequence 1
    calls = {"self": lambda m: m(x), "cross+pad": lambda m: m(x, ctx, pad), "causal": lambda m: m(x, is_causal=True),
             "causal cross": lambda m: m(x, ctx, is_causal=True), "left pad+causal": lambda m: m(x, mask=left, is_causal=True)}
    for what, call in calls.items():
        results = {}
        for name, m in mods.items():
            m.zero_grad()
            out = call(m)
            out.pow(2).sum().backward()
            results[name] = [out.detach()] + [p.grad.clone() for p in m.parameters()]
        for name in ("sdpa", "tiled"):
            for a, b in zip(results[name], results["explicit"]):
                torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4, msg=lambda s, w=what, n=name: f"{n}, {w}: {s}")


def test_tiled_backend_refuses_dropout_while_training_and_weights():
    m = MultiHeadAttention(8, 2, dropout=0.1, backend="tiled")
    x = torch.randn(1, 3, 8)
    with pytest.raises(ValueError, match=r"backend='tiled' has no dropout.*model.eval\(\)"):
        m(x)
    m.eval()
    ref = MultiHeadAttention(8, 2, dropout=0.1, backend="explicit").eval()
    ref.load_state_dict(m.state_dict())
    torch.testing.assert_close(m(x), ref(x))  # in eval mode dropout is off and the tiled backend runs
    with pytest.raises(ValueError, match="needs backend='explicit'.*'tiled'"):
        m(x, return_weights=True)


def test_heads_split_and_merge_roundtrip():
    m = MultiHeadAttention(12, 3)
    x = torch.randn(2, 5, 12)
    h = m.split_heads(x)
    assert h.shape == (2, 3, 5, 4)
    assert torch.equal(h[:, 1, :, :], x[..., 4:8])  # head 1 owns channels 4..7
    assert torch.equal(m.merge_heads(h), x)


def test_parameter_count_does_not_depend_on_heads():
    counts = {h: count_parameters(MultiHeadAttention(16, h)) for h in (1, 2, 4, 8)}
    d = 16
    assert set(counts.values()) == {(d * 3 * d + 3 * d) + (d * d + d)}


def test_dim_not_divisible_by_heads():
    with pytest.raises(ValueError, match=r"dim=10 is not divisible by heads=4") as err:
        MultiHeadAttention(10, 4)
    assert "5" in str(err.value)  # suggests a divisor
    with pytest.raises(ValueError, match="not divisible"):
        CausalSelfAttention(10, 3, 8)


def test_bad_input_shape():
    m = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match=r"\[B, T, D\] with D=8.*\[5, 8\].*x\[None\]"):
        m(torch.randn(5, 8))
    with pytest.raises(ValueError, match=r"\[2, 5, 6\]"):
        m(torch.randn(2, 5, 6))
    with pytest.raises(ValueError, match="batch size"):
        m(torch.randn(2, 5, 8), context=torch.randn(3, 4, 8))


def test_sdpa_backend_refuses_weights():
    with pytest.raises(ValueError, match="explicit"):
        MultiHeadAttention(8, 2, backend="sdpa")(torch.randn(1, 3, 8), return_weights=True)
    with pytest.raises(ValueError, match="backend"):
        MultiHeadAttention(8, 2, backend="flash")


def test_causal_self_attention_limits_and_leak(device):
    attn = CausalSelfAttention(16, 4, max_tokens=6).to(device)
    assert attn(torch.randn(2, 1, 16, device=device)).shape == (2, 1, 16)  # T = 1
    x = torch.randn(2, 6, 16, device=device)  # T = max_tokens
    y = attn(x)
    x2 = x.clone()
    x2[:, 3:] = torch.randn(2, 3, 16, device=device)
    torch.testing.assert_close(attn(x2)[:, :3], y[:, :3])
    with pytest.raises(ValueError, match=r"7 tokens.*\[2, 7, 16\].*max_tokens=6"):
        attn(torch.randn(2, 7, 16, device=device))


def test_causal_self_attention_weights_upper_triangle_zero():
    attn = CausalSelfAttention(8, 2, max_tokens=5)
    _, w = attn(torch.randn(1, 5, 8), return_weights=True)
    assert (w.masked_select(~causal_mask(5)) == 0).all()


def test_dropout_only_in_train_mode():
    m = MultiHeadAttention(16, 2, dropout=0.5)
    x = torch.randn(2, 6, 16)
    m.eval()
    torch.testing.assert_close(m(x), m(x))
    m.train()
    assert not torch.allclose(m(x), m(x))


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


# ---- positions inside attention (chapter 13): RoPE rotates q and k, never v; ALiBi: tests/test_alibi.py ----------


@pytest.mark.parametrize("backend", ["explicit", "sdpa", "tiled"])
@pytest.mark.parametrize("kv_heads", [None, 2])
def test_rope_attention_rotates_q_and_k_only(backend, kv_heads):
    from tinytf import ModelConfig
    from tinytf.rope import apply_rope, rope_frequencies, rope_tables

    torch.manual_seed(0)
    attn = CausalSelfAttention(ModelConfig(dim=32, heads=4, kv_heads=kv_heads, positions="rope", rotary_dim=6, backend=backend)).eval()
    x = torch.randn(2, 10, 32)
    with torch.no_grad():
        q, k, v = attn.project(x)
        cos, sin = rope_tables(torch.arange(10), rope_frequencies(6)[0])
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)  # v stays as it is
        ref = attn.proj(attn.merge_heads(F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv_heads is not None)))
        torch.testing.assert_close(attn(x), ref, atol=1e-5, rtol=1e-5)
    assert count_parameters(attn) == count_parameters(CausalSelfAttention(ModelConfig(dim=32, heads=4, kv_heads=kv_heads)))


def test_rope_and_alibi_layers_run_past_max_tokens_and_learned_ones_do_not():
    from tinytf import KVCache, ModelConfig

    for positions in ("rope", "alibi", "none"):
        attn = CausalSelfAttention(ModelConfig(dim=16, heads=2, max_tokens=8, positions=positions))
        assert attn(torch.randn(1, 20, 16)).shape == (1, 20, 16)
    learned = CausalSelfAttention(ModelConfig(dim=16, heads=2, max_tokens=8))
    with pytest.raises(ValueError, match="longer than max_tokens=8"):
        learned(torch.randn(1, 6, 16), cache=_filled(KVCache(1, 1, 2, 16, 8), 4))
    with pytest.raises(ValueError, match="positions=\\[B, T\\] works without a cache"):
        CausalSelfAttention(ModelConfig(dim=16, heads=2, positions="rope"))(
            torch.randn(1, 2, 16), cache=KVCache(1, 1, 2, 8, 8), positions=torch.zeros(1, 2, dtype=torch.long))


def _filled(cache, n: int):
    cache.lengths = [n] * len(cache.lengths)
    return cache
