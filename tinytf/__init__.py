"""tinytf — hand-written attention and the Transformer block, small enough to read in one sitting.

Masks are boolean with **True = may attend** (the convention of
``torch.nn.functional.scaled_dot_product_attention``).
"""

from __future__ import annotations

from .alibi import alibi_bias, alibi_slopes
from .attention import scaled_dot_product_attention
from .bench import BenchResult, benchmark, one_thread
from .block import TransformerBlock
from .checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from .checks import (
    CATALOG,
    PITFALLS,
    Finding,
    Pitfall,
    diagnose_alibi,
    diagnose_attention,
    diagnose_block,
    diagnose_causal_mask,
    diagnose_causal_tiles,
    diagnose_expand_kv,
    diagnose_grad_underflow,
    diagnose_half_attention,
    diagnose_kv_grouping,
    diagnose_lm_loss,
    diagnose_masked_rows,
    diagnose_online_softmax,
    diagnose_overlapped_ring,
    diagnose_padded_positions,
    diagnose_qkv_split,
    diagnose_replicated,
    diagnose_replicated_grads,
    diagnose_ring_attention,
    diagnose_ring_traffic,
    diagnose_rope,
    diagnose_rope_decode,
    diagnose_row_parallel,
    diagnose_tiled_attention,
    diagnose_timings,
    diagnose_ulysses,
    diagnose_window,
    report,
)
from .collectives import (
    Comm,
    Pending,
    Traffic,
    all_gather_bytes,
    all_reduce_bytes,
    all_to_all_bytes,
    conjugate_exchange,
    copy_to_parallel,
    reduce_from_parallel,
    reduce_scatter_bytes,
)
from .compiled import CompileReport, compile_report, compile_skip_reason
from .config import ModelConfig
from .context_parallel import ContextParallelBlock
from .convert import to_grouped_query, to_half_split
from .device import describe_device, pick_device, synchronize
from .generation import cache_for, generate
from .grouped import repeat_kv
from .heads import CausalSelfAttention, MultiHeadAttention
from .kvcache import KVCache
from .language import edition_folder, notebook_language
from .launch import run_processes, torchrun
from .lm import TinyLanguageModel, lm_loss, train_step
from .masks import causal_mask, padding_mask
from .memory import Ledger, ledger
from .mixed_precision import GradientUnderflow, gradient_underflow, lost_updates
from .parallel import (
    TensorParallelAttention,
    TensorParallelBlock,
    column_parallel_linear,
    reduce_replicated_kv_grads,
    row_parallel_linear,
    shard_block_tensors,
    shard_qkv,
)
from .params import count_parameters, parameter_breakdown
from .precision import Threshold, accumulation_errors, finite_map, formats, score_overflow, softmax_overflow
from .profiling import PartTimes, label_parts, part_times
from .ring import (
    RingStats,
    causal_scores,
    contiguous_layout,
    layout_positions,
    ring_attention,
    shard_sequence,
    unshard_sequence,
    zigzag_layout,
)
from .rolling import RollingKVCache
from .rope import RotaryEmbedding, apply_rope, rope_frequencies, rope_tables, rotate_half
from .sequence_parallel import SequenceParallelBlock, gather_sequence, scatter_sequence
from .sinusoidal import sinusoidal_table
from .tiled import TileStats, online_softmax_finish, online_softmax_update, tiled_attention
from .ulysses import heads_to_seq, seq_to_heads, ulysses_attention

__version__ = "0.1.0"

__all__ = [
    "scaled_dot_product_attention",
    "tiled_attention",
    "online_softmax_update",
    "online_softmax_finish",
    "TileStats",
    "causal_mask",
    "padding_mask",
    "MultiHeadAttention",
    "CausalSelfAttention",
    "repeat_kv",
    "to_grouped_query",
    "to_half_split",
    "RotaryEmbedding",
    "rope_frequencies",
    "rope_tables",
    "rotate_half",
    "apply_rope",
    "alibi_slopes",
    "alibi_bias",
    "sinusoidal_table",
    "TransformerBlock",
    "ModelConfig",
    "TinyLanguageModel",
    "lm_loss",
    "train_step",
    "Checkpoint",
    "save_checkpoint",
    "load_checkpoint",
    "KVCache",
    "RollingKVCache",
    "generate",
    "cache_for",
    "pick_device",
    "describe_device",
    "synchronize",
    "notebook_language",
    "edition_folder",
    "count_parameters",
    "parameter_breakdown",
    "Ledger",
    "ledger",
    "BenchResult",
    "benchmark",
    "one_thread",
    "Finding",
    "Pitfall",
    "PITFALLS",
    "CATALOG",
    "report",
    "diagnose_attention",
    "diagnose_causal_mask",
    "diagnose_block",
    "diagnose_lm_loss",
    "diagnose_online_softmax",
    "diagnose_tiled_attention",
    "diagnose_causal_tiles",
    "diagnose_kv_grouping",
    "diagnose_expand_kv",
    "diagnose_window",
    "Comm",
    "Traffic",
    "all_reduce_bytes",
    "all_gather_bytes",
    "reduce_scatter_bytes",
    "all_to_all_bytes",
    "Pending",
    "conjugate_exchange",
    "copy_to_parallel",
    "reduce_from_parallel",
    "run_processes",
    "torchrun",
    "shard_qkv",
    "shard_block_tensors",
    "column_parallel_linear",
    "row_parallel_linear",
    "TensorParallelAttention",
    "TensorParallelBlock",
    "reduce_replicated_kv_grads",
    "SequenceParallelBlock",
    "gather_sequence",
    "scatter_sequence",
    "ContextParallelBlock",
    "ulysses_attention",
    "seq_to_heads",
    "heads_to_seq",
    "ring_attention",
    "causal_scores",
    "RingStats",
    "contiguous_layout",
    "zigzag_layout",
    "shard_sequence",
    "unshard_sequence",
    "layout_positions",
    "diagnose_qkv_split",
    "diagnose_row_parallel",
    "diagnose_replicated",
    "diagnose_ring_attention",
    "formats",
    "score_overflow",
    "softmax_overflow",
    "accumulation_errors",
    "finite_map",
    "Threshold",
    "gradient_underflow",
    "GradientUnderflow",
    "lost_updates",
    "label_parts",
    "part_times",
    "PartTimes",
    "compile_report",
    "compile_skip_reason",
    "CompileReport",
    "diagnose_half_attention",
    "diagnose_masked_rows",
    "diagnose_grad_underflow",
    "diagnose_timings",
    "diagnose_ulysses",
    "diagnose_overlapped_ring",
    "diagnose_replicated_grads",
    "diagnose_ring_traffic",
    "diagnose_rope",
    "diagnose_rope_decode",
    "diagnose_alibi",
    "diagnose_padded_positions",
]
