"""Chapter 14's pitfalls (40-44): each detector names its mistake on code that makes it, stays quiet on code that
does not, and says a fix that fits what it found; the catalog lists them for chapter 14, chapter 08 and the book."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from _diagnoses import pitfalls

import tinytf
from tinytf.checks import (
    CATALOG,
    Pitfall,
    catalog_markdown,
    chapters_with_pitfalls,
    diagnose_grad_underflow,
    diagnose_half_attention,
    diagnose_masked_rows,
    diagnose_timings,
    glance_table,
    report,
)

ROOT = Path(__file__).resolve().parents[1]
CHAPTER_14 = [Pitfall.UNSCALED_HALF_SCORES, Pitfall.HALF_SOFTMAX_NO_MAX, Pitfall.EMPTY_ROW_INF_MASK, Pitfall.FP16_NO_GRAD_SCALER,
              Pitfall.COMPILED_FIRST_CALL]


def scaled_after(q, k, v):  # the article's formula: the product first, then 1/sqrt(d)
    return ((q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))).softmax(-1) @ v


def no_max(q, k, v):
    s = (q / math.sqrt(q.size(-1))) @ k.transpose(-2, -1)
    e = s.exp()
    return (e / e.sum(-1, keepdim=True)) @ v


def inf_mask(q, k, v, allowed):
    s = (q / math.sqrt(q.size(-1))) @ k.transpose(-2, -1)
    return (s + torch.zeros(allowed.shape, dtype=s.dtype).masked_fill(~allowed, float("-inf"))).softmax(-1) @ v


def min_mask(q, k, v, allowed):
    s = (q / math.sqrt(q.size(-1))) @ k.transpose(-2, -1)
    return s.masked_fill(~allowed, torch.finfo(s.dtype).min).softmax(-1) @ v


@pytest.mark.parametrize("attn,pitfall", [(scaled_after, Pitfall.UNSCALED_HALF_SCORES), (no_max, Pitfall.HALF_SOFTMAX_NO_MAX),
                                          (tinytf.scaled_dot_product_attention, Pitfall.UNSCALED_HALF_SCORES)])
def test_half_attention_names_what_overflows(attn, pitfall):
    findings = diagnose_half_attention(attn)
    assert pitfalls(findings) == {pitfall}, report(findings)
    text = report(findings)
    assert ("65504" in text) if pitfall is Pitfall.UNSCALED_HALF_SCORES else ("11.09" in text)
    assert "Fix:" in text


@pytest.mark.parametrize("attn", [F.scaled_dot_product_attention, tinytf.tiled_attention])
def test_half_attention_passes_attention_that_scales_q_first(attn):
    assert diagnose_half_attention(attn) == []


def test_half_attention_reports_a_crash():
    def broken(q, k, v):
        raise NotImplementedError

    [f] = diagnose_half_attention(broken)
    assert f.pitfall is Pitfall.GENERAL and "not implemented" in f.title


def test_masked_rows_names_nan_and_the_finfo_min_variant_with_their_own_fixes():
    [nan] = diagnose_masked_rows(inf_mask)
    assert nan.pitfall is Pitfall.EMPTY_ROW_INF_MASK and "NaN gradients for k, v" in nan.message
    [uniform] = diagnose_masked_rows(min_mask)
    assert uniform.pitfall is Pitfall.EMPTY_ROW_INF_MASK and "mean of all values" in uniform.message
    assert uniform.fix and uniform.fix != nan.fix and "at least itself" in uniform.text
    assert diagnose_masked_rows(tinytf.scaled_dot_product_attention) == []
    assert diagnose_masked_rows(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)) == []
    assert diagnose_masked_rows(lambda q, k, v, m: tinytf.tiled_attention(q, k, v, m, block_q=2, block_k=4)) == []


def test_grad_underflow_is_named_only_when_scaling_would_save_gradients():
    model = torch.nn.Linear(4, 1, bias=False)
    x = torch.ones(3, 4)
    [f] = diagnose_grad_underflow(model, lambda m: m(x).float().sum() * 1e-9)
    assert f.pitfall is Pitfall.FP16_NO_GRAD_SCALER and "4 of 4 gradient entries" in f.message and "GradScaler" in f.text
    assert "bf16" in f.text  # on the CPU bf16 is the other way out
    assert diagnose_grad_underflow(model, lambda m: m(x).float().sum()) == []
    assert diagnose_grad_underflow(model, lambda m: m(x).float().sum() * 1e-9, dtype=torch.bfloat16) == []


def test_timings_name_the_compile_the_cold_start_and_a_recompile():
    [f] = diagnose_timings([21000.0, 5.0, 5.2, 4.9], compiled=True)
    assert f.pitfall is Pitfall.COMPILED_FIRST_CALL and "call 1 took 21,000.0 ms" in f.message
    [cold] = diagnose_timings([210.0, 5.0, 5.2, 4.9])
    assert cold.pitfall is Pitfall.COLD_TIMING
    [again] = diagnose_timings([5.0, 5.1, 900.0, 4.9], compiled=True)
    assert again.pitfall is Pitfall.COMPILED_FIRST_CALL and "recompilation" in again.message and "dynamic=True" in again.text
    assert diagnose_timings([5.0, 5.1, 6.0, 4.9], compiled=True) == []
    with pytest.raises(ValueError, match="at least 3"):
        diagnose_timings([1.0, 2.0])


def test_the_catalog_has_chapter_14s_five_in_both_languages():
    assert [int(p) for p in CHAPTER_14] == [40, 41, 42, 43, 44]
    for p in CHAPTER_14:
        e = CATALOG[p]
        assert e.section.startswith("14_precision_and_profiling.ipynb § ") and "diagnose_" in e.detector
        assert all(re.search("[\u4e00-\u9fff]", s) for s in (e.title_zh, e.symptom_zh, e.fix_zh)), p
    for lang in ("en", "zh"):
        rows = [int(r.split("|")[1]) for r in glance_table(lang, chapter="14").splitlines()[2:]]
        assert rows == [int(p) for p in CHAPTER_14]


def test_catalog_markdown_lists_every_chapter_and_chapter_08_and_the_book_show_it():
    chapters = chapters_with_pitfalls()
    assert chapters[0] == "08" and "14" in chapters
    later = catalog_markdown("en", after="08")
    assert "`08_pitfalls.ipynb`" not in later and all(f"### Chapter {c}:" in later for c in chapters[1:])
    numbers = {int(m) for m in re.findall(r"^\| (\d+) \|", later, re.M)}
    assert numbers == {int(p) for p, e in CATALOG.items() if p and not e.section.startswith("08_")}
    assert "### 第 14 章" in catalog_markdown("zh")
    for folder in ("notebooks", "notebooks/zh"):
        cells = json.loads((ROOT / folder / "08_pitfalls.ipynb").read_text(encoding="utf-8"))["cells"]
        assert any('catalog_markdown(after="08")' in "".join(c["source"]) for c in cells if c["cell_type"] == "code"), folder
    books = sorted((ROOT / "tinytf" / "course").rglob("book.py"))  # wherever the course tooling keeps it
    assert len(books) == 1 and "catalog_markdown(" in books[0].read_text(encoding="utf-8")
