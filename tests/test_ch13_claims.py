"""Chapter 13 (positions) states numbers and facts in its prose; each is recomputed here from tinytf or torch (or
read from the chapter's own code) and must still be stated, in both editions. The measured claims are asserted by the
chapter's own cells, which CI executes."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch
from _claims import code_cell, editions, prose, stated

from tinytf.alibi import alibi_slopes

CHAPTER = "13_positions.ipynb"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def text() -> dict[str, str]:
    return prose(CHAPTER)


def _assigned(cell: str, name: str) -> ast.expr:
    found = [n.value for n in ast.walk(code_cell(CHAPTER, cell)) if isinstance(n, ast.Assign)
             and any(ast.unparse(t) == name for t in n.targets)]
    assert len(found) == 1, f"cell {cell} must assign {name} once"
    return found[0]


def test_the_spacing_of_low_precision_numbers_at_4096(text):
    spacing = {dtype: torch.finfo(dtype).eps * 4096 for dtype in (torch.bfloat16, torch.float16)}
    assert spacing == {torch.bfloat16: 32.0, torch.float16: 4.0}
    stated(text, {"en": "a spacing of 32, a float16 one of 4", "zh": "间距是 32，float16 的是 4"},
           {"en": "has a spacing of 32", "zh": "bfloat16 数的间距是 32"})


def test_the_extrapolation_setup(text):
    lengths = ast.literal_eval(ast.unparse(_assigned("c13-extrapolate", "(V_LAG, LAG, T_TRAIN, LENGTHS)")))
    vocab, lag, trained, evaluated = lengths
    assert (lag, trained, evaluated) == (1, 64, (64, 128, 256))
    cfg = ast.unparse(_assigned("c13-extrapolate", "lag_cfg"))
    assert "dim=32" in cfg and "heads=8" in cfg and "layers=1" in cfg
    s = evaluated[-1] // trained
    stated(text, {"en": "one layer, 8 heads, `D = 32`", "zh": "一层、8 个头、`D = 32`"}, f"`s = {s}`", f"{lag / s:g}",
           {"en": "rows 64–255 are never trained", "zh": "第 64–255 行从未被训练"}, "1,000")
    source = ast.unparse(code_cell(CHAPTER, "c13-extrapolate"))
    assert source.count("assert ") >= 4 and "rope + linear" in source  # the prose's claims, asserted by the chapter


def test_the_offsets_checked_for_rope(text):
    pairs = ast.literal_eval(ast.unparse(_assigned("c13-relative", "pairs")))
    assert pairs == [(7, 3), (1007, 1003), (10007, 10003), (3, 7)]
    stated(text, {"en": "positions 7, 1,007 and 10,007", "zh": "位置 7、1,007 和 10,007"})


def test_hugging_face_parity_positions_are_those_of_the_test(text):
    source = (ROOT / "tests" / "test_rope.py").read_text(encoding="utf-8")
    assert "torch.arange(200, 240)" in source and "LlamaRotaryEmbedding" in source and "apply_rotary_pos_emb" in source
    stated(text, {"en": "at positions 200–239", "zh": "在位置 200–239 上"})


def test_past_the_table_and_the_alibi_sizes(text):
    assert ast.unparse(_assigned("c13-past", "total")) == "4 * TRAINED"
    assert ast.literal_eval(ast.unparse(_assigned("c13-past", "(W, TRAINED)"))) == (16, 64)
    stated(text, {"en": "Four times `max_tokens`", "zh": "`max_tokens` 的四倍"}, {"en": "all 256 tokens", "zh": "全部 256 个 token"})
    sizes = ast.unparse(_assigned("c13-alibi-cost", "(B_, H_, T_, d_)"))
    assert "512 if fast else 1024" in sizes
    stated(text, {"en": "`T = 512` (1024 with `fast = False`)", "zh": "`T = 512`（`fast = False` 时为 1024）"})
    h = 8
    assert alibi_slopes(h)[0].item() == 2 ** (-8 / h) and alibi_slopes(h)[-1].item() == 2 ** -8
    stated(text, "`2^(−8/H), 2^(−16/H), …, 2^(−8)`")


def test_the_cost_shape_and_the_bases(text):
    shape = ast.unparse(_assigned("c13-cost", "shape"))
    assert "dim=256" in shape and "layers=4" in shape
    stated(text, {"en": "4-layer `D = 256` shape", "zh": "4 层、`D = 256` 的 shape"}, "10,000", "500,000")


def test_check_yourself_answers(text):
    past = 100
    stated(text, "`0 - n`", f"`{past} - n`", "(0, 2, 4, …, 1, 3, 5, …)")


def test_references_cited(text):
    stated(text, "arXiv:1706.03762", "arXiv:2104.09864", "arXiv:2108.12409", "arXiv:2306.15595", "arXiv:2309.00071")


def test_the_extrapolation_table_is_one_markdown_table():
    """The accuracy table is displayed as one markdown table: header, rule and rows in one ``Markdown`` (a header
    displayed alone renders as an empty table and the rows after it as plain text with pipes)."""
    for lang, path in editions(CHAPTER).items():
        cells = [c for c in json.loads(path.read_text(encoding="utf-8"))["cells"] if c["id"] == "c13-extrapolate"]
        assert len(cells) == 1, lang
        source = "".join(cells[0]["source"])
        shown = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call) and ast.unparse(n.func) == "Markdown"]
        assert len(shown) == 1, f"{lang}: the table must be one Markdown display, found {len(shown)}"
        [joined] = shown[0].args
        items = joined.args[0].elts  # "\n".join([header, rule, *table_rows])
        assert len(items) == 3 and items[1].value == "|---|---|---|---|" and ast.unparse(items[2]) == "*table_rows", lang
        assert items[0].value.startswith("| ") and items[0].value.count("|") == 5, lang
