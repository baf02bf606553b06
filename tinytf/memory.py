"""A memory ledger: predicted bytes for attention, activations, parameters and the KV cache,
and the meters that check each prediction against a measurement.

Four modules, one namespace (every name is importable as ``tinytf.memory.X``):

* :mod:`tinytf.memory_sizes` — sizes from shapes and a dtype: :func:`dtype_bytes`,
  :func:`attention_matrix_bytes`, :func:`kv_cache_bytes`, :func:`tiled_working_set` (one step of the
  tiled attention) and :func:`format_bytes`;
* :mod:`tinytf.memory_ledger` — :func:`parameter_count` and :func:`ledger`, which adds the sizes up
  (a :class:`Ledger`) for a whole training step or inference prefill;
* :mod:`tinytf.memory_io` — an IO model: :func:`attention_io_bytes`, the bytes the explicit and the
  tiled attention move between slow and fast memory (:func:`tiled_io_blocks` picks the tiles);
* :mod:`tinytf.memory_meters` — measurements: :class:`SavedTensorMeter` (bytes autograd saves for
  backward), :class:`PeakMemoryMeter` (peak bytes of live tensors: ``torch.cuda`` statistics on a
  GPU, a dispatch-mode tensor tracker on the CPU) and :func:`state_bytes` (parameters, gradients,
  optimizer state).
"""

from __future__ import annotations

from .memory_io import IO_METHODS, attention_io_bytes, tiled_io_blocks
from .memory_ledger import ATTENTION_PATHS, INT64, LEDGER_ROWS, OPTIMIZER_STATES, Ledger, ledger, ledger_label, parameter_count
from .memory_meters import PeakMemoryMeter, SavedTensorMeter, state_bytes
from .memory_sizes import (
    FP32,
    GiB,
    KiB,
    MiB,
    as_dtype,
    attention_matrix_bytes,
    dtype_bytes,
    dtype_name,
    format_bytes,
    kv_cache_bytes,
    tiled_working_set,
)

__all__ = [
    "dtype_bytes", "dtype_name", "attention_matrix_bytes", "kv_cache_bytes", "format_bytes", "parameter_count",
    "Ledger", "ledger", "ledger_label", "LEDGER_ROWS", "SavedTensorMeter", "PeakMemoryMeter", "state_bytes",
    "GiB", "MiB", "KiB", "OPTIMIZER_STATES", "ATTENTION_PATHS", "FP32", "INT64",
    "tiled_working_set", "attention_io_bytes", "tiled_io_blocks", "IO_METHODS", "as_dtype",
]
