"""The analytic memory ledger: predicted bytes for attention, activations, parameters and the
KV cache, from shapes and a dtype alone (no tensor is allocated).

Size helpers (:func:`dtype_bytes`, :func:`attention_matrix_bytes`, :func:`kv_cache_bytes`,
:func:`format_bytes`) return bytes as an ``int``; :func:`ledger` adds the terms up, component by
component, for a whole training step or inference prefill (a :class:`Ledger`). The meters that
check each prediction against a measurement live in :mod:`tinytf.memory_meters`; both are
importable from :mod:`tinytf.memory`."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from .config import ModelConfig, check_kv_heads, check_window

__all__ = [
    "dtype_bytes", "dtype_name", "attention_matrix_bytes", "kv_cache_bytes", "format_bytes", "parameter_count",
    "Ledger", "ledger", "GiB", "MiB", "KiB", "OPTIMIZER_STATES", "ATTENTION_PATHS", "tiled_working_set",
]


_ALIASES = {"fp32": torch.float32, "float32": torch.float32, "fp16": torch.float16, "float16": torch.float16,
            "bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp64": torch.float64, "float64": torch.float64}


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, str):
        if dtype.lower().removeprefix("torch.") not in _ALIASES:
            raise ValueError(f"unknown dtype {dtype!r}: use one of {sorted(_ALIASES)} or a torch.dtype")
        return _ALIASES[dtype.lower().removeprefix("torch.")]
    return dtype


def dtype_bytes(dtype: torch.dtype | str) -> int:
    """Bytes per element: ``torch.float16``/``"fp16"`` -> 2, ``torch.float32``/``"fp32"`` -> 4, ..."""
    return torch.empty((), dtype=_as_dtype(dtype)).element_size()


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


# -- the ledger -------------------------------------------------------------------------------------

OPTIMIZER_STATES = {"adamw": 2, "adam": 2, "sgd": 0, "sgd_momentum": 1}
ATTENTION_PATHS = ("explicit", "sdpa", "tiled")
TILE = 64  # the block_q = block_k of tinytf.tiled_attention that backend="tiled" uses
FP32 = 4  # LayerNorm statistics and the fused kernel's log-sum-exp are kept in fp32
INT64 = 8  # token ids and targets saved by the embedding and the loss
GiB, MiB, KiB = 2**30, 2**20, 2**10


def format_bytes(n: float) -> str:
    """``4294967296 -> '4.00 GiB'``, ``1536 -> '1.50 KiB'`` (binary units)."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def _config_of(model_config: Any) -> ModelConfig:
    """The :class:`tinytf.ModelConfig` of a config or of a :class:`tinytf.TinyLanguageModel` (its ``.config``)."""
    config = getattr(model_config, "config", model_config)
    if not isinstance(config, ModelConfig):
        raise ValueError(f"model_config must be a tinytf.ModelConfig or TinyLanguageModel, got {type(model_config).__name__}")
    return config


def parameter_count(model_config: Any) -> tuple[int, int]:
    """``(scalars, tensors)`` of a :class:`tinytf.TinyLanguageModel` built from ``model_config``.

    Per block: ``qkv 3D²+3D``, ``proj D²+D``, two LayerNorms ``4D``, FFN ``2·D·F + F + D`` (F = eD);
    with ``kv_heads`` K/V heads ``qkv`` is ``D·Q + Q``, ``Q = D + 2·kv_heads·d_head``;
    plus token ``V·D`` and position ``T_max·D`` tables, the final LayerNorm ``2D`` and ``lm_head D·V``.
    With ``bias=False`` the four Linear layers of a block lose their biases (``3D + D + F + D``);
    the LayerNorms keep theirs.
    """
    c = _config_of(model_config)
    d, f = c.dim, c.expansion * c.dim
    qkv = d + 2 * c.n_kv_heads * c.head_dim  # output width of the fused projection
    bias = c.bias
    linear_biases = (qkv + d + f + d) if bias else 0
    block = (qkv * d + d * d + 2 * d * f) + linear_biases + 4 * d
    scalars = c.vocab * d + c.max_tokens * d + c.layers * block + 2 * d + d * c.vocab
    tensors = (12 if bias else 8) * c.layers + 5  # per block 4 Linear weights (+4 biases), 2 LayerNorms w/b; + 5 outside
    return scalars, tensors


