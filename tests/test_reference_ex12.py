"""Exercise 12's judges, probes and self-check diagnosis, on the instructor notebook's own code.

The solution cells run in one namespace; every test cell (visible and hidden parts) records, and every record
satisfies its judge; wrong values on the recorded inputs are rejected with a message that names the chapter-13
pitfall; ``diagnose`` is silent on the solution, names each pitfall (30-36) on a wrong student function with its fix,
and judges ``rope_decode_step`` on tinytf's rotation (each task on its own).
"""

from __future__ import annotations

import _runner as R
import pytest
import torch

from tinytf.checks import Pitfall
from tinytf.checks.rope import reference_rope, reference_rope_decode
from tinytf.course.reference import ex12

TESTS = ("ex12_rope", "ex12_decode", "ex12_alibi")
CODE = ("ex12_setup", "ex12_rope_code", "ex12_decode_code", "ex12_alibi_code")


def _cells() -> dict:
    return R.instructor_cells("ex12_rope.ipynb")


@pytest.fixture(scope="module")
def ns() -> dict:
    return R.run_cells(_cells(), CODE)


def test_every_test_cell_has_a_judge_and_a_probe():
    R.assert_hidden_tests_use_their_probes(_cells(), TESTS, ex12.PROBES, "_probes12")
    assert R.graded_points(_cells()) == {"ex12_rope": 4, "ex12_decode": 4, "ex12_alibi": 5, "ex12_explain": 2}


