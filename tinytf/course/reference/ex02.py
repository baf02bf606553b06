"""Exercise 2 — a padding mask: judges for the hidden tests and the self-check diagnosis.

Student functions: ``build_padding_mask(lengths, t, device=None) -> bool [B, 1, 1, t]``,
``masked_softmax(scores, mask)``, ``renormalise(weights, mask)``,
``padded_attention(q, k, v, mask=None) -> out``.
"""

from __future__ import annotations

from typing import Any

import torch

from ..judges import judge
from . import call_student, check_parts

__all__ = ["reference_masked_softmax", "reference_renormalise", "diagnose"]


def reference_masked_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """scores ``[..., Tq, Tk]``, bool mask (True = may attend) -> weights, 0 where blocked."""
    return scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)


def reference_renormalise(weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Zero the blocked weights ``[..., Tq, Tk]`` and rescale each row to sum to one."""
    kept = weights * mask
    return kept / kept.sum(dim=-1, keepdim=True)


def _tensor(value: Any, shape: tuple[int, ...], what: str, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    assert isinstance(value, torch.Tensor), f"{what} must be a tensor, got {type(value).__name__}"
    assert tuple(value.shape) == tuple(shape), f"{what} has shape {list(value.shape)}, expected {list(shape)}"
    if dtype is not None:
        assert value.dtype == dtype, f"{what} must have dtype {dtype}, got {value.dtype}"
    else:
        assert value.is_floating_point(), f"{what} must be a floating-point tensor, got {value.dtype}"
        assert bool(torch.isfinite(value).all()), f"{what} contains inf or NaN"
    return value


def _close(value: torch.Tensor, expected: torch.Tensor, what: str, atol: float = 1e-5) -> None:
    assert torch.allclose(value.float(), expected.float(), atol=atol, rtol=1e-4), f"{what} differs from the reference"


def _bool_mask(mask: Any) -> torch.Tensor:
    assert isinstance(mask, torch.Tensor) and mask.dtype == torch.bool, "the recorded mask is not a bool tensor"
    return mask


# ---- judges ---------------------------------------------------------------------------------------


@judge("ex02_mask")
def _judge_mask(value: Any, lengths: list[int], t: int) -> None:
    from tinytf import padding_mask

    expected = padding_mask([int(n) for n in lengths], int(t))
    value = _tensor(value, tuple(expected.shape), "build_padding_mask(lengths, t)", dtype=torch.bool)
    assert torch.equal(value, expected), "build_padding_mask(lengths, t) marks the wrong positions"


@judge("ex02_masked_softmax")
def _judge_masked_softmax(value: Any, scores: torch.Tensor, mask: Any) -> None:
    mask = _bool_mask(mask)
    expected = reference_masked_softmax(scores.float(), mask)
    value = _tensor(value, tuple(expected.shape), "masked_softmax(scores, mask)")
    assert bool((value[~mask.expand_as(value)] == 0).all()), "masked_softmax: blocked weights are not exactly zero"
    _close(value, expected, "masked_softmax(scores, mask)")


@judge("ex02_renormalise")
def _judge_renormalise(value: Any, weights: torch.Tensor, mask: Any) -> None:
    mask = _bool_mask(mask)
    expected = reference_renormalise(weights.float(), mask)
    _close(_tensor(value, tuple(expected.shape), "renormalise(weights, mask)"), expected, "renormalise(weights, mask)", atol=1e-6)


@judge("ex02_attention")
def _judge_attention(value: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any) -> None:
    from tinytf import scaled_dot_product_attention

    mask = _bool_mask(mask)
    assert isinstance(value, dict) and {"masked", "unmasked"} <= set(value), "the record must hold 'masked' and 'unmasked'"
    q, k, v = q.float(), k.float(), v.float()
    for key, m in (("masked", mask), ("unmasked", None)):
        expected = scaled_dot_product_attention(q, k, v, m)
        _close(_tensor(value[key], tuple(expected.shape), f"padded_attention ({key})"), expected, f"padded_attention ({key})")


# ---- self-check diagnosis -------------------------------------------------------------------------


_call = call_student  # shared: tinytf.course.reference.call_student


def _diagnose_mask(fn: Any, Finding: Any) -> list[Any]:
    from tinytf import padding_mask

    lengths, t = [5, 2, 3], 5
    m, problem = _call("build_padding_mask", fn, lengths, t)
    if problem:
        return [problem]
    expected = padding_mask(lengths, t)
    if not isinstance(m, torch.Tensor) or m.dtype != torch.bool:
        got = m.dtype if isinstance(m, torch.Tensor) else type(m).__name__
        return [Finding(0, "build_padding_mask must return a bool tensor",
                        f"got {got}; build it from a comparison (positions < lengths) so it is torch.bool, True = may attend.")]
    if tuple(m.shape) != tuple(expected.shape):
        hint = " A [B, T] mask on [B, H, T, T] scores is read as [Tq, Tk]: add the axes with [:, None, None, :]." if m.dim() == 2 else ""
        return [Finding(0, "build_padding_mask has the wrong shape",
                        f"lengths {lengths}, t={t} must give [B, 1, 1, t] = {list(expected.shape)}, got {list(m.shape)}.{hint}")]
    if torch.equal(m, ~expected):
        return [Finding(3, "build_padding_mask uses the inverted convention",
                        "True must mean 'may attend' (a real token), False = padding, as in F.scaled_dot_product_attention.")]
    if not torch.equal(m, expected):
        return [Finding(0, "build_padding_mask marks the wrong positions",
                        f"for lengths {lengths} and t={t}, key j of sequence b is real when j < lengths[b].")]
    return []


def _diagnose_masked_softmax(fn: Any, Finding: Any) -> list[Any]:
    from tinytf import padding_mask

    g = torch.Generator().manual_seed(7)
    scores = torch.randn(3, 2, 5, 5, generator=g) * 2
    mask = padding_mask([5, 2, 3], 5)
    w, problem = _call("masked_softmax", fn, scores, mask)
    if problem:
        return [problem]
    expected = reference_masked_softmax(scores, mask)
    if not isinstance(w, torch.Tensor) or w.shape != expected.shape:
        return [Finding(0, "masked_softmax returns the wrong shape", f"expected {list(expected.shape)} (the scores' shape).")]
    if torch.allclose(w, reference_masked_softmax(scores, ~mask), atol=1e-5):
        return [Finding(3, "masked_softmax uses the inverted mask", "Block where mask is False: scores.masked_fill(~mask, float('-inf')).")]
    if torch.allclose(w, scores.softmax(-1) * mask, atol=1e-5) or torch.allclose(w, scores.softmax(-1).masked_fill(~mask, 0), atol=1e-5):
        return [Finding(3, "masked_softmax applies the mask after the softmax",
                        "Zeroing weights after the softmax leaves rows that no longer sum to one. "
                        "Fill the blocked scores with -inf before the softmax.")]
    if not bool((w[~mask.expand_as(w)] == 0).all()):
        return [Finding(3, "masked_softmax leaves weight on padded keys",
                        "Blocked weights must be exactly 0: use float('-inf') (not a large negative number) before the softmax.")]
    if not torch.allclose(w, expected, atol=1e-5):
        return [Finding(0, "masked_softmax gives wrong weights", "Softmax over the last axis (keys), after masking.")]
    return []


def _diagnose_renormalise(fn: Any, Finding: Any) -> list[Any]:
    from tinytf import padding_mask

    g = torch.Generator().manual_seed(8)
    weights = torch.rand(2, 2, 4, 4, generator=g) + 0.05
    weights = weights / weights.sum(-1, keepdim=True)
    mask = padding_mask([4, 2], 4)
    r, problem = _call("renormalise", fn, weights, mask)
    if problem:
        return [problem]
    if not isinstance(r, torch.Tensor) or r.shape != weights.shape:
        return [Finding(0, "renormalise returns the wrong shape", f"expected {list(weights.shape)}.")]
    if torch.allclose(r, weights * mask, atol=1e-6):
        return [Finding(3, "renormalise does not rescale the rows",
                        "After zeroing the blocked weights, divide each row by its new sum so it adds up to one again.")]
    if not torch.allclose(r, reference_renormalise(weights, mask), atol=1e-6):
        return [Finding(0, "renormalise gives wrong values",
                        "Zero where mask is False, then divide by the row sum (dim=-1, keepdim=True).")]
    return []


def diagnose(namespace: dict[str, Any]) -> list[Any]:
    """Findings about the student's ex02 functions in ``namespace`` (empty when all look right); never raises."""
    from tinytf.checks import Finding, diagnose_attention

    findings: list[Any] = []
    parts = (
        ("build_padding_mask", _diagnose_mask),
        ("masked_softmax", _diagnose_masked_softmax),
        ("renormalise", _diagnose_renormalise),
    )
    findings.extend(check_parts(namespace, [(name, lambda fn, c=check: c(fn, Finding)) for name, check in parts]))

    fn = namespace.get("padded_attention")
    if not callable(fn):
        findings.append(Finding(0, "padded_attention is missing", "Define padded_attention(q, k, v, mask=None)."))
        return findings
    q = torch.randn(2, 2, 3, 4, generator=torch.Generator().manual_seed(9))
    _, problem = _call("padded_attention", fn, q, q, q)
    if problem:
        findings.append(problem)
        return findings
    try:
        findings.extend(diagnose_attention(fn))
    except Exception as err:  # noqa: BLE001
        findings.append(Finding(0, "padded_attention could not be checked", f"{type(err).__name__}: {err}"))
    return findings
