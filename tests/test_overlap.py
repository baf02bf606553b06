"""tinytf.overlap: the silent ring computes what the ring computes without sending, and ring_overlap_times
returns every variant's times and the exposed-communication ratio on 2 gloo processes (its structure only:
timings are measured in make bench and in chapter 12, never asserted)."""

from __future__ import annotations

import math

import torch

from tinytf import Comm, contiguous_layout, ring_attention
from tinytf.launch import run_processes
from tinytf.overlap import SilentRing, ring_overlap_times


def _job(rank: int, world: int) -> dict:
    torch.manual_seed(rank)
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
    return ring_overlap_times(q, k, v, layout=contiguous_layout(8 * world, world), comm=Comm(), repeats=3, warmup=1)


def test_times_and_ratio_are_reported_for_every_variant():
    results = run_processes(_job, 2)
    for res in results:
        assert sorted(res["times"]) == ["blocking", "overlapped", "silent"]
        assert all(len(ts) == 3 and min(ts) > 0 for ts in res["times"].values())
        assert sorted(res["p50"]) == sorted(res["times"]) and sorted(res["exposed"]) == ["blocking", "overlapped"]
        assert math.isnan(res["ratio"]) or res["ratio"] == res["exposed"]["overlapped"] / res["exposed"]["blocking"]
        assert (res["repeats"], res["warmup"]) == (3, 1)


def test_the_silent_ring_folds_its_own_block_p_times():
    q, k, v = (torch.randn(1, 2, 4, 3) for _ in range(3))
    out = ring_attention(q, k, v, layout=contiguous_layout(12, 3), comm=SilentRing(1, 3))
    # three copies of the same keys: the same softmax as one copy
    torch.testing.assert_close(out, torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(3), -1) @ v)
