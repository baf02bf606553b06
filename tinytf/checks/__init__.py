"""Diagnostics that name the mistake: property checks for attention, causal masks, blocks and the LM loss.

The usual bugs in attention code are silent — the shapes are right and the numbers are wrong. Each
``diagnose_*`` function here treats your code as a black box, feeds it several random inputs and shapes
(``Tq != Tk``, ``d_head != D``, ``B > 1``, several seeds), compares the answers with references and
with *deliberately wrong* references, and returns a list of :class:`Finding` (empty when nothing is
wrong). ``Finding.pitfall`` is the number of the mistake in chapter 08 (the article's list):

====  =========================================================
 0    not one of the fourteen: the code raised, returned the wrong type, changed its inputs, ...
 1    missing or wrong ``1/sqrt(d_head)`` scaling
 2    ``q @ kᵀ`` orientation and the shape contract (softmax over the wrong axis, wrong output shape)
 3    mask applied after the softmax, not applied, or with the inverted convention
 4    causal mask off by one (or leaking the future)
 5    ``dim`` not divisible by ``heads``                     (no detector: tinytf raises)
 6    ``view`` after ``transpose``                           (no detector: PyTorch raises)
 7    normalising across the batch (BatchNorm) instead of the features (LayerNorm)
 8    a residual branch that changes the shape
 9    ``train()`` / ``eval()`` / ``no_grad`` confusion (dropout on in eval, tied to autograd)
10    hand-written attention in production                   (no detector: measure memory)
11    KV-cache misconceptions                                (no detector: measure it)
12    first-run CPU timing taken as performance              (no detector: time it warm)
13    language-model targets not shifted
14    padding tokens counted in the loss or its denominator
====  =========================================================

Usage::

    from tinytf.checks import diagnose_attention, report
    print(report(diagnose_attention(my_attention)))

Every detector catches exceptions from the code under test and turns them into a finding, so a
half-written function (``raise NotImplementedError``) is diagnosed, not crashed on.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .catalog import CATALOG, PITFALLS, Pitfall

__all__ = [
    "Finding",
    "PITFALLS",
    "Pitfall",
    "CATALOG",
    "report",
    "diagnose_attention",
    "diagnose_causal_mask",
    "diagnose_block",
    "diagnose_lm_loss",
]



@dataclass(frozen=True)
class Finding:
    """One diagnosed problem: ``pitfall`` (chapter-08 number, 0 = general), a short ``title`` and a
    ``message`` that explains the evidence and the fix."""

    pitfall: Pitfall
    title: str
    message: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "pitfall", Pitfall(self.pitfall))  # a plain int from JSON becomes its name

    def __str__(self) -> str:
        tag = f"pitfall {int(self.pitfall)}" if self.pitfall else "problem"
        return f"[{tag}] {self.title}: {self.message}"


def report(findings: Iterable[Finding], *, name: str | None = None) -> str:
    """A readable summary of ``findings`` (one paragraph per finding); says so when there are none."""
    findings = list(findings)
    head = f"{name}: " if name else ""
    if not findings:
        return f"{head}OK - no problems found."
    lines = [f"{head}{len(findings)} problem{'s' if len(findings) > 1 else ''} found:"]
    for f in findings:
        tag = f.pitfall.label()
        lines.append(f"  x [{tag}] {f.title}")
        lines.append(f"      {f.message}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _one_thread():
    """Run the (tiny) probes on one CPU thread: much faster than many threads fighting over small ops."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _quietly(diagnose: Callable[..., list[Finding]]) -> Callable[..., list[Finding]]:
    """Run a detector on one thread, with the global RNG state restored afterwards."""

    @functools.wraps(diagnose)
    def wrapper(*args, **kwargs):
        cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
        with _one_thread(), torch.random.fork_rng(devices=cuda):
            return diagnose(*args, **kwargs)

    return wrapper


def _err(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0].rstrip(".") if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _crash(what: str, exc: BaseException, pitfall: int = 0, hint: str = "") -> Finding:
    if isinstance(exc, NotImplementedError):
        return Finding(0, f"{what} is not implemented yet", f"it raised {_err(exc)}. Fill in the TODO and run the check again.")
    return Finding(pitfall, f"{what} raised an exception", f"it raised {_err(exc)}.{(' ' + hint) if hint else ''}")


def _as_tensor(out):
    """Accept ``out`` or ``(out, weights)``."""
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return out


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-4) -> bool:
    if a.shape != b.shape:
        return False
    a, b = a.detach().double(), b.detach().double()
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return bool(torch.equal(torch.isnan(a), torch.isnan(b)) and torch.allclose(a.nan_to_num(0.0), b.nan_to_num(0.0), atol=tol))
    return bool(torch.allclose(a, b, atol=tol, rtol=tol))


def _maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double() - b.detach().double()).abs().max())


# ---------------------------------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------------------------------
# (B, H, Tq, Tk, d): Tq != Tk, d_head != D = H*d, B > 1; the square probe lets transposed code run.
_ATTN_SHAPES = ((2, 3, 5, 7, 8), (3, 2, 6, 6, 4), (2, 4, 3, 9, 16))


def _variant(q, k, v, mask=None, *, scale, orient="qk", axis=-1, mask_mode="before", invert=False):
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


