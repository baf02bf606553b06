"""Where each rank's tokens sit when a sequence is split across ranks (context parallelism).

A **layout** is, per rank, its list of ``(start, stop)`` global ranges; a rank's local tensor is those ranges
concatenated in order (:func:`shard_sequence`, undone by :func:`unshard_sequence`)::

    contiguous, T = 8, P = 2:  rank 0 [0 1 2 3]  rank 1 [4 5 6 7]
    zig-zag,    T = 8, P = 2:  rank 0 [0 1 6 7]  rank 1 [2 3 4 5]   (chunks r and 2P - 1 - r of 2P)

Whatever acts on positions must use the *global* ones (:func:`layout_positions`), never ``0 … T/P - 1``: the
causal mask, RoPE's rotation of q and k, ALiBi's distances, and the rows of a learned or sinusoidal position
table that the rank adds to its token embeddings before the first block.
"""

from __future__ import annotations

import torch

from .translation import gettext as _

__all__ = ["Layout", "contiguous_layout", "zigzag_layout", "causal_scores", "shard_sequence", "unshard_sequence",
           "layout_positions", "local_ranges"]

Tensor = torch.Tensor
Layout = list[list[tuple[int, int]]]  # layout[rank] = [(start, stop), ...] global positions held by that rank


def contiguous_layout(t: int, world: int) -> Layout:
    """Rank ``r`` holds positions ``r·T/P … (r+1)·T/P`` (``T`` divisible by ``P``)."""
    if t % world:
        raise ValueError(_("T={t} does not split into P={world} equal blocks; pad T to a multiple of {world}").format(t=t, world=world))
    n = t // world
    return [[(r * n, (r + 1) * n)] for r in range(world)]


def zigzag_layout(t: int, world: int) -> Layout:
    """``2P`` equal chunks; rank ``r`` holds chunks ``r`` and ``2P - 1 - r`` (``T`` divisible by ``2P``)."""
    if t % (2 * world):
        raise ValueError(_("T={t} does not split into 2P={chunks} equal chunks; pad T to a multiple of {chunks}")
                         .format(t=t, chunks=2 * world))
    n = t // (2 * world)
    return [[(r * n, (r + 1) * n), ((2 * world - 1 - r) * n, (2 * world - r) * n)] for r in range(world)]


def causal_scores(layout: Layout) -> list[int]:
    """Per rank, the causal scores its queries may compute (per batch and head): query ``i`` sees ``i + 1`` keys.
    What a finely tiled kernel computes; the ring computes whole diagonal tiles (:class:`tinytf.RingStats`)."""
    return [sum((b * (b + 1) - a * (a + 1)) // 2 for a, b in chunks) for chunks in layout]


def shard_sequence(x: Tensor, chunks: list[tuple[int, int]], dim: int = -2) -> Tensor:
    """The positions ``chunks`` of ``x`` along ``dim``, concatenated (a rank's local block)."""
    return torch.cat([x.narrow(dim, a, b - a) for a, b in chunks], dim=dim)


def unshard_sequence(parts: list[Tensor], layout: Layout, dim: int = -2) -> Tensor:
    """Put every rank's local block back at its global positions: the inverse of :func:`shard_sequence`."""
    pieces = []
    for part, chunks in zip(parts, layout):
        offsets = [0, *torch.tensor([b - a for a, b in chunks]).cumsum(0).tolist()]
        pieces += [(a, part.narrow(dim, o, b - a)) for (a, b), o in zip(chunks, offsets)]
    return torch.cat([p for _, p in sorted(pieces, key=lambda ap: ap[0])], dim=dim)


def layout_positions(chunks: list[tuple[int, int]], device: torch.device | str | None = None) -> Tensor:
    """The global positions ``[T_local]`` (int64) of a rank's chunks, in the order its local block holds them:
    what RoPE rotates q and k at, and the rows of a learned or sinusoidal position table the rank adds."""
    return torch.cat([torch.arange(a, b, device=device) for a, b in chunks])


def local_ranges(chunks: list[tuple[int, int]]) -> list[tuple[int, int, int, int]]:
    """``(local_start, local_stop, global_start, global_stop)`` of each chunk of a rank's block."""
    out, o = [], 0
    for a, b in chunks:
        out.append((o, o + b - a, a, b))
        o += b - a
    return out
