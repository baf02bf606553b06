"""tinytf.ring on two gloo processes: ring attention equals full attention (forward and gradients,
causal or not, contiguous or zig-zag), sends (P - 1) K/V blocks forward, never holds more than a
[T/P, T/P] score tile, balances causal work in the zig-zag layout, and breaks without global offsets."""

from __future__ import annotations

import pytest
import torch

import tinytf
from tinytf import (
    Comm,
    Pitfall,
    RingStats,
    contiguous_layout,
    diagnose_ring_attention,
    ring_attention,
    shard_sequence,
    unshard_sequence,
    zigzag_layout,
)
from tinytf.launch import run_processes

WORLD = 2
B, H, T, DH = 2, 3, 16, 8
LAYOUTS = {"contiguous": contiguous_layout, "zigzag": zigzag_layout}


def _qkv(dtype=torch.float32):
    g = torch.Generator().manual_seed(7)
    return [torch.randn(B, H, T, DH, generator=g, dtype=dtype) for _ in range(3)]


def _case(rank: int, layout, is_causal: bool, told=None) -> dict:
    """Ring attention on the ``layout`` split of one problem; ``told``: the layout ring_attention is given."""
    comm = Comm()
    q, k, v = (t.requires_grad_() for t in _qkv())
    d_out = torch.randn(B, H, T, DH, generator=torch.Generator().manual_seed(8))
    ref = tinytf.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    ref.backward(d_out)
    mine = [shard_sequence(t.detach(), layout[rank]).requires_grad_() for t in (q, k, v)]
    stats = RingStats()
    out = ring_attention(*mine, layout=layout if told is None else told, comm=comm, is_causal=is_causal, stats=stats)
    forward_sent = comm.traffic.sent
    out.backward(shard_sequence(d_out, layout[rank]))
    errs = [(out - shard_sequence(ref, layout[rank])).abs().max().item()]
    errs += [(m.grad - shard_sequence(t.grad, layout[rank])).abs().max().item() for m, t in zip(mine, (q, k, v))]
    return dict(errs=errs, out=out.detach(), stats=stats, forward_sent=forward_sent, block=mine[1].nbytes,
                backward_sent=comm.traffic.sent - forward_sent, ref=ref.detach())


def _job(rank: int, world: int) -> dict:
    cases = {(name, c): _case(rank, make(T, world), c) for name, make in LAYOUTS.items() for c in (False, True)}
    local = [[(0, T // world)]] * world  # the pitfall: every block believes it starts at position 0
    cases["local offsets", True] = _case(rank, contiguous_layout(T, world), True, told=local)
    return dict(rank=rank, cases=cases)


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    results = run_processes(_job, WORLD)
    assert [r["rank"] for r in results] == [0, 1]
    return results


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("is_causal", [False, True])
def test_forward_and_gradients_equal_full_attention(ranks, layout, is_causal):
    for r in ranks:
        errs = r["cases"][layout, is_causal]["errs"]
        assert len(errs) == 4 and max(errs) <= 1e-6, errs
    whole = unshard_sequence([r["cases"][layout, is_causal]["out"] for r in ranks], LAYOUTS[layout](T, WORLD))
    torch.testing.assert_close(whole, ranks[0]["cases"][layout, is_causal]["ref"], rtol=0, atol=1e-6)


def test_bytes_are_p_minus_1_kv_blocks(ranks):
    for r in ranks:
        for case in r["cases"].values():
            assert case["forward_sent"] == (WORLD - 1) * 2 * case["block"]  # K and V, P - 1 hops
            assert case["backward_sent"] == (WORLD - 1) * 4 * case["block"] + 2 * case["block"]  # + dK, dV home


def test_score_tiles_stay_t_over_p(ranks):
    for r in ranks:
        assert r["cases"]["contiguous", False]["stats"].largest_tile == (T // WORLD, T // WORLD)
        assert r["cases"]["zigzag", True]["stats"].largest_tile == (T // (2 * WORLD), T // (2 * WORLD))
        assert r["cases"]["contiguous", False]["stats"].steps == WORLD


def test_causal_work_imbalance_and_the_zigzag_fix(ranks):
    contiguous = [r["cases"]["contiguous", True]["stats"].score_elements for r in ranks]
    zigzag = [r["cases"]["zigzag", True]["stats"].score_elements for r in ranks]
    n = T // WORLD
    assert contiguous == [n * n, 2 * n * n]  # rank 0 skips the block from its future
    assert zigzag[0] == zigzag[1] == 5 * (T // 4) ** 2  # 5 of 8 chunk tiles each
    assert sum(zigzag) < sum(contiguous)


def test_local_offsets_break_causal_attention(ranks):
    case0, case1 = (r["cases"]["local offsets", True] for r in ranks)
    ref = ranks[0]["cases"]["contiguous", True]["ref"]
    # rank 0 lets its queries see rank 1's (future) keys, rank 1 hides half of rank 0's (past) keys
    assert case0["errs"][0] > 1e-2 and case1["errs"][0] > 1e-2
    got = unshard_sequence([case0["out"], case1["out"]], contiguous_layout(T, WORLD))
    assert (got - ref).abs().max() > 1e-2
    q, k, v = _qkv()
    [finding] = diagnose_ring_attention([case0["out"], case1["out"]], q, k, v, contiguous_layout(T, WORLD))
    assert finding.pitfall is Pitfall.RING_LOCAL_OFFSET
    right = [r["cases"]["zigzag", True]["out"] for r in ranks]
    assert diagnose_ring_attention(right, q, k, v, zigzag_layout(T, WORLD)) == []


def test_layouts_and_round_trip():
    assert zigzag_layout(8, 2) == [[(0, 2), (6, 8)], [(2, 4), (4, 6)]]
    assert contiguous_layout(8, 4) == [[(0, 2)], [(2, 4)], [(4, 6)], [(6, 8)]]
    x = torch.arange(24.0).view(1, 24, 1)
    for layout in (zigzag_layout(24, 3), contiguous_layout(24, 4)):
        assert torch.equal(unshard_sequence([shard_sequence(x, c, dim=1) for c in layout], layout, dim=1), x)
    with pytest.raises(ValueError, match="2P=4"):
        zigzag_layout(10, 2)
    with pytest.raises(ValueError, match="P=3"):
        contiguous_layout(10, 3)
