"""Exercise 11's judges, probes and self-check diagnosis, on the instructor notebook's own code.

The solution cells run in one namespace; every test cell (visible parts on two real gloo processes, hidden
parts on P = 2 and 4 simulated ranks) records, and every record satisfies its judge; wrong values on the
recorded inputs are rejected with a message that names the chapter-12 pitfall (Ulysses' swapped axes
included); ``diagnose`` is silent on the solution and names each pitfall on a wrong student function. The
student's functions reach the spawned processes by value (:mod:`tinytf.course.reference.ex11_ranks`), also when defined by a plain ``exec``.
"""

from __future__ import annotations

import _runner as R
import pytest
import torch
import torch.nn.functional as F

from tinytf.checks import Pitfall
from tinytf.course.reference import ex11
from tinytf.course.reference.ex11_ranks import on_processes, on_threads, reference_attention, ship, unship

TESTS = ("ex11_split", "ex11_row", "ex11_ring", "ex11_ulysses")
CODE = ("ex11_setup", "ex11_split_code", "ex11_row_code", "ex11_ring_code", "ex11_ulysses_code")


def _cells() -> dict:
    return R.instructor_cells("ex11_tensor_parallel.ipynb")


@pytest.fixture(scope="module")
def ns() -> dict:
    return R.run_cells(_cells(), CODE)


def test_every_test_cell_has_a_judge_and_a_probe():
    R.assert_hidden_tests_use_their_probes(_cells(), TESTS, ex11.PROBES, "_probes11")
    assert R.graded_points(_cells()) == {"ex11_split": 4, "ex11_row": 3, "ex11_ring": 4, "ex11_ulysses": 3, "ex11_explain": 2}
    for gid in TESTS:  # every visible check is a real multi-process run
        visible = _cells()[gid].source.split("### BEGIN HIDDEN TESTS")[0]
        assert "on_processes(" in visible, gid


