"""Scaled dot-product attention, written out step by step (the explicit version).

    out = softmax(q kᵀ · scale  [masked]) v,   scale = 1 / sqrt(d)

Every intermediate is an ordinary tensor you can print: scores and weights are ``[..., Tq, Tk]``.
"""

from __future__ import annotations

import math

import torch

from .masks import causal_mask
from .translation import gettext as _

__all__ = ["scaled_dot_product_attention", "combine_masks", "check_qkv", "check_mask", "check_inputs"]


def _shape(t: torch.Tensor) -> list[int]:
    return list(t.shape)


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise ``ValueError`` unless q ``[..., Tq, d]``, k ``[..., Tk, d]``, v ``[..., Tk, dv]`` fit."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() < 2:
            raise ValueError(_("{name} must be at least 2-D [..., T, d], got shape {t}").format(name=name, t=_shape(t)))
        if not t.is_floating_point():
            raise ValueError(_("{name} must be a floating-point tensor, got {t_dtype}").format(name=name, t_dtype=t.dtype))
    if q.size(-1) != k.size(-1):
        raise ValueError(
            _("q and k must have the same width d to form q @ kᵀ: q {q} has d={q_size}, k {k} has d={k_size}. Project both to the same "
              "per-head width.").format(q=_shape(q), q_size=q.size(-1), k=_shape(k), k_size=k.size(-1))
        )
    if k.size(-2) != v.size(-2):
        raise ValueError(
            _("k and v must hold the same number of positions Tk: k {k}, v {v}").format(k=_shape(k), v=_shape(v))
        )
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2]:
        raise ValueError(
            _("q, k, v must share their leading (batch/head) dims: q {q}, k {k}, v {v}. Split heads the same way for all three ([B, H, "
              "T, d]).").format(q=_shape(q), k=_shape(k), v=_shape(v))
        )


def check_mask(mask: torch.Tensor, scores_shape: torch.Size | tuple[int, ...]) -> None:
    """Raise ``ValueError`` unless ``mask`` is bool and broadcasts to ``scores_shape`` ``[..., Tq, Tk]``.

    The rule is read from the right, as PyTorch broadcasting does: the last two mask axes are
    ``[Tq, Tk]`` (each may be 1). A ``[B, T]`` padding mask on ``[B, H, T, T]`` scores would be read
    as ``[Tq, Tk]``, which is wrong; use ``mask[:, None, None, :]`` (``[B, 1, 1, T]``) instead.
    """
    scores_shape = tuple(scores_shape)
    if mask.dtype != torch.bool:
        raise ValueError(
            _("mask must be torch.bool with True = may attend, got dtype {mask_dtype} (shape {mask}). Convert a 0/1 mask with "
              "mask.bool(); an additive mask (0 where allowed, -inf where blocked) with mask == 0.")
                  .format(mask_dtype=mask.dtype, mask=_shape(mask))
        )
    if mask.dim() > len(scores_shape):
        raise ValueError(
            _("mask has rank {mask_dim} (shape {mask}) but scores have rank {n_scores_shape} (shape {scores_shape}). Drop the extra axes.")
                .format(mask_dim=mask.dim(), mask=_shape(mask), n_scores_shape=len(scores_shape), scores_shape=list(scores_shape))
        )
    tq, tk = scores_shape[-2], scores_shape[-1]
    ok = True
    for m, s in zip(reversed(mask.shape), reversed(scores_shape)):
        if m not in (1, s):
            ok = False
    if not ok:
        hint = ""
        if mask.dim() == 2 and len(scores_shape) == 4:
            hint = (
                _(" A 2-D mask is read as [Tq, Tk]. If this is a [B, T] padding mask, reshape it to "
                "[B, 1, 1, T] with mask[:, None, None, :] (or build it with tinytf.padding_mask).")
            )
        raise ValueError(
            _("mask of shape {mask} does not broadcast to scores of shape {scores_shape} [..., Tq={tq}, Tk={tk}].{hint}")
                .format(mask=_shape(mask), scores_shape=list(scores_shape), tq=tq, tk=tk, hint=hint)
        )


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> None:
    """Every check of an attention call: :func:`check_qkv`, then :func:`check_mask` against the
    scores ``[..., Tq, Tk]`` and the mask's device. Shared by the explicit and the tiled version."""
    check_qkv(q, k, v)
    if mask is not None:
        check_mask(mask, (*q.shape[:-1], k.size(-2)))
        if mask.device != q.device:
            raise ValueError(
                _("mask is on {mask_device} but q is on {q_device}; create the mask with device=q.device (or register it as a buffer so "
                  "model.to() moves it).").format(mask_device=mask.device, q_device=q.device)
            )


def combine_masks(
    mask: torch.Tensor | None, is_causal: bool, t_q: int, t_k: int, device: torch.device
) -> torch.Tensor | None:
    """The allowed-positions mask (bool, True = may attend) from an optional mask and/or causality."""
    allowed = mask
    if is_causal:
        causal = causal_mask(t_q, t_k, device=device)  # [Tq, Tk]
        allowed = causal if allowed is None else allowed & causal
    return allowed


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    return_weights: bool = False,
    bias: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Explicit scaled dot-product attention.

    Args:
        q: ``[..., Tq, d]`` queries;  k: ``[..., Tk, d]`` keys;  v: ``[..., Tk, dv]`` values.
        mask: bool, broadcastable to ``[..., Tq, Tk]``, **True = may attend**.
        is_causal: also block the future; with ``Tk > Tq`` the causal mask is end-aligned
            (see :func:`tinytf.causal_mask`), which is what a KV-cache decode step needs.
        scale: multiplies the scores; defaults to ``1 / sqrt(d)``.
        return_weights: also return the attention weights ``[..., Tq, Tk]``.
        bias: float, broadcastable to ``[..., Tq, Tk]``, added to the scaled scores before masking (ALiBi's
            ``-m·(i - j)``, :mod:`tinytf.alibi`).

    Returns:
        ``out [..., Tq, dv]``, or ``(out, weights)``.

    Masking happens *before* the softmax (blocked scores become ``-inf``), so each query row of
    weights sums to 1 over the keys it may see. A row that may see nothing at all (say a left-pad
    query under a causal mask) gets all-zero weights and a zero output instead of NaN — the same
    choice PyTorch's own "safe softmax" makes.
    """
    check_inputs(q, k, v, mask)
    t_q, t_k = q.size(-2), k.size(-2)
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale

    scores = (q @ k.transpose(-2, -1)) * scale  # [..., Tq, d] @ [..., d, Tk] -> [..., Tq, Tk]
    if bias is not None:
        scores = scores + bias.to(scores.dtype)  # an additive bias on the scores (e.g. ALiBi)
    allowed = combine_masks(mask, is_causal, t_q, t_k, q.device)
    if allowed is None:
        weights = scores.softmax(dim=-1)
    else:
        empty = ~allowed.any(dim=-1, keepdim=True)  # query rows with nothing to attend to
        scores = scores.masked_fill(~allowed, float("-inf"))  # mask BEFORE softmax
        scores = scores.masked_fill(empty, 0.0)  # keep empty rows finite: no NaN, no NaN grads
        weights = scores.softmax(dim=-1).masked_fill(empty, 0.0)  # [..., Tq, Tk]
    out = weights @ v  # [..., Tq, Tk] @ [..., Tk, dv] -> [..., Tq, dv]
    return (out, weights) if return_weights else out
