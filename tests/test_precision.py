"""tinytf.precision: the formats are torch's, the thresholds found by a sweep equal the formulas that
predict them (and the computation really is finite just below and not at them), and the low-precision
accumulators lose what a float64 sum keeps."""

from __future__ import annotations

import math

import pytest
import torch

import tinytf
from tinytf import precision as P


def test_formats_are_torchs_and_add_up():
    rows = {f.name: f for f in P.formats()}
    assert list(rows) == ["fp32", "bf16", "fp16"]
    fp16, bf16, fp32 = rows["fp16"], rows["bf16"], rows["fp32"]
    assert (fp16.max, fp16.eps, fp16.smallest_normal, fp16.smallest_subnormal) == (65504.0, 2.0**-10, 2.0**-14, 2.0**-24)
    assert (bf16.eps, bf16.smallest_subnormal, bf16.exponent_bits, bf16.mantissa_bits) == (2.0**-7, 2.0**-133, 8, 7)
    assert (fp32.exponent_bits, fp32.mantissa_bits) == (8, 23)
    for f in rows.values():
        assert 1 + f.exponent_bits + f.mantissa_bits == f.bits
        assert torch.isfinite(torch.tensor(f.max_exp_argument - 1e-3, dtype=torch.float64).exp().to(f.dtype))
    assert math.isclose(fp16.max_exp_argument, math.log(65504))


def test_overflow_limit_is_where_rounding_reaches_inf():
    limit = P.overflow_limit(torch.float16)
    assert limit == 65520.0
    assert torch.isfinite(torch.tensor(limit - 0.01).half()) and torch.isinf(torch.tensor(limit).half())
    big = P.overflow_limit("bf16")
    assert torch.isfinite(torch.tensor(big * (1 - 1e-6)).bfloat16()) and torch.isinf(torch.tensor(big * (1 + 1e-6)).bfloat16())


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_round_trip_error_is_at_most_half_an_epsilon(name):
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    median, worst = P.round_trip_error(x, name)
    eps = torch.finfo(tinytf.memory.as_dtype(name)).eps
    assert 0 < median < worst <= eps / 2


def test_first_failure_finds_the_boundary_and_refuses_a_range_without_one():
    assert 3.0 <= P.first_failure(lambda x: x >= 3.0, 0.1, 100.0, rel=1e-6) <= 3.0 * (1 + 1e-6)
    with pytest.raises(ValueError, match="no failure boundary"):
        P.first_failure(lambda x: False, 1.0, 2.0)
    with pytest.raises(ValueError, match="0 < lo < hi"):
        P.first_failure(lambda x: True, 2.0, 1.0)


def test_the_three_scalings_are_the_same_numbers_in_float64():
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 5, 16, generator=g, dtype=torch.float64), torch.randn(2, 7, 16, generator=g, dtype=torch.float64)
    none, after, before = (P.attention_scores(q, k, s) for s in P.SCALINGS)
    torch.testing.assert_close(after, none / 4)
    torch.testing.assert_close(before, after)
    with pytest.raises(ValueError, match="scaling must be one of"):
        P.attention_scores(q, k, "later")


@pytest.mark.parametrize("scaling", P.SCALINGS)
def test_score_overflow_found_by_the_sweep_is_the_predicted_one(scaling):
    th = P.score_overflow(64, scaling=scaling)
    assert abs(th.agreement) < 2e-3, th
    g = torch.Generator().manual_seed(0)  # score_overflow's own inputs: seed 0, [1, 2, 128, 64]
    q0, k0 = torch.randn(1, 2, 128, 64, generator=g), torch.randn(1, 2, 128, 64, generator=g)
    below, at = th.found / (1 + 2e-3), th.found
    assert torch.isfinite(P.attention_scores((below * q0).half(), (below * k0).half(), scaling)).all()
    assert torch.isinf(P.attention_scores((at * q0).half(), (at * k0).half(), scaling)).any()


def test_scaling_after_the_product_does_not_help_and_scaling_q_first_buys_a_fourth_root_of_d():
    for d in (32, 128):
        none, after, before = (P.score_overflow(d, scaling=s) for s in P.SCALINGS)
        assert none.found == after.found  # the product overflowed before the scale was applied
        assert math.isclose(before.predicted / after.predicted, d ** 0.25)