@dataclass(frozen=True)
class Ledger:
    """Predicted bytes of one training step (or one inference prefill), component by component.

    Training activations are the tensors autograd *saves for backward*. Inference saves nothing:
    its activations are the transient working set at the peak of a no-grad forward, i.e. of the
    largest of three phases (attention, FFN, logits; named by ``peak_phase``).
    """

    batch: int
    tokens: int
    dtype: str
    training: bool
    optimizer: str
    attention_path: str
    mixed_precision: bool
    parameters: int
    gradients: int
    optimizer_state: int
    master_weights: int
    hidden: int  # B×T×D tensors (residual stream, LayerNorm outputs, q/k/v, head merge)
    ffn: int  # B×T×D_ff tensors (GELU input and output)
    attention: int  # B×H×T×T tensors (scores/weights); 0 on the fused path; tiled: output, lse and (inference) one tile
    logits: int  # B×T×V (log-softmax output kept by the loss; the logits at inference)
    other: int  # small terms: LayerNorm statistics, masks, token ids, log-sum-exp
    kv_cache: int  # inference only: K and V for every layer
    peak_phase: str = ""  # inference: the phase of the forward that holds the most ("attention", "ffn", "logits")

    COMPONENTS = (
        "parameters", "gradients", "optimizer_state", "master_weights", "hidden", "ffn", "attention", "logits", "other", "kv_cache"
    )
    ACTIVATIONS = ("hidden", "ffn", "attention", "logits", "other")

    @property
    def activations(self) -> int:
        """Sum of the activation terms (hidden + FFN + attention + logits + other)."""
        return sum(getattr(self, name) for name in self.ACTIVATIONS)

    @property
    def total(self) -> int:
        """Sum of every component. For inference this is the predicted peak; for training an
        estimate of it (all components counted as if alive at once — backward frees activations
        while it allocates gradients and temporaries; chapter 05 measures the difference)."""
        return sum(getattr(self, name) for name in self.COMPONENTS)

    def components(self) -> dict[str, int]:
        """``{component: bytes}`` in a fixed order (handy for plots and tables)."""
        return {name: getattr(self, name) for name in self.COMPONENTS}

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable: conditions, every component, activations and total."""
        return asdict(self) | {"activations": self.activations, "total": self.total}

    def table(self) -> str:
        """A plain-text table in GiB/MiB with each component's share of the total."""
        mode = "training step" if self.training else "inference (prefill)"
        if not self.training:
            mode += f", peak in the {self.peak_phase} phase"
        head = (f"ledger: {mode}, B={self.batch}, T={self.tokens}, {self.dtype}, attention={self.attention_path}"
                + (f", optimizer={self.optimizer}" if self.training else "") + (", mixed precision" if self.mixed_precision else ""))
        rows = [head]
        total = max(self.total, 1)
        for name, n in self.components().items():
            indent = "  activations/" if name in self.ACTIVATIONS else ""
            rows.append(f"  {indent + name:<28}{format_bytes(n):>12}  {100 * n / total:5.1f}%")
        rows.append(f"  {'total':<28}{format_bytes(self.total):>12}")
        return "\n".join(rows)

    def __str__(self) -> str:
        return self.table()


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
    dtype = _as_dtype(dtype)
    return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}.get(dtype, str(dtype))


