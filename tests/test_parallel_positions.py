"""Every position choice of chapter 13 wherever a block is split across gloo processes (P = 2 and 4):
tensor parallelism, sequence parallelism, the ring (contiguous, zig-zag, overlapped) and Ulysses equal one
process — the split block's output, every weight gradient and the embedding tables' gradients — for learned,
sinusoidal, RoPE (both layouts), ALiBi and no positions; RoPE and ALiBi also with grouped-query K/V and a window.

Learned and sinusoidal rows are added before the block as tinytf.context_parallel documents (each rank the rows
of its global positions); RoPE and ALiBi act inside the split block. A RoPE ring rotated at each rank's local
positions — the mistake the split makes easy — is measured too, and must be far off. PyTorch's
parallelize_module (ParallelizableBlock) is checked with RoPE and ALiBi."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn

import tinytf
from tinytf import (
    Comm,
    ContextParallelBlock,
    SequenceParallelBlock,
    TensorParallelBlock,
    contiguous_layout,
    layout_positions,
    shard_block_tensors,
    zigzag_layout,
)
from tinytf.launch import run_processes
from tinytf.parallel import ParallelizableBlock, reduce_replicated_kv_grads

WORLDS = (2, 4)
B, T, D, H, VOCAB = 2, 16, 16, 4, 11  # T divisible by 2P for P = 2 and 4 (zig-zag)
POSITIONS = {"learned": {}, "sinusoidal": {}, "rope": {}, "rope interleaved": {"rope_layout": "interleaved"},
             "alibi": {}, "none": {}}
SPLITS = ("tensor", "sequence", "ring", "zigzag", "zigzag overlapped", "ulysses")
SHAPES = {"multi-head": {}, "grouped, window 5": {"kv_heads": 2, "window": 5}}
# learned, sinusoidal and no positions act before the block: one shape is enough; RoPE and ALiBi act inside attention,
# where the grouped K/V heads and the window meet them
CASES = [(p, s, split) for p in POSITIONS for s in SHAPES for split in SPLITS if s == "multi-head" or p in ("rope", "alibi")]


def _model(positions: str, shape: str) -> tinytf.TinyLanguageModel:
    torch.manual_seed(5)
    extra = {**POSITIONS[positions], **SHAPES[shape]}
    name = positions.split()[0]
    return tinytf.TinyLanguageModel(vocab=VOCAB, dim=D, heads=H, layers=1, max_tokens=T, positions=name, **extra).double()


def _embed(model: tinytf.TinyLanguageModel, ids: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Token embeddings plus the position table's rows ``rows`` (the global positions of these tokens), if any."""
    return model.embed(ids, rows.expand_as(ids))


def _split(split: str, block: nn.Module, rank: int, world: int, comm: Comm):
    """The split block and the global positions of the tokens it takes."""
    if split == "tensor":
        return TensorParallelBlock(block, rank, world, comm), torch.arange(T)
    if split == "sequence":
        return SequenceParallelBlock(block, rank, world, comm), layout_positions(contiguous_layout(T, world)[rank])
    layout = (zigzag_layout if split.startswith("zigzag") else contiguous_layout)(T, world)
    cp = ContextParallelBlock(block, comm, layout, attention="ulysses" if split == "ulysses" else "ring",
                              overlap=split.endswith("overlapped"))
    return cp, layout_positions(layout[rank])


def _grads(split: str, blk: nn.Module, model: tinytf.TinyLanguageModel, rank: int, world: int) -> dict:
    """Every gradient of the split model, summed where a rank holds only its positions' share, by the block's names."""
    if split in ("tensor", "sequence"):
        if split == "sequence":
            blk.reduce_replicated_grads()
        reduce_replicated_kv_grads(blk.attn)
        grads = {blk.source[n]: p.grad for n, p in blk.named_parameters()}
    else:
        blk.reduce_grads()
        grads = {n.removeprefix("block."): p.grad for n, p in blk.named_parameters()}
    for name, p in (("token", model.token.weight), ("position", getattr(model.position, "weight", None))):
        if p is not None:
            if split != "tensor":  # the split sequence: each rank's table gradient covers its own tokens
                dist.all_reduce(p.grad)
            grads[name] = p.grad
    return grads


def _case(rank: int, world: int, positions: str, shape: str, split: str) -> dict:
    ref_model = _model(positions, shape)
    model, comm = copy.deepcopy(ref_model), Comm(measure=False)
    g = torch.Generator().manual_seed(1)
    ids, w = torch.randint(VOCAB, (B, T), generator=g), torch.randn(B, T, D, generator=g, dtype=torch.float64)
    ref = ref_model.blocks[0](_embed(ref_model, ids, torch.arange(T)))
    (ref * w).sum().backward()
    blk, rows = _split(split, model.blocks[0], rank, world, comm)
    out = blk(_embed(model, ids[:, rows], rows))
    (out * w[:, rows]).sum().backward()
    want = shard_block_tensors({n: p.grad for n, p in ref_model.blocks[0].named_parameters()}, rank, world, H,
                               ref_model.config.n_kv_heads) if split in ("tensor", "sequence") else \
        {n: p.grad for n, p in ref_model.blocks[0].named_parameters()}
    want["token"] = ref_model.token.weight.grad
    if isinstance(ref_model.position, nn.Embedding):
        want["position"] = ref_model.position.weight.grad
    got = _grads(split, blk, model, rank, world)
    assert sorted(got) == sorted(want), (sorted(got), sorted(want))
    return dict(fwd=(out - ref[:, rows]).abs().max().item(), grads=max((got[n] - want[n]).abs().max().item() for n in want),
                names=len(want))


