"""Tensor parallelism (Megatron-LM style): the heads and the FFN's hidden units split across ranks.

    x (every rank) --f--> qkv shard [W_q; W_k; W_v] of rank r's heads (column-parallel)
        --> attention over rank r's heads --> proj columns of those heads (row-parallel) --g--> + bias
    x (every rank) --f--> Linear(D, eD/P) --> GELU --> Linear(eD/P, D) --g--> + bias

Column-parallel: a rank holds some *output* rows of ``W`` and computes those features in full.
Row-parallel: a rank holds some *input* columns and computes a partial sum of every output; ``g``
(:func:`tinytf.collectives.reduce_from_parallel`) all-reduces the partial sums, and the bias is added
once, after it. A block's forward therefore costs exactly two all-reduces of ``[B, T, D]``.

The fused ``qkv.weight [D + 2·kv·d, D]`` is ``[W_q; W_k; W_v]``: rank ``r`` needs rows of *each* of
the three, those of its own heads (:func:`shard_qkv`). Cutting the fused matrix into ``P`` plain
pieces would give rank 0 all of ``W_q`` and none of ``W_k`` (for ``P = 3``) — same shapes, wrong heads.

Grouped-query K/V with fewer K/V heads than ranks (``kv_heads < P``, ``P`` a multiple of ``kv_heads``):
the K/V heads are **replicated**, as vLLM and TensorRT-LLM do — rank ``r`` holds the one K/V head its
query heads read, ``r // (P / kv_heads)``, so ``P / kv_heads`` ranks hold each. That costs ``P / kv_heads``
times the K/V weights and cache across the group, and in training the replicas' weight gradients are
partial sums: :func:`reduce_replicated_kv_grads` adds them up.

Every position choice of chapter 13 works: a rank sees the whole sequence, so RoPE rotates at ``0 … T - 1`` and
ALiBi takes the slopes of the rank's heads (:mod:`tinytf.parallel_positions`).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from .block import TransformerBlock
from .collectives import Comm, copy_to_parallel, reduce_from_parallel
from .heads import MultiHeadAttention
from .parallel_kv import kv_heads_per_rank, kv_replicas, reduce_replicated_kv_grads
from .parallel_positions import local_attention, local_slopes, mesh_rank

__all__ = [
    "shard_qkv", "colwise_qkv_order", "local_attention", "shard_rows", "shard_cols", "shard_block_tensors",
    "column_parallel_linear", "row_parallel_linear", "TensorParallelAttention", "TensorParallelBlock", "ParallelizableBlock",
    "kv_heads_per_rank", "kv_replicas", "reduce_replicated_kv_grads",
]

Tensor = torch.Tensor


def _check_split(heads: int, kv_heads: int, world: int, rank: int) -> None:
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank must be in 0..world-1, got rank={rank}, world={world}")
    if heads % world or (kv_heads % world and world % kv_heads):
        raise ValueError(
            f"heads={heads} must be divisible by the number of ranks P={world}, and kv_heads={kv_heads} must be divisible by P "
            f"or divide it (fewer K/V heads than ranks are replicated): each rank computes whole heads. Choose P among the "
            f"divisors of heads, or change heads."
        )


def shard_qkv(w: Tensor, rank: int, world: int, heads: int, kv_heads: int | None = None) -> Tensor:
    """Rank ``rank``'s rows of a fused ``qkv`` weight ``[(H + 2·kv)·d, D]`` (or bias ``[(H + 2·kv)·d]``).

    Returns ``[W_q of heads r·H/P … ; W_k of K/V heads r·kv/P … ; W_v of the same]`` of shape
    ``[(H + 2·kv)·d / P, ...]`` — per Q/K/V and per head, never one plain slice of the fused matrix.
    """
    kv_heads = heads if kv_heads is None else kv_heads
    _check_split(heads, kv_heads, world, rank)
    if w.size(0) % (heads + 2 * kv_heads):
        raise ValueError(f"qkv tensor {list(w.shape)} has no (heads + 2·kv_heads)·d_head = ({heads} + 2·{kv_heads})·d rows")
    d = w.size(0) // (heads + 2 * kv_heads)
    w_q, w_k, w_v = w.split([heads * d, kv_heads * d, kv_heads * d])
    q_per, kv_per = heads // world, kv_heads_per_rank(kv_heads, world)  # heads of each kind one rank holds
    first_kv = rank // kv_replicas(kv_heads, world) * kv_per  # its first K/V head (the same on every replica)
    return torch.cat([w_q[rank * q_per * d : (rank + 1) * q_per * d],
                      w_k[first_kv * d : (first_kv + kv_per) * d], w_v[first_kv * d : (first_kv + kv_per) * d]])


def colwise_qkv_order(w: Tensor, world: int, heads: int, kv_heads: int | None = None) -> Tensor:
    """The fused ``qkv`` rows reordered so that plain contiguous chunk ``r`` is :func:`shard_qkv` of rank ``r``
    (what ``ColwiseParallel``, which cuts dim 0 into ``P`` equal pieces, needs)."""
    return torch.cat([shard_qkv(w, r, world, heads, kv_heads) for r in range(world)])


def shard_rows(w: Tensor, rank: int, world: int) -> Tensor:
    """Column-parallel shard: output rows ``r·n/P … (r+1)·n/P`` of a weight ``[n, in]`` (or bias ``[n]``)."""
    if w.size(0) % world:
        raise ValueError(f"{list(w.shape)}: {w.size(0)} output rows do not split into P={world} equal shards")
    return w.chunk(world, dim=0)[rank]


def shard_cols(w: Tensor, rank: int, world: int) -> Tensor:
    """Row-parallel shard: input columns ``r·n/P … (r+1)·n/P`` of a weight ``[out, n]``."""
    if w.size(-1) % world:
        raise ValueError(f"{list(w.shape)}: {w.size(-1)} input columns do not split into P={world} equal shards")
    return w.chunk(world, dim=-1)[rank]


def shard_block_tensors(tensors: dict[str, Tensor], rank: int, world: int, heads: int,
                        kv_heads: int | None = None) -> dict[str, Tensor]:
    """Rank ``rank``'s piece of each tensor of a :class:`tinytf.TransformerBlock`, keyed by the block's names.

    Works on parameters and on their gradients alike: ``attn.qkv.*`` by :func:`shard_qkv`, ``ffn.0.*``
    by rows, ``attn.proj.weight`` and ``ffn.2.weight`` by columns; the norms and the two row-parallel
    biases (added once, after the all-reduce) are whole on every rank.
    """
    out = {}
    for name, t in tensors.items():
        if name.startswith("attn.qkv."):
            out[name] = shard_qkv(t, rank, world, heads, kv_heads)
        elif name.startswith("ffn.0."):
            out[name] = shard_rows(t, rank, world)
        elif name in ("attn.proj.weight", "ffn.2.weight"):
            out[name] = shard_cols(t, rank, world)
        else:
            out[name] = t
    return out


def column_parallel_linear(x: Tensor, weight: Tensor, bias: Tensor | None, comm: Comm) -> Tensor:
    """``x [..., in]`` (the same on every rank) times this rank's output rows ``weight [out/P, in]``
    -> ``[..., out/P]``. No communication forward; dL/dx is all-reduced in backward."""
    return F.linear(copy_to_parallel(x, comm), weight, bias)


def row_parallel_linear(x: Tensor, weight: Tensor, bias: Tensor | None, comm: Comm) -> Tensor:
    """This rank's input features ``x [..., in/P]`` times ``weight [out, in/P]``: a partial sum of every
    output; one all-reduce makes it whole ``[..., out]``, then ``bias [out]`` is added (once)."""
    y = reduce_from_parallel(F.linear(x, weight), comm)
    return y if bias is None else y + bias


def _param(t: Tensor | None) -> nn.Parameter | None:
    return None if t is None else nn.Parameter(t.detach().clone())


class TensorParallelAttention(nn.Module):
    """Rank ``rank``'s heads of a :class:`tinytf.MultiHeadAttention` (``H/P`` query, ``kv/P`` K/V heads).

    Parameters ``qkv_weight [(H + 2·kv)·d / P, D]``, ``qkv_bias``, ``proj_weight [D, D/P]`` and the whole
    ``proj_bias [D]``. ``forward(x [B, T, D]) -> [B, T, D]``, equal on every rank, one all-reduce.
    No dropout on the attention weights (the explicit attention of :mod:`tinytf.attention`).
    """

    def __init__(self, full: MultiHeadAttention, rank: int, world: int, comm: Comm, *, window: int | None = None) -> None:
        super().__init__()
        heads, kv = full.heads, full.kv_heads
        _check_split(heads, kv, world, rank)
        self.comm, self.head_dim, self.groups, self.window = comm, full.head_dim, full.groups, window
        self.local_heads, self.local_kv = heads // world, kv_heads_per_rank(kv, world)
        self.kv_heads, self.rank, self.world = kv, rank, world
        self.rope, self.slopes = getattr(full, "rope", None), local_slopes(full, rank, world)  # RoPE / ALiBi (chapter 13)
        self.qkv_weight = _param(shard_qkv(full.qkv.weight, rank, world, heads, kv))
        self.qkv_bias = _param(None if full.qkv.bias is None else shard_qkv(full.qkv.bias, rank, world, heads, kv))
        self.proj_weight = _param(shard_cols(full.proj.weight, rank, world))
        self.proj_bias = _param(full.proj.bias)

    def forward(self, x: Tensor, mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        """x ``[B, T, D]`` -> ``[B, T, D]``; ``mask`` as in :class:`tinytf.MultiHeadAttention` (True = may attend)."""
        y = reduce_from_parallel(self.partial(copy_to_parallel(x, self.comm), mask, is_causal), self.comm)
        return y if self.proj_bias is None else y + self.proj_bias

    def partial(self, x: Tensor, mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        """This rank's share of the output, before any communication and without the bias: its heads' attention
        over ``x [B, T, D]`` times its columns of ``proj`` -> ``[B, T, D]`` (a partial sum over the ranks)."""
        qkv = F.linear(x, self.qkv_weight, self.qkv_bias)  # [B, T, (H/P + 2·kv_r)·d]: this rank's heads
        groups = self.local_heads // self.local_kv
        out = local_attention(qkv, self.head_dim, self.local_heads, self.local_kv, groups, mask, is_causal, self.window,
                              rope=self.rope, slopes=self.slopes)
        return F.linear(out, self.proj_weight)


class _ParallelFFN(nn.Module):
    """``Linear(D, eD/P)`` (column-parallel) -> GELU -> ``Linear(eD/P, D)`` (row-parallel) + bias."""

    def __init__(self, ffn: nn.Sequential, rank: int, world: int, comm: Comm) -> None:
        super().__init__()
        up, down = ffn[0], ffn[2]
        self.comm = comm
        self.up_weight = _param(shard_rows(up.weight, rank, world))
        self.up_bias = _param(None if up.bias is None else shard_rows(up.bias, rank, world))
        self.down_weight = _param(shard_cols(down.weight, rank, world))
        self.down_bias = _param(down.bias)

    def forward(self, x: Tensor) -> Tensor:
        h = F.gelu(column_parallel_linear(x, self.up_weight, self.up_bias, self.comm))  # [B, T, eD/P]
        return row_parallel_linear(h, self.down_weight, self.down_bias, self.comm)

    def partial(self, x: Tensor) -> Tensor:
        """This rank's partial sum of the FFN output (no communication, no bias): ``[..., D] -> [..., D]``."""
        return F.linear(F.gelu(F.linear(x, self.up_weight, self.up_bias)), self.down_weight)


