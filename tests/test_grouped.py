"""Grouped-query and multi-query attention: exact against PyTorch on every backend (the cache with fewer K/V heads is
tested in test_kvcache.py, `kv_heads` in the config in test_config.py)."""

import pytest
import torch
import torch.nn.functional as F

import tinytf
from tinytf import (
    CausalSelfAttention,
    MultiHeadAttention,
    causal_mask,
    padding_mask,
    repeat_kv,
)
from tinytf.grouped import kv_head_of

BACKENDS = ["explicit", "sdpa", "tiled"]


def reference(attn: MultiHeadAttention, x, context=None, mask=None, is_causal=False, share="gqa"):
    """The layer's output computed from its weights by hand: F.sdpa(enable_gqa=True), or explicit
    repetition of the K/V heads (``share="interleave"``) — never through the module's own forward."""
    h, kv, d = attn.heads, attn.kv_heads, attn.head_dim
    w_q, w_k, w_v = attn.qkv.weight.split([attn.dim, kv * d, kv * d])
    b_q, b_k, b_v = attn.qkv.bias.split([attn.dim, kv * d, kv * d])
    src = x if context is None else context
    q = F.linear(x, w_q, b_q).unflatten(-1, (h, d)).transpose(1, 2)  # [B, H, Tq, d]
    k = F.linear(src, w_k, b_k).unflatten(-1, (kv, d)).transpose(1, 2)  # [B, kv, Tk, d]
    v = F.linear(src, w_v, b_v).unflatten(-1, (kv, d)).transpose(1, 2)
    if is_causal:
        causal = causal_mask(q.size(-2), k.size(-2), device=x.device)
        mask = causal if mask is None else mask & causal
    if share == "gqa":
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    else:
        g = h // kv
        out = F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), attn_mask=mask)
    return attn.proj(out.transpose(1, 2).flatten(-2))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (4, 1), (6, 3), (6, 2), (4, 4)])
@pytest.mark.parametrize("share", ["gqa", "interleave"])
def test_matches_pytorch_enable_gqa_and_explicit_repetition(device, backend, heads, kv_heads, share):
    torch.manual_seed(heads * 10 + kv_heads)
    attn = MultiHeadAttention(12 * heads, heads, kv_heads=kv_heads, backend=backend).to(device).eval()
    x, ctx = torch.randn(2, 7, 12 * heads, device=device), torch.randn(2, 9, 12 * heads, device=device)
    pad = padding_mask([9, 4], 9, device=device)
    with torch.no_grad():
        torch.testing.assert_close(attn(x), reference(attn, x, share=share))
        torch.testing.assert_close(attn(x, is_causal=True), reference(attn, x, is_causal=True, share=share))
        torch.testing.assert_close(attn(x, ctx, pad), reference(attn, x, ctx, pad, share=share))
        torch.testing.assert_close(attn(x, ctx, is_causal=True), reference(attn, x, ctx, is_causal=True, share=share))


def test_backends_agree_on_gradients(device):
    torch.manual_seed(5)
    layers = [CausalSelfAttention(32, 8, 16, kv_heads=2, backend=be).to(device) for be in BACKENDS]
    for other in layers[1:]:
        other.load_state_dict(layers[0].state_dict())
    x = torch.randn(2, 11, 32, device=device)
    grads = []
    for layer in layers:
        layer(x).square().sum().backward()
        grads.append([p.grad for p in layer.parameters()])
    for other in grads[1:]:
        for a, b in zip(grads[0], other):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_repeat_is_not_repeat_interleave():
    """The classic silent mistake: ``repeat`` tiles the K/V heads (k0 k1 k0 k1), ``repeat_interleave``
    gives each its group (k0 k0 k1 k1). Same shapes, different attention."""
    heads, kv_heads, groups = 4, 2, 2
    k = torch.randn(1, kv_heads, 5, 8)
    interleaved, tiled = k.repeat_interleave(groups, dim=1), k.repeat(1, groups, 1, 1)
    assert interleaved.shape == tiled.shape == (1, heads, 5, 8)
    assert torch.equal(repeat_kv(k, groups), interleaved)
    for h in range(heads):
        assert torch.equal(interleaved[:, h], k[:, kv_head_of(h, heads, kv_heads)])  # h // groups
        assert torch.equal(tiled[:, h], k[:, h % kv_heads])  # the wrong head for h = 1 and 2
    assert not torch.equal(interleaved, tiled)
    q, v = torch.randn(1, heads, 3, 8), torch.randn(1, kv_heads, 5, 8)
    want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(tinytf.scaled_dot_product_attention(q, interleaved, repeat_kv(v, groups)), want)
    wrong = tinytf.scaled_dot_product_attention(q, tiled, v.repeat(1, groups, 1, 1))
    assert not torch.allclose(wrong, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_query_head_h_reads_kv_head_h_over_groups(backend):
    attn = MultiHeadAttention(48, 6, kv_heads=2, backend=backend).eval()
    q, k, v = torch.randn(1, 6, 4, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    base = attn.attend(q, k, v, None, False)
    v2 = v.clone()
    v2[:, 1] += 1.0  # change K/V head 1 only
    changed = (attn.attend(q, k, v2, None, False) - base).abs().amax(dim=(0, 2, 3)) > 1e-6  # per query head
    assert changed.tolist() == [kv_head_of(h, 6, 2) == 1 for h in range(6)] == [False] * 3 + [True] * 3


def test_multi_head_layout_and_outputs_unchanged():
    torch.manual_seed(0)
    old = MultiHeadAttention(32, 4)
    for kv in (None, 4):
        new = MultiHeadAttention(32, 4, kv_heads=kv)
        assert {n: p.shape for n, p in new.named_parameters()} == {n: p.shape for n, p in old.named_parameters()}
        assert new.qkv.weight.shape == (96, 32)
        new.load_state_dict(old.state_dict())
        x = torch.randn(2, 5, 32)
        torch.testing.assert_close(new(x, is_causal=True), old(x, is_causal=True), atol=0, rtol=0)
    gqa = MultiHeadAttention(32, 4, kv_heads=2)
    assert gqa.qkv.weight.shape == (32 + 2 * 2 * 8, 32) and gqa.kv_heads == 2 and gqa.groups == 2
