"""Diagnoses for chapter 14's pitfalls: half precision, masks, loss scaling and compiled timings.

* ``diagnose_half_attention(attn)``: ``attn(q, k, v)`` in fp16 at growing activation scales, against the
  same attention with q scaled first and a safe softmax; the scale where it first returns inf/NaN names
  the scores overflowing (1/sqrt(d) applied after ``q @ kᵀ``) or the softmax without the max.
* ``diagnose_masked_rows(attn)``: ``attn(q, k, v, mask)`` with a query that may see no key: NaN (a ``-inf``
  additive mask), or finite weights over the very keys it may not see (``finfo.min``), and NaN gradients.
* ``diagnose_grad_underflow(model, loss_fn)``: gradient entries an fp16 backward loses without loss scaling.
* ``diagnose_timings(times_ms, compiled=True)``: a first call (or a recompile) counted as run time.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

import torch

from ..mixed_precision import gradient_underflow
from ..precision import attention_scores, naive_softmax
from ..translation import gettext as _
from .catalog import Pitfall
from .findings import Finding, found
from .probe import crash_finding, first_output, quietly

__all__ = ["diagnose_half_attention", "diagnose_masked_rows", "diagnose_grad_underflow", "diagnose_timings", "HALF_SCALES"]

HALF_SCALES = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 96.0)  # activation scales σ of the probes: q, k = σ · N(0, 1)


def _reference(scaling: str, safe: bool) -> Callable[..., torch.Tensor]:
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        s = attention_scores(q, k, scaling)
        return (s.softmax(-1) if safe else naive_softmax(s)) @ v

    return attend


def _first_failure(attn: Callable[..., torch.Tensor], probes: list[tuple[torch.Tensor, ...]]) -> int | None:
    """Index of the first probe whose output holds inf or NaN (None: all finite)."""
    for i, (q, k, v) in enumerate(probes):
        if not torch.isfinite(first_output(attn(q, k, v))).all():
            return i
    return None


@quietly
def diagnose_half_attention(attn: Callable[..., torch.Tensor], *, dtype: torch.dtype = torch.float16, d: int = 64,
                            tokens: int = 32) -> list[Finding]:
    """``attn(q, k, v) -> out [..., T, d]`` on ``dtype`` inputs ``[1, 2, T, d]`` at the activation scales of
    :data:`HALF_SCALES`. Names ``UNSCALED_HALF_SCORES`` or ``HALF_SOFTMAX_NO_MAX`` (or both) from the scale at
    which its output first stops being finite, when the right attention in ``dtype`` is still finite there."""
    g = torch.Generator().manual_seed(0)
    base = [torch.randn(1, 2, tokens, d, generator=g) for _ in range(3)]
    probes = [tuple((s * t if i < 2 else t).to(dtype) for i, t in enumerate(base)) for s in HALF_SCALES]
    try:
        first = _first_failure(attn, probes)
    except Exception as exc:  # noqa: BLE001 - student code may raise anything
        return [crash_finding(_("attention on {dtype} inputs").format(dtype=dtype), exc)]
    right = _first_failure(_reference("before", True), probes)
    if first is None or (right is not None and first >= right):
        return []
    where = _("q, k = σ · N(0, 1) of shape {shape}, {dtype}").format(shape=[1, 2, tokens, d], dtype=str(dtype).replace("torch.", ""))
    culprits = {Pitfall.UNSCALED_HALF_SCORES: _reference("after", True), Pitfall.HALF_SOFTMAX_NO_MAX: _reference("before", False)}
    both = _reference("after", False)
    names = [p for p, ref in culprits.items() if _first_failure(ref, probes) == first]
    if not names and _first_failure(both, probes) == first:
        names = list(culprits)
    evidence = _("its output holds inf or NaN from σ = {sigma:g} on ({where}), where attention with q scaled first and a safe softmax "
                 "stays finite up to σ = {right}.").format(sigma=HALF_SCALES[first], where=where,
                                                           right=HALF_SCALES[right - 1] if right else HALF_SCALES[-1])
    if not names:
        return [found(Pitfall.GENERAL, _("half-precision attention is not finite"), evidence,
                      fix=_("form the scores as (q * d**-0.5) @ k.transpose(-2, -1) and use torch.softmax; compare in fp32 first"))]
    titles = {Pitfall.UNSCALED_HALF_SCORES: _("the fp16 scores overflow before they are scaled"),
              Pitfall.HALF_SOFTMAX_NO_MAX: _("the softmax overflows without the row maximum")}
    causes = {Pitfall.UNSCALED_HALF_SCORES: _("The unscaled product q @ kᵀ passes 65504 there; multiplying by 1/sqrt(d) afterwards "
                                              "cannot bring inf back."),
              Pitfall.HALF_SOFTMAX_NO_MAX: _("A score above ln(65504) = 11.09 makes exp overflow; inf / inf is NaN.")}
    return [found(p, titles[p], evidence + " " + causes[p]) for p in names]


@quietly
def diagnose_masked_rows(attn: Callable[..., torch.Tensor], *, dtype: torch.dtype = torch.float32) -> list[Finding]:
    """``attn(q, k, v, mask) -> out``, mask bool ``[T, T]`` (True = may attend) causal, with query 3 allowed no key.
    Names ``EMPTY_ROW_INF_MASK``: NaN in that row (and NaN gradients of k and v from a loss that ignores the row),
    or a finite row that reads the keys it may not see (a ``finfo.min`` mask: uniform weights)."""
    g = torch.Generator().manual_seed(0)
    t, row = 6, 3
    q, k, v = (torch.randn(1, 2, t, 8, generator=g).to(dtype).requires_grad_() for _ in range(3))
    allowed = torch.ones(t, t, dtype=torch.bool).tril()
    allowed[row] = False
    try:
        out = first_output(attn(q, k, v, allowed))
        keep = torch.ones(t, dtype=torch.bool)
        keep[row] = False
        out[..., keep, :].float().sum().backward()  # a loss that ignores the empty row
    except Exception as exc:  # noqa: BLE001
        return [crash_finding(_("attention with a fully masked row"), exc)]
    where = _("(causal mask [{t}, {t}] in which query {row} may see no key, {dtype})").format(t=t, row=row,
                                                                                           dtype=str(dtype).replace("torch.", ""))
    if torch.isnan(out[..., row, :]).any():
        leaked = [n for n, x in (("k", k), ("v", v)) if x.grad is not None and torch.isnan(x.grad).any()]
        spread = _(" A loss that ignores that row still gets NaN gradients for {names}: 0 · NaN is NaN.").format(
            names=", ".join(leaked)) if leaked else ""
        return [found(Pitfall.EMPTY_ROW_INF_MASK, _("a fully masked row gives NaN"),
                      _("the output of query {row} is NaN: every score of its row is -inf, and softmax divides 0 by 0.{spread}")
                      .format(row=row, spread=spread), where=where)]
    mean_v = v.detach().float().mean(-2)  # [1, 2, 8]: uniform weights over every key
    if not torch.allclose(out[..., row, :].detach().float(), torch.zeros_like(mean_v), atol=1e-3) and \
            torch.allclose(out[..., row, :].detach().float(), mean_v, atol=1e-2):
        return [found(Pitfall.EMPTY_ROW_INF_MASK, _("a fully masked row reads the keys it may not see"),
                      _("the output of query {row} is the mean of all values: its scores, all finfo.min, become uniform weights over "
                        "the keys it may not see (the future ones too).").format(row=row), where=where,
                      fix=_("give a row that may see nothing zero weights and a zero output (weights.masked_fill(~allowed.any(-1, "
                            "keepdim=True), 0)), or let every query see at least itself"))]
    return []


def diagnose_grad_underflow(model: torch.nn.Module, loss_fn: Callable[[torch.nn.Module], torch.Tensor], *,
                            dtype: torch.dtype = torch.float16, scale: float = 2.0**16) -> list[Finding]:
    """Names ``FP16_NO_GRAD_SCALER`` when an autocast backward in ``dtype`` leaves gradient entries exactly zero that
    fp32 does not, and scaling the loss by ``scale`` (what ``GradScaler`` does) brings them back."""
    u = gradient_underflow(model, loss_fn, dtype=dtype, scale=scale)
    if u.lost <= u.lost_scaled:
        return []
    fix = _("scaler = torch.amp.GradScaler(); scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()")
    device = next(model.parameters()).device
    if device.type == "cpu" or (device.type == "cuda" and torch.cuda.is_bf16_supported()):
        fix += _(" — or train in bf16, which has fp32's range and needs no scaler")
    return [found(Pitfall.FP16_NO_GRAD_SCALER, _("{dtype} gradients underflow to zero").format(dtype=u.dtype),
                  _("{lost:,} of {total:,} gradient entries ({share:.2%}) are exactly zero in the {dtype} backward but not in fp32 "
                    "(relative error of the gradient {err:.1e}); with the loss scaled by {scale:g}, {lost_scaled:,} are (error "
                    "{err_scaled:.1e}).").format(lost=u.lost, total=u.total, share=u.lost / u.total, dtype=u.dtype, err=u.error,
                                                 scale=u.scale, lost_scaled=u.lost_scaled, err_scaled=u.error_scaled), fix=fix)]


def diagnose_timings(times_ms: Sequence[float], *, compiled: bool = False, factor: float = 10.0) -> list[Finding]:
    """``times_ms``: one duration per call, in the order they ran. A call more than ``factor`` times the median of
    the others is a compile (``compiled=True``: ``COMPILED_FIRST_CALL``; a later one: a recompilation) or a cold
    start (``COLD_TIMING``)."""
    if len(times_ms) < 3:
        raise ValueError(_("diagnose_timings needs at least 3 timed calls, got {n}").format(n=len(times_ms)))
    rest = statistics.median(times_ms[1:])
    mean, slow = statistics.fmean(times_ms), [i for i, t in enumerate(times_ms) if t > factor * rest]
    if not slow:
        return []
    first = times_ms[0] > factor * rest
    said = _("call {i} took {t:,.1f} ms, {ratio:,.0f}× the median of the others ({median:.3f} ms); the mean of all {n} calls is "
             "{mean:,.2f} ms, {mean_ratio:,.1f}× that median.").format(i=slow[0] + 1, t=times_ms[slow[0]], ratio=times_ms[slow[0]] / rest,
                                                                      median=rest, n=len(times_ms), mean=mean, mean_ratio=mean / rest)
    if compiled and first:
        return [found(Pitfall.COMPILED_FIRST_CALL, _("the compile is timed as a call"), said + " " +
                      _("The first call of a compiled model traces and compiles it."))]
    if compiled:
        return [found(Pitfall.COMPILED_FIRST_CALL, _("a recompilation is timed as a call"), said + " " +
                      _("A later slow call of a compiled model is a recompilation (new shapes or dtypes)."),
                      fix=_("time each input shape after its own warm-up call, or compile with dynamic=True"))]
    if first:
        return [found(Pitfall.COLD_TIMING, _("the first call is timed"), said)]
    return [found(Pitfall.GENERAL, _("an outlier call"), said,
                  fix=_("report the median and the p99 of many calls with their conditions (tinytf.benchmark), not the mean"))]
