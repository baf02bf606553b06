"""Exercise 10's judges, probes and self-check diagnosis, on the instructor notebook's own code.

The solution cells run in one namespace; every test cell (visible and hidden parts) records, and every
record satisfies its judge; wrong values on the recorded inputs are rejected with a message that names the
chapter-11 pitfall where there is one; ``diagnose`` is silent on the solution, names each pitfall on a wrong
student function, and judges ``grouped_attention`` on tinytf's K/V head sharing (each task on its own).
"""

from __future__ import annotations

import _runner as R
import pytest
import torch

from tinytf.checks import Pitfall
from tinytf.course.reference import ex10

TESTS = ("ex10_expand", "ex10_grouped", "ex10_cache", "ex10_window")
CODE = ("ex10_setup", "ex10_expand_code", "ex10_grouped_code", "ex10_cache_code", "ex10_window_code")


def _cells() -> dict:
    return R.instructor_cells("ex10_grouped_query.ipynb")


@pytest.fixture(scope="module")
def ns() -> dict:
    return R.run_cells(_cells(), CODE)


def test_every_test_cell_has_a_judge_and_a_probe():
    R.assert_hidden_tests_use_their_probes(_cells(), TESTS, ex10.PROBES, "_probes10")
    assert R.graded_points(_cells()) == {"ex10_expand": 3, "ex10_grouped": 4, "ex10_cache": 3, "ex10_window": 4, "ex10_explain": 2}


@pytest.fixture(scope="module")
def records(ns, tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("ex10_records")
    return R.record_tests(ns, _cells(), TESTS, folder)


def test_the_solution_satisfies_every_judge(records):
    R.assert_judges_accept(records)


def test_the_hidden_inputs_are_the_hard_ones(records):
    kv, heads = records["ex10_expand"]["inputs"]["kv"], records["ex10_expand"]["inputs"]["heads"]
    assert 1 < kv.size(1) < heads, "repeat and repeat_interleave differ only for 1 < kv_heads < heads"
    g = records["ex10_grouped"]["inputs"]
    assert 1 < g["k"].size(1) < g["q"].size(1) and g["k_one"].size(1) == 1 and g["q"].size(1) % g["bad_kv_heads"]
    windows = [a[-1] for a in records["ex10_cache"]["inputs"]["args"]]
    tokens = [a[4] for a in records["ex10_cache"]["inputs"]["args"]]
    assert windows[0] is None and windows[1] < tokens[1] and windows[2] >= tokens[2], "no window, a short one, a long one"
    sizes = records["ex10_window"]["inputs"]["sizes"]
    assert any(tk > tq for tq, tk, _ in sizes) and any(w == 1 for *_, w in sizes)



def test_wrong_values_are_rejected_with_a_message_that_names_the_pitfall(records):
    rec = records["ex10_expand"]
    kv, heads = rec["inputs"]["kv"], rec["inputs"]["heads"]
    R.rejects("ex10_expand", kv.repeat(1, heads // kv.size(1), 1, 1), rec["inputs"], "pitfall 19", "repeat_interleave")

    rec = records["ex10_grouped"]
    R.rejects("ex10_grouped", dict(rec["value"], masked=rec["value"]["plain"]), rec["inputs"], "grouped_attention (masked) differs")
    R.rejects("ex10_grouped", dict(rec["value"], raised="RuntimeError"), rec["inputs"], "must raise a ValueError", "RuntimeError")

    rec = records["ex10_cache"]
    R.rejects("ex10_cache", [n // 2 for n in rec["value"]], rec["inputs"], "2 (keys and values)",
             "— exactly half the right value: only the keys (or only the values) are counted")
    two_bytes = [ex10.reference_cache_bytes(*a[:5], 2, a[6]) for a in rec["inputs"]["args"]]  # dtype_bytes ignored
    dtype = rec["inputs"]["args"][0][5]  # the first call, where the message is: dtype_bytes=1 (the probe draws 1, 2, 4, 8)
    assert dtype == 1
    R.rejects("ex10_cache", two_bytes, rec["inputs"], f"dtype_bytes={dtype} looks ignored (2 bytes per number assumed)")
    R.rejects("ex10_cache", [float(n) for n in rec["value"]], rec["inputs"], "must return an int")

    rec = records["ex10_window"]
    wider = [_window_plus_one(*size) for size in rec["inputs"]["sizes"]]
    R.rejects("ex10_window", wider, rec["inputs"], "pitfall 20")


def _expand_tiled(kv, heads):
    return kv.repeat(1, heads // kv.size(1), 1, 1)


def _window_plus_one(t_q, t_k, window):
    p, j = torch.arange(t_q)[:, None] + t_k - t_q, torch.arange(t_k)[None, :]
    return (j <= p) & (j >= p - window)


def _keys_only(batch, layers, kv_heads, head_dim, tokens, dtype_bytes, window=None):
    return layers * batch * kv_heads * (tokens if window is None else min(tokens, window)) * head_dim * dtype_bytes


def test_diagnose_is_silent_on_the_solution(ns):
    assert ex10.diagnose(dict(ns)) == []


@pytest.mark.parametrize("name,wrong,pitfall", [
    ("expand_kv", _expand_tiled, Pitfall.KV_GROUPING),
    ("sliding_window_mask", _window_plus_one, Pitfall.WINDOW_OFF_BY_ONE),
    ("cache_bytes", _keys_only, Pitfall.KV_CACHE),
])
def test_diagnose_names_each_pitfall_and_judges_each_task_on_its_own(ns, name, wrong, pitfall):
    findings = ex10.diagnose(dict(ns, **{name: wrong}))
    assert {f.pitfall for f in findings} == {pitfall}, findings  # grouped_attention runs on tinytf's expand_kv


def test_grouped_attention_is_diagnosed_on_its_own(ns):
    def grouped_tiled(q, k, v, mask=None):
        groups = q.size(1) // k.size(1)
        return ns["grouped_attention"](q, k.repeat(1, groups, 1, 1), v.repeat(1, groups, 1, 1), mask)

    findings = ex10.diagnose(dict(ns, grouped_attention=grouped_tiled))
    assert {f.pitfall for f in findings} == {Pitfall.KV_GROUPING}, findings

    def stub(q, k, v, mask=None):
        raise NotImplementedError()

    findings = ex10.diagnose(dict(ns, grouped_attention=stub))
    assert [f.title for f in findings] == ["grouped_attention is not implemented yet"], findings


def test_probes_match_the_hidden_tests_judges(ns):
    R.assert_probes_pass(ns, ex10.PROBES)
