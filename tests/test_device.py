"""pick_device honours TINYTF_DEVICE and falls back to the CPU without touching CUDA-only calls."""

import pytest
import torch

from tinytf import describe_device, pick_device


def test_explicit_cpu():
    assert pick_device("cpu") == torch.device("cpu")


def test_env_var(monkeypatch):
    monkeypatch.setenv("TINYTF_DEVICE", "cpu")
    assert pick_device() == torch.device("cpu")


def test_auto_prefers_cuda_when_present(monkeypatch):
    monkeypatch.delenv("TINYTF_DEVICE", raising=False)
    expected = "cuda" if torch.cuda.is_available() else None
    dev = pick_device()
    if expected:
        assert dev.type == "cuda"
    else:
        assert dev.type in ("cpu", "mps")


def test_missing_cuda_falls_back_with_message(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: pytest.fail("CUDA-only call made"))
    assert pick_device("cuda") == torch.device("cpu")
    assert "CUDA is not available" in capsys.readouterr().err
    assert describe_device("cpu").startswith("CPU")


def test_unknown_device():
    with pytest.raises(ValueError, match="unknown device"):
        pick_device("tpu-9000")
