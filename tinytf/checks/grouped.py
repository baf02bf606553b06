"""Diagnoses of grouped-query attention's K/V head sharing (chapter 11), measured rather than guessed.

- ``diagnose_expand_kv(fn)``: ``fn(kv [B, kv_heads, T, d], heads) -> [B, heads, T, d]``; which K/V head
  each output head holds is read off the output.
- ``diagnose_kv_grouping(fn)``: ``fn(q [B, H, Tq, d], k [B, kv_heads, Tk, d], v [B, kv_heads, Tk, dv])
  -> out [B, H, Tq, dv]``; which K/V head each query head reads is measured with values that are the
  constant ``g + 1`` on K/V head ``g`` (a softmax average of a constant is that constant).

Both probe ``kv_heads`` strictly between 1 and ``heads``, where ``repeat`` (tile: query head ``h`` meets
K/V head ``h % kv_heads``) and ``repeat_interleave`` (``h // (heads // kv_heads)``) differ, and the two
ends (multi-query, multi-head), where they agree: a mistake right only there is named with that evidence.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from ..attention import scaled_dot_product_attention
from ..grouped import kv_head_of, repeat_kv
from ..translation import gettext
from .catalog import Pitfall
from .findings import Finding, found
from .probe import crash_finding, first_output, is_close, max_abs_diff, only_for, quietly

__all__ = ["diagnose_kv_grouping", "diagnose_expand_kv", "interleaved", "tiled_heads"]

_GROUPING = Pitfall.KV_GROUPING


class Shape(NamedTuple):
    b: int
    heads: int
    kv_heads: int
    t_q: int
    t_k: int
    d: int
    dv: int

    def where(self) -> str:
        return (gettext("for heads={heads}, kv_heads={kv_heads} (q [{b}, {heads}, {t_q}, {d}])")
            .format(heads=self.heads, kv_heads=self.kv_heads, b=self.b, t_q=self.t_q, d=self.d))


# Tq != Tk, B > 1, kv_heads strictly inside (1, heads) first, then multi-query and multi-head
_SHAPES = (Shape(2, 4, 2, 5, 7, 8, 6), Shape(1, 6, 3, 4, 4, 4, 5), Shape(2, 6, 2, 3, 6, 8, 4), Shape(1, 8, 4, 2, 5, 4, 3),
           Shape(2, 4, 1, 5, 7, 8, 6), Shape(1, 4, 4, 3, 3, 8, 4))


def interleaved(heads: int, kv_heads: int) -> list[int]:
    """The right mapping, ``repeat_interleave``: query head ``h`` reads K/V head ``h // (heads // kv_heads)``."""
    return [kv_head_of(h, heads, kv_heads) for h in range(heads)]


def tiled_heads(heads: int, kv_heads: int) -> list[int]:
    """``repeat``'s mapping (tile: ``k0 k1 k0 k1``): query head ``h`` reads K/V head ``h % kv_heads``."""
    return [h % kv_heads for h in range(heads)]


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """tinytf's grouped-query attention: K/V heads widened with ``repeat_kv``, ``scale`` default ``1/sqrt(d)``."""
    groups = q.size(1) // k.size(1)
    return scaled_dot_product_attention(q, repeat_kv(k, groups), repeat_kv(v, groups), scale=scale)


def _read_mapping(out: torch.Tensor, candidates: torch.Tensor) -> list[int | None]:
    """For each head of ``out [B, H, ...]``, the index ``g`` of ``candidates [B, G, ...]`` it equals (or None)."""
    return [next((g for g in range(candidates.size(1)) if is_close(out[:, h], candidates[:, g], 1e-5)), None)
            for h in range(out.size(1))]


def _name_mapping(got: list[int | None], s: Shape) -> tuple[str, str] | None:
    """``(title, evidence)`` for a measured head mapping that is not ``repeat_interleave``'s, or None."""
    right, tile = interleaved(s.heads, s.kv_heads), tiled_heads(s.heads, s.kv_heads)
    if got == right:
        return None
    if got == tile:
        return (gettext("query heads read K/V heads in the order of repeat, not repeat_interleave"),
                gettext("query heads 0..{value} read K/V heads {got} (tile: h % kv_heads, what kv.repeat(1, groups, 1, 1) gives); "
                  "grouped-query attention gives consecutive query heads one K/V head: {right} (h // groups). The shapes are right and "
                  "the outputs silently differ.").format(value=s.heads - 1, got=got, right=right))
    return (gettext("query heads read the wrong K/V heads"),
            gettext("query heads 0..{value} read K/V heads {value2} (measured; ? = none of them exactly); they should read {right} (h // "
              "groups).").format(value=s.heads - 1, value2=['?' if g is None else g for g in got], right=right))


def _named(bad: list[tuple[Shape, tuple[str, str]]], n_total: int) -> list[Finding]:
    """One finding per distinct title; the shapes that show it, and that the others are right."""
    out = []
    for title in dict.fromkeys(t for _, (t, _) in bad):
        shapes = [s for s, (t, _) in bad if t == title]
        evidence = next(e for s, (t, e) in bad if t == title)
        where = (only_for([s.where() for s in shapes], len(shapes), n_total)
                 or gettext("Seen {where}.").format(where=shapes[0].where()))
        if len(shapes) < n_total:
            where += gettext(" Multi-query (kv_heads = 1) and multi-head (kv_heads = heads) cannot show it: both orders agree there.")
        out.append(found(_GROUPING, title, evidence, where=where))
    return out


