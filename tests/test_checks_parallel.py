"""tinytf.checks.parallel: the diagnoses of chapter 12's pitfalls, on ranks simulated in one process
(the multi-process runs that feed them real ranks' results are in test_parallel.py and test_ring.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tinytf import Pitfall, shard_qkv
from tinytf.checks import CATALOG, diagnose_qkv_split, diagnose_replicated, diagnose_row_parallel, glance_table, report

CHAPTER_12 = (Pitfall.FORGOTTEN_ALL_REDUCE, Pitfall.QKV_SPLIT_ONE_PIECE, Pitfall.BIAS_BEFORE_ALL_REDUCE,
              Pitfall.RING_LOCAL_OFFSET, Pitfall.DROPOUT_RNG_UNSYNCED, Pitfall.ULYSSES_AXES_SWAPPED, Pitfall.RING_BUFFER_REUSED,
              Pitfall.SP_GRADS_NOT_REDUCED, Pitfall.KV_EXPANDED_BEFORE_RING)


def test_qkv_split_right_one_piece_and_other():
    assert diagnose_qkv_split(shard_qkv) == []
    [f] = diagnose_qkv_split(lambda w, r, p, h, kv: w.chunk(p)[r])
    assert f.pitfall is Pitfall.QKV_SPLIT_ONE_PIECE and CATALOG[f.pitfall].fix.replace("`", "") in f.message
    [f] = diagnose_qkv_split(lambda w, r, p, h, kv: shard_qkv(w, (r + 1) % p, p, h, kv))
    assert f.pitfall is Pitfall.GENERAL and "W_q rows of heads" in f.message


def test_qkv_split_that_raises_is_diagnosed():
    def todo(w, r, p, h, kv):
        raise NotImplementedError

    [f] = diagnose_qkv_split(todo)
    assert f.pitfall is Pitfall.GENERAL and "not implemented" in f.title


def _simulated_ranks(world: int = 4):
    """A row-parallel projection on ``world`` simulated ranks: the partial sums, the reference, the bias."""
    x, w, b = torch.randn(2, 5, 8), torch.randn(6, 8), torch.randn(6)
    partial = [F.linear(xs, ws) for xs, ws in zip(x.chunk(world, -1), w.chunk(world, -1))]
    return partial, F.linear(x, w, b), b


def test_row_parallel_partial_sum_and_bias_added_p_times():
    partial, ref, b = _simulated_ranks()
    summed = sum(partial)
    assert diagnose_row_parallel([summed + b] * 4, ref, b) == []
    [f] = diagnose_row_parallel([p + b for p in partial], ref, b)
    assert f.pitfall is Pitfall.FORGOTTEN_ALL_REDUCE
    [f] = diagnose_row_parallel([p for p in partial], ref, b)  # no bias at all, no sum either
    assert f.pitfall is Pitfall.FORGOTTEN_ALL_REDUCE
    [f] = diagnose_row_parallel([sum(p + b for p in partial)] * 4, ref, b)
    assert f.pitfall is Pitfall.BIAS_BEFORE_ALL_REDUCE and "(P - 1) = 3" in f.message
    [f] = diagnose_row_parallel([summed * 2] * 4, ref, b)
    assert f.pitfall is Pitfall.GENERAL


def test_replicated_tensors():
    t = torch.randn(3, 4)
    assert diagnose_replicated([t, t.clone()]) == []
    [f] = diagnose_replicated([t, t + 1e-3], "the residual")
    assert f.pitfall is Pitfall.DROPOUT_RNG_UNSYNCED and "the residual" in f.message


def test_catalog_rows_in_both_languages():
    assert [int(p) for p in CHAPTER_12] == list(range(21, 30))
    for p in CHAPTER_12:
        e = CATALOG[p]
        assert e.section.startswith("12_attention_across_processes.ipynb § ")
        assert all((e.title_zh, e.symptom_zh, e.fix_zh)) and "diagnose_" in e.detector
    en, zh = glance_table("en", chapter="12"), glance_table("zh", chapter="12")
    assert en.count("\n") == zh.count("\n") == 2 + len(CHAPTER_12) - 1
    assert "忘了全归约" in zh and "pitfall 25" in report(diagnose_replicated([torch.zeros(1), torch.ones(1)]))
