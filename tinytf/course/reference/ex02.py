"""Exercise 2 — a padding mask: judges for the hidden tests and the self-check diagnosis.

Student functions: ``build_padding_mask(lengths, t, device=None) -> bool [B, 1, 1, t]``,
``masked_softmax(scores, mask)``, ``renormalise(weights, mask)``,
``padded_attention(q, k, v, mask=None) -> out``.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import Any

import torch

from tinytf.checks import Finding, Pitfall, found

from ...translation import gettext as _
from . import Probe, call_student, check_parts, explained, flat, swapped
from .judging import judge
from .validators import bool_mask, close, differs, float_inputs, has_keys, shape_of, shapes, should_be, tensor

__all__ = ["PROBES", "reference_masked_softmax", "reference_renormalise", "tinytf_masked_softmax", "diagnose", "diagnose_tasks",
           "unchanged"]


def reference_masked_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """scores ``[..., Tq, Tk]``, bool mask (True = may attend) -> weights, 0 where blocked."""
    return scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)


def reference_renormalise(weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Zero the blocked weights ``[..., Tq, Tk]`` and rescale each row to sum to one."""
    kept = weights * mask
    return kept / kept.sum(dim=-1, keepdim=True)


def tinytf_masked_softmax(namespace: dict[str, Any]) -> AbstractContextManager[None]:
    """Inside the block the notebook's ``masked_softmax`` is tinytf's, so that ``padded_attention`` (which
    calls it) is graded on its own: a mistake in Task 2b costs Task 2b's points only."""
    return swapped(namespace, masked_softmax=reference_masked_softmax)


# ---- judges ---------------------------------------------------------------------------------------


@judge("ex02_mask")
def _judge_mask(value: Any, lengths: list[int], t: int) -> None:
    from tinytf import padding_mask

    expected = padding_mask([int(n) for n in lengths], int(t))
    value = tensor(value, expected.shape, "build_padding_mask(lengths, t)", dtype=torch.bool)
    assert torch.equal(value, expected), (
        _("build_padding_mask(lengths, t) marks the wrong positions: {should_be}").format(
            should_be=should_be(value, expected, f'lengths {list(lengths)}, t {t}')))


def unchanged(value: Any, what: str, **given: torch.Tensor) -> None:
    """A probe's record ``value["after"]`` (the inputs as the caller holds them after the call) still holds ``given``:
    otherwise "``what`` changed its input …" (an in-place operation)."""
    after = value.get("after") if isinstance(value, dict) else None
    if not isinstance(after, dict):
        return
    for key, want in given.items():
        got = after.get(key)
        assert isinstance(got, torch.Tensor) and got.shape == want.shape and torch.equal(got, want), _(
            "{what} changed its input: after the call the {key} tensor passed in no longer holds its values (an in-place "
            "operation such as masked_fill_, mul_ or -=)").format(what=what, key=key)


@judge("ex02_masked_softmax")
def _judge_masked_softmax(value: Any, scores: torch.Tensor, mask: Any) -> None:
    mask = bool_mask(mask)
    expected = reference_masked_softmax(*float_inputs(scores), mask)
    has_keys(value, ("weights",), _("the masked_softmax record"))
    unchanged(value, "masked_softmax(scores, mask)", scores=scores)
    value = tensor(value["weights"], expected.shape, "masked_softmax(scores, mask)")
    assert bool((value[~mask.expand_as(value)] == 0).all()), _("masked_softmax: blocked weights are not exactly zero")
    close(value, expected, "masked_softmax(scores, mask)", given=shapes(scores=scores, mask=mask))


@judge("ex02_renormalise")
def _judge_renormalise(value: Any, weights: torch.Tensor, mask: Any) -> None:
    expected = reference_renormalise(*float_inputs(weights), bool_mask(mask))
    has_keys(value, ("weights",), _("the renormalise record"))
    unchanged(value, "renormalise(weights, mask)", weights=weights)
    close(tensor(value["weights"], expected.shape, "renormalise(weights, mask)"), expected, "renormalise(weights, mask)", atol=1e-6,
          given=shapes(weights=weights, mask=mask))


@judge("ex02_attention")
def _judge_attention(value: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any) -> None:
    from tinytf import scaled_dot_product_attention

    mask = bool_mask(mask)
    has_keys(value, ("masked", "unmasked"))
    q, k, v = float_inputs(q, k, v)
    for key, m in (("masked", mask), ("unmasked", None)):
        expected = scaled_dot_product_attention(q, k, v, m)
        close(tensor(value[key], expected.shape, f"padded_attention ({key})"), expected, f"padded_attention ({key})",
              given=shapes(q=q, k=k, v=v, mask=mask), reference="tinytf.scaled_dot_product_attention")


# ---- self-check diagnosis -------------------------------------------------------------------------


