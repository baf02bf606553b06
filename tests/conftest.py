"""Shared fixtures: deterministic seeds and the device under test (``TINYTF_DEVICE``)."""

from __future__ import annotations

import os

import pytest
import torch

import tinytf


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none here)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture
def device() -> torch.device:
    """The device tests run on: ``TINYTF_DEVICE`` (``make test-cuda`` sets cuda), else the CPU."""
    return tinytf.pick_device(os.environ.get("TINYTF_DEVICE", "cpu"))


@pytest.fixture
def cuda() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (none here)")
    return torch.device("cuda")