@quietly
def diagnose_expand_kv(fn: Callable) -> list[Finding]:
    """Diagnose ``fn(kv, heads) -> [B, heads, T, d]`` for ``kv [B, kv_heads, T, d]``: each K/V head once per query
    head of its group, consecutive (``repeat_interleave``). Names ``KV_GROUPING`` from the measured head order."""
    gen = torch.Generator().manual_seed(1019)
    bad = []
    for s in _SHAPES:
        kv = torch.randn(s.b, s.kv_heads, s.t_k, s.d, generator=gen)
        try:
            out = fn(kv.clone(), s.heads)
        except Exception as exc:  # noqa: BLE001 - student code may raise anything
            return [crash_finding(gettext("expand_kv {s_where}").format(s_where=s.where()), exc)]
        want = (s.b, s.heads, s.t_k, s.d)
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != want:
            got = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            return [found(Pitfall.GENERAL, gettext("expand_kv returns the wrong shape"),
                          gettext("expected [B, heads, T, d] = {want}, got {got} {s_where}.").format(want=list(want), got=got,
                                                                                                       s_where=s.where()),
                          fix=gettext("repeat along the head axis: kv.repeat_interleave(heads // kv_heads, dim=1), not the time axis"))]
        named = _name_mapping(_read_mapping(out, kv), s)
        if named:
            bad.append((s, named))
    return _named(bad, len(_SHAPES))


def _grouping_probe(fn: Callable, s: Shape, gen: torch.Generator) -> tuple[str, str] | Finding | None:
    """What ``fn`` gets wrong on shape ``s``: a ``(title, evidence)`` mapping mistake, another finding, or None."""
    q, k = torch.randn(s.b, s.heads, s.t_q, s.d, generator=gen), torch.randn(s.b, s.kv_heads, s.t_k, s.d, generator=gen)
    v = torch.randn(s.b, s.kv_heads, s.t_k, s.dv, generator=gen)
    out = first_output(fn(q.clone(), k.clone(), v.clone()))
    want = _reference(q, k, v)
    if not isinstance(out, torch.Tensor) or out.shape != want.shape:
        got = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        return found(Pitfall.GENERAL, gettext("grouped attention returns the wrong shape"),
                     gettext("expected [B, H, Tq, dv] = {want_shape}, got {got} {s_where}.")
                     .format(want_shape=list(want.shape), got=got, s_where=s.where()),
                     fix=gettext("expand k and v to the H query heads first, so every query head gets an output"))
    if is_close(out, want):
        return None
    labels = torch.arange(1.0, s.kv_heads + 1).view(1, -1, 1, 1).expand(s.b, -1, s.t_k, s.dv)  # v = g + 1 on K/V head g
    marked = first_output(fn(q.clone(), k.clone(), labels.clone()))
    per_head = torch.arange(1.0, s.kv_heads + 1).view(1, -1, 1, 1).expand(s.b, -1, s.t_q, s.dv)
    named = _name_mapping(_read_mapping(marked, per_head), s)
    if named:
        return named
    if is_close(out, _reference(q, k, v, scale=1.0)):
        return found(Pitfall.SCALE, gettext("the scores are not scaled"),
                     gettext("each query head reads the right K/V head, but the scores miss the 1/sqrt(d) factor."),
                     where=gettext("Seen {s_where}.").format(s_where=s.where()))
    return found(Pitfall.GENERAL, gettext("grouped attention differs from the reference"),
                 gettext("each query head reads the right K/V head (h // groups), yet the output differs by up to {max_abs_diff:.3g} "
                         "{s_where}.").format(max_abs_diff=max_abs_diff(out, want), s_where=s.where()),
                 fix=gettext("compare softmax(q kᵀ / sqrt(d)) v head by head"))


@quietly
def diagnose_kv_grouping(fn: Callable) -> list[Finding]:
    """Diagnose grouped-query attention ``fn(q, k, v) -> out`` (or ``(out, weights)``): q ``[B, H, Tq, d]``, k
    ``[B, kv_heads, Tk, d]``, v ``[B, kv_heads, Tk, dv]``, out ``[B, H, Tq, dv]``, query head ``h`` reading K/V head
    ``h // (H // kv_heads)``. Names ``KV_GROUPING`` (the order of ``repeat`` or another wrong mapping, measured),
    ``SCALE``, a wrong shape or another difference."""
    gen = torch.Generator().manual_seed(1020)
    bad = []
    for s in _SHAPES:
        try:
            res = _grouping_probe(fn, s, gen)
        except Exception as exc:  # noqa: BLE001
            return [crash_finding(gettext("grouped attention {s_where}")
                .format(s_where=s.where()), exc, hint=gettext("k and v have kv_heads heads, q has H."))]
        if isinstance(res, Finding):
            return [res]
        if res is not None:
            bad.append((s, res))
    return _named(bad, len(_SHAPES))