def _diagnose_mask(fn: Any) -> list[Finding]:
    from tinytf import padding_mask

    lengths, t = [5, 2, 3], 5
    m, problem = call_student("build_padding_mask", fn, lengths, t)
    if problem:
        return [problem]
    expected = padding_mask(lengths, t)
    if not isinstance(m, torch.Tensor) or m.dtype != torch.bool:
        got = m.dtype if isinstance(m, torch.Tensor) else type(m).__name__
        return [found(Pitfall.GENERAL, _("build_padding_mask must return a bool tensor"), _("got {got}.").format(got=got),
                      fix=_("build it from a comparison, torch.arange(t) < lengths[:, None], so it is torch.bool (True = may attend)"))]
    if tuple(m.shape) != tuple(expected.shape):
        hint = _(" A [B, T] mask on [B, H, T, T] scores is read as [Tq, Tk].") if m.dim() == 2 else ""
        return [found(Pitfall.GENERAL, _("build_padding_mask has the wrong shape"),
                      _("lengths {lengths}, t={t} must give [B, 1, 1, t] = {expected_shape}, got {m_shape}.{hint}").format(
                          lengths=lengths, t=t, expected_shape=list(expected.shape), m_shape=list(m.shape), hint=hint),
                      fix=_("return the [B, t] comparison with the head and query axes added: mask[:, None, None, :]"))]
    if torch.equal(m, ~expected):
        return [found(Pitfall.MASK, _("build_padding_mask uses the inverted convention"),
                      _("True must mean 'may attend' (a real token), False = padding, as in F.scaled_dot_product_attention."),
                      fix=_("flip the comparison: positions < lengths (True = real token), not positions >= lengths"))]
    if not torch.equal(m, expected):
        return [found(Pitfall.GENERAL, _("build_padding_mask marks the wrong positions"),
                      _("for lengths {lengths} and t={t}, key j of sequence b is real when j < lengths[b].").format(lengths=lengths, t=t),
                      fix=_("compare torch.arange(t)[None, :] < lengths[:, None]"))]
    return []


def _diagnose_masked_softmax(fn: Any) -> list[Finding]:
    from tinytf import padding_mask

    g = torch.Generator().manual_seed(7)
    scores = torch.randn(3, 2, 5, 5, generator=g) * 2
    mask = padding_mask([5, 2, 3], 5)
    w, problem = call_student("masked_softmax", fn, scores, mask)
    if problem:
        return [problem]
    expected = reference_masked_softmax(scores, mask)
    if not isinstance(w, torch.Tensor) or w.shape != expected.shape:
        return [found(Pitfall.GENERAL, _("masked_softmax returns the wrong shape"),
                      _("expected {expected_shape} (the scores' shape), got {got}.").format(expected_shape=list(expected.shape),
                                                                                          got=shape_of(w)),
                      fix=_("mask the scores (they broadcast with the mask), then softmax(dim=-1): same shape as the scores"))]
    if torch.allclose(w, reference_masked_softmax(scores, ~mask), atol=1e-5):
        return [found(Pitfall.MASK, _("masked_softmax uses the inverted mask"),
                      _("the weights sit on the padded keys: it blocks where mask is True."),
                      fix=_("block where mask is False: scores.masked_fill(~mask, float('-inf'))"))]
    if torch.allclose(w, scores.softmax(-1) * mask, atol=1e-5) or torch.allclose(w, scores.softmax(-1).masked_fill(~mask, 0), atol=1e-5):
        return [found(Pitfall.MASK, _("masked_softmax applies the mask after the softmax"),
                      _("Zeroing weights after the softmax leaves rows that no longer sum to one."))]
    if not bool((w[~mask.expand_as(w)] == 0).all()):
        return [found(Pitfall.MASK, _("masked_softmax leaves weight on padded keys"), _("blocked weights must be exactly 0."),
                      fix=_("fill the blocked scores with float('-inf'), not a large negative number, before the softmax"))]
    if not torch.allclose(w, expected, atol=1e-5):
        return [found(Pitfall.GENERAL, _("masked_softmax gives wrong weights"),
                      differs("masked_softmax(scores, mask)", w, expected, _("scores {scores_shape}, mask {mask_shape}").format(
                          scores_shape=list(scores.shape), mask_shape=list(mask.shape))) + ".",
                      fix=_("scores.masked_fill(~mask, float('-inf')).softmax(dim=-1): the softmax over the keys, after masking"))]
    return []


def _diagnose_renormalise(fn: Any) -> list[Finding]:
    from tinytf import padding_mask

    g = torch.Generator().manual_seed(8)
    weights = torch.rand(2, 2, 4, 4, generator=g) + 0.05
    weights = weights / weights.sum(-1, keepdim=True)
    mask = padding_mask([4, 2], 4)
    r, problem = call_student("renormalise", fn, weights, mask)
    if problem:
        return [problem]
    if not isinstance(r, torch.Tensor) or r.shape != weights.shape:
        return [found(Pitfall.GENERAL, _("renormalise returns the wrong shape"),
                      _("expected {weights_shape}, got {got}.").format(weights_shape=list(weights.shape), got=shape_of(r)),
                      fix=_("keep the weights' shape: w = weights * mask, then w / w.sum(dim=-1, keepdim=True)"))]
    if torch.allclose(r, weights * mask, atol=1e-6):
        return [found(Pitfall.MASK, _("renormalise does not rescale the rows"),
                      _("after zeroing the blocked weights the rows no longer add up to one."),
                      fix=_("divide each row by its new sum: w / w.sum(dim=-1, keepdim=True)"))]
    if not torch.allclose(r, reference_renormalise(weights, mask), atol=1e-6):
        return [found(Pitfall.GENERAL, _("renormalise gives wrong values"),
                      differs("renormalise(weights, mask)", r, reference_renormalise(weights, mask),
                              _("weights {weights_shape}, mask {mask_shape}").format(weights_shape=list(weights.shape),
                                                                                     mask_shape=list(mask.shape))) + ".",
                      fix=_("zero where mask is False, then divide by the row sum (dim=-1, keepdim=True)"))]
    return []


