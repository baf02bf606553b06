"""tinytf.tiled_attention: exact parity with the explicit version and PyTorch's kernel (values and
gradients), the causal tile count, the same errors, and memory that never holds a [Tq, Tk] tensor."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from tinytf import (
    TileStats,
    causal_mask,
    online_softmax_finish,
    online_softmax_update,
    padding_mask,
    scaled_dot_product_attention,
    tiled_attention,
)
from tinytf.memory import PeakMemoryMeter, SavedTensorMeter


def rand_qkv(b=2, h=3, tq=37, tk=37, d=8, dv=6, device="cpu", dtype=torch.float32, grad=False):
    g = torch.Generator().manual_seed(tq * 1000 + tk)
    q, k, v = (torch.randn(b, h, t, w, generator=g, dtype=dtype).to(device) for t, w in ((tq, d), (tk, d), (tk, dv)))
    return tuple(t.requires_grad_(grad) for t in (q, k, v))


def grads(fn, q, k, v, seed=0):
    """(out, dq, dk, dv) of ``fn(q, k, v)`` under a fixed random upstream gradient."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v)
    d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype).to(out.device)
    out.backward(d_out)
    return out.detach(), q.grad, k.grad, v.grad


SHAPES = [  # (tq, tk, block_q, block_k): T not a multiple of the block, Tq != Tk, one ragged tile, blocks > T
    (37, 37, 8, 16),
    (13, 50, 4, 7),
    (50, 13, 16, 5),
    (64, 64, 16, 16),
    (1, 9, 64, 64),
    (100, 100, 64, 64),
]


@pytest.mark.parametrize("tq,tk,bq,bk", SHAPES)
@pytest.mark.parametrize("is_causal", [False, True])
def test_matches_the_explicit_version_values_and_gradients(device, tq, tk, bq, bk, is_causal):
    if is_causal and tk < tq:
        pytest.skip("an end-aligned causal mask needs Tk >= Tq (tested with the errors)")
    q, k, v = rand_qkv(tq=tq, tk=tk, device=device)
    ours = grads(lambda q, k, v: tiled_attention(q, k, v, is_causal=is_causal, block_q=bq, block_k=bk), q, k, v)
    ref = grads(lambda q, k, v: scaled_dot_product_attention(q, k, v, is_causal=is_causal), q, k, v)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("tq,tk,bq,bk", SHAPES)
def test_matches_torch_sdpa(device, tq, tk, bq, bk):
    q, k, v = rand_qkv(tq=tq, tk=tk, device=device)
    ours = grads(lambda q, k, v: tiled_attention(q, k, v, block_q=bq, block_k=bk, scale=0.3), q, k, v)
    ref = grads(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.3), q, k, v)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b)
    if tk >= tq:  # F.sdpa's is_causal is start-aligned: hand it the end-aligned mask
        allowed = causal_mask(tq, tk, device=device)
        torch.testing.assert_close(
            tiled_attention(q, k, v, is_causal=True, block_q=bq, block_k=bk), F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        )


def test_causal_is_end_aligned_and_leaks_no_future(device):
    q, k, v = rand_qkv(tq=10, tk=30, device=device)
    out = tiled_attention(q, k, v, is_causal=True, block_q=4, block_k=8)
    k2, v2 = k.clone(), v.clone()
    k2[..., 25:, :] += 10  # keys 25.. are the future of queries 0..4 (absolute positions 20..24)
    v2[..., 25:, :] += 10
    out2 = tiled_attention(q, k2, v2, is_causal=True, block_q=4, block_k=8)
    torch.testing.assert_close(out[..., :5, :], out2[..., :5, :])
    assert not torch.allclose(out[..., 5:, :], out2[..., 5:, :])


MASKS = {
    "padding [B,1,1,T]": lambda b, tq, tk, dev: padding_mask([tk, 9][:b], tk, device=dev),
    "left padding [B,1,1,T]": lambda b, tq, tk, dev: padding_mask([tk, 5][:b], tk, side="left", device=dev),
    "square [T,T]": lambda b, tq, tk, dev: torch.rand(tq, tk, generator=torch.Generator().manual_seed(1)).to(dev) > 0.4,
    "per head [B,H,T,T]": lambda b, tq, tk, dev: torch.rand(b, 3, tq, tk, generator=torch.Generator().manual_seed(2)).to(dev) > 0.6,
    "per query [B,1,T,1]": lambda b, tq, tk, dev: torch.arange(tq, device=dev)[None, None, :, None].expand(b, 1, tq, 1) % 3 != 0,
}