def _rand_mask(shape: Sequence[int], gen: torch.Generator) -> torch.Tensor:
    """Random bool mask whose every row (last axis) has at least one True and one False."""
    m = torch.rand(*shape, generator=gen) < 0.5
    n = shape[-1]
    idx = torch.randint(0, n, (*shape[:-1], 1), generator=gen)
    m = m.scatter(-1, idx, True)
    m = m.scatter(-1, (idx + 1 + torch.randint(0, n - 1, idx.shape, generator=gen)) % n, False)
    return m


def _scale_name(scale: float, d: int, h: int) -> str | None:
    for value, name in ((1 / math.sqrt(d), "1/sqrt(d_head)"), (1.0, "1 (no scaling)"), (1 / math.sqrt(h * d), "1/sqrt(D) (total dim)"),
                        (1 / d, "1/d_head"), (math.sqrt(d), "sqrt(d_head) (multiplied)")):
        if abs(scale - value) < 1e-3 * max(1.0, value):
            return name
    return None


def _fit_scale(out: torch.Tensor, q, k, v) -> tuple[float, float]:
    """The scale ``s`` for which ``softmax(q kᵀ s) v`` best matches ``out``: grid over log s, then refine."""
    def err(log_s: float) -> float:
        return _maxdiff(out, _variant(q, k, v, scale=math.exp(log_s)))

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


_CORE_TITLES = {
    ("qk", -1): None,
    ("kq", -1): (2, "transposed scores: k @ qᵀ instead of q @ kᵀ"),
    ("qk", -2): (2, "softmax over the query axis: weight rows do not sum to one"),
    ("kq", -2): (2, "transposed scores and softmax over the wrong axis"),
}


