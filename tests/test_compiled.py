"""tinytf.compiled: the ratio's ingredients are consistent (it is the ratio of the two medians), the compiled
output equals eager within the stated tolerance, kernels are counted from the profiler, and a machine without a
C++ compiler gets a clear reason instead of a failure. No timing is asserted."""

from __future__ import annotations

import math

import pytest
import torch
from torch.profiler import profile

import tinytf
from tinytf.compiled import VIEWS, compile_report, compile_skip_reason, cxx_compiler, kernel_calls


def _block():
    torch.manual_seed(0)
    return tinytf.TransformerBlock(32, 4, 32).eval(), torch.randn(2, 32, 32)


def test_kernel_calls_counts_eager_ops_and_leaves_views_out():
    block, x = _block()
    with torch.no_grad(), profile() as prof:
        block(x)
    count = kernel_calls(prof.events())
    from_python = [e for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None]
    assert count.ops + count.views == len(from_python)
    assert count.views == sum(e.name in VIEWS for e in from_python) > 0
    assert count.fused == () and count.device_kernels == 0 and count.kernels == count.ops


def test_the_report_is_consistent_and_the_outputs_agree():
    block, x = _block()
    report = compile_report(block, x, backend="aot_eager", warmup=1, iters=3, tolerance=1e-5, B=2, T=32)
    assert report.speedup == report.eager.median_ms / report.compiled.median_ms
    assert report.equal and report.max_abs_diff <= report.tolerance
    assert len(report.eager.times_ms) == len(report.compiled.times_ms) == 3
    assert report.eager.conditions["B"] == 2 and math.isfinite(report.compile_s)  # the first call was timed apart
    assert report.compiled_kernels.fused == ()  # aot_eager traces, but generates no kernels
    assert report.eager_kernels.kernels > 0
    saved = report.eager.median_ms - report.compiled.median_ms
    assert report.break_even_calls == (report.compile_s * 1e3 / saved if saved > 0 else float("inf"))
    assert "compile (first call)" in report.summary()


def test_a_machine_without_a_cxx_compiler_gets_a_reason(monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert cxx_compiler() is None
    reason = compile_skip_reason("cpu")
    assert reason and "C++ compiler" in reason and "skipped" in reason
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    assert compile_skip_reason("cpu") is None


@pytest.mark.slow
@pytest.mark.skipif(compile_skip_reason("cpu") is not None, reason="no C++ compiler for inductor")
def test_inductor_fuses_the_block_into_fewer_kernels():
    block, x = _block()
    with tinytf.one_thread():
        report = compile_report(block, x, warmup=1, iters=3)
    assert report.equal, report.max_abs_diff
    assert report.compiled_kernels.fused and all("_fused_" in name for name in report.compiled_kernels.fused)
    assert report.compiled_kernels.kernels < report.eager_kernels.kernels
    assert any("softmax" in name for name in report.compiled_kernels.fused)  # scale, mask and softmax in one kernel
