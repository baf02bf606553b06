"""tinytf.checks.loss: ``diagnose_lm_loss`` names the deliberate bug it claims (on every batch or on some batches
only), and stays quiet on correct losses."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _diagnoses import pitfalls, titles

import tinytf
from tinytf.checks import Pitfall, diagnose_lm_loss, report


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


# ---------------------------------------------------------------------------------------------------
# mistakes that show on some inputs only: named from the probes that show them
# ---------------------------------------------------------------------------------------------------
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