class TensorParallelBlock(nn.Module):
    """Rank ``rank``'s share of a :class:`tinytf.TransformerBlock`: ``x [B, T, D] -> [B, T, D]`` with two
    all-reduces forward (attention, FFN) and two backward. The LayerNorms are whole on every rank.

    ``dropout`` (default: the block's) acts on each residual branch *after* its all-reduce, on a tensor
    that every rank holds: the ranks must draw the same mask, i.e. seed their RNGs identically.
    ``source`` maps each parameter name here to the block's name (``attn.qkv_weight`` -> ``attn.qkv.weight``).
    """

    SOURCE = {"norm1.weight": "norm1.weight", "norm1.bias": "norm1.bias", "norm2.weight": "norm2.weight",
              "norm2.bias": "norm2.bias", "attn.qkv_weight": "attn.qkv.weight", "attn.qkv_bias": "attn.qkv.bias",
              "attn.proj_weight": "attn.proj.weight", "attn.proj_bias": "attn.proj.bias",
              "ffn.up_weight": "ffn.0.weight", "ffn.up_bias": "ffn.0.bias",
              "ffn.down_weight": "ffn.2.weight", "ffn.down_bias": "ffn.2.bias"}

    def __init__(self, block: TransformerBlock, rank: int, world: int, comm: Comm, *, dropout: float | None = None) -> None:
        super().__init__()
        self.norm_position = block.norm_position
        self.norm1, self.norm2 = copy.deepcopy(block.norm1), copy.deepcopy(block.norm2)
        self.attn = TensorParallelAttention(block.attn, rank, world, comm, window=block.attn.window)
        self.ffn = _ParallelFFN(block.ffn, rank, world, comm)
        self.drop = nn.Dropout(block.drop.p if dropout is None else dropout)
        self.source = {n: self.SOURCE[n] for n, _ in self.named_parameters()}

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """x ``[B, T, D]`` (the same on every rank) -> ``[B, T, D]`` (the same on every rank), causal."""
        if self.norm_position == "pre":
            x = x + self.drop(self.attn(self.norm1(x), mask, is_causal=True))
            return x + self.drop(self.ffn(self.norm2(x)))
        x = self.norm1(x + self.drop(self.attn(x, mask, is_causal=True)))
        return self.norm2(x + self.drop(self.ffn(x)))


