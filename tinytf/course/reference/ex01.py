"""Exercise 1 — attention by hand: judges for the hidden tests and the self-check diagnosis.

Student functions (in the notebook): ``hand_qk`` (a 3x3 list), ``scores_by_hand(q, k)``,
``softmax_by_hand(scores)``, ``attention_by_hand(q, k, v) -> (out, weights)``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..judges import judge
from . import call_student

__all__ = ["EXAMPLE_Q", "EXAMPLE_K", "EXAMPLE_V", "reference_scores", "reference_attention", "diagnose"]

EXAMPLE_Q = [[1.0, 0.0, 1.0, 0.0], [0.0, 2.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]
EXAMPLE_K = [[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0]]
EXAMPLE_V = [[1.0, 0.0, 0.0, 0.0], [0.0, 10.0, 0.0, 0.0], [0.0, 0.0, 100.0, 0.0]]


def reference_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q ``[..., Tq, d]``, k ``[..., Tk, d]`` -> ``q kᵀ / sqrt(d)`` ``[..., Tq, Tk]``."""
    return (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [..., Tq, dv], weights [..., Tq, Tk])`` from tinytf's explicit attention."""
    from tinytf import scaled_dot_product_attention

    return scaled_dot_product_attention(q, k, v, return_weights=True)


def _tensor(value: Any, shape: tuple[int, ...], what: str) -> torch.Tensor:
    assert isinstance(value, torch.Tensor), f"{what} must be a tensor, got {type(value).__name__}"
    assert tuple(value.shape) == tuple(shape), f"{what} has shape {list(value.shape)}, expected {list(shape)}"
    assert value.is_floating_point(), f"{what} must be a floating-point tensor, got {value.dtype}"
    assert bool(torch.isfinite(value).all()), f"{what} contains inf or NaN"
    return value.float()


def _close(value: torch.Tensor, expected: torch.Tensor, what: str, atol: float = 1e-5) -> None:
    assert torch.allclose(value, expected.to(value.dtype), atol=atol, rtol=1e-4), f"{what} differs from the reference"


def _floats(x: Any) -> torch.Tensor:
    assert isinstance(x, torch.Tensor) and x.is_floating_point(), "the recorded inputs are not float tensors"
    return x.float()


# ---- judges (run in a clean process on what the hidden tests recorded) ---------------------------


@judge("ex01_hand_qk")
def _judge_hand_qk(value: Any, q: torch.Tensor, k: torch.Tensor) -> None:
    q, k = _floats(q), _floats(k)
    assert q.reshape(-1).tolist() == sum(EXAMPLE_Q, []) and k.reshape(-1).tolist() == sum(EXAMPLE_K, []), (
        "the example tensors q and k were changed; hand_qk is judged on the original example"
    )
    value = _tensor(value, (3, 3), "hand_qk")
    _close(value, (q @ k.transpose(-2, -1))[0], "hand_qk (row i = query i, column j = key j)", atol=1e-4)


@judge("ex01_scores")
def _judge_scores(value: Any, q: torch.Tensor, k: torch.Tensor) -> None:
    q, k = _floats(q), _floats(k)
    expected = reference_scores(q, k)
    _close(_tensor(value, tuple(expected.shape), "scores_by_hand(q, k)"), expected, "scores_by_hand(q, k)")


@judge("ex01_softmax")
def _judge_softmax(value: Any, scores: torch.Tensor, large: torch.Tensor) -> None:
    scores, large = _floats(scores), _floats(large)
    assert isinstance(value, dict) and {"weights", "large"} <= set(value), "the softmax record must hold 'weights' and 'large'"
    _close(_tensor(value["weights"], tuple(scores.shape), "softmax_by_hand(scores)"), scores.softmax(-1), "softmax_by_hand(scores)")
    big = _tensor(value["large"], tuple(large.shape), "softmax_by_hand on large scores")
    _close(big, large.softmax(-1), "softmax_by_hand on large scores")


