"""``diagnose_causal_tiles``: causal tiled attention that skips the tiles wholly in the future.

``fn(q, k, v, *, block_q, block_k) -> (out, tiles_computed)``. Which keys each query reads is measured,
not guessed: changing ``v`` at key ``j`` changes query ``i``'s output exactly when ``i`` reads ``j``. A
query that does not read its own key, nor the keys before it in the same key tile, lost the diagonal
tile; one that misses only its own key has an off-by-one mask.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..translation import gettext as _
from .catalog import Pitfall
from .findings import Finding, found, relation
from .probe import crash_finding, is_close, max_abs_diff, quietly
from .tiled_probes import causal_reference, tile_count

__all__ = ["diagnose_causal_tiles"]

# (B, H, Tq, Tk, d), (block_q, block_k): square with equal and unequal blocks, and Tk > Tq (end-aligned)
_CAUSAL = (((1, 2, 10, 10, 4), (3, 3)), ((2, 1, 9, 9, 4), (4, 2)), ((1, 2, 8, 8, 6), (2, 4)), ((2, 1, 5, 12, 4), (2, 3)))


def _where(q: torch.Tensor, k: torch.Tensor, bq: int, bk: int) -> str:
    return _("for q {q_shape}, k {k_shape}, block_q={bq}, block_k={bk}").format(q_shape=list(q.shape), k_shape=list(k.shape), bq=bq, bk=bk)


def _reads(fn: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bq: int, bk: int) -> torch.Tensor:
    """``[Tq, Tk]`` bool: query i's output (batch 0, head 0) changes when v at key j changes."""
    base = fn(q, k, v, block_q=bq, block_k=bk)[0][0, 0].nan_to_num(1e9)
    reads = torch.zeros(q.size(-2), k.size(-2), dtype=torch.bool)
    for j in range(k.size(-2)):
        v2 = v.clone()
        v2[..., j, :] += 10.0
        out = fn(q, k, v2, block_q=bq, block_k=bk)[0][0, 0].nan_to_num(1e9)
        reads[:, j] = (out - base).abs().amax(-1) > 1e-6
    return reads


def _name_reads(reads: torch.Tensor, bk: int, where: str) -> Finding | None:
    """The causal mistake the measured ``reads`` show, if it is a known one."""
    tq, tk = reads.shape
    offset = tk - tq
    allowed = torch.ones(tq, tk, dtype=torch.bool).tril(offset)
    if (reads & ~allowed).any():
        i, j = (int(x) for x in (reads & ~allowed).nonzero()[0])
        return found(Pitfall.CAUSAL_OFF_BY_ONE, _("a query reads a future key"),
                     _("query {i} reads key {j} > {value}: the mask inside the diagonal tiles lets the future leak.")
                     .format(i=i, j=j, value=offset + i),
                     where=_("Seen {where}.").format(where=where),
                     fix=_("inside a diagonal tile block key j of query i when j > Tk - Tq + i (END-aligned), not when j > i"))
    own = reads[torch.arange(tq), torch.arange(tq) + offset]
    if own.all():
        return None
    missing = [int(i) for i in (~own).nonzero()[:, 0]]
    # a query whose own key is not the first of its key tile tells the two mistakes apart
    i = next((i for i in missing if (offset + i) % bk), missing[0])
    start = (offset + i) // bk * bk  # the first key of the key tile that holds query i's own key
    if start < offset + i and reads[i, start:offset + i].all():
        return found(Pitfall.CAUSAL_OFF_BY_ONE, _("a query does not read its own key"),
                     _("query {i} reads keys {start}..{value} of its diagonal tile but not key {value2} itself: the causal mask inside "
                       "the tile is off by one.")
                     .format(i=i, start=start, value=offset + i - 1, value2=offset + i), where=_("Seen {where}.").format(where=where),
                     fix=_("let query i read key j when j <= Tk - Tq + i (its own key included): keep j <= offset + i, "
                           "not j < offset + i"))
    return found(Pitfall.DIAGONAL_TILE_SKIPPED, _("the diagonal tile is skipped"),
                 _("query {i} reads none of keys {start}..{value} — the key tile that holds its own key was never computed{value2}. Only "
                   "key blocks that start at or after Tk - Tq + q1 lie wholly in the future.")
                 .format(i=i, start=start, value=offset + i,
                         value2=_(' (row 0 has nothing to attend to)') if not reads[0].any() else ''),
                 where=_("Seen {where}.").format(where=where))