class ParallelizableBlock(nn.Module):
    """A :class:`tinytf.TransformerBlock` rebuilt from plain ``nn.Linear`` layers for PyTorch's own tensor
    parallelism: ``parallelize_module(m, mesh, m.plan())`` turns it into rank ``r``'s share.

    ``ColwiseParallel`` cuts a weight's rows into ``P`` contiguous pieces, so ``attn_qkv``'s rows are stored
    in :func:`colwise_qkv_order`; and the attention here counts the heads *one rank* holds (``H/P``),
    because after sharding each rank's ``attn_qkv`` returns only its heads' ``[q; k; v]``. Unsharded it is
    not the block (the rows are permuted): it exists to be parallelized. With ALiBi each rank reads its place on the
    mesh from its sharded ``attn_qkv.weight`` (a DTensor) and takes the slopes of its heads.
    """

    SOURCE = {"norm1.weight": "norm1.weight", "norm1.bias": "norm1.bias", "norm2.weight": "norm2.weight",
              "norm2.bias": "norm2.bias", "attn_qkv.weight": "attn.qkv.weight", "attn_qkv.bias": "attn.qkv.bias",
              "attn_proj.weight": "attn.proj.weight", "attn_proj.bias": "attn.proj.bias",
              "ffn_up.weight": "ffn.0.weight", "ffn_up.bias": "ffn.0.bias",
              "ffn_down.weight": "ffn.2.weight", "ffn_down.bias": "ffn.2.bias"}

    def __init__(self, block: TransformerBlock, world: int) -> None:
        super().__init__()
        attn = block.attn
        _check_split(attn.heads, attn.kv_heads, world, 0)
        self.norm_position, self.window = block.norm_position, attn.window
        self.head_dim = attn.head_dim
        self.local_heads, self.local_kv = attn.heads // world, kv_heads_per_rank(attn.kv_heads, world)
        self.groups = self.local_heads // self.local_kv
        self.rope = attn.rope  # RoPE turns every head alike: the same rotation on every rank
        self.alibi_slopes, self.world = attn.alibi_slopes, world  # ALiBi: each rank takes its heads' slopes (mesh_rank)
        self.norm1, self.norm2 = copy.deepcopy(block.norm1), copy.deepcopy(block.norm2)
        self.attn_proj = copy.deepcopy(attn.proj)
        weight = colwise_qkv_order(attn.qkv.weight, world, attn.heads, attn.kv_heads)  # more rows than qkv's if K/V replicate
        self.attn_qkv = nn.Linear(weight.size(1), weight.size(0), bias=attn.qkv.bias is not None,
                                  device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            self.attn_qkv.weight.copy_(weight)
            if attn.qkv.bias is not None:
                self.attn_qkv.bias.copy_(colwise_qkv_order(attn.qkv.bias, world, attn.heads, attn.kv_heads))
        self.ffn_up, self.ffn_down = copy.deepcopy(block.ffn[0]), copy.deepcopy(block.ffn[2])
        self.drop = copy.deepcopy(block.drop)

    @staticmethod
    def plan() -> dict:
        """The ``parallelize_plan``: qkv and the FFN's first layer column-wise, the two output layers row-wise."""
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        return {"attn_qkv": ColwiseParallel(), "attn_proj": RowwiseParallel(),
                "ffn_up": ColwiseParallel(), "ffn_down": RowwiseParallel()}

    def _attn(self, x: Tensor) -> Tensor:
        slopes = None if self.alibi_slopes is None else self.alibi_slopes.chunk(self.world)[mesh_rank(self.attn_qkv.weight)]
        out = local_attention(self.attn_qkv(x), self.head_dim, self.local_heads, self.local_kv, self.groups,
                              None, True, self.window, rope=self.rope, slopes=slopes)
        return self.attn_proj(out)

    def forward(self, x: Tensor) -> Tensor:
        """x ``[B, T, D]`` -> ``[B, T, D]`` (after ``parallelize_module``: the same on every rank)."""
        ffn = lambda z: self.ffn_down(F.gelu(self.ffn_up(z)))
        if self.norm_position == "pre":
            x = x + self.drop(self._attn(self.norm1(x)))
            return x + self.drop(ffn(self.norm2(x)))
        x = self.norm1(x + self.drop(self._attn(x)))
        return self.norm2(x + self.drop(ffn(x)))
