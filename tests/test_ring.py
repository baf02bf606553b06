"""tinytf.ring on 2, 3 and 4 gloo processes: ring attention equals full attention (forward and gradients,
causal or not, contiguous or zig-zag, multi-head and grouped-query, blocking and overlapped), sends
(P - 1) narrow K/V blocks forward and 4 (P - 1) + 2 backward, never holds more than a [T/P, T/P] score
tile, balances causal work in the zig-zag layout, and breaks without global offsets.

With P = 2 the previous and the next rank are the same process, so a ring-direction or indexing bug
cannot show; P = 3 and 4 are where it would."""

from __future__ import annotations

import pytest
import torch

import tinytf
from tinytf import (
    Comm,
    Pitfall,
    RingStats,
    causal_scores,
    contiguous_layout,
    diagnose_ring_attention,
    diagnose_ring_traffic,
    ring_attention,
    shard_sequence,
    unshard_sequence,
    zigzag_layout,
)
from tinytf.grouped import repeat_kv
from tinytf.launch import run_processes

WORLDS = (2, 3, 4)
B, H, T, DH = 2, 4, 24, 8  # T divisible by 2P for P = 2, 3 (T = 24 = 2·3·4) and 4 (2P = 8 divides 24)
LAYOUTS = {"contiguous": contiguous_layout, "zigzag": zigzag_layout}
KV = (4, 2, 1)  # multi-head, grouped-query, multi-query


def _qkv(kv: int = H, dtype=torch.float32):
    g = torch.Generator().manual_seed(7)
    return [torch.randn(B, h, T, DH, generator=g, dtype=dtype) for h in (H, kv, kv)]


