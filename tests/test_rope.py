"""tinytf.rope: the rotation keeps lengths, q·k depends on m - n only (large offsets too), both layouts and the weight
permutation between them, partial rotary, the three scalings, float32 angles, and parity with Hugging Face's Llama."""

from __future__ import annotations

import math

import pytest
import torch

import tinytf
from tinytf.rope import (
    RotaryEmbedding,
    apply_rope,
    half_order,
    interleaved_to_half,
    rope_frequencies,
    rope_tables,
    rotate_half,
    rotate_pairs,
)


def _rotate(x: torch.Tensor, positions: torch.Tensor, layout: str = "half", rotary_dim: int | None = None,
            **scaling) -> torch.Tensor:
    theta, factor = rope_frequencies(rotary_dim or x.size(-1), **scaling)
    cos, sin = rope_tables(positions, theta, layout, factor)
    return apply_rope(x, cos, sin, layout)


def test_frequencies_and_tables():
    theta, factor = rope_frequencies(8, 10000.0)
    assert factor == 1.0 and theta.dtype == torch.float32
    torch.testing.assert_close(theta, torch.tensor([10000.0 ** (-2 * i / 8) for i in range(4)]))
    cos, sin = rope_tables(torch.arange(5), theta, "half")
    assert cos.shape == sin.shape == (5, 8)
    torch.testing.assert_close(cos[3, :4], cos[3, 4:])  # half: [φ, φ]
    cos_i, _ = rope_tables(torch.arange(5), theta, "interleaved")
    torch.testing.assert_close(cos_i[3, 0::2], cos_i[3, 1::2])  # interleaved: φ0 φ0 φ1 φ1
    torch.testing.assert_close(cos_i[3, 0::2], cos[3, :4])


def test_quarter_turns():
    x = torch.arange(1.0, 7.0)
    assert rotate_half(x).tolist() == [-4.0, -5.0, -6.0, 1.0, 2.0, 3.0]
    assert rotate_pairs(x).tolist() == [-2.0, 1.0, -4.0, 3.0, -6.0, 5.0]


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rotation_keeps_lengths_and_position_zero_is_identity(layout):
    x = torch.randn(2, 3, 7, 16, dtype=torch.float64)
    out = _rotate(x, torch.arange(7), layout)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(out[..., 0, :], x[..., 0, :])
    pairs = out.unflatten(-1, (2, 8)) if layout == "half" else out.unflatten(-1, (8, 2)).transpose(-1, -2)
    ref = x.unflatten(-1, (2, 8)) if layout == "half" else x.unflatten(-1, (8, 2)).transpose(-1, -2)
    torch.testing.assert_close(pairs.norm(dim=-2), ref.norm(dim=-2))  # every pair keeps its own length


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_scores_depend_on_the_offset_only_even_far_away(layout):
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 32, generator=g), torch.randn(1, 32, generator=g)
    scores = []
    for m, n in ((7, 3), (1007, 1003), (10_004, 10_000), (100_004, 100_000), (3, 7), (10_000, 10_004)):
        qm = _rotate(q, torch.tensor([m]), layout)
        kn = _rotate(k, torch.tensor([n]), layout)
        scores.append((qm @ kn.T).item())
    assert scores[1] == pytest.approx(scores[0], abs=1e-4) and scores[2] == pytest.approx(scores[0], abs=1e-3)
    # at 100,000 a float32 angle is only good to ~4e-3 rad (its spacing there is 2^-7): the score moves by ~1e-3
    assert scores[3] == pytest.approx(scores[0], abs=1e-2)
    assert scores[5] == pytest.approx(scores[4], abs=1e-3)
    assert abs(scores[0] - scores[4]) > 1e-2  # +4 and -4 differ: the order is seen


def test_partial_rotary_leaves_the_rest():
    x = torch.randn(2, 2, 5, 16)
    out = _rotate(x, torch.arange(5), rotary_dim=8)
    torch.testing.assert_close(out[..., 8:], x[..., 8:])
    torch.testing.assert_close(out[..., :8], _rotate(x[..., :8], torch.arange(5)))
    with pytest.raises(ValueError, match="rotary_dim <= d_head"):
        apply_rope(x[..., :6], *rope_tables(torch.arange(5), rope_frequencies(8)[0]))


def test_the_permutation_turns_interleaved_into_half():
    assert half_order(6).tolist() == [0, 2, 4, 1, 3, 5]
    assert half_order(8, 4).tolist() == [0, 2, 1, 3, 4, 5, 6, 7]
    x = torch.randn(3, 4, 5, 12, dtype=torch.float64)
    order = half_order(12, 8)
    torch.testing.assert_close(_rotate(x, torch.arange(5), "interleaved", 8)[..., order],
                               _rotate(x[..., order], torch.arange(5), "half", 8))
    w = torch.arange(2 * 4 * 3.0).view(8, 3)  # 2 heads of width 4
    assert interleaved_to_half(w, 2, 4)[:, 0].tolist() == [0.0, 6.0, 3.0, 9.0, 12.0, 18.0, 15.0, 21.0]
    with pytest.raises(ValueError, match=r"expected 12 rows \(heads=3"):
        interleaved_to_half(w, 3, 4)


