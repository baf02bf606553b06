"""tinytf.checks.findings: ``Finding`` and ``report``, and the checks' public names exported from tinytf."""

from __future__ import annotations

import dataclasses

import pytest

import tinytf
from tinytf.checks import PITFALLS, Finding, report


def test_finding_is_frozen_and_report_lists_every_finding():
    f = Finding(3, "mask ignored", "apply it")
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.pitfall = 4  # type: ignore[misc]
    text = report([f, Finding(1, "missing scaling", "divide by sqrt(d)")])
    assert "2 problems" in text and "mask ignored" in text and "missing scaling" in text and "pitfall 3" in text
    assert "no problems" in report([])
    assert set(range(1, 15)) <= set(PITFALLS)


def test_exported_from_tinytf():
    for name in ("Finding", "report", "diagnose_attention", "diagnose_causal_mask", "diagnose_block", "diagnose_lm_loss",
                 "Pitfall", "PITFALLS", "CATALOG"):
        assert name in tinytf.__all__ and getattr(tinytf, name) is getattr(tinytf.checks, name)


def test_where_two_tensors_differ_and_which_slices_were_taken():
    import torch

    from tinytf.checks.findings import difference_pattern, slice_map, slices_relation

    a = torch.arange(24.0).reshape(2, 3, 4)
    b = a.clone()
    b[:, 1] += 1
    assert difference_pattern(b, a, ("B", "H", "T")) == "only dim 1 (H) indices 1 differ"
    assert difference_pattern(a + 1, a) == "24 of 24 entries differ, spread over every axis"
    assert difference_pattern(a + 1, a, spread=False) == "" and difference_pattern(a, a) == ""
    nan = a.clone()
    nan[0, 0, 0] = float("nan")
    assert difference_pattern(nan, a).startswith("yours holds NaN in 1 of 24 entries")
    k = torch.randn(1, 3, 2)
    assert slice_map(k[:, [0, 0, 2]], k, 1) == [0, 0, 2] and slice_map(k + 5, k, 1) == [None, None, None]
    assert slices_relation(k[:, [0, 1, 0]], k, 1, "heads") == "your heads 0, 1, 2 are the reference's heads 0, 1, 0"
    assert slices_relation(k, k, 1, "heads") == ""
