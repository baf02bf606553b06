"""``Finding``'s own fix: printed (in English and Chinese) instead of the catalog's, which stays the fallback."""

from __future__ import annotations

import json
import math

import torch
from torch import nn

import tinytf
from tinytf.checks import Finding, Pitfall, found, report
from tinytf.course.check.report import finding_lines
from tinytf.course.check.selfcheck import finding_json
from tinytf.course.exercises import REPO
from tinytf.course.reference import ex05, ex07
from tinytf.translation import _


def _lines(f: Finding, lang: str) -> list[str]:
    return finding_lines(json.loads(json.dumps(finding_json(f))), lang)  # as validate reads it back


def test_found_with_its_own_fix_says_that_fix_not_the_catalogs(monkeypatch):
    f = found(Pitfall.CAUSAL_OFF_BY_ONE, "t", "evidence.", fix="use causal_mask(t, past + t)")
    assert f.fix == "use causal_mask(t, past + t)" and f.message.endswith("Fix: use causal_mask(t, past + t).")
    assert "tril" not in f.message
    en = _lines(f, "en")
    assert len(en) == 3 and en[1].strip() == "evidence." and en[2].strip() == "Fix: use causal_mask(t, past + t)"
    monkeypatch.setenv("TINYTF_LANG", "zh")  # a Chinese kernel: its own fix comes from the one catalog, like its title
    g = found(Pitfall.CAUSAL_OFF_BY_ONE, "t", "evidence.", fix=_("call diagnose_block(factory, dim=D)"))
    zh = _lines(g, "zh")
    assert g.fix == "调用 diagnose_block(factory, dim=D)" and g.message.endswith("修复：调用 diagnose_block(factory, dim=D)。")
    assert zh[-1].strip() == "修复：调用 diagnose_block(factory, dim=D)" and "tril" not in "\n".join(zh)


def test_without_its_own_fix_the_catalogs_fix_is_the_fallback():
    f = found(Pitfall.CAUSAL_OFF_BY_ONE, "t", "evidence.")
    assert f.fix == "" and "fix" not in finding_json(f)
    assert _lines(f, "en")[-1].strip() == f"evidence. Fix: {Pitfall.CAUSAL_OFF_BY_ONE.fix.replace('`', '')}."
    assert _lines(f, "zh")[-1].strip() == f"修复：{Pitfall.CAUSAL_OFF_BY_ONE.entry.fix_zh}"
    general = Finding(Pitfall.GENERAL, "t", "read this.")
    assert _lines(general, "zh")[-1].strip() == "证据：read this." and len(_lines(general, "en")) == 2


def test_an_own_fix_without_chinese_is_printed_as_written():
    f = Finding(Pitfall.SCALE, "t", "evidence.", fix="divide by sqrt(d)")
    assert _lines(f, "zh")[-1].strip() == "修复：divide by sqrt(d)"
    assert str(f).endswith("evidence. Fix: divide by sqrt(d).") and report([f]).endswith("evidence. Fix: divide by sqrt(d).")
    assert found(Pitfall.SCALE, "t", "e.", fix="x").text.count("Fix:") == 1  # stated once, not twice


def _step(aligned: str):
    def attention_step(attn, x_new, cache, layer=0):
        b, t, dim = x_new.shape
        q, k, v = (z.view(b, t, attn.heads, attn.head_dim).transpose(1, 2) for z in attn.qkv(x_new).chunk(3, dim=-1))
        k_all, v_all = cache.update(layer, k, v)
        if aligned == "sdpa":  # is_causal on the cached keys: a START-aligned (top-left) mask
            out = torch.nn.functional.scaled_dot_product_attention(q, k_all, v_all, is_causal=True)
        else:
            scores = q @ k_all.transpose(-2, -1) / math.sqrt(attn.head_dim)
            out = scores.masked_fill(~tinytf.causal_mask(t, k_all.size(2)), float("-inf")).softmax(-1) @ v_all
        return attn.proj(out.transpose(1, 2).reshape(b, t, dim))

    return attention_step


def test_a_start_aligned_decode_mask_is_told_the_end_aligned_fix_not_the_square_tril(monkeypatch):
    findings = ex07._diagnose_step(_step("sdpa"))
    assert [f.pitfall for f in findings] == [Pitfall.CAUSAL_OFF_BY_ONE] and "START-aligned" in findings[0].message
    assert "causal_mask(t, past + t)" in findings[0].fix and "END-aligned" in findings[0].fix
    monkeypatch.setenv("TINYTF_LANG", "zh")  # the Chinese notebook's diagnosis says the same fix in Chinese
    zh = ex07._diagnose_step(_step("sdpa"))
    assert "causal_mask(t, past + t)" in zh[0].fix and "末尾对齐" in zh[0].fix and "END-aligned" not in zh[0].fix
    for lang, f in (("en", findings[0]), ("zh", zh[0])):
        text = "\n".join(_lines(f, lang))
        assert "causal_mask(t, past + t)" in text.splitlines()[-1] and "ones(T, T).tril()" not in text, text
    monkeypatch.delenv("TINYTF_LANG")
    assert ex07._diagnose_step(_step("end")) == []  # the fix applied: the finding disappears


