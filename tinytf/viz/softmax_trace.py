"""One query row of :func:`tinytf.tiled_attention`, recorded one key tile at a time (the stepper's data).

:func:`online_softmax_trace` runs the tiled forward for the query block that holds ``row`` on seeded
q, k, v ``[1, 1, T, d]`` — the same tiles, masks and updates as :func:`tinytf.tiled_attention` — and
records the row's running maximum ``m``, running sum ``l`` and output ``acc / l`` after every key tile,
next to the exact answer and the grid of computed/skipped tiles. No matplotlib: :mod:`tinytf.viz.tiled`
draws it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..attention import scaled_dot_product_attention
from ..tiled import TileStats, keys_needed, online_softmax_finish, online_softmax_update, tile_mask, tile_scores, tiled_attention
from ..translation import gettext as _

__all__ = ["SoftmaxTrace", "online_softmax_trace", "tile_steps", "check_row", "Q_STD"]

Q_STD = 2.0  # queries ~ N(0, 2²): a peaked softmax, so the running maximum visibly jumps


@dataclass
class SoftmaxTrace:
    """What the online softmax did for one query row (n = key tiles its query block computed).

    ``scores [T]`` the row's scaled scores (``-inf`` where causally masked); ``tiles`` the key ranges
    ``(k0, k1)`` in order; ``m, l [n]`` and ``out [n, d]`` after each tile; ``seen [n, d]`` the exact
    attention over the keys seen so far; ``exact [d]`` the explicit answer; ``grid [q_blocks, k_blocks]``
    True where a tile is computed; ``stats`` the :class:`tinytf.TileStats` of the whole call.
    """

    row: int
    block_q: int
    block_k: int
    causal: bool
    scores: torch.Tensor
    tiles: list[tuple[int, int]]
    m: torch.Tensor
    l: torch.Tensor  # noqa: E741 - the running sum, named as in the FlashAttention papers
    out: torch.Tensor
    seen: torch.Tensor
    exact: torch.Tensor
    grid: torch.Tensor
    stats: TileStats
    qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def check_row(row: int, tokens: int, block_q: int, block_k: int, head_dim: int) -> None:
    """Raise ``ValueError`` unless the sizes are positive integers and ``row`` lies in ``[0, T)``."""
    for name, val in (("T", tokens), ("block_k", block_k), ("block_q", block_q), ("d", head_dim)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ValueError(_("{name} must be a positive integer, got {name}={val!r}").format(name=name, val=val))
    if not 0 <= row < tokens:
        raise ValueError(_("row must lie in [0, {value}] for T={tokens}, got row={row}").format(value=tokens - 1, tokens=tokens,
                                                                                                      row=row))


def tile_steps(row: int, tokens: int, block_q: int, block_k: int, causal: bool) -> int:
    """Key tiles the query block holding ``row`` computes (the stepper's number of steps)."""
    q1 = min((row // block_q + 1) * block_q, tokens)
    return math.ceil(keys_needed(q1, tokens, tokens, causal) / block_k)


def online_softmax_trace(row: int = 37, *, T: int = 64, block_k: int = 8, block_q: int | None = None, causal: bool = True,
                         d: int = 8, seed: int = 0) -> SoftmaxTrace:
    """Run the tiled forward on seeded q, k, v ``[1, 1, T, d]`` and record row ``row`` after each key tile.

    The query block holding ``row`` is processed exactly as :func:`tinytf.tiled_attention` does it
    (same slices, masks and :func:`tinytf.online_softmax_update` calls), so ``out[-1]`` is the
    library's output for that row. ``block_q`` defaults to ``block_k``.
    """
    bq = block_k if block_q is None else block_q
    check_row(row, T, bq, block_k, d)
    g = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(1, 1, T, d, generator=g) * Q_STD, torch.randn(1, 1, T, d, generator=g), torch.randn(1, 1, T, d, generator=g)
    q0, q1, r = row // bq * bq, min(row // bq * bq + bq, T), row % bq
    q_i = q[..., q0:q1, :] * (1.0 / math.sqrt(d))  # the scaled query block, as the library scales it
    m = torch.full((1, 1, q1 - q0, 1), float("-inf"))
    l, acc = torch.zeros_like(m), torch.zeros(1, 1, q1 - q0, d)  # noqa: E741
    tiles, ms, ls, outs = [], [], [], []
    with torch.no_grad():
        for k0 in range(0, keys_needed(q1, T, T, causal), block_k):
            k1 = min(k0 + block_k, T)
            s = tile_scores(q_i, k[..., k0:k1, :], tile_mask(None, causal, (q0, q1), (k0, k1), 0, q.device))
            m, l, acc = online_softmax_update(m, l, acc, s, v[..., k0:k1, :])  # noqa: E741
            tiles.append((k0, k1))
            ms.append(m[0, 0, r, 0])
            ls.append(l[0, 0, r, 0])
            outs.append(online_softmax_finish(m, l, acc)[0][0, 0, r])
        allowed = torch.arange(T) <= row if causal else torch.ones(T, dtype=torch.bool)
        scores = (q_i[0, 0, r] @ k[0, 0].T).masked_fill(~allowed, float("-inf"))  # [T]
        exact = scaled_dot_product_attention(q, k, v, is_causal=causal)[0, 0, row]
        seen = torch.stack([torch.softmax(scores[:k1], -1) @ v[0, 0, :k1] for _, k1 in tiles])  # [n, d]
        _, stats = tiled_attention(q, k, v, is_causal=causal, block_q=bq, block_k=block_k, return_stats=True)
    qb = torch.arange(stats.q_blocks)
    needed = torch.tensor([keys_needed(min((i + 1) * bq, T), T, T, causal) for i in qb.tolist()])
    grid = torch.arange(stats.k_blocks)[None, :] * block_k < needed[:, None]  # [q_blocks, k_blocks]
    return SoftmaxTrace(row, bq, block_k, causal, scores, tiles, torch.stack(ms), torch.stack(ls), torch.stack(outs), seen,
                        exact, grid, stats, (q, k, v))
