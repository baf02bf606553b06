"""tinytf.parallel with every position choice (chapter 13): a tensor-parallel block of a RoPE or ALiBi model equals the
single-process block on two gloo processes (ALiBi's slopes split with the heads), and parallelize_module with RoPE."""

from __future__ import annotations

import pytest
import torch

import tinytf
from tinytf import Comm, TensorParallelBlock
from tinytf.launch import run_processes
from tinytf.parallel import ParallelizableBlock

WORLD, D, H, B, T = 2, 32, 4, 2, 10


def _case(rank: int, positions: str, kv_heads: int | None, window: int | None) -> float:
    torch.manual_seed(7)
    trained = T if positions == "learned" else 8  # past max_tokens where no table stops it
    block = tinytf.TransformerBlock(tinytf.ModelConfig(dim=D, heads=H, kv_heads=kv_heads, max_tokens=trained, window=window,
                                                       positions=positions))
    tp = TensorParallelBlock(block, rank, WORLD, Comm(measure=False))
    x = torch.randn(B, T, D, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return (tp(x) - block(x)).abs().max().item()


def _pytorch_rope(rank: int) -> float:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    torch.manual_seed(8)
    block = tinytf.TransformerBlock(tinytf.ModelConfig(dim=D, heads=H, max_tokens=T, positions="rope"))
    theirs = parallelize_module(ParallelizableBlock(block, WORLD), init_device_mesh("cpu", (WORLD,)), ParallelizableBlock.plan())
    x = torch.randn(B, T, D, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return (theirs(x) - block(x)).abs().max().item()


CASES = [(p, kv, w) for p in ("learned", "sinusoidal", "rope", "alibi", "none") for kv, w in ((None, None), (2, 4))]


def _job(rank: int, world: int) -> dict:
    return {"rank": rank, "cases": {case: _case(rank, *case) for case in CASES}, "pytorch_rope": _pytorch_rope(rank)}


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return run_processes(_job, WORLD)


def test_tensor_parallel_block_equals_the_block_for_every_position_choice(ranks):
    assert len(CASES) == 10 and [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        worst = {case: err for case, err in r["cases"].items() if err > 1e-5}
        assert not worst, worst
        assert r["pytorch_rope"] <= 1e-5


def test_parallelize_module_refuses_alibi_with_the_fix():
    block = tinytf.TransformerBlock(tinytf.ModelConfig(dim=D, heads=H, positions="alibi"))
    with pytest.raises(ValueError, match="Use TensorParallelBlock"):
        ParallelizableBlock(block, WORLD)
