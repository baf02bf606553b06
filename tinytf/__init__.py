"""tinytf — hand-written attention and the Transformer block, small enough to read in one sitting.

Masks are boolean with **True = may attend** (the convention of
``torch.nn.functional.scaled_dot_product_attention``).
"""

from __future__ import annotations

from .attention import scaled_dot_product_attention
from .bench import BenchResult, benchmark, one_thread
from .block import TransformerBlock
from .checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from .checks import (
    CATALOG,
    PITFALLS,
    Finding,
    Pitfall,
    diagnose_attention,
    diagnose_block,
    diagnose_causal_mask,
    diagnose_causal_tiles,
    diagnose_expand_kv,
    diagnose_kv_grouping,
    diagnose_lm_loss,
    diagnose_online_softmax,
    diagnose_tiled_attention,
    diagnose_window,
    report,
)
from .device import describe_device, pick_device, synchronize
from .grouped import repeat_kv, to_grouped_query
from .heads import CausalSelfAttention, MultiHeadAttention
from .kvcache import KVCache, generate
from .language import edition_folder, notebook_language
from .lm import ModelConfig, TinyLanguageModel, lm_loss, train_step
from .masks import causal_mask, padding_mask
from .memory import Ledger, ledger
from .params import count_parameters, parameter_breakdown
from .rolling import RollingKVCache
from .tiled import TileStats, online_softmax_finish, online_softmax_update, tiled_attention

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
]
