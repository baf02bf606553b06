"""tinytf.checks.masks: ``diagnose_causal_mask`` names the deliberate bug it claims (on every size or on some
sizes only), and stays quiet on correct masks."""

from __future__ import annotations

import pytest
import torch
from _diagnoses import pitfalls, titles

import tinytf
from tinytf.checks import Pitfall, diagnose_causal_mask, report


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
# mistakes that show on some inputs only: named from the probes that show them
# ---------------------------------------------------------------------------------------------------
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
