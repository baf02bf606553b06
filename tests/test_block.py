"""TransformerBlock: parity with nn.TransformerEncoderLayer, causality, layouts, parameter counts."""

import pytest
import torch
from torch import nn

from tinytf import TransformerBlock, causal_mask, count_parameters, padding_mask, parameter_breakdown


def encoder_layer_from(block: TransformerBlock, norm_first: bool) -> nn.TransformerEncoderLayer:
    dim = block.norm1.normalized_shape[0]
    ref = nn.TransformerEncoderLayer(
        dim, block.attn.heads, dim_feedforward=block.ffn[0].out_features, dropout=0.0,
        activation="gelu", batch_first=True, norm_first=norm_first,
    )
    with torch.no_grad():
        ref.self_attn.in_proj_weight.copy_(block.attn.qkv.weight)
        ref.self_attn.in_proj_bias.copy_(block.attn.qkv.bias)
        ref.self_attn.out_proj.weight.copy_(block.attn.proj.weight)
        ref.self_attn.out_proj.bias.copy_(block.attn.proj.bias)
        for ours, theirs in ((block.ffn[0], ref.linear1), (block.ffn[2], ref.linear2), (block.norm1, ref.norm1), (block.norm2, ref.norm2)):
            theirs.weight.copy_(ours.weight)
            theirs.bias.copy_(ours.bias)
    return ref.eval()


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("backend", ["explicit", "sdpa", "tiled"])
def test_matches_torch_encoder_layer_with_causal_mask(device, norm, backend):
    block = TransformerBlock(dim=32, heads=4, max_tokens=16, norm=norm, backend=backend).to(device).eval()
    ref = encoder_layer_from(block, norm_first=(norm == "pre")).to(device)
    x = torch.randn(3, 10, 32, device=device)
    blocked = ~causal_mask(10, device=device)  # PyTorch's src_mask: True = blocked
    with torch.no_grad():
        torch.testing.assert_close(block(x), ref(x, src_mask=blocked, is_causal=True), atol=1e-5, rtol=1e-5)


def test_three_backends_agree_on_block_outputs_and_gradients(device):
    torch.manual_seed(2)
    for norm in ("pre", "post"):
        blocks = {name: TransformerBlock(32, 4, 100, norm=norm, backend=name).to(device) for name in ("explicit", "sdpa", "tiled")}
        x = torch.randn(2, 100, 32, device=device)  # 100 tokens: a full and a ragged 64-row tile
        pad = padding_mask([100, 57], 100, device=device)
        results = {}
        for name, block in blocks.items():
            block.load_state_dict(blocks["explicit"].state_dict())
            xi = x.clone().requires_grad_(True)
            out = block(xi, pad)
            out.pow(2).mean().backward()
            results[name] = [out.detach(), xi.grad] + [p.grad for p in block.parameters()]
        for name in ("sdpa", "tiled"):
            for a, b in zip(results[name], results["explicit"]):
                torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)


def test_no_future_leak_and_edge_lengths(device):
    block = TransformerBlock(dim=16, heads=2, max_tokens=8).to(device)
    assert block(torch.randn(2, 1, 16, device=device)).shape == (2, 1, 16)
    x = torch.randn(2, 8, 16, device=device)
    y = block(x)
    x2 = x.clone()
    x2[:, 5] += 3.0
    y2 = block(x2)
    torch.testing.assert_close(y2[:, :5], y[:, :5])
    assert not torch.allclose(y2[:, 5:], y[:, 5:])
    with pytest.raises(ValueError, match="max_tokens=8"):
        block(torch.randn(2, 9, 16, device=device))


def test_parameter_count_formula_and_article_figure():
    dim, e = 16, 4
    block = TransformerBlock(dim=dim, heads=4, max_tokens=12, expansion=e)
    layer_norms = 2 * (2 * dim)
    attention = (dim * 3 * dim + 3 * dim) + (dim * dim + dim)
    ffn = (dim * e * dim + e * dim) + (e * dim * dim + dim)
    assert count_parameters(block) == layer_norms + attention + ffn == 3280
    # the article prints 3216 for this block: exactly the block without its two LayerNorms
    assert count_parameters(block) - layer_norms == 3216
    parts = parameter_breakdown(block)
    assert parts == {"norm1": 32, "attn": 1088, "norm2": 32, "ffn": 2128}


def test_pre_and_post_norm_differ_but_share_parameters():
    torch.manual_seed(0)
    pre = TransformerBlock(16, 2, 8)
    post = TransformerBlock(16, 2, 8, norm="post")
    post.load_state_dict(pre.state_dict(), strict=True)
    x = torch.randn(1, 8, 16)
    assert not torch.allclose(pre(x), post(x))
    # post-norm output is normalised per token; pre-norm output is not
    out = post(x)
    torch.testing.assert_close(out.mean(-1), torch.zeros(1, 8), atol=1e-5, rtol=0)


def test_bad_arguments():
    with pytest.raises(ValueError, match="norm"):
        TransformerBlock(norm="middle")
    with pytest.raises(ValueError, match="not divisible"):
        TransformerBlock(dim=30, heads=4)


def test_dropout_train_vs_eval_vs_no_grad():
    block = TransformerBlock(16, 2, 8, dropout=0.3)
    x = torch.randn(2, 8, 16)
    block.eval()
    torch.testing.assert_close(block(x), block(x))
    block.train()
    with torch.no_grad():  # no_grad does NOT switch dropout off
        assert not torch.allclose(block(x), block(x))


def test_stacked_blocks_keep_shape():
    stack = nn.Sequential(*[TransformerBlock(16, 2, 8) for _ in range(3)])
    assert stack(torch.randn(2, 8, 16)).shape == (2, 8, 16)
