"""What fp16 and bf16 do to attention: the formats, the thresholds where scores and weights stop
being finite (found by a sweep, next to the formula that predicts them), and the error of sums kept
in a low-precision accumulator.

    formats()                                   fp32, bf16, fp16: range, epsilon, subnormals (torch.finfo)
    score_overflow(d, scaling="after")          the activation scale where fp16 q @ kᵀ first overflows
    softmax_overflow(torch.float16)             the score where a softmax without the max first breaks
    accumulation_errors([64, 256, 1024])        bf16 sums accumulated in bf16 vs fp32, against fp64

A *sweep* here is a geometric bisection (:func:`first_failure`) over a scale on fixed, seeded inputs:
below the returned value every call is finite, at it the first ``inf``/NaN appears.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .attention import scaled_dot_product_attention
from .bench import one_thread
from .memory_sizes import as_dtype, dtype_name
from .tiled import tiled_attention
from .translation import N_
from .translation import gettext as _

__all__ = [
    "FORMATS", "SCALINGS", "FINITE_STATES", "Format", "Threshold", "AccumulationError", "formats", "overflow_limit",
    "round_trip_error", "first_failure", "attention_scores", "naive_softmax", "additive_mask", "score_overflow",
    "softmax_overflow", "accumulate", "accumulated_matmul", "accumulation_errors", "finite_map",
]

FORMATS = ("fp32", "bf16", "fp16")
SCALINGS = ("none", "after", "before")  # no 1/sqrt(d); (q @ kᵀ) · scale; (q · scale) @ kᵀ as fused kernels do
FINITE_STATES = (N_("finite"), N_("weights not finite"), N_("scores not finite"))  # finite_map's values 0, 1, 2
Tensor = torch.Tensor


def _one_thread(fn: Callable) -> Callable:
    """Run a sweep on one intra-op thread: its tensors are small, and on a busy machine two threads mostly wait
    for each other (a 128 × 128 matmul: ~0.2 ms on one thread, ~10 ms on two that contend)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        with one_thread():
            return fn(*args, **kwargs)

    return wrapper


@dataclass(frozen=True)
class Format:
    """One floating-point format as ``torch.finfo`` and ``torch.nextafter`` describe it."""

    name: str
    dtype: torch.dtype
    bits: int
    exponent_bits: int
    mantissa_bits: int  # stored fraction bits (the leading 1 is implicit)
    max: float
    smallest_normal: float
    smallest_subnormal: float
    eps: float  # the gap between 1 and the next number

    @property
    def max_exp_argument(self) -> float:
        """``ln(max)``: the largest ``x`` whose ``exp(x)`` is still finite in this format."""
        return math.log(self.max)


def formats(names: Sequence[str] = FORMATS) -> list[Format]:
    """:class:`Format` of each of ``names`` (``"fp32"``, ``"bf16"``, ``"fp16"``, ...), read from torch."""
    rows = []
    for name in names:
        dt = as_dtype(name)
        fi = torch.finfo(dt)
        mantissa = round(-math.log2(fi.eps))
        sub = torch.nextafter(torch.zeros((), dtype=dt), torch.ones((), dtype=dt)).item()
        rows.append(Format(dtype_name(dt), dt, fi.bits, fi.bits - 1 - mantissa, mantissa, fi.max, fi.smallest_normal, sub, fi.eps))
    return rows


def overflow_limit(dtype: torch.dtype | str) -> float:
    """The smallest value that rounds to ``inf`` in ``dtype``: ``max`` plus half a step (65520 for fp16)."""
    fi = torch.finfo(as_dtype(dtype))
    return fi.max * (2 - fi.eps / 2) / (2 - fi.eps)


def round_trip_error(x: Tensor, dtype: torch.dtype | str) -> tuple[float, float]:
    """``(median, max)`` relative error of ``x -> dtype -> float64`` over the non-zero entries of ``x``."""
    x = x.detach().double().flatten()
    x = x[x != 0]
    rel = ((x.to(as_dtype(dtype)).double() - x).abs() / x.abs())
    return rel.median().item(), rel.max().item()


def first_failure(fails: Callable[[float], bool], lo: float, hi: float, *, rel: float = 1e-4) -> float:
    """The smallest value in ``[lo, hi]`` at which ``fails(value)`` becomes True, by geometric bisection
    to a relative width ``rel``. ``fails`` must be False at ``lo`` and True at ``hi`` (monotone in between)."""
    if not 0 < lo < hi:
        raise ValueError(_("first_failure needs 0 < lo < hi, got lo={lo}, hi={hi}").format(lo=lo, hi=hi))
    if fails(lo) or not fails(hi):
        raise ValueError(_("no failure boundary in [{lo}, {hi}]: it fails at lo={at_lo} and at hi={at_hi}. Widen the range.")
                         .format(lo=lo, hi=hi, at_lo=fails(lo), at_hi=fails(hi)))
    while hi / lo > 1 + rel:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if fails(mid) else (mid, hi)
    return hi


