"""tinytf.collectives on 2, 3 and 4 real gloo processes: the counted ring collectives (and the all-to-all)
equal torch.distributed's, the bytes each rank sends equal the ring formulas, a posted exchange is the
blocking one, and f/g all-reduce on the right side of autograd. With P = 2 the previous and the next rank
are the same process; P = 3 and 4 are where a ring-direction or chunk-index bug shows."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tinytf import (
    Comm,
    all_gather_bytes,
    all_reduce_bytes,
    all_to_all_bytes,
    conjugate_exchange,
    copy_to_parallel,
    reduce_from_parallel,
    reduce_scatter_bytes,
)
from tinytf.launch import run_processes

WORLDS = (2, 3, 4)
SIZES = (24, 1200, 3 * 4096)  # elements; divisible by 2, 3 and 4 so that the formulas are exact
ODD = 13  # not divisible by P: uneven chunks


def _collectives_job(rank: int, world: int) -> dict:
    """Every collective, counted, next to torch.distributed's own result."""
    comm, out = Comm(), {"rank": rank, "cases": []}
    for n in (*SIZES, ODD):
        x = torch.randn(n, generator=torch.Generator().manual_seed(rank * 100 + n))
        comm.reset()
        mine = comm.all_reduce(x.clone())
        sent_ar = comm.traffic.sent
        ref = x.clone()
        dist.all_reduce(ref)
        comm.reset()
        part = comm.reduce_scatter(x)
        sent_rs = comm.traffic.sent
        comm.reset()
        sizes = [c.numel() for c in x.tensor_split(world)]
        gathered = comm.all_gather(x.tensor_split(world)[rank], sizes)
        sent_ag = comm.traffic.sent
        everyone = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(everyone, x)
        comm.reset()
        (got,) = comm.exchange([x])
        sent_p2p = comm.traffic.sent, comm.traffic.received
        into = torch.full_like(x, float("nan"))
        pending = comm.post_exchange([x * 2], [into])  # returns at once; the receive lands in `into`
        posted = pending.wait()[0] is into and torch.equal(into, 2 * everyone[(rank - 1) % world])
        a2a, a2a_err, sent_a2a = None, None, None
        if n % world == 0:
            comm.reset()
            a2a = comm.all_to_all(x.view(world, -1))  # chunk j to rank j; chunk i of the result from rank i
            want = torch.stack([e.view(world, -1)[rank] for e in everyone])
            a2a_err, sent_a2a = (a2a - want).abs().max().item(), (comm.traffic.sent, comm.traffic.received)
        out["cases"].append(dict(
            n=n, nbytes=x.nbytes, ar_err=(mine - ref).abs().max().item(), sent_ar=sent_ar,
            rs_err=(part - ref.tensor_split(world)[rank]).abs().max().item(), sent_rs=sent_rs,
            ag_err=(gathered - torch.cat([e.tensor_split(world)[i] for i, e in enumerate(everyone)])).abs().max().item(),
            sent_ag=sent_ag, p2p_err=(got - everyone[(rank - 1) % world]).abs().max().item(), sent_p2p=sent_p2p,
            posted=posted, a2a_err=a2a_err, sent_a2a=sent_a2a, phases=dict(comm.traffic.sent_by_phase),
        ))
    fast = Comm(measure=False)
    y = fast.all_reduce(torch.ones(5) * (rank + 1))
    out["fast"] = (y.tolist(), fast.traffic.count("all_reduce"), fast.traffic.sent, fast.traffic.logical["all_reduce"])
    # f and g: copy_to_parallel all-reduces the gradient, reduce_from_parallel the value
    comm.reset()
    x = torch.full((3,), float(rank + 1), requires_grad=True)
    (copy_to_parallel(x, comm) * (rank + 1)).sum().backward()
    out["f"] = (x.grad.tolist(), comm.traffic.count("all_reduce"), comm.traffic.count("all_reduce", "backward"))
    comm.reset()
    x = torch.full((3,), float(rank + 1), requires_grad=True)
    y = reduce_from_parallel(x, comm)
    y.sum().backward()
    out["g"] = (y.tolist(), x.grad.tolist(), comm.traffic.count("all_reduce"), comm.traffic.count("all_reduce", "backward"))
    return out