@judge("ex01_attention")
def _judge_attention(value: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    q, k, v = _floats(q), _floats(k), _floats(v)
    assert isinstance(value, dict) and {"out", "weights"} <= set(value), "the attention record must hold 'out' and 'weights'"
    out, weights = reference_attention(q, k, v)
    _close(_tensor(value["weights"], tuple(weights.shape), "weights"), weights, "attention_by_hand weights")
    _close(_tensor(value["out"], tuple(out.shape), "out"), out, "attention_by_hand out")


# ---- self-check diagnosis ------------------------------------------------------------------------


_call = call_student  # shared: tinytf.course.reference.call_student


def diagnose(namespace: dict[str, Any]) -> list[Any]:
    """Findings about the student's ex01 functions in ``namespace`` (empty when all look right).

    Runs the student's code on a few fixed-seed probes (Tq != Tk, d != 4, batch and head axes);
    it never raises.
    """
    from tinytf.checks import Finding

    try:
        return _diagnose(namespace)
    except Exception as err:  # noqa: BLE001 - the diagnosis itself must never crash the notebook
        return [Finding(0, "the self-check could not finish", f"{type(err).__name__}: {err}")]


def _diagnose(namespace: dict[str, Any]) -> list[Any]:
    from tinytf.checks import Finding, diagnose_attention

    findings: list[Any] = []
    g = torch.Generator().manual_seed(1234)
    q = torch.randn(2, 3, 5, 8, generator=g)
    k = torch.randn(2, 3, 7, 8, generator=g)
    v = torch.randn(2, 3, 7, 6, generator=g)

    hand = namespace.get("hand_qk")
    if hand is None:
        findings.append(Finding(0, "hand_qk is not defined yet", "Task 1a: type your QKᵀ table as a nested list hand_qk[i][j]."))
    else:
        try:
            table = torch.tensor(hand, dtype=torch.float32)
            ok = tuple(table.shape) == (3, 3) and torch.allclose(
                table, torch.tensor(EXAMPLE_Q) @ torch.tensor(EXAMPLE_K).T
            )
        except Exception:  # noqa: BLE001
            ok = False
        if not ok:
            findings.append(Finding(2, "hand_qk is not QKᵀ of the example",
                                    "Entry [i][j] is the dot product of query row i with key row j (no scaling yet): "
                                    "a 3 x 3 table, rows = queries, columns = keys."))

    fns = {name: namespace.get(name) for name in ("scores_by_hand", "softmax_by_hand", "attention_by_hand")}
    for name, fn in fns.items():
        if not callable(fn):
            findings.append(Finding(0, f"{name} is missing", f"Define {name} in the notebook (keep its name and signature)."))
    scores_fn, softmax_fn, attn_fn = fns["scores_by_hand"], fns["softmax_by_hand"], fns["attention_by_hand"]

    working = {}
    if callable(scores_fn):
        s, problem = _call("scores_by_hand", scores_fn, q, k)
        if problem:
            findings.append(problem)
        else:
            working["scores"] = True
            expected = reference_scores(q, k)
            if not isinstance(s, torch.Tensor) or tuple(s.shape) != tuple(expected.shape):
                shape = list(s.shape) if isinstance(s, torch.Tensor) else type(s).__name__
                hint = " (did you multiply by k instead of k.transpose(-2, -1)?)" if isinstance(s, torch.Tensor) else ""
                findings.append(Finding(2, "scores_by_hand returns the wrong shape",
                                        f"For q {list(q.shape)} and k {list(k.shape)} the scores must be [B, H, Tq, Tk] = "
                                        f"{list(expected.shape)}, got {shape}{hint}."))
            elif not torch.allclose(s, expected, atol=1e-4):
                raw = q @ k.transpose(-2, -1)
                if torch.allclose(s, raw, atol=1e-4):
                    msg = "the scores are not divided by sqrt(d): divide q @ kᵀ by math.sqrt(q.size(-1))."
                elif torch.allclose(s, raw / q.size(-1), atol=1e-4):
                    msg = "the scores are divided by d instead of sqrt(d)."
                else:
                    msg = "the values differ from q @ k.transpose(-2, -1) / sqrt(d) with d = q.size(-1) (the per-head width)."
                findings.append(Finding(1, "scores_by_hand: wrong scaling or values", msg))

    if callable(softmax_fn):
        scores = torch.randn(2, 3, 5, 7, generator=g) * 3
        w, problem = _call("softmax_by_hand", softmax_fn, scores)
        if problem:
            findings.append(problem)
        elif not isinstance(w, torch.Tensor) or w.shape != scores.shape:
            findings.append(Finding(0, "softmax_by_hand changes the shape",
                                    f"scores {list(scores.shape)} must give weights of the same shape."))
        elif not torch.allclose(w.sum(-1), torch.ones(scores.shape[:-1]), atol=1e-4):
            findings.append(Finding(2, "softmax_by_hand: rows do not sum to one",
                                    "Normalise over the keys, the last axis: e / e.sum(dim=-1, keepdim=True)."))
        elif not torch.allclose(w, scores.softmax(-1), atol=1e-5):
            findings.append(Finding(0, "softmax_by_hand: wrong values", "Compare with torch.softmax(scores, dim=-1) on a small example."))
        else:
            working["softmax"] = True
            big, problem = _call("softmax_by_hand", softmax_fn, torch.tensor([[1000.0, 999.0, 0.0]]))
            if problem or not isinstance(big, torch.Tensor) or not bool(torch.isfinite(big).all()):
                findings.append(Finding(0, "softmax_by_hand overflows on large scores",
                                        "exp(1000) is inf in float32: subtract each row's maximum "
                                        "(scores.amax(dim=-1, keepdim=True)) before exp; softmax does not change."))

    if callable(attn_fn):
        res, problem = _call("attention_by_hand", attn_fn, q, k, v)
        if problem:
            findings.append(problem)
        elif not (isinstance(res, (tuple, list)) and len(res) == 2):
            findings.append(Finding(0, "attention_by_hand must return (out, weights)", "Return a pair: weights @ v and the weights."))
        elif working.get("scores") and working.get("softmax") and not findings:
            # the full property probe of tinytf.checks, with the mask applied before the student's softmax
            def as_attention(q, k, v, mask=None):
                if mask is None:
                    return attn_fn(q, k, v)[0]
                weights = softmax_fn(scores_fn(q, k).masked_fill(~mask, float("-inf")))
                return weights @ v

            findings.extend(diagnose_attention(as_attention))
            ref_out, ref_w = reference_attention(q, k, v)
            out, w = res
            if not findings and not (
                isinstance(out, torch.Tensor) and isinstance(w, torch.Tensor)
                and out.shape == ref_out.shape and w.shape == ref_w.shape
                and torch.allclose(out, ref_out, atol=1e-4) and torch.allclose(w, ref_w, atol=1e-4)
            ):
                findings.append(Finding(0, "attention_by_hand differs from tinytf",
                                        "Return (weights @ v, weights) with weights = softmax_by_hand(scores_by_hand(q, k))."))
    return findings
