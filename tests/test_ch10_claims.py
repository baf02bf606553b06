"""Chapter 10 (tiled attention) states numbers in its prose; each is recomputed here from tinytf and
must still be stated, in both editions — so prose and printout cannot drift apart."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F
from _claims import prose, stated
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

import tinytf
from tinytf.memory import KiB, PeakMemoryMeter, attention_io_bytes, format_bytes, tiled_io_blocks, tiled_working_set
from tinytf.viz.tiled import online_softmax_trace

CHAPTER = "10_tiled_attention.ipynb"
N, D = 4096, 64  # section 7's N and d
FAST_MEMORIES = (48, 100, 228)  # KiB, section 7's M
NS = [2**i for i in range(8, 17)]  # section 7's plotted N


@pytest.fixture(scope="module")
def text() -> dict[str, str]:
    return prose(CHAPTER)


def _io(m_kib: int, causal: bool) -> tuple[int, int]:
    tiled = attention_io_bytes(N, D, m_kib * KiB, method="tiled", causal=causal)
    explicit = attention_io_bytes(N, D, m_kib * KiB, method="explicit", causal=causal)
    return tiled, explicit


def test_io_comparison_with_and_without_the_causal_mask(text):
    assert D * D * 4 == 16 * KiB and 48 * KiB == 3 * D * D * 4  # "d² is 16 KiB", "48 KiB — only 3 d²"
    stated(text, "16 KiB", "3 d²", "M ≫ d²")
    verdicts = {}
    for m in FAST_MEMORIES:
        for causal in (True, False):
            tiled, explicit = _io(m, causal)
            verdicts[m, causal] = "more" if tiled > explicit else "fewer"
            stated(text, f"{max(tiled, explicit) / min(tiled, explicit):.2f}x")
    assert len(verdicts) == 6
    # without a mask tiling moves MORE bytes at M = 3 d², fewer above; with the mask always fewer
    assert [verdicts[m, False] for m in FAST_MEMORIES] == ["more", "fewer", "fewer"]
    assert all(verdicts[m, True] == "fewer" for m in FAST_MEMORIES)
    tiled, explicit = _io(48, False)
    stated(text, {"en": f"**{tiled / explicit:.2f}x more**", "zh": f"**多 {tiled / explicit:.2f}x**"})
    # the causal columns win by more than the no-mask ones at every M: the mask's two effects
    assert all(_io(m, True)[1] / _io(m, True)[0] > _io(m, False)[1] / _io(m, False)[0] for m in FAST_MEMORIES)


def test_the_small_fast_memory_makes_many_passes(text):
    bq, bk = tiled_io_blocks(N, D, 48 * KiB)
    assert bk == D
    stated(text, {"en": f"query blocks of {bq} rows make {math.ceil(N / bq)} passes",
                  "zh": f"{bq} 行的查询块要把 `K` 和 `V` 遍历 {math.ceil(N / bq)} 遍"})


def test_all_of_q_fits_one_block_only_at_the_largest_memory_and_shortest_n(text):
    whole = [(m, n) for m in FAST_MEMORIES for n in NS if tiled_io_blocks(n, D, m * KiB)[0] == n]
    assert len(whole) == 1
    [(m, n)] = whole
    stated(text, {"en": f"one point of the plot: M = {m} KiB at N = {n}", "zh": f"图上只有一个点满足它：M = {m} KiB、N = {n}"})


def test_causal_tile_counts_and_flops(text):
    q, k, v = (torch.randn(1, 2, 1024, 32) for _ in range(3))  # section 4's call
    _, stats = tinytf.tiled_attention(q, k, v, is_causal=True, block_q=64, block_k=64, return_stats=True)
    with FlopCounterMode(display=False) as tiled:
        tinytf.tiled_attention(q, k, v, is_causal=True, block_q=64, block_k=64)
    with FlopCounterMode(display=False) as explicit:
        tinytf.scaled_dot_product_attention(q, k, v, is_causal=True)
    share = Fraction(tiled.get_total_flops(), explicit.get_total_flops())
    assert share == Fraction(stats.computed, stats.total)
    stated(text, f"{share.numerator}/{share.denominator} = {float(share):.4f}", f"{share.numerator}/{share.denominator}")
    stated(text, {"en": f"{stats.computed} of the {stats.total} tiles", "zh": f"{stats.total} 块中计算了 {stats.computed} 块"},
           {"en": f"{stats.computed} of {stats.total} at `T = 1024`", "zh": f"{stats.total} 块中的 {stats.computed} 块"})


def test_check_yourself_tile_count(text):
    q, k, v = (torch.randn(1, 1, 2048, 4) for _ in range(3))
    _, stats = tinytf.tiled_attention(q, k, v, is_causal=True, block_q=128, block_k=128, return_stats=True)
    stated(text, f"`16 · 17 / 2 = {stats.computed}`", f"`256 - {stats.computed} = {stats.skipped}`")


def test_rescale_factors_of_section_2_and_the_stepper_row(text):
    g = torch.Generator().manual_seed(2)  # section 2's row
    scores = torch.randn(12, generator=g, dtype=torch.float64) * 3
    running = torch.cummax(scores.view(3, 4).amax(1), 0).values
    factors = torch.exp(torch.cat([torch.tensor([-math.inf], dtype=torch.float64), running[:-1]]) - running)
    assert factors[0] == 0 and bool((factors[1:] < 1).all())  # the maximum rises in every tile
    stated(text, *(f"{f:.4f}" for f in factors.tolist()))
    m = online_softmax_trace(37, T=64, block_k=8, causal=True).m  # section 9's row
    assert len(m) == 5 and m[-4] < m[-3] == m[-2] == m[-1]  # the last three tiles leave m alone: factor 1
    stated(text, f"m = {m[-1].item():.3f}")


def _python_calls(events) -> int:
    return sum(e.name.startswith("aten::") and not (e.cpu_parent and e.cpu_parent.name.startswith("aten::")) for e in events)


def test_fused_cpu_kernel_scratch_and_operator_calls_at_t1024(text):
    q, k, v = (torch.randn(1, 4, 1024, 64) for _ in range(3))  # section 6's largest fast-mode call
    with tinytf.one_thread(), torch.no_grad():
        with PeakMemoryMeter() as fused_meter:
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
        with PeakMemoryMeter() as tiled_meter:
            tinytf.tiled_attention(q, k, v, is_causal=True, block_q=64, block_k=64)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as fused_prof:
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
        with profile(activities=[ProfilerActivity.CPU]) as tiled_prof:
            _, stats = tinytf.tiled_attention(q, k, v, is_causal=True, block_q=64, block_k=64, return_stats=True)
    [call] = [e for e in fused_prof.events() if e.name == "aten::scaled_dot_product_attention"]
    inside, todo = [], [call]
    while todo:
        e = todo.pop()
        inside.append(e)
        todo += e.cpu_children
    allocated = sum(max(e.self_cpu_memory_usage, 0) for e in inside)
    assert fused_meter.peak == 1024 * 4 * 64 * 4 + 1024 * 4 * 4  # the meter sees the kernel's outputs: out and lse
    assert allocated > fused_meter.peak  # scratch the meter cannot see ...
    assert allocated >= tiled_meter.peak  # ... bringing the fused kernel to at least the tiled peak, even on one thread
    stated(text, "T = 1024", {"en": "registers and shared memory", "zh": "寄存器和共享内存"})
    per_tile = _python_calls(tiled_prof.events()) / stats.computed
    assert _python_calls(fused_prof.events()) == 1 and 18 <= per_tile <= 22, per_tile
    stated(text, {"en": "about 20 operator calls per tile", "zh": "大约 20 次算子调用"},
           {"en": f"{stats.computed} tiles at `T = 1024`", "zh": f"`T = 1024` 时共 {stats.computed} 块"})


def _fused_scratch(q, k, v, threads: int) -> int:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
    finally:
        torch.set_num_threads(before)
    [kernel] = [e for e in prof.events() if e.name.startswith("aten::_scaled_dot_product_flash_attention")]
    return -kernel.self_cpu_memory_usage  # allocated and freed inside the kernel itself


def test_fused_cpu_scratch_is_per_thread(text):
    q, k, v = (torch.randn(1, 4, 1024, 64) for _ in range(3))
    one, two = _fused_scratch(q, k, v, 1), _fused_scratch(q, k, v, 2)
    assert one > 0 and two == 2 * one
    stated(text, {"en": "buffers per thread", "zh": "按线程分配"})


def test_block_sweep_numbers(text):
    def entries(t: int, b: int) -> int:
        n = -(-t // b)
        return n * (n + 1) // 2 * b * b

    extra = entries(1024, 256) / entries(1024, 128) - 1
    stated(text, f"{extra:.0%}".replace("%", " %"))
    ws64 = tiled_working_set(1, 4, 1024, 64, torch.float32, 64)
    ws256 = tiled_working_set(1, 4, 1024, 64, torch.float32, 256)
    assert ws64 == tiled_working_set(1, 4, 4096, 64, torch.float32, 64)  # the same at every T >= block
    stated(text, f"{ws64 / KiB:.0f} KiB", format_bytes(ws256))


def test_references_cited(text):
    stated(text, "arXiv:1805.02867", "arXiv:2205.14135", "arXiv:2307.08691", "§3.1", "228 KiB", "164 KiB")


def test_flash_attention_versions_loop_orders(text):
    # FlashAttention-1's backward (Algorithm 4) is already key/value-outer; FlashAttention-2 moved the forward's loop
    stated(text, "Algorithm 4", "B_r = min(⌈M/4d⌉, d)", "B_c = ⌈M/4d⌉",
           {"en": "is FlashAttention-1's already", "zh": "在 FlashAttention-1 里就已经是这样"},
           {"en": "**query blocks in the outer loop**", "zh": "**查询块放在外层循环**"})
    assert "and its backward puts the **key/value blocks in the outer loop**" not in text["en"]
    assert "它的反向把**键/值块放在外层循环**" not in text["zh"]
    assert "the key/value-blocks-outer backward.\n" not in text["en"] and "键/值块在外层的反向。" not in text["zh"]
    # tinytf's IO model: the block that streams past is the one bounded by d (FlashAttention-1 bounds its query block)
    doc = tiled_io_blocks.__doc__
    assert "B_r = min(⌈M/4d⌉, d)" in doc and "As in the FlashAttention paper the other block" not in doc
    for m_kib in FAST_MEMORIES:
        bq, bk = tiled_io_blocks(N, D, m_kib * KiB)
        assert bk == min(D, N) and bq >= 1  # the streamed key block is bounded by d; the reused query block takes the rest