@pytest.fixture(scope="module", params=WORLDS, ids=lambda p: f"P{p}")
def ranks(request) -> list[dict]:
    results = run_processes(_collectives_job, request.param)
    assert [r["rank"] for r in results] == list(range(request.param))
    return results


def test_ring_collectives_equal_torch_distributed(ranks):
    for r in ranks:
        assert len(r["cases"]) == len(SIZES) + 1
        for c in r["cases"]:
            assert c["ar_err"] < 1e-5 and c["rs_err"] < 1e-5, c
            assert c["ag_err"] == 0 and c["p2p_err"] == 0 and c["posted"], c
        for c in r["cases"][: len(SIZES)]:
            assert c["a2a_err"] == 0, c


def test_bytes_sent_equal_the_ring_formulas(ranks):
    world = len(ranks)
    for r in ranks:
        for c in r["cases"][: len(SIZES)]:
            assert c["sent_ar"] == all_reduce_bytes(c["nbytes"], world) == 2 * (world - 1) * c["nbytes"] / world
            assert c["sent_rs"] == reduce_scatter_bytes(c["nbytes"], world)
            assert c["sent_ag"] == all_gather_bytes(c["nbytes"], world)
            assert c["sent_p2p"] == (c["nbytes"], c["nbytes"])
            assert c["sent_a2a"] == (all_to_all_bytes(c["nbytes"], world),) * 2
            assert c["phases"] == {"forward": all_to_all_bytes(c["nbytes"], world)}  # counted per phase too
    # uneven chunks: over all ranks, every chunk is still sent (P - 1) times per phase
    odd = [r["cases"][-1] for r in ranks]
    assert sum(c["sent_ar"] for c in odd) == 2 * (world - 1) * odd[0]["nbytes"]


def test_formulas_for_larger_rings():
    assert all_reduce_bytes(1000, 4) == 1500 and all_reduce_bytes(1000, 1) == 0
    assert reduce_scatter_bytes(1000, 4) == all_gather_bytes(1000, 4) == all_to_all_bytes(1000, 4) == 750


def test_fast_path_counts_calls_not_bytes(ranks):
    total_over_ranks = sum(range(1, len(ranks) + 1))
    for r in ranks:
        total, calls, sent, logical = r["fast"]
        assert total == [float(total_over_ranks)] * 5 and calls == 1 and sent == 0 and logical == 5 * 4


def test_f_reduces_the_gradient_and_g_the_value(ranks):
    total_over_ranks = sum(range(1, len(ranks) + 1))
    for r in ranks:
        grad, fwd, bwd = r["f"]
        assert grad == [float(total_over_ranks)] * 3 and (fwd, bwd) == (0, 1)  # d/dx of sum over ranks of (rank + 1) x
        value, grad, fwd, bwd = r["g"]
        assert value == [float(total_over_ranks)] * 3 and grad == [1.0] * 3 and (fwd, bwd) == (1, 0)


def test_all_to_all_needs_one_chunk_per_rank():
    comm = Comm.__new__(Comm)  # no process group needed to check the argument
    comm.rank, comm.world, comm.group = 0, 4, None
    with pytest.raises(ValueError, match=r"one chunk per rank.*P=4"):
        comm.all_to_all(torch.zeros(3, 2))


def test_conjugate_exchange_sends_the_gradient_through_the_conjugate():
    """The op runs forward, its conjugate on the gradient, each given the comm and told its phase (what Traffic
    counts by). A stand-in comm: the plumbing needs no process group (the real exchanges are tested in
    test_ulysses and test_sequence_parallel)."""
    calls, comm = [], object()

    def op(x, comm, phase):
        calls.append(("op", phase, comm))
        return x * 2

    def conj(d_y, comm, phase):
        calls.append(("conj", phase, comm))
        return d_y * 3

    x = torch.ones(2, 3, requires_grad=True)
    y = conjugate_exchange(x, comm, op, conj)
    y.sum().backward()
    assert torch.equal(y, torch.full((2, 3), 2.0)) and torch.equal(x.grad, torch.full((2, 3), 3.0))
    assert calls == [("op", "forward", comm), ("conj", "backward", comm)]
