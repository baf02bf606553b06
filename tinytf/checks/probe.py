"""Probe helpers shared by every ``diagnose_*``: one thread and a restored RNG (:func:`quietly`), crash
findings (:func:`crash_finding`, :func:`error_text`), closeness tests (:func:`is_close`, :func:`max_abs_diff`),
random masks, and the search that names which wrong reference explains the failing probes
(:func:`cover_probes`, :func:`only_for`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import torch

from ..bench import one_thread
from ..translation import gettext as _
from .catalog import Pitfall
from .findings import Finding, sentences

__all__ = ["quietly", "error_text", "crash_finding", "first_output", "is_close", "max_abs_diff", "random_mask",
           "cover_probes", "only_for"]

C = TypeVar("C")


def quietly(diagnose: Callable[..., list[Finding]]) -> Callable[..., list[Finding]]:
    """Run a detector on one thread, with the global RNG state restored afterwards."""

    @functools.wraps(diagnose)
    def wrapper(*args: Any, **kwargs: Any) -> list[Finding]:
        cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
        with one_thread(), torch.random.fork_rng(devices=cuda):
            return diagnose(*args, **kwargs)

    return wrapper


def error_text(exc: BaseException) -> str:
    """``"RuntimeError: first line of the message"``."""
    text = str(exc).strip().splitlines()[0].rstrip(".") if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def crash_finding(what: str, exc: BaseException, pitfall: Pitfall = Pitfall.GENERAL, hint: str = "") -> Finding:
    """The finding for code that raised: "not implemented yet" for ``NotImplementedError``."""
    if isinstance(exc, NotImplementedError):
        return Finding(Pitfall.GENERAL, _("{what} is not implemented yet").format(what=what),
                       _("it raised {error_text}. Fill in the TODO and run the check again.").format(error_text=error_text(exc)))
    return Finding(pitfall, _("{what} raised an exception")
        .format(what=what), sentences(_("it raised {error_text}.").format(error_text=error_text(exc)), hint))


def first_output(out: Any) -> Any:
    """Accept ``out`` or ``(out, weights)``."""
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return out


def is_close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-4) -> bool:
    """Same shape and allclose; NaNs must sit in the same places."""
    if a.shape != b.shape:
        return False
    a, b = a.detach().double(), b.detach().double()
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return bool(torch.equal(torch.isnan(a), torch.isnan(b)) and torch.allclose(a.nan_to_num(0.0), b.nan_to_num(0.0), atol=tol))
    return bool(torch.allclose(a, b, atol=tol, rtol=tol))


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest ``|a - b|`` (in float64)."""
    return float((a.detach().double() - b.detach().double()).abs().max())


def random_mask(shape: Sequence[int], gen: torch.Generator) -> torch.Tensor:
    """Random bool mask whose every row (last axis) has at least one True and one False."""
    m = torch.rand(*shape, generator=gen) < 0.5
    n = shape[-1]
    idx = torch.randint(0, n, (*shape[:-1], 1), generator=gen)
    m = m.scatter(-1, idx, True)
    m = m.scatter(-1, (idx + 1 + torch.randint(0, n - 1, idx.shape, generator=gen)) % n, False)
    return m


def cover_probes(
    bad: Sequence[int], candidates: Sequence[C], matches: Callable[[C, int], bool]
) -> tuple[list[tuple[C, list[int]]], list[int]]:
    """Name the failing probes: greedily pick the candidate (a wrong reference) that matches the most
    of the ``bad`` probe indices, then the next one for the rest. Returns ``[(candidate, its probes)]``
    and the probes no candidate explains. A mistake that shows on some inputs only is still named."""
    memo: dict[tuple[int, int], bool] = {}

    def hit(c: int, i: int) -> bool:
        if (c, i) not in memo:
            memo[(c, i)] = bool(matches(candidates[c], i))
        return memo[(c, i)]

    remaining, named = list(bad), []
    while remaining:
        hits = [[i for i in remaining if hit(c, i)] for c in range(len(candidates))]
        best = max(range(len(candidates)), key=lambda c: (len(hits[c]), -c), default=None)
        if best is None or not hits[best]:
            break
        named.append((candidates[best], hits[best]))
        remaining = [i for i in remaining if i not in hits[best]]
    return named, remaining


def only_for(descriptions: Sequence[Hashable], n_bad: int, n_total: int) -> str:
    """``"Wrong for q [2, 3, 5, 8] and k [2, 3, 7, 8] (2 of 8 probes); right on the others."``, or ``""``
    when every probe shows it. Right on the others may mean the mistake makes no difference there
    (no padding, one head, T = 1) or that the code is wrong for some inputs only."""
    if n_bad >= n_total:
        return ""
    unique = list(dict.fromkeys(descriptions))
    more = _(" and {value} more").format(value=len(unique) - 3) if len(unique) > 3 else ""
    return (_("Wrong {value_join}{more} ({n_bad} of {n_total} probes); right on the others.")
        .format(value_join=_("; ").join(map(str, unique[:3])), more=more, n_bad=n_bad, n_total=n_total))
