"""tinytf.memory.attention_io_bytes: the IO model's properties (FlashAttention paper: Θ(Nd + N²) vs
Θ(N²d²/M)), and the tiled count tied to the tiles tinytf.tiled_attention really computes."""

import pytest
import torch

import tinytf
from tinytf.memory import KiB, attention_io_bytes, tiled_io_blocks


def io(n, d=64, m=64 * KiB, **kw):
    return attention_io_bytes(n, d, m, **kw)


def test_explicit_is_independent_of_fast_memory_and_quadratic_in_n():
    assert io(4096, m=16 * KiB, method="explicit") == io(4096, m=1024 * KiB, method="explicit")
    ratios = [io(2 * n, method="explicit") / io(n, method="explicit") for n in (1024, 8192, 65536)]
    assert ratios[0] < ratios[1] < ratios[2] < 4 and ratios[2] > 3.99  # Θ(Nd + N²): tends to 4 per doubling
    assert io(4096, method="explicit", causal=True) > io(4096, method="explicit")  # the mask is one more pass over S


def test_tiled_blocks_are_the_largest_that_fit():
    for d, m, b in [(64, 64 * KiB, 4), (128, 192 * KiB, 2), (32, 16 * KiB, 4)]:
        bq, bk = tiled_io_blocks(100_000, d, m, b)
        used = 2 * bq * d + 2 * bq + 2 * bk * d + bq * bk
        more = 2 * (bq + 1) * d + 2 * (bq + 1) + 2 * bk * d + (bq + 1) * bk
        assert bk == d and used * b <= m < more * b
    assert tiled_io_blocks(100, 64, 10**9) == (100, 64)  # never larger than the sequence
    with pytest.raises(ValueError, match=r"cannot hold one tile for head_dim=64.*fast_memory >= "):
        tiled_io_blocks(1024, 64, 4 * KiB)


def test_tiled_moves_fewer_bytes_than_explicit_only_when_fast_memory_is_large_enough():
    n, d = 8192, 64
    sizes = [34 * KiB] + [2**k for k in range(16, 24)]  # 34 KiB (two query rows fit) .. 8 MiB
    wins = [io(n, d, m, method="tiled") < io(n, d, m, method="explicit") for m in sizes]
    assert not wins[0] and wins[-1]  # one query row at a time re-reads K and V N times: worse than explicit
    assert wins == sorted(wins)  # once it wins it keeps winning as M grows
    assert io(n, d, 192 * KiB, method="tiled", bytes_per=2) * 5 < io(n, d, 192 * KiB, method="explicit", bytes_per=2)


def test_tiled_scales_as_n2_d2_over_m():
    n, d, m = 16384, 64, 256 * KiB
    base = io(n, d, m, method="tiled")
    # twice the fast memory: about half the K/V passes (a bit more, as the K/V block's share is fixed)
    assert 1.9 <= base / io(n, d, 2 * m, method="tiled") <= 2.3
    assert 3.8 <= io(2 * n, d, m, method="tiled") / base <= 4.05  # still quadratic in N: the pairwise work stays
    ratios = [io(n, d, mm, method="tiled") * mm / (n * n * d * d * 4) for n, d, mm in
              [(8192, 64, 256 * KiB), (16384, 64, 1024 * KiB), (16384, 128, 1024 * KiB), (32768, 32, 128 * KiB)]]
    assert max(ratios) / min(ratios) < 1.5, ratios  # the same constant in front of N²d²/M


def test_causal_tiled_reads_about_half_the_keys():
    full, causal = io(16384, method="tiled"), io(16384, method="tiled", causal=True)
    assert 0.5 <= causal / full <= 0.55


@pytest.mark.parametrize("causal", [False, True])
def test_tiled_count_is_the_tiles_tiled_attention_computes(causal):
    n, d, bq, bk = 96, 8, 16, 8
    q, k, v = (torch.randn(1, 1, n, d) for _ in range(3))
    _, stats = tinytf.tiled_attention(q, k, v, is_causal=causal, block_q=bq, block_k=bk, return_stats=True)
    moved = attention_io_bytes(n, d, 0, method="tiled", causal=causal, block_q=bq, block_k=bk, bytes_per=4)
    fixed = (2 * n * d + n) * 4  # Q read once, O and lse written once
    assert moved - fixed == stats.computed * 2 * bk * d * 4  # every computed tile reads one K and one V block


def test_unknown_method():
    with pytest.raises(ValueError, match="method must be one of"):
        io(128, method="flash")
