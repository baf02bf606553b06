"""Exercise 1 — attention by hand: judges for the hidden tests and the self-check diagnosis.

Student functions (in the notebook): ``hand_qk`` (a 3x3 list), ``scores_by_hand(q, k)``,
``softmax_by_hand(scores)``, ``attention_by_hand(q, k, v) -> (out, weights)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from tinytf.checks import Finding, Pitfall, found
from tinytf.checks.findings import tensor_relation

from ...translation import gettext
from ...translation import gettext as _
from . import Probe, call_student, check_parts, explained, flat, swapped
from .judging import judge
from .validators import close, differs, float_inputs, has_keys, shape_of, shapes, tensor

__all__ = ["EXAMPLE_Q", "EXAMPLE_K", "EXAMPLE_V", "PROBES", "REFERENCE_PARTS", "reference_scores", "reference_softmax",
           "reference_attention", "diagnose", "diagnose_tasks"]

EXAMPLE_Q = [[1.0, 0.0, 1.0, 0.0], [0.0, 2.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]
EXAMPLE_K = [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]]  # QKᵀ is not symmetric
EXAMPLE_V = [[1.0, 0.0, 0.0, 0.0], [0.0, 10.0, 0.0, 0.0], [0.0, 0.0, 100.0, 0.0]]


def reference_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q ``[..., Tq, d]``, k ``[..., Tk, d]`` -> ``q kᵀ / sqrt(d)`` ``[..., Tq, Tk]``."""
    return (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))


