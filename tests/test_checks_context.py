"""tinytf.checks.context: each detector passes right code and names its pitfall on the matching mistake —
Ulysses with swapped axes, a ring buffer used before its wait (simulated ranks, blocks delivered at once and at
wait()), partial replicated gradients, K/V expanded before the ring — and says "general" for other errors."""

from __future__ import annotations

import math

import torch

import tinytf
from tinytf import Pitfall, contiguous_layout, ring_attention, shard_sequence
from tinytf.checks import diagnose_overlapped_ring, diagnose_replicated_grads, diagnose_ring_traffic, diagnose_ulysses


def _positions(chunks) -> torch.Tensor:
    return torch.cat([torch.arange(a, b) for a, b in chunks])


def written_out_ring(q, k, v, *, layout, comm, is_causal, buffers=2, early=False, masked=True):
    """One rank's double-buffered ring, written out (chapter 12's); ``buffers=1`` receives into the block being
    computed, ``early`` computes with the incoming buffer before its wait, ``masked=False`` forgets the mask."""
    rank, world = comm.rank, comm.world
    m = q.new_full((*q.shape[:-1], 1), -math.inf)
    l, acc = torch.zeros_like(m), torch.zeros_like(q)
    held, spare = [k, v], [torch.empty_like(k), torch.empty_like(v)]
    for step in range(world):
        src = (rank - step) % world
        pending = comm.post_exchange(held, spare if buffers == 2 else held) if step < world - 1 else None
        use = spare if early and pending else held
        scores = q @ use[0].transpose(-2, -1) / math.sqrt(q.size(-1))
        if is_causal and masked:
            scores = scores.masked_fill(_positions(layout[src])[None, :] > _positions(layout[rank])[:, None], -math.inf)
        m, l, acc = tinytf.online_softmax_update(m, l, acc, scores, use[1])
        if pending:
            held, spare = pending.wait(), (held if step > 0 else [torch.empty_like(k), torch.empty_like(v)])
    return tinytf.online_softmax_finish(m, l, acc)[0]


def test_overlapped_ring_right_code_passes():
    assert diagnose_overlapped_ring(written_out_ring) == []
    assert diagnose_overlapped_ring(lambda *a, **kw: ring_attention(*a, **kw, overlap=True)) == []
    assert diagnose_overlapped_ring(lambda *a, **kw: ring_attention(*a, **kw), world=4) == []


def test_one_buffer_and_reading_before_wait_are_named():
    for mistake in ({"buffers": 1}, {"early": True}):
        [f] = diagnose_overlapped_ring(lambda *a, mistake=mistake, **kw: written_out_ring(*a, **kw, **mistake))
        assert f.pitfall is Pitfall.RING_BUFFER_REUSED, (mistake, f)
    [f] = diagnose_overlapped_ring(lambda *a, **kw: written_out_ring(*a, **kw, buffers=1))
    assert "still being sent" in f.message


def test_writing_a_sent_block_before_its_wait_is_named():
    def scribble(q, k, v, *, layout, comm, is_causal):
        pending = comm.post_exchange([k, v])
        k.mul_(2)  # the block is still travelling
        pending.wait()
        return ring_attention(q, k, v, layout=layout, comm=comm, is_causal=is_causal)

    [f] = diagnose_overlapped_ring(scribble)
    assert f.pitfall is Pitfall.RING_BUFFER_REUSED and "written before its wait()" in f.message


def test_other_ring_errors_are_general():
    [f] = diagnose_overlapped_ring(lambda *a, **kw: written_out_ring(*a, **kw, masked=False))
    assert f.pitfall is Pitfall.GENERAL and "whenever the blocks arrive" in f.message

    def broken(*a, **kw):
        raise NotImplementedError

    [f] = diagnose_overlapped_ring(broken)
    assert f.pitfall is Pitfall.GENERAL and "not implemented" in f.title


def test_ulysses_axes_swapped_is_block_local_attention():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 12, 3, generator=g) for _ in range(3))
    layout = contiguous_layout(12, 3)
    right = tinytf.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert diagnose_ulysses([shard_sequence(right, c) for c in layout], q, k, v) == []
    local = [tinytf.scaled_dot_product_attention(*(shard_sequence(t, c) for t in (q, k, v)), is_causal=True) for c in layout]
    [f] = diagnose_ulysses(local, q, k, v)
    assert f.pitfall is Pitfall.ULYSSES_AXES_SWAPPED and "4 positions" in f.message
    [f] = diagnose_ulysses([torch.zeros_like(o) for o in local], q, k, v)
    assert f.pitfall is Pitfall.GENERAL


def test_replicated_gradients():
    full = {"norm1.weight": torch.arange(4.0), "norm1.bias": torch.ones(4)}
    parts = [{n: t * w for n, t in full.items()} for w in (0.25, 0.75)]
    [f] = diagnose_replicated_grads(parts, full)
    assert f.pitfall is Pitfall.SP_GRADS_NOT_REDUCED and "norm1.bias, norm1.weight" in f.message
    assert diagnose_replicated_grads([full, full], full) == []
    [f] = diagnose_replicated_grads([full, {n: -t for n, t in full.items()}], {n: t + 1 for n, t in full.items()})
    assert f.pitfall is Pitfall.GENERAL


def test_ring_traffic():
    q = torch.zeros(2, 8, 6, 4)  # [B, H, T/P, d] on one of P = 4 ranks; 2 K/V heads
    narrow = 2 * 3 * 2 * 2 * 6 * 4 * 4
    assert diagnose_ring_traffic(narrow, q, kv_heads=2, world=4) == []
    [f] = diagnose_ring_traffic(4 * narrow, q, kv_heads=2, world=4)
    assert f.pitfall is Pitfall.KV_EXPANDED_BEFORE_RING and "4×" in f.message
    [f] = diagnose_ring_traffic(narrow + 1, q, kv_heads=2, world=4)
    assert f.pitfall is Pitfall.GENERAL
