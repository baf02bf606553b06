"""What each way of splitting a Transformer layer across ``P`` ranks costs, per layer and training step, per rank.

Five splits (chapter 12), with ``s`` bytes per element, ``n = B·T·D·s`` one activation ``[B, T, D]`` and
``n_kv = B·T·kv·d·s`` its keys (or values):

    split        forward                         backward                         weight gradients
    tensor       2 all-reduces of n              2 all-reduces of n               none (each rank owns its shard)
    sequence     2 all-gathers + 2 reduce-scat.  the same                         all-reduce of the LayerNorms and
                 of n (= tensor's bytes)                                          row-parallel biases
    ring         (P-1) K and V blocks: 2(P-1)/P  (P-1) K, V, dK, dV blocks and    all-reduce of every weight
                 · n_kv                          one dK, dV hop home: (4(P-1)+2)/P · n_kv
    ulysses      all-to-alls of q, k, v, out:    the same                         all-reduce of every weight
                 (P-1)/P² · B·T·s·(2H + 2kv')·d

``kv'`` is the K/V heads Ulysses moves (``kv``, or ``P`` when ``kv < P``). Each formula is checked against
the bytes :class:`tinytf.collectives.Comm` counts on real processes (tests/test_split_costs.py).
Activations per rank use Korthikanti et al. (2022)'s count for a GPT layer — ``34·B·T·D`` bytes in 16-bit
with the attention scores recomputed — split as each method splits them: tensor ``(10 + 24/P)·B·T·D``
(LayerNorms, dropouts and residuals whole on every rank), the others ``34/P·B·T·D``. Training state: 16
bytes per parameter with mixed-precision Adam (bf16 weights and gradients, fp32 master weights, m and v).
"""

from __future__ import annotations

from dataclasses import dataclass

from .collectives import all_gather_bytes, all_reduce_bytes, all_to_all_bytes, reduce_scatter_bytes
from .ring import causal_scores, contiguous_layout, zigzag_layout
from .translation import gettext as _

__all__ = ["LayerShape", "Hardware", "SplitCost", "SPLITS", "LLAMA2_7B", "LLAMA2_70B", "H100", "split_costs",
           "training_state_bytes", "fsdp_weight_traffic", "overlap_threshold", "ADAM_BYTES_PER_PARAM"]

SPLITS = ("tensor", "sequence", "ring", "zigzag", "ulysses")
ADAM_BYTES_PER_PARAM = 16  # bf16 weight 2 + bf16 gradient 2 + fp32 master weight 4 + Adam m 4 + v 4


@dataclass(frozen=True)
class LayerShape:
    """One Transformer layer: ``dim``, query ``heads`` and ``kv_heads`` of width ``dim / heads``, an FFN of
    ``ffn`` hidden units (``gated``: SwiGLU's three matrices, else two), ``layers`` of them in the model;
    ``norm_params`` per layer (``2·dim``: RMSNorm weights; ``4·dim``: LayerNorm weights and biases)."""

    name: str
    dim: int
    heads: int
    kv_heads: int
    ffn: int
    layers: int
    gated: bool = True
    bias: bool = False
    norm_params: int = 0  # 0: 2·dim
    vocab: int = 0  # the embedding and the output layer (untied): 2·vocab·dim parameters outside the layers

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @property
    def replicated_params(self) -> int:
        """Parameters that tensor parallelism keeps whole on every rank: the norms, the row-parallel biases."""
        return (self.norm_params or 2 * self.dim) + (2 * self.dim if self.bias else 0)

    @property
    def params(self) -> int:
        """Parameters of one layer."""
        d, qkv_rows = self.head_dim, (self.heads + 2 * self.kv_heads) * self.head_dim
        attention = qkv_rows * self.dim + self.heads * d * self.dim + (qkv_rows if self.bias else 0)
        ffn = (3 if self.gated else 2) * self.dim * self.ffn + (self.ffn if self.bias else 0)
        return attention + ffn + self.replicated_params

    @property
    def model_params(self) -> int:
        """Parameters of the whole model: its layers, the embedding and the output layer."""
        return self.layers * self.params + 2 * self.vocab * self.dim

    @classmethod
    def of_block(cls, block, name: str = "tinytf block") -> LayerShape:
        """The shape of a :class:`tinytf.TransformerBlock` (GELU FFN, LayerNorms, biases as built)."""
        attn, up = block.attn, block.ffn[0]
        return cls(name, attn.dim, attn.heads, attn.kv_heads, up.out_features, 1, gated=False, bias=up.bias is not None,
                   norm_params=sum(p.numel() for m in (block.norm1, block.norm2) for p in m.parameters()))


# Llama 2 (Touvron et al. 2023, table 1 and the released configs): SwiGLU, RMSNorm, no biases
LLAMA2_7B = LayerShape("Llama-2-7B", dim=4096, heads=32, kv_heads=32, ffn=11008, layers=32, vocab=32000)
LLAMA2_70B = LayerShape("Llama-2-70B", dim=8192, heads=64, kv_heads=8, ffn=28672, layers=80, vocab=32000)


@dataclass(frozen=True)
class Hardware:
    """Assumed peak numbers: dense bf16 FLOP/s, bytes/s per direction per GPU inside a node (``nvlink``) and
    between nodes (``infiniband``), GPUs per node, memory per GPU."""

    name: str
    flops: float
    nvlink: float
    infiniband: float
    gpus_per_node: int
    memory: float