def _ex05_namespace() -> dict:
    nb = json.loads((REPO / "solutions" / "ex05_cross_attention.ipynb").read_text(encoding="utf-8"))
    cells = [c for c in nb["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "ex05_model"]
    assert len(cells) == 1
    ns: dict = {"torch": torch, "nn": nn, "tinytf": tinytf}
    exec("".join(cells[0]["source"]), ns)  # noqa: S102 - the course's own model cell
    return ns


def _probe(clone: bool):
    def probe_encoder_decoder(model, src, tgt, lengths):
        real = torch.arange(src.size(1))[None, :] < lengths[:, None]  # [B, Tk]
        with torch.no_grad():
            base = model(src, tgt, lengths)
            changed = src.clone() if clone else src
            changed[real] = torch.randn_like(changed[real])
            effect = (model(changed, tgt, lengths) - base).abs().max()
            changed = src.clone() if clone else changed
            changed[~real] = torch.randn_like(changed[~real])
            leak = (model(changed, tgt, lengths) - base).abs().max()
        return {"encoder_effect": float(effect), "padding_leak": float(leak)}

    return probe_encoder_decoder


def test_a_probe_that_writes_into_src_is_a_problem_of_the_probe_fixed_by_a_clone():
    ns = _ex05_namespace()
    findings = ex05._diagnose_probe(_probe(clone=False), ns)
    assert [f.pitfall for f in findings] == [Pitfall.GENERAL], findings  # no pitfall 3: the model is correct
    assert "src" in findings[0].title and findings[0].fix.startswith("clone the input before changing it")
    for lang in ("en", "zh"):
        text = "\n".join(_lines(findings[0], lang))
        assert "masked_fill" not in text and ("clone" in text.splitlines()[-1] or "克隆" in text.splitlines()[-1]), text
    assert ex05._diagnose_probe(_probe(clone=True), ns) == []  # the fix applied: the finding disappears


def test_relation_names_a_clean_ratio_or_an_off_by_one():
    from tinytf.checks.findings import relation, shape_relation, tensor_relation

    assert relation(107692032, 215384064, suspects={"dtype_bytes=4 looks ignored": 0.5}) == (
        "exactly half the right value: dtype_bytes=4 looks ignored")
    assert relation(6, 5, step=("tile", 1)) == "one tile more than the right value (off by one)"
    assert relation(4, 5) == "one less than the right value (off by one)"
    assert relation(12, 4) == "exactly 3× the right value" and relation(30, 40) == "exactly 3/4 of the right value"
    assert relation(7, 13) == "" and relation(5, 5) == "" and relation(1, 0) == ""  # no clean relation, or nothing wrong
    assert relation(1 / 8, 1 / math.sqrt(8)) == "exactly 1/sqrt(8) = 1/2.83 of the right value"
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    assert tensor_relation(x * 2, x, suspects={"counted twice": 2}) == "exactly twice the right value: counted twice"
    assert tensor_relation(x + 1, x) == "" and tensor_relation(x[:2], x) == ""  # not one factor; another shape
    assert tensor_relation(x * 1.00005, x) == ""  # the same values to float rounding: nothing to name
    assert shape_relation([2, 6, 4], [2, 5, 4], ["B", "Tq", "d"]) == "dim 1 (Tq) has one more (6) than it should (5)"
    assert shape_relation([3, 2], [2, 3]) == "" and shape_relation([2, 7], [2, 5]) == ""  # transposed; two off


def test_the_ex05_judge_rejects_a_probe_that_changed_its_inputs():
    from tinytf.course.reference.judging import run_judge

    ns = _ex05_namespace()
    value, inputs = ex05._probe_encdec({**ns, "probe_encoder_decoder": _probe(clone=True)}, torch.Generator().manual_seed(1))
    assert run_judge("ex05_encdec", value, inputs) == (True, "ok")
    edited = {**inputs["after"], "src": inputs["after"]["src"] + 1}
    ok, why = run_judge("ex05_encdec", value, {**inputs, "after": edited})
    assert not ok and why.startswith("probe_encoder_decoder changed its input src") and "clone the input" in why, why