@_quietly
def diagnose_attention(fn: Callable, *, seeds: Sequence[int] = (0, 1), tol: float = 1e-4) -> list[Finding]:
    """Diagnose ``fn(q, k, v, mask=None) -> out``: q ``[B, H, Tq, d]``, k/v ``[B, H, Tk, d]``,
    out ``[B, H, Tq, d]``; ``mask`` bool broadcastable to ``[B, H, Tq, Tk]``, True = may attend.

    Probes several shapes (Tq != Tk, d_head != D, B > 1) and ``seeds``. Catches: missing or wrong
    scaling (1; it names the scale your code behaves like: none, 1/sqrt(D), 1/d, ...), transposed
    scores and softmax over the wrong axis (2), wrong output shapes (2), masks applied after the
    softmax, ignored, multiplied into the scores or with the inverted convention (3), rows of
    weights that do not sum to one, and exceptions (0).
    """
    findings: list[Finding] = []
    gen = torch.Generator().manual_seed(1234)
    probes = []  # (q, k, v, H, d, seed)
    for seed in seeds:
        gen.manual_seed(1000 + seed)
        for b, h, tq, tk, d in _ATTN_SHAPES:
            q, k, v = (torch.randn(b, h, t, d, generator=gen) for t in (tq, tk, tk))
            probes.append((q, k, v, h, d))

    # 1. unmasked calls: crashes, shapes, in-place edits --------------------------------------------------
    ok, crashed = [], []
    for q, k, v, h, d in probes:
        args = (q.clone(), k.clone(), v.clone())
        try:
            out = _as_tensor(fn(*args))
        except Exception as exc:  # noqa: BLE001 - student code may raise anything
            crashed.append(((q, k, v), exc))
            continue
        if not all(torch.equal(a, b) for a, b in zip(args, (q, k, v))):
            findings.append(Finding(0, "modifies its inputs in place",
                                    "q, k or v changed after the call (an in-place op such as q.mul_() or q *= ...). "
                                    "Use out-of-place ops: q = q * scale."))
        if not isinstance(out, torch.Tensor):
            return findings + [Finding(0, "does not return a tensor", f"expected a tensor [B, H, Tq, d], got {type(out).__name__}.")]
        ok.append(((q, k, v, h, d), out))
    if crashed:
        (q, k, v), exc = crashed[0]
        square_ok = any(p[0].size(-2) == p[1].size(-2) for p, _ in ok)
        shape_err = isinstance(exc, RuntimeError) and any(w in str(exc) for w in ("size", "shape", "dimension"))
        hint = ""
        if shape_err:
            hint = (f"With q {list(q.shape)} and k {list(k.shape)} the scores must be q @ k.transpose(-2, -1) -> "
                    f"[..., Tq={q.size(-2)}, Tk={k.size(-2)}]; print every intermediate shape.")
            if square_ok:
                hint = "It works when Tq == Tk but not when Tq != Tk: the scores are oriented the wrong way. " + hint
        findings.append(_crash(f"attention with q {list(q.shape)}, k/v {list(k.shape)}", exc, 2 if shape_err else 0, hint))
        if not ok:
            return findings

    bad_shape = [(p, o) for p, o in ok if o.shape != p[0].shape[:-1] + (p[2].size(-1),)]
    if bad_shape:
        (q, k, v, h, d), out = bad_shape[0]
        want = [*q.shape[:-1], v.size(-1)]
        got = list(out.shape)
        why = ""
        if got == [*q.shape[:-1], k.size(-2)]:
            why = " That is the shape of the attention weights: multiply them by v."
        elif got == [*q.shape[:-2], k.size(-2), v.size(-1)]:
            why = " It has Tk rows instead of Tq: the scores are transposed (use q @ k.transpose(-2, -1))."
        elif len(got) == 3 and got[-1] == q.size(1) * q.size(-1):
            why = " The heads were merged; this function should return per-head outputs [B, H, Tq, d]."
        return findings + [Finding(2, "wrong output shape", f"for q {list(q.shape)} and k/v {list(k.shape)} it returned {got}, "
                                   f"expected {want} = [B, H, Tq, d].{why}")]
    if any(not torch.isfinite(o).all() for _, o in ok):
        findings.append(Finding(0, "non-finite output without a mask", "the output holds NaN or inf for ordinary random inputs."))
        return findings

    # 2. the core: scale, orientation, softmax axis -----------------------------------------------------
    def matches(**kw) -> bool:
        for (q, k, v, h, d), out in ok:
            if kw.get("orient") == "kq" and q.size(-2) != k.size(-2):
                return False
            scale = kw["scale"](d, h)
            if not _close(out, _variant(q, k, v, **{**kw, "scale": scale}), tol):
                return False
        return True

    scales = [
        (lambda d, h: 1 / math.sqrt(d), None),
        (lambda d, h: 1.0, (1, "missing scaling", "the output matches softmax(q kᵀ) v with no scaling. Multiply the scores by "
                                                  "1/sqrt(d_head) (q.size(-1)) so their spread does not grow with the head width.")),
        (lambda d, h: 1 / math.sqrt(h * d), (1, "scaled by the total dim, not the head dim",
                                             "the output matches a scale of 1/sqrt(H * d_head) = 1/sqrt(D). Scale by the width of "
                                             "one head: 1/sqrt(q.size(-1)).")),
        (lambda d, h: 1 / d, (1, "scaled by 1/d_head instead of 1/sqrt(d_head)", "take the square root: 1/math.sqrt(q.size(-1)).")),
        (lambda d, h: math.sqrt(d), (1, "multiplied by sqrt(d_head) instead of dividing", "the scale must be 1/sqrt(d_head).")),
    ]
    core = None  # (scale_fn, orient, axis)
    square_only = all(p[0].size(-2) == p[1].size(-2) for p, _ in ok)
    for (orient, axis), core_problem in _CORE_TITLES.items():
        if orient == "kq" and not square_only:
            continue
        for scale_fn, scale_problem in scales:
            if matches(scale=scale_fn, orient=orient, axis=axis):
                core = (scale_fn, orient, axis)
                if scale_problem:
                    findings.append(Finding(*scale_problem))
                if core_problem:
                    pit, title = core_problem
                    msg = ("the output matches softmax(k qᵀ) v: the scores are [Tk, Tq], not [Tq, Tk]. Use q @ k.transpose(-2, -1)."
                           if orient == "kq" else
                           "the output matches weights normalised over the queries (softmax(dim=-2)). The softmax must run over the "
                           "keys, the last axis, so each query's weights sum to one.")
                    if square_only:
                        msg += " (It also only ran when Tq == Tk.)"
                    findings.append(Finding(pit, title, msg))
                break
        if core is not None:
            break

    if core is None:
        # Not one of the named mistakes: fit the scale per head shape, then check the properties one by one.
        fitted: dict[tuple[int, int], float] = {}
        for (q, k, v, h, d), out in ok:
            if (h, d) not in fitted:
                fitted[(h, d)] = _fit_scale(out, q, k, v)[0]
        fits = all(_close(o, _variant(p[0], p[1], p[2], scale=fitted[(p[3], p[4])]), 1e-3) for p, o in ok)
        if fits:
            found = sorted((d, s_) for (_, d), s_ in fitted.items())
            table = ", ".join(f"d_head={d}: s={s_:.4g} (want {1 / math.sqrt(d):.4g})" for d, s_ in found)
            ratios = [s_ * math.sqrt(d) for d, s_ in found]
            values = [s_ for _, s_ in found]
            if max(values) - min(values) < 1e-2 * max(values):
                why = (f" The scale is the same constant {values[0]:.4g} for every head width: a hard-coded number"
                       f"{f' (1/sqrt({round(values[0] ** -2)}))' if abs(values[0] ** -2 - round(values[0] ** -2)) < 1e-2 else ''}. "
                       "Compute it from the tensor: 1/math.sqrt(q.size(-1)).")
            elif max(ratios) - min(ratios) < 1e-2 * max(ratios):
                why = f" It is {ratios[0]:.4g} x 1/sqrt(d_head): an extra constant factor (scaled q or k, or the scale applied twice?)."
            else:
                why = " Use 1/sqrt(d_head) = 1/math.sqrt(q.size(-1))."
            findings.append(Finding(1, "wrong scaling", f"the output matches softmax(q kᵀ · s) v with {table}.{why}"))
            core = (lambda d_, h_: fitted[(h_, d_)], "qk", -1)
        else:
            (q, k, v, h, d), _ = ok[0]
            ones = torch.ones_like(v)
            try:
                row_sums = _as_tensor(fn(q.clone(), k.clone(), ones))
                if isinstance(row_sums, torch.Tensor) and row_sums.shape == ones.shape[:-2] + (q.size(-2), v.size(-1)) \
                        and not torch.allclose(row_sums, torch.ones_like(row_sums), atol=1e-4):
                    findings.append(Finding(2, "weight rows do not sum to one",
                                            f"with v = ones the output should be all ones (each query's weights sum to 1); it ranges over "
                                            f"[{float(row_sums.min()):.3g}, {float(row_sums.max()):.3g}]. Apply softmax over the last axis "
                                            "(the keys) and nothing after it."))
            except Exception:  # noqa: BLE001
                pass
            perm = torch.randperm(k.size(-2), generator=gen)
            try:
                out_p = _as_tensor(fn(q.clone(), k[..., perm, :].clone(), v[..., perm, :].clone()))
                if not _close(out_p, ok[0][1], 1e-4):
                    findings.append(Finding(2, "depends on the order of the keys",
                                            "shuffling k and v together (the same permutation) changed the output; attention without a "
                                            "mask treats the keys as a set. Check the orientation of q @ kᵀ and the softmax axis."))
            except Exception:  # noqa: BLE001
                pass
            worst = max(_maxdiff(o, _variant(p[0], p[1], p[2], scale=1 / math.sqrt(p[4]))) for p, o in ok)
            findings.append(Finding(0, "output differs from softmax(q kᵀ / sqrt(d)) v",
                                    f"largest difference {worst:.3g} over {len(ok)} random probes, and it is none of the known "
                                    "mistakes. Compare your intermediates with tinytf.scaled_dot_product_attention step by step."))
            return findings

    # 3. masks ------------------------------------------------------------------------------------------
    scale_fn, orient, axis = core
    masked = []  # (q, k, v, h, d, mask)
    for (q, k, v, h, d), _ in ok:
        b, _, tq, _ = q.shape
        tk = k.size(-2)
        if orient == "kq" and tq != tk:
            continue
        for shape in ((b, 1, tq, tk), (b, 1, 1, tk), (tq, tk)):
            masked.append((q, k, v, h, d, _rand_mask(shape, gen)))
    outs = []
    for q, k, v, _h, _d, m in masked:
        try:
            o = _as_tensor(fn(q.clone(), k.clone(), v.clone(), m.clone()))
        except Exception as exc:  # noqa: BLE001
            return findings + [_crash(f"attention with a bool mask {list(m.shape)} (q {list(q.shape)}, k {list(k.shape)})", exc, 3,
                                      "fn(q, k, v, mask) must accept a bool mask broadcastable to [B, H, Tq, Tk], True = may attend.")]
        if not isinstance(o, torch.Tensor) or o.shape != q.shape[:-1] + (v.size(-1),):
            got = list(o.shape) if isinstance(o, torch.Tensor) else type(o).__name__
            return findings + [Finding(2, "wrong output shape with a mask", f"with mask {list(m.shape)} it returned {got}, expected "
                                       f"{[*q.shape[:-1], v.size(-1)]}.")]
        outs.append(o)

    def mask_matches(mode: str, invert: bool) -> bool:
        for (q, k, v, h, d, m), o in zip(masked, outs):
            ref = _variant(q, k, v, m, scale=scale_fn(d, h), orient=orient, axis=axis, mask_mode=mode, invert=invert)
            if not _close(o, ref, tol):
                return False
        return True

    if mask_matches("before", False):
        return findings
    if any(not torch.isfinite(o).all() for o in outs):
        findings.append(Finding(3, "non-finite output with a mask",
                                "the output holds NaN or inf although every query may attend to at least one key. Filling blocked "
                                "*weights* with -inf after the softmax does this: fill the *scores* with -inf before the softmax."))
        return findings
    named = [
        ("ignored", False, "mask ignored", "the output is the same as without a mask. Apply it: scores.masked_fill(~mask, float('-inf')) "
                                           "before the softmax."),
        ("after", False, "mask applied after the softmax", "the output matches softmax(scores) * mask: blocked weights are zeroed "
                                                           "afterwards, so the remaining ones no longer sum to one. Fill the scores with "
                                                           "-inf before the softmax instead."),
        ("multiply", False, "mask multiplied into the scores", "blocked scores become 0, not -inf, so exp(0) still gives them weight. Use "
                                                               "scores.masked_fill(~mask, float('-inf')) before the softmax."),
        ("before", True, "inverted mask convention", "your code blocks the positions where mask is True. In tinytf (and "
                                                     "F.scaled_dot_product_attention) a bool mask means True = MAY attend: fill where "
                                                     "~mask."),
        ("after", True, "inverted mask convention, applied after the softmax", "True means MAY attend, and the mask must be applied "
                                                                               "to the scores before the softmax."),
        ("multiply", True, "inverted mask multiplied into the scores", "True means MAY attend; fill blocked scores with -inf."),
    ]
    for mode, invert, title, msg in named:
        if mask_matches(mode, invert):
            return findings + [Finding(3, title, msg)]

    # Generic property checks with a key-padding mask [B, 1, 1, Tk].
    for (q, k, v, _h, _d, m), o in zip(masked, outs):
        if m.shape[1:3] != (1, 1):
            continue
        blocked = ~m[:, 0, 0, :, None]  # [B, Tk, 1]
        k2 = torch.where(blocked[:, None], torch.randn_like(k) * 3, k)
        v2 = torch.where(blocked[:, None], torch.randn_like(v) * 3, v)
        try:
            o2 = _as_tensor(fn(q.clone(), k2, v2, m.clone()))
        except Exception:  # noqa: BLE001
            break
        if not _close(o, o2, tol):
            return findings + [Finding(3, "blocked keys leak into the output",
                                       "changing k and v at positions the key-padding mask blocks changed the output. Fill the blocked "
                                       "scores with -inf before the softmax (True = may attend).")]
        break
    return findings + [Finding(3, "masked output differs from the reference",
                               "with a bool mask (True = may attend) the output differs from masked softmax attention, and not in one of "
                               "the known ways. Compare with tinytf.scaled_dot_product_attention(q, k, v, mask).")]