@pytest.mark.parametrize("name", MASKS)
@pytest.mark.parametrize("is_causal", [False, True])
def test_broadcasting_masks_match_explicit(device, name, is_causal):
    q, k, v = rand_qkv(tq=21, tk=21, device=device)
    mask = MASKS[name](2, 21, 21, device)
    ours = grads(lambda q, k, v: tiled_attention(q, k, v, mask, is_causal=is_causal, block_q=8, block_k=5), q, k, v)
    ref = grads(lambda q, k, v: scaled_dot_product_attention(q, k, v, mask, is_causal=is_causal), q, k, v)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b)


def test_fully_masked_rows_give_zeros_and_zero_gradients_not_nan(device):
    """Left padding under a causal mask: pad queries see nothing; so does a query whose mask row is all False."""
    q, k, v = rand_qkv(b=2, h=2, tq=12, tk=12, device=device)
    mask = padding_mask([12, 7], 12, side="left", device=device) & torch.ones(12, 12, dtype=torch.bool, device=device)
    mask = mask.expand(2, 2, 12, 12).clone()
    mask[0, 1, 3] = False  # one more empty row, in the first sequence, second head
    out, dq, dk, dv = grads(lambda q, k, v: tiled_attention(q, k, v, mask, is_causal=True, block_q=4, block_k=4), q, k, v)
    empty = ~(mask & causal_mask(12, device=device)).any(-1)  # [B, H, Tq]
    assert empty.sum() == 2 * 5 + 1
    for t in (out, dq, dk, dv):
        assert torch.isfinite(t).all()
    assert (out[empty] == 0).all() and (dq[empty] == 0).all()
    ref = grads(lambda q, k, v: scaled_dot_product_attention(q, k, v, mask, is_causal=True), q, k, v)
    for a, b in zip((out, dq, dk, dv), ref):
        torch.testing.assert_close(a, b)
    _, lse = tiled_attention(q, k, v, mask, is_causal=True, block_q=4, block_k=4, return_lse=True)
    assert (lse[empty] == float("-inf")).all() and torch.isfinite(lse[~empty]).all()


def test_lse_is_the_log_sum_exp_of_the_scores_and_differentiable(device):
    q, k, v = rand_qkv(tq=19, tk=26, device=device)
    _, lse = tiled_attention(q, k, v, is_causal=True, block_q=5, block_k=6, return_lse=True)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    expected = scores.masked_fill(~causal_mask(19, 26, device=device), float("-inf")).logsumexp(-1)
    torch.testing.assert_close(lse, expected)
    ours = grads(lambda q, k, v: tiled_attention(q, k, v, is_causal=True, block_q=5, block_k=6, return_lse=True)[1], q, k, v)
    ref = grads(lambda q, k, v: ((q @ k.transpose(-2, -1)) / math.sqrt(8)).masked_fill(~causal_mask(19, 26, device=device),
                                                                                    float("-inf")).logsumexp(-1), q, k, v)
    for a, b in zip(ours[:3], ref[:3]):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("case", ["plain", "causal Tk>Tq", "padding + causal, empty rows", "[T,T] mask + lse"])
def test_gradcheck_float64(case):
    q, k, v = rand_qkv(b=1, h=2, tq=7, tk=7 if case != "causal Tk>Tq" else 11, d=4, dv=3, dtype=torch.float64, grad=True)
    opts = {"block_q": 3, "block_k": 4}
    if case == "plain":
        fn = lambda q, k, v: tiled_attention(q, k, v, **opts)
    elif case == "causal Tk>Tq":
        fn = lambda q, k, v: tiled_attention(q, k, v, is_causal=True, **opts)
    elif case == "padding + causal, empty rows":
        mask = padding_mask([5], 7, side="left")  # queries 0 and 1 see nothing under the causal mask
        fn = lambda q, k, v: tiled_attention(q, k, v, mask, is_causal=True, **opts)
    else:
        mask = torch.rand(7, 7, generator=torch.Generator().manual_seed(3)) > 0.5
        mask[:, 0] = True  # every row sees a key, so lse is finite everywhere

        def fn(q, k, v):
            out, lse = tiled_attention(q, k, v, mask, return_lse=True, **opts)
            return out, lse
    assert torch.autograd.gradcheck(fn, (q, k, v))


# -- the tile grid --------------------------------------------------------------------------------

def future_tiles(tq, tk, bq, bk):
    """Tiles of the end-aligned causal mask with no allowed entry, counted on the full mask."""
    allowed = causal_mask(tq, tk)
    return sum(not allowed[i : i + bq, j : j + bk].any() for i in range(0, tq, bq) for j in range(0, tk, bk))


