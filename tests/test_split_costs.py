"""tinytf.split_costs: the per-layer, per-step formulas of chapter 12's table against the bytes Comm counts
when each split runs a whole block on 2 and 4 gloo processes (forward, backward, weight-gradient phases),
and the numbers the chapter quotes (7B and 70B shapes, the claims it corrects)."""

from __future__ import annotations

import pytest
import torch

import tinytf
from tinytf import (
    Comm,
    ContextParallelBlock,
    SequenceParallelBlock,
    TensorParallelBlock,
    contiguous_layout,
    shard_sequence,
    zigzag_layout,
)
from tinytf.launch import run_processes
from tinytf.split_costs import (
    H100,
    LLAMA2_7B,
    LLAMA2_70B,
    SPLITS,
    LayerShape,
    fsdp_weight_traffic,
    overlap_threshold,
    split_costs,
    training_state_bytes,
)

WORLDS = (2, 4)
B, T, D, H, KV = 2, 16, 32, 8, 4  # T divisible by 2P for P = 2 and 4; grouped-query K/V


def _block() -> tinytf.TransformerBlock:
    torch.manual_seed(0)
    return tinytf.TransformerBlock(D, H, T, kv_heads=KV)


def _run(rank: int, world: int, split: str) -> dict:
    """One training step's communication of ``split`` on this rank: the block forward and backward, then the
    weight-gradient reduction the split needs. Returns the bytes per phase and the largest error."""
    block = _block()
    x = torch.randn(B, T, D, generator=torch.Generator().manual_seed(1))
    w = torch.randn(B, T, D, generator=torch.Generator().manual_seed(2))
    ref = block(x)
    comm = Comm()
    layout = (zigzag_layout if split == "zigzag" else contiguous_layout)(T, world)
    if split == "tensor":
        model, x_in, w_in, ref_mine = TensorParallelBlock(block, rank, world, comm), x, w, ref
    else:
        x_in, w_in, ref_mine = (shard_sequence(t, layout[rank], dim=1) for t in (x, w, ref))
        model = (SequenceParallelBlock(block, rank, world, comm) if split == "sequence" else
                 ContextParallelBlock(block, comm, layout, attention="ulysses" if split == "ulysses" else "ring"))
    out = model(x_in)
    (out * w_in).sum().backward()
    if split == "sequence":
        model.reduce_replicated_grads()
    elif split != "tensor":
        model.reduce_grads()
    return dict(err=(out - ref_mine).abs().max().item(), phases=dict(comm.traffic.sent_by_phase))


def _job(rank: int, world: int) -> dict:
    return {split: _run(rank, world, split) for split in SPLITS}


@pytest.fixture(scope="module", params=WORLDS, ids=lambda p: f"P{p}")
def ranks(request) -> list[dict]:
    return run_processes(_job, request.param)


def test_every_split_computes_the_block(ranks):
    for r in ranks:
        assert sorted(r) == sorted(SPLITS)
        for split, res in r.items():
            assert res["err"] <= 1e-5, (split, res["err"])


def test_counted_bytes_equal_the_formulas(ranks):
    world = len(ranks)
    costs = split_costs(LayerShape.of_block(_block()), B, T, world, bytes_per=4)
    assert sorted(costs) == sorted(SPLITS)
    for r in ranks:
        for split, res in r.items():
            c = costs[split]
            want = {"forward": c.forward, "backward": c.backward, "weight_grad": c.weight_grad}
            assert res["phases"] == {k: v for k, v in want.items() if v}, (split, res["phases"], want)


def test_layer_shapes_count_the_models_parameters():
    block = _block()
    assert LayerShape.of_block(block).params == sum(p.numel() for p in block.parameters())
    assert LLAMA2_7B.model_params == LLAMA2_7B.params * LLAMA2_7B.layers + 2 * 32000 * 4096  # + embedding and output layer
    assert round(LLAMA2_7B.model_params / 1e9, 2) == 6.74 and round(LLAMA2_70B.model_params / 1e9, 1) == 69.0


def test_the_ring_backward_and_weight_gradients_claim_one():
    # chapter 12's two measured shapes at P = 2 in fp32: the ring's weight gradients need an all-reduce of their own
    small = split_costs(LayerShape.of_block(tinytf.TransformerBlock(64, 4, 512)), 1, 512, 2, bytes_per=4)
    wide = split_costs(LayerShape.of_block(tinytf.TransformerBlock(512, 8, 64)), 2, 64, 2, bytes_per=4)
    assert small["ring"].weight_grad == 199_936 and round(wide["ring"].weight_grad / 1e6, 1) == 12.6
    assert wide["tensor"].total == 1_048_576  # 1.05 MB: two all-reduces forward, two backward, no weight gradients
    for c in (small, wide):
        assert c["ring"].forward * 2 == c["tensor"].forward  # the forward claim holds ...
        assert c["ring"].backward == 1.5 * c["tensor"].backward  # ... the backward sends 6 blocks: 1.5x at P = 2


def test_seventy_b_at_eight_ranks():
    c = split_costs(LLAMA2_70B, 1, 32768, 8)
    assert c["tensor"].forward / c["ring"].forward == 16  # 2x for half the bytes, 8x for kv_heads / heads
    ring = c["ring"]
    assert ring.weight_grad > 8 * (ring.forward + ring.backward)  # but the ring's weight-gradient all-reduce dominates its step
    assert 0.8 < ring.total / c["tensor"].total < 0.9  # per layer and step: not 1/16 of tensor parallelism, 0.83 of it
    assert c["zigzag"].busiest == 1 and round(c["ring"].busiest, 3) == 1.875  # (2P - 1)/P with a fine-tiled kernel
    assert round(training_state_bytes(LLAMA2_70B.model_params, 8) / 1e9) == 138 > H100.memory / 1e9  # TP = 8 alone: too much
    replicated, fsdp = fsdp_weight_traffic(LLAMA2_70B.params, 8)
    assert fsdp == 1.5 * replicated  # FSDP / ZeRO-3: two all-gathers and a reduce-scatter instead of an all-reduce


def test_overlap_thresholds():
    assert round(H100.flops / H100.nvlink) == 2198 and round(H100.flops / H100.infiniband) == 19780
    assert overlap_threshold(H100.flops, H100.infiniband) == 19780
    assert overlap_threshold(H100.flops, H100.infiniband, causal=True) == 2 * 19780
    assert round(overlap_threshold(H100.flops, H100.nvlink)) == 2198
    assert 131072 // 32 < overlap_threshold(H100.flops, H100.infiniband)  # T = 131,072 on P = 32 (4 nodes): exposed