# ---------------------------------------------------------------------------------------------------
# causal masks
# ---------------------------------------------------------------------------------------------------
@_quietly
def diagnose_causal_mask(fn: Callable[[int], torch.Tensor], *, sizes: Sequence[int] = (1, 2, 4, 7)) -> list[Finding]:
    """Diagnose ``fn(T) -> bool [T, T]`` (True = may attend: query i sees keys 0..i).

    Catches the off-by-one diagonal in both directions (4: the diagonal blocked, or one future token
    let through), the inverted convention (True = blocked), a transposed mask (future instead of
    past), a non-bool dtype, wrong shapes and exceptions.
    """
    findings: list[Finding] = []
    masks = {}
    for t in sizes:
        try:
            m = fn(t)
        except Exception as exc:  # noqa: BLE001
            return [_crash(f"causal mask for T={t}", exc)]
        if not isinstance(m, torch.Tensor):
            return [Finding(0, "does not return a tensor", f"fn({t}) returned {type(m).__name__}; expected a bool tensor [{t}, {t}].")]
        if tuple(m.shape) != (t, t):
            return [Finding(4, "wrong mask shape", f"fn({t}) returned shape {list(m.shape)}; expected [{t}, {t}] "
                                                  "(query rows, key columns). A mask built for a fixed size does not follow T.")]
        masks[t] = m
    first = next(iter(masks.values()))
    if first.dtype != torch.bool:
        additive = first.is_floating_point() and any(bool(torch.isinf(m).any()) for m in masks.values())
        findings.append(Finding(4, "mask is not boolean",
                                f"it has dtype {first.dtype}" + (" and -inf entries: an additive mask" if additive else "") +
                                ". tinytf expects bool with True = may attend (torch.ones(T, T, dtype=torch.bool).tril()). "
                                "The rest of this diagnosis reads it as " + ("0 = allowed." if additive else "nonzero = True.")))
        masks = {t: (m == 0) if additive else (m != 0) for t, m in masks.items()}

    def is_(make) -> bool:
        return all(torch.equal(m.cpu(), make(t)) for t, m in masks.items())

    tril = lambda t, k=0: torch.ones(t, t, dtype=torch.bool).tril(k)  # noqa: E731
    if is_(tril):
        return findings
    if is_(lambda t: tril(t).T) and max(sizes) > 1:
        return findings + [Finding(4, "transposed causal mask", "query i may see keys i..T-1 (the future) instead of 0..i (the past). "
                                                               "Use .tril(), not .triu(), for the allowed positions.")]
    for k in (-2, -1, 1, 2):
        if is_(lambda t, k=k: tril(t, k)):
            if k < 0:
                return findings + [Finding(4, "off by one: the diagonal is blocked",
                                           f"query i may only see keys 0..i{k}, not itself (tril(diagonal={k})). Row 0 then has nothing to "
                                           "attend to (NaN after the softmax). Use tril(diagonal=0) for the allowed positions, i.e. "
                                           "block only triu(diagonal=1).")]
            return findings + [Finding(4, "off by one: the future leaks",
                                       f"query i may see keys 0..i+{k} (tril(diagonal={k})): {k} future token{'s' if k > 1 else ''} per "
                                       "position leak in. Use tril(diagonal=0) for the allowed positions.")]
    for k in (0, -1, 1, -2, 2):
        if is_(lambda t, k=k: ~tril(t, k)):
            extra = "" if k == 0 else (f" It is also off by {abs(k)}: the blocked part should be triu(diagonal=1), "
                                       f"it is triu(diagonal={k + 1}).")
            return findings + [Finding(4, "inverted convention: True marks blocked positions",
                                       "the mask is True where the future is (the *blocked* positions). In tinytf and "
                                       "F.scaled_dot_product_attention a bool mask means True = MAY attend: return ~mask, i.e. "
                                       f"torch.ones(T, T, dtype=torch.bool).tril().{extra}")]
    t = max(masks)
    m, ref = masks[t].cpu(), tril(t)
    leak = (m & ~ref).nonzero().tolist()
    miss = (~m & ref).nonzero().tolist()
    parts = []
    if leak:
        parts.append(f"future positions allowed (query, key): {leak[:4]}")
    if miss:
        parts.append(f"past or present positions blocked: {miss[:4]}")
    return findings + [Finding(4, "not a causal mask",
                               f"for T={t}: " + "; ".join(parts) + ". Expected torch.ones(T, T, dtype=bool).tril().")]


