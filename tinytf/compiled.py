"""What ``torch.compile`` buys, measured: the first call's compile time apart, the speed-up as a ratio of
medians, the outputs against eager within a stated tolerance, and the kernels counted from the profiler
before and after (what fused).

    report = compile_report(block, x)        # None-free: check compile_skip_reason() first
    print(report.summary())

On a CPU, inductor writes C++ and builds it with the machine's compiler; :func:`compile_skip_reason` says
why a machine cannot (no C++ compiler, no Triton on a GPU) so that a chapter can skip instead of failing.
The private ``torch._dynamo`` / ``torch._inductor`` modules are imported only inside these functions.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .bench import BenchResult, benchmark
from .device import synchronize
from .profiling import spans_of
from .translation import gettext as _

__all__ = ["KernelCount", "CompileReport", "kernel_calls", "cxx_compiler", "compile_skip_reason", "compile_report", "VIEWS"]

# aten ops that only make a new view of the same memory, and dropout with p = 0 or in eval mode: no kernel runs
VIEWS = frozenset({"aten::view", "aten::transpose", "aten::t", "aten::split", "aten::split_with_sizes", "aten::chunk", "aten::expand",
                   "aten::as_strided", "aten::_unsafe_view", "aten::unsqueeze", "aten::squeeze", "aten::permute", "aten::slice",
                   "aten::select", "aten::detach", "aten::alias", "aten::unbind", "aten::reshape", "aten::dropout"})


@dataclass(frozen=True)
class KernelCount:
    """What one call dispatched: aten ops called from Python or from a compiled graph (views excluded: they
    launch no kernel), the views, the compiled graph's own fused kernels (their names), and CUDA kernels."""

    ops: int
    views: int
    fused: tuple[str, ...]
    device_kernels: int

    @property
    def kernels(self) -> int:
        """CUDA kernels on a GPU, else the CPU calls that run a kernel: aten ops plus fused kernels."""
        return self.device_kernels or self.ops + len(self.fused)


def kernel_calls(events: Any) -> KernelCount:
    """Count what a profiled call dispatched (``prof.events()``; see :class:`KernelCount`)."""
    events = list(events)
    device = sum(1 for e in events if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA)
    top = [s for s in spans_of(events) if s.parent is None or not s.parent.name.startswith("aten::")]
    fused = tuple(s.name for s in top if "_fused_" in s.name)
    aten = [s for s in top if s.name.startswith("aten::")]
    views = sum(s.name in VIEWS for s in aten)
    return KernelCount(len(aten) - views, views, fused, device)


def cxx_compiler() -> str | None:
    """The C++ compiler inductor would build CPU kernels with: ``$CXX``, else the first of g++, c++, clang++ on PATH."""
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and (found := shutil.which(name)):
            return found
    return None


