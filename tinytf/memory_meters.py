"""Memory meters: measured bytes, to check the :mod:`tinytf.memory_ledger` predictions against.

:class:`SavedTensorMeter` (bytes autograd saves for backward), :class:`PeakMemoryMeter` (peak bytes
of live tensors: ``torch.cuda`` statistics on a GPU, a dispatch-mode tensor tracker on the CPU) and
:func:`state_bytes` (parameters, gradients, optimizer state). The tracker is built on torch's
private ``torch.utils._python_dispatch``, imported only when a CPU meter is entered."""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch

__all__ = ["SavedTensorMeter", "PeakMemoryMeter", "state_bytes"]


def _storage_ids(tensors: Any) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors if isinstance(t, torch.Tensor)}


class SavedTensorMeter:
    """Bytes of the distinct storages autograd saves for backward inside the ``with`` block.

    Uses ``torch.autograd.graph.saved_tensors_hooks``: every tensor an op keeps for its backward
    passes through the pack hook. Views share a storage, so storages are counted once (by data
    pointer) at their full size; tensors whose storage is in ``exclude`` (pass the parameters) are
    skipped::

        with SavedTensorMeter(exclude=model.parameters()) as saved:
            loss = lm_loss(model(ids), ids)
        saved.nbytes
    """

    def __init__(self, exclude: Any = ()) -> None:
        self._exclude = _storage_ids(exclude)
        self.storages: dict[int, tuple[tuple[int, ...], torch.dtype, int]] = {}  # ptr -> (shape, dtype, bytes)
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr not in self._exclude and ptr not in self.storages:
            self.storages[ptr] = (tuple(t.shape), t.dtype, st.nbytes())
        return t

    @property
    def nbytes(self) -> int:
        """Total bytes saved for backward (distinct storages)."""
        return sum(n for _, _, n in self.storages.values())

    def __enter__(self) -> SavedTensorMeter:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)


@functools.cache
def _live_tensors() -> type:
    """The live-tensor tracker class (a ``TorchDispatchMode``), defined on first use: its base
    class is private torch API that ``import tinytf`` should not pull in."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class _LiveTensors(TorchDispatchMode):
        """Tracks the bytes of tensor storages created inside the mode until they are freed."""

        def __init__(self, device_type: str) -> None:
            super().__init__()
            self.device_type = device_type
            self.current = self.peak = 0
            self._refs: dict[int, weakref.ref] = {}  # id(storage) -> weak reference (freed => callback)

        def _watch(self, st: torch.UntypedStorage, count: bool) -> None:
            key = id(st)
            if key in self._refs:
                return
            n = st.nbytes() if count else 0

            def freed(_ref: weakref.ref, key: int = key, n: int = n) -> None:
                self._refs.pop(key, None)
                self.current -= n

            self._refs[key] = weakref.ref(st, freed)
            self.current += n
            self.peak = max(self.peak, self.current)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            for t in tree_leaves((args, kwargs)):  # storages that existed before: the baseline, not counted
                if isinstance(t, torch.Tensor) and t.device.type == self.device_type:
                    self._watch(t.untyped_storage(), count=False)
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.device.type == self.device_type:
                    self._watch(t.untyped_storage(), count=True)
            return out

    return _LiveTensors


class PeakMemoryMeter:
    """Peak bytes of tensors allocated inside the ``with`` block, above what was live before.

    On CUDA: ``torch.cuda.max_memory_allocated`` minus the allocation at entry (caching-allocator
    bytes, rounded to its 512-byte blocks). On the CPU (no allocator statistics) a
    ``TorchDispatchMode`` sees every tensor an op creates and a weak reference sees its storage
    freed, so ``peak`` is the largest sum of live storages — tensors only, not allocator overhead
    or Python objects::

        with PeakMemoryMeter(device) as meter:
            train_step(model, optimizer, ids)
        meter.peak
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.peak = 0
        self.method = "torch.cuda.max_memory_allocated" if self.device.type == "cuda" else "live-tensor tracker (TorchDispatchMode)"
        self._mode: Any = None

    def __enter__(self) -> PeakMemoryMeter:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
        else:
            self._mode = _live_tensors()(self.device.type)
            self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device) - self._start
        else:
            assert self._mode is not None
            self._mode.__exit__(*exc)
            self.peak = self._mode.peak


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """Measured bytes of ``parameters``, ``gradients`` (``.grad`` tensors) and ``optimizer_state``
    (every tensor in ``optimizer.state``, step counters included)."""
    params = list(model.parameters())
    out = {
        "parameters": sum(p.numel() * p.element_size() for p in params),
        "gradients": sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None),
        "optimizer_state": 0,
    }
    if optimizer is not None:
        for state in optimizer.state.values():
            out["optimizer_state"] += sum(v.numel() * v.element_size() for v in state.values() if isinstance(v, torch.Tensor))
    return out
