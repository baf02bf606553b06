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
