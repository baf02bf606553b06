"""tinytf.parallel on two gloo processes: tensor-parallel attention and block equal the single-process
modules (forward ≤ 1e-6 in fp32, each rank's gradients = the slices of the full gradients), equal
PyTorch's parallelize_module, cost exactly two all-reduces per block forward, and the five pitfalls show.
On 3 and 4 processes: the block again, with multi-head and with fewer K/V heads than ranks (replicated,
their weight gradients summed over the replicas by reduce_replicated_kv_grads)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tinytf
from tinytf import (
    Comm,
    Pitfall,
    TensorParallelAttention,
    TensorParallelBlock,
    all_reduce_bytes,
    diagnose_replicated,
    diagnose_row_parallel,
    shard_block_tensors,
    shard_qkv,
)
from tinytf.launch import run_processes
from tinytf.parallel import (
    ParallelizableBlock,
    colwise_qkv_order,
    kv_heads_per_rank,
    kv_replicas,
    local_attention,
    reduce_replicated_kv_grads,
    shard_cols,
    shard_rows,
)

WORLD = 2
D, H, B, T = 32, 4, 2, 8
ATTN_NAMES = {"qkv_weight": "qkv.weight", "qkv_bias": "qkv.bias", "proj_weight": "proj.weight", "proj_bias": "proj.bias"}


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def _grad_errors(tp_named, full_grads: dict, rank: int, heads: int, kv_heads: int, source) -> dict:
    """Largest relative error of each rank-local gradient against the matching slice of the full one."""
    shards = shard_block_tensors(full_grads, rank, WORLD, heads, kv_heads)
    out = {}
    for name, p in tp_named:
        g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
        ref = shards[source(name)]
        out[source(name)] = _err(g, ref) / ref.abs().max().item()
    return out


def _attention_case(rank: int, kv_heads: int, is_causal: bool) -> dict:
    torch.manual_seed(kv_heads)
    full = tinytf.MultiHeadAttention(D, H, kv_heads=kv_heads)
    comm = Comm(measure=False)
    tp = TensorParallelAttention(full, rank, WORLD, comm)
    x = torch.randn(B, T, D, generator=torch.Generator().manual_seed(1))
    w = torch.randn(B, T, D, generator=torch.Generator().manual_seed(2))  # a fixed direction for the loss
    ref, out = full(x, is_causal=is_causal), tp(x, is_causal=is_causal)
    (ref * w).sum().backward()
    (out * w).sum().backward()
    grads = {f"attn.{n}": p.grad for n, p in full.named_parameters()}
    return dict(fwd=_err(out, ref), calls=comm.traffic.count("all_reduce"),
                grads=_grad_errors(tp.named_parameters(), grads, rank, H, kv_heads, lambda n: "attn." + ATTN_NAMES[n]))


def _block_case(rank: int, norm: str, measure: bool) -> dict:
    torch.manual_seed(3)
    block = tinytf.TransformerBlock(D, H, T, norm=norm)
    comm = Comm(measure=measure)
    tp = TensorParallelBlock(block, rank, WORLD, comm)
    x = torch.randn(B, T, D, generator=torch.Generator().manual_seed(1))
    w = torch.randn(B, T, D, generator=torch.Generator().manual_seed(2))
    x_full, x_tp = x.clone().requires_grad_(), x.clone().requires_grad_()  # dL/dx too: both f's all-reduce backward
    ref, out = block(x_full), tp(x_tp)
    forward_sent = comm.traffic.sent
    (ref * w).sum().backward()
    (out * w).sum().backward()
    grads = {n: p.grad for n, p in block.named_parameters()}
    return dict(fwd=_err(out, ref), dx=_err(x_tp.grad, x_full.grad), fwd_calls=comm.traffic.count("all_reduce"),
                bwd_calls=comm.traffic.count("all_reduce", "backward"),
                forward_sent=forward_sent, nbytes=x.nbytes, grads=_grad_errors(tp.named_parameters(), grads, rank, H, None, tp.source.get))


def _pytorch_case(rank: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    torch.manual_seed(4)
    block = tinytf.TransformerBlock(D, H, T)
    mine = TensorParallelBlock(block, rank, WORLD, Comm(measure=False))
    theirs = parallelize_module(ParallelizableBlock(block, WORLD), init_device_mesh("cpu", (WORLD,)), ParallelizableBlock.plan())
    x = torch.randn(B, T, D, generator=torch.Generator().manual_seed(1))
    w = torch.randn(B, T, D, generator=torch.Generator().manual_seed(2))
    a, b = mine(x), theirs(x)
    (a * w).sum().backward()
    (b * w).sum().backward()
    ours = {mine.source[n]: p.grad for n, p in mine.named_parameters()}
    errs = {}
    for n, p in theirs.named_parameters():
        g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
        ref = ours[ParallelizableBlock.SOURCE[n]]
        errs[ParallelizableBlock.SOURCE[n]] = _err(g, ref) / ref.abs().max().item()
    sharded = {ParallelizableBlock.SOURCE[n]: type(p).__name__ for n, p in theirs.named_parameters()}
    return dict(fwd=_err(a, b), grads=errs, kinds=sharded)


def _pitfalls_case(rank: int) -> dict:
    torch.manual_seed(5)
    full = tinytf.MultiHeadAttention(D, H)
    comm = Comm(measure=False)
    x = torch.randn(B, T, D, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = full(x)
        tp = TensorParallelAttention(full, rank, WORLD, comm)
        heads_out = F.linear(x, tp.qkv_weight, tp.qkv_bias)
        local = local_attention(heads_out, full.head_dim, H // WORLD, H // WORLD, 1, None, False, None)
        partial = F.linear(local, tp.proj_weight) + tp.proj_bias  # pitfall 1: no all-reduce
        bias_twice = comm.all_reduce(F.linear(local, tp.proj_weight) + tp.proj_bias)  # pitfall 3: bias before the sum
        one_piece = TensorParallelAttention(full, rank, WORLD, comm)
        one_piece.qkv_weight.copy_(full.qkv.weight.chunk(WORLD)[rank])  # pitfall 2: a plain slice of [W_q; W_k; W_v]
        one_piece.qkv_bias.copy_(full.qkv.bias.chunk(WORLD)[rank])
        sliced = one_piece(x)
    block = tinytf.TransformerBlock(D, H, T, dropout=0.1)
    tp_block = TensorParallelBlock(block, rank, WORLD, comm).train()
    torch.manual_seed(100 + rank)  # pitfall 5: every rank its own RNG
    unsynced = tp_block(x).detach()
    torch.manual_seed(100)
    synced = tp_block(x).detach()
    return dict(partial=_err(partial, ref), bias=_err(bias_twice - ref, (WORLD - 1) * full.proj.bias.detach()),
                bias_err=_err(bias_twice, ref), sliced=_err(sliced, ref), unsynced=unsynced, synced=synced,
                outputs=dict(partial=partial, bias_twice=bias_twice, ref=ref, bias=full.proj.bias.detach().clone()))


def _job(rank: int, world: int) -> dict:
    assert world == WORLD
    return dict(
        rank=rank,
        attention={(kv, c): _attention_case(rank, kv, c) for kv in (H, 2) for c in (False, True)},
        block={(norm, measure): _block_case(rank, norm, measure) for norm in ("pre", "post") for measure in (False, True)},
        pytorch=_pytorch_case(rank),
        pitfalls=_pitfalls_case(rank),
    )


WIDE_D, WIDE_H = 48, 12  # heads divisible by 2, 3 and 4
WIDE_KV = {3: (12, 3, 1), 4: (12, 4, 2, 1)}  # per P: multi-head, kv = P, and kv < P (replicated)


def _wide_case(rank: int, world: int, kv: int) -> dict:
    """The whole block on ``world`` ranks, fp64, with ``kv`` K/V heads; gradients before and after the replica sum."""
    torch.manual_seed(6)
    block = tinytf.TransformerBlock(WIDE_D, WIDE_H, T, kv_heads=kv).double()
    comm = Comm()
    tp = TensorParallelBlock(block, rank, world, comm)
    x = torch.randn(B, T, WIDE_D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    w = torch.randn(B, T, WIDE_D, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    ref, out = block(x), tp(x)
    (ref * w).sum().backward()
    (out * w).sum().backward()
    full = shard_block_tensors({n: p.grad for n, p in block.named_parameters()}, rank, world, WIDE_H, kv)
    before = tp.attn.qkv_weight.grad.clone()
    reduce_replicated_kv_grads(tp.attn)
    errs = {tp.source[n]: _err(p.grad, full[tp.source[n]]) for n, p in tp.named_parameters()}
    rows = tp.attn.local_heads * tp.attn.head_dim
    return dict(fwd=_err(out, ref), grads=errs, kv_rows=before[rows:], full_kv_rows=full["attn.qkv.weight"][rows:],
                qkv_shape=list(tp.attn.qkv_weight.shape), weight_grad_sent=comm.traffic.sent_by_phase["weight_grad"])


def _wide_job(rank: int, world: int) -> dict:
    return dict(rank=rank, cases={kv: _wide_case(rank, world, kv) for kv in WIDE_KV[world]})


@pytest.fixture(scope="module", params=sorted(WIDE_KV), ids=lambda p: f"P{p}")
def wide(request) -> list[dict]:
    results = run_processes(_wide_job, request.param)
    assert [r["rank"] for r in results] == list(range(request.param))
    return results


def test_block_on_three_and_four_ranks_with_replicated_kv_heads(wide):
    world = len(wide)
    for r in wide:
        assert sorted(r["cases"]) == sorted(WIDE_KV[world])
        for kv, case in r["cases"].items():
            assert case["fwd"] <= 1e-12 and len(case["grads"]) == 12 and max(case["grads"].values()) <= 1e-12, (kv, case["grads"])
            d = WIDE_D // WIDE_H
            assert case["qkv_shape"] == [(WIDE_H // world + 2 * kv_heads_per_rank(kv, world)) * d, WIDE_D]
            assert (case["weight_grad_sent"] > 0) == (kv < world)  # only replicated K/V heads need the extra all-reduce
    for kv in WIDE_KV[world]:
        if kv >= world:
            continue
        replicas = kv_replicas(kv, world)
        for head in range(kv):  # before the sum each replica holds a part; the parts add up to the full gradient
            group = [wide[r]["cases"][kv] for r in range(head * replicas, (head + 1) * replicas)]
            assert all(_err(c["kv_rows"], c["full_kv_rows"]) > 1e-6 for c in group)
            assert _err(sum(c["kv_rows"] for c in group), group[0]["full_kv_rows"]) <= 1e-12


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    results = run_processes(_job, WORLD)
    assert [r["rank"] for r in results] == [0, 1]
    return results


def test_attention_forward_and_gradients_match_single_process(ranks):
    for r in ranks:
        assert len(r["attention"]) == 4
        for case, res in r["attention"].items():
            assert res["fwd"] <= 1e-6, (case, res)
            assert res["calls"] == 1, case  # one all-reduce: the output projection
            assert set(res["grads"]) == {"attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias"}
            assert max(res["grads"].values()) < 1e-5, (case, res["grads"])


def test_block_forward_gradients_and_two_all_reduces(ranks):
    for r in ranks:
        assert len(r["block"]) == 4
        for case, res in r["block"].items():
            assert res["fwd"] <= 1e-6 and res["dx"] <= 1e-5, (case, res["fwd"], res["dx"])
            assert len(res["grads"]) == 12 and max(res["grads"].values()) < 1e-5, (case, res["grads"])
            assert (res["fwd_calls"], res["bwd_calls"]) == (2, 2), case
        measured = r["block"]["pre", True]
        assert measured["forward_sent"] == 2 * all_reduce_bytes(B * T * D * 4, WORLD) == 2 * measured["nbytes"]


def test_equals_pytorch_parallelize_module(ranks):
    for r in ranks:
        res = r["pytorch"]
        assert res["fwd"] <= 1e-6
        assert len(res["grads"]) == 12 and max(res["grads"].values()) < 1e-5, res["grads"]
        assert res["kinds"]["attn.qkv.weight"] == "DTensor" and res["kinds"]["norm1.weight"] == "Parameter"


def test_the_pitfalls_break_parity(ranks):
    for r in ranks:
        p = r["pitfalls"]
        assert p["partial"] > 1e-2  # each rank holds a partial sum
        assert p["bias"] < 1e-6 and p["bias_err"] > 1e-3  # exactly (P - 1) extra biases
        assert p["sliced"] > 1e-2  # a plain slice of the fused weight: Q of some heads, K of others
    assert _err(ranks[0]["pitfalls"]["unsynced"], ranks[1]["pitfalls"]["unsynced"]) > 1e-2
    assert _err(ranks[0]["pitfalls"]["synced"], ranks[1]["pitfalls"]["synced"]) == 0


def test_the_diagnoses_name_the_pitfalls_from_what_the_ranks_returned(ranks):
    out = [r["pitfalls"]["outputs"] for r in ranks]
    ref, bias = out[0]["ref"], out[0]["bias"]
    [f] = diagnose_row_parallel([o["partial"] for o in out], ref, bias)
    assert f.pitfall is Pitfall.FORGOTTEN_ALL_REDUCE
    [f] = diagnose_row_parallel([o["bias_twice"] for o in out], ref, bias)
    assert f.pitfall is Pitfall.BIAS_BEFORE_ALL_REDUCE and "(P - 1) = 1" in f.message
    assert diagnose_row_parallel([ref, ref], ref, bias) == []
    [f] = diagnose_replicated([r["pitfalls"]["unsynced"] for r in ranks])
    assert f.pitfall is Pitfall.DROPOUT_RNG_UNSYNCED
    assert diagnose_replicated([r["pitfalls"]["synced"] for r in ranks]) == []


@pytest.mark.parametrize("world", [2, 4])
def test_shard_qkv_takes_each_rank_its_heads_of_q_k_and_v(world):
    heads, kv, d = 4, 4 if world == 4 else 2, 3
    rows = torch.arange((heads + 2 * kv) * d).float()[:, None]  # row i holds the number i
    for r in range(world):
        got = shard_qkv(rows, r, world, heads, kv).flatten().long().tolist()
        hq, hk = heads // world, kv // world
        q = list(range(r * hq * d, (r + 1) * hq * d))
        k = [heads * d + i for i in range(r * hk * d, (r + 1) * hk * d)]
        v = [(heads + kv) * d + i for i in range(r * hk * d, (r + 1) * hk * d)]
        assert got == q + k + v
    assert torch.equal(colwise_qkv_order(rows, world, heads, kv).chunk(world)[1], shard_qkv(rows, 1, world, heads, kv))
    assert not torch.equal(rows.chunk(world)[0], shard_qkv(rows, 0, world, heads, kv))  # the one-piece split differs


def test_replicated_kv_heads_go_to_the_ranks_whose_query_heads_read_them():
    heads, kv, d, world = 8, 2, 1, 4
    rows = torch.arange((heads + 2 * kv) * d).float()[:, None]
    for r in range(world):
        got = shard_qkv(rows, r, world, heads, kv).flatten().long().tolist()
        head = r // 2  # ranks 0, 1 read K/V head 0 (query heads 0-3); ranks 2, 3 head 1
        assert got == [2 * r, 2 * r + 1, heads + head, heads + kv + head]
        assert all(tinytf.grouped.kv_head_of(h, heads, kv) == head for h in (2 * r, 2 * r + 1))
    assert (kv_heads_per_rank(2, 4), kv_replicas(2, 4), kv_heads_per_rank(8, 4), kv_replicas(8, 4)) == (1, 2, 2, 1)
    assert colwise_qkv_order(rows, world, heads, kv).size(0) == world * 4  # the K/V rows appear once per replica


def test_shards_and_errors():
    w = torch.arange(24.0).view(4, 6)
    assert torch.equal(torch.cat([shard_rows(w, r, 2) for r in range(2)]), w)
    assert torch.equal(torch.cat([shard_cols(w, r, 2) for r in range(2)], dim=1), w)
    with pytest.raises(ValueError, match="divisible by the number of ranks"):
        shard_qkv(torch.zeros(36, 4), 0, 3, 4, 4)
    with pytest.raises(ValueError, match="or divide it"):
        shard_qkv(torch.zeros(30, 4), 0, 4, 12, 3)  # 3 K/V heads on 4 ranks: neither divides the other
    with pytest.raises(ValueError, match="rank must be"):
        shard_qkv(torch.zeros(36, 4), 2, 2, 4, 4)
    with pytest.raises(ValueError, match="equal shards"):
        shard_cols(torch.zeros(4, 5), 0, 2)