def reference_softmax(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis (the keys): weights ``[..., Tq, Tk]`` whose rows sum to one."""
    return scores.softmax(dim=-1)


REFERENCE_PARTS = {"scores_by_hand": reference_scores, "softmax_by_hand": reference_softmax}
"""tinytf's Tasks 1b and 1c: Task 1d's tests run ``attention_by_hand`` on these (see :func:`swapped`), so a
mistake in 1b or 1c costs only that task."""


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [..., Tq, dv], weights [..., Tq, Tk])`` from tinytf's explicit attention."""
    from tinytf import scaled_dot_product_attention

    return scaled_dot_product_attention(q, k, v, return_weights=True)


# ---- judges (run in a clean process on what the hidden tests recorded) ---------------------------


@judge("ex01_hand_qk")
def _judge_hand_qk(value: Any, q: torch.Tensor, k: torch.Tensor) -> None:
    q, k = float_inputs(q, k)
    assert q.reshape(-1).tolist() == sum(EXAMPLE_Q, []) and k.reshape(-1).tolist() == sum(EXAMPLE_K, []), (
        _("the example tensors q and k were changed; hand_qk is judged on the original example")
    )
    close(tensor(value, (3, 3), "hand_qk"), (q @ k.transpose(-2, -1))[0], _("hand_qk (row i = query i, column j = key j)"), atol=1e-4,
          given=_("the example q, k [1, 3, 4]"), reference="q @ kᵀ")


@judge("ex01_scores")
def _judge_scores(value: Any, q: torch.Tensor, k: torch.Tensor) -> None:
    q, k = float_inputs(q, k)
    expected = reference_scores(q, k)
    d = q.size(-1)
    close(tensor(value, expected.shape, "scores_by_hand(q, k)"), expected, "scores_by_hand(q, k)", given=shapes(q=q, k=k),
          reference=_("q @ kᵀ / sqrt(d)"), suspects={_("divided by d = {d} instead of sqrt(d)").format(d=d): 1 / math.sqrt(d),
                                                    _("not divided by sqrt(d)"): math.sqrt(d)})


@judge("ex01_softmax")
def _judge_softmax(value: Any, scores: torch.Tensor, large: torch.Tensor, single: torch.Tensor | None = None) -> None:
    scores, large = float_inputs(scores, large)
    has_keys(value, ("weights", "large"), _("the softmax record"))
    reference = "torch.softmax(scores, dim=-1)"
    if isinstance(value.get("after"), dict):  # the inputs as the caller holds them after the calls
        for key, given in (("scores", scores), ("large", large)):
            after = value["after"].get(key)
            assert isinstance(after, torch.Tensor) and after.shape == given.shape and torch.equal(after.float(), given), _(
                "softmax_by_hand changed its input: after the call the {key} tensor passed in no longer holds its values "
                "(an in-place operation such as sub_ or -=)").format(key=key)
    close(tensor(value["weights"], scores.shape, "softmax_by_hand(scores)"), scores.softmax(-1), "softmax_by_hand(scores)",
          given=shapes(scores=scores), reference=reference)
    what = _("softmax_by_hand on large scores (rows whose maxima lie far apart, large and very negative)")
    close(tensor(value["large"], large.shape, what), large.softmax(-1), what, given=shapes(scores=large), reference=reference)
    if single is not None:
        (single,) = float_inputs(single)
        what = _("softmax_by_hand on a single key")
        close(tensor(value.get("single"), single.shape, what), single.softmax(-1), what, given=shapes(scores=single), reference=reference)


@judge("ex01_attention")
def _judge_attention(value: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    has_keys(value, ("out", "weights"), _("the attention record"))
    q, k, v = float_inputs(q, k, v)
    out, weights = reference_attention(q, k, v)
    given, reference = shapes(q=q, k=k, v=v), "tinytf.scaled_dot_product_attention"
    close(tensor(value["weights"], weights.shape, _("attention_by_hand weights")), weights, _("attention_by_hand weights"), given=given,
          reference=reference)
    close(tensor(value["out"], out.shape, _("attention_by_hand out")), out, _("attention_by_hand out"), given=given, reference=reference)


# ---- self-check diagnosis ------------------------------------------------------------------------


def _probe() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fixed-seed q, k, v with Tq != Tk, d != 4, batch and head axes."""
    g = torch.Generator().manual_seed(1234)
    return torch.randn(2, 3, 5, 8, generator=g), torch.randn(2, 3, 7, 8, generator=g), torch.randn(2, 3, 7, 6, generator=g)


def _diagnose_hand_qk(hand: Any) -> list[Finding]:
    if hand is None:
        return [found(Pitfall.GENERAL, _("hand_qk is not defined yet"), _("Task 1a asks for the QKᵀ table of the example."),
                      fix=_("type your QKᵀ table as a nested list hand_qk[i][j]"))]
    try:
        table = torch.tensor(hand, dtype=torch.float32)
        ok = tuple(table.shape) == (3, 3) and torch.allclose(table, torch.tensor(EXAMPLE_Q) @ torch.tensor(EXAMPLE_K).T)
    except Exception:  # noqa: BLE001 - a ragged or non-numeric table is simply wrong
        ok = False
    if ok:
        return []
    if _is_transposed(hand):
        return [found(Pitfall.ORIENTATION, _("hand_qk is transposed (it is KQᵀ)"),
                      _("Row i must be query i and column j key j: entry [i][j] = q[i] · k[j]. Yours has rows = keys."),
                      fix=_("transpose your table: row i = query i, entry [i][j] = q[i] · k[j]"))]
    return [found(Pitfall.ORIENTATION, _("hand_qk is not QKᵀ of the example"),
                  _("Entry [i][j] is the dot product of query row i with key row j (no scaling yet): "
                    "a 3 x 3 table, rows = queries, columns = keys."),
                  fix=_("recompute each entry [i][j] = q[i] · k[j] of the 3 x 3 table (no scaling yet)"))]


def _is_transposed(hand: Any) -> bool:
    try:
        table = torch.tensor(hand, dtype=torch.float32)
        return tuple(table.shape) == (3, 3) and torch.allclose(table, torch.tensor(EXAMPLE_K) @ torch.tensor(EXAMPLE_Q).T)
    except Exception:  # noqa: BLE001
        return False


def _diagnose_scores(fn: Any) -> list[Finding]:
    q, k, _ = _probe()
    s, problem = call_student("scores_by_hand", fn, q, k)
    if problem:
        return [problem]
    expected = reference_scores(q, k)
    if not isinstance(s, torch.Tensor) or tuple(s.shape) != tuple(expected.shape):
        hint = gettext(" (did you multiply by k instead of k.transpose(-2, -1)?)") if isinstance(s, torch.Tensor) else ""
        return [found(Pitfall.ORIENTATION, gettext("scores_by_hand returns the wrong shape"),
                      gettext("For q {q_shape} and k {k_shape} the scores must be [B, H, Tq, Tk] = {expected_shape}, got "
                              "{s}{hint}.").format(
                          q_shape=list(q.shape), k_shape=list(k.shape), expected_shape=list(expected.shape), s=shape_of(s), hint=hint))]
    if torch.allclose(s, expected, atol=1e-4):
        return []
    d = q.size(-1)
    how = tensor_relation(s, expected,
                          suspects={gettext("the scores are divided by d instead of sqrt(d) (d = {d})").format(d=d): 1 / math.sqrt(d),
                                    gettext("the scores are not divided by sqrt(d)"): math.sqrt(d)})
    if how:
        msg = gettext("scores_by_hand(q, k) is {how}.").format(how=how)
    else:
        msg = (differs("scores_by_hand(q, k)", s, expected, f"q {list(q.shape)}, k {list(k.shape)}")
               + gettext(": the scores are q @ k.transpose(-2, -1) / sqrt(d) with d = q.size(-1) (the per-head width)."))
    return [found(Pitfall.SCALE, gettext("scores_by_hand: wrong scaling or values"), msg)]  # the catalog's fix is this one


def _diagnose_softmax(fn: Any) -> list[Finding]:
    scores = torch.randn(2, 3, 5, 7, generator=torch.Generator().manual_seed(1235)) * 3
    w, problem = call_student("softmax_by_hand", fn, scores)
    if problem:
        return [problem]
    if not isinstance(w, torch.Tensor) or w.shape != scores.shape:
        return [found(Pitfall.GENERAL, _("softmax_by_hand changes the shape"),
                      _("scores {scores_shape} must give weights of the same shape.").format(scores_shape=list(scores.shape)),
                      fix=_("reduce with keepdim=True and divide elementwise: e / e.sum(dim=-1, keepdim=True)"))]
    if not torch.allclose(w.sum(-1), torch.ones(scores.shape[:-1]), atol=1e-4):
        sums = w.sum(-1).flatten()[:4].tolist()  # the symptom only: the axis mistakes are the mutants' (queries, heads)
        return [found(Pitfall.GENERAL, _("softmax_by_hand: rows do not sum to one"),
                      _("each row (one query, all keys) must sum to one; yours sum to {sums} …").format(
                          sums=", ".join(f"{x:.3g}" for x in sums)),
                      fix=_("print e.sum(dim=-1) of your weights: every entry must be 1; divide each row by its own sum"))]
    if not torch.allclose(w, scores.softmax(-1), atol=1e-5):
        return [found(Pitfall.GENERAL, _("softmax_by_hand: wrong values"),
                      differs("softmax_by_hand(scores)", w, scores.softmax(-1), _("scores {scores_shape}").format(
                          scores_shape=list(scores.shape))) + ".",
                      fix=_("compute e = exp(scores - max) and e / e.sum(dim=-1, keepdim=True), as torch.softmax(scores, dim=-1) does"))]
    big, problem = call_student("softmax_by_hand", fn, torch.tensor([[1000.0, 999.0, 0.0]]))
    if problem or not isinstance(big, torch.Tensor) or not bool(torch.isfinite(big).all()):
        return [found(Pitfall.GENERAL, _("softmax_by_hand overflows on large scores"),
                      _("exp(1000) is inf in float32; subtracting each row's maximum does not change the softmax."),
                      fix=_("subtract each row's maximum before exp: e = (scores - scores.amax(dim=-1, keepdim=True)).exp()"))]
    return []


def _diagnose_attention(attn_fn: Any, namespace: dict[str, Any]) -> list[Finding]:
    """The pair structure, then the property probe of tinytf.checks; attention_by_hand runs on tinytf's
    scores and softmax (:data:`REFERENCE_PARTS`), as in its test, so that it is judged on its own."""
    from tinytf.checks import diagnose_attention

    q, k, v = _probe()
    with swapped(namespace, **REFERENCE_PARTS):
        res, problem = call_student("attention_by_hand", attn_fn, q, k, v)
        if problem:
            return [problem]
        if not (isinstance(res, (tuple, list)) and len(res) == 2):
            return [found(Pitfall.GENERAL, _("attention_by_hand must return (out, weights)"),
                          _("it returned {type}.").format(type=type(res).__name__),
                          fix=_("return a pair: return weights @ v, weights"))]

        def as_attention(q, k, v, mask=None):  # the mask is applied before the softmax
            if mask is None:
                return attn_fn(q, k, v)[0]
            return reference_softmax(reference_scores(q, k).masked_fill(~mask, float("-inf"))) @ v

        findings = diagnose_attention(as_attention)
    ref_out, ref_w = reference_attention(q, k, v)
    out, w = res
    wrong_out = not (isinstance(out, torch.Tensor) and out.shape == ref_out.shape and torch.allclose(out, ref_out, atol=1e-4))
    wrong_w = not (isinstance(w, torch.Tensor) and w.shape == ref_w.shape and torch.allclose(w, ref_w, atol=1e-4))
    if not findings and (wrong_out or wrong_w):
        given = f"q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}"
        findings.append(found(Pitfall.GENERAL, _("attention_by_hand differs from tinytf"),
                              differs(_("attention_by_hand out") if wrong_out else _("attention_by_hand weights"),
                                      out if wrong_out else w, ref_out if wrong_out else ref_w, given) + ".",
                              fix=_("return (weights @ v, weights) with weights = softmax_by_hand(scores_by_hand(q, k))")))
    return findings


# ---- the judges on fresh inputs (the self-check's copy of the grader's verdict) ------------------


def _sizes(gen: torch.Generator) -> tuple[int, int, int]:
    """Fresh ``(Tq, Tk, d)`` with Tq != Tk and d > Tq (a width taken from the wrong axis always shows), drawn
    independently of the hidden tests."""
    tq = int(torch.randint(2, 7, (1,), generator=gen))
    return tq, tq + int(torch.randint(1, 4, (1,), generator=gen)), tq + int(torch.randint(1, 11, (1,), generator=gen))


LARGE = torch.tensor([[1000.0, 999.0, 0.0, -5.0, 998.5],  # a row of large scores: exp overflows without the shift
                      [-1000.0, -1001.0, -2000.0, -999.5, -1003.0],  # very negative: 2000 below row 0's maximum
                      [3.0, -90.0, 0.5, 1.0, 2.0]])  # a row spanning 93: exp(score - min) overflows
"""Softmax inputs that expose each pitfall deterministically: rows whose maxima lie far apart, large and very
negative scores, a wide spread inside a row; every softmax probe includes them (plus fresh random rows)."""

def _probe_hand(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    return torch.tensor(ns["hand_qk"], dtype=torch.float32), {"q": torch.tensor([EXAMPLE_Q]), "k": torch.tensor([EXAMPLE_K])}


def _probe_scores(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    tq, tk, d = _sizes(gen)
    q, k = torch.randn(2, 3, tq, d, generator=gen), torch.randn(2, 3, tk, d, generator=gen)
    return ns["scores_by_hand"](q, k), {"q": q, "k": k}


def _probe_softmax(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    scores = torch.randn(2, 3, 4, 6, generator=gen) * 4
    large = torch.cat([LARGE, torch.randn(3, 5, generator=gen) * 300 + 800])
    single = torch.randn(2, 4, 1, generator=gen) * 5  # one key: every weight is 1
    given = {"scores": scores.clone(), "large": large.clone()}  # what the caller holds; the calls get these tensors
    fn = ns["softmax_by_hand"]
    value = {"weights": fn(given["scores"]), "large": fn(given["large"]), "single": fn(single.clone()), "after": given}
    return value, {"scores": scores, "large": large, "single": single}


def _probe_attention(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    tq, tk, d = _sizes(gen)
    q, k, v = (torch.randn(2, 2, t, n, generator=gen) for t, n in ((tq, d), (tk, d), (tk, d - 1)))  # dv != d
    with swapped(ns, **REFERENCE_PARTS):  # Task 1d is judged on its own, as in its test
        out, weights = ns["attention_by_hand"](q, k, v)
    return {"out": out, "weights": weights}, {"q": q, "k": k, "v": v}


PROBES: dict[str, Probe] = {"ex01_hand_qk": _probe_hand, "ex01_scores": _probe_scores, "ex01_softmax": _probe_softmax,
                            "ex01_attention": _probe_attention}


def diagnose_tasks(namespace: dict[str, Any], only: Iterable[str] | None = None) -> dict[str, list[Finding]]:
    """``{grade_id: findings}`` about the student's ex01 functions in ``namespace`` (empty lists when all look right).

    The named checks run the student's code on a few fixed-seed probes (Tq != Tk, d != 4, batch and head axes),
    attention_by_hand on tinytf's scores and softmax (each task on its own); the task's mutants (the plausible
    mistakes, :mod:`.mutants.ex01`) say what a wrong result is; then the grader's judges decide on fresh random
    inputs (:data:`PROBES`) for every task that nothing explains yet. Never raises.
    """
    by_task = {"ex01_hand_qk": lambda: _diagnose_hand_qk(namespace.get("hand_qk")),
               "ex01_scores": lambda: check_parts(namespace, [("scores_by_hand", _diagnose_scores)]),
               "ex01_softmax": lambda: check_parts(namespace, [("softmax_by_hand", _diagnose_softmax)]),
               "ex01_attention": lambda: check_parts(namespace, [("attention_by_hand", lambda fn: _diagnose_attention(fn, namespace))])}
    return explained(namespace, PROBES, by_task, only=only)


def diagnose(namespace: dict[str, Any]) -> list[Finding]:
    """Findings about the student's ex01 functions in ``namespace`` (empty when all look right); see :func:`diagnose_tasks`."""
    return flat(diagnose_tasks(namespace))
