"""tinytf.bench: structure and honesty of results (never speed: timings are not tested)."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from tinytf.bench import BenchResult, benchmark, percentile, sdpa_backend


def test_percentile_matches_the_definition():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert percentile(xs, 50) == 3.0 and percentile(xs, 0) == 1.0 and percentile(xs, 100) == 5.0
    assert percentile([1.0, 2.0], 25) == pytest.approx(1.25)
    with pytest.raises(ValueError):
        percentile([], 50)


def test_warmup_and_iters_are_the_number_of_calls():
    calls = []
    res = benchmark(lambda: calls.append(1), warmup=3, iters=7, device="cpu", memory=False)
    assert len(calls) == 3 + 7 and len(res.times_ms) == 7
    assert res.conditions["warmup"] == 3 and res.conditions["iters"] == 7 and res.peak_bytes is None


def test_result_statistics_are_consistent_and_json_serialisable():
    x = torch.randn(64, 64)
    res = benchmark(lambda: x @ x, warmup=1, iters=9, device="cpu", name="mm", B=2, T=32, heads=1, dtype="fp32", backend="mm")
    assert isinstance(res, BenchResult)
    assert res.min_ms <= res.p50_ms <= res.p99_ms <= max(res.times_ms)
    assert res.median_ms == res.p50_ms == sorted(res.times_ms)[4]
    assert math.isclose(res.tokens_per_s, 2 * 32 / (res.median_ms / 1e3))
    back = json.loads(json.dumps(res.to_dict()))
    for key in ("device_name", "dtype", "B", "T", "heads", "backend", "warmup", "iters", "torch", "timer"):
        assert key in back["conditions"], key
    assert back["conditions"]["torch"] == torch.__version__


def test_peak_memory_is_measured_on_cpu():
    x = torch.randn(128, 128)
    res = benchmark(lambda: (x @ x) * 2, warmup=0, iters=2, device="cpu")
    assert res.peak_bytes == 2 * x.numel() * x.element_size()  # the product and the doubled copy


def test_a_cpu_result_never_claims_gpu_performance():
    res = benchmark(lambda: None, warmup=0, iters=3, device="cpu", memory=False)
    assert not res.on_gpu and res.conditions["device_type"] == "cpu" and res.conditions["timer"] == "time.perf_counter"
    assert "CPU" in res.summary() and "says nothing about a GPU" in res.summary()
    assert "GPU" not in res.conditions["device_name"]


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="iters"):
        benchmark(lambda: None, warmup=0, iters=0)


def test_sdpa_backend_names_the_kernel_that_ran():
    q = torch.randn(1, 2, 16, 8)
    label = sdpa_backend(q, q, q, is_causal=True)
    assert label in ("flash (fused CPU kernel)", "math (unfused, CPU)")
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        assert sdpa_backend(q, q, q, is_causal=True).startswith("math")
    assert F.scaled_dot_product_attention(q, q, q).shape == q.shape


@pytest.mark.cuda
def test_cuda_uses_events_and_labels_the_gpu(cuda):
    x = torch.randn(256, 256, device=cuda)
    res = benchmark(lambda: x @ x, warmup=2, iters=5, device=cuda)
    assert res.on_gpu and res.conditions["timer"] == "cuda events" and res.peak_bytes >= x.numel() * 4
    q = torch.randn(1, 2, 128, 64, device=cuda, dtype=torch.float16)
    assert sdpa_backend(q, q, q, is_causal=True) in ("flash", "mem-efficient", "cudnn", "math")


def test_one_thread_runs_the_block_on_one_thread_and_restores_the_setting():
    from tinytf.bench import one_thread

    before = torch.get_num_threads()
    with one_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), one_thread():
        raise RuntimeError("the block failed")
    assert torch.get_num_threads() == before  # restored on an exception too


def test_the_summary_speaks_the_notebooks_language(monkeypatch):
    """Chapter 05 (issue 35): a benchmark's line in the Chinese edition; the numbers and conditions stay as they are."""
    monkeypatch.setenv("TINYTF_LANG", "zh")
    res = benchmark(lambda: torch.ones(4).sum(), warmup=0, iters=2, B=1, T=4)
    text = res.summary()
    assert "中位数" in text and "CPU 上的数字，说明不了 GPU" in text and "median" not in text and "warmup" not in text
