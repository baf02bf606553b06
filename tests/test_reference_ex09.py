"""Exercise 9's judges, probes and self-check diagnosis, on the instructor notebook's own code.

The solution cells run in one namespace; every test cell (visible and hidden parts) records, and every
record satisfies its judge; wrong values on the recorded inputs are rejected with a message; ``diagnose``
is silent on the solution, names each chapter-10 pitfall on a wrong student function, and judges parts
B and C on tinytf's ``online_softmax_update`` (each task on its own).
"""

from __future__ import annotations

import math

import _runner as R
import pytest
import torch

from tinytf.checks import Pitfall
from tinytf.course.reference import ex09

NEG_INF = float("-inf")
TESTS = ("ex09_update", "ex09_tiled", "ex09_memory", "ex09_causal")


def _cells() -> dict:
    return R.instructor_cells("ex09_tiled_attention.ipynb")


@pytest.fixture(scope="module")
def ns() -> dict:
    return R.run_cells(_cells(), ("ex09_setup", "ex09_update_code", "ex09_mask_helper", "ex09_tiled_code", "ex09_causal_code"))


def test_every_test_cell_has_a_judge_and_a_probe():
    R.assert_hidden_tests_use_their_probes(_cells(), TESTS, ex09.PROBES, "_probes9")
    assert R.graded_points(_cells()) == {"ex09_update": 4, "ex09_tiled": 6, "ex09_memory": 2, "ex09_causal": 4, "ex09_explain": 2}


@pytest.fixture(scope="module")
def records(ns, tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("ex09_records")
    return R.record_tests(ns, _cells(), TESTS, folder)


def test_the_solution_satisfies_every_judge(records):
    R.assert_judges_accept(records)


def test_the_hidden_inputs_are_the_hard_ones(records):
    up = records["ex09_update"]["inputs"]
    assert bool((up["scores"][:, -1] == NEG_INF).all()) and up["scores"].size(-1) > 2 * up["block_k"], "a fully masked row, 3+ tiles"
    tiled = records["ex09_tiled"]["inputs"]
    assert tiled["q"].size(-2) != tiled["k"].size(-2) and tiled["k"].size(-2) % tiled["block_k"]
    assert not bool(tiled["empty_rows"].any(-1).all()), "some rows may see nothing"
    causal = records["ex09_causal"]["inputs"]
    assert causal["k"].size(-2) == causal["q"].size(-2) < causal["k_long"].size(-2)



def test_wrong_values_are_rejected_with_a_message(records):
    rec = records["ex09_update"]
    bad_l = dict(rec["value"], l=rec["value"]["l"] * 1.5)
    R.rejects("ex09_update", bad_l, rec["inputs"], "the running sum l differs")
    nan = dict(rec["value"], acc=rec["value"]["acc"] * float("nan"))
    R.rejects("ex09_update", nan, rec["inputs"], "inf or NaN")

    rec = records["ex09_tiled"]
    unnormalised = dict(rec["value"], rising=rec["value"]["rising"] * 2.0)
    R.rejects("ex09_tiled", unnormalised, rec["inputs"], "tiled_forward (rising) differs", "— exactly twice the right value")

    rec = records["ex09_memory"]
    q = rec["inputs"]["q"]
    full = 2 * q.size(0) * q.size(1) * q.size(-2) ** 2 * 4  # scores and weights: two [B, H, T, T] float32 tensors
    R.rejects("ex09_memory", dict(rec["value"], peak_bytes=full), rec["inputs"], "never q @ kᵀ")

    rec = records["ex09_causal"]
    total = dict(rec["value"], square=dict(rec["value"]["square"], computed=10**6))
    R.rejects("ex09_causal", total, rec["inputs"], "wholly in the future")
    one_more = dict(rec["value"], square=dict(rec["value"]["square"], computed=rec["value"]["square"]["computed"] + 1))
    R.rejects("ex09_causal", one_more, rec["inputs"], "— one tile more than the right value (off by one)")


def _no_rescale(m, l, acc, scores, v):
    m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
    m_safe = m_new.masked_fill(m_new == NEG_INF, 0.0)
    p = torch.exp(scores - m_safe)
    return m_new, torch.exp(m - m_safe) * l + p.sum(-1, keepdim=True), acc + p @ v


def _causal_skipping_the_diagonal(ns):
    update = ns["online_softmax_update"]

    def causal(q, k, v, *, block_q, block_k):
        t_q, t_k = q.size(-2), k.size(-2)
        off, out, n = t_k - t_q, torch.zeros(*q.shape[:-1], v.size(-1)), 0
        for q0 in range(0, t_q, block_q):
            q1 = min(q0 + block_q, t_q)
            m = torch.full((*q.shape[:-2], q1 - q0, 1), NEG_INF)
            l, acc = torch.zeros_like(m), torch.zeros(*q.shape[:-2], q1 - q0, v.size(-1))
            for k0 in range(0, off + q0, block_k):
                k1 = min(k0 + block_k, t_k)
                s = q[..., q0:q1, :] @ k[..., k0:k1, :].transpose(-2, -1) / math.sqrt(q.size(-1))
                ok = torch.arange(k0, k1)[None, :] <= torch.arange(q0, q1)[:, None] + off
                m, l, acc = update(m, l, acc, s.masked_fill(~ok, NEG_INF), v[..., k0:k1, :])
                n += 1
            out[..., q0:q1, :] = acc / l.masked_fill(l == 0, 1.0)
        return out, n

    return causal


def test_diagnose_is_silent_on_the_solution(ns):
    assert ex09.diagnose(dict(ns)) == []


def test_diagnose_names_each_pitfall_and_judges_each_task_on_its_own(ns):
    wrong_a = dict(ns, online_softmax_update=_no_rescale)
    findings = ex09.diagnose(wrong_a)
    assert {f.pitfall for f in findings} == {Pitfall.ACC_NOT_RESCALED}, findings  # parts B, C run on tinytf's update

    wrong_c = dict(ns)
    wrong_c["causal_tiled_forward"] = _causal_skipping_the_diagonal(wrong_c)
    findings = ex09.diagnose(wrong_c)
    assert {f.pitfall for f in findings} == {Pitfall.DIAGONAL_TILE_SKIPPED}, findings

    stub = dict(ns)

    def tiled_forward(q, k, v, mask=None, *, block_q, block_k):
        raise NotImplementedError()

    stub["tiled_forward"] = tiled_forward
    findings = ex09.diagnose(stub)
    assert [f.title for f in findings] == ["tiled_forward is not implemented yet"], findings


def test_probes_match_the_hidden_tests_judges(ns):
    R.assert_probes_pass(ns, ex09.PROBES)


def test_the_causal_probe_always_puts_a_query_tile_on_a_key_tile_boundary():
    """ex09_causal's "longer" shapes: Tk - Tq + q_end is a multiple of block_k for the first query tile, and a
    key tile lies beyond it, so counting one tile too many is caught on every draw (not one in block_k)."""
    import torch

    from tinytf.course.reference.ex09 import PROBES

    def forward(q, k, v, *, block_q, block_k):
        return torch.zeros_like(q), 0

    for seed in range(200):
        _, inputs = PROBES["ex09_causal"]({"causal_tiled_forward": forward}, torch.Generator().manual_seed(seed))
        tq, tk, bq, bk = inputs["q"].size(-2), inputs["k_long"].size(-2), inputs["block_q"], inputs["block_k"]
        assert tq > bq and tk > tq and (tk - tq + bq) % bk == 0 and tk - tq + bq < tk, (seed, tq, tk, bq, bk)
