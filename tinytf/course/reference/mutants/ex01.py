"""Exercise 1's mutants: QKᵀ by hand, the scaled scores, the softmax and attention (see :mod:`.`)."""

from __future__ import annotations

import math
from typing import Any

from tinytf.checks import Pitfall

from ....translation import N_
from . import Correct, Family, Mutant

EXAMPLE_Q = [[1.0, 0.0, 1.0, 0.0], [0.0, 2.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]
EXAMPLE_K = [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]]
EXAMPLE_V = [[1.0, 0.0, 0.0, 0.0], [0.0, 10.0, 0.0, 0.0], [0.0, 0.0, 100.0, 0.0]]


def _dots(a: list[list[float]], b: list[list[float]]) -> list[list[float]]:
    return [[sum(x * y for x, y in zip(r, c)) for c in b] for r in a]


def _table(rows: list[list[float]]) -> Any:
    return lambda ns: {"hand_qk": [list(r) for r in rows]}


def _softmax_rows(rows: list[list[float]], scale: float) -> list[list[float]]:
    out = []
    for r in rows:
        e = [math.exp(x * scale - max(r) * scale) for x in r]
        out.append([x / sum(e) for x in e])
    return out


QK = _dots(EXAMPLE_Q, EXAMPLE_K)

HAND = Family(
    task="ex01_hand_qk", cell="ex01_hand_answer", subject="hand_qk",
    source="hand_qk = [[0.0, 1.0, 1.0],\n           [2.0, 0.0, 0.0],\n           [1.0, 2.0, 1.0]]\n",
    mutants=(
        Mutant("transposed", Pitfall.ORIENTATION, N_("hand_qk is transposed (it is KQᵀ)"),
               N_("your table is KQᵀ: entry [i][j] is key i · query j, so its rows are keys; QKᵀ is not symmetric here."),
               N_("transpose your table: row i = query i, entry [i][j] = q[i] · k[j]"), bind=_table(_dots(EXAMPLE_K, EXAMPLE_Q))),
        Mutant("scaled", Pitfall.GENERAL, N_("hand_qk is already scaled"),
               N_("your table is QKᵀ / sqrt(d) = QKᵀ / 2: Part A asks for the raw dot products; the scaling is Part B's."),
               N_("type the raw dot products q[i] · k[j], without dividing by sqrt(d)"),
               bind=_table([[x / 2 for x in r] for r in QK])),
        Mutant("queries_twice", Pitfall.GENERAL, N_("hand_qk multiplies the queries with themselves"),
               N_("your table is QQᵀ: entry [i][j] = q[i] · q[j], the queries against the queries, not against the keys."),
               N_("take each query row with each KEY row: entry [i][j] = q[i] · k[j]"), bind=_table(_dots(EXAMPLE_Q, EXAMPLE_Q))),
        Mutant("values_as_keys", Pitfall.GENERAL, N_("hand_qk uses the values as keys"),
               N_("your table is QVᵀ: entry [i][j] = q[i] · v[j]; the scores compare queries with keys."),
               N_("use the rows of k, not v: entry [i][j] = q[i] · k[j]"), bind=_table(_dots(EXAMPLE_Q, EXAMPLE_V))),
        Mutant("weights", Pitfall.GENERAL, N_("hand_qk holds the attention weights"),
               N_("your table is softmax(QKᵀ / 2), the weights of Part C: every row sums to one. Part A asks for the raw QKᵀ."),
               N_("type QKᵀ itself: entry [i][j] = q[i] · k[j], before any scaling or softmax"),
               bind=_table(_softmax_rows(QK, 0.5))),
    ),
    correct=(Correct("ints", bind=_table([[int(x) for x in r] for r in QK])),
             Correct("computed", bind=lambda ns: {"hand_qk": tuple(tuple(r) for r in _dots(EXAMPLE_Q, EXAMPLE_K))})),
)