def test_scalings():
    theta, _ = rope_frequencies(16)
    lin, f = rope_frequencies(16, scaling="linear", factor=4.0)
    torch.testing.assert_close(lin, theta / 4)
    assert f == 1.0
    ntk, _ = rope_frequencies(16, scaling="ntk", factor=4.0)
    assert ntk[0] == theta[0] and ntk[-1].item() == pytest.approx(theta[-1].item() / 4, rel=1e-5)  # fast pair kept, slowest / factor
    yarn, mscale = rope_frequencies(16, scaling="yarn", factor=4.0, trained=64)
    assert mscale == pytest.approx(0.1 * math.log(4) + 1)
    assert yarn[0] == theta[0] and yarn[-1].item() == pytest.approx(theta[-1].item() / 4)
    assert rope_frequencies(16, scaling="yarn", factor=1.0, trained=64)[1] == 1.0
    with pytest.raises(ValueError, match="trained length"):
        rope_frequencies(16, scaling="yarn", factor=2.0)


def test_angles_in_float32_and_what_bfloat16_would_lose():
    theta, _ = rope_frequencies(64)
    pos = torch.tensor([4096])
    exact = (pos.double()[:, None] * theta.double())
    cos32, _ = rope_tables(pos, theta)
    assert (cos32[0, :32].double() - exact.cos()[0]).abs().max() < 1e-3
    low = (pos.to(torch.bfloat16)[:, None] * theta.to(torch.bfloat16)).double()
    assert (low - exact).abs().max() > 1.0  # whole radians off at 4096: why the tables are built in float32
    emb = RotaryEmbedding(tinytf.ModelConfig(dim=64, heads=1, positions="rope")).to(torch.bfloat16)
    cos, _ = emb.tables(4096, 1, torch.device("cpu"))
    assert cos.dtype == torch.float32  # model.to(bfloat16) does not touch the angles


def test_rotary_embedding_grows_its_tables_and_works_after_inference_mode():
    emb = RotaryEmbedding(tinytf.ModelConfig(dim=16, heads=2, positions="rope"))
    with torch.inference_mode():
        emb.tables(0, 10, torch.device("cpu"))
    q, k = torch.randn(1, 2, 3, 8, requires_grad=True), torch.randn(1, 2, 3, 8)
    out, _ = emb(q, k, start=300)  # tables regrown past 300, usable by autograd
    out.sum().backward()
    assert emb._cos.size(0) == 512 and q.grad is not None
    cos, _ = emb.tables(300, 3, torch.device("cpu"))
    ref, _ = rope_tables(torch.arange(300, 303), emb.theta)
    torch.testing.assert_close(cos, ref)
    positions = torch.tensor([[0, 1, 2], [5, 6, 7]])
    rq, _ = emb(q.detach().expand(2, -1, -1, -1), k.expand(2, -1, -1, -1), positions=positions)
    torch.testing.assert_close(rq[1:], emb(q.detach(), k, start=5)[0])


# ---- Hugging Face transformers: Llama's rotary embedding --------------------------------------------


def _llama(head_dim: int = 16, heads: int = 4, **rope_parameters):
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    config = transformers.LlamaConfig(hidden_size=head_dim * heads, num_attention_heads=heads, num_key_value_heads=heads,
                                      max_position_embeddings=256, rope_parameters={"rope_theta": 10000.0, **rope_parameters})
    return LlamaRotaryEmbedding(config), apply_rotary_pos_emb


@pytest.mark.parametrize(("scaling", "rope_parameters"), [
    (None, {"rope_type": "default"}),
    ("linear", {"rope_type": "linear", "factor": 4.0}),
    ("yarn", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
], ids=["default", "linear", "yarn"])
def test_parity_with_hugging_face_llama(scaling, rope_parameters):
    hf_rope, hf_apply = _llama(**rope_parameters)
    factor = rope_parameters.get("factor", 1.0)
    config = tinytf.ModelConfig(dim=64, heads=4, max_tokens=64, positions="rope", rope_scaling=scaling, rope_factor=factor)
    ours = RotaryEmbedding(config)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 40, 16, generator=g), torch.randn(2, 4, 40, 16, generator=g)
    positions = torch.arange(200, 240)[None].expand(2, -1)  # far past the trained 64
    cos, sin = hf_rope(q, positions)  # [B, T, d]
    theirs = hf_apply(q, k, cos, sin)
    torch.testing.assert_close(ours.tables(200, 40, q.device)[0], cos[0], atol=1e-6, rtol=0)
    mine = ours(q, k, start=200)
    torch.testing.assert_close(mine[0], theirs[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mine[1], theirs[1], atol=1e-5, rtol=1e-5)


def test_parity_with_hugging_face_inside_attention():
    """A whole tinytf RoPE attention layer against q/k rotated by Hugging Face's functions and PyTorch's attention."""
    hf_rope, hf_apply = _llama(head_dim=8, heads=4)
    torch.manual_seed(0)
    attn = tinytf.CausalSelfAttention(tinytf.ModelConfig(dim=32, heads=4, max_tokens=64, positions="rope")).eval()
    x = torch.randn(2, 12, 32)
    with torch.no_grad():
        q, k, v = attn.project(x)
        cos, sin = hf_rope(q, torch.arange(12)[None].expand(2, -1))
        q, k = hf_apply(q, k, cos, sin)
        ref = attn.proj(attn.merge_heads(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)))
        torch.testing.assert_close(attn(x), ref, atol=1e-5, rtol=1e-5)
