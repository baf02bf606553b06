"""tinytf.checks' grouped-query and sliding-window diagnoses: silent on correct code, and each chapter-11
pitfall named on code written the way students write it (one wrong implementation per mistake)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _diagnoses import pitfalls

import tinytf
from tinytf.checks import CATALOG, Pitfall, diagnose_expand_kv, diagnose_kv_grouping, diagnose_window, glance_table, report
from tinytf.checks.grouped import interleaved, tiled_heads

# ---- K/V head sharing ------------------------------------------------------------------------------

def expand_right(kv, heads):
    return kv.repeat_interleave(heads // kv.size(1), dim=1)


def expand_tiled(kv, heads):
    return kv.repeat(1, heads // kv.size(1), 1, 1)  # k0 k1 k0 k1: query head h meets K/V head h % kv_heads


def expand_time_axis(kv, heads):
    return kv.repeat_interleave(heads // kv.size(1), dim=2)


def expand_first_head(kv, heads):
    return kv[:, :1].expand(-1, heads, -1, -1)  # every query head reads K/V head 0


def grouped_right(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def grouped_with(expand, scale=None):
    def grouped(q, k, v):
        heads = q.size(1)
        return F.scaled_dot_product_attention(q, expand(k, heads), expand(v, heads), scale=scale)

    return grouped


def test_the_two_mappings_agree_only_at_the_ends():
    assert interleaved(4, 2) == [0, 0, 1, 1] and tiled_heads(4, 2) == [0, 1, 0, 1]
    assert interleaved(4, 1) == tiled_heads(4, 1) and interleaved(4, 4) == tiled_heads(4, 4)
    assert interleaved(8, 2) == [tinytf.grouped.kv_head_of(h, 8, 2) for h in range(8)]


def test_correct_code_gets_no_finding():
    assert diagnose_expand_kv(expand_right) == []
    assert diagnose_expand_kv(lambda kv, heads: tinytf.repeat_kv(kv, heads // kv.size(1))) == []
    assert diagnose_kv_grouping(grouped_right) == []
    assert diagnose_kv_grouping(grouped_with(expand_right)) == []
    assert diagnose_kv_grouping(lambda q, k, v: (grouped_right(q, k, v), None)) == [], "(out, weights) is accepted"


def test_repeat_for_repeat_interleave_is_named_with_the_measured_heads():
    for findings in (diagnose_expand_kv(expand_tiled), diagnose_kv_grouping(grouped_with(expand_tiled))):
        assert pitfalls(findings) == {Pitfall.KV_GROUPING}, report(findings)
        text = report(findings)
        assert "[0, 1, 0, 1]" in text and "[0, 0, 1, 1]" in text, text
        assert "kv_heads = 1" in text and "right on the others" in text, "multi-query and multi-head cannot show it"
        assert CATALOG[Pitfall.KV_GROUPING].fix.replace("`", "") in text


def test_other_mistakes_are_told_apart():
    findings = diagnose_expand_kv(expand_time_axis)
    assert pitfalls(findings) == {Pitfall.GENERAL} and "dim=1" in report(findings), report(findings)
    findings = diagnose_expand_kv(expand_first_head)
    assert pitfalls(findings) == {Pitfall.KV_GROUPING} and "wrong K/V heads" in report(findings), report(findings)
    findings = diagnose_kv_grouping(grouped_with(expand_right, scale=1.0))
    assert pitfalls(findings) == {Pitfall.SCALE}, report(findings)

    def not_implemented(q, k, v):
        raise NotImplementedError

    assert "not implemented yet" in report(diagnose_kv_grouping(not_implemented))

    def ignores_groups(q, k, v):
        return F.scaled_dot_product_attention(q[:, : k.size(1)], k, v)

    findings = diagnose_kv_grouping(ignores_groups)
    assert pitfalls(findings) == {Pitfall.GENERAL} and "wrong shape" in report(findings), report(findings)


# ---- sliding windows --------------------------------------------------------------------------------

def _band(t_q, t_k, lo, hi, offset=None):
    offset = t_k - t_q if offset is None else offset
    j, p = torch.arange(t_k)[None, :], torch.arange(t_q)[:, None] + offset
    return (j >= p + lo) & (j <= p + hi)


def window_right(t_q, t_k, window):
    return _band(t_q, t_k, 1 - window, 0)


WRONG_WINDOWS = [
    (lambda tq, tk, w: _band(tq, tk, -w, 0), Pitfall.WINDOW_OFF_BY_ONE, "window + 1 keys"),
    (lambda tq, tk, w: _band(tq, tk, 2 - w, 0), Pitfall.WINDOW_OFF_BY_ONE, "window - 1 keys"),
    (lambda tq, tk, w: _band(tq, tk, -w, -1), Pitfall.CAUSAL_OFF_BY_ONE, "own key"),
    (lambda tq, tk, w: (torch.arange(tk)[None, :] - torch.arange(tq)[:, None] - (tk - tq)).abs() < w,
     Pitfall.CAUSAL_OFF_BY_ONE, "not causal"),
    (lambda tq, tk, w: _band(tq, tk, 1 - w, 0, offset=0), Pitfall.GENERAL, "aligned to the start"),
    (lambda tq, tk, w: tinytf.causal_mask(tq, tk), Pitfall.GENERAL, "ignored"),
]


def test_a_right_window_gets_no_finding():
    assert diagnose_window(window_right) == []
    assert diagnose_window(lambda tq, tk, w: tinytf.causal_mask(tq, tk, window=w)) == []


@pytest.mark.parametrize("fn,pitfall,words", WRONG_WINDOWS, ids=lambda x: x if isinstance(x, str) else "")
def test_window_mistakes_are_named_with_the_keys_each_query_sees(fn, pitfall, words):
    findings = diagnose_window(fn)
    text = report(findings)
    assert pitfalls(findings) == {pitfall} and words in text, text
    assert "Keys seen per query" in text, text


def test_a_window_off_by_one_on_some_sizes_only_says_which():
    def big_windows_only(t_q, t_k, window):
        return _band(t_q, t_k, -window, 0) if window >= 3 else window_right(t_q, t_k, window)

    findings = diagnose_window(big_windows_only)
    text = report(findings)
    assert pitfalls(findings) == {Pitfall.WINDOW_OFF_BY_ONE} and "right on the others" in text and "window=3" in text, text


def test_a_non_bool_or_misshapen_window_is_reported():
    assert "not boolean" in report(diagnose_window(lambda tq, tk, w: window_right(tq, tk, w).float()))
    assert "wrong window mask shape" in report(diagnose_window(lambda tq, tk, w: window_right(tk, tk, w)))


def test_chapter_11_has_its_own_glance_table():
    for lang in ("en", "zh"):
        rows = [int(r.split("|")[1]) for r in glance_table(lang, chapter="11").splitlines()[2:]]
        assert rows == [int(Pitfall.KV_GROUPING), int(Pitfall.WINDOW_OFF_BY_ONE)]
    assert all(CATALOG[p].section.startswith("11_smaller_kv_caches.ipynb § ") for p in (Pitfall.KV_GROUPING, Pitfall.WINDOW_OFF_BY_ONE))
