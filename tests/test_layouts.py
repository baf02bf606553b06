"""tinytf.layouts: where each rank's tokens sit — the layouts partition the positions, a rank's global positions
are what shard_sequence cuts, unshard_sequence undoes it, and an uneven split names the padding that fixes it."""

from __future__ import annotations

import pytest
import torch

from tinytf.layouts import causal_scores, contiguous_layout, layout_positions, local_ranges, shard_sequence, unshard_sequence, zigzag_layout


@pytest.mark.parametrize("make", [contiguous_layout, zigzag_layout])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_a_layout_partitions_the_positions(make, world):
    t = 24
    layout = make(t, world)
    assert len(layout) == world
    positions = [layout_positions(chunks) for chunks in layout]
    assert all(p.numel() == t // world for p in positions)
    assert torch.equal(torch.cat(positions).sort().values, torch.arange(t))
    x = torch.arange(t)[None, :, None].expand(2, t, 3)  # [B, T, D]: each row holds its own position
    parts = [shard_sequence(x, chunks, dim=1) for chunks in layout]
    assert all(torch.equal(part[0, :, 0], p) for part, p in zip(parts, positions))
    assert torch.equal(unshard_sequence(parts, layout, dim=1), x)
    assert sum(causal_scores(layout)) == t * (t + 1) // 2


def test_zigzag_positions_and_local_ranges():
    assert layout_positions(zigzag_layout(8, 2)[0]).tolist() == [0, 1, 6, 7]
    assert local_ranges(zigzag_layout(8, 2)[1]) == [(0, 2, 2, 4), (2, 4, 4, 6)]


def test_uneven_splits_name_the_padding():
    with pytest.raises(ValueError, match="pad T to a multiple of 4"):
        contiguous_layout(10, 4)
    with pytest.raises(ValueError, match="pad T to a multiple of 8"):
        zigzag_layout(12, 4)
