"""tinytf.ulysses on 2, 3 and 4 gloo processes: Ulysses attention equals full attention (forward and gradients,
causal or not, multi-head, grouped-query with kv_heads >= P and < P), each all-to-all sends (P - 1)/P of the
rank's tensor — 4 (P - 1)/P² · B·T·D·s per layer and pass for multi-head attention — and an all-to-all that
lays the received chunks along the heads instead of the sequence is what diagnose_ulysses names."""

from __future__ import annotations

import pytest
import torch

import tinytf
from tinytf import Comm, Pitfall, all_to_all_bytes, contiguous_layout, diagnose_ulysses, shard_sequence, ulysses_attention
from tinytf.grouped import repeat_kv
from tinytf.launch import run_processes
from tinytf.ulysses import seq_to_heads, ulysses_kv_heads

WORLDS = (2, 3, 4)
B, H, T, DH = 2, 12, 24, 4


def _kvs(world: int) -> tuple[int, ...]:
    return {2: (H, 6, 2, 1), 3: (H, 6, 3, 1), 4: (H, 4, 2, 1)}[world]  # multi-head; kv >= P; kv < P (repeated up to P)


def _qkv(kv: int):
    g = torch.Generator().manual_seed(11)
    return [torch.randn(B, h, T, DH, generator=g, dtype=torch.float64) for h in (H, kv, kv)]


def _case(rank: int, world: int, kv: int, is_causal: bool) -> dict:
    q, k, v = (t.requires_grad_() for t in _qkv(kv))
    d_out = torch.randn(B, H, T, DH, generator=torch.Generator().manual_seed(12), dtype=torch.float64)
    ref = tinytf.scaled_dot_product_attention(q, repeat_kv(k, H // kv), repeat_kv(v, H // kv), is_causal=is_causal)
    ref.backward(d_out)
    mine = contiguous_layout(T, world)[rank]
    local = [shard_sequence(t.detach(), mine).requires_grad_() for t in (q, k, v)]
    comm = Comm()
    out = ulysses_attention(*local, comm=comm, is_causal=is_causal)
    out.backward(shard_sequence(d_out, mine))
    errs = [(out - shard_sequence(ref, mine)).abs().max().item()]
    errs += [(m.grad - shard_sequence(t.grad, mine)).abs().max().item() for m, t in zip(local, (q, k, v))]
    return dict(errs=errs, phases=dict(comm.traffic.sent_by_phase), calls=dict(comm.traffic.calls))


def _swapped(rank: int, world: int) -> torch.Tensor:
    """The pitfall: after the all-to-all the received chunks (one block of positions per rank) go along the heads."""
    q, k, v = _qkv(H)
    comm = Comm()

    def exchange(x):  # [B, H, n, d] -> [P, B, H/P, n, d] -> all-to-all -> laid along dim 1: heads, not positions
        return comm.all_to_all(x.unflatten(1, (world, -1)).movedim(1, 0).contiguous()).movedim(0, 1).flatten(1, 2)

    mine = contiguous_layout(T, world)[rank]
    with torch.no_grad():
        q_h, k_h, v_h = (exchange(shard_sequence(t, mine)) for t in (q, k, v))
        return exchange(tinytf.scaled_dot_product_attention(q_h, k_h, v_h, is_causal=True))


def _job(rank: int, world: int) -> dict:
    cases = {(kv, c): _case(rank, world, kv, c) for kv in _kvs(world) for c in (False, True)}
    return dict(rank=rank, cases=cases, swapped=_swapped(rank, world), right=_right(rank, world))


def _right(rank: int, world: int) -> torch.Tensor:
    q, k, v = _qkv(H)
    mine = contiguous_layout(T, world)[rank]
    with torch.no_grad():
        return ulysses_attention(*(shard_sequence(t, mine) for t in (q, k, v)), comm=Comm(), is_causal=True)


@pytest.fixture(scope="module", params=WORLDS, ids=lambda p: f"P{p}")
def ranks(request) -> list[dict]:
    results = run_processes(_job, request.param)
    assert [r["rank"] for r in results] == list(range(request.param))
    return results


def test_forward_and_gradients_equal_full_attention(ranks):
    for r in ranks:
        assert len(r["cases"]) == 8
        for case, res in r["cases"].items():
            assert len(res["errs"]) == 4 and max(res["errs"]) <= 1e-12, (case, res["errs"])


def test_bytes_fall_with_p(ranks):
    world = len(ranks)
    for r in ranks:
        for (kv, _), res in r["cases"].items():
            travel = ulysses_kv_heads(kv, world)  # K/V heads repeated up to P when fewer
            per_pass = sum(all_to_all_bytes(B * h * (T // world) * DH * 8, world) for h in (H, travel, travel, H))
            assert res["phases"] == {"forward": per_pass, "backward": per_pass}
            assert res["calls"]["all_to_all", "forward"] == res["calls"]["all_to_all", "backward"] == 4
            if kv == H:
                assert per_pass == 4 * (world - 1) * B * T * (H * DH) * 8 / world**2  # 4 (P - 1)/P² · B·T·D·s


def test_swapped_axes_are_named(ranks):
    q, k, v = _qkv(H)
    [finding] = diagnose_ulysses([r["swapped"] for r in ranks], q, k, v)
    assert finding.pitfall is Pitfall.ULYSSES_AXES_SWAPPED
    assert diagnose_ulysses([r["right"] for r in ranks], q, k, v) == []


def test_heads_fewer_than_ranks_are_refused():
    comm = Comm.__new__(Comm)
    comm.rank, comm.world = 0, 8
    q = torch.zeros(1, 4, 3, 2)
    with pytest.raises(ValueError, match="heads=4 is not divisible by P=8"):
        ulysses_attention(q, q, q, comm=comm)
    with pytest.raises(ValueError, match="heads >= P"):
        seq_to_heads(q, comm)
    with pytest.raises(ValueError, match="kv_heads=3 and P=4"):
        ulysses_kv_heads(3, 4)
