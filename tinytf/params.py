"""Parameter counts, computed from the module (never typed in)."""

from __future__ import annotations

from torch import nn

__all__ = ["count_parameters", "parameter_breakdown"]


def count_parameters(module: nn.Module, *, trainable_only: bool = False) -> int:
    """Number of scalar parameters in ``module``."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)


def parameter_breakdown(module: nn.Module, depth: int = 1) -> dict[str, int]:
    """Parameters per submodule, ``depth`` levels down (e.g. ``{"attn.qkv": 816, ...}``)."""
    out: dict[str, int] = {}
    for name, p in module.named_parameters():
        key = ".".join(name.split(".")[:depth]) if "." in name else name
        out[key] = out.get(key, 0) + p.numel()
    return out