def _check_one(fn: Callable, shape: tuple[int, ...], blocks: tuple[int, int], gen: torch.Generator) -> Finding | None:
    (b, h, tq, tk, d), (bq, bk) = shape, blocks
    q, k, v = torch.randn(b, h, tq, d, generator=gen), torch.randn(b, h, tk, d, generator=gen), torch.randn(b, h, tk, d, generator=gen)
    where = _where(q, k, bq, bk)
    res = fn(q.clone(), k.clone(), v.clone(), block_q=bq, block_k=bk)
    if not (isinstance(res, tuple) and len(res) == 2 and isinstance(res[0], torch.Tensor)):
        return found(Pitfall.GENERAL, _("the causal tiled attention returns the wrong thing"),
                     _("got {type} {where}.").format(type=type(res).__name__, where=where),
                     fix=_("return (out [B, H, Tq, dv], tiles_computed: int)"))
    out, computed = res
    want = causal_reference(q, k, v)
    if out.shape != want.shape:
        return Finding(Pitfall.ORIENTATION, _("wrong output shape"), _("expected {want_shape}, got {out_shape} {where}.")
            .format(want_shape=list(want.shape), out_shape=list(out.shape), where=where))
    if not is_close(out, want):
        named = _name_reads(_reads(fn, q, k, v, bq, bk), bk, where)
        return named or found(Pitfall.GENERAL, _("causal tiled attention differs from the reference"),
                              _("by up to {max_abs_diff:.3g} {where}.").format(max_abs_diff=max_abs_diff(out.nan_to_num(0.0), want),
                                                                                where=where),
                              fix=_("compare each query block with tinytf.scaled_dot_product_attention(q, k, v, is_causal=True)"))
    expected = tile_count(tq, tk, bq, bk)
    total = -(-tq // bq) * -(-tk // bk)
    if computed != expected:
        if computed == total:
            return found(Pitfall.GENERAL, _("no tile is skipped"),
                         _("it computed all {total} tiles, of which {value} lie wholly in the future {where}.")
                         .format(total=total, value=total - expected, where=where),
                         fix=_("stop each query block's key loop at Tk - Tq + q1"))
        how = relation(computed, expected, step=(_("tile"), 1)) if isinstance(computed, int) and not isinstance(computed, bool) else ""
        return found(Pitfall.GENERAL, _("the count of computed tiles is wrong"),
                     _("it says {computed!r}{how}, but {expected} of the {total} tiles hold a key some query may see {where}.")
                     .format(computed=computed, how=f" ({how})" if how else "", expected=expected, total=total, where=where),
                     fix=_("count one tile per q_i @ k_jᵀ computed"))
    return None


@quietly
def diagnose_causal_tiles(fn: Callable) -> list[Finding]:
    """Diagnose ``fn(q, k, v, *, block_q, block_k) -> (out, tiles_computed)``: end-aligned causal attention
    (``Tk >= Tq``) computed tile by tile, skipping the key tiles wholly in the future. Names
    ``DIAGONAL_TILE_SKIPPED`` and ``CAUSAL_OFF_BY_ONE`` from the keys each query measurably reads, and a
    wrong tile count (nothing skipped, or miscounted)."""
    gen = torch.Generator().manual_seed(918)
    for shape, blocks in _CAUSAL:
        try:
            finding = _check_one(fn, shape, blocks, gen)
        except Exception as exc:  # noqa: BLE001 - student code may raise anything
            return [crash_finding(_("causal tiled attention for q {value}, Tk={shape}, blocks {blocks}")
                .format(value=list(shape[:3]) + [shape[4]], shape=shape[3], blocks=blocks), exc)]
        if finding is not None:
            return [finding]
    return []