@pytest.fixture(scope="module")
def records(ns, tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("ex11_records")
    return R.record_tests(ns, _cells(), TESTS, folder)


def test_the_solution_satisfies_every_judge(records):
    R.assert_judges_accept(records)


def test_the_hidden_inputs_cover_two_and_four_ranks(records):
    for gid in TESTS:
        assert [len(records[gid]["value"][f"P{p}"]) for p in ex11.WORLDS] == [2, 4], gid
    rec = records["ex11_split"]["inputs"]
    assert rec["heads"] % 4 == 0 and rec["kv_heads"] % 4 == 0
    assert records["ex11_ring"]["inputs"]["q"].size(-2) % 4 == 0
    h, t = records["ex11_ulysses"]["inputs"]["q"].shape[1:3]
    for p in ex11.WORLDS:  # every Ulysses mistake shows on both: >= 2 heads per rank, >= 4 positions per rank, divisible by P
        assert h % p == 0 and h // p >= 2 and t % (p * p) == 0 and t // p >= 4, (h, t, p)



def test_wrong_values_are_rejected_with_a_message_that_names_the_pitfall(records):
    rec = records["ex11_split"]
    w = rec["inputs"]["weight"]
    R.rejects("ex11_split", {f"P{p}": list(w.chunk(p)) for p in ex11.WORLDS}, rec["inputs"], "pitfall 22")

    rec = records["ex11_row"]
    x, weight, bias = rec["inputs"]["x"], rec["inputs"]["weight"], rec["inputs"]["bias"]
    partial = {f"P{p}": [F.linear(xs, ws) + bias for xs, ws in zip(x.chunk(p, -1), weight.chunk(p, -1))] for p in ex11.WORLDS}
    R.rejects("ex11_row", partial, rec["inputs"], "pitfall 21")
    extra = {f"P{p}": [F.linear(x, weight, bias) + (p - 1) * bias] * p for p in ex11.WORLDS}
    R.rejects("ex11_row", extra, rec["inputs"], "pitfall 23")

    rec = records["ex11_ring"]
    q, k, v = rec["inputs"]["q"], rec["inputs"]["k"], rec["inputs"]["v"]
    local = {f"P{p}": on_threads("ring", _merge_local, p, q, k, v) for p in ex11.WORLDS}
    R.rejects("ex11_ring", local, rec["inputs"], "pitfall 24")

    rec = records["ex11_ulysses"]
    q, k, v = rec["inputs"]["q"], rec["inputs"]["k"], rec["inputs"]["v"]
    swapped = {f"P{p}": on_threads("ulysses", _heads_along_heads, p, q, k, v) for p in ex11.WORLDS}
    R.rejects("ex11_ulysses", swapped, rec["inputs"], "pitfall 26")
    unordered = {f"P{p}": on_threads("ulysses", _positions_interleaved, p, q, k, v) for p in ex11.WORLDS}
    R.rejects("ex11_ulysses", unordered, rec["inputs"], "not this rank's head group")


def _split_one_piece(weight, rank, world, heads, kv_heads):
    return weight.chunk(world)[rank]


def _row_no_reduce(x, weight, bias, comm):
    return F.linear(x, weight) + bias


def _row_bias_every_rank(x, weight, bias, comm):
    return comm.all_reduce(F.linear(x, weight, bias))


def _merge_local(m, l, acc, q, k, v, q_start, k_start):
    return ex11.reference_merge_block(m, l, acc, q, k, v, 0, 0)


def _heads_along_heads(x, comm):
    """Pitfall 26: the received blocks of positions laid along the heads."""
    p = comm.world
    return comm.all_to_all(x.unflatten(1, (p, x.size(1) // p)).movedim(1, 0).contiguous()).movedim(0, 1).flatten(1, 2)


def _positions_interleaved(x, comm):
    """Right shape, wrong order: the rank axis put after the positions (position i of every rank, then i + 1 ...)."""
    p = comm.world
    got = comm.all_to_all(x.unflatten(1, (p, x.size(1) // p)).movedim(1, 0).contiguous())  # [P, B, H/P, n, d]
    return got.permute(1, 2, 3, 0, 4).flatten(2, 3)


def test_diagnose_is_silent_on_the_solution(ns):
    assert ex11.diagnose(dict(ns)) == []


@pytest.mark.parametrize("name,wrong,pitfall", [
    ("split_qkv", _split_one_piece, Pitfall.QKV_SPLIT_ONE_PIECE),
    ("row_parallel", _row_no_reduce, Pitfall.FORGOTTEN_ALL_REDUCE),
    ("row_parallel", _row_bias_every_rank, Pitfall.BIAS_BEFORE_ALL_REDUCE),
    ("merge_block", _merge_local, Pitfall.RING_LOCAL_OFFSET),
    ("seq_to_heads", _heads_along_heads, Pitfall.ULYSSES_AXES_SWAPPED),
    ("seq_to_heads", _positions_interleaved, Pitfall.GENERAL),
])
def test_diagnose_names_each_pitfall(ns, name, wrong, pitfall):
    findings = ex11.diagnose(dict(ns, **{name: wrong}))
    assert {f.pitfall for f in findings} == {pitfall}, findings


def test_a_stub_is_not_implemented_yet(ns):
    def stub(x, weight, bias, comm):
        raise NotImplementedError()

    findings = ex11.diagnose(dict(ns, row_parallel=stub))
    assert [f.title for f in findings] == ["row_parallel is not implemented yet"], findings


def test_probes_match_the_hidden_tests_judges(ns):
    R.assert_probes_pass(ns, ex11.PROBES)


def test_a_shipped_function_keeps_its_helpers_and_modules():
    space = {"__name__": "__main__"}
    exec(compile("import math\nSCALE = 3\ndef helper(x):\n    return math.sqrt(x) * SCALE\n"
                 "def fn(x):\n    return [helper(v) for v in x]\n", "<cell>", "exec"), space)  # noqa: S102
    rebuilt = unship(ship(space["fn"]))
    assert rebuilt([4.0, 9.0]) == [6.0, 9.0] and rebuilt.__globals__ is not space


def test_simulated_ranks_raise_the_first_error_and_do_not_hang():
    def broken(x, weight, bias, comm):
        if comm.rank == 1:
            raise ValueError("rank 1 is broken")
        return comm.all_reduce(F.linear(x, weight)) + bias

    x, w, b = torch.randn(2, 4), torch.randn(3, 4), torch.randn(3)
    with pytest.raises(ValueError, match="rank 1 is broken"):
        on_threads("row", broken, 2, x, w, b, timeout_s=20)


def test_the_attention_job_is_multi_head_attention():
    import tinytf

    torch.manual_seed(0)
    mha = tinytf.MultiHeadAttention(16, 4, kv_heads=2, dropout=0.0)
    x = torch.randn(2, 5, 16)
    want = mha(x, is_causal=True)
    got = reference_attention(x, mha.qkv.weight, mha.qkv.bias, mha.proj.weight, mha.proj.bias, 4, 2)
    assert torch.allclose(got, want, atol=1e-5)


def test_a_notebook_function_runs_on_two_real_processes(ns):
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 1, 8, 3, generator=g) for _ in range(3))
    outs = on_processes("ring", ns["merge_block"], 2, q, k, v)
    assert len(outs) == 2
    assert torch.allclose(torch.cat(outs, -2), F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-5)
