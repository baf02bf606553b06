"""Choosing a device without ever calling a CUDA-only function on a machine that lacks CUDA, and the CPU's
intra-op thread count for a block of work (:func:`intra_op_threads`)."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["pick_device", "describe_device", "synchronize", "cuda_available", "intra_op_threads"]

ENV_VAR = "TINYTF_DEVICE"


def cuda_available() -> bool:
    """True when a CUDA device can be used (safe to call on any machine)."""
    return torch.cuda.is_available()


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def pick_device(preferred: str | torch.device | None = None) -> torch.device:
    """The device to run on.

    ``preferred`` (or, when it is None, the ``TINYTF_DEVICE`` environment variable) may be
    ``"auto"`` (CUDA, then Apple MPS, then CPU), ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"``.
    When the requested accelerator is missing, prints a message and falls back to the CPU.
    """
    if preferred is None:
        preferred = os.environ.get(ENV_VAR, "auto") or "auto"
    want = str(preferred).strip().lower()
    if want == "auto":
        if cuda_available():
            return torch.device("cuda")
        return torch.device("mps") if _mps_available() else torch.device("cpu")
    try:
        dev = torch.device(want)
    except RuntimeError as err:
        raise ValueError(f"unknown device {preferred!r}: use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'") from err
    if dev.type == "cuda":
        if not cuda_available():
            print(f"tinytf: {preferred!r} requested but CUDA is not available here; using the CPU.", file=sys.stderr)
            return torch.device("cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            n = torch.cuda.device_count()
            print(f"tinytf: {preferred!r} requested but only {n} CUDA device(s) exist; using cuda:0.", file=sys.stderr)
            return torch.device("cuda", 0)
    if dev.type == "mps" and not _mps_available():
        print(f"tinytf: {preferred!r} requested but MPS is not available here; using the CPU.", file=sys.stderr)
        return torch.device("cpu")
    return dev


def describe_device(device: str | torch.device) -> str:
    """A human-readable name: the GPU's model for CUDA, the processor for CPU."""
    dev = torch.device(device)
    if dev.type == "cuda" and cuda_available():
        return torch.cuda.get_device_name(dev)
    if dev.type == "cpu":
        return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    return dev.type


def synchronize(device: str | torch.device) -> None:
    """Wait for queued kernels on ``device`` (a no-op on the CPU)."""
    dev = torch.device(device)
    if dev.type == "cuda" and cuda_available():
        torch.cuda.synchronize(dev)
    elif dev.type == "mps" and _mps_available():
        torch.mps.synchronize()


@contextmanager
def intra_op_threads(threads: int | None) -> Iterator[None]:
    """Run the ``with`` block with ``threads`` intra-op CPU threads (``torch.set_num_threads``), then restore the previous
    setting; ``None`` changes nothing. Tiny ops (a decode step of a small model) are faster on one thread: more threads
    spend their time waiting for each other, and far more so on a machine that is busy with other work (chapter 13)."""
    if threads is None:
        yield
        return
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive int or None (keep torch's setting), got {threads!r}")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