def _d(value: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    q = inputs["q"]
    return {"d": q.size(-1), "root": math.sqrt(q.size(-1)), "tq": q.size(-2), "shape": list(q.shape)}


SCORES = Family(
    task="ex01_scores", cell="ex01_scores_answer", subject="scores_by_hand",
    source=("def scores_by_hand(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:\n"
            "    d = q.size(-1)\n"
            "    return (q @ k.transpose(-2, -1)) / math.sqrt(d)\n"),
    mutants=(
        Mutant("unscaled", Pitfall.SCALE, N_("scores_by_hand: the scores are not divided by sqrt(d)"),
               N_("your scores are exactly sqrt(d) = {root:.3g} times the reference (d = {d}): q @ kᵀ without the division by sqrt(d)."),
               N_("divide by math.sqrt(d) with d = q.size(-1)"), facts=_d,
               edits=(("(q @ k.transpose(-2, -1)) / math.sqrt(d)", "(q @ k.transpose(-2, -1))"),)),
        Mutant("by_d", Pitfall.SCALE, N_("scores_by_hand: the scores are divided by d instead of sqrt(d)"),
               N_("your scores are exactly 1/sqrt(d) = 1/{root:.3g} of the reference (d = {d}): q @ kᵀ / d."),
               N_("divide by sqrt(q.size(-1)), not by d"), facts=_d, edits=(("/ math.sqrt(d)", "/ d"),)),
        Mutant("times_sqrt", Pitfall.SCALE, N_("scores_by_hand multiplies by sqrt(d)"),
               N_("your scores are exactly d = {d} times the reference: q @ kᵀ · sqrt(d) instead of / sqrt(d)."),
               N_("divide by math.sqrt(d) instead of multiplying"), facts=_d, edits=(("/ math.sqrt(d)", "* math.sqrt(d)"),)),
        Mutant("wrong_width", Pitfall.SCALE, N_("scores_by_hand scales by the wrong axis's size"),
               N_("your scores are q @ kᵀ / sqrt({tq}): d was taken from q.size(-2), the number of queries, not the width {d} of one "
                  "query vector."),
               N_("take d = q.size(-1), the last axis"), facts=_d, edits=(("d = q.size(-1)", "d = q.size(-2)"),)),
        Mutant("transposed", Pitfall.ORIENTATION, N_("scores_by_hand computes k @ qᵀ"),
               N_("your scores are [..., Tk, Tq], the transpose: rows are keys and columns are queries (k @ qᵀ / sqrt(d))."),
               N_("q @ k.transpose(-2, -1): rows = queries, columns = keys"),
               edits=(("(q @ k.transpose(-2, -1))", "(k @ q.transpose(-2, -1))"),)),
    ),
    correct=(Correct("einsum", edits=(("(q @ k.transpose(-2, -1))", 'torch.einsum("...qd,...kd->...qk", q, k)'),)),
             Correct("scale_first", edits=(("(q @ k.transpose(-2, -1)) / math.sqrt(d)", "(q / math.sqrt(d)) @ k.transpose(-2, -1)"),))),
)


def _gap(value: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    rows = inputs["large"].amax(-1)
    return {"gap": float(rows.max() - rows.min()), "big": float(inputs["large"].max())}


SOFTMAX = Family(
    task="ex01_softmax", cell="ex01_softmax_answer", subject="softmax_by_hand",
    source=("def softmax_by_hand(scores: torch.Tensor) -> torch.Tensor:\n"
            "    shifted = scores - scores.amax(dim=-1, keepdim=True)\n"
            "    e = shifted.exp()\n"
            "    return e / e.sum(dim=-1, keepdim=True)\n"),
    mutants=(
        Mutant("no_shift", Pitfall.GENERAL, N_("softmax_by_hand overflows on large scores"),
               N_("your softmax is exp(scores) / sum without subtracting each row's maximum: on scores of {big:.0f} exp gives inf and "
                  "the row becomes inf / inf = NaN, though the softmax of that row is finite."),
               N_("subtract each row's maximum before exp: e = (scores - scores.amax(dim=-1, keepdim=True)).exp()"), facts=_gap,
               edits=(("scores - scores.amax(dim=-1, keepdim=True)", "scores"),)),
        Mutant("global_max", Pitfall.GENERAL, N_("softmax_by_hand subtracts the maximum of the whole tensor"),
               N_("your softmax shifts every row by scores.max(), the largest score anywhere, not by the row's own maximum: a row whose "
                  "maximum lies {gap:.0f} below it underflows to exp(…) = 0 everywhere and comes out 0 / 0 = NaN."),
               N_("subtract each row's own maximum: scores - scores.amax(dim=-1, keepdim=True)"), facts=_gap,
               edits=(("scores.amax(dim=-1, keepdim=True)", "scores.max()"),)),
        Mutant("min_shift", Pitfall.GENERAL, N_("softmax_by_hand subtracts each row's minimum"),
               N_("your softmax shifts each row by its minimum, not its maximum: a row spanning more than about 88 (here up to "
                  "{gap:.0f}) overflows exp to inf and becomes NaN."),
               N_("subtract the row maximum: amax, not amin"), facts=_gap, edits=(("scores.amax(", "scores.amin("),)),
        Mutant("over_queries", Pitfall.ORIENTATION, N_("softmax_by_hand normalises over the queries"),
               N_("your weights are the softmax over dim -2, the queries: every column sums to one, the rows do not."),
               N_("normalise over the keys, the last axis: dim=-1 in both the maximum and the sum"),
               edits=(("amax(dim=-1", "amax(dim=-2"), ("e.sum(dim=-1", "e.sum(dim=-2"))),
        Mutant("over_heads", Pitfall.ORIENTATION, N_("softmax_by_hand: rows do not sum to one (it normalises over dim 1)"),
               N_("your weights are the softmax over dim 1 (the heads of [B, H, Tq, Tk] scores): the rows do not sum to one; "
                  "the weights must be normalised over the keys, the last axis."),
               N_("sum over the keys (dim=-1): the maximum and the sum both over dim=-1, e / e.sum(dim=-1, keepdim=True)"),
               edits=(("amax(dim=-1", "amax(dim=1"), ("e.sum(dim=-1", "e.sum(dim=1"))),
        Mutant("global_sum", Pitfall.GENERAL, N_("softmax_by_hand divides by the sum of the whole tensor"),
               N_("your weights are exp(shifted) / exp(shifted).sum() over every entry: all weights together sum to one, each row "
                  "only to its share."),
               N_("divide by each row's own sum: e / e.sum(dim=-1, keepdim=True)"),
               edits=(("e.sum(dim=-1, keepdim=True)", "e.sum()"),)),
        Mutant("in_place", Pitfall.GENERAL, N_("softmax_by_hand changes its input in place"),
               N_("your weights are right, but the call subtracts the row maxima from the caller's scores tensor (sub_): after it, "
                  "the scores passed in hold scores - max."),
               N_("compute the shift as a new tensor, scores - scores.amax(dim=-1, keepdim=True); never edit an input in place"),
               edits=(("scores - scores.amax(dim=-1, keepdim=True)", "scores.sub_(scores.amax(dim=-1, keepdim=True))"),)),
    ),
    correct=(Correct("logsumexp", edits=(("e / e.sum(dim=-1, keepdim=True)", "(shifted - e.sum(dim=-1, keepdim=True).log()).exp()"),)),
             Correct("max_values", edits=(("scores.amax(dim=-1, keepdim=True)", "scores.max(dim=-1, keepdim=True).values"),))),
)


def _widths(value: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    return {"d": inputs["k"].size(-1), "dv": inputs["v"].size(-1)}


ATTENTION = Family(
    task="ex01_attention", cell="ex01_attention_answer", subject="attention_by_hand",
    source=("def attention_by_hand(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:\n"
            "    weights = softmax_by_hand(scores_by_hand(q, k))\n"
            "    return weights @ v, weights\n"),
    mutants=(
        Mutant("swapped_pair", Pitfall.GENERAL, N_("attention_by_hand returns (weights, out)"),
               N_("your pair is (weights, weights @ v): the first entry must be out [..., Tq, dv], the second the weights "
                  "[..., Tq, Tk]."),
               N_("return out first: return weights @ v, weights"),
               edits=(("return weights @ v, weights", "return weights, weights @ v"),)),
        Mutant("scaled_twice", Pitfall.SCALE, N_("attention_by_hand scales the scores twice"),
               N_("your weights are softmax(q kᵀ / d): scores_by_hand already divides by sqrt(d), and the scores were divided by "
                  "sqrt(d) again."),
               N_("hand scores_by_hand(q, k) to softmax_by_hand as it is: it is scaled already"),
               edits=(("softmax_by_hand(scores_by_hand(q, k))", "softmax_by_hand(scores_by_hand(q, k) / math.sqrt(q.size(-1)))"),)),
        Mutant("unscaled", Pitfall.SCALE, N_("attention_by_hand skips the scaling"),
               N_("your weights are softmax(q kᵀ) without 1/sqrt(d): the raw products bypass scores_by_hand."),
               N_("compute the scores with scores_by_hand(q, k): it divides by sqrt(d)"),
               edits=(("scores_by_hand(q, k)", "q @ k.transpose(-2, -1)"),)),
        Mutant("out_from_k", Pitfall.GENERAL, N_("attention_by_hand averages the keys"),
               N_("your out is weights @ k: it averages the keys (width d = {d}) instead of the values (width dv = {dv})."),
               N_("multiply the weights by the values: out = weights @ v"), facts=_widths,
               edits=(("return weights @ v, weights", "return weights @ k, weights"),)),
        Mutant("no_softmax", Pitfall.GENERAL, N_("attention_by_hand skips the softmax"),
               N_("your weights are the scaled scores themselves: no softmax, so the rows do not sum to one and out is scores @ v."),
               N_("weights = softmax_by_hand(scores_by_hand(q, k))"),
               edits=(("softmax_by_hand(scores_by_hand(q, k))", "scores_by_hand(q, k)"),)),
    ),
    correct=(Correct("einsum", edits=(("return weights @ v, weights", 'return torch.einsum("...qk,...kd->...qd", weights, v), weights'),)),
             Correct("broadcast_sum", edits=(("return weights @ v, weights",
                                              "return (weights[..., :, :, None] * v[..., None, :, :]).sum(-2), "
                                              "weights"),))),
)

FAMILIES = (HAND, SCORES, SOFTMAX, ATTENTION)
