"""Sequence parallelism (Korthikanti et al. 2022): tensor parallelism whose activations outside attention
and the FFN are split along the sequence.

A tensor-parallel block holds ``x [B, T, D]`` whole on every rank, and its LayerNorms, dropouts and
residual adds repeat the same work ``P`` times on the same numbers. Sequence parallelism gives rank ``r``
only positions ``r·T/P … (r+1)·T/P - 1`` of them, ``[B, T/P, D]``, and turns each all-reduce into its two
halves (chapter 12, section 1)::

    x_r [B, T/P, D] -> LayerNorm -> all-gather (seq) -> [B, T, D] -> column-parallel ... row-parallel partial sum
        -> reduce-scatter (seq) -> [B, T/P, D] -> + bias -> dropout -> + x_r

The all-gather replaces tensor parallelism's *f* (its backward is a reduce-scatter) and the reduce-scatter
replaces *g* (its backward is an all-gather): the same bytes as the two all-reduces, since an all-reduce
*is* a reduce-scatter followed by an all-gather. The activations outside attention and the FFN shrink
``P`` times. One thing is new: the LayerNorms and the row-parallel biases act on ``T/P`` positions, so each
rank's gradient of them is a partial sum over its positions — they are all-reduced once per step
(:meth:`SequenceParallelBlock.reduce_replicated_grads`, phase ``"weight_grad"``), or the ranks' copies
drift apart.

Positions (chapter 13): attention runs on the all-gathered sequence, so RoPE and ALiBi act there exactly as in
:class:`tinytf.TensorParallelBlock` (positions ``0 … T - 1``, each rank its heads' ALiBi slopes). A learned or
sinusoidal table is added before the first block, where ``x`` is split: rank ``r`` adds its rows
``r·T/P … (r+1)·T/P - 1`` (:meth:`tinytf.TinyLanguageModel.embed` at :func:`tinytf.layout_positions` of
``contiguous_layout(T, P)[r]``).
"""

from __future__ import annotations

import torch
from torch import nn

from .block import TransformerBlock
from .collectives import Comm, conjugate_exchange
from .parallel import TensorParallelBlock

__all__ = ["gather_sequence", "scatter_sequence", "SequenceParallelBlock", "REPLICATED"]

Tensor = torch.Tensor
# parameters every rank holds whole, whose gradients come from its own positions only
REPLICATED = ("norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias", "attn.proj_bias", "ffn.down_bias")


def _all_gather_seq(x: Tensor, comm: Comm, phase: str) -> Tensor:
    """``[B, T/P, ...] -> [B, T, ...]``: the ranks' blocks of positions, concatenated in rank order."""
    chunk = x.movedim(1, 0).contiguous()  # [T/P, B, ...]: a flat chunk is then this rank's positions
    flat = comm.all_gather(chunk.flatten(), [chunk.numel()] * comm.world, phase)
    return flat.view(comm.world * chunk.size(0), *chunk.shape[1:]).movedim(0, 1)


def _reduce_scatter_seq(x: Tensor, comm: Comm, phase: str) -> Tensor:
    """``[B, T, ...] -> [B, T/P, ...]``: the sum over ranks, rank ``r`` keeping positions ``r·T/P …``."""
    t = x.movedim(1, 0).contiguous()  # [T, B, ...]
    part = comm.reduce_scatter(t, phase)
    return part.view(t.size(0) // comm.world, *t.shape[1:]).movedim(0, 1)


def gather_sequence(x: Tensor, comm: Comm) -> Tensor:
    """``x [B, T/P, D]`` (this rank's positions) -> ``[B, T, D]`` on every rank; the gradient is reduce-scattered."""
    return conjugate_exchange(x, comm, _all_gather_seq, _reduce_scatter_seq)


def scatter_sequence(x: Tensor, comm: Comm) -> Tensor:
    """``x [B, T, D]`` (a partial sum on each rank) -> ``[B, T/P, D]``: rank ``r``'s positions of the sum;
    the gradient is all-gathered."""
    if x.size(1) % comm.world:
        raise ValueError(f"T={x.size(1)} does not split into P={comm.world} equal blocks of positions; pad T to a multiple of "
                         f"{comm.world}")
    return conjugate_exchange(x, comm, _reduce_scatter_seq, _all_gather_seq)


class SequenceParallelBlock(nn.Module):
    """Rank ``rank``'s share of a :class:`tinytf.TransformerBlock` with tensor *and* sequence parallelism.

    ``forward(x [B, T/P, D]) -> [B, T/P, D]``: ``x`` holds positions ``rank·T/P …`` (a contiguous layout), causal
    attention sees the whole sequence. The weights are split exactly as in :class:`tinytf.TensorParallelBlock`
    (``attn``, ``ffn`` are that block's modules; their ``partial`` methods compute the local products), so the
    parameter names and :attr:`source` are the same. Per forward: two all-gathers and two reduce-scatters of
    ``[B, T, D]``; per backward the same; then :meth:`reduce_replicated_grads`. Dropout acts on this rank's
    positions only, so here the ranks should draw *different* masks (seed them differently).
    """

    def __init__(self, block: TransformerBlock, rank: int, world: int, comm: Comm, *, dropout: float | None = None) -> None:
        super().__init__()
        tp = TensorParallelBlock(block, rank, world, comm, dropout=dropout)
        self.norm_position, self.comm = tp.norm_position, comm
        self.norm1, self.attn, self.norm2, self.ffn, self.drop = tp.norm1, tp.attn, tp.norm2, tp.ffn, tp.drop
        self.source = tp.source

    def _attn(self, h: Tensor) -> Tensor:
        y = scatter_sequence(self.attn.partial(gather_sequence(h, self.comm), is_causal=True), self.comm)
        return y if self.attn.proj_bias is None else y + self.attn.proj_bias

    def _ffn(self, h: Tensor) -> Tensor:
        y = scatter_sequence(self.ffn.partial(gather_sequence(h, self.comm)), self.comm)
        return y if self.ffn.down_bias is None else y + self.ffn.down_bias

    def forward(self, x: Tensor) -> Tensor:
        """x ``[B, T/P, D]`` (this rank's positions) -> ``[B, T/P, D]``."""
        if self.norm_position == "pre":
            x = x + self.drop(self._attn(self.norm1(x)))
            return x + self.drop(self._ffn(self.norm2(x)))
        x = self.norm1(x + self.drop(self._attn(x)))
        return self.norm2(x + self.drop(self._ffn(x)))

    def reduce_replicated_grads(self) -> int:
        """All-reduce (sum) the gradients of the parameters every rank holds whole (:data:`REPLICATED`: the
        LayerNorms and the row-parallel biases) in one flat tensor; returns its number of elements."""
        params = [p for n, p in self.named_parameters() if n in REPLICATED and p.grad is not None]
        if not params:
            return 0
        flat = torch.cat([p.grad.flatten() for p in params])
        self.comm.all_reduce(flat, "weight_grad")
        for p, g in zip(params, flat.split([p.numel() for p in params])):
            p.grad.copy_(g.view_as(p))
        return flat.numel()
