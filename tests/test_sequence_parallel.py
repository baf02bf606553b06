"""tinytf.sequence_parallel on 2, 3 and 4 gloo processes: the sequence-parallel block equals the single-process
block (forward, input gradient, every weight gradient after the replicated gradients are all-reduced), sends
exactly tensor parallelism's bytes (all-gathers and reduce-scatters instead of all-reduces), and without the
all-reduce its LayerNorm gradients are the partial sums diagnose_replicated_grads names."""

from __future__ import annotations

import pytest
import torch

import tinytf
from tinytf import (
    Comm,
    Pitfall,
    SequenceParallelBlock,
    all_gather_bytes,
    all_reduce_bytes,
    contiguous_layout,
    diagnose_replicated_grads,
    reduce_scatter_bytes,
    shard_block_tensors,
    shard_sequence,
)
from tinytf.launch import run_processes
from tinytf.parallel import reduce_replicated_kv_grads
from tinytf.sequence_parallel import REPLICATED

WORLDS = (2, 3, 4)
D, H, B, T = 48, 12, 2, 24


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def _case(rank: int, world: int, norm: str, kv: int) -> dict:
    torch.manual_seed(3)
    block = tinytf.TransformerBlock(D, H, T, norm=norm, kv_heads=kv).double()
    comm = Comm()
    sp = SequenceParallelBlock(block, rank, world, comm)
    mine = contiguous_layout(T, world)[rank]
    x = torch.randn(B, T, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    w = torch.randn(B, T, D, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    x_full, x_mine = x.clone().requires_grad_(), shard_sequence(x, mine, dim=1).requires_grad_()
    ref, out = block(x_full), sp(x_mine)
    (ref * w).sum().backward()
    (out * shard_sequence(w, mine, dim=1)).sum().backward()
    partial = {sp.source[n]: p.grad.clone() for n, p in sp.named_parameters() if n in REPLICATED}
    elements = sp.reduce_replicated_grads()
    reduce_replicated_kv_grads(sp.attn)
    full = shard_block_tensors({n: p.grad for n, p in block.named_parameters()}, rank, world, H, kv)
    return dict(fwd=_err(out, shard_sequence(ref, mine, dim=1)), dx=_err(x_mine.grad, shard_sequence(x_full.grad, mine, dim=1)),
                grads={sp.source[n]: _err(p.grad, full[sp.source[n]]) for n, p in sp.named_parameters()},
                partial=partial, reference={n: full[n] for n in partial}, elements=elements, nbytes=x.nbytes,
                phases=dict(comm.traffic.sent_by_phase), calls=dict(comm.traffic.calls))


def _job(rank: int, world: int) -> dict:
    kvs = (H, 2) if world != 3 else (H, 3)
    return dict(rank=rank, cases={(norm, kv): _case(rank, world, norm, kv) for norm in ("pre", "post") for kv in kvs})


@pytest.fixture(scope="module", params=WORLDS, ids=lambda p: f"P{p}")
def ranks(request) -> list[dict]:
    results = run_processes(_job, request.param)
    assert [r["rank"] for r in results] == list(range(request.param))
    return results


def test_equals_the_single_process_block(ranks):
    for r in ranks:
        assert len(r["cases"]) == 4
        for case, res in r["cases"].items():
            assert res["fwd"] <= 1e-12 and res["dx"] <= 1e-12, case
            assert len(res["grads"]) == 12 and max(res["grads"].values()) <= 1e-12, (case, res["grads"])


def test_the_bytes_are_tensor_parallelisms(ranks):
    world = len(ranks)
    for r in ranks:
        for (_norm, kv), res in r["cases"].items():
            n = res["nbytes"]  # one [B, T, D] activation
            per_pass = 2 * (all_gather_bytes(n, world) + reduce_scatter_bytes(n, world))
            assert per_pass == 2 * all_reduce_bytes(n, world)  # an all-reduce is a reduce-scatter and an all-gather
            assert res["phases"]["forward"] == res["phases"]["backward"] == per_pass
            assert (res["calls"]["all_gather", "forward"], res["calls"]["reduce_scatter", "forward"]) == (2, 2)
            assert (res["calls"]["all_gather", "backward"], res["calls"]["reduce_scatter", "backward"]) == (2, 2)
            assert res["elements"] == 6 * D  # two LayerNorms (weight, bias) and the two row-parallel biases
            replicated_kv = 0 if kv >= world else kv * (2 * D // H) * (D + 1) * 8  # the replicas' K/V rows (weight and bias)
            assert res["phases"]["weight_grad"] == all_reduce_bytes(6 * D * 8, world) + all_reduce_bytes(replicated_kv, world)


def test_without_the_all_reduce_the_layernorm_gradients_are_partial(ranks):
    for key in ranks[0]["cases"]:
        per_rank = [r["cases"][key]["partial"] for r in ranks]
        reference = ranks[0]["cases"][key]["reference"]
        assert sorted(reference) == sorted(tinytf.TensorParallelBlock.SOURCE[n] for n in REPLICATED)
        [finding] = diagnose_replicated_grads(per_rank, reference)
        assert finding.pitfall is Pitfall.SP_GRADS_NOT_REDUCED
        summed = [{n: sum(g[n] for g in per_rank) for n in reference}] * len(ranks)  # what the all-reduce leaves
        assert diagnose_replicated_grads(summed, reference) == []


def test_the_sequence_must_split_evenly():
    comm = Comm.__new__(Comm)
    comm.rank, comm.world = 0, 4
    with pytest.raises(ValueError, match="T=6 does not split into P=4"):
        tinytf.scatter_sequence(torch.zeros(1, 6, 2), comm)
