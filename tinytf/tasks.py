"""Tiny synthetic tasks a model can only solve with attention: copying, and looking a fixed distance back.

    ids     = x_1 … x_L  SEP  x_1 … x_L                      [B, 2L + 1]
    targets = ids[:, 1:] with the first L entries ignored    [B, 2L]

After the separator, the token at position ``L + i`` must be ``x_i``, a random symbol seen ``L``
positions earlier. An MLP applied to each position on its own cannot know it; attention can look
it up. The first half is random, so its targets are unpredictable and are ignored in the loss
(``IGNORE_INDEX``, the default ``ignore_index`` of ``F.cross_entropy``).

    lag task:  ids = x_0 … x_{T-1} (random symbols),  at position t the answer is x_{t - lag}    [B, T - 1]

The lag task needs *relative* positions: the same lookup at every position, at any length, so a model trained
on short sequences can be evaluated on longer ones (chapter 13's length extrapolation).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["IGNORE_INDEX", "SEP", "copy_batch", "lag_batch", "copy_loss", "token_accuracy"]

IGNORE_INDEX = -100  # F.cross_entropy's default ignore_index
SEP = 0  # the separator token; symbols are 1 … vocab - 1


def copy_batch(
    batch: int,
    length: int,
    vocab: int,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of the copy task: ids ``[B, 2L + 1]`` and shifted targets ``[B, 2L]``.

    ``targets[:, t]`` is the token that ``logits[:, t]`` must predict (``ids[:, t + 1]``); the first
    ``L`` targets (the random half and the separator) are ``IGNORE_INDEX``, the last ``L`` are the copy.
    """
    if batch < 1 or length < 1:
        raise ValueError(f"copy_batch needs batch >= 1 and length >= 1, got batch={batch}, length={length}")
    if vocab < 3:
        raise ValueError(f"copy_batch needs vocab >= 3 (the separator {SEP} plus at least two symbols), got {vocab}")
    x = torch.randint(1, vocab, (batch, length), generator=generator)  # [B, L] symbols, never SEP
    sep = torch.full((batch, 1), SEP, dtype=x.dtype)
    ids = torch.cat([x, sep, x], dim=1)  # [B, 2L + 1]
    targets = ids[:, 1:].clone()  # [B, 2L]: position t predicts ids[:, t + 1]
    targets[:, :length] = IGNORE_INDEX  # the random half (and the separator) carry no signal
    return ids.to(device), targets.to(device)


def lag_batch(
    batch: int,
    length: int,
    vocab: int,
    lag: int,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of the lag task: ids ``[B, T]`` (random symbols ``1 … vocab - 1``) and targets ``[B, T - 1]`` where
    ``targets[:, t] = ids[:, t - lag]`` — what ``logits[:, t]`` must output — and ``IGNORE_INDEX`` for ``t < lag``."""
    if batch < 1 or not 1 <= lag < length - 1:
        raise ValueError(f"lag_batch needs batch >= 1 and 1 <= lag < length - 1, got batch={batch}, length={length}, lag={lag}")
    if vocab < 3:
        raise ValueError(f"lag_batch needs vocab >= 3 (symbols 1 … vocab - 1), got {vocab}")
    ids = torch.randint(1, vocab, (batch, length), generator=generator)  # [B, T]
    targets = torch.full((batch, length - 1), IGNORE_INDEX, dtype=ids.dtype)  # [B, T - 1]
    targets[:, lag:] = ids[:, : length - 1 - lag]  # row t answers ids[t - lag]
    return ids.to(device), targets.to(device)


def copy_loss(model: torch.nn.Module, ids: torch.Tensor, targets: torch.Tensor,
              mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy of a language model on a copy (or lag) batch, and the logits it scored.

    ids: [B, 2L + 1], targets: [B, 2L] (from :func:`copy_batch`; :func:`lag_batch`'s pair fits too); returns the mean loss over the copied
    half and logits ``[B, 2L, V]`` (row t predicts ``ids[:, t + 1]``) — chapter 07 writes it out."""
    if targets.shape != (ids.size(0), ids.size(1) - 1):
        raise ValueError(f"copy_loss expects targets [B, T - 1] for ids [B, T], got ids {list(ids.shape)} and targets "
                         f"{list(targets.shape)}: pass copy_batch's (ids, targets) pair, already shifted.")
    logits = model(ids, mask=mask)[:, :-1]  # [B, 2L, V]
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=IGNORE_INDEX)
    return loss, logits


def token_accuracy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> float:
    """Fraction of non-ignored targets ``[B, T]`` whose argmax prediction in logits ``[B, T, V]`` is right."""
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"token_accuracy expects logits [B, T, V] and targets [B, T], got logits {list(logits.shape)} and "
            f"targets {list(targets.shape)}. Shift first: logits[:, :-1] predicts ids[:, 1:]."
        )
    real = targets != ignore_index
    if not real.any():
        raise ValueError("token_accuracy: every target is ignore_index, nothing to score")
    right = (logits.argmax(dim=-1) == targets) & real
    return float(right.sum()) / float(real.sum())
