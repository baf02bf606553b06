"""Shared fixtures: deterministic seeds and the device under test (``TINYTF_DEVICE``)."""

from __future__ import annotations

import os

import pytest
import torch

import tinytf


def pytest_collection_modifyitems(config, items):
    """CUDA tests skip without a GPU.

    ``make unit`` runs ``--dist loadfile``: a file's tests stay on one worker, so a file's module fixtures
    (a grading run, a release) are set up once. (``--dist loadgroup`` with ``xdist_group`` marks does not
    group under pytest 9: pytest-xdist 3.8 renames ``item._nodeid``, which pytest 9's ``nodeid`` no longer
    reads, and the tests of one file were spread over both workers.) The corpus's grading run
    (test_corpus.py) and its validate runs (test_corpus_validate.py) are two files: one worker each.
    """
    skip = None if torch.cuda.is_available() else pytest.mark.skip(reason="needs a CUDA GPU (none here)")
    for item in items:
        if skip is not None and "cuda" in item.keywords:
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


@pytest.fixture
def small_lm(device) -> tinytf.TinyLanguageModel:
    """A seeded TinyLanguageModel (V=40, D=32, H=4, 3 layers, 32 positions) on the device, in eval mode: the
    model of the generation and KV-cache tests."""
    torch.manual_seed(0)
    return tinytf.TinyLanguageModel(vocab=40, dim=32, heads=4, layers=3, max_tokens=32).to(device).eval()