def test_a_softmax_without_the_max_breaks_where_exp_overflows():
    fp16 = P.softmax_overflow(torch.float16)
    assert math.isclose(fp16.predicted, math.log(65520)) and abs(fp16.agreement) < 1e-3
    for name in ("bf16", "fp32"):
        th = P.softmax_overflow(name)
        assert 88.5 < th.found < 89 and abs(th.agreement) < 1e-3
    with pytest.raises(ValueError, match="no failure boundary"):
        P.softmax_overflow(torch.float16, safe=True)  # torch.softmax subtracts the max: it never breaks
    s = torch.randn(3, 9, dtype=torch.float64)
    torch.testing.assert_close(P.naive_softmax(s), s.softmax(-1))


def test_additive_masks_and_the_fully_masked_row():
    allowed = torch.ones(4, 4, dtype=torch.bool).tril()
    allowed[2] = False  # a query that may see nothing
    scores = torch.randn(4, 4, generator=torch.Generator().manual_seed(0)).half()
    inf_mask, min_mask = P.additive_mask(allowed, "fp16"), P.additive_mask(allowed, "fp16", fill="min")
    assert (inf_mask[allowed] == 0).all() and torch.isneginf(inf_mask[~allowed]).all() and (min_mask[~allowed] == -65504).all()
    w_inf, w_min = (scores + inf_mask).softmax(-1), (scores + min_mask).softmax(-1)
    assert torch.isnan(w_inf[2]).all() and not torch.isnan(w_inf[[0, 1, 3]]).any()
    torch.testing.assert_close(w_min[2].float(), torch.full((4,), 0.25))  # uniform over keys it may not see
    assert torch.isneginf(min_mask + min_mask).any()  # two finfo.min masks added overflow to -inf in fp16
    with pytest.raises(ValueError, match="fill must be"):
        P.additive_mask(allowed, "fp16", fill="zero")


def test_a_low_precision_accumulator_stagnates():
    ones = torch.ones(1, 5000)
    assert P.accumulate(ones, torch.bfloat16).item() == 256  # 256 + 1 rounds back to 256 in bf16
    assert P.accumulate(ones, torch.float16).item() == 2048
    assert P.accumulate(ones, torch.float32).item() == 5000
    x = torch.randn(3, 4, 10, dtype=torch.float64)
    torch.testing.assert_close(P.accumulate(x, torch.float64, dim=1), x.sum(1))
    w, v = torch.rand(2, 3, 6, dtype=torch.float64), torch.randn(2, 6, 5, dtype=torch.float64)
    torch.testing.assert_close(P.accumulated_matmul(w, v, torch.float64), w @ v)


def test_accumulation_errors_grow_with_t_only_in_the_low_precision_accumulator():
    rows = P.accumulation_errors([64, 1024])
    assert [r.tokens for r in rows] == [64, 1024]
    short, long = rows
    assert long.normaliser_low > 5 * short.normaliser_low and long.normaliser_low > 0.1
    assert long.normaliser_fp32 <= short.normaliser_fp32 < 1e-3
    assert long.output_low > long.output_fp32 and long.output_fp32 < 2 ** -8  # one bf16 rounding of the result
    for r in rows:
        assert max(r.sdpa, r.explicit) < 0.02 and r.tiled < 0.05


def test_finite_map_states_only_get_worse_with_the_scale():
    widths, scales = [16, 64, 256], [2.0 ** (i / 2) for i in range(0, 18)]
    maps = {(dtype, safe): P.finite_map(dtype, widths, scales, safe_softmax=safe, tokens=32)
            for dtype, safe in (("fp16", True), ("fp16", False), ("bf16", False), ("fp32", True))}
    for m in maps.values():
        assert m.shape == (3, 18) and set(m.unique().tolist()) <= {0, 1, 2}
        assert (m[:, 1:] >= m[:, :-1]).all(), m  # once not finite, never finite again at a larger scale
    assert maps["fp32", True].eq(0).all() and maps["bf16", False].ne(2).all()  # bf16 has fp32's range
    assert (maps["fp16", False] == 1).any() and (maps["fp16", True] == 1).sum() == 0  # only the naive softmax breaks alone
    assert (maps["fp16", True] == 2).any()