def _case(rank: int, layout, is_causal: bool, told=None, kv: int = H, overlap: bool = False) -> dict:
    """Ring attention on the ``layout`` split of one problem; ``told``: the layout ring_attention is given."""
    comm = Comm()
    q, k, v = (t.requires_grad_() for t in _qkv(kv))
    d_out = torch.randn(B, H, T, DH, generator=torch.Generator().manual_seed(8))
    ref = tinytf.scaled_dot_product_attention(q, repeat_kv(k, H // kv), repeat_kv(v, H // kv), is_causal=is_causal)
    ref.backward(d_out)
    mine = [shard_sequence(t.detach(), layout[rank]).requires_grad_() for t in (q, k, v)]
    stats = RingStats()
    out = ring_attention(*mine, layout=layout if told is None else told, comm=comm, is_causal=is_causal, stats=stats, overlap=overlap)
    forward_sent = comm.traffic.sent
    out.backward(shard_sequence(d_out, layout[rank]))
    errs = [(out - shard_sequence(ref, layout[rank])).abs().max().item()]
    errs += [(m.grad - shard_sequence(t.grad, layout[rank])).abs().max().item() for m, t in zip(mine, (q, k, v))]
    return dict(errs=errs, out=out.detach(), grads=[m.grad for m in mine], stats=stats, forward_sent=forward_sent, block=mine[1].nbytes,
                backward_sent=comm.traffic.sent - forward_sent, ref=ref.detach(), phases=dict(comm.traffic.sent_by_phase))


def _job(rank: int, world: int) -> dict:
    cases = {(name, c, kv, overlap): _case(rank, make(T, world), c, kv=kv, overlap=overlap)
             for name, make in LAYOUTS.items() for c in (False, True) for kv in KV for overlap in (False, True)}
    local = [[(0, T // world)]] * world  # the pitfall: every block believes it starts at position 0
    cases["local offsets", True, H, False] = _case(rank, contiguous_layout(T, world), True, told=local)
    q, k, v = _qkv(1)
    wide = Comm()  # the pitfall of section 6: K/V heads repeated before the ring
    layout = contiguous_layout(T, world)
    with torch.no_grad():
        ring_attention(*(shard_sequence(t, layout[rank]) for t in (q, repeat_kv(k, H), repeat_kv(v, H))), layout=layout, comm=wide)
    return dict(rank=rank, cases=cases, wide_sent=wide.traffic.sent, q_local=shard_sequence(q, layout[rank]))


@pytest.fixture(scope="module", params=WORLDS, ids=lambda p: f"P{p}")
def ranks(request) -> list[dict]:
    results = run_processes(_job, request.param)
    assert [r["rank"] for r in results] == list(range(request.param))
    return results


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("kv", KV)
def test_forward_and_gradients_equal_full_attention(ranks, layout, is_causal, kv):
    world = len(ranks)
    for r in ranks:
        errs = r["cases"][layout, is_causal, kv, False]["errs"]
        assert len(errs) == 4 and max(errs) <= 1e-5, errs  # fp32; MQA sums dK, dV over 4 query heads
    whole = unshard_sequence([r["cases"][layout, is_causal, kv, False]["out"] for r in ranks], LAYOUTS[layout](T, world))
    torch.testing.assert_close(whole, ranks[0]["cases"][layout, is_causal, kv, False]["ref"], rtol=0, atol=1e-5)


def test_the_overlapped_ring_is_the_blocking_ring_to_the_bit(ranks):
    assert len(ranks[0]["cases"]) == 2 * 2 * len(KV) * 2 + 1
    for r in ranks:
        for key, case in r["cases"].items():
            if key[-1]:  # overlapped
                blocking = r["cases"][(*key[:-1], False)]
                assert torch.equal(case["out"], blocking["out"]), key
                assert all(torch.equal(a, b) for a, b in zip(case["grads"], blocking["grads"])), key
                assert (case["forward_sent"], case["backward_sent"]) == (blocking["forward_sent"], blocking["backward_sent"])


def test_bytes_are_p_minus_1_narrow_kv_blocks(ranks):
    world = len(ranks)
    for r in ranks:
        for (_, _, kv, _), case in r["cases"].items():
            narrow = B * kv * (T // world) * DH * 4  # one rank's K (or V) block: kv heads, not H
            assert case["block"] == narrow
            assert case["forward_sent"] == (world - 1) * 2 * narrow  # K and V, P - 1 hops
            assert case["backward_sent"] == (world - 1) * 4 * narrow + 2 * narrow  # + dK, dV home
            assert case["phases"] == {"forward": case["forward_sent"], "backward": case["backward_sent"]}


def test_expanding_kv_before_the_ring_is_named_from_its_bytes(ranks):
    world = len(ranks)
    for r in ranks:
        narrow = r["cases"]["contiguous", False, 1, False]["forward_sent"]
        assert r["wide_sent"] == H * narrow  # repeat_kv before the ring: every query head's K/V travel
        [finding] = diagnose_ring_traffic(r["wide_sent"], r["q_local"], kv_heads=1, world=world)
        assert finding.pitfall is Pitfall.KV_EXPANDED_BEFORE_RING
        assert diagnose_ring_traffic(narrow, r["q_local"], kv_heads=1, world=world) == []


def test_score_tiles_stay_t_over_p(ranks):
    world = len(ranks)
    for r in ranks:
        assert r["cases"]["contiguous", False, H, False]["stats"].largest_tile == (T // world, T // world)
        assert r["cases"]["zigzag", True, H, False]["stats"].largest_tile == (T // (2 * world), T // (2 * world))
        assert r["cases"]["contiguous", False, H, False]["stats"].steps == world


def test_causal_work_imbalance_and_the_zigzag_fix(ranks):
    world, n = len(ranks), T // len(ranks)
    contiguous = [r["cases"]["contiguous", True, H, False]["stats"] for r in ranks]
    zigzag = [r["cases"]["zigzag", True, H, False]["stats"] for r in ranks]
    assert [s.score_elements for s in contiguous] == [(r + 1) * n * n for r in range(world)]  # whole tiles: rank r does r + 1
    assert [s.allowed_elements for s in contiguous] == causal_scores(contiguous_layout(T, world))  # what the mask allows
    assert [s.allowed_elements for s in contiguous] == [r * n * n + n * (n + 1) // 2 for r in range(world)]
    assert len({s.score_elements for s in zigzag}) == 1 and len({s.allowed_elements for s in zigzag}) == 1  # balanced
    assert [s.allowed_elements for s in zigzag] == causal_scores(zigzag_layout(T, world))
    assert sum(s.allowed_elements for s in zigzag) == sum(s.allowed_elements for s in contiguous) == T * (T + 1) // 2


def test_local_offsets_break_causal_attention(ranks):
    world = len(ranks)
    cases = [r["cases"]["local offsets", True, H, False] for r in ranks]
    ref = ranks[0]["cases"]["contiguous", True, H, False]["ref"]
    # rank 0 lets its queries see later ranks' (future) keys, later ranks hide part of their past
    assert cases[0]["errs"][0] > 1e-2 and cases[-1]["errs"][0] > 1e-2
    got = unshard_sequence([c["out"] for c in cases], contiguous_layout(T, world))
    assert (got - ref).abs().max() > 1e-2
    q, k, v = _qkv()
    [finding] = diagnose_ring_attention([c["out"] for c in cases], q, k, v, contiguous_layout(T, world))
    assert finding.pitfall is Pitfall.RING_LOCAL_OFFSET
    right = [r["cases"]["zigzag", True, H, False]["out"] for r in ranks]
    assert diagnose_ring_attention(right, q, k, v, zigzag_layout(T, world)) == []


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


def test_causal_scores_count_what_the_mask_allows():
    # chapter 12's T = 256: 8,256 vs 24,640 at P = 2; at P = 4 the last rank does 6.91x the first
    assert causal_scores(contiguous_layout(256, 2)) == [8256, 24640]
    four = causal_scores(contiguous_layout(256, 4))
    assert four == [2080, 6176, 10272, 14368] and round(four[-1] / four[0], 2) == 6.91
    assert causal_scores(zigzag_layout(256, 4)) == [8224] * 4


def test_grouped_kv_heads_must_divide_the_query_heads():
    q, k = torch.randn(1, 6, 4, 2), torch.randn(1, 4, 4, 2)
    comm = Comm.__new__(Comm)
    comm.rank, comm.world = 0, 1
    with pytest.raises(ValueError, match="kv_heads=4 does not divide heads=6"):
        ring_attention(q, k, k, layout=[[(0, 4)]], comm=comm)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_bad_blocks_and_layouts_name_the_shapes_and_the_fix(lang, monkeypatch):
    """Each refusal names what it got and how to cut it right, in the notebook's language."""
    monkeypatch.setenv("TINYTF_LANG", lang)
    comm = Comm.__new__(Comm)
    comm.rank, comm.world = 1, 2
    q = torch.randn(1, 2, 4, 3)
    said = {
        "rank": ("must hold the 4 positions of layout[1]", "必须持有 layout[1]"),
        "dims": ("give each rank its block of all four dimensions", "给每个 rank 一个四维的块"),
        "world": ("make the layout for P=2", "按 P=2 生成布局"),
        "sizes": ("cut T into P equal parts", "把 T 切成 P 等份"),
    }
    cases = {
        "rank": (q[:, :, :3], q[:, :, :3], contiguous_layout(8, 2)),  # 3 positions where layout[1] holds 4
        "dims": (q[0], q[0], contiguous_layout(8, 2)),
        "world": (q, q, contiguous_layout(12, 3)),
        "sizes": (q, q, [[(0, 3)], [(3, 8)]]),
    }
    assert len(cases) == len(said) == 4
    for name, (qq, kk, layout) in cases.items():
        with pytest.raises(ValueError) as err:
            ring_attention(qq, kk, kk, layout=layout, comm=comm)
        assert said[name][lang == "zh"] in str(err.value), (name, str(err.value))
    with pytest.raises(ValueError, match=r"q \[1, 2, 3, 3\] and k \[1, 2, 3, 3\]" if lang == "en" else r"q \[1, 2, 3, 3\] 和 k"):
        ring_attention(q[:, :, :3], q[:, :, :3], q[:, :, :3], layout=contiguous_layout(8, 2), comm=comm)
