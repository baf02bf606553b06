"""An honest benchmark harness: warm up, synchronise, time many runs, report the spread and the
conditions.

    result = benchmark(lambda: attn(x), warmup=3, iters=20, device="cpu", B=8, T=512, heads=4, dtype="fp32")
    print(result)            # median, p50/p99, tokens/s, peak memory, and where it ran

On a GPU each run is timed with CUDA events (the GPU's own clock) after a synchronisation; on a
CPU with ``time.perf_counter``. Every result carries its conditions — device name, dtype, B, T,
heads, backend, warmup, iterations, torch version — and a CPU result says so: a CPU figure says
nothing about GPU performance.
"""

from __future__ import annotations

import functools
import json
import platform
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from .device import describe_device, intra_op_threads, synchronize
from .memory import PeakMemoryMeter, format_bytes
from .translation import N_
from .translation import gettext as _

__all__ = ["BenchResult", "benchmark", "one_thread", "percentile", "sdpa_backend", "cpu_load", "decode_step_times"]

@contextmanager
def one_thread() -> Iterator[None]:
    """Run the ``with`` block with one intra-op CPU thread, then restore the previous setting.

    Small models (the chapters' copy-task models, B=1 decoding) spend more time synchronising threads
    than computing; one thread is faster there and its timings are steadier on a shared machine."""
    with intra_op_threads(1):
        yield


# which kernel F.scaled_dot_product_attention dispatched to, by the aten op it called
_SDPA_KERNELS = {
    "_scaled_dot_product_flash_attention_for_cpu": N_("flash (fused CPU kernel)"),
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_efficient_attention": "mem-efficient",
    "_scaled_dot_product_cudnn_attention": "cudnn",
    "_flash_attention_forward": "flash",
    "_efficient_attention_forward": "mem-efficient",
}


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation, like ``numpy.percentile``."""
    if not values:
        raise ValueError("percentile of an empty list")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = int(pos), min(int(pos) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class BenchResult:
    """Latency statistics (milliseconds), throughput, peak memory and the run's conditions."""

    name: str
    median_ms: float
    p50_ms: float
    p99_ms: float
    mean_ms: float
    min_ms: float
    tokens_per_s: float | None
    peak_bytes: int | None
    times_ms: list[float] = field(repr=False)
    conditions: dict[str, Any]

    @property
    def on_gpu(self) -> bool:
        """True only for a result measured on a CUDA device."""
        return self.conditions.get("device_type") == "cuda"

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable copy (plain floats, ints, strings, lists)."""
        return json.loads(json.dumps(asdict(self)))

    def summary(self) -> str:
        """One line: median (p50/p99), tokens/s, peak memory, then where and how it ran."""
        c = self.conditions
        shape = ", ".join(f"{k}={c[k]}" for k in ("B", "T", "heads", "dtype", "backend") if k in c)
        tps = _(", {tps:,.0f} tokens/s").format(tps=self.tokens_per_s) if self.tokens_per_s else ""
        mem = _(", peak {peak}").format(peak=format_bytes(self.peak_bytes)) if self.peak_bytes is not None else ""
        where = c["device_name"] + ("" if self.on_gpu else _(" — a CPU figure, says nothing about a GPU"))
        return (_("{name}: median {median:.3f} ms (p50 {p50:.3f}, p99 {p99:.3f}){tps}{mem} [{shape}; warmup {warmup}, iters "
                  "{iters}, torch {torch}; {where}]")
                .format(name=self.name, median=self.median_ms, p50=self.p50_ms, p99=self.p99_ms, tps=tps, mem=mem, shape=shape,
                        warmup=c["warmup"], iters=c["iters"], torch=c["torch"], where=where))

    def __str__(self) -> str:
        return self.summary()


def benchmark(
    fn: Callable[[], Any],
    *,
    warmup: int = 3,
    iters: int = 10,
    device: torch.device | str = "cpu",
    tokens: int | None = None,
    name: str = "",
    memory: bool = True,
    **conditions: Any,
) -> BenchResult:
    """Time ``fn()`` ``iters`` times after ``warmup`` untimed calls.

    Args:
        fn: the work to time, called with no arguments; it must run on ``device``.
        device: where ``fn`` runs. CUDA: each call is bracketed by CUDA events and the results are
            read after a synchronisation; CPU/MPS: ``time.perf_counter`` with a synchronise.
        tokens: tokens processed per call (for tokens/s); defaults to ``B * T`` from ``conditions``.
        memory: also measure peak memory: on CUDA over the timed calls
            (``torch.cuda.max_memory_allocated``), elsewhere in one extra untimed call under
            :class:`tinytf.memory.PeakMemoryMeter` (its per-op tracking would distort timings).
        **conditions: recorded with the result (``B``, ``T``, ``heads``, ``dtype``, ``backend``, ...).

    Returns:
        :class:`BenchResult`; its ``conditions`` also hold the device, its name, warmup, iters,
        the timer, the torch version and the platform.
    """
    import statistics  # here, not at module level: it pulls in decimal and fractions

    if warmup < 0 or iters < 1:
        raise ValueError(f"need warmup >= 0 and iters >= 1, got warmup={warmup}, iters={iters}")
    dev = torch.device(device)
    for _call in range(warmup):
        fn()
    synchronize(dev)
    if dev.type == "cuda" and torch.cuda.is_available():
        times, peak, method, timer = _time_cuda(fn, dev, iters, memory)
    else:
        times, peak, method, timer = _time_host(fn, dev, iters, memory)
    if tokens is None and "B" in conditions and "T" in conditions:
        tokens = int(conditions["B"]) * int(conditions["T"])
    median = statistics.median(times)
    conds = dict(conditions) | _run_conditions(dev) | {"warmup": warmup, "iters": iters, "timer": timer, "memory_method": method}
    return BenchResult(
        name=name or getattr(fn, "__name__", "fn"),
        median_ms=median,
        p50_ms=percentile(times, 50),
        p99_ms=percentile(times, 99),
        mean_ms=statistics.fmean(times),
        min_ms=min(times),
        tokens_per_s=(tokens / (median / 1e3) if tokens and median > 0 else None),
        peak_bytes=peak,
        times_ms=times,
        conditions=conds,
    )


def _run_conditions(dev: torch.device) -> dict[str, Any]:
    """Where a result was measured: the device (its type and name), torch's version and threads, the platform."""
    return {"device": str(dev), "device_type": dev.type, "device_name": describe_device(dev), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "platform": platform.platform()}


