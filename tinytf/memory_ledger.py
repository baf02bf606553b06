"""The analytic memory ledger: predicted bytes for attention, activations, parameters and the
KV cache, from shapes and a dtype alone (no tensor is allocated).

:func:`ledger` adds the terms up, component by component, for a whole training step or inference
prefill (a :class:`Ledger`), from the size helpers of :mod:`tinytf.memory_sizes`. The meters that
check each prediction against a measurement live in :mod:`tinytf.memory_meters`; all are
importable from :mod:`tinytf.memory`."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from .config import ModelConfig
from .memory_sizes import FP32, attention_matrix_bytes, dtype_bytes, dtype_name, format_bytes, kv_cache_bytes, tiled_working_set
from .translation import N_
from .translation import gettext as _

__all__ = ["parameter_count", "Ledger", "ledger", "OPTIMIZER_STATES", "ATTENTION_PATHS", "INT64", "LEDGER_ROWS", "ledger_label"]

COMPONENT_LABELS = {  # a Ledger's rows as its table names them, said in the notebook's language
    "parameters": N_("parameters"), "gradients": N_("gradients"), "optimizer_state": N_("optimizer_state"),
    "master_weights": N_("master_weights"), "hidden": N_("activations/hidden"), "ffn": N_("activations/ffn"),
    "attention": N_("activations/attention"), "logits": N_("activations/logits"), "other": N_("activations/other"),
    "kv_cache": N_("kv_cache"),
}

LEDGER_ROWS = {  # the rows of a prediction-versus-measurement comparison (chapter 05), by key
    "parameters": N_("parameters"), "gradients": N_("gradients"), "optimizer_state": N_("optimizer state"),
    "activations_explicit": N_("activations (explicit)"), "activations_fused": N_("activations (fused)"),
    "attention_saved": N_("attention: explicit - fused"), "peak_explicit": N_("step peak vs total (explicit)"),
    "peak_fused": N_("step peak vs total (fused)"),
}


def ledger_label(key: str, width: int = 0, lang: str | None = None) -> str:
    """The row label of :data:`LEDGER_ROWS` ``key`` (``"optimizer_state"`` -> ``"optimizer state"``, in Chinese ``"优化器状态"``),
    in ``lang`` (default: the running notebook's language), left-aligned in ``width`` columns (a CJK character counts two)."""
    return _pad(_(LEDGER_ROWS[key], lang), width)


def _pad(text: str, width: int) -> str:
    """``text`` left-aligned in ``width`` columns, a CJK character counting as two."""
    wide = sum(1 for ch in text if ord(ch) > 0x2E80)
    return text + " " * max(0, width - len(text) - wide)


OPTIMIZER_STATES = {"adamw": 2, "adam": 2, "sgd": 0, "sgd_momentum": 1}
ATTENTION_PATHS = ("explicit", "sdpa", "tiled")
INT64 = 8  # token ids and targets saved by the embedding and the loss


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
    plus token ``V·D`` and position ``T_max·D`` tables (the position table only for ``positions="learned"``: sinusoidal,
    RoPE and ALiBi positions have no parameters), the final LayerNorm ``2D`` and ``lm_head D·V``.
    With ``bias=False`` the four Linear layers of a block lose their biases (``3D + D + F + D``);
    the LayerNorms keep theirs.
    """
    c = _config_of(model_config)
    d, f = c.dim, c.expansion * c.dim
    qkv = d + 2 * c.n_kv_heads * c.head_dim  # output width of the fused projection
    bias = c.bias
    linear_biases = (qkv + d + f + d) if bias else 0
    block = (qkv * d + d * d + 2 * d * f) + linear_biases + 4 * d
    learned = c.positions == "learned"
    scalars = c.vocab * d + (c.max_tokens * d if learned else 0) + c.layers * block + 2 * d + d * c.vocab
    tensors = (12 if bias else 8) * c.layers + 4 + learned  # per block 4 Linear weights (+4 biases), 2 LayerNorms w/b; + 4 or 5 outside
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
        """A plain-text table in GiB/MiB with each component's share of the total, in the notebook's language."""
        mode = _("training step") if self.training else _("inference (prefill)")
        if not self.training:
            mode += _(", peak in the {phase} phase").format(phase=self.peak_phase)
        head = (_("ledger: {mode}, B={batch}, T={tokens}, {dtype}, attention={path}").format(
                    mode=mode, batch=self.batch, tokens=self.tokens, dtype=self.dtype, path=self.attention_path)
                + (_(", optimizer={optimizer}").format(optimizer=self.optimizer) if self.training else "")
                + (_(", mixed precision") if self.mixed_precision else ""))
        rows = [head]
        total = max(self.total, 1)
        for name, n in self.components().items():
            indent = "  " if name in self.ACTIVATIONS else ""
            label = indent + _(COMPONENT_LABELS[name])
            rows.append(f"  {_pad(label, 28)}{format_bytes(n):>12}  {100 * n / total:5.1f}%")
        label = _("total")
        rows.append(f"  {_pad(label, 28)}{format_bytes(self.total):>12}")
        return "\n".join(rows)

    def __str__(self) -> str:
        return self.table()


def _check_step(batch: int, tokens: int, training: bool, optimizer: str, attention: str) -> None:
    """Raise ``ValueError`` for an unknown optimizer or attention path, or sizes no step can have."""
    if optimizer not in OPTIMIZER_STATES:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZER_STATES)}, got {optimizer!r}")
    if attention not in ATTENTION_PATHS:
        raise ValueError(f"attention must be one of {ATTENTION_PATHS}, got {attention!r}")
    if batch < 1 or tokens < 1:
        raise ValueError(f"batch and tokens must be positive, got batch={batch}, tokens={tokens}")
    if training and tokens < 2:
        raise ValueError(f"a training step needs tokens >= 2 (the loss predicts the next token), got {tokens}")


def _training_state(n_params: int, n_tensors: int, b: int, optimizer: str, mixed_precision: bool) -> tuple[int, int, int]:
    """``(gradients, optimizer_state, master_weights)`` bytes of a training step with ``b``-byte parameters."""
    state_bytes = FP32 if mixed_precision else b
    steps = n_tensors * FP32 if optimizer.startswith("adam") else 0  # Adam keeps a step counter per tensor
    optimizer_state = OPTIMIZER_STATES[optimizer] * n_params * state_bytes + steps
    return n_params * b, optimizer_state, n_params * FP32 if mixed_precision else 0


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
    _check_step(batch, tokens, training, optimizer, attention)
    b = dtype_bytes(dtype)
    n_params, n_tensors = parameter_count(c)
    s = _Shapes(batch, tokens, c.dim, c.heads, c.layers, c.vocab, c.expansion * c.dim, c.n_kv_heads, b, attention, dtype)
    parameters = n_params * b
    gradients = optimizer_state = master = kv = 0
    peak_phase = ""
    if training:
        gradients, optimizer_state, master = _training_state(n_params, n_tensors, b, optimizer, mixed_precision)
        hidden, ffn, attn, logits, other = _saved_for_backward(s)
    else:
        peak_phase, (hidden, ffn, attn, logits, other) = _prefill_peak(s)
        kv = kv_cache_bytes(s.B, s.L, s.H, s.T, s.D // s.H, dtype, kv_heads=s.kv_heads, window=c.window)
    return Ledger(batch, tokens, dtype_name(dtype), training, optimizer, attention, mixed_precision,
                  parameters, gradients, optimizer_state, master, hidden, ffn, attn, logits, other, kv, peak_phase)


@dataclass(frozen=True)
class _Shapes:
    """The sizes one ledger works with: ``B, T, D, H, L, V``, the FFN width ``F``, the K/V heads, the bytes
    per element ``b``, the attention path and the dtype."""

    B: int
    T: int
    D: int
    H: int
    L: int
    V: int
    F: int
    kv_heads: int
    b: int
    attention: str
    dtype: torch.dtype | str

    @property
    def BTD(self) -> int:  # noqa: N802 - the names of the formulas
        return self.B * self.T * self.D

    @property
    def BTQ(self) -> int:  # noqa: N802
        """Elements of the fused projection's output: q, k, v ``[B, T, D + 2·kv_heads·d]``."""
        return self.B * self.T * (self.D + 2 * self.kv_heads * (self.D // self.H))

    @property
    def repeated(self) -> int:
        """K and V repeated per query head (``repeat_kv``) by the explicit and the tiled attention of a GQA model."""
        return 2 * self.BTD if self.kv_heads < self.H and self.attention != "sdpa" else 0


def _saved_for_backward(s: _Shapes) -> tuple[int, int, int, int, int]:
    """Training: the bytes autograd saves, as ``(hidden, ffn, attention, logits, other)``."""
    B, T, H, L, V, b, BTD = s.B, s.T, s.H, s.L, s.V, s.b, s.BTD
    explicit, tiled = s.attention == "explicit", s.attention == "tiled"
    # per layer: norm1 in/out, q, k, v, heads merged, norm2 in/out; + final norm in/out. The explicit
    # matmuls save contiguous q, k, v [B, H, T, d] (3 BTD, however many K/V heads); the fused and the
    # tiled kernel save the projection's output itself (BTQ) and the tiled one the repeated K and V
    qkv_saved = 3 * BTD if explicit else s.BTQ + s.repeated
    hidden = (L * (5 * BTD + qkv_saved) + 2 * BTD) * b
    ffn = 2 * L * B * T * s.F * b  # GELU input and output (the second Linear's input)
    attn = 2 * L * attention_matrix_bytes(B, H, T, s.dtype) if explicit else 0
    if tiled:
        attn = L * (BTD + B * H * T) * b  # the saved output [B, H, T, d] and lse [B, H, T], in dtype
    logits = B * (T - 1) * V * b  # log-softmax output saved by cross-entropy
    other = (2 * (2 * L + 1) * B * T * FP32  # LayerNorm mean and rstd
             + (B * T + T + B * (T - 1)) * INT64 + INT64 + b  # ids, positions, targets; token count, weight
             + (L * (T * T + T) if explicit else 0 if tiled else L * B * H * T * FP32))  # bool masks | fp32 lse
    return hidden, ffn, attn, logits, other


def _prefill_peak(s: _Shapes) -> tuple[str, tuple[int, int, int, int, int]]:
    """No-grad prefill: the largest working set of three phases of one layer, ``(phase, (hidden, ffn, attention,
    logits, other))``."""
    B, T, H, V, b, BTD = s.B, s.T, s.H, s.V, s.b, s.BTD
    explicit = s.attention == "explicit"
    mask_bytes = 2 * T * T if explicit else 0  # one layer's causal mask and its negation (bool)
    scores = 3 * attention_matrix_bytes(B, H, T, s.dtype) if explicit else 0  # scores, softmax, masked weights
    if s.attention == "tiled":  # output [B, H, T, d] + lse [B, H, T] + the larger of one block's working set and the head merge
        scores = (BTD + B * H * T) * b + max(tiled_working_set(B, H, T, s.D // H, s.dtype), BTD * b)
    phases = {  # (hidden, ffn, attention, logits, other)
        # block input, norm1 output, the [B, T, D + 2·kv_heads·d] projection (+ the fused kernel's output
        # | the K and V repeated per query head for the explicit and the tiled attention)
        "attention": ((2 * BTD + s.BTQ + (BTD if s.attention == "sdpa" else s.repeated)) * b, 0, scores, 0, mask_bytes),
        "ffn": (3 * BTD * b, 2 * B * T * s.F * b, 0, 0, 0),  # block input, residual, norm2 output; GELU input and output
        "logits": (2 * BTD * b, 0, 0, B * T * V * b, 0),  # last hidden state, final norm output; logits
    }
    peak = max(phases, key=lambda name: sum(phases[name]))
    return peak, phases[peak]
