"""tinytf.context_parallel on 3 gloo processes: a whole block with every activation split along the sequence
equals the single-process block — ring (contiguous, zig-zag, overlapped) and Ulysses, pre- and post-norm,
forward, input gradient and every weight gradient once reduce_grads has summed them — and Ulysses refuses a
layout that is not contiguous."""

from __future__ import annotations

import pytest
import torch

import tinytf
from tinytf import Comm, ContextParallelBlock, contiguous_layout, shard_sequence, zigzag_layout
from tinytf.launch import run_processes

WORLD = 3
B, T, D, H = 2, 12, 24, 6
VARIANTS = {"ring": ("ring", contiguous_layout, False), "zigzag": ("ring", zigzag_layout, False),
            "overlapped": ("ring", zigzag_layout, True), "ulysses": ("ulysses", contiguous_layout, False)}


def _case(rank: int, world: int, variant: str, norm: str) -> dict:
    attention, make, overlap = VARIANTS[variant]
    torch.manual_seed(9)
    block = tinytf.TransformerBlock(D, H, T, norm=norm, kv_heads=3).double()
    layout = make(T, world)
    cp = ContextParallelBlock(block, Comm(), layout, attention=attention, overlap=overlap)
    x = torch.randn(B, T, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    w = torch.randn(B, T, D, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    x_full, x_mine = x.clone().requires_grad_(), shard_sequence(x, layout[rank], dim=1).requires_grad_()
    ref, out = block(x_full), cp(x_mine)
    (ref * w).sum().backward()
    (out * shard_sequence(w, layout[rank], dim=1)).sum().backward()
    elements = cp.reduce_grads()
    full = dict(block.named_parameters())
    return dict(fwd=(out - shard_sequence(ref, layout[rank], dim=1)).abs().max().item(),
                dx=(x_mine.grad - shard_sequence(x_full.grad, layout[rank], dim=1)).abs().max().item(),
                grads=max((p.grad - full[n.removeprefix("block.")].grad).abs().max().item() for n, p in cp.named_parameters()),
                elements=elements, params=sum(p.numel() for p in block.parameters()))


def _job(rank: int, world: int) -> dict:
    return {(v, norm): _case(rank, world, v, norm) for v in VARIANTS for norm in ("pre", "post")}


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return run_processes(_job, WORLD)


def test_equals_the_single_process_block(ranks):
    for r in ranks:
        assert len(r) == 2 * len(VARIANTS)
        for case, res in r.items():
            assert res["fwd"] <= 1e-12 and res["dx"] <= 1e-12 and res["grads"] <= 1e-12, (case, res)
            assert res["elements"] == res["params"]  # every weight's gradient is all-reduced


def test_ulysses_needs_the_contiguous_layout():
    comm = Comm.__new__(Comm)
    comm.rank, comm.world = 0, 2
    with pytest.raises(ValueError, match="contiguous layout"):
        ContextParallelBlock(tinytf.TransformerBlock(8, 2, 8), comm, zigzag_layout(8, 2), attention="ulysses")
    with pytest.raises(ValueError, match="attention must be one of"):
        ContextParallelBlock(tinytf.TransformerBlock(8, 2, 8), comm, attention="striped")
