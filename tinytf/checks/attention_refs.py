"""The references ``diagnose_attention`` compares against: the correct one and the ones that are wrong
in one named way (scale, orientation, softmax axis, mask handling), plus a scale fit for the rest."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from ..translation import N_, gettext
from .catalog import Pitfall
from .probe import max_abs_diff

ScaleFn = Callable[[int, int], float]  # (d_head, heads) -> the factor applied to q kᵀ


class Probe(NamedTuple):
    """One unmasked probe: q ``[B, H, Tq, d]``, k/v ``[B, H, Tk, d]``, H heads of width d."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    h: int
    d: int


class Core(NamedTuple):
    """How the scores are formed: ``scale(d, h)``, orientation ``"qk"``/``"kq"`` and softmax axis."""

    scale: ScaleFn
    orient: str = "qk"
    axis: int = -1


Problem = tuple[Pitfall, str, str]  # (pitfall, title, evidence)


class Candidate(NamedTuple):
    """A wrong reference: the core it uses, how it treats the mask, and the problems it stands for."""

    core: Core | None  # None: the probe's own core (right or already diagnosed)
    mask_mode: str
    invert: bool
    problems: tuple[Problem, ...]


def _variant(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, *, scale: float,
             orient: str = "qk", axis: int = -1, mask_mode: str = "before", invert: bool = False) -> torch.Tensor:
    """A reference attention, correct or wrong in one named way. q ``[..., Tq, d]`` -> ``[..., Tq, d]``."""
    s = (q @ k.transpose(-2, -1)) if orient == "qk" else (k @ q.transpose(-2, -1))  # [..., Tq, Tk]
    s = s * scale
    m = None if mask is None or mask_mode == "ignored" else (~mask if invert else mask)
    if m is not None and mask_mode == "before":
        s = s.masked_fill(~m, float("-inf"))
    elif m is not None and mask_mode == "multiply":
        s = s * m
    w = s.softmax(dim=axis)
    if m is not None and mask_mode == "after":
        w = w * m
    return w @ v


def reference(p: Probe, core: Core, mask: torch.Tensor | None = None, mask_mode: str = "before",
              invert: bool = False) -> torch.Tensor:
    """``_variant`` for probe ``p`` with ``core``: ``[B, H, Tq, d]``."""
    return _variant(p.q, p.k, p.v, mask, scale=core.scale(p.d, p.h), orient=core.orient, axis=core.axis,
                    mask_mode=mask_mode, invert=invert)


RIGHT = Core(lambda d, h: 1 / math.sqrt(d))

_SCALES: tuple[tuple[ScaleFn, Problem | None], ...] = (
    (RIGHT.scale, None),
    (lambda d, h: 1.0, (Pitfall.SCALE, N_("missing scaling"), N_("the output matches softmax(q kᵀ) v with no scaling: the spread of "
                                                          "the scores then grows with the head width."))),
    (lambda d, h: 1 / math.sqrt(h * d), (Pitfall.SCALE, N_("scaled by the total dim, not the head dim"),
                                         N_("the output matches a scale of 1/sqrt(H * d_head) = 1/sqrt(D); scale by the width of "
                                         "one head, q.size(-1)."))),
    (lambda d, h: 1 / d, (Pitfall.SCALE, N_("scaled by 1/d_head instead of 1/sqrt(d_head)"), N_("the square root is missing."))),
    (lambda d, h: math.sqrt(d), (Pitfall.SCALE, N_("multiplied by sqrt(d_head) instead of dividing"), N_("the scale must be "
                                                                                                         "1/sqrt(d_head)."))),
)
_TRANSPOSED = N_("the output matches softmax(k qᵀ) v: the scores are [Tk, Tq], not [Tq, Tk].")
_QUERY_AXIS = (N_("the output matches weights normalised over the queries (softmax(dim=-2)); the softmax must run over the keys, "
               "the last axis, so each query's weights sum to one."))