@pytest.fixture(scope="module")
def records(ns, tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("ex12_records")
    return R.record_tests(ns, _cells(), TESTS, folder)


def test_the_solution_satisfies_every_judge(records):
    R.assert_judges_accept(records)


def test_the_hidden_inputs_are_the_hard_ones(records):
    rope = records["ex12_rope"]["inputs"]
    assert int(rope["far_positions"][0]) >= 4000, "low-precision angles show only far from position 0"
    assert rope["half"].dtype == torch.bfloat16, "angles built in x's dtype, or a result not cast back, show on a bfloat16 x"
    assert int(rope["near_positions"][0]) >= 1 and rope["near"].size(-1) >= 4, "positions ignored, and a second pair"
    decode = records["ex12_decode"]["inputs"]
    assert decode["past"] >= 1 and decode["q"].size(-2) == 1, "a decode step after a cache, where position 0 is wrong"
    assert decode["chunk"]["past"] >= 1 and decode["chunk"]["q"].size(-2) >= 2, "new tokens that must not see each other's future"
    alibi = records["ex12_alibi"]["inputs"]
    assert [4, 3, 7] in alibi["sizes"], "several heads but not 8, t_k > t_q: slopes and alignment show"
    assert alibi["lengths"][-1] == 2 and alibi["t"] > max(alibi["lengths"]), "every row padded, one with two real tokens"


def test_wrong_values_are_rejected_with_a_message_that_names_the_pitfall(records):
    rec = records["ex12_rope"]
    inputs = rec["inputs"]
    interleaved = {"near": reference_rope(inputs["near"], inputs["near_positions"], layout="interleaved"),
                   "far": reference_rope(inputs["far"], inputs["far_positions"], layout="interleaved")}
    R.rejects("ex12_rope", interleaved, inputs, "pitfall 30", "interleaved")
    low = dict(rec["value"], far=reference_rope(inputs["far"], inputs["far_positions"], angle_dtype=torch.bfloat16))
    R.rejects("ex12_rope", low, inputs, "pitfall 34", "bfloat16")

    rec = records["ex12_decode"]
    args = [rec["inputs"][k] for k in ("q", "k", "v", "k_cache", "v_cache", "past")]
    for kwargs, pitfall in ((dict(rotate_v=True), "pitfall 31"), (dict(q_at=0, k_at=0), "pitfall 32"), (dict(again=True), "pitfall 33")):
        out, keys, values = reference_rope_decode(*args, **kwargs)
        R.rejects("ex12_decode", {"out": out, "k_cache": keys, "v_cache": values}, rec["inputs"], pitfall)
    out, keys, values = reference_rope_decode(*args, store_raw=True)
    R.rejects("ex12_decode", {"out": out, "k_cache": keys, "v_cache": values}, rec["inputs"], "pitfall 33", "k_cache")

    rope = records["ex12_rope"]
    R.rejects("ex12_rope", dict(rope["value"], half=rope["value"]["half"].float()), rope["inputs"], "bfloat16", "float32")  # dtype lost

    rec = records["ex12_decode"]
    chunk = rec["inputs"]["chunk"]
    cargs = [chunk[k] for k in ("q", "k", "v", "k_cache", "v_cache", "past")]
    q_r = reference_rope(chunk["q"], torch.arange(chunk["past"], chunk["past"] + chunk["q"].size(-2)))
    _, keys, values = reference_rope_decode(*cargs)
    unmasked = torch.nn.functional.scaled_dot_product_attention(q_r, keys, values)  # no causal mask among the new tokens
    R.rejects("ex12_decode", dict(rec["value"], chunk={"out": unmasked, "k_cache": keys, "v_cache": values}), rec["inputs"],
              "out differs", f"past={chunk['past']}")

    rec = records["ex12_alibi"]
    future = [b.masked_fill(torch.ones_like(b, dtype=torch.bool).triu(diagonal=b.size(-1) - b.size(-2) + 1), float("-inf"))
              for b in rec["value"]["bias"]]
    R.accepts("ex12_alibi", dict(rec["value"], bias=future), rec["inputs"])  # the keys after a query are not checked
    flipped = dict(rec["value"], bias=[-b for b in rec["value"]["bias"]])
    R.rejects("ex12_alibi", flipped, rec["inputs"], "pitfall 36", "sign is flipped")
    t = rec["inputs"]["t"]
    from_pads = dict(rec["value"], positions=torch.arange(t).expand(len(rec["inputs"]["lengths"]), t).clone())
    if min(rec["inputs"]["lengths"]) < t:
        R.rejects("ex12_alibi", from_pads, rec["inputs"], "pitfall 35")


def test_diagnose_is_silent_on_the_solution(ns):
    assert ex12.diagnose(dict(ns)) == []


def _interleaved(x, positions, base=10000.0):
    return reference_rope(x, positions, base, layout="interleaved")


def _bf16(x, positions, base=10000.0):
    return reference_rope(x, positions, base, angle_dtype=torch.bfloat16)


def _v_rotated(*args):
    return reference_rope_decode(*args, rotate_v=True)


def _at_zero(*args):
    return reference_rope_decode(*args, q_at=0, k_at=0)


def _twice(*args):
    return reference_rope_decode(*args, again=True)


def _flipped(heads, t_q, t_k):
    return -ex12.reference_alibi(heads, t_q, t_k)


def _from_pads(lengths, t):
    return torch.arange(t).expand(len(lengths), t).clone()


@pytest.mark.parametrize("name,wrong,pitfall", [
    ("rope", _interleaved, Pitfall.ROPE_LAYOUT),
    ("rope", _bf16, Pitfall.LOW_PRECISION_ANGLES),
    ("rope_decode_step", _v_rotated, Pitfall.ROPE_ON_V),
    ("rope_decode_step", _at_zero, Pitfall.DECODE_AT_ZERO),
    ("rope_decode_step", _twice, Pitfall.KEYS_ROTATED_TWICE),
    ("alibi_bias", _flipped, Pitfall.ALIBI_BIAS),
    ("position_ids", _from_pads, Pitfall.LEFT_PAD_OFFSET),
])
def test_diagnose_names_each_pitfall_with_its_fix(ns, name, wrong, pitfall):
    findings = ex12.diagnose(dict(ns, **{name: wrong}))
    assert {f.pitfall for f in findings} == {pitfall}, findings  # the decode step runs on tinytf's rope
    assert all("Fix:" in f.text for f in findings), findings


def test_the_decode_step_is_diagnosed_on_its_own(ns):
    def stub(*args):
        raise NotImplementedError()

    findings = ex12.diagnose(dict(ns, rope_decode_step=stub))
    assert [f.title for f in findings] == ["rope_decode_step is not implemented yet"], findings
    findings = ex12.diagnose(dict(ns, rope=_interleaved))  # a wrong rope costs part A only
    assert {f.pitfall for f in findings} == {Pitfall.ROPE_LAYOUT}, findings


def test_probes_match_the_hidden_tests_judges(ns):
    R.assert_probes_pass(ns, ex12.PROBES)
