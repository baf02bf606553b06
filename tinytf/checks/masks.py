"""``diagnose_causal_mask``: is ``fn(T)`` the bool ``[T, T]`` lower triangle, for every T probed?"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from ..translation import gettext as _
from .catalog import Pitfall
from .findings import Finding, found
from .probe import cover_probes, crash_finding, only_for, quietly

__all__ = ["diagnose_causal_mask"]

_CAUSAL = Pitfall.CAUSAL_OFF_BY_ONE


def _tril(t: int, k: int = 0) -> torch.Tensor:
    """The allowed positions of a causal mask, ``[T, T]`` bool, shifted by ``k`` diagonals."""
    return torch.ones(t, t, dtype=torch.bool).tril(k)


class WrongMask(NamedTuple):
    make: Callable[[int], torch.Tensor]  # T -> [T, T] bool
    title: str
    evidence: str


def _wrong_masks() -> list[WrongMask]:
    """The named wrong causal masks, most telling first."""
    wrong = [WrongMask(lambda t: _tril(t).T, _("transposed causal mask"),
                       _("query i may see keys i..T-1 (the future) instead of 0..i (the past): .triu() where .tril() belongs."))]
    for k in (-2, -1, 1, 2):
        if k < 0:
            wrong.append(WrongMask(lambda t, k=k: _tril(t, k), _("off by one: the diagonal is blocked"),
                                   _("query i may only see keys 0..i{k}, not itself (tril(diagonal={k})). Row 0 then has nothing to "
                                     "attend to (NaN after the softmax). Block only triu(diagonal=1).").format(k=k)))
        else:
            wrong.append(WrongMask(lambda t, k=k: _tril(t, k), _("off by one: the future leaks"),
                                   _("query i may see keys 0..i+{k} (tril(diagonal={k})): {k} future token{value} per position leak in.")
                                       .format(k=k, value='s' if k > 1 else '')))
    for k in (0, -1, 1, -2, 2):
        extra = "" if k == 0 else (_(" It is also off by {k}: the blocked part should be triu(diagonal=1), it is triu(diagonal={value}).")
            .format(k=abs(k), value=k + 1))
        wrong.append(WrongMask(lambda t, k=k: ~_tril(t, k), _("inverted convention: True marks blocked positions"),
                               _("the mask is True where the future is (the *blocked* positions). In tinytf and "
                               "F.scaled_dot_product_attention a bool mask means True = MAY attend: return ~mask.") + extra))
    return wrong


def _collect(fn: Callable[[int], torch.Tensor], sizes: Sequence[int]) -> tuple[list[Finding], dict[int, torch.Tensor] | None]:
    """``{T: fn(T)}`` as bool on the CPU, or the finding that stops the diagnosis (crash, type, shape)."""
    masks = {}
    for t in sizes:
        try:
            m = fn(t)
        except Exception as exc:  # noqa: BLE001
            return [crash_finding(_("causal mask for T={t}").format(t=t), exc)], None
        if not isinstance(m, torch.Tensor):
            return [Finding(Pitfall.GENERAL, _("does not return a tensor"),
                            _("fn({t}) returned {type}; expected a bool tensor [{t}, {t}].").format(t=t, type=type(m).__name__))], None
        if tuple(m.shape) != (t, t):
            return [Finding(_CAUSAL, _("wrong mask shape"),
                            _("fn({t}) returned shape {m_shape}; expected [{t}, {t}] (query rows, key columns). A mask built for a fixed "
                              "size does not follow T.").format(t=t, m_shape=list(m.shape)))], None
        masks[t] = m.cpu()
    first = next(iter(masks.values()))
    if first.dtype == torch.bool:
        return [], masks
    additive = first.is_floating_point() and any(bool(torch.isinf(m).any()) for m in masks.values())
    finding = Finding(_CAUSAL, _("mask is not boolean"),
                      _("it has dtype {first_dtype}")
                          .format(first_dtype=first.dtype) + (_(" and -inf entries: an additive mask") if additive else "") +
                      _(". tinytf expects bool with True = may attend (torch.ones(T, T, dtype=torch.bool).tril()). "
                      "The rest of this diagnosis reads it as ") + (_("0 = allowed.") if additive else _("nonzero = True.")))
    return [finding], {t: (m == 0) if additive else (m != 0) for t, m in masks.items()}


@quietly
def diagnose_causal_mask(fn: Callable[[int], torch.Tensor], *, sizes: Sequence[int] = (1, 2, 4, 7)) -> list[Finding]:
    """Diagnose ``fn(T) -> bool [T, T]`` (True = may attend: query i sees keys 0..i).

    Catches the off-by-one diagonal in both directions (the diagonal blocked, or one future token
    let through), the inverted convention (True = blocked), a transposed mask (future instead of
    past), a non-bool dtype and wrong shapes (all ``Pitfall.CAUSAL_OFF_BY_ONE``), and exceptions.
    Each is named from the sizes T on which the mask is wrong: a mask right for T <= 4 only is named too.
    """
    findings, masks = _collect(fn, sizes)
    if masks is None:
        return findings
    bad = [t for t, m in masks.items() if not torch.equal(m, _tril(t))]
    if not bad:
        return findings
    wrong = _wrong_masks()
    full = [w for w in wrong if all(torch.equal(masks[t], w.make(t)) for t in bad)]
    if full:
        named, rest = [(full[0], bad)], []
    else:  # partly one mistake, partly another; on T < 3 the named masks coincide, so they prove nothing there
        named, rest = cover_probes(bad, wrong, lambda w, t: torch.equal(masks[t], w.make(t)))
        rest += [t for w, ts in named if max(ts) < 3 for t in ts]
        named = [(w, ts) for w, ts in named if max(ts) >= 3]
    for w, ts in named:
        findings.append(found(_CAUSAL, w.title, w.evidence, where=only_for([_("for T={t}").format(t=t) for t in ts], len(ts), len(masks))))
    if rest:
        t = max(rest)
        leak = (masks[t] & ~_tril(t)).nonzero().tolist()
        miss = (~masks[t] & _tril(t)).nonzero().tolist()
        parts = ([_("future positions allowed (query, key): {leak}").format(leak=leak[:4])] if leak else []) + \
                ([_("past or present positions blocked: {miss}").format(miss=miss[:4])] if miss else [])
        findings.append(found(_CAUSAL, _("not a causal mask"), _("for T={t}: ").format(t=t) + _("; ").join(parts) + _("."),
                              where=only_for([_("for T={t}").format(t=t) for t in sorted(rest)], len(rest), len(masks))))
    return findings
