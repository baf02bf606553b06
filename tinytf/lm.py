"""A tiny decoder-only language model, its next-token loss, and one training step.

    ids [B, T] -> token [B, T, D] + position [1, T, D] -> blocks [B, T, D] -> norm -> lm_head [B, T, V]

The position term is the learned table (``positions="learned"``, the seed's) or the fixed sinusoidal one; with
``"rope"`` and ``"alibi"`` positions act inside every attention layer instead, with ``"none"`` nowhere.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from .block import TransformerBlock
from .config import ModelConfig
from .sinusoidal import SinusoidalPositions
from .translation import gettext as _

if TYPE_CHECKING:  # pragma: no cover
    from .kvcache import KVCache

__all__ = ["TinyLanguageModel", "lm_loss", "train_step"]


class TinyLanguageModel(nn.Module):
    """Decoder-only LM with submodules ``token``, ``position``, ``blocks``, ``norm``, ``lm_head``.

    ``position`` is the learned table ``nn.Embedding(max_tokens, D)`` for ``positions="learned"``, a parameter-free
    :class:`tinytf.sinusoidal.SinusoidalPositions` for ``"sinusoidal"``, and None otherwise (RoPE and ALiBi act in the
    attention layers; ``"none"`` has no positions at all).

    Built from a :class:`tinytf.ModelConfig` (``TinyLanguageModel(config)``, keywords override its
    fields), from keywords or positional sizes (``TinyLanguageModel(vocab=100, dim=32, heads=4)``,
    ``TinyLanguageModel(100, 32, 4, 2, 64)``), or from a dict with :meth:`from_config`.
    ``model.config`` is the full config: every block is built from it.
    """

    def __init__(self, config: ModelConfig | int | None = None, *sizes: int, **fields: Any) -> None:
        super().__init__()
        c = self.config = _resolve_config(config, sizes, fields)
        self.max_tokens = c.max_tokens
        self.token = nn.Embedding(c.vocab, c.dim)
        if c.positions == "learned":
            self.position = nn.Embedding(c.max_tokens, c.dim)
        elif c.positions == "sinusoidal":
            self.position = SinusoidalPositions(c.dim)
        else:
            self.position = None  # RoPE and ALiBi act inside attention; "none" has no positions
        self.blocks = nn.ModuleList(TransformerBlock(c) for _ in range(c.layers))
        self.norm = nn.LayerNorm(c.dim)
        self.lm_head = nn.Linear(c.dim, c.vocab, bias=False)

    @classmethod
    def from_config(cls, config: ModelConfig | Mapping[str, Any]) -> TinyLanguageModel:
        """A fresh model from a :class:`ModelConfig` or its ``to_dict()`` (missing fields: defaults)."""
        return cls(config if isinstance(config, ModelConfig) else ModelConfig.from_dict(config))

    def forward(self, ids: torch.Tensor, cache: KVCache | None = None, mask: torch.Tensor | None = None, *,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        """ids ``[B, T]`` (int) -> logits ``[B, T, vocab]``.

        With ``cache`` (a :class:`tinytf.KVCache`), ``ids`` are the *new* tokens only: a prefill
        writes a whole prompt, a decode step one token; positions continue from ``cache.seen``.
        ``positions`` ``[B, T]`` (without a cache): each token's position, e.g. counted from the first real token of a
        left-padded sequence (:func:`tinytf.masks.padded_positions`); by default ``0 … T - 1``. Only learned positions
        stop at ``max_tokens``.
        """
        x = self.embed(ids, positions, start=0 if cache is None else cache.seen)  # [B, T, D]
        for i, block in enumerate(self.blocks):
            x = block(x, mask, cache=cache, layer=i, positions=positions)
        return self.lm_head(self.norm(x))  # [B, T, V]

    def embed(self, ids: torch.Tensor, positions: torch.Tensor | None = None, *, start: int = 0) -> torch.Tensor:
        """ids ``[B, T]`` -> ``x [B, T, D]``, what the first block takes: the token embeddings plus, for learned or
        sinusoidal positions, the table's rows at ``positions`` ``[B, T]`` (by default ``start … start + T - 1``);
        RoPE and ALiBi add nothing here, they act in attention.

        A rank holding part of a split sequence (sequence or context parallelism) passes the *global* positions of
        its tokens, ``layout_positions(layout[rank]).expand_as(ids)`` (:func:`tinytf.layout_positions`): the rows of
        those positions, never ``0 … T/P - 1``; a learned table then still stops at ``max_tokens``.
        """
        if ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
            raise ValueError(_("ids must be an integer tensor [B, T], got {dtype} of shape {shape}").format(dtype=ids.dtype,
                                                                                                              shape=list(ids.shape)))
        if positions is not None and (positions.shape != ids.shape or positions.is_floating_point()):
            raise ValueError(_("positions must be integers of the shape of ids {shape}, got {dtype} {got}").format(
                shape=list(ids.shape), dtype=positions.dtype, got=list(positions.shape)))
        t = ids.size(1)
        last = start + t if positions is None else int(positions.max()) + 1
        if last > self.max_tokens and self.config.positions == "learned":
            after = _(" after {start} cached").format(start=start) if start else ""
            tail = (_(" (or relative positions: positions='rope' or 'alibi').") if self.config.window is None else
                    _(". A sliding window and its rolling cache bound the memory, not the positions: every token still needs a "
                      "row of the learned position table; relative positions (positions='rope' or 'alibi') do not."))
            raise ValueError(_("{last} positions (ids {shape}{after}) exceed max_tokens={max_tokens}, the size of the position "
                               "table. Keep only the last {max_tokens} tokens or build the model with a larger max_tokens{tail}")
                             .format(last=last, shape=list(ids.shape), after=after, max_tokens=self.max_tokens, tail=tail))
        x = self.token(ids)  # [B, T, D]
        if self.position is not None:
            at = torch.arange(start, start + t, device=ids.device)[None, :] if positions is None else positions  # [1 or B, T]
            x = x + self.position(at).to(x.dtype)  # [B, T, D]
        return x


def _resolve_config(config: ModelConfig | int | None, sizes: tuple[int, ...], fields: dict[str, Any]) -> ModelConfig:
    """The :class:`ModelConfig` of ``TinyLanguageModel(config, *sizes, **fields)``."""
    if isinstance(config, ModelConfig):
        if sizes:
            raise ValueError(_("TinyLanguageModel(config, ...) takes its sizes from the config; got extra positional {sizes}")
                             .format(sizes=list(sizes)))
        return ModelConfig.from_dict({**config.to_dict(), **fields}) if fields else config  # keywords override
    if isinstance(config, Mapping):
        raise ValueError(_("TinyLanguageModel takes a ModelConfig, not a dict: use TinyLanguageModel.from_config(d)"))
    names = [f.name for f in dataclasses.fields(ModelConfig)]
    given = ((config,) if config is not None else ()) + sizes
    if config is None and sizes:
        raise ValueError(_("TinyLanguageModel(None, ...): pass the sizes as keywords, e.g. TinyLanguageModel(vocab=100, dim=32)"))
    if len(given) > len(names):
        raise ValueError(_("TinyLanguageModel takes at most {n} positional values ({names}), got {got}").format(
            n=len(names), names=", ".join(names), got=len(given)))
    twice = [n for n in names[: len(given)] if n in fields]
    if twice:
        raise ValueError(_("{names} given both by position and by keyword").format(names=twice))
    return ModelConfig.from_dict({**dict(zip(names, given)), **fields})


def lm_loss(logits: torch.Tensor, ids: torch.Tensor, *, pad_id: int | None = None) -> torch.Tensor:
    """Next-token cross-entropy. logits ``[B, T, V]`` were computed from ids ``[B, T]``.

    The shift happens here: ``logits[:, :-1]`` predicts ``ids[:, 1:]``. Targets equal to ``pad_id``
    are ignored and the mean is over real target tokens only.
    """
    if logits.dim() != 3 or ids.dim() != 2 or logits.shape[:2] != ids.shape:
        raise ValueError(_("lm_loss expects logits [B, T, V] computed from ids [B, T]; got logits {logits} and ids {ids}. Pass "
                           "the full ids: lm_loss shifts them itself.").format(logits=list(logits.shape), ids=list(ids.shape)))
    if ids.size(1) < 2:
        raise ValueError(_("lm_loss needs T >= 2 to have a next token to predict, got ids {ids}").format(ids=list(ids.shape)))
    pred = logits[:, :-1]  # [B, T-1, V]: position t predicts token t+1
    target = ids[:, 1:]  # [B, T-1]
    ignore = -100 if pad_id is None else pad_id
    n_real = (target != ignore).sum()
    if n_real == 0:
        raise ValueError(_("lm_loss: every target token equals pad_id, so there is nothing to learn from"))
    total = F.cross_entropy(pred.reshape(-1, pred.size(-1)), target.reshape(-1), ignore_index=ignore, reduction="sum")
    return total / n_real  # mean over real tokens only


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    ids: torch.Tensor,
    *,
    pad_id: int | None = None,
    clip: float | None = 1.0,
    scheduler: Any = None,
) -> dict[str, float]:
    """One optimisation step: zero grads, forward, :func:`lm_loss`, backward, clip, step.

    Returns ``{"loss", "grad_norm", "lr"}`` (grad_norm before clipping).
    """
    model.train()
    optimizer.zero_grad(set_to_none=True)
    loss = lm_loss(model(ids), ids, pad_id=pad_id)
    loss.backward()
    params = [p for p in model.parameters() if p.grad is not None]
    if clip is not None:
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
    else:
        grad_norm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params])))
    optimizer.step()
    lr = optimizer.param_groups[0]["lr"]
    if scheduler is not None:
        scheduler.step()
    return {"loss": float(loss.detach()), "grad_norm": grad_norm, "lr": float(lr)}
