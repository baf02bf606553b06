"""tinytf.checks: every detector names the deliberate bug it claims, and stays quiet on correct code."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tinytf
from tinytf.checks import (
    CATALOG,
    PITFALLS,
    Finding,
    Pitfall,
    diagnose_attention,
    diagnose_block,
    diagnose_causal_mask,
    diagnose_lm_loss,
    report,
)


def pitfalls(findings: list[Finding]) -> set[int]:
    return {f.pitfall for f in findings}


def titles(findings: list[Finding]) -> str:
    return " | ".join(f.title for f in findings)


# ---------------------------------------------------------------------------------------------------
# Finding and report
# ---------------------------------------------------------------------------------------------------
def test_finding_is_frozen_and_report_lists_every_finding():
    f = Finding(3, "mask ignored", "apply it")
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.pitfall = 4  # type: ignore[misc]
    text = report([f, Finding(1, "missing scaling", "divide by sqrt(d)")])
    assert "2 problems" in text and "mask ignored" in text and "missing scaling" in text and "pitfall 3" in text
    assert "no problems" in report([])
    assert set(range(1, 15)) <= set(PITFALLS)


# ---------------------------------------------------------------------------------------------------
# diagnose_attention
# ---------------------------------------------------------------------------------------------------
def make_attention(*, scale=None, orient="qk", axis=-1, mask_mode="before", invert=False):
    """A hand-written attention with exactly one configurable mistake (defaults are correct)."""

    def attention(q, k, v, mask=None):
        s = q @ k.transpose(-2, -1) if orient == "qk" else k @ q.transpose(-2, -1)
        s = s * (1 / math.sqrt(q.size(-1)) if scale is None else scale(q))
        m = None if mask is None else (~mask if invert else mask)
        if m is not None and mask_mode == "before":
            s = s.masked_fill(~m, float("-inf"))
        w = s.softmax(dim=axis)
        if m is not None and mask_mode == "after":
            w = w.masked_fill(~m, 0.0)
        return w @ v

    return attention


def _raises(q, k, v, mask=None):
    raise NotImplementedError("TODO: your attention here")


CORRECT_ATTENTION = {
    "tinytf": tinytf.scaled_dot_product_attention,
    "torch_sdpa": F.scaled_dot_product_attention,
    "handwritten": make_attention(),
    "returns_out_and_weights": lambda q, k, v, mask=None: tinytf.scaled_dot_product_attention(q, k, v, mask, return_weights=True),
}


@pytest.mark.parametrize("name", list(CORRECT_ATTENTION))
def test_attention_no_false_alarms(name):
    assert diagnose_attention(CORRECT_ATTENTION[name]) == []


BUGGY_ATTENTION = {
    # name: (fn, pitfall, words expected in a title)
    "missing_scale": (make_attention(scale=lambda q: 1.0), 1, "missing scaling"),
    "scale_by_total_dim": (make_attention(scale=lambda q: 1 / math.sqrt(q.size(1) * q.size(-1))), 1, "total dim"),
    "hardcoded_scale": (make_attention(scale=lambda q: 0.25), 1, "wrong scaling"),
    "transposed_scores": (make_attention(orient="kq"), 2, "transposed"),
    "q_times_k_untransposed": (lambda q, k, v, mask=None: (q @ k).softmax(-1) @ v, 2, "raised"),
    "mask_after_softmax": (make_attention(mask_mode="after"), 3, "after the softmax"),
    "mask_ignored": (make_attention(mask_mode="ignored"), 3, "mask ignored"),
    "inverted_mask": (make_attention(invert=True), 3, "inverted"),
    "rows_not_summing_to_one_axis": (make_attention(axis=-2), 2, "sum to one"),
    "rows_not_summing_to_one_exp": (lambda q, k, v, mask=None: (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).exp() @ v, 2,
                                    "sum to one"),
    "returns_weights": (lambda q, k, v, mask=None: tinytf.scaled_dot_product_attention(q, k, v, mask, return_weights=True)[1], 2,
                        "wrong output shape"),
    "merges_heads": (lambda q, k, v, mask=None: tinytf.scaled_dot_product_attention(q, k, v, mask).transpose(1, 2).flatten(2), 2,
                     "wrong output shape"),
    "not_implemented": (_raises, 0, "not implemented"),
    "no_mask_argument": (lambda q, k, v: tinytf.scaled_dot_product_attention(q, k, v), 3, "raised"),
}


@pytest.mark.parametrize("name", list(BUGGY_ATTENTION))
def test_attention_names_the_bug(name):
    fn, pitfall, words = BUGGY_ATTENTION[name]
    findings = diagnose_attention(fn)
    assert pitfall in pitfalls(findings), report(findings)
    assert words in titles(findings), report(findings)
    assert isinstance(report(findings), str)


def test_attention_mask_after_softmax_is_not_called_a_scaling_bug():
    findings = diagnose_attention(make_attention(mask_mode="after"))
    assert pitfalls(findings) == {3}, report(findings)


@pytest.mark.parametrize(
    ("scale", "words"),
    [(lambda q: 1 / 8, "hard-coded"), (lambda q: 0.5 / math.sqrt(q.size(-1)), "constant factor")],
    ids=["typed_in_sqrt64", "extra_factor"],
)
def test_attention_fitted_scale_explains_itself(scale, words):
    findings = diagnose_attention(make_attention(scale=scale))
    assert pitfalls(findings) == {1} and words in findings[0].message, report(findings)


def test_attention_with_two_bugs_reports_both():
    findings = diagnose_attention(make_attention(scale=lambda q: 1.0, invert=True))
    assert {1, 3} <= pitfalls(findings), report(findings)


def test_attention_in_place_edit_of_inputs_is_reported():
    def in_place(q, k, v, mask=None):
        q.mul_(1.0 / math.sqrt(q.size(-1)))
        return make_attention(scale=lambda q: 1.0)(q, k, v, mask)

    findings = diagnose_attention(in_place)
    assert "in place" in titles(findings) and 1 not in pitfalls(findings), report(findings)


def _scaled_for_the_first_batch_element_only(q, k, v, mask=None):
    """Attention that forgets 1/sqrt(d) for every batch element but the first."""
    s = q @ k.transpose(-2, -1)  # [B, H, Tq, Tk]
    s = torch.cat([s[:1] / math.sqrt(q.size(-1)), s[1:]])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return s.softmax(-1) @ v


def test_attention_wrong_scale_on_part_of_the_batch_is_pitfall_1_on_those_elements():
    findings = diagnose_attention(_scaled_for_the_first_batch_element_only)
    assert [int(f.pitfall) for f in findings] == [1], report(findings)
    f = findings[0]
    assert "part of the batch" in f.title and "missing scaling" in f.title, report(findings)
    assert "batch element 0 is right" in f.message and "batch elements 1, 2 only" in f.message, report(findings)
    assert "none of the known mistakes" not in report(findings)
    assert "whole batch" in f.fix and "sqrt(q.size(-1))" in f.fix
    assert diagnose_attention(make_attention(scale=lambda q: 1.0))[0].title == "missing scaling"  # the whole batch: as before


def test_attention_wrong_scale_on_part_of_the_batch_in_chinese(monkeypatch):
    """Under TINYTF_LANG=zh the same finding is said in Chinese: title, evidence and its own fix, shapes kept."""
    monkeypatch.setenv("TINYTF_LANG", "zh")
    findings = diagnose_attention(_scaled_for_the_first_batch_element_only)
    assert [int(f.pitfall) for f in findings] == [1], report(findings)
    f = findings[0]
    assert "batch 的一部分" in f.title and "缺少缩放" in f.title, report(findings)
    assert "第 0 个元素是对的" in f.message and "[B, H, T, d]" in f.message, report(findings)
    assert "整个 batch" in f.fix and "sqrt(q.size(-1))" in f.fix and "whole" not in report(findings)


# ---------------------------------------------------------------------------------------------------
# diagnose_causal_mask
# ---------------------------------------------------------------------------------------------------
def ones(t: int) -> torch.Tensor:
    return torch.ones(t, t, dtype=torch.bool)


@pytest.mark.parametrize(
    "fn",
    [lambda t: tinytf.causal_mask(t), lambda t: ones(t).tril(), lambda t: ~ones(t).triu(1),
     lambda t: torch.arange(t)[:, None] >= torch.arange(t)],
    ids=["tinytf", "tril", "not_triu1", "arange"],
)
def test_causal_mask_no_false_alarms(fn):
    assert diagnose_causal_mask(fn) == []


BUGGY_MASKS = {
    "diagonal_blocked": (lambda t: ones(t).tril(-1), "diagonal is blocked"),
    "one_future_token": (lambda t: ones(t).tril(1), "future leaks"),
    "inverted_convention": (lambda t: ones(t).triu(1), "inverted"),
    "transposed": (lambda t: ones(t).triu(), "transposed"),
    "no_mask_at_all": (lambda t: ones(t), "not a causal mask"),
    "fixed_size": (lambda t: ones(4).tril(), "wrong mask shape"),
    "additive_float": (lambda t: torch.full((t, t), float("-inf")).triu(1), "not boolean"),
}


@pytest.mark.parametrize("name", list(BUGGY_MASKS))
def test_causal_mask_names_the_bug(name):
    fn, words = BUGGY_MASKS[name]
    findings = diagnose_causal_mask(fn)
    assert pitfalls(findings) == {4}, report(findings)
    assert words in titles(findings), report(findings)


def test_causal_mask_that_raises_is_diagnosed_not_crashed():
    def todo(t):
        raise NotImplementedError

    findings = diagnose_causal_mask(todo)
    assert len(findings) == 1 and "not implemented" in findings[0].title


# ---------------------------------------------------------------------------------------------------
# diagnose_block
# ---------------------------------------------------------------------------------------------------
class HandBlock(nn.Module):
    """A correct pre-norm causal block (hand-written) whose methods the buggy variants override."""

    def __init__(self, width: int = 16, heads: int = 4, dropout: float = 0.1) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        self.drop = nn.Dropout(dropout)

    def allowed(self, t: int) -> torch.Tensor:
        return torch.ones(t, t, dtype=torch.bool).tril()

    def norm1(self, x):
        return self.ln1(x)

    def dropout(self, x):
        return self.drop(x)

    def attention(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(x).chunk(3, dim=-1))
        out = tinytf.scaled_dot_product_attention(q, k, v, self.allowed(t))
        return self.proj(out.transpose(1, 2).reshape(b, t, d))

    def ffn(self, x):
        return self.down(F.gelu(self.up(x)))

    def forward(self, x):
        x = x + self.dropout(self.attention(self.norm1(x)))
        return x + self.dropout(self.ffn(self.ln2(x)))


class FutureLeak(HandBlock):
    def allowed(self, t):
        return torch.ones(t, t, dtype=torch.bool)


class OneAhead(HandBlock):
    def allowed(self, t):
        return torch.ones(t, t, dtype=torch.bool).tril(1)


class BatchNormBlock(HandBlock):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(16)

    def norm1(self, x):
        return self.bn(x.transpose(1, 2)).transpose(1, 2)  # statistics over batch and time


class ManualBatchNorm(HandBlock):
    def norm1(self, x):
        return (x - x.mean(dim=0)) / (x.std(dim=0) + 1e-5)  # statistics over the batch, in eval too


class LayerNormOverTime(HandBlock):
    def __init__(self):
        super().__init__()
        self.ln_time = nn.LayerNorm([6, 16])

    def norm1(self, x):
        return self.ln_time(x)


class WideResidual(HandBlock):
    def forward(self, x):
        return x.repeat(1, 1, 4) + self.up(x)  # [B, T, 4D]: the FFN never projects back


class MismatchedResidual(HandBlock):
    def forward(self, x):
        return x + F.gelu(self.up(x))  # [B, T, D] + [B, T, 4D] raises


class DropoutInEval(HandBlock):
    def dropout(self, x):
        return F.dropout(x, 0.1)  # training=True by default


class DropoutTiedToGrad(HandBlock):
    def dropout(self, x):
        return F.dropout(x, 0.1) if torch.is_grad_enabled() else x


class ReturnsTuple(HandBlock):
    def forward(self, x):
        return super().forward(x), None  # (out, extras) is accepted


class OnlyX(nn.Module):
    """A wrapper whose forward takes x only (no mask argument); D is found inside it."""

    def __init__(self):
        super().__init__()
        self.inner = tinytf.TransformerBlock(dim=24, heads=3, max_tokens=5, dropout=0.1)

    def forward(self, x):
        return self.inner(x)


CORRECT_BLOCKS = {
    "tinytf": lambda: tinytf.TransformerBlock(dim=16, heads=4, max_tokens=16),
    "tinytf_dropout": lambda: tinytf.TransformerBlock(dim=16, heads=4, max_tokens=16, dropout=0.2),
    "tinytf_post_norm_sdpa_dropout": lambda: tinytf.TransformerBlock(dim=16, heads=2, max_tokens=16, norm="post", backend="sdpa",
                                                                     dropout=0.2),
    "handwritten": HandBlock,
    "only_x_wrapper": OnlyX,
    "returns_tuple": ReturnsTuple,
}


@pytest.mark.parametrize("name", list(CORRECT_BLOCKS))
def test_block_no_false_alarms(name):
    assert diagnose_block(CORRECT_BLOCKS[name]) == []


BUGGY_BLOCKS = {
    "future_leak": (FutureLeak, 4, "future tokens leak"),
    "off_by_one_ahead": (OneAhead, 4, "future tokens leak"),
    "batchnorm_over_batch": (BatchNormBlock, 7, "across the batch"),
    "manual_batch_statistics": (ManualBatchNorm, 7, "across the batch"),
    "layernorm_over_time": (LayerNormOverTime, 7, "time axis"),
    "residual_changes_shape": (WideResidual, 8, "shape"),
    "residual_shape_mismatch_raises": (MismatchedResidual, 8, "raised"),
    "dropout_on_in_eval": (DropoutInEval, 9, "stays on in eval"),
    "dropout_tied_to_no_grad": (DropoutTiedToGrad, 9, "autograd"),
}


@pytest.mark.parametrize("name", list(BUGGY_BLOCKS))
def test_block_names_the_bug(name):
    factory, pitfall, words = BUGGY_BLOCKS[name]
    findings = diagnose_block(factory)
    assert pitfall in pitfalls(findings), report(findings)
    assert words in titles(findings), report(findings)


def test_block_off_by_one_is_called_one_ahead():
    findings = diagnose_block(OneAhead)
    assert "exactly one token ahead" in findings[0].message, report(findings)


def test_block_dim_keyword_and_uninferable_width():
    class Opaque(nn.Module):
        def forward(self, x):
            return x * 1.0

    assert diagnose_block(Opaque, dim=8) == []
    findings = diagnose_block(Opaque)
    assert len(findings) == 1 and "infer" in findings[0].title


def test_block_factory_that_raises_is_diagnosed():
    def todo():
        raise NotImplementedError

    findings = diagnose_block(todo)
    assert len(findings) == 1 and "not implemented" in findings[0].title


def test_block_restores_the_global_rng():
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    diagnose_block(DropoutInEval)
    assert torch.equal(torch.rand(3), expected)


# ---------------------------------------------------------------------------------------------------
# diagnose_lm_loss
# ---------------------------------------------------------------------------------------------------
def flat_ce(logits, target, **kw):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1), **kw)


def unshifted(logits, ids, pad_id=None):
    return flat_ce(logits, ids, ignore_index=pad_id)


def shifted_backwards(logits, ids, pad_id=None):
    return flat_ce(logits[:, 1:], ids[:, :-1], ignore_index=pad_id)


def pad_counted(logits, ids, pad_id=None):
    return flat_ce(logits[:, :-1], ids[:, 1:])


def pad_in_denominator_only(logits, ids, pad_id=None):
    target = ids[:, 1:]
    per_token = flat_ce(logits[:, :-1], target, reduction="none")
    real = (target != pad_id).reshape(-1)
    return (per_token * real).sum() / real.numel()


def masked_by_input_not_target(logits, ids, pad_id=None):
    per_token = flat_ce(logits[:, :-1], ids[:, 1:], reduction="none")
    real = (ids[:, :-1] != pad_id).reshape(-1)
    return (per_token * real).sum() / real.sum()


def pad_hard_coded_zero(logits, ids, pad_id=None):
    return tinytf.lm_loss(logits, ids, pad_id=0)


def correct_manual(logits, ids, pad_id=None):
    per_token = flat_ce(logits[:, :-1], ids[:, 1:], reduction="none")
    real = (ids[:, 1:] != pad_id).reshape(-1)
    return (per_token * real).sum() / real.sum()


@pytest.mark.parametrize("fn", [tinytf.lm_loss, correct_manual], ids=["tinytf", "manual"])
def test_lm_loss_no_false_alarms(fn):
    assert diagnose_lm_loss(fn) == []


BUGGY_LOSSES = {
    "unshifted": (unshifted, 13, "not shifted"),
    "shifted_backwards": (shifted_backwards, 13, "wrong way"),
    "pad_counted": (pad_counted, 14, "counted in the loss"),
    "pad_in_denominator_only": (pad_in_denominator_only, 14, "denominator"),
    "masked_by_input_token": (masked_by_input_not_target, 14, "counted in the loss"),
    "pad_id_hard_coded": (pad_hard_coded_zero, 14, "counted in the loss"),
    "detached_item": (lambda logits, ids, pad_id=None: torch.tensor(tinytf.lm_loss(logits, ids, pad_id=pad_id).item()), 0, "detached"),
    "sum_not_mean": (lambda logits, ids, pad_id=None: tinytf.lm_loss(logits, ids, pad_id=pad_id) * 4, 0, "differs"),
}


@pytest.mark.parametrize("name", list(BUGGY_LOSSES))
def test_lm_loss_names_the_bug(name):
    fn, pitfall, words = BUGGY_LOSSES[name]
    findings = diagnose_lm_loss(fn)
    assert pitfalls(findings) == {pitfall}, report(findings)
    assert words in titles(findings), report(findings)


def test_exported_from_tinytf():
    for name in ("Finding", "report", "diagnose_attention", "diagnose_causal_mask", "diagnose_block", "diagnose_lm_loss",
                 "Pitfall", "PITFALLS", "CATALOG"):
        assert name in tinytf.__all__ and getattr(tinytf, name) is getattr(tinytf.checks, name)


def test_findings_carry_a_pitfall_and_the_catalog_fix():
    findings = diagnose_attention(make_attention(scale=lambda q: 1.0))
    assert findings[0].pitfall is Pitfall.SCALE and isinstance(findings[0].pitfall, Pitfall)
    assert CATALOG[Pitfall.SCALE].fix.replace("`", "") in findings[0].message
    assert "| 1 |" in tinytf.checks.glance_table() and "| 14 |" in tinytf.checks.glance_table()


# ---------------------------------------------------------------------------------------------------
# mistakes that show on some inputs only: named from the probes that show them
# ---------------------------------------------------------------------------------------------------
RIGHT = make_attention()


def only_if(cond, wrong, right=RIGHT):
    """An attention that is ``wrong`` when ``cond(q, k, mask)`` holds and right otherwise."""
    return lambda q, k, v, mask=None: (wrong if cond(q, k, mask) else right)(q, k, v, mask)


def square(q, k, mask):
    return q.size(-2) == k.size(-2)


PARTLY_WRONG_ATTENTION = {
    # name: (fn, pitfall, words in a title)
    "no_scale_when_square": (only_if(square, make_attention(scale=lambda q: 1.0)), Pitfall.SCALE, "missing scaling"),
    "no_scale_unless_d_head_8": (only_if(lambda q, k, m: q.size(-1) != 8, make_attention(scale=lambda q: 1.0)), Pitfall.SCALE,
                                 "missing scaling"),
    "total_dim_only_for_wide_heads": (only_if(lambda q, k, m: q.size(-1) >= 16,
                                              make_attention(scale=lambda q: 1 / math.sqrt(q.size(1) * q.size(-1)))),
                                      Pitfall.SCALE, "total dim"),
    "no_scale_only_with_a_mask": (only_if(lambda q, k, m: m is not None, make_attention(scale=lambda q: 1.0)), Pitfall.SCALE,
                                  "missing scaling"),
    "k_q_when_square": (only_if(square, make_attention(orient="kq")), Pitfall.ORIENTATION, "transposed scores"),
    "query_axis_for_batches": (only_if(lambda q, k, m: q.size(0) > 1, make_attention(axis=-2)), Pitfall.ORIENTATION,
                               "query axis"),
    "query_axis_for_long_keys": (only_if(lambda q, k, m: k.size(-2) > 8, make_attention(axis=-2)), Pitfall.ORIENTATION,
                                 "query axis"),
    "mask_after_softmax_for_key_padding": (only_if(lambda q, k, m: m is not None and m.size(-2) == 1,
                                                   make_attention(mask_mode="after")), Pitfall.MASK, "after the softmax"),
    "mask_ignored_when_2d": (only_if(lambda q, k, m: m is not None and m.dim() == 2, make_attention(mask_mode="ignored")),
                             Pitfall.MASK, "mask ignored"),
    "mask_inverted_when_square": (only_if(square, make_attention(invert=True)), Pitfall.MASK, "inverted"),
}


@pytest.mark.parametrize("name", list(PARTLY_WRONG_ATTENTION))
def test_attention_names_a_mistake_on_some_inputs_only(name):
    fn, pitfall, words = PARTLY_WRONG_ATTENTION[name]
    findings = diagnose_attention(fn)
    assert [f.pitfall for f in findings] == [pitfall], report(findings)
    assert words in findings[0].title and "right on the others" in findings[0].message, report(findings)


def test_attention_partly_wrong_message_names_the_inputs():
    findings = diagnose_attention(PARTLY_WRONG_ATTENTION["k_q_when_square"][0])
    assert "for q [3, 2, 6, 4] and k [3, 2, 6, 4]" in findings[0].message, report(findings)
    assert "[2, 3, 5, 8]" not in findings[0].message, report(findings)


def test_attention_two_mistakes_on_different_inputs_are_both_named():
    fn = only_if(square, make_attention(orient="kq"), make_attention(scale=lambda q: 1.0))
    findings = diagnose_attention(fn)
    assert {Pitfall.SCALE, Pitfall.ORIENTATION} <= pitfalls(findings), report(findings)


PARTLY_WRONG_MASKS = {
    "future_leaks_for_long_sequences": (lambda t: ones(t).tril(1 if t > 4 else 0), "future leaks", "for T=7"),
    "diagonal_blocked_beyond_one": (lambda t: ones(t).tril(-1 if t > 1 else 0), "diagonal is blocked", "for T=2"),
    "inverted_from_four": (lambda t: ones(t).triu(1) if t >= 4 else ones(t).tril(), "inverted", "for T=4"),
    "transposed_for_long": (lambda t: ones(t).triu() if t > 4 else ones(t).tril(), "transposed", "for T=7"),
}


@pytest.mark.parametrize("name", list(PARTLY_WRONG_MASKS))
def test_causal_mask_names_a_mistake_on_some_sizes_only(name):
    fn, words, where = PARTLY_WRONG_MASKS[name]
    findings = diagnose_causal_mask(fn)
    assert [f.pitfall for f in findings] == [Pitfall.CAUSAL_OFF_BY_ONE], report(findings)
    assert words in findings[0].title and where in findings[0].message, report(findings)


def short(x):
    return x.size(1) <= 3


class LeakForShortInputs(HandBlock):
    def allowed(self, t):
        return torch.ones(t, t, dtype=torch.bool) if t <= 3 else torch.ones(t, t, dtype=torch.bool).tril()


class BatchStatsInTrainOnly(HandBlock):
    def norm1(self, x):
        if not self.training:
            return self.ln1(x)
        return (x - x.mean(dim=(0, 1))) / (x.std(dim=(0, 1)) + 1e-5)  # over the batch, in train only


class WideResidualForSingleSequences(HandBlock):
    def forward(self, x):
        return x.repeat(1, 1, 4) + self.up(x) if x.size(0) == 1 else super().forward(x)


class DropoutInEvalForShortInputs(HandBlock):
    def dropout(self, x):
        return F.dropout(x, 0.1) if short(x) else self.drop(x)


class DropoutTiedToGradForShortInputs(HandBlock):
    def dropout(self, x):
        return F.dropout(x, 0.1) if short(x) and torch.is_grad_enabled() else self.drop(x)


PARTLY_WRONG_BLOCKS = {
    "leak_for_short_inputs": (LeakForShortInputs, Pitfall.CAUSAL_OFF_BY_ONE, "future tokens leak", "x [1, 3, 16]"),
    "batch_stats_in_train_only": (BatchStatsInTrainOnly, Pitfall.BATCH_NORM, "across the batch", "in train()"),
    "wide_residual_for_one_sequence": (WideResidualForSingleSequences, Pitfall.RESIDUAL_SHAPE, "shape", "x [1, 3, 16]"),
    "dropout_in_eval_for_short_inputs": (DropoutInEvalForShortInputs, Pitfall.TRAIN_EVAL, "stays on in eval", "x [1, 3, 16]"),
    "dropout_tied_to_grad_for_short": (DropoutTiedToGradForShortInputs, Pitfall.TRAIN_EVAL, "autograd", "x [1, 3, 16]"),
}


@pytest.mark.parametrize("name", list(PARTLY_WRONG_BLOCKS))
def test_block_names_a_mistake_on_some_inputs_only(name):
    factory, pitfall, words, where = PARTLY_WRONG_BLOCKS[name]
    findings = diagnose_block(factory)
    assert [f.pitfall for f in findings] == [pitfall], report(findings)
    assert words in findings[0].title and where in findings[0].message, report(findings)


def only_loss_if(cond, wrong, right=correct_manual):
    return lambda logits, ids, pad_id=None: (wrong if cond(logits, ids, pad_id) else right)(logits, ids, pad_id=pad_id)


def right_padding_only(logits, ids, pad_id=None):
    """Takes the first n - 1 targets of each row (n real tokens): right for right padding only."""
    per_token = flat_ce(logits[:, :-1], ids[:, 1:], reduction="none").view(ids.size(0), -1)
    n = (ids != pad_id).sum(1, keepdim=True)
    keep = torch.arange(ids.size(1) - 1) < n - 1
    return (per_token * keep).sum() / keep.sum()


PARTLY_WRONG_LOSSES = {
    "unshifted_without_padding": (only_loss_if(lambda lg, ids, pad: not (ids == pad).any(), unshifted), Pitfall.UNSHIFTED_TARGETS,
                                  "not shifted", "without padding"),
    "backwards_for_long_batches": (only_loss_if(lambda lg, ids, pad: ids.size(1) > 6, shifted_backwards), Pitfall.UNSHIFTED_TARGETS,
                                   "wrong way", "T=9"),
    "right_padding_only": (right_padding_only, Pitfall.PADDING_IN_LOSS, "counted in the loss", "left-padded"),
    "pad_in_denominator_unless_pad_0": (only_loss_if(lambda lg, ids, pad: pad != 0, pad_in_denominator_only), Pitfall.PADDING_IN_LOSS,
                                        "denominator", "pad_id=10"),
}


@pytest.mark.parametrize("name", list(PARTLY_WRONG_LOSSES))
def test_lm_loss_names_a_mistake_on_some_batches_only(name):
    fn, pitfall, words, where = PARTLY_WRONG_LOSSES[name]
    findings = diagnose_lm_loss(fn)
    assert [f.pitfall for f in findings] == [pitfall], report(findings)
    assert words in findings[0].title and where in findings[0].message and "right on the others" in findings[0].message, \
        report(findings)


def test_every_pitfall_points_at_a_section_that_exists():
    """The catalog's "NN_chapter.ipynb § heading" must name a real notebook and the start of one of its headings."""
    import json
    import re
    from pathlib import Path

    from tinytf.checks.catalog import CATALOG

    root = Path(__file__).resolve().parents[1] / "notebooks"
    for pitfall, entry in CATALOG.items():
        name, _, section = entry.section.partition(" § ")
        path = root / name
        assert path.exists(), f"{pitfall.name}: {name} is not a chapter"
        if not section:
            continue
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        headings = [re.sub(r"^#+\s*", "", line) for c in cells if c["cell_type"] == "markdown"
                    for line in "".join(c["source"]).splitlines() if line.startswith("#")]
        assert any(h.startswith(section) for h in headings), f"{pitfall.name}: no heading of {name} starts with {section!r}"