# H100 SXM: 989 TFLOP/s dense bf16, NVLink 4 900 GB/s both directions (450 each), one 400 Gb/s NDR NIC per GPU
H100 = Hardware("H100 SXM", flops=989e12, nvlink=450e9, infiniband=50e9, gpus_per_node=8, memory=80e9)


@dataclass(frozen=True)
class SplitCost:
    """One split's cost per layer and training step, per rank: bytes sent in the forward, the backward and the
    weight-gradient reduction, bytes of weights and of stored activations held, the causal attention work
    of the busiest rank over the mean (1 = balanced), and what the split requires."""

    split: str
    forward: float
    backward: float
    weight_grad: float
    weights: float
    activations: float
    busiest: float
    requires: str

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.weight_grad


def _causal_balance(tokens: int, world: int, layout) -> float:
    work = causal_scores(layout(tokens, world))
    return max(work) * world / sum(work)


def _requires(split: str, shape: LayerShape, world: int) -> str:
    heads = _("heads % P = 0, kv_heads % P = 0 or K/V heads replicated")
    return {"tensor": heads + _("; inside a node"),
            "sequence": heads + _("; T % P = 0; inside a node"),
            "ring": _("T % P = 0; all weights on every rank (or FSDP)"),
            "zigzag": _("T % 2P = 0; all weights on every rank (or FSDP)"),
            "ulysses": _("heads >= P ({heads} heads); all weights on every rank (or FSDP)").format(heads=shape.heads)}[split]


def split_costs(shape: LayerShape, batch: int, tokens: int, world: int, bytes_per: int = 2) -> dict[str, SplitCost]:
    """The cost of each of :data:`SPLITS` for one layer of ``shape`` at ``[batch, tokens]`` on ``world`` ranks,
    ``bytes_per`` bytes per element (activations, weights and gradients alike)."""
    p, s, d = world, bytes_per, shape.head_dim
    act = batch * tokens * shape.dim * s  # one [B, T, D] activation
    kv_block = batch * (tokens // p) * shape.kv_heads * d * s  # one rank's K (or V) block
    korthikanti = batch * tokens * shape.dim * s / 2  # B·T·D at 2 bytes: the unit of the 34·B·T·D count
    grads_all = all_reduce_bytes(shape.params * s, p)
    sharded = (shape.params - shape.replicated_params) * s / p + shape.replicated_params * s
    travel = shape.kv_heads if shape.kv_heads % p == 0 else p  # the K/V heads Ulysses moves
    ulysses = sum(all_to_all_bytes(batch * (tokens // p) * h * d * s, p) for h in (shape.heads, travel, travel, shape.heads))
    tp = 2 * all_reduce_bytes(act, p)
    sp = 2 * (all_gather_bytes(act, p) + reduce_scatter_bytes(act, p))
    rows = {
        "tensor": (tp, tp, 0.0, sharded, (10 + 24 / p) * korthikanti, 1.0),
        "sequence": (sp, sp, all_reduce_bytes(shape.replicated_params * s, p), sharded, 34 / p * korthikanti, 1.0),
        "ring": (2 * (p - 1) * kv_block, (4 * (p - 1) + 2) * kv_block if p > 1 else 0, grads_all, shape.params * s,
                 34 / p * korthikanti, _causal_balance(tokens, p, contiguous_layout)),
        "zigzag": (2 * (p - 1) * kv_block, (4 * (p - 1) + 2) * kv_block if p > 1 else 0, grads_all, shape.params * s,
                   34 / p * korthikanti, _causal_balance(tokens, p, zigzag_layout)),
        "ulysses": (ulysses, ulysses, grads_all, shape.params * s, 34 / p * korthikanti, 1.0),
    }
    return {name: SplitCost(name, *row, requires=_requires(name, shape, p)) for name, row in rows.items()}


def training_state_bytes(params: float, world: int = 1, per_param: int = ADAM_BYTES_PER_PARAM) -> float:
    """Bytes of weights, gradients and optimizer state per rank when ``world`` ranks share ``params`` evenly."""
    return params * per_param / world


def fsdp_weight_traffic(params: float, world: int, bytes_per: int = 2) -> tuple[float, float]:
    """Bytes per rank and step for a layer's weights: ``(replicated: all-reduce of the gradients, FSDP / ZeRO-3:
    all-gather of the weights forward and again backward, reduce-scatter of the gradients)``."""
    n = params * bytes_per
    return all_reduce_bytes(n, world), 2 * all_gather_bytes(n, world) + reduce_scatter_bytes(n, world)


def overlap_threshold(flops: float, link: float, bytes_per: int = 2, *, causal: bool = False, kv_ratio: float = 1.0) -> float:
    """Tokens per rank ``T/P`` from which a ring step's attention takes longer than its K/V transfer.

    A step computes ``4·B·(T/P)²·D`` FLOPs (scores and values; half of it under a causal mask with the zig-zag
    layout, on average) and sends ``2·B·(T/P)·D·s·kv_ratio`` bytes (``kv_ratio = kv_heads / heads``), so the
    transfer hides once ``2·(T/P)/(s·kv_ratio) · (1/2 if causal) >= flops / link``."""
    return flops / link * bytes_per * kv_ratio / 2 * (2 if causal else 1)
