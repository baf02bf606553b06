"""Context parallelism for a whole block: every activation split along the sequence, every weight whole.

Rank ``r`` holds positions ``layout[r]`` of ``x``: ``[B, T/P, D]``. The LayerNorms, the QKV and output
projections and the FFN act on those positions alone (they mix features, not positions); only attention
needs the other positions, and gets them by the ring (:func:`tinytf.ring_attention`: K/V blocks travel)
or by Ulysses (:func:`tinytf.ulysses.ulysses_attention`: two all-to-alls trade the sequence split for a
head split and back). Every rank keeps every weight, so after the backward each rank holds the gradient
of its positions only: :meth:`ContextParallelBlock.reduce_grads` all-reduces them (phase
``"weight_grad"``), as data parallelism does — or, with FSDP / ZeRO-3, the weights are sharded too and
gathered layer by layer.

**Positions** (chapter 13) are the *global* ones of ``layout[rank]`` (:func:`tinytf.layout_positions`), never
``0 … T/P - 1``. Learned and sinusoidal tables act before the first block: each rank adds the table's rows of
its global positions to its token embeddings (:meth:`tinytf.TinyLanguageModel.embed`:
``model.embed(ids_r, layout_positions(layout[r]).expand_as(ids_r))``), no communication needed. RoPE is
applied here, in :meth:`ContextParallelBlock.forward`, to this rank's q and k at their global positions *before*
any exchange: a rotated key keeps its rotation while it travels. ALiBi's slopes and a sliding window go to the
ring (bias and mask from global positions in every tile) or to Ulysses.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from .block import TransformerBlock
from .collectives import Comm
from .layouts import Layout, contiguous_layout, layout_positions
from .ring import ring_attention
from .translation import gettext as _
from .ulysses import ulysses_attention

__all__ = ["ContextParallelBlock", "CONTEXT_ATTENTION"]

Tensor = torch.Tensor
CONTEXT_ATTENTION = ("ring", "ulysses")


class ContextParallelBlock(nn.Module):
    """A copy of ``block`` that runs on this rank's positions ``layout[rank]`` of the sequence.

    ``forward(x [B, T_local, D]) -> [B, T_local, D]``, causal over global positions. ``attention``: ``"ring"``
    (any layout; ``overlap=True`` for the double-buffered ring) or ``"ulysses"`` (contiguous layout, heads
    divisible by ``P``). Parameters have the block's own names (``attn.qkv.weight`` …). Every position choice of the
    block works: RoPE rotates at the global positions of ``layout[rank]``, ALiBi and the window act on them.
    """

    def __init__(self, block: TransformerBlock, comm: Comm, layout: Layout | None = None, *, attention: str = "ring",
                 overlap: bool = False) -> None:
        super().__init__()
        if attention not in CONTEXT_ATTENTION:
            raise ValueError(_("attention must be one of {choices}, got {attention!r}").format(choices=CONTEXT_ATTENTION,
                                                                                              attention=attention))
        self.block, self.comm, self.attention, self.overlap = copy.deepcopy(block), comm, attention, overlap
        self.layout = layout
        if attention == "ulysses" and layout is not None and layout != contiguous_layout(max(b for c in layout for _, b in c), comm.world):
            raise ValueError(_("Ulysses gathers whole sequences in rank order: it needs the contiguous layout, got {layout}. Pass "
                               "contiguous_layout(T, P), or use attention='ring' for the zig-zag layout.").format(layout=layout))

    def _mix(self, h: Tensor) -> Tensor:
        attn = self.block.attn
        layout = self.layout or contiguous_layout(h.size(1) * self.comm.world, self.comm.world)
        q, k, v = attn.project(h)  # [B, H, T_local, d], [B, kv, T_local, d]: this rank's positions
        if attn.rope is not None:  # at the global positions, before any exchange (never at 0 … T_local - 1)
            q, k = attn.rope(q, k, positions=layout_positions(layout[self.comm.rank], h.device))
        options = dict(comm=self.comm, is_causal=True, slopes=attn.alibi_slopes, window=attn.window)
        if self.attention == "ring":
            out = ring_attention(q, k, v, layout=layout, overlap=self.overlap, **options)
        else:
            out = ulysses_attention(q, k, v, **options)
        return attn.proj(attn.merge_heads(out))

    def forward(self, x: Tensor) -> Tensor:
        """x ``[B, T_local, D]`` (this rank's positions) -> ``[B, T_local, D]``."""
        b = self.block
        if b.norm_position == "pre":
            x = x + b.drop(self._mix(b.norm1(x)))
            return x + b.drop(b.ffn(b.norm2(x)))
        x = b.norm1(x + b.drop(self._mix(x)))
        return b.norm2(x + b.drop(b.ffn(x)))

    def reduce_grads(self) -> int:
        """All-reduce (sum) every parameter's gradient over the ranks, in one flat tensor; returns its elements."""
        params = [p for p in self.parameters() if p.grad is not None]
        flat = torch.cat([p.grad.flatten() for p in params])
        self.comm.all_reduce(flat, "weight_grad")
        for p, g in zip(params, flat.split([p.numel() for p in params])):
            p.grad.copy_(g.view_as(p))
        return flat.numel()