_ORIENTATIONS: tuple[tuple[str, int, Problem | None], ...] = (
    ("qk", -1, None),
    ("kq", -1, (Pitfall.ORIENTATION, N_("transposed scores: k @ qᵀ instead of q @ kᵀ"), _TRANSPOSED)),
    ("qk", -2, (Pitfall.ORIENTATION, N_("softmax over the query axis: weight rows do not sum to one"), _QUERY_AXIS)),
    ("kq", -2, (Pitfall.ORIENTATION, N_("transposed scores and softmax over the wrong axis"),
                N_("the output matches softmax(k qᵀ) v: the scores are [Tk, Tq], not [Tq, Tk]. The weights are normalised over the "
                   "queries (softmax(dim=-2)); the softmax must run over the keys, the last axis, so each query's weights sum to one."))),
)
# every wrong core (orientation x scale), in the order they are tried; the first is the right one
CORES: tuple[tuple[Core, tuple[Problem, ...]], ...] = tuple(
    (Core(scale, orient, axis), tuple(p for p in (scale_problem, core_problem) if p))
    for orient, axis, core_problem in _ORIENTATIONS for scale, scale_problem in _SCALES
)

_M = Pitfall.MASK
_MASK_MISTAKES: tuple[tuple[str, bool, str, str], ...] = (
    ("ignored", False, N_("mask ignored"), N_("the output is the same as without a mask.")),
    ("after", False, N_("mask applied after the softmax"), N_("the output matches softmax(scores) * mask: blocked weights are zeroed "
                                                       "afterwards, so the remaining ones no longer sum to one.")),
    ("multiply", False, N_("mask multiplied into the scores"), N_("blocked scores become 0, not -inf, so exp(0) still gives them weight.")),
    ("before", True, N_("inverted mask convention"), N_("your code blocks the positions where mask is True. In tinytf (and "
                                                 "F.scaled_dot_product_attention) a bool mask means True = MAY attend.")),
    ("after", True, N_("inverted mask convention, applied after the softmax"), N_("True means MAY attend, and the mask must be applied "
                                                                           "to the scores before the softmax.")),
    ("multiply", True, N_("inverted mask multiplied into the scores"), N_("True means MAY attend; blocked scores must be -inf, not 0.")),
)
# with a mask: first a mask mistake on the probe's own core, then a core mistake that shows only with a mask
MASKED: tuple[Candidate, ...] = (
    *(Candidate(None, mode, inv, ((_M, title, text),)) for mode, inv, title, text in _MASK_MISTAKES),
    *(Candidate(core, "before", False, problems) for core, problems in CORES[1:]),
)


def fit_scale(out: torch.Tensor, p: Probe) -> tuple[float, float]:
    """The scale ``s`` for which ``softmax(q kᵀ s) v`` best matches ``out``: grid over log s, then refine."""

    def err(log_s: float) -> float:
        return max_abs_diff(out, _variant(p.q, p.k, p.v, scale=math.exp(log_s)))

    grid = [i / 8 for i in range(-64, 33)]  # s from e^-8 to e^4
    errs = [err(x) for x in grid]
    i = min(range(len(grid)), key=errs.__getitem__)
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = err(a), err(b)
    for _ in range(40):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = err(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = err(b)
    x = (lo + hi) / 2
    return math.exp(x), err(x)


def explain_scales(fitted: dict[tuple[int, int], float]) -> str:
    """What the fitted scales per (heads, d_head) say: a hard-coded constant, an extra factor, or neither."""
    found = sorted((d, s_) for (_, d), s_ in fitted.items())
    table = gettext(", ").join(gettext("d_head={d}: s={s:.4g} (want {want:.4g})").format(d=d, s=s_, want=1 / math.sqrt(d))
                               for d, s_ in found)
    ratios = [s_ * math.sqrt(d) for d, s_ in found]
    values = [s_ for _, s_ in found]
    if max(values) - min(values) < 1e-2 * max(values):
        inv_sq = values[0] ** -2
        named = gettext(" (1/sqrt({inv_sq}))").format(inv_sq=round(inv_sq)) if abs(inv_sq - round(inv_sq)) < 1e-2 else ""
        why = (gettext(" The scale is the same constant {values:.4g} for every head width: a hard-coded number{named}; compute it from "
                       "the tensor.").format(values=values[0], named=named))
    elif max(ratios) - min(ratios) < 1e-2 * max(ratios):
        why = (gettext(" It is {ratios:.4g} x 1/sqrt(d_head): an extra constant factor (scaled q or k, or the scale applied twice?).")
            .format(ratios=ratios[0]))
    else:
        why = ""
    return gettext("the output matches softmax(q kᵀ · s) v with {table}.{why}").format(table=table, why=why)
