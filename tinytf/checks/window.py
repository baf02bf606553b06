"""``diagnose_window``: is ``fn(t_q, t_k, window)`` the end-aligned sliding-window causal mask?

The query at position ``p = t_k - t_q + i`` may see keys ``p - window + 1 … p``: at most ``window`` keys,
itself included (``min(window, p + 1)`` of them). The diagnosis counts the keys each query sees and
compares the mask with the named wrong ones: one key too many or too few (the window not counting the
query itself), the query's own key blocked, a window that reaches into the future, a mask aligned to the
start instead of the end, and no window at all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from ..masks import causal_mask
from ..translation import N_
from ..translation import gettext as _
from .catalog import Pitfall
from .findings import Finding, found
from .probe import cover_probes, crash_finding, only_for, quietly

__all__ = ["diagnose_window"]

# (t_q, t_k, window): square and t_k > t_q (a decode step over a cache), window 1 and window >= t_k
_WINDOW = Pitfall.WINDOW_OFF_BY_ONE
_PROBES = ((6, 6, 3), (4, 9, 3), (7, 7, 1), (5, 8, 2), (3, 3, 5), (6, 10, 4))


def _band(t_q: int, t_k: int, lo: int, hi: int, offset: int | None = None) -> torch.Tensor:
    """Allowed where ``p + lo <= j <= p + hi`` for the query at position ``p = offset + i`` (end-aligned by default)."""
    offset = t_k - t_q if offset is None else offset
    j = torch.arange(t_k)[None, :]
    p = torch.arange(t_q)[:, None] + offset
    return (j >= p + lo) & (j <= p + hi)


class WrongWindow(NamedTuple):
    make: Callable[[int, int, int], torch.Tensor]  # (t_q, t_k, window) -> [t_q, t_k] bool
    pitfall: Pitfall
    title: str
    evidence: str


_WRONG = (
    WrongWindow(lambda tq, tk, w: _band(tq, tk, -w, 0), _WINDOW, N_("the window lets a query see window + 1 keys"),
                N_("the query at position p sees keys p - window … p: window + 1 keys. The window counts the query itself, so "
                "the oldest key it keeps is p - window + 1 (keep j > p - window, not j >= p - window).")),
    WrongWindow(lambda tq, tk, w: _band(tq, tk, 2 - w, 0), _WINDOW, N_("the window lets a query see window - 1 keys"),
                N_("the query at position p sees keys p - window + 2 … p: window - 1 keys (none at all for window = 1). The window "
                "counts the query itself, so it keeps the last window keys, p - window + 1 … p.")),
    WrongWindow(lambda tq, tk, w: _band(tq, tk, -w, -1), Pitfall.CAUSAL_OFF_BY_ONE, N_("the window blocks the query's own key"),
                N_("the query at position p sees keys p - window … p - 1: window keys, but not itself (position 0 sees nothing, "
                "NaN after the softmax). The window ends at the query: keys p - window + 1 … p.")),
    WrongWindow(lambda tq, tk, w: _band(tq, tk, 1 - w, w - 1), Pitfall.CAUSAL_OFF_BY_ONE, N_("the window is not causal"),
                N_("the query at position p sees keys p - window + 1 … p + window - 1: the window is centred on the query and lets "
                "the future in. A causal window ends at the query itself.")),
    WrongWindow(lambda tq, tk, w: _band(tq, tk, 1 - w, 0, offset=0), Pitfall.GENERAL, N_("the window is aligned to the start"),
                N_("query i is treated as position i, but with t_k > t_q (new tokens over a cache) it sits at position "
                "t_k - t_q + i: the last query must see the last keys.")),
    WrongWindow(lambda tq, tk, w: causal_mask(tq, tk), Pitfall.GENERAL, N_("the window is ignored"),
                N_("every query sees all of its past: a plain causal mask. Also block the keys older than p - window + 1.")),
)


def _counts(mask: torch.Tensor) -> list[int]:
    return [int(n) for n in mask.sum(-1)]


def _collect(fn: Callable) -> tuple[list[Finding], dict[tuple[int, int, int], torch.Tensor] | None]:
    """``{(t_q, t_k, window): fn(...)}`` as CPU bool tensors, or the finding that stops the diagnosis."""
    masks = {}
    for tq, tk, w in _PROBES:
        try:
            m = fn(tq, tk, w)
        except Exception as exc:  # noqa: BLE001 - student code may raise anything
            return [crash_finding(_("the window mask for t_q={tq}, t_k={tk}, window={w}").format(tq=tq, tk=tk, w=w), exc)], None
        if not isinstance(m, torch.Tensor) or tuple(m.shape) != (tq, tk):
            got = list(m.shape) if isinstance(m, torch.Tensor) else type(m).__name__
            return [Finding(Pitfall.GENERAL, _("wrong window mask shape"),
                            _("fn({tq}, {tk}, {w}) returned {got}; expected a bool tensor [{tq}, {tk}] (query rows, key columns).")
                                .format(tq=tq, tk=tk, w=w, got=got))], None
        if m.dtype != torch.bool:
            return [found(Pitfall.GENERAL, _("the window mask is not boolean"), _("it has dtype {m_dtype}.").format(m_dtype=m.dtype),
                          fix=_("build it from comparisons: a bool tensor, True = may attend (what tinytf and "
                                "F.scaled_dot_product_attention take)"))], None
        masks[(tq, tk, w)] = m.cpu()
    return [], masks


def _where(probe: tuple[int, int, int]) -> str:
    return _("for t_q={}, t_k={}, window={}").format(*probe)


@quietly
def diagnose_window(fn: Callable[[int, int, int], torch.Tensor]) -> list[Finding]:
    """Diagnose ``fn(t_q, t_k, window) -> bool [t_q, t_k]`` (True = may attend): end-aligned, the query at position
    ``p = t_k - t_q + i`` sees keys ``p - window + 1 … p``. Counts the keys each query sees; names
    ``WINDOW_OFF_BY_ONE`` (window ± 1 keys), ``CAUSAL_OFF_BY_ONE`` (own key blocked, future keys seen) and a window
    aligned to the start or ignored, from the probes that show each."""
    findings, masks = _collect(fn)
    if masks is None:
        return findings
    bad = [p for p, m in masks.items() if not torch.equal(m, causal_mask(p[0], p[1], window=p[2]))]
    if not bad:
        return []
    named, rest = cover_probes(bad, _WRONG, lambda w, p: torch.equal(masks[p], w.make(*p)))
    for w, probes in named:
        p = next((p for p in probes if p[1] > p[0]), probes[0])
        counts = (_("Keys seen per query {where}: {counts}, should be {counts2}.")
            .format(where=_where(p), counts=_counts(masks[p]), counts2=_counts(causal_mask(p[0], p[1], window=p[2]))))
        where = only_for([_where(p) for p in probes], len(probes), len(masks)) or _("Seen {where}.").format(where=_where(p))
        findings.append(found(w.pitfall, _(w.title), f"{_(w.evidence)} {counts}", where=where, fix=w.pitfall is _WINDOW))
    if rest:
        p = rest[0]
        m, right = masks[p], causal_mask(p[0], p[1], window=p[2])
        future = (m & ~causal_mask(p[0], p[1])).nonzero().tolist()
        pitfall = Pitfall.CAUSAL_OFF_BY_ONE if future else _WINDOW
        detail = _("future (query, key) pairs allowed: {future}. ").format(future=future[:4]) if future else ""
        findings.append(found(pitfall, _("not a sliding-window causal mask"),
                              _("{where} the queries see {counts} keys, should see {counts2} (min(window, p + 1) for the query at "
                                "position p). {detail}").format(where=_where(p), counts=_counts(m), counts2=_counts(right), detail=detail),
                              where=only_for([_where(p) for p in rest], len(rest), len(masks)), fix=pitfall is _WINDOW))
    return findings
