"""State-dict compatibility with the article's reference modules (written out here as the article
gives them): a checkpoint saved from them loads into tinytf with strict=True and gives the same
outputs."""

import math

import pytest
import torch
from torch import nn

import tinytf


class RefCausalSelfAttention(nn.Module):
    def __init__(self, dim, heads, max_tokens):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        mask = torch.triu(torch.ones(max_tokens, max_tokens), diagonal=1)
        self.register_buffer("future", mask.bool()[None, None], persistent=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        shape = (b, t, self.heads, self.head_dim)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(self.future[:, :, :t, :t], float("-inf"))
        y = scores.softmax(dim=-1) @ v
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, d))


class RefBlock(nn.Module):
    def __init__(self, dim=64, heads=4, max_tokens=128, expansion=4):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = RefCausalSelfAttention(dim, heads, max_tokens)
        self.norm2 = nn.LayerNorm(dim)
        self.ffn = nn.Sequential(nn.Linear(dim, expansion * dim), nn.GELU(), nn.Linear(expansion * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class RefLM(nn.Module):
    def __init__(self, vocab=100, dim=32, heads=4, layers=2, max_tokens=64):
        super().__init__()
        self.token = nn.Embedding(vocab, dim)
        self.position = nn.Embedding(max_tokens, dim)
        self.blocks = nn.ModuleList([RefBlock(dim, heads, max_tokens) for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids):
        t = ids.size(1)
        x = self.token(ids) + self.position(torch.arange(t, device=ids.device)[None])
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm(x))


@pytest.mark.parametrize("backend", ["explicit", "sdpa"])
def test_attention_block_and_lm_load_strict_and_agree(tmp_path, backend):
    torch.manual_seed(0)
    cases = [
        (RefCausalSelfAttention(16, 4, 12), tinytf.CausalSelfAttention(16, 4, 12, backend=backend), torch.randn(2, 7, 16)),
        (RefBlock(16, 4, 12), tinytf.TransformerBlock(16, 4, 12, backend=backend), torch.randn(2, 7, 16)),
        (RefLM(), tinytf.TinyLanguageModel(backend=backend), torch.randint(0, 100, (2, 12))),
    ]
    for ref, ours, x in cases:
        path = tmp_path / f"{type(ref).__name__}.pt"
        torch.save(ref.state_dict(), path)
        ours.load_state_dict(torch.load(path, weights_only=True), strict=True)
        assert set(ref.state_dict()) == set(ours.state_dict())
        with torch.no_grad():
            torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=1e-5)