def attention_scores(q: Tensor, k: Tensor, scaling: str = "after") -> Tensor:
    """Scores ``[..., Tq, Tk]`` in q's dtype: ``"none"`` q @ kᵀ, ``"after"`` (q @ kᵀ) · scale,
    ``"before"`` (q · scale) @ kᵀ, with scale = 1/sqrt(d)."""
    if scaling not in SCALINGS:
        raise ValueError(_("scaling must be one of {scalings}, got {scaling!r}").format(scalings=SCALINGS, scaling=scaling))
    scale = 1.0 / math.sqrt(q.size(-1))
    if scaling == "before":
        return (q * scale) @ k.transpose(-2, -1)
    scores = q @ k.transpose(-2, -1)  # [..., Tq, d] @ [..., d, Tk] -> [..., Tq, Tk]
    return scores * scale if scaling == "after" else scores


def naive_softmax(scores: Tensor, dim: int = -1) -> Tensor:
    """``exp(s) / Σ exp(s)`` without subtracting the row maximum: exact maths, unsafe numbers."""
    e = scores.exp()
    return e / e.sum(dim=dim, keepdim=True)


def additive_mask(allowed: Tensor, dtype: torch.dtype | str, fill: str = "-inf") -> Tensor:
    """An additive mask from a bool one (True = may attend): 0 where allowed, ``-inf`` (``fill="-inf"``)
    or ``torch.finfo(dtype).min`` (``fill="min"``) where blocked."""
    dt = as_dtype(dtype)
    if fill not in ("-inf", "min"):
        raise ValueError(_("fill must be '-inf' or 'min', got {fill!r}").format(fill=fill))
    value = float("-inf") if fill == "-inf" else torch.finfo(dt).min
    return torch.zeros(allowed.shape, dtype=dt, device=allowed.device).masked_fill(~allowed, value)


@dataclass(frozen=True)
class Threshold:
    """Where a computation first stops being finite: ``found`` by a sweep, ``predicted`` by a formula."""

    what: str
    found: float
    predicted: float
    dtype: str

    @property
    def agreement(self) -> float:
        """``found / predicted - 1``."""
        return self.found / self.predicted - 1


def _unit_qk(d: int, tokens: int, heads: int, seed: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, heads, tokens, d, generator=g) for _ in range(2))  # q0, k0 ~ N(0, 1)


@_one_thread
def score_overflow(d: int, *, scaling: str = "after", dtype: torch.dtype | str = torch.float16, tokens: int = 128, heads: int = 2,
                   seed: int = 0) -> Threshold:
    """The activation scale ``σ`` at which ``attention_scores(σ·q0, σ·k0, scaling)`` in ``dtype`` first holds ``inf``.

    q0, k0 ``[1, heads, tokens, d]`` are seeded unit normals. The scores are ``σ² · q0 k0ᵀ`` (times
    1/sqrt(d) for ``"after"`` and ``"before"``): predicted ``σ = sqrt(limit / max|q0 k0ᵀ|)`` when the
    product itself must fit (``"none"``, ``"after"``: scaling the product cannot undo its overflow),
    ``sqrt(limit · sqrt(d) / max|q0 k0ᵀ|)`` when q is scaled first; ``limit`` = :func:`overflow_limit`."""
    dt = as_dtype(dtype)
    q0, k0 = _unit_qk(d, tokens, heads, seed)
    peak = (q0.double() @ k0.double().transpose(-2, -1)).abs().max().item()
    room = overflow_limit(dt) * (math.sqrt(d) if scaling == "before" else 1.0)
    found = first_failure(lambda s: not bool(torch.isfinite(attention_scores((s * q0).to(dt), (s * k0).to(dt), scaling)).all()),
                          1e-2, 1e4, rel=1e-3)
    return Threshold(f"q @ kᵀ, scaling={scaling}, d={d}", found, math.sqrt(room / peak), dtype_name(dt))


@_one_thread
def softmax_overflow(dtype: torch.dtype | str = torch.float16, *, safe: bool = False, tokens: int = 256, rows: int = 64,
                     seed: int = 0) -> Threshold:
    """The largest score ``x`` in a row at which the softmax in ``dtype`` first returns ``inf``/NaN.

    Rows of seeded normal scores are scaled so that their largest entry is ``x``. Without the max
    (``safe=False``, :func:`naive_softmax`) ``exp(x)`` overflows first: predicted ``ln(limit)``, 11.09
    for fp16. ``torch.softmax`` subtracts the max and does not break within the sweep (ValueError)."""
    dt = as_dtype(dtype)
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(rows, tokens, generator=g)
    z = z / z.amax(dim=-1, keepdim=True)  # every row's largest entry is 1
    fn = (lambda s: s.softmax(-1)) if safe else naive_softmax
    found = first_failure(lambda x: not bool(torch.isfinite(fn((x * z).to(dt))).all()), 1e-2, 1e4, rel=1e-5)
    return Threshold("softmax" if safe else "softmax without the max", found, math.log(overflow_limit(dt)), dtype_name(dt))