def ledger(
    model_config: Any,
    batch: int,
    tokens: int,
    dtype: torch.dtype | str = torch.float32,
    *,
    training: bool = True,
    optimizer: str = "adamw",
    attention: str = "explicit",
    mixed_precision: bool = False,
) -> Ledger:
    """Predict the memory of a :class:`tinytf.TinyLanguageModel` step on ``batch × tokens`` ids.

    Args:
        model_config: a :class:`tinytf.ModelConfig` or a ``TinyLanguageModel`` (its ``.config``).
        dtype: the compute dtype (activations, parameters; gradients and optimizer state too
            unless ``mixed_precision``).
        training: a full step (forward, backward, optimizer) or a no-grad prefill with a KV cache.
        optimizer: ``"adamw"``/``"adam"`` (2 states per parameter), ``"sgd_momentum"`` (1), ``"sgd"`` (0).
        attention: ``"explicit"`` (:func:`tinytf.scaled_dot_product_attention`, materialises
            ``[B, H, T, T]``), ``"sdpa"`` (fused ``F.scaled_dot_product_attention``: no T×T tensor) or
            ``"tiled"`` (:func:`tinytf.tiled_attention`: saves its output ``[B, H, T, d]`` and ``lse``
            ``[B, H, T]``; at inference one query block's tiles are live, see :func:`tiled_working_set`).
        mixed_precision: parameters and gradients in ``dtype`` plus an fp32 master copy and fp32
            optimizer state (the classic 2 + 2 + 4 + 8 = 16 bytes per parameter for fp16 + AdamW).

    Counts follow tinytf's own code with dropout 0 (verified against measurement in
    ``tests/test_memory.py``): per layer, training saves 8 ``B×T×D`` tensors, 2 ``B×T×D_ff``
    tensors and, on the explicit path, 2 ``B×H×T×T`` tensors (the softmax output and the masked
    weights that feed ``@ v``); on the tiled path 1 ``B×T×D`` output and a ``B×H×T`` log-sum-exp
    instead; the loss keeps a ``B×(T-1)×V`` log-softmax. A grouped-query config (``kv_heads``) has a
    narrower projection and a ``heads / kv_heads`` times smaller KV cache; a sliding ``window`` caps
    the cache at ``window`` tokens (the rolling cache).
    """
    c = _config_of(model_config)
    if optimizer not in OPTIMIZER_STATES:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZER_STATES)}, got {optimizer!r}")
    if attention not in ATTENTION_PATHS:
        raise ValueError(f"attention must be one of {ATTENTION_PATHS}, got {attention!r}")
    if batch < 1 or tokens < 1:
        raise ValueError(f"batch and tokens must be positive, got batch={batch}, tokens={tokens}")
    if training and tokens < 2:
        raise ValueError(f"a training step needs tokens >= 2 (the loss predicts the next token), got {tokens}")
    b = dtype_bytes(dtype)
    peak_phase = ""
    n_params, n_tensors = parameter_count(c)
    B, T, D, H, L, V = batch, tokens, c.dim, c.heads, c.layers, c.vocab
    F = c.expansion * D
    BTD, BTF = B * T * D, B * T * F
    explicit, tiled = attention == "explicit", attention == "tiled"
    kv_heads = c.n_kv_heads
    BTQ = B * T * (D + 2 * kv_heads * (D // H))  # the fused projection's output: q, k, v
    repeated = 2 * BTD if kv_heads < H and attention != "sdpa" else 0  # K and V repeated per query head (repeat_kv)
    parameters = n_params * b
    gradients = optimizer_state = master = kv = 0
    if training:
        gradients = n_params * b
        state_bytes = FP32 if mixed_precision else b
        k = OPTIMIZER_STATES[optimizer]
        steps = n_tensors * FP32 if optimizer.startswith("adam") else 0  # Adam keeps a step counter per tensor
        optimizer_state = k * n_params * state_bytes + steps
        master = n_params * FP32 if mixed_precision else 0
        # per layer: norm1 in/out, q, k, v, heads merged, norm2 in/out; + final norm in/out. The explicit
        # matmuls save contiguous q, k, v [B, H, T, d] (3 BTD, however many K/V heads); the fused and the
        # tiled kernel save the projection's output itself (BTQ) and the tiled one the repeated K and V
        qkv_saved = 3 * BTD if explicit else BTQ + repeated
        hidden = (L * (5 * BTD + qkv_saved) + 2 * BTD) * b
        ffn = 2 * L * BTF * b  # GELU input and output (the second Linear's input)
        attn = 2 * L * attention_matrix_bytes(B, H, T, dtype) if explicit else 0
        if tiled:
            attn = L * (BTD + B * H * T) * b  # the saved output [B, H, T, d] and lse [B, H, T], in dtype
        logits = B * (T - 1) * V * b  # log-softmax output saved by cross-entropy
        other = (2 * (2 * L + 1) * B * T * FP32  # LayerNorm mean and rstd
                 + (B * T + T + B * (T - 1)) * INT64 + INT64 + b  # ids, positions, targets; token count, weight
                 + (L * (T * T + T) if explicit else 0 if tiled else L * B * H * T * FP32))  # bool masks | fp32 lse
    else:  # no-grad prefill: the peak is the largest working set of three phases of one layer
        mask_bytes = 2 * T * T if explicit else 0  # one layer's causal mask and its negation (bool)
        scores = 3 * attention_matrix_bytes(B, H, T, dtype) if explicit else 0  # scores, softmax, masked weights
        if tiled:  # output [B, H, T, d] + lse [B, H, T] + the larger of one block's working set and the head merge
            scores = (BTD + B * H * T) * b + max(tiled_working_set(B, H, T, D // H, dtype), BTD * b)
        phases = {  # (hidden, ffn, attention, logits, other)
            # block input, norm1 output, the [B, T, D + 2·kv_heads·d] projection (+ the fused kernel's output
            # | the K and V repeated per query head for the explicit and the tiled attention)
            "attention": ((2 * BTD + BTQ + (BTD if attention == "sdpa" else repeated)) * b, 0, scores, 0, mask_bytes),
            "ffn": (3 * BTD * b, 2 * BTF * b, 0, 0, 0),  # block input, residual, norm2 output; GELU input and output
            "logits": (2 * BTD * b, 0, 0, B * T * V * b, 0),  # last hidden state, final norm output; logits
        }
        peak_phase = max(phases, key=lambda name: sum(phases[name]))
        hidden, ffn, attn, logits, other = phases[peak_phase]
        kv = kv_cache_bytes(B, L, H, T, D // H, dtype, kv_heads=kv_heads, window=c.window)
    return Ledger(B, T, dtype_name(dtype), training, optimizer, attention, mixed_precision,
                  parameters, gradients, optimizer_state, master, hidden, ffn, attn, logits, other, kv, peak_phase)
