"""tinytf.checks.attention: ``diagnose_attention`` names the deliberate bug it claims (on every input or on some
inputs only), and stays quiet on correct code."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from _diagnoses import pitfalls, titles

import tinytf
from tinytf.checks import CATALOG, Pitfall, diagnose_attention, report


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
