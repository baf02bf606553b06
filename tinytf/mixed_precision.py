"""Mixed-precision training, measured: the gradients that underflow to zero in an fp16 backward without loss
scaling (what ``torch.amp.GradScaler`` prevents), and the weight updates a bf16 copy of the weights would lose
(why autocast keeps fp32 *master* weights).

    gradient_underflow(model, lambda m: loss(m), dtype=torch.float16)   # entries lost, with and without scaling
    lost_updates(model.parameters(), updates, torch.bfloat16)           # updates too small to change a bf16 weight
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from .memory_sizes import as_dtype, dtype_name

__all__ = ["GradientUnderflow", "gradient_underflow", "lost_updates"]

Tensor = torch.Tensor


@dataclass(frozen=True)
class GradientUnderflow:
    """Parameter-gradient entries of one backward: ``total``; exactly zero in fp32 (``zero_fp32``); zero under
    autocast in ``dtype`` without loss scaling but not in fp32 (``lost``); the same with the loss scaled by
    ``scale`` (``lost_scaled``); and the relative error of each gradient vector against fp32's."""

    dtype: str
    scale: float
    total: int
    zero_fp32: int
    lost: int
    lost_scaled: int
    error: float
    error_scaled: float


def gradient_underflow(model: torch.nn.Module, loss_fn: Callable[[torch.nn.Module], Tensor], *, dtype: torch.dtype | str = torch.float16,
                       scale: float = 2.0**16) -> GradientUnderflow:
    """Count the gradient entries that underflow to zero in a ``dtype`` autocast backward: ``loss_fn(model)`` (the
    forward and the loss) runs in fp32, under ``torch.autocast(dtype)``, and under autocast with the loss
    multiplied by ``scale`` (what ``torch.amp.GradScaler`` does; the gradients are divided back). The model's
    ``.grad`` are cleared afterwards."""
    dt = as_dtype(dtype)
    device_type = next(model.parameters()).device.type

    def grads(autocast: bool, factor: float) -> Tensor:
        model.zero_grad(set_to_none=True)
        ctx = torch.autocast(device_type, dtype=dt) if autocast else contextlib.nullcontext()
        with ctx:
            loss = loss_fn(model)
        (loss.float() * factor).backward()
        return torch.cat([(p.grad.float() / factor).flatten() for p in model.parameters() if p.grad is not None])

    ref, plain, scaled = grads(False, 1.0), grads(True, 1.0), grads(True, scale)
    model.zero_grad(set_to_none=True)
    live = ref != 0

    def err(g: Tensor) -> float:
        return ((g - ref).norm() / ref.norm()).item()

    return GradientUnderflow(dtype_name(dt), scale, ref.numel(), int((~live).sum()), int(((plain == 0) & live).sum()),
                             int(((scaled == 0) & live).sum()), err(plain), err(scaled))


def lost_updates(params: Iterable[Tensor], updates: Iterable[Tensor], dtype: torch.dtype | str = torch.bfloat16) -> tuple[int, int]:
    """``(lost, changed)``: of the non-zero entries of ``updates`` (one optimizer step's ``new - old``), how many leave a
    copy of ``params`` stored in ``dtype`` unchanged (``round(w + u) == round(w)``), and how many change the fp32 weight."""
    dt = as_dtype(dtype)
    lost = changed = 0
    for w, u in zip(params, updates):
        w, u = w.detach().float(), u.detach().float()
        moved = u != 0
        changed += int(moved.sum())
        lost += int(((w + u).to(dt) == w.to(dt))[moved].sum())
    return lost, changed