def accumulate(x: Tensor, dtype: torch.dtype | str, dim: int = -1) -> Tensor:
    """``x.sum(dim)`` with the running sum kept in ``dtype``: every partial sum is rounded, as a kernel
    with a ``dtype`` accumulator would (``torch.sum`` itself accumulates half inputs in fp32)."""
    dt = as_dtype(dtype)
    x = x.movedim(dim, -1)
    acc = torch.zeros(x.shape[:-1], dtype=dt, device=x.device)
    for j in range(x.size(-1)):
        acc = (acc.double() + x[..., j].double()).to(dt)  # one rounding per addition
    return acc


def accumulated_matmul(w: Tensor, v: Tensor, dtype: torch.dtype | str) -> Tensor:
    """``w @ v`` (``[..., Tq, Tk] @ [..., Tk, d]``) with the running sum over ``Tk`` kept in ``dtype``:
    each product ``w_j · v_j`` is exact, each addition is rounded to ``dtype``."""
    dt = as_dtype(dtype)
    acc = torch.zeros(*w.shape[:-1], v.size(-1), dtype=dt, device=w.device)
    for j in range(w.size(-1)):
        acc = (acc.double() + w[..., j, None].double() * v[..., j, None, :].double()).to(dt)
    return acc


@dataclass(frozen=True)
class AccumulationError:
    """Relative errors at one ``T`` against float64 (the same rounded inputs): the softmax normaliser
    ``l = Σ exp(s - m)`` and ``weights @ v`` accumulated in the low dtype vs fp32, and three attentions."""

    tokens: int
    normaliser_low: float
    normaliser_fp32: float
    output_low: float
    output_fp32: float
    sdpa: float  # F.scaled_dot_product_attention
    explicit: float  # tinytf.scaled_dot_product_attention
    tiled: float  # tinytf.tiled_attention


def _rel(got: Tensor, want: Tensor) -> float:
    """``max |got - want| / max |want|``."""
    return ((got.double() - want).abs().max() / want.abs().max()).item()


@_one_thread
def accumulation_errors(tokens: Sequence[int], *, dtype: torch.dtype | str = torch.bfloat16, d: int = 64, queries: int = 16,
                        heads: int = 2, seed: int = 0) -> list[AccumulationError]:
    """:class:`AccumulationError` for each ``T`` in ``tokens``: q ``[1, heads, queries, d]``, k, v ``[1, heads, T, d]``
    seeded normals rounded to ``dtype``. The normaliser is the max over rows of ``|l - l64| / l64``."""
    dt = as_dtype(dtype)
    rows = []
    for t in tokens:
        g = torch.Generator().manual_seed(seed + t)
        q, k, v = (torch.randn(1, heads, n, d, generator=g).to(dt) for n in (queries, t, t))  # rounded inputs
        q64, k64, v64 = q.double(), k.double(), v.double()
        s = (q64 @ k64.transpose(-2, -1)) / math.sqrt(d)
        p = (s - s.amax(-1, keepdim=True)).exp()  # [1, H, Tq, T] in fp64
        l64 = p.sum(-1)
        w64 = p / l64[..., None]
        ref = w64 @ v64
        p_low, w_low = p.to(dt), w64.to(dt)  # what a low-precision kernel adds up
        norm_low, norm_fp32 = (((accumulate(p_low, acc).double() - l64).abs() / l64).max().item() for acc in (dt, torch.float32))
        rows.append(AccumulationError(
            t, norm_low, norm_fp32,
            _rel(accumulated_matmul(w_low, v, dt), ref), _rel(accumulated_matmul(w_low, v, torch.float32).to(dt), ref),
            _rel(F.scaled_dot_product_attention(q, k, v), ref), _rel(scaled_dot_product_attention(q, k, v), ref),
            _rel(tiled_attention(q, k, v), ref)))
    return rows


@_one_thread
def finite_map(dtype: torch.dtype | str, widths: Sequence[int], scales: Sequence[float], *, scaling: str = "after",
               safe_softmax: bool = True, tokens: int = 128, seed: int = 0) -> Tensor:
    """``[len(widths), len(scales)]`` int tensor of :data:`FINITE_STATES` indices: for head width ``d`` and
    activation scale ``σ``, are ``attention_scores(σ·q0, σ·k0, scaling)`` and their softmax finite in ``dtype``?"""
    dt = as_dtype(dtype)
    out = torch.zeros(len(widths), len(scales), dtype=torch.long)
    for i, d in enumerate(widths):
        q0, k0 = _unit_qk(d, tokens, 1, seed)
        for j, s in enumerate(scales):
            scores = attention_scores((s * q0).to(dt), (s * k0).to(dt), scaling)
            if not torch.isfinite(scores).all():
                out[i, j] = 2
                continue
            weights = scores.softmax(-1) if safe_softmax else naive_softmax(scores)
            out[i, j] = 0 if torch.isfinite(weights).all() else 1
    return out

