"""``diagnose_attention``: black-box probes of ``fn(q, k, v, mask=None)`` against named wrong references.

The steps, in order: call it without a mask (crashes, in-place edits, output shape, NaN), name the
core mistake (scale, orientation, softmax axis) on the probes whose output is wrong, then the same
with bool masks. A mistake that shows on some inputs only (only when ``Tq == Tk``, only for some
``d_head``, only with a mask of one shape) is named from the probes that show it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..translation import gettext
from .attention_refs import CORES, MASKED, RIGHT, Candidate, Core, Probe, explain_scales, fit_scale, reference
from .catalog import Pitfall
from .findings import Finding, found
from .probe import cover_probes, crash_finding, first_output, is_close, max_abs_diff, only_for, quietly, random_mask

__all__ = ["diagnose_attention"]

# (B, H, Tq, Tk, d): Tq != Tk, d_head != D = H*d, B > 1; the square probes let transposed code run, and the
# last one is the single-example, single-head square test with d_head = 64 that hides so much.
_ATTN_SHAPES = ((2, 3, 5, 7, 8), (3, 2, 6, 6, 4), (2, 4, 3, 9, 16), (1, 1, 4, 4, 64))
Ran = tuple[Probe, torch.Tensor]  # a probe and fn's output on it


def _where(p: Probe, mask: torch.Tensor | None = None) -> str:
    extra = gettext(" with mask {mask_shape}").format(mask_shape=list(mask.shape)) if mask is not None else ""
    return gettext("for q {q_shape} and k {k_shape}{extra}").format(q_shape=list(p.q.shape), k_shape=list(p.k.shape), extra=extra)


def _make_probes(seeds: Sequence[int], gen: torch.Generator) -> list[Probe]:
    probes = []
    for seed in seeds:
        gen.manual_seed(1000 + seed)
        for b, h, tq, tk, d in _ATTN_SHAPES:
            q, k, v = (torch.randn(b, h, t, d, generator=gen) for t in (tq, tk, tk))
            probes.append(Probe(q, k, v, h, d))
    return probes


def _run_unmasked(fn: Callable, probes: list[Probe]) -> tuple[list[Finding], list[Ran], list[tuple[Probe, Exception]]]:
    """Call ``fn(q, k, v)`` on every probe: in-place edits and non-tensor results are findings."""
    findings: list[Finding] = []
    ok, crashed = [], []
    for p in probes:
        args = (p.q.clone(), p.k.clone(), p.v.clone())
        try:
            out = first_output(fn(*args))
        except Exception as exc:  # noqa: BLE001 - student code may raise anything
            crashed.append((p, exc))
            continue
        if not findings and not all(torch.equal(a, b) for a, b in zip(args, (p.q, p.k, p.v))):
            findings.append(found(Pitfall.GENERAL, gettext("modifies its inputs in place"),
                                  gettext("q, k or v changed after the call (an in-place op such as q.mul_() or q *= ...)."),
                                  fix=gettext("use out-of-place ops: q = q * scale")))
        if not isinstance(out, torch.Tensor):
            return findings + [Finding(Pitfall.GENERAL, gettext("does not return a tensor"),
                                       gettext("expected a tensor [B, H, Tq, d], got {type}.").format(type=type(out).__name__))], [], []
        ok.append((p, out))
    return findings, ok, crashed


def _crash_finding(crashed: list[tuple[Probe, Exception]], ok: list[Ran]) -> Finding:
    p, exc = crashed[0]
    square_ok = any(r.q.size(-2) == r.k.size(-2) for r, _ in ok)
    shape_err = isinstance(exc, RuntimeError) and any(w in str(exc) for w in ("size", "shape", "dimension"))
    hint = ""
    if shape_err:
        hint = (gettext("With q {q_shape} and k {k_shape} the scores must be q @ k.transpose(-2, -1) -> [..., Tq={q_size}, Tk={k_size}]; "
                        "print every intermediate shape.")
                            .format(q_shape=list(p.q.shape), k_shape=list(p.k.shape), q_size=p.q.size(-2), k_size=p.k.size(-2)))
        if square_ok:
            hint = gettext("It works when Tq == Tk but not when Tq != Tk: the scores are oriented the wrong way. ") + hint
    return crash_finding(gettext("attention with q {q_shape}, k/v {k_shape}").format(q_shape=list(p.q.shape), k_shape=list(p.k.shape)), exc,
                  Pitfall.ORIENTATION if shape_err else Pitfall.GENERAL, hint)


def _shape_finding(ok: list[Ran]) -> Finding | None:
    """Pitfall 2 for the first probe with a wrong output shape (the weights, Tk rows, merged heads)."""
    bad = [(p, o) for p, o in ok if o.shape != p.q.shape[:-1] + (p.v.size(-1),)]
    if not bad:
        return None
    (q, k, v, _, _), out = bad[0]
    want, got = [*q.shape[:-1], v.size(-1)], list(out.shape)
    why = ""
    if got == [*q.shape[:-1], k.size(-2)]:
        why = gettext(" That is the shape of the attention weights: multiply them by v.")
    elif got == [*q.shape[:-2], k.size(-2), v.size(-1)]:
        why = gettext(" It has Tk rows instead of Tq: the scores are transposed (use q @ k.transpose(-2, -1)).")
    elif len(got) == 3 and got[-1] == q.size(1) * q.size(-1):
        why = gettext(" The heads were merged; this function should return per-head outputs [B, H, Tq, d].")
    return Finding(Pitfall.ORIENTATION, gettext("wrong output shape"),
                   f"for q {list(q.shape)} and k/v {list(k.shape)} it returned {got}, expected {want} = [B, H, Tq, d].{why} "
                   f"{only_for([_where(p) for p, _ in bad], len(bad), len(ok))}".rstrip())


def _fits(core: Core, p: Probe, out: torch.Tensor, tol: float, mask: torch.Tensor | None = None,
          mask_mode: str = "before", invert: bool = False) -> bool:
    if core.orient == "kq" and p.q.size(-2) != p.k.size(-2):
        return False  # k qᵀ only runs (and only means anything) when square
    return is_close(out, reference(p, core, mask, mask_mode, invert), tol)


def _explain(bad: list[int], candidates: Sequence[Candidate], hit: Callable[[Candidate, int], bool]):
    """One candidate that explains every bad probe if there is one, else a greedy cover (see ``cover_probes``)."""
    for c in candidates:
        if all(hit(c, i) for i in bad):
            return [(c, list(bad))], []
    return cover_probes(bad, candidates, hit)


def _name_core(ok: list[Ran], bad: list[int], cores: list[Core], tol: float) -> tuple[list[Finding], list[int]]:
    """Name the wrong core (scale x orientation x axis) behind the bad unmasked probes; fills ``cores``."""
    candidates = [Candidate(core, "before", False, problems) for core, problems in CORES[1:]]
    named, rest = _explain(bad, candidates, lambda c, i: _fits(c.core, *ok[i], tol))
    if len(named) > 1 or rest:  # a scale that is none of the named ones explains them all? (e.g. hard-coded)
        fitted = {(ok[i][0].h, ok[i][0].d): 0.0 for i in bad}
        for i in bad:
            p, out = ok[i]
            if not fitted[(p.h, p.d)]:
                fitted[(p.h, p.d)] = fit_scale(out, p)[0]
        fit = Core(lambda d_, h_: fitted[(h_, d_)])
        if all(_fits(fit, *ok[i], 1e-3) for i in bad):
            named, rest = [(Candidate(fit, "before", False, ((Pitfall.SCALE, gettext("wrong scaling"), explain_scales(fitted)),)), bad)], []
    square_only = all(p.q.size(-2) == p.k.size(-2) for p, _ in ok)
    findings = []
    for cand, idx in named:
        for i in idx:
            cores[i] = cand.core
        where = only_for([_where(ok[i][0]) for i in idx], len(idx), len(ok))
        for pitfall, title, text in cand.problems:
            ran = gettext(" (It also only ran when Tq == Tk.)") if square_only and cand.core.orient == "kq" else ""
            findings.append(found(pitfall, gettext(title), gettext(text) + ran, where=where))
    return findings, rest


def _name_batch_part(ok: list[Ran], rest: list[int], tol: float) -> list[Finding]:
    """A core mistake on part of the batch only: some batch elements right, every other one wrong in one named way
    (e.g. the scale forgotten for every batch element but the first). ``[]`` when that is not what happened."""
    elements = {(i, b): (Probe(p.q[b : b + 1], p.k[b : b + 1], p.v[b : b + 1], p.h, p.d), out[b : b + 1])
                for i in rest for p, out in [ok[i]] for b in range(p.q.size(0))}
    right = sorted({b for key, el in elements.items() if _fits(RIGHT, *el, tol) for b in [key[1]]})
    wrong = [key for key, el in elements.items() if not _fits(RIGHT, *el, tol)]
    if not right or not wrong:
        return []
    bad = sorted({b for _, b in wrong})
    if set(bad) & set(right):
        return []  # the same batch element is right on one probe and wrong on another: not a split of the batch
    for core, problems in CORES[1:]:
        if all(_fits(core, *elements[key], tol) for key in wrong):
            where = only_for([_where(ok[i][0]) for i in sorted({i for i, _ in wrong})], len({i for i, _ in wrong}), len(ok))
            part = (gettext(" This holds for batch element{s} {bad} only; batch element{s2} {right} {verb} right: "
                            "the code treats the batch elements differently (an index such as [0], or a loop over the batch that does "
                            "the step for one of them only). Do every step on the whole tensor [B, H, T, d].")
                    .format(s="s" if len(bad) > 1 else "", bad=", ".join(map(str, bad)), s2="s" if len(right) > 1 else "",
                            right=", ".join(map(str, right)), verb="are" if len(right) > 1 else "is"))
            return [found(pitfall, gettext("{title} on part of the batch").format(title=gettext(title)), gettext(text) + part,
                          where=where, fix=gettext("do the step for the whole batch at once (no [0], no per-element branch): "
                                                   "{pitfall_fix}").format(pitfall_fix=gettext(pitfall.fix)))
                    for pitfall, title, text in problems]
    return []


def _unnamed_core(fn: Callable, ok: list[Ran], rest: list[int], gen: torch.Generator) -> list[Finding]:
    """Property checks (rows of weights sum to one, keys are a set) on a probe no reference explains."""
    findings = []
    p, out = ok[rest[0]]
    ones = torch.ones_like(p.v)
    try:
        row_sums = first_output(fn(p.q.clone(), p.k.clone(), ones))
        if isinstance(row_sums, torch.Tensor) and row_sums.shape == ones.shape[:-2] + (p.q.size(-2), p.v.size(-1)) \
                and not torch.allclose(row_sums, torch.ones_like(row_sums), atol=1e-4):
            findings.append(found(Pitfall.ORIENTATION, gettext("weight rows do not sum to one"),
                                  gettext("{where} with v = ones the output should be all ones (each query's weights sum to 1); it "
                                          "ranges over "
                                    "[{row_sums_min:.3g}, {row_sums_max:.3g}]. Apply softmax over the last axis (the keys) and nothing "
                                    "after it.")
                                        .format(where=_where(p), row_sums_min=float(row_sums.min()), row_sums_max=float(row_sums.max()))))
    except Exception:  # noqa: BLE001
        pass
    perm = torch.randperm(p.k.size(-2), generator=gen)
    try:
        out_p = first_output(fn(p.q.clone(), p.k[..., perm, :].clone(), p.v[..., perm, :].clone()))
        if not is_close(out_p, out, 1e-4):
            findings.append(found(Pitfall.ORIENTATION, gettext("depends on the order of the keys"),
                                  gettext("{where}, shuffling k and v together (the same permutation) changed the output; attention "
                                          "without a "
                                    "mask treats the keys as a set.").format(where=_where(p))))
    except Exception:  # noqa: BLE001
        pass
    worst = max(max_abs_diff(ok[i][1], reference(ok[i][0], RIGHT)) for i in rest)
    where = only_for([_where(ok[i][0]) for i in rest], len(rest), len(ok))
    return findings + [found(Pitfall.GENERAL, gettext("output differs from softmax(q kᵀ / sqrt(d)) v"),
                             gettext("largest difference {worst:.3g} over {n_rest} random probes, and it is none of the known "
                                     "mistakes.{value}").format(worst=worst, n_rest=len(rest), value=' ' + where if where else ''),
                             fix=gettext("compare your intermediates (scores, weights, output) with "
                                         "tinytf.scaled_dot_product_attention step by step"))]


Masked = tuple[int, torch.Tensor]  # (index of the unmasked probe, bool mask)


def _run_masked(fn: Callable, ok: list[Ran], cores: list[Core], gen: torch.Generator):
    """Call ``fn(q, k, v, mask)`` with a full, a key-padding and a 2-D mask per probe."""
    masked: list[Masked] = []
    for i, (p, _) in enumerate(ok):
        b, _, tq, _ = p.q.shape
        tk = p.k.size(-2)
        if cores[i].orient == "kq" and tq != tk:
            continue
        masked += [(i, random_mask(shape, gen)) for shape in ((b, 1, tq, tk), (b, 1, 1, tk), (tq, tk))]
    outs = []
    for i, m in masked:
        p = ok[i][0]
        try:
            o = first_output(fn(p.q.clone(), p.k.clone(), p.v.clone(), m.clone()))
        except Exception as exc:  # noqa: BLE001
            return masked, [], [crash_finding(gettext("attention with a bool mask {m_shape} (q {q_shape}, k {k_shape})")
                .format(m_shape=list(m.shape), q_shape=list(p.q.shape), k_shape=list(p.k.shape)),
                                       exc, Pitfall.MASK, gettext("fn(q, k, v, mask) must accept a bool mask broadcastable to "
                                                          "[B, H, Tq, Tk], True = may attend."))]
        if not isinstance(o, torch.Tensor) or o.shape != p.q.shape[:-1] + (p.v.size(-1),):
            got = list(o.shape) if isinstance(o, torch.Tensor) else type(o).__name__
            return masked, [], [Finding(Pitfall.ORIENTATION, gettext("wrong output shape with a mask"),
                                        gettext("with mask {m_shape} it returned {got}, expected {value}.")
                                            .format(m_shape=list(m.shape), got=got, value=[*p.q.shape[:-1], p.v.size(-1)]))]
        outs.append(o)
    return masked, outs, []


def _mask_leaks(fn: Callable, ok: list[Ran], masked: list[Masked], outs: list[torch.Tensor], rest: list[int],
                tol: float) -> bool:
    """Does changing k and v where a key-padding mask ``[B, 1, 1, Tk]`` blocks them change the output?"""
    for j in rest:
        i, m = masked[j]
        if m.dim() != 4 or m.shape[1:3] != (1, 1):
            continue
        p = ok[i][0]
        blocked = ~m[:, 0, 0, :, None]  # [B, Tk, 1]
        k2 = torch.where(blocked[:, None], torch.randn_like(p.k) * 3, p.k)
        v2 = torch.where(blocked[:, None], torch.randn_like(p.v) * 3, p.v)
        try:
            return not is_close(outs[j], first_output(fn(p.q.clone(), k2, v2, m.clone())), tol)
        except Exception:  # noqa: BLE001
            return False
    return False


def _diagnose_masks(fn: Callable, ok: list[Ran], cores: list[Core], gen: torch.Generator, tol: float) -> list[Finding]:
    """Name the mask mistake (or a core mistake that shows only with a mask) on the bad masked probes."""
    masked, outs, stop = _run_masked(fn, ok, cores, gen)
    if stop:
        return stop
    bad = [j for j, ((i, m), o) in enumerate(zip(masked, outs)) if not _fits(cores[i], ok[i][0], o, tol, m)]
    if not bad:
        return []

    def where(idx: list[int]) -> str:
        return only_for([_where(ok[masked[j][0]][0], masked[j][1]) for j in idx], len(idx), len(masked))

    nonfinite = [j for j in bad if not torch.isfinite(outs[j]).all()]
    if nonfinite:
        return [found(Pitfall.MASK, gettext("non-finite output with a mask"),
                      gettext("the output holds NaN or inf although every query may attend to at least one key. Filling blocked "
                      "*weights* with -inf after the softmax does this."), where=where(nonfinite))]

    def hit(c: Candidate, j: int) -> bool:
        i, m = masked[j]
        return _fits(c.core or cores[i], ok[i][0], outs[j], tol, m, c.mask_mode, c.invert)

    named, rest = _explain(bad, MASKED, hit)
    findings = [found(pit, gettext(title), gettext(text), where=where(idx)) for c, idx in named for pit, title, text in c.problems]
    if rest and _mask_leaks(fn, ok, masked, outs, rest, tol):
        findings.append(found(Pitfall.MASK, gettext("blocked keys leak into the output"),
                              gettext("changing k and v at positions the key-padding mask blocks changed the output."), where=where(rest)))
    elif rest:
        findings.append(found(Pitfall.MASK, gettext("masked output differs from the reference"),
                              gettext("with a bool mask (True = may attend) the output differs from masked softmax attention, and not in "
                              "one of the known ways. Compare with tinytf.scaled_dot_product_attention(q, k, v, mask)."),
                              where=where(rest)))
    return findings


@quietly
def diagnose_attention(fn: Callable, *, seeds: Sequence[int] = (0, 1), tol: float = 1e-4) -> list[Finding]:
    """Diagnose ``fn(q, k, v, mask=None) -> out``: q ``[B, H, Tq, d]``, k/v ``[B, H, Tk, d]``,
    out ``[B, H, Tq, d]``; ``mask`` bool broadcastable to ``[B, H, Tq, Tk]``, True = may attend.

    Probes several shapes (Tq != Tk, d_head != D, B > 1, and one ``[1, 1, 4, 64]`` square) and ``seeds``.
    Catches: missing or wrong scaling (``Pitfall.SCALE``; it names the scale your code behaves like:
    none, 1/sqrt(D), 1/d, a hard-coded constant, ...), transposed scores, softmax over the wrong axis
    and wrong output shapes (``ORIENTATION``), masks applied after the softmax, ignored, multiplied
    into the scores or with the inverted convention (``MASK``), and exceptions (``GENERAL``). Each is
    named from the probes on which the output is wrong, so a mistake on some inputs only is named too.
    """
    gen = torch.Generator().manual_seed(1234)
    findings, ok, crashed = _run_unmasked(fn, _make_probes(seeds, gen))
    if crashed:
        findings.append(_crash_finding(crashed, ok))
    if not ok:
        return findings
    shape = _shape_finding(ok)
    if shape is not None:
        return findings + [shape]
    if any(not torch.isfinite(o).all() for _, o in ok):
        return findings + [Finding(Pitfall.GENERAL, gettext("non-finite output without a mask"),
                                   gettext("the output holds NaN or inf for ordinary random inputs."))]
    cores = [RIGHT] * len(ok)
    bad = [i for i, (p, o) in enumerate(ok) if not _fits(RIGHT, p, o, tol)]
    if bad:
        named, rest = _name_core(ok, bad, cores, tol)
        findings += named
        if rest:
            partial = _name_batch_part(ok, rest, tol)
            return findings + (partial or _unnamed_core(fn, ok, rest, gen))
    return findings + _diagnose_masks(fn, ok, cores, gen, tol)


