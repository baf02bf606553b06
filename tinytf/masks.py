"""Boolean attention masks. Convention: **True = may attend**, as in
``torch.nn.functional.scaled_dot_product_attention``, so one mask serves both backends."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .config import check_window
from .translation import gettext as _

__all__ = ["causal_mask", "padding_mask", "padded_positions", "check_causal_sizes", "check_causal_window"]


def causal_mask(
    t_q: int, t_k: int | None = None, *, window: int | None = None, device: torch.device | str | None = None
) -> torch.Tensor:
    """Causal mask ``[t_q, t_k]`` (bool, True = may attend).

    With ``t_k > t_q`` the mask is aligned to the *end*: query ``i`` is the token at absolute
    position ``t_k - t_q + i`` and sees keys ``0 … t_k - t_q + i``, so the last query sees every key.
    That is the mask a decode step needs when ``t_q`` new tokens attend over a KV cache of ``t_k``.
    (Note: ``F.scaled_dot_product_attention(is_causal=True)`` aligns to the *start* instead; the two
    only agree when ``t_q == t_k``.)

    ``window`` (sliding-window attention): each query sees at most the last ``window`` keys, itself
    included — query at position ``p`` sees keys ``p - window + 1 … p``. ``window=1``: only itself;
    ``window >= t_k``: the plain causal mask.
    """
    t_k = t_q if t_k is None else t_k
    check_causal_sizes(t_q, t_k)
    ones = torch.ones(t_q, t_k, dtype=torch.bool, device=device)
    offset = t_k - t_q  # absolute position of query 0
    mask = ones.tril(diagonal=offset)  # [t_q, t_k]: key j <= offset + i
    if window is not None:
        mask = mask.triu(diagonal=offset - check_window(window) + 1)  # and key j > offset + i - window
    return mask


def check_causal_sizes(t_q: int, t_k: int) -> None:
    """Raise ``ValueError`` unless an end-aligned causal mask ``[t_q, t_k]`` exists (``1 <= t_q <= t_k``).

    Shared by :func:`causal_mask` and the tiled attention, which never builds the whole mask.
    """
    if t_q < 1 or t_k < 1:
        raise ValueError(_("causal_mask needs positive sizes, got t_q={t_q}, t_k={t_k}").format(t_q=t_q, t_k=t_k))
    if t_k < t_q:
        raise ValueError(
            _("causal_mask(t_q={t_q}, t_k={t_k}): an end-aligned causal mask needs t_k >= t_q (the keys include the queries' own "
              "positions). Pass t_k >= t_q.").format(t_q=t_q, t_k=t_k)
        )


def check_causal_window(window: int | None, is_causal: bool) -> int | None:
    """``window`` checked (:func:`tinytf.config.check_window`), or None; a ``ValueError`` if it comes without causality."""
    if window is not None and not is_causal:
        raise ValueError(_("a sliding window (window={window}) limits how far back a query looks: it needs is_causal=True")
                         .format(window=window))
    return None if window is None else check_window(window)


def padding_mask(
    lengths: Sequence[int] | torch.Tensor,
    t: int,
    *,
    side: str = "right",
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Key-padding mask ``[B, 1, 1, t]`` (bool, True = a real token that may be attended).

    ``lengths[b]`` real tokens per sequence; padding sits on the right (``side="right"``, the
    usual layout for training) or on the left (``side="left"``, common for batched generation).
    The two singleton axes broadcast over heads and query positions of ``[B, H, Tq, Tk]`` scores.
    """
    if side not in ("right", "left"):
        raise ValueError(_("padding_mask: side must be 'right' or 'left', got {side!r}").format(side=side))
    lengths = torch.as_tensor(lengths, device=device)
    if lengths.dim() != 1:
        raise ValueError(_("padding_mask: lengths must be 1-D [B], got shape {lengths_shape}").format(lengths_shape=list(lengths.shape)))
    if lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
        raise ValueError(_("padding_mask: lengths must be integers, got {lengths_dtype}").format(lengths_dtype=lengths.dtype))
    if len(lengths) and (int(lengths.min()) < 0 or int(lengths.max()) > t):
        raise ValueError(_("padding_mask: every length must lie in [0, {t}], got {lengths_tolist}")
            .format(t=t, lengths_tolist=lengths.tolist()))
    pos = torch.arange(t, device=lengths.device)  # [t]
    if side == "right":
        keep = pos[None, :] < lengths[:, None]  # [B, t]
    else:
        keep = pos[None, :] >= (t - lengths)[:, None]  # [B, t]
    return keep[:, None, None, :]  # [B, 1, 1, t]


def padded_positions(lengths: Sequence[int] | torch.Tensor, t: int, *, device: torch.device | str | None = None) -> torch.Tensor:
    """Position ids ``[B, t]`` (int64) of a left-padded batch: ``lengths[b]`` real tokens at the end of row ``b``,
    numbered ``0 … lengths[b] - 1``; the pads in front get 0 (they are masked anyway). Without them the first real
    token of a short sequence would sit at position ``t - lengths[b]`` — absolute positions see that offset."""
    keep = padding_mask(lengths, t, side="left", device=device)[:, 0, 0, :]  # [B, t]
    return (keep.long().cumsum(-1) - 1).clamp(min=0)