def _diagnose_padded(fn: Any, namespace: dict[str, Any]) -> list[Finding]:
    from tinytf.checks import diagnose_attention

    q = torch.randn(2, 2, 3, 4, generator=torch.Generator().manual_seed(9))
    with tinytf_masked_softmax(namespace):  # as in its test: judged on its own, whatever Task 2b says
        _, problem = call_student("padded_attention", fn, q, q, q)
        return [problem] if problem else diagnose_attention(fn)


# ---- the judges on fresh inputs (the self-check's copy of the grader's verdict) ------------------


def _lengths(gen: torch.Generator, b: int, t: int) -> list[int]:
    """``b`` lengths in ``[1, t - 1]``: every row has padding."""
    return torch.randint(1, t, (b,), generator=gen).tolist()


def _probe_mask(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    """A full sequence, a one-token one and one short of full (an off-by-one, an inverted or left-aligned mask shows on
    every draw), then fresh random lengths."""
    t = int(torch.randint(4, 10, (1,), generator=gen))
    lengths = [t, 1, t - 1, 2] + torch.randint(1, t + 1, (int(torch.randint(0, 4, (1,), generator=gen)),), generator=gen).tolist()
    return ns["build_padding_mask"](lengths, t), {"lengths": lengths, "t": t}


def _probe_masked_softmax(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    from tinytf import causal_mask, padding_mask

    t = int(torch.randint(3, 9, (1,), generator=gen))
    mask = padding_mask(_lengths(gen, 2, t), t) & causal_mask(t)
    scores = torch.randn(2, 3, t, t, generator=gen) * 3
    given = scores.clone()  # the tensor the call gets; the caller keeps a copy to see whether it changed
    return {"weights": ns["masked_softmax"](given, mask), "after": {"scores": given}}, {"scores": scores, "mask": mask}


def _probe_renormalise(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    from tinytf import padding_mask

    t = int(torch.randint(3, 9, (1,), generator=gen))
    weights = torch.rand(3, 2, t, t, generator=gen) + 0.05
    weights, mask = weights / weights.sum(-1, keepdim=True), padding_mask(_lengths(gen, 3, t), t)
    given = weights.clone()
    return {"weights": ns["renormalise"](given, mask), "after": {"weights": given}}, {"weights": weights, "mask": mask}


def _probe_attention(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    from tinytf import padding_mask

    tq, tk = int(torch.randint(2, 7, (1,), generator=gen)), int(torch.randint(3, 10, (1,), generator=gen))
    q, k, v = (torch.randn(3, 2, t, n, generator=gen) for t, n in ((tq, 6), (tk, 6), (tk, 5)))
    mask = padding_mask(_lengths(gen, 3, tk), tk)
    with tinytf_masked_softmax(ns):
        value = {"masked": ns["padded_attention"](q, k, v, mask), "unmasked": ns["padded_attention"](q, k, v)}
    return value, {"q": q, "k": k, "v": v, "mask": mask}


PROBES: dict[str, Probe] = {"ex02_mask": _probe_mask, "ex02_masked_softmax": _probe_masked_softmax,
                            "ex02_renormalise": _probe_renormalise, "ex02_attention": _probe_attention}
TASKS = {"ex02_mask": ("build_padding_mask", _diagnose_mask), "ex02_masked_softmax": ("masked_softmax", _diagnose_masked_softmax),
         "ex02_renormalise": ("renormalise", _diagnose_renormalise)}


def diagnose_tasks(namespace: dict[str, Any], only: Iterable[str] | None = None) -> dict[str, list[Finding]]:
    """``{grade_id: findings}`` about the student's ex02 functions in ``namespace``: the named pitfalls, the task's
    mutants (:mod:`.mutants.ex02`), then the grader's judges on fresh inputs for every task without one. Never raises."""
    by_task = {gid: (lambda part=part: check_parts(namespace, [part])) for gid, part in TASKS.items()}
    by_task["ex02_attention"] = lambda: check_parts(namespace, [("padded_attention", lambda fn: _diagnose_padded(fn, namespace))])
    return explained(namespace, PROBES, by_task, only=only)


def diagnose(namespace: dict[str, Any]) -> list[Finding]:
    """Findings about the student's ex02 functions in ``namespace`` (empty when all look right); see :func:`diagnose_tasks`."""
    return flat(diagnose_tasks(namespace))
