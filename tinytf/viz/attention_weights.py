"""The attention explorer's model: a sentence, its tokens and a seeded multi-head attention's weights.

:func:`explorer_weights` turns the explorer's options into tokens, weights ``[H, T, T]`` and the
allowed mask ``[T, T]`` (no matplotlib: :mod:`tinytf.viz.attention` draws them). Deterministic: each
token's embedding is drawn from a generator seeded by the token's text (the same word always gets the
same vector), positions and the attention weights come from ``seed``.
"""

from __future__ import annotations

import math
import zlib

import torch

from ..attention import scaled_dot_product_attention
from ..heads import MultiHeadAttention
from ..masks import causal_mask
from ..translation import gettext
from ..translation import gettext as _
from .fonts import has_cjk

__all__ = ["explorer_weights", "tokenize", "MASKS", "SCALINGS", "TOKENIZERS", "PAD", "DIM", "MAX_TOKENS"]

MASKS = ("none", "causal", "padding", "both")
SCALINGS = ("1/sqrt(d)", "none", "temperature")
TOKENIZERS = ("auto", "words", "chars")
PAD = "<pad>"
DIM = 24  # divisible by 1, 2, 3, 4, 6, 8, 12, 24: every sensible head count works
MAX_TOKENS = 24  # keeps the heatmap readable


def tokenize(sentence: str, mode: str = "auto") -> list[str]:
    """Split ``sentence`` into word tokens (whitespace) or character tokens (spaces shown as ``␣``).

    ``"auto"``: characters for text with Chinese (or other CJK) characters, which has no spaces
    between words (``"猫坐在垫子上"`` -> 6 tokens), words otherwise.
    """
    if mode not in TOKENIZERS:
        raise ValueError(_("tokenize: mode must be one of {TOKENIZERS}, got {mode!r}").format(TOKENIZERS=TOKENIZERS, mode=mode))
    if mode == "auto":
        mode = "chars" if has_cjk(sentence) else "words"
    if mode == "words":
        return sentence.split()
    return ["␣" if c == " " else c for c in sentence.strip()]


def _token_vector(token: str, dim: int, seed: int) -> torch.Tensor:
    """A fixed random vector ``[dim]`` per token text (seeded by the text, so repeats match)."""
    g = torch.Generator().manual_seed(zlib.crc32(token.encode()) + 7919 * seed)
    return torch.randn(dim, generator=g)


def _build_tokens(sentence: str, tokenizer: str, mask: str, pad_to: int | None) -> tuple[list[str], int]:
    """Tokens (padded when the mask uses padding) and the number of real tokens."""
    tokens = tokenize(sentence, tokenizer)
    if not tokens:
        raise ValueError(_("the sentence is empty: type a few words"))
    if len(tokens) > MAX_TOKENS:
        raise ValueError(_("{n_tokens} tokens is too many for a readable heatmap; use at most {MAX_TOKENS}").format(
            n_tokens=len(tokens), MAX_TOKENS=MAX_TOKENS))
    real = len(tokens)
    if mask in ("padding", "both"):
        target = real + 2 if pad_to is None else pad_to
        if target < real:
            raise ValueError(_("pad_to={pad_to} is shorter than the sentence ({real} tokens)").format(pad_to=pad_to, real=real))
        tokens = tokens + [PAD] * (target - real)
    return tokens, real


def explorer_weights(
    sentence: str = "the cat sat on the mat",
    *,
    tokenizer: str = "auto",
    heads: int = 2,
    mask: str = "causal",
    scaling: str = "1/sqrt(d)",
    temperature: float = 1.0,
    pad_to: int | None = None,
    pad_side: str = "right",
    seed: int = 0,
) -> tuple[list[str], torch.Tensor, torch.Tensor, float]:
    """Run a seeded :class:`tinytf.MultiHeadAttention` (dim 24) over the sentence.

    Returns ``(tokens, weights [H, T, T], allowed [T, T] bool, scale)``. ``scaling`` picks the factor
    on ``q·kᵀ``: ``"1/sqrt(d)"`` (``1/sqrt(d_head)``), ``"none"`` (1) or ``"temperature"``
    (``1 / (temperature · sqrt(d_head))``: above 1 flattens, below 1 sharpens). With a padding mask
    the sentence is padded with ``<pad>`` to ``pad_to`` tokens (default: 2 more), on ``pad_side``.
    """
    if mask not in MASKS:
        raise ValueError(gettext("mask must be one of {MASKS}, got {mask!r}").format(MASKS=MASKS, mask=mask))
    if scaling not in SCALINGS:
        raise ValueError(gettext("scaling must be one of {SCALINGS}, got {scaling!r}").format(SCALINGS=SCALINGS, scaling=scaling))
    if pad_side not in ("right", "left"):
        raise ValueError(gettext("pad_side must be 'right' or 'left', got {pad_side!r}").format(pad_side=pad_side))
    if scaling == "temperature" and not temperature > 0:
        raise ValueError(gettext("temperature must be positive, got {temperature}").format(temperature=temperature))
    tokens, real = _build_tokens(sentence, tokenizer, mask, pad_to)
    if pad_side == "left":
        tokens = tokens[real:] + tokens[:real]
    t = len(tokens)

    gen = torch.Generator().manual_seed(seed)
    pos = torch.randn(t, DIM, generator=gen)  # [T, D] position vectors
    tok = torch.stack([_token_vector(w, DIM, seed) for w in tokens])  # [T, D]
    x = ((tok + pos) / math.sqrt(2.0))[None]  # [1, T, D], entries ~ N(0, 1)

    mha = MultiHeadAttention(DIM, heads)  # raises a clear ValueError when 24 % heads != 0
    with torch.no_grad():
        # weights ~ N(0, 1/D): q and k entries then have variance ~1, the setting of chapter 01
        for p in (mha.qkv.weight, mha.proj.weight):
            p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(DIM))
        for p in (mha.qkv.bias, mha.proj.bias):
            p.zero_()
        q, k, v = mha.project(x)  # each [1, H, T, d_head]

    d_head = DIM // heads
    scale = {"1/sqrt(d)": 1.0 / math.sqrt(d_head), "none": 1.0}.get(scaling, 1.0 / (temperature * math.sqrt(d_head)))

    allowed = torch.ones(t, t, dtype=torch.bool)  # [Tq, Tk]
    if mask in ("causal", "both"):
        allowed &= causal_mask(t)
    if mask in ("padding", "both"):
        is_real = torch.tensor([w != PAD for w in tokens])  # [T]
        allowed &= is_real[None, :]  # key padding: nobody may attend to a <pad> key
    with torch.no_grad():
        _, weights = scaled_dot_product_attention(q, k, v, allowed, scale=scale, return_weights=True)
    return tokens, weights[0], allowed, scale  # [H, T, T]
