"""A memory ledger: predicted bytes for attention, activations, parameters and the KV cache.

Every function takes shapes and a dtype and returns bytes (an ``int``)."""

from __future__ import annotations

import torch

__all__ = ["dtype_bytes", "attention_matrix_bytes", "kv_cache_bytes"]


def dtype_bytes(dtype: torch.dtype | str) -> int:
    """Bytes per element: ``torch.float16``/``"fp16"`` -> 2, ``torch.float32``/``"fp32"`` -> 4, ..."""
    if isinstance(dtype, str):
        aliases = {"fp32": torch.float32, "float32": torch.float32, "fp16": torch.float16, "float16": torch.float16,
                   "bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp64": torch.float64, "float64": torch.float64}
        if dtype.lower() not in aliases:
            raise ValueError(f"unknown dtype {dtype!r}: use one of {sorted(aliases)} or a torch.dtype")
        dtype = aliases[dtype.lower()]
    return torch.empty((), dtype=dtype).element_size()


def attention_matrix_bytes(batch: int, heads: int, tokens: int, dtype: torch.dtype | str) -> int:
    """Bytes of one ``[B, H, T, T]`` scores or weights tensor."""
    return batch * heads * tokens * tokens * dtype_bytes(dtype)


def kv_cache_bytes(batch: int, layers: int, heads: int, tokens: int, head_dim: int, dtype: torch.dtype | str) -> int:
    """Bytes of a KV cache: keys and values ``[B, H, T, d_head]`` for every layer (``2·L·B·H·T·d``)."""
    return 2 * layers * batch * heads * tokens * head_dim * dtype_bytes(dtype)
