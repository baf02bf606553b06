"""Chapter 14 (precision and profiling) states numbers in its prose; each is recomputed here from tinytf and must
still be stated, in both editions. The machine-dependent ones (times, the compile ratio, the GradScaler count)
are printed by the chapter, not stated; their ingredients are tested in test_profiling, test_compiled and
test_mixed_precision."""

from __future__ import annotations

import math
import re

import pytest
import torch
from _claims import code_cell, prose, stated

from tinytf import precision
from tinytf.checks import Pitfall, glance_table
from tinytf.viz.precision import predicted_boundaries

CHAPTER = "14_precision_and_profiling.ipynb"


@pytest.fixture(scope="module")
def text() -> dict[str, str]:
    return prose(CHAPTER)


def test_the_formats(text):
    fp32, bf16, fp16 = precision.formats()
    assert (fp16.max, fp16.eps, bf16.eps) == (65504.0, 2**-10, 2**-7) and bf16.exponent_bits == fp32.exponent_bits == 8
    subnormal, big = f"`{fp16.smallest_subnormal:.0e}`".replace("e-08", "e-8"), f"`{bf16.max:.1e}`".replace("e+38", "e38")
    stated(text, "**65504**", f"`eps = 2⁻⁷ ≈ {bf16.eps:.4f}`", f"`eps = 2⁻¹⁰ ≈ {fp16.eps:.5f}`", subnormal, big,
           f"`{fp16.eps / 2:.5f}`", f"`{bf16.eps / 2:.4f}`")
    assert torch.tensor(257.0).bfloat16().item() == 256  # "bf16 cannot tell 257 from 256"
    stated(text, "257")


def test_the_score_thresholds_at_d_64(text):
    after, before = precision.score_overflow(64, scaling="after"), precision.score_overflow(64, scaling="before")
    assert precision.score_overflow(64, scaling="none").found == after.found
    stated(text, {"en": f"`σ = {after.found:.1f}` at `d = 64`", "zh": f"`d = 64` 时 `σ = {after.found:.1f}`"},
           f"`σ = {before.found:.0f}`", f"`d^(1/4) = {64 ** 0.25:.2f}`")
    wide = precision.score_overflow(128, scaling="after"), precision.score_overflow(128, scaling="before")
    stated(text, f"`σ = {wide[0].found:.0f}`", f"`σ = {round(wide[1].found, -1):.0f}`")  # the Check-yourself answer at d = 128


def test_the_softmax_thresholds(text):
    th = precision.softmax_overflow(torch.float16)
    stated(text, f"**{th.found:.2f}**", f"`ln(65520 / T) = {math.log(65520 / 256):.2f}`", f"{math.log(0.99 * 255 / 0.01):.1f}",
           f"{precision.softmax_overflow('bf16').predicted:.1f}")
    ratio = math.sqrt(math.log(precision.overflow_limit("bf16")) / math.log(precision.overflow_limit("fp16")))
    stated(text, {"en": f"about {ratio:.1f}\ntimes smaller".replace("\n", " "), "zh": f"小约 {ratio:.1f} 倍"})


def test_the_accumulation_errors(text):
    short, long = precision.accumulation_errors([64, 4096])
    stated(text, {"en": f"{short.normaliser_low:.1%} off at `T = 64` and {long.normaliser_low:.0%} at `T = 4096`",
                  "zh": f"`T = 64` 时偏差 {short.normaliser_low:.1%}，`T = 4096` 时偏差 {long.normaliser_low:.0%}"},
           f"`{10 ** round(math.log10(long.normaliser_fp32)):.0e}`".replace("e-04", "e-4"))
    assert long.normaliser_fp32 < short.normaliser_fp32  # "its error shrinks with T"
    assert [precision.accumulate(torch.ones(1, 5000), d).item() for d in ("bf16", "fp16")] == [256, 2048]


def test_the_widget_boundary(text):
    scores, _ = predicted_boundaries("fp16", [16, 32, 64, 128, 256], "before", 128)
    assert all(abs(s / 120 - 1) < 0.1 for s in scores)  # q scaled first and the max subtracted: fp16 lasts to σ ≈ 120
    stated(text, "`σ ≈ 120`")


def test_the_chapter_runs_fast_and_names_its_pitfalls(text):
    cell = code_cell(CHAPTER, "c14-params")
    assert "fast = True" in __import__("ast").unparse(cell)
    rows = [int(r.split("|")[1]) for r in glance_table("en", chapter="14").splitlines()[2:]]
    assert rows == [int(p) for p in (Pitfall.UNSCALED_HALF_SCORES, Pitfall.HALF_SOFTMAX_NO_MAX, Pitfall.EMPTY_ROW_INF_MASK,
                                     Pitfall.FP16_NO_GRAD_SCALER, Pitfall.COMPILED_FIRST_CALL)]
    stated(text, {"en": "pitfall 43", "zh": "陷阱 43"}, {"en": "pitfall 44", "zh": "陷阱 44"})


def test_references_cited(text):
    stated(text, "*Mixed Precision Training*", "*LLM.int8()*", "*Scaling Vision Transformers to 22 Billion Parameters*", "*PyTorch 2*")


def test_check_yourself_names_only_ops_the_dtype_table_lists(text):
    """Check-yourself question 5 reads the autocast dtype table of section 6: it may name only the operations that
    table lists (``tinytf.profiling.COMPUTE_OPS``: the ops that do the arithmetic, ``aten::addmm`` but not the
    ``aten::linear`` that calls it)."""
    from tinytf.profiling import COMPUTE_OPS

    assert "aten::addmm" in COMPUTE_OPS and "aten::linear" not in COMPUTE_OPS
    for lang, prose_text in text.items():
        quiz = prose_text[prose_text.index("## Check yourself" if lang == "en" else "## 自我检测"):]
        named = set(re.findall(r"aten::\w+", quiz))
        assert named and named <= set(COMPUTE_OPS), (lang, named - set(COMPUTE_OPS))
