"""tinytf.checks.rope and tinytf.checks.positions: chapter 13's pitfalls (30-36) named from what the code returns,
with a fix that fits; the right code and tinytf's own functions pass."""

from __future__ import annotations

import torch

from tinytf.alibi import alibi_bias, alibi_slopes
from tinytf.checks import (
    CATALOG,
    Pitfall,
    diagnose_alibi,
    diagnose_padded_positions,
    diagnose_rope,
    diagnose_rope_decode,
    glance_table,
)
from tinytf.checks.rope import reference_rope, reference_rope_decode
from tinytf.masks import padded_positions

CHAPTER13 = [p for p, e in CATALOG.items() if e.section.startswith("13_")]


def _pitfalls(findings) -> list[Pitfall]:
    return [f.pitfall for f in findings]


def test_the_catalog_has_chapter_13s_seven_in_the_reserved_numbers():
    assert len(CHAPTER13) == 7 and {int(p) for p in CHAPTER13} == set(range(30, 37))
    en, zh = glance_table("en", chapter="13"), glance_table("zh", chapter="13")
    assert len(en.splitlines()) == 2 + 7 == len(zh.splitlines())
    everything = glance_table("en", chapter=None).splitlines()
    assert len(everything) == 2 + len(CATALOG) - 1 and any(line.startswith("| 36 |") for line in everything)


def test_diagnose_rope():
    assert diagnose_rope(lambda x, pos: reference_rope(x, pos)) == []
    cases = {Pitfall.ROPE_LAYOUT: lambda x, pos: reference_rope(x, pos, layout="interleaved"),
             Pitfall.LOW_PRECISION_ANGLES: lambda x, pos: reference_rope(x, pos, angle_dtype=torch.bfloat16),
             Pitfall.DECODE_AT_ZERO: lambda x, pos: reference_rope(x, torch.arange(pos.numel()))}
    for pitfall, fn in cases.items():
        findings = diagnose_rope(fn)
        assert _pitfalls(findings) == [pitfall], (pitfall, findings)
        assert "Fix:" in findings[0].text
    fp16 = diagnose_rope(lambda x, pos: reference_rope(x, pos, angle_dtype=torch.float16))
    assert _pitfalls(fp16) == [Pitfall.LOW_PRECISION_ANGLES]
    [backwards] = diagnose_rope(lambda x, pos: reference_rope(x, pos, sign=-1.0))
    assert backwards.pitfall is Pitfall.GENERAL and "wrong way" in backwards.title and "float32" in backwards.fix
    [stub] = diagnose_rope(lambda x, pos: (_ for _ in ()).throw(NotImplementedError()))
    assert "not implemented yet" in stub.title


def test_diagnose_rope_decode():
    assert diagnose_rope_decode(reference_rope_decode) == []
    wrong = {Pitfall.ROPE_ON_V: {"rotate_v": True}, Pitfall.DECODE_AT_ZERO: {"q_at": 0, "k_at": 0},
             Pitfall.KEYS_ROTATED_TWICE: {"again": True}}
    for pitfall, kwargs in wrong.items():
        findings = diagnose_rope_decode(lambda *a, kw=kwargs: reference_rope_decode(*a, **kw))
        assert _pitfalls(findings) == [pitfall], (pitfall, findings)
    [raw] = diagnose_rope_decode(lambda *a: reference_rope_decode(*a, store_raw=True))
    assert raw.pitfall is Pitfall.KEYS_ROTATED_TWICE and "before they are rotated" in raw.title
    [query] = diagnose_rope_decode(lambda *a: reference_rope_decode(*a, q_at=0))
    assert query.pitfall is Pitfall.DECODE_AT_ZERO and "query" in query.title


def test_diagnose_alibi():
    def right(h: int, tq: int, tk: int) -> torch.Tensor:
        return alibi_bias(alibi_slopes(h), torch.arange(tk - tq, tk), torch.arange(tk))

    assert diagnose_alibi(right) == []
    [f] = diagnose_alibi(lambda h, tq, tk: -right(h, tq, tk))
    assert f.pitfall is Pitfall.ALIBI_BIAS and "rewards distance" in f.title
    [f] = diagnose_alibi(lambda h, tq, tk: alibi_bias(alibi_slopes(h), torch.arange(tq), torch.arange(tk)))
    assert "aligned to the start" in f.title and "Wrong" in f.message  # square probes cannot show it
    [f] = diagnose_alibi(lambda h, tq, tk: alibi_bias(alibi_slopes(h).flip(0), torch.arange(tk - tq, tk), torch.arange(tk)))
    assert "wrong way" in f.title


def test_diagnose_padded_positions():
    assert diagnose_padded_positions(padded_positions) == []
    [f] = diagnose_padded_positions(lambda lengths, t: torch.arange(t).expand(len(lengths), t))
    assert f.pitfall is Pitfall.LEFT_PAD_OFFSET and "counted from the pads" in f.title
    [f] = diagnose_padded_positions(lambda lengths, t: padded_positions(lengths, t) + 1)
    assert f.pitfall is Pitfall.GENERAL and "start at 1" in f.title


def test_the_findings_speak_chinese(monkeypatch):
    import re

    monkeypatch.setenv("TINYTF_LANG", "zh")
    findings = (diagnose_rope(lambda x, pos: reference_rope(x, pos, layout="interleaved"))
                + diagnose_rope_decode(lambda *a: reference_rope_decode(*a, again=True))
                + diagnose_padded_positions(lambda lengths, t: torch.arange(t).expand(len(lengths), t))
                + diagnose_alibi(lambda h, tq, tk: -alibi_bias(alibi_slopes(h), torch.arange(tk - tq, tk), torch.arange(tk))))
    assert len(findings) == 4
    for f in findings:
        assert re.search("[\u4e00-\u9fff]", f.title) and re.search("[\u4e00-\u9fff]", f.text), f
        assert "修正" in f.text or "修复" in f.text or "Fix" not in f.text