def _time_cuda(fn: Callable[[], Any], dev: torch.device, iters: int, memory: bool) -> tuple[list[float], int | None, str | None, str]:
    """``iters`` calls bracketed by CUDA events, read after one synchronisation; peak over all of them."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    with PeakMemoryMeter(dev) as meter:
        for s, e in zip(starts, ends):
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize(dev)
    times = [s.elapsed_time(e) for s, e in zip(starts, ends)]  # milliseconds
    return times, (meter.peak if memory else None), (meter.method if memory else None), "cuda events"


def _time_host(fn: Callable[[], Any], dev: torch.device, iters: int, memory: bool) -> tuple[list[float], int | None, str | None, str]:
    """``iters`` calls timed with ``perf_counter`` (synchronised); peak memory in one extra untimed call."""
    times = []
    for _call in range(iters):
        t0 = time.perf_counter()
        fn()
        synchronize(dev)
        times.append((time.perf_counter() - t0) * 1e3)
    if not memory:
        return times, None, None, "time.perf_counter"
    with PeakMemoryMeter(dev) as meter:
        fn()
    return times, meter.peak, meter.method, "time.perf_counter"


@functools.cache
def _op_names() -> type:
    """A ``TorchDispatchMode`` recording the aten op names it sees, defined on first use (its base
    class is private torch API that ``import tinytf`` should not pull in)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class _OpNames(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            self.names.append(func.__name__.split(".")[0])
            return func(*args, **(kwargs or {}))

    return _OpNames


def sdpa_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **sdpa_kwargs: Any) -> str:
    """Which kernel ``F.scaled_dot_product_attention(q, k, v, **sdpa_kwargs)`` runs for these inputs:
    ``"flash (fused CPU kernel)"``, ``"flash"``, ``"mem-efficient"``, ``"cudnn"`` or ``"math"``
    (the unfused composite); the CPU labels in the notebook's language. Found by recording the aten ops of one call."""
    with torch.no_grad(), _op_names()() as rec:
        F.scaled_dot_product_attention(q, k, v, **sdpa_kwargs)
    for op in rec.names:
        if op in _SDPA_KERNELS:
            return _(_SDPA_KERNELS[op])
    return _("math (unfused, CPU)") if q.device.type == "cpu" else "math"


@contextmanager
def cpu_load(processes: int) -> Iterator[int]:
    """Keep ``processes`` CPU cores busy for the ``with`` block: plain Python busy loops in child processes (nothing
    shared with this one), stopped when the block ends, however it ends. Yields the number started. What a student's
    laptop running a browser, a build or another notebook looks like to a benchmark."""
    import subprocess
    import sys

    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(max(0, processes))]
    try:
        time.sleep(0.2 if procs else 0.0)  # let them start spinning
        yield len(procs)
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def decode_step_times(models: dict[str, torch.nn.Module], *, steps: int = 50, threads: int | None = None, prompt: int = 16,
                      batch: int = 1) -> dict[str, list[float]]:
    """Milliseconds of each cached decode step of each model, measured **side by side**: one step of every model in turn,
    so that a change in the machine's load hits them all alike. One prefill of ``prompt`` random tokens each, then
    ``steps`` greedy decode steps, with ``threads`` intra-op threads (None: torch's setting). CPU timings (synchronised)."""
    from .generation import cache_for

    caches, logits = {}, {}
    with torch.inference_mode(), intra_op_threads(threads):
        for name, m in models.items():
            p = next(m.parameters())
            caches[name] = cache_for(m, batch, max_tokens=prompt + steps + 1)
            ids = torch.randint(0, m.config.vocab, (batch, prompt), device=p.device)
            logits[name] = m(ids, cache=caches[name])[:, -1]
        times: dict[str, list[float]] = {name: [] for name in models}
        for _ in range(steps):
            for name, m in models.items():
                nxt = logits[name].argmax(-1, keepdim=True)
                device = nxt.device
                synchronize(device)
                start = time.perf_counter()
                logits[name] = m(nxt, cache=caches[name])[:, -1]
                synchronize(device)
                times[name].append((time.perf_counter() - start) * 1e3)
    return times