# ---------------------------------------------------------------------------------------------------
# blocks
# ---------------------------------------------------------------------------------------------------
_DIM_ATTRS = ("dim", "d_model", "embed_dim", "hidden_size", "n_embd", "width")
_LEN_ATTRS = ("max_tokens", "block_size", "max_len", "max_seq_len", "context_length")


def _infer_dim(module: nn.Module) -> int | None:
    """D from ``module.dim``-like attributes, else the first LayerNorm / BatchNorm / Linear inside it."""
    for name in _DIM_ATTRS:
        val = getattr(module, name, None)
        if isinstance(val, int) and not isinstance(val, bool) and val > 0:
            return val
    for sub in module.modules():
        if isinstance(sub, nn.LayerNorm):
            return int(sub.normalized_shape[-1])
        if isinstance(sub, nn.modules.batchnorm._BatchNorm):
            return int(sub.num_features)
        if isinstance(sub, nn.Linear):
            return int(sub.in_features)
        for name in _DIM_ATTRS:
            val = getattr(sub, name, None)
            if sub is not module and isinstance(val, int) and not isinstance(val, bool) and val > 0:
                return val
    return None


def _max_len(module: nn.Module) -> int | None:
    for sub in module.modules():
        for name in _LEN_ATTRS:
            val = getattr(sub, name, None)
            if isinstance(val, int) and not isinstance(val, bool) and val > 0:
                return val
    return None