def compile_skip_reason(device: torch.device | str = "cpu") -> str | None:
    """None when ``torch.compile``'s default backend (inductor) can run on ``device`` here, else why not (translated)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        if importlib.util.find_spec("triton") is None:
            return _("torch.compile on a GPU generates Triton kernels, but triton is not installed here (pip install triton); "
                     "the torch.compile section is skipped.")
        return None
    if dev.type != "cpu":
        return _("torch.compile's inductor backend is measured here on CPU and CUDA only, not on {device}; the section is skipped.")\
            .format(device=dev.type)
    if cxx_compiler() is None:
        return _("torch.compile on the CPU writes C++ and needs a C++ compiler, but none was found ($CXX, g++, c++, clang++). "
                 "Install one (Debian/Ubuntu: apt install g++; macOS: xcode-select --install) to run the torch.compile section; "
                 "it is skipped.")
    return None


@dataclass
class CompileReport:
    """``torch.compile`` against eager on the same inputs (times in ms, ``compile_s`` in seconds)."""

    compile_s: float  # the first call: tracing, graph lowering, code generation, building the C++/Triton
    cache_hits: int  # inductor's FX-graph cache hits during that call (a warm on-disk cache compiles much faster)
    eager: BenchResult
    compiled: BenchResult
    max_abs_diff: float
    tolerance: float
    eager_kernels: KernelCount
    compiled_kernels: KernelCount

    @property
    def speedup(self) -> float:
        """Eager median / compiled median."""
        return self.eager.median_ms / self.compiled.median_ms

    @property
    def equal(self) -> bool:
        """The outputs agree: max |compiled - eager| <= tolerance."""
        return self.max_abs_diff <= self.tolerance

    @property
    def break_even_calls(self) -> float:
        """Calls after which the compile time is paid back by the faster calls (inf when there is no speed-up)."""
        saved = self.eager.median_ms - self.compiled.median_ms
        return self.compile_s * 1e3 / saved if saved > 0 else float("inf")

    def summary(self) -> str:
        """Compile time, the ratio of medians and its ingredients, the outputs' agreement, the kernel counts."""
        e, c = self.eager_kernels, self.compiled_kernels
        return _("compile (first call) {compile_s:.1f} s; eager median {eager:.3f} ms (p99 {eager99:.3f}), compiled median {comp:.3f} ms "
                 "(p99 {comp99:.3f}): {speedup:.2f}x; max |compiled - eager| = {diff:.1e} (tolerance {tol:.0e}); kernels {ek} -> {ck} "
                 "({fused} fused)").format(compile_s=self.compile_s, eager=self.eager.median_ms, eager99=self.eager.p99_ms,
                                           comp=self.compiled.median_ms, comp99=self.compiled.p99_ms, speedup=self.speedup,
                                           diff=self.max_abs_diff, tol=self.tolerance, ek=e.kernels, ck=c.kernels, fused=len(c.fused))


def compile_report(module: nn.Module, *inputs: torch.Tensor, warmup: int = 3, iters: int = 20, tolerance: float = 1e-5,
                   backend: str = "inductor", trust_cpu_isa: bool = True, **conditions: Any) -> CompileReport:
    """Compile ``module`` (inference: ``torch.no_grad``), time its first call, then benchmark eager and compiled
    side by side with :func:`tinytf.benchmark` and count each one's kernels with the profiler. On a CPU the
    generated C++ kernels are built with a profiler record around each, so that they can be counted and named.

    ``trust_cpu_isa``: use the vector instructions the CPU reports (AVX2, AVX-512, NEON …) without inductor's
    one-time probe, which builds a test program for each of them — about ten seconds of C++ compilation the
    first time on a machine (cached afterwards), not part of compiling this module."""
    import torch._dynamo
    import torch._inductor.config
    from torch._dynamo.utils import counters

    device = inputs[0].device
    torch._dynamo.reset()  # compile afresh: the first call below includes the whole compilation
    compiled = torch.compile(module, backend=backend)
    hits = counters["inductor"]["fxgraph_cache_hit"]
    patch = {"cpp.enable_kernel_profile": True} | ({"cpp.vec_isa_ok": True} if trust_cpu_isa else {})
    with torch.no_grad(), torch._inductor.config.patch(patch):
        start = time.perf_counter()
        out = compiled(*inputs)
        synchronize(device)
        compile_s = time.perf_counter() - start
        hits = counters["inductor"]["fxgraph_cache_hit"] - hits
        diff = (out.float() - module(*inputs).float()).abs().max().item()
        kernels = []
        for fn in (module, compiled):
            with torch.profiler.profile() as prof:
                fn(*inputs)
                synchronize(device)
            kernels.append(kernel_calls(prof.events()))
        results = [benchmark(lambda fn=fn: fn(*inputs), warmup=warmup, iters=iters, device=device, memory=False, name=name, **conditions)
                   for name, fn in (("eager", module), ("compiled", compiled))]
    return CompileReport(compile_s, hits, *results, diff, tolerance, *kernels)
