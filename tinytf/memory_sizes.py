"""Sizes in bytes, from shapes and a dtype alone (no tensor is allocated): one element, one
``[B, H, T, T]`` score matrix, a KV cache, one step of the tiled attention; and how to print them.

Every function returns bytes as an ``int``; :func:`tinytf.memory.ledger` adds them up for a whole
model. All are importable from :mod:`tinytf.memory`."""

from __future__ import annotations

import torch

from .config import check_kv_heads, check_window

__all__ = [
    "as_dtype", "dtype_bytes", "dtype_name", "attention_matrix_bytes", "kv_cache_bytes", "tiled_working_set", "format_bytes",
    "GiB", "MiB", "KiB", "FP32", "TILE",
]

TILE = 64  # the block_q = block_k of tinytf.tiled_attention that backend="tiled" uses
FP32 = 4  # LayerNorm statistics and the fused kernel's log-sum-exp are kept in fp32
GiB, MiB, KiB = 2**30, 2**20, 2**10

_ALIASES = {"fp32": torch.float32, "float32": torch.float32, "fp16": torch.float16, "float16": torch.float16,
            "bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp64": torch.float64, "float64": torch.float64}


def as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """``"fp16"``/``"float16"``/``torch.float16`` -> ``torch.float16`` (also bf16, fp32, fp64); ``ValueError`` for other names."""
    if isinstance(dtype, str):
        if dtype.lower().removeprefix("torch.") not in _ALIASES:
            raise ValueError(f"unknown dtype {dtype!r}: use one of {sorted(_ALIASES)} or a torch.dtype")
        return _ALIASES[dtype.lower().removeprefix("torch.")]
    return dtype


def dtype_bytes(dtype: torch.dtype | str) -> int:
    """Bytes per element: ``torch.float16``/``"fp16"`` -> 2, ``torch.float32``/``"fp32"`` -> 4, ..."""
    return torch.empty((), dtype=as_dtype(dtype)).element_size()


def attention_matrix_bytes(batch: int, heads: int, tokens: int, dtype: torch.dtype | str) -> int:
    """Bytes of one ``[B, H, T, T]`` scores or weights tensor."""
    return batch * heads * tokens * tokens * dtype_bytes(dtype)


def kv_cache_bytes(
    batch: int,
    layers: int,
    heads: int,
    tokens: int,
    head_dim: int,
    dtype: torch.dtype | str,
    *,
    kv_heads: int | None = None,
    window: int | None = None,
) -> int:
    """Bytes of a KV cache: keys and values ``[B, kv_heads, T, d_head]`` for every layer (``2·L·B·kv_heads·T·d``).

    ``kv_heads`` (a divisor of ``heads``; None = ``heads``) are the K/V heads a grouped-query model
    stores: the cache is exactly ``heads / kv_heads`` times smaller. With a sliding ``window`` the
    rolling cache holds ``min(T, window)`` tokens."""
    stored = check_kv_heads(heads, kv_heads)
    kept = tokens if window is None else min(tokens, check_window(window))
    return 2 * layers * batch * stored * kept * head_dim * dtype_bytes(dtype)


def tiled_working_set(batch: int, heads: int, tokens: int, head_dim: int, dtype: torch.dtype | str, block: int = TILE) -> int:
    """Bytes live inside one step of :func:`tinytf.tiled_attention` (no grad), beyond its inputs and output.

    Two ``[B, H, bq, bk]`` tiles (the scores and their exponentials ``p``), the bool mask tile
    ``[bq, bk]``, five ``[B, H, bq, d]`` tensors (the scaled query block, the accumulator, ``p @ v``,
    the rescaled and the new accumulator) and seven ``[B, H, bq, 1]`` statistics (``m``, ``l``, the
    tile maximum, the new and the safe maximum, the correction factor, the new ``l``). Blocks are
    ``min(block, T)``: at ``T <= block`` a tile *is* the whole score matrix.
    """
    b, t = dtype_bytes(dtype), min(block, tokens)
    return (2 * batch * heads * t * t + 5 * batch * heads * t * head_dim + 7 * batch * heads * t) * b + t * t


def dtype_name(dtype: torch.dtype | str) -> str:
    """Short name: ``torch.bfloat16``/``"bfloat16"`` -> ``"bf16"``, ``torch.float32`` -> ``"fp32"``."""
    dtype = as_dtype(dtype)
    return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}.get(dtype, str(dtype))


def format_bytes(n: float) -> str:
    """``4294967296 -> '4.00 GiB'``, ``1536 -> '1.50 KiB'`` (binary units)."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"