def _forward(m: nn.Module, x: torch.Tensor, seed: int, *, grad: bool = True) -> torch.Tensor:
    torch.manual_seed(seed)
    with torch.set_grad_enabled(grad):
        out = _as_tensor(m(x))  # a module may return (out, extras)
        return out.detach() if isinstance(out, torch.Tensor) else out


@_quietly
def diagnose_block(factory: Callable[[], nn.Module], *, dim: int | None = None, tokens: int = 6, batch: int = 3,
                   seeds: Sequence[int] = (0, 1)) -> list[Finding]:
    """Diagnose a causal block: ``factory() -> nn.Module`` with ``module(x)`` ``[B, T, D] -> [B, T, D]``.

    The module is called with ``x`` only (extra arguments such as ``mask`` keep their defaults).
    D is ``dim`` when given, else inferred from the module: an int attribute ``dim`` / ``d_model`` /
    ``embed_dim`` / ``hidden_size`` / ``n_embd``, else the first ``LayerNorm``, ``BatchNorm`` or
    ``Linear`` inside it. T is ``tokens``, capped by a ``max_tokens``-like attribute.

    Catches: future positions leaking into earlier ones (4), normalisation across the batch —
    BatchNorm, or LayerNorm over the time axis (7), a residual branch that changes the shape (8),
    dropout that stays on in ``eval()``, or dropout switched by ``no_grad`` instead of
    ``train()``/``eval()`` (9), and exceptions.
    """
    findings: list[Finding] = []
    try:
        torch.manual_seed(0)
        m = factory()
    except Exception as exc:  # noqa: BLE001
        return [_crash("factory()", exc)]
    if not isinstance(m, nn.Module):
        return [Finding(0, "factory() did not return an nn.Module", f"got {type(m).__name__}.")]
    d = dim if dim is not None else _infer_dim(m)
    if d is None:
        return [Finding(0, "cannot infer the model width D", "no dim-like attribute, LayerNorm or Linear found; call "
                                                               "diagnose_block(factory, dim=D).")]
    limit = _max_len(m)
    t = min(tokens, limit) if limit else tokens
    p = next(m.parameters(), None)
    dev, dt = (p.device, p.dtype) if p is not None else (torch.device("cpu"), torch.float32)
    gen = torch.Generator().manual_seed(7 + seeds[0])
    x = torch.randn(batch, t, d, generator=gen).to(dev, dt)
    tol = 1e-5

    # 8: shape (and crashes) -----------------------------------------------------------------------------
    m.eval()
    try:
        out = _forward(m, x, 0)
    except Exception as exc:  # noqa: BLE001
        shape_err = isinstance(exc, RuntimeError) and ("must match the size" in str(exc) or "size of tensor" in str(exc))
        hint = ("A residual sum x + branch(x) needs the branch to return [B, T, D]; a widened FFN (D -> 4D) must project "
                "back to D before the addition." if shape_err else "")
        return [_crash(f"block on x {list(x.shape)}", exc, 8 if shape_err else 0, hint)]
    if not isinstance(out, torch.Tensor):
        return [Finding(0, "block does not return a tensor", f"got {type(out).__name__}; expected [B, T, D].")]
    if out.shape != x.shape:
        return [Finding(8, "output shape differs from the input", f"x {list(x.shape)} -> {list(out.shape)}. A block maps [B, T, D] -> "
                                                                  "[B, T, D]: every residual branch (attention, FFN) must end in D "
                                                                  "features; the FFN's 4D is only its hidden width.")]

    # 9: eval() must be deterministic, with and without grad --------------------------------------------
    eval_rand = not torch.allclose(out, _forward(m, x, 1), atol=tol)
    eval_rand_ng = not torch.allclose(_forward(m, x, 0, grad=False), _forward(m, x, 1, grad=False), atol=tol)
    if eval_rand and not eval_rand_ng:
        findings.append(Finding(9, "dropout switched by autograd, not by eval()",
                                "in eval() the output is random with gradients enabled but deterministic under torch.no_grad(). "
                                "Gate dropout on self.training (nn.Dropout does), not on torch.is_grad_enabled(); "
                                "no_grad/inference_mode do not replace model.eval()."))
    elif eval_rand:
        findings.append(Finding(9, "dropout stays on in eval()",
                                "two calls on the same input in eval() gave different outputs. Use nn.Dropout modules (or "
                                "F.dropout(x, p, training=self.training)); F.dropout defaults to training=True."))
    else:
        m.train()
        train_rand = not torch.allclose(_forward(m, x, 0), _forward(m, x, 1), atol=tol)
        train_rand_ng = not torch.allclose(_forward(m, x, 0, grad=False), _forward(m, x, 1, grad=False), atol=tol)
        if train_rand and not train_rand_ng:
            findings.append(Finding(9, "no_grad changes training behaviour",
                                    "in train() the output is random (dropout) with gradients but deterministic under torch.no_grad(). "
                                    "Dropout must follow self.training only."))
        m.eval()

    # 7: batch mixing, in eval and (seeded) in train ----------------------------------------------------
    x_other = x.clone()
    x_other[1:] = torch.randn(x[1:].shape, generator=gen).to(dev, dt)
    bns = [name or type(sub).__name__ for name, sub in m.named_modules() if isinstance(sub, nn.modules.batchnorm._BatchNorm)]
    mixed = None
    for mode in ("eval", "train"):
        trial = factory() if mode == "train" else m  # a fresh module: train-mode BatchNorm updates its running stats
        trial.to(dev)
        trial.train(mode == "train")
        try:
            a, b = _forward(trial, x, 3), _forward(trial, x_other, 3)
        except Exception:  # noqa: BLE001
            continue
        if not torch.allclose(a[0], b[0], atol=tol):
            mixed = mode
            break
    if mixed or bns:
        where = f" It contains {', '.join(bns)}." if bns else ""
        msg = (f"in {mixed}() the output for sequence 0 changed when only the *other* sequences of the batch changed: the block "
               "normalises (or mixes) across the batch." if mixed else "the block holds batch-statistics normalisation.")
        findings.append(Finding(7, "normalises across the batch instead of the features",
                                msg + where + " A Transformer uses nn.LayerNorm(D): statistics over each token's own D features, the "
                                "same in train and eval, independent of the batch."))

    # 4: future leakage (eval, fixed dropout seed), one perturbed position at a time, several inputs ------
    m.eval()
    leaks = set()  # (query i, key j > i)
    for seed in seeds:
        x = torch.randn(batch, t, d, generator=gen.manual_seed(100 + seed)).to(dev, dt)
        base = _forward(m, x, 0)
        if not torch.isfinite(base).all():
            findings.append(Finding(4, "non-finite output", "the block outputs NaN or inf. A causal mask that blocks the diagonal "
                                                            "leaves row 0 with nothing to attend to: softmax over all -inf is NaN."))
            return findings
        for j in range(1, t):
            x2 = x.clone()
            x2[:, j] += torch.randn(x2[:, j].shape, generator=gen).to(dev, dt)
            try:
                out2 = _forward(m, x2, 0)
            except Exception:  # noqa: BLE001
                break
            changed = (out2 - base).abs().amax(dim=(0, 2)) > tol * (1 + float(base.abs().max()))  # [T]
            leaks |= {(i, j) for i in range(j) if bool(changed[i])}
    leaks = sorted(leaks)
    if leaks:
        reach = max(j - i for i, j in leaks)
        wide_ln = [name for name, sub in m.named_modules() if isinstance(sub, nn.LayerNorm) and len(sub.normalized_shape) > 1]
        if wide_ln:
            findings.append(Finding(7, "LayerNorm over the time axis",
                                    f"{', '.join(wide_ln)} normalise over more than the last axis, so a token's output depends on later "
                                    f"tokens (leaks such as query {leaks[0][0]} <- key {leaks[0][1]}). Use nn.LayerNorm(D)."))
        else:
            detail = (" Every position sees exactly one token ahead: an off-by-one causal mask (tril(diagonal=1))."
                      if reach == 1 and len(leaks) == t - 1 else "")
            findings.append(Finding(4, "future tokens leak into earlier positions",
                                    f"changing token j changed the outputs at positions i < j, e.g. (i, j) = {leaks[:4]} (up to {reach} "
                                    f"ahead).{detail} Apply a causal mask (True = may attend, tril) in every attention."))
    return findings