class _RotatedLocally(nn.Module):
    """The mistake: RoPE at each rank's local positions ``0 … T/P - 1`` (whatever positions it is given)."""

    def __init__(self, rope: nn.Module) -> None:
        super().__init__()
        self.rope = rope

    def forward(self, q, k, start=0, positions=None):
        return self.rope(q, k)


def _rope_at_local_positions(rank: int, world: int) -> float:
    ref_model = _model("rope", "multi-head")
    ids = torch.randint(VOCAB, (B, T), generator=torch.Generator().manual_seed(1))
    layout = contiguous_layout(T, world)
    cp = ContextParallelBlock(ref_model.blocks[0], Comm(measure=False), layout)
    cp.block.attn.rope = _RotatedLocally(cp.block.attn.rope)
    rows = layout_positions(layout[rank])
    with torch.no_grad():
        ref = ref_model.blocks[0](ref_model.token(ids))
        return (cp(ref_model.token(ids[:, rows])) - ref[:, rows]).abs().max().item()


def _pytorch(world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    mesh, errs = init_device_mesh("cpu", (world,)), {}
    for positions in ("rope", "alibi"):
        block = _model(positions, "multi-head").blocks[0]
        theirs = parallelize_module(ParallelizableBlock(block, world), mesh, ParallelizableBlock.plan())
        x = torch.randn(B, T, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        with torch.no_grad():
            errs[positions] = (theirs(x) - block(x)).abs().max().item()
    return errs


def _job(rank: int, world: int) -> dict:
    cases = {case: _case(rank, world, *case) for case in CASES}
    return dict(rank=rank, cases=cases, local=_rope_at_local_positions(rank, world), pytorch=_pytorch(world))


@pytest.fixture(scope="module", params=WORLDS, ids=lambda p: f"P{p}")
def ranks(request) -> list[dict]:
    results = run_processes(_job, request.param)
    assert [r["rank"] for r in results] == list(range(request.param))
    return results


def test_every_split_equals_one_process_for_every_position_choice(ranks):
    for r in ranks:
        assert len(r["cases"]) == len(CASES) == (len(POSITIONS) + 2) * len(SPLITS) == 48
        wrong = {case: res for case, res in r["cases"].items() if res["fwd"] > 1e-12 or res["grads"] > 1e-12}
        assert not wrong, (r["rank"], wrong)
        learned = [res["names"] for (p, _s, _split), res in r["cases"].items() if p == "learned"]
        assert set(learned) == {12 + 2}  # the block's 12 tensors, the token and the position table


def test_rope_rotated_at_local_positions_is_wrong(ranks):
    assert ranks[0]["local"] <= 1e-12  # rank 0's local positions are its global ones, and it sees only its own keys
    assert min(r["local"] for r in ranks[1:]) > 1e-2


def test_parallelize_module_with_rope_and_alibi(ranks):
    for r in ranks:
        assert sorted(r["pytorch"]) == ["alibi", "rope"] and max(r["pytorch"].values()) <= 1e-12, r["pytorch"]


def _one_rank(world: int = 2) -> Comm:
    comm = Comm.__new__(Comm)
    comm.rank, comm.world = 0, world
    return comm


def test_alibi_and_windows_need_causal_attention_with_the_fix():
    q = torch.zeros(1, 4, 4, 8)
    comm, layout, slopes = _one_rank(), contiguous_layout(8, 2), tinytf.alibi_slopes(4)
    for attend in (lambda **o: tinytf.ring_attention(q, q, q, layout=layout, comm=comm, **o),
                   lambda **o: tinytf.ulysses_attention(q, q, q, comm=comm, **o)):
        with pytest.raises(ValueError, match="Pass is_causal=True, or drop the slopes"):
            attend(slopes=slopes)
        with pytest.raises(ValueError, match="one slope per query head"):
            attend(slopes=slopes[:2], is_causal=True)
        with pytest.raises(ValueError, match="window=3.*needs is_causal=True"):
            attend(window=3)
    block = tinytf.TransformerBlock(tinytf.ModelConfig(dim=D, heads=H, positions="alibi"))
    tp = tinytf.TensorParallelAttention(block.attn, 0, 2, _one_rank())
    with pytest.raises(ValueError, match="Pass is_causal=True"):
        tp.partial(torch.zeros(1, 4, D), is_causal=False)


def test_rope_rotates_one_dimensional_positions_by_the_cached_tables():
    rope = tinytf.RotaryEmbedding(tinytf.ModelConfig(dim=D, heads=H, positions="rope"))
    q, k = torch.randn(2, H, T, D // H), torch.randn(2, H, T, D // H)
    whole = rope(q, k)
    rows = layout_positions(zigzag_layout(T, 2)[1])  # positions 4 … 11 of T = 16
    mine = rope(q[..., rows, :], k[..., rows, :], positions=rows)
    assert all(torch.equal(a, b[..., rows, :]) for a, b in zip(mine, whole))  # bit for bit: the same table rows


def test_a_rank_embeds_its_global_positions_and_the_learned_table_still_stops():
    model = _model("learned", "multi-head")
    ids = torch.randint(VOCAB, (B, T), generator=torch.Generator().manual_seed(1))
    rows = layout_positions(zigzag_layout(T, 2)[1])
    with torch.no_grad():
        assert torch.equal(model.embed(ids[:, rows], rows.expand(B, -1)), model.embed(ids)[:, rows])
    past = layout_positions(contiguous_layout(2 * T, 2)[1])  # positions T … 2T - 1 of a sequence twice max_tokens
    with pytest.raises(ValueError, match=f"exceed max_tokens={T}"):
        model.embed(ids, past.expand(B, -1))