@pytest.mark.parametrize("tq,tk,bq,bk", [(64, 64, 16, 16), (37, 37, 8, 16), (13, 50, 4, 7), (100, 100, 64, 64), (33, 33, 5, 3)])
def test_causal_skips_exactly_the_tiles_wholly_in_the_future(tq, tk, bq, bk):
    q, k, v = rand_qkv(b=1, h=1, tq=tq, tk=tk)
    _, stats = tiled_attention(q, k, v, is_causal=True, block_q=bq, block_k=bk, return_stats=True)
    assert isinstance(stats, TileStats)
    assert (stats.q_blocks, stats.k_blocks) == (math.ceil(tq / bq), math.ceil(tk / bk))
    assert stats.skipped == future_tiles(tq, tk, bq, bk)
    assert stats.computed + stats.skipped == stats.total
    _, full = tiled_attention(q, k, v, block_q=bq, block_k=bk, return_stats=True)
    assert full.skipped == 0 and full.computed == full.total


@pytest.mark.parametrize("n", [1, 4, 16, 64])
def test_square_causal_computes_n_n_plus_1_over_2_tiles_about_half(n):
    b = 2
    q, k, v = rand_qkv(b=1, h=1, tq=n * b, tk=n * b, d=2, dv=2)
    _, stats = tiled_attention(q, k, v, is_causal=True, block_q=b, block_k=b, return_stats=True)
    assert stats.computed == n * (n + 1) // 2 and stats.skipped == n * (n - 1) // 2
    if n >= 16:
        assert 0.45 <= stats.skipped / stats.total <= 0.5


# -- the online softmax step by step ---------------------------------------------------------------

def test_online_softmax_update_is_exact_after_every_tile():
    """One query row, keys in tiles of 3; the maximum grows in the third tile, so rescaling matters."""
    scores = torch.tensor([[0.5, -1.0, 0.0, 2.0, 1.0, -3.0, 9.0, 0.1]])  # [1, 8]
    v = torch.arange(16.0).reshape(8, 2)
    m, l, acc = torch.full((1, 1), float("-inf")), torch.zeros(1, 1), torch.zeros(1, 2)
    for k0 in range(0, 8, 3):
        m, l, acc = online_softmax_update(m, l, acc, scores[:, k0 : k0 + 3], v[k0 : k0 + 3])
        seen = scores[:, : k0 + 3]
        out, lse = online_softmax_finish(m, l, acc)
        torch.testing.assert_close(out, seen.softmax(-1) @ v[: k0 + 3])
        torch.testing.assert_close(lse, seen.logsumexp(-1))
        assert m.item() == seen.max().item()


def test_online_softmax_update_of_a_fully_masked_tile_changes_nothing_and_makes_no_nan():
    m, l, acc = torch.full((2, 1), float("-inf")), torch.zeros(2, 1), torch.zeros(2, 3)
    blocked = torch.full((2, 4), float("-inf"))
    m, l, acc = online_softmax_update(m, l, acc, blocked, torch.randn(4, 3))  # -inf - -inf must not appear
    assert torch.isfinite(l).all() and torch.isfinite(acc).all() and (l == 0).all()
    s = torch.randn(2, 4)
    m2, l2, acc2 = online_softmax_update(m, l, acc, s, v := torch.randn(4, 3))
    m3, l3, acc3 = online_softmax_update(m2, l2, acc2, blocked, torch.randn(4, 3))
    assert torch.equal(m3, m2) and torch.equal(l3, l2) and torch.equal(acc3, acc2)
    out, _ = online_softmax_finish(m3, l3, acc3)
    torch.testing.assert_close(out, s.softmax(-1) @ v)
    out0, lse0 = online_softmax_finish(*online_softmax_update(m, l, acc, blocked, torch.randn(4, 3)))
    assert (out0 == 0).all() and (lse0 == float("-inf")).all()


# -- errors: the same as the explicit version -----------------------------------------------------

