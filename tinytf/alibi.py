"""ALiBi (Press et al. 2022, "Train Short, Test Long"): no position embedding, a linear penalty on the scores.

    score[h, i, j] = q_i · k_j / sqrt(d)  -  m_h · (p_i - p_j)        p = absolute positions, p_j <= p_i

Head ``h`` has its own slope ``m_h``: for ``H`` a power of two the geometric sequence ``2^(-8/H), 2^(-16/H), …, 2^(-8)``
(steep heads look near, shallow heads far); other ``H`` take the sequence of the power of two below and every other
slope of the one above (:func:`alibi_slopes`). The bias is a float tensor added to the scores, so it composes with
the boolean masks (causal, window, padding) as ``bias.masked_fill(~allowed, -inf)`` (:func:`alibi_scores_bias`);
PyTorch's fused attention takes that as a float ``attn_mask``.

The keys need their absolute positions, not their slots: a rolling cache returns keys in ring order, and
:meth:`tinytf.KVCache.key_positions` says which position each returned key holds.
"""

from __future__ import annotations

import math

import torch

from .translation import gettext as _

__all__ = ["alibi_slopes", "alibi_bias", "allowed_keys", "alibi_scores_bias", "check_alibi"]


def alibi_slopes(heads: int) -> torch.Tensor:
    """The slope of each head ``[heads]`` (float32): ``2^(-8(h+1)/H)`` for ``H`` a power of two; otherwise the ``n``
    slopes of ``n = 2^floor(log2 H)`` heads, then the first ``H - n`` odd-numbered slopes of ``2n`` heads (the paper's rule)."""
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
        raise ValueError(_("alibi_slopes needs a positive number of heads, got {heads!r}").format(heads=heads))

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]

    n = 2 ** int(math.floor(math.log2(heads)))
    slopes = geometric(n) + geometric(2 * n)[0::2][: heads - n]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(slopes: torch.Tensor, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
    """``-m_h · (p_i - p_j)``: slopes ``[H]``, query positions ``[..., Tq]`` and key positions ``[..., Tk]`` (integers)
    -> ``[..., H, Tq, Tk]`` float32 (``[H, Tq, Tk]`` for 1-D positions). Zero on the diagonal, more negative with distance;
    positive for keys after the query, which a causal mask removes."""
    distance = (q_positions[..., :, None] - k_positions[..., None, :]).to(torch.float32)  # [..., Tq, Tk]
    return -slopes.to(distance.device)[:, None, None] * distance.unsqueeze(-3)  # [..., H, Tq, Tk]


def allowed_keys(q_positions: torch.Tensor, k_positions: torch.Tensor, *, window: int | None = None) -> torch.Tensor:
    """Bool ``[..., Tq, Tk]``: key ``j`` may be seen by query ``i`` iff ``p_j <= p_i`` (and ``p_i - p_j < window``): the
    causal (window) mask from absolute positions, in whatever order the keys come."""
    distance = q_positions[..., :, None] - k_positions[..., None, :]  # [..., Tq, Tk]
    allowed = distance >= 0
    return allowed if window is None else allowed & (distance < window)


def alibi_scores_bias(slopes: torch.Tensor, q_positions: torch.Tensor, k_positions: torch.Tensor, *, window: int | None = None,
                      mask: torch.Tensor | None = None) -> torch.Tensor:
    """The additive ``attn_mask`` of causal ALiBi attention: :func:`alibi_bias` where a query may attend (key at or before
    it, within ``window`` when given, and where the bool ``mask`` allows), ``-inf`` elsewhere. Shapes as
    :func:`alibi_bias`; ``mask`` broadcastable to the result (e.g. a padding mask ``[B, 1, 1, Tk]``)."""
    bias = alibi_bias(slopes, q_positions, k_positions)
    allowed = allowed_keys(q_positions, k_positions, window=window).unsqueeze(-3)  # [..., 1, Tq, Tk]
    if mask is not None:
        allowed = allowed & mask
    return bias.masked_fill(~allowed, float("-inf"))


def check_alibi(slopes: torch.Tensor | None, heads: int, is_causal: bool, where: str) -> None:
    """``ValueError`` unless ALiBi's ``slopes`` (if any) hold one slope per query head and the attention is causal.

    The bias ``-m·(p_i - p_j)`` is defined for keys at or before the query (it grows *positive* past it), so tinytf
    applies ALiBi to causal attention only, as :class:`tinytf.CausalSelfAttention` does; ``where`` names the caller."""
    if slopes is None:
        return
    if slopes.dim() != 1 or slopes.numel() != heads:
        raise ValueError(_("{where}: ALiBi needs one slope per query head, got slopes {shape} for {heads} heads. Pass "
                           "alibi_slopes(heads) (or the layer's attn.alibi_slopes).").format(where=where, shape=list(slopes.shape),
                                                                                            heads=heads))
    if not is_causal:
        raise ValueError(_("{where}: ALiBi's bias -m·(p_i - p_j) is defined for keys at or before the query; without the causal "
                           "mask it would reward the future. Pass is_causal=True, or drop the slopes.").format(where=where))