# ---------------------------------------------------------------------------------------------------
# language-model loss
# ---------------------------------------------------------------------------------------------------
def _reference_lm_loss(logits: torch.Tensor, ids: torch.Tensor, pad: int) -> torch.Tensor:
    pred, target = logits[:, :-1], ids[:, 1:]  # position t predicts token t+1
    return F.cross_entropy(pred.reshape(-1, pred.size(-1)), target.reshape(-1), ignore_index=pad)


def _lm_batch(gen: torch.Generator, vocab: int, pad: int, lengths: Sequence[int], t: int, left: Sequence[bool]):
    b = len(lengths)
    ids = torch.randint(0, vocab - 1, (b, t), generator=gen)
    ids = ids + (ids >= pad).long()  # real tokens never equal pad
    for i, (n, is_left) in enumerate(zip(lengths, left)):
        if is_left:
            ids[i, : t - n] = pad
        else:
            ids[i, n:] = pad
    logits = torch.randn(b, t, vocab, generator=gen) * 2
    return logits, ids


@_quietly
def diagnose_lm_loss(fn: Callable, *, vocab: int = 11, tol: float = 1e-5) -> list[Finding]:
    """Diagnose a next-token loss called as ``fn(logits, ids, pad_id=PAD) -> loss`` (the signature of
    :func:`tinytf.lm_loss`): logits ``[B, T, V]`` computed from ids ``[B, T]``; ``fn`` shifts itself.

    Black-box property checks on padded batches (right and left padding, two pad ids): the loss
    must not depend on the logits at the last position nor on the first token (13: missing or
    reversed shift); nor on the logits whose target is padding (14: pad counted in the loss); nor
    change when extra padding columns are appended (14: pad in the denominator). Also: it must
    return a scalar tensor that can be back-propagated, equal to the mean over real target tokens.
    """
    gen = torch.Generator().manual_seed(99)
    cases = []
    for pad, lengths, left in ((0, (6, 4, 3), (False, False, True)), (vocab - 1, (5, 6, 2), (False, True, False))):
        logits, ids = _lm_batch(gen, vocab, pad, lengths, 6, left)
        cases.append((logits, ids, pad))

    def call(logits, ids, pad):
        return fn(logits.clone(), ids.clone(), pad_id=pad)

    base = []
    for logits, ids, pad in cases:
        lg = logits.clone().requires_grad_(True)
        try:
            loss = fn(lg, ids.clone(), pad_id=pad)
        except Exception as exc:  # noqa: BLE001
            hint = ("The loss is called as fn(logits, ids, pad_id=PAD), the signature of tinytf.lm_loss."
                    if isinstance(exc, TypeError) and "pad_id" in str(exc) else "")
            return [_crash(f"loss on logits {list(logits.shape)}, ids {list(ids.shape)}", exc, 0, hint)]
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            got = f"shape {list(loss.shape)}" if isinstance(loss, torch.Tensor) else type(loss).__name__
            return [Finding(0, "loss is not a scalar tensor", f"got {got}; return a 0-d tensor (the mean over real target tokens).")]
        if not loss.requires_grad:
            return [Finding(0, "loss is detached from the logits", "it does not require grad, so backward() cannot train the model. "
                                                                   "Do not call .item(), .detach() or torch.tensor(...) on it.")]
        if not torch.isfinite(loss):
            return [Finding(0, "non-finite loss", f"got {float(loss)} on ordinary random logits.")]
        base.append(loss.detach())

    findings: list[Finding] = []
    # 13: shift --------------------------------------------------------------------------------------------
    uses_last = uses_first_id = uses_first_logits = False
    for (logits, ids, pad), loss in zip(cases, base):
        lg = logits.clone()
        lg[:, -1] = torch.randn(lg[:, -1].shape, generator=gen) * 3
        uses_last |= not torch.allclose(call(lg, ids, pad), loss, atol=tol)
        lg = logits.clone()
        lg[:, 0] = torch.randn(lg[:, 0].shape, generator=gen) * 3
        uses_first_logits |= not torch.allclose(call(lg, ids, pad), loss, atol=tol)
        ids2 = ids.clone()
        real0 = ids2[:, 0] != pad
        new = (ids2[:, 0] + 1) % vocab
        new = torch.where(new == pad, (new + 1) % vocab, new)  # another real token
        ids2[:, 0] = torch.where(real0, new, ids2[:, 0])
        uses_first_id |= not torch.allclose(call(logits, ids2, pad), loss, atol=tol)
    if uses_last and not uses_first_logits:
        return [Finding(13, "targets shifted the wrong way", "the loss ignores the first position's logits and uses the last one's: "
                                                              "logits[:, 1:] were paired with ids[:, :-1]. Position t predicts token t+1: "
                                                              "pair logits[:, :-1] with ids[:, 1:].")]
    if uses_last or uses_first_id:
        ev = []
        if uses_last:
            ev.append("it depends on the logits at the last position (which have no next token)")
        if uses_first_id:
            ev.append("it depends on the first token (which nothing predicts)")
        return [Finding(13, "targets not shifted", " and ".join(ev).capitalize() + ": each position is scored against its own input "
                                                   "token, which it can see. Pair logits[:, :-1] with ids[:, 1:].")]

    # 14: padding -----------------------------------------------------------------------------------------
    pad_logits = False
    for (logits, ids, pad), loss in zip(cases, base):
        target_pad = torch.zeros_like(ids, dtype=torch.bool)
        target_pad[:, :-1] = ids[:, 1:] == pad  # logits at t are scored against ids[t+1]
        lg = logits.clone()
        lg[target_pad] = torch.randn(int(target_pad.sum()), vocab, generator=gen) * 3
        pad_logits |= not torch.allclose(call(lg, ids, pad), loss, atol=tol)
    if pad_logits:
        findings.append(Finding(14, "padding tokens counted in the loss",
                                "changing the logits at positions whose target is padding changed the loss, so pad targets are scored. "
                                "Pass ignore_index=pad_id to cross_entropy (or mask by target != pad_id) and divide by the number of "
                                "real target tokens."))
        return findings
    denom = False
    for (logits, ids, pad), loss in zip(cases, base):
        extra = 3
        ids2 = torch.cat([ids, torch.full((ids.size(0), extra), pad)], dim=1)  # same real targets, more pad targets
        lg2 = torch.cat([logits, torch.randn(ids.size(0), extra, vocab, generator=gen)], dim=1)
        try:
            denom |= not torch.allclose(call(lg2, ids2, pad), loss, atol=tol)
        except Exception:  # noqa: BLE001
            pass
    if denom:
        findings.append(Finding(14, "padding in the denominator",
                                "appending padding columns (no new real tokens) changed the loss: the sum over real tokens is divided by "
                                "all positions, pads included. Divide by the number of real target tokens ((target != pad_id).sum()), "
                                "which is what cross_entropy(..., ignore_index=pad_id) does with reduction='mean'."))
        return findings
    worst = max(abs(float(loss) - float(_reference_lm_loss(lg, ids, pad))) for (lg, ids, pad), loss in zip(cases, base))
    if worst > 1e-4:
        findings.append(Finding(0, "loss differs from the mean next-token cross-entropy",
                                f"it is off by up to {worst:.3g} from cross_entropy(logits[:, :-1], ids[:, 1:], ignore_index=pad_id) "
                                "(mean over real target tokens), though shift and padding look right. Check the reduction "
                                "(sum vs mean, per sequence vs per token) and the axes passed to cross_entropy."))
    return findings