BAD_CALLS = {
    "d mismatch": lambda: (torch.randn(2, 5, 8), torch.randn(2, 7, 4), torch.randn(2, 7, 6), {}),
    "Tk mismatch": lambda: (torch.randn(2, 5, 8), torch.randn(2, 7, 8), torch.randn(2, 6, 6), {}),
    "leading dims": lambda: (torch.randn(2, 5, 8), torch.randn(3, 7, 8), torch.randn(3, 7, 6), {}),
    "1-D q": lambda: (torch.randn(8), torch.randn(7, 8), torch.randn(7, 6), {}),
    "int q": lambda: (torch.ones(5, 8, dtype=torch.long), torch.randn(7, 8), torch.randn(7, 6), {}),
    "float mask": lambda: (*rand_qkv(tq=4, tk=4), {"mask": torch.ones(4, 4)}),
    "mask rank": lambda: (*rand_qkv(tq=4, tk=4), {"mask": torch.ones(1, 1, 1, 4, 4, dtype=torch.bool)}),
    "[B, T] mask": lambda: (*rand_qkv(b=2, h=2, tq=4, tk=4), {"mask": torch.ones(2, 4, dtype=torch.bool)}),
    "causal Tk < Tq": lambda: (*rand_qkv(tq=6, tk=4), {"is_causal": True}),
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_errors_are_the_explicit_versions_errors(name):
    q, k, v, kwargs = BAD_CALLS[name]()
    with pytest.raises(ValueError) as explicit:
        scaled_dot_product_attention(q, k, v, **kwargs)
    with pytest.raises(ValueError) as tiled:
        tiled_attention(q, k, v, **kwargs)
    assert str(tiled.value) == str(explicit.value)


@pytest.mark.parametrize("blocks", [{"block_q": 0}, {"block_k": -4}, {"block_q": 2.5}, {"block_k": True}])
def test_block_sizes_must_be_positive_integers(blocks):
    q, k, v = rand_qkv(tq=4, tk=4)
    with pytest.raises(ValueError, match=r"must be a positive integer .*block_q × block_k.*block_q=64") as err:
        tiled_attention(q, k, v, **blocks)
    assert f"{next(iter(blocks))}={next(iter(blocks.values()))!r}" in str(err.value)


# -- memory: never a [Tq, Tk] tensor, O(T) saved for backward ----------------------------------------

class LargestTensor(TorchDispatchMode):
    """Records the shape of the largest tensor any op creates inside the ``with`` block."""

    def __init__(self) -> None:
        super().__init__()
        self.numel, self.shape = 0, ()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.numel() > self.numel:
                self.numel, self.shape = t.numel(), tuple(t.shape)
        return out


def largest_tensor(fn, q, k, v) -> LargestTensor:
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    with LargestTensor() as rec:
        fn(q, k, v).sum().backward()
    return rec


@pytest.mark.parametrize("mask_kind", [None, "padding"])
def test_forward_and_backward_never_create_a_score_matrix(mask_kind):
    b, h, t, d, bq, bk = 1, 2, 256, 8, 32, 16
    q, k, v = rand_qkv(b=b, h=h, tq=t, tk=t, d=d, dv=d)
    mask = padding_mask([200], t) if mask_kind else None
    rec = largest_tensor(lambda q, k, v: tiled_attention(q, k, v, mask, is_causal=True, block_q=bq, block_k=bk), q, k, v)
    assert rec.numel <= b * h * max(t * d, bq * bk), rec.shape  # inputs-sized tensors and tiles, nothing T×T
    # the same probe sees the explicit version's [B, H, T, T] scores, so the bound above can fail
    explicit = largest_tensor(lambda q, k, v: scaled_dot_product_attention(q, k, v, mask, is_causal=True), q, k, v)
    assert explicit.numel == b * h * t * t, explicit.shape


def test_saved_for_backward_is_q_k_v_out_and_lse_only():
    q, k, v = rand_qkv(b=2, h=2, tq=128, tk=128, d=8, dv=8, grad=True)
    with SavedTensorMeter(exclude=(q, k, v)) as saved:
        out = tiled_attention(q, k, v, is_causal=True, block_q=16, block_k=16)
    assert saved.nbytes == out.numel() * 4 + 2 * 2 * 128 * 4  # out [B, H, T, d] + lse [B, H, T], fp32
    with SavedTensorMeter(exclude=(q, k, v)) as explicit:
        scaled_dot_product_attention(q, k, v, is_causal=True)
    assert explicit.nbytes > 2 * 2 * 2 * 128 * 128 * 4  # at least two [B, H, T, T] tensors


def measured_peak(fn, t, backward):
    q, k, v = rand_qkv(b=1, h=2, tq=t, tk=t, d=16, dv=16, grad=backward)
    with torch.set_grad_enabled(backward), PeakMemoryMeter("cpu") as meter:
        out = fn(q, k, v)
        if backward:
            out.sum().backward()
    return meter.peak


@pytest.mark.parametrize("backward", [False, True])
def test_measured_peak_grows_linearly_in_t_for_tiled_quadratically_for_explicit(backward):
    """Peak bytes of live tensors (a dispatch-mode tracker, not a clock) as T doubles."""
    tiled = lambda q, k, v: tiled_attention(q, k, v, is_causal=True, block_q=32, block_k=32)
    explicit = lambda q, k, v: scaled_dot_product_attention(q, k, v, is_causal=True)
    p_tiled = [measured_peak(tiled, t, backward) for t in (256, 512, 1024)]
    p_explicit = [measured_peak(explicit, t, backward) for t in (256, 512)]
    assert p_tiled[2] / p_tiled[1] <= 2.2 and p_tiled[1] / p_tiled[0] <= 2.2
    assert p_explicit[1] / p_explicit[0] >= 3.5
    assert p_tiled[1] * 8 < p_explicit[1]
