"""notebooks/zh/术语表.md is the rule for the Chinese edition's words, and these tests hold every zh notebook to it.

For each Chinese notebook (chapters, solutions, released exercises) every markdown cell and every printed
Chinese string (a string literal with a CJK character inside ``print(...)``/``display(...)``/``Markdown(...)``)
is searched for the glossary's disallowed variants ("不要写成"). Code spans, fenced code, URLs and a bracketed
English gloss such as "（fused kernel）" are not prose and are skipped. Two layout rules go with it: no hard line
break inside a Chinese paragraph (a newline between two CJK characters renders as a space between them), and
no gloss nested inside a gloss ("（key/value cache，即 KV 缓存（KV cache））").

The notebooks other helpers still own are listed in ``KNOWN_DRIFT`` with the fixes they need; each is an
``xfail(strict=True)``, so the list has to be emptied as they are fixed.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GLOSSARY = ROOT / "notebooks" / "zh" / "术语表.md"
ZH_FOLDERS = (ROOT / "notebooks" / "zh", ROOT / "solutions" / "zh", ROOT / "exercises" / "zh")
ZH_NOTEBOOKS = sorted(p for folder in ZH_FOLDERS for p in folder.glob("*.ipynb"))

CJK = "\u3400-\u9fff\uf900-\ufaff"
_CJK_TEXT = f"[{CJK}，。、；：？！“”）（《》]"
HARD_BREAK = re.compile(f"(?<={_CJK_TEXT})\n(?={_CJK_TEXT})")
NESTED_GLOSS = re.compile(r"（[^（）\n]*（[\x20-\x7e]+））")  # a bracket that ends in a gloss
_NOT_PROSE = re.compile(r"```.*?```|`[^`\n]*`|\$\$.*?\$\$|\$[^$\n]*\$|<[^>\n]+>|\]\([^)\s]*\)|https?://\S+", re.DOTALL)
_GLOSS = re.compile(r"（[\x20-\x7e\u00b2-\u00b3\u00d7\u2013\u2014\u2032-\u2033\u1d40]+）")

# notebook (relative to the repository) -> the fixes it still needs; emptied as the owners apply them
KNOWN_DRIFT: dict[str, str] = {  # one line per notebook
}


def glossary() -> list[tuple[str, str, list[str]]]:
    """The glossary's rows: (中文, English, disallowed variants)."""
    rows = []
    for line in GLOSSARY.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| ") or len(cells) < 4 or cells[0] in ("中文", "---") or set(cells[0]) <= set("-"):
            continue
        rows.append((cells[0], cells[1], [v.strip() for v in re.split("[、,，]", cells[2]) if v.strip()]))
    return rows


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def printed_strings(code: str) -> list[str]:
    """The Chinese string literals (f-string literal parts included) printed or displayed by a code cell."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in ("print", "display", "Markdown"):
            for arg in ast.walk(node):
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and re.search(f"[{CJK}]", arg.value):
                    out.append(arg.value)
    return out


def prose(text: str) -> str:
    """Markdown without code, maths, tags, links and bracketed English glosses: the words a student reads."""
    return _GLOSS.sub("（）", _NOT_PROSE.sub(" ", text))


def problems(path: Path) -> list[str]:
    nb = json.loads(path.read_text(encoding="utf-8"))
    rules = [(zh, v) for zh, _en, variants in glossary() for v in variants]
    found = []
    for cell in nb["cells"]:
        text = _source(cell)
        pieces = [text] if cell["cell_type"] == "markdown" else printed_strings(text) if cell["cell_type"] == "code" else []
        for piece in pieces:
            words = prose(piece)
            for zh, variant in rules:
                flags = re.IGNORECASE if variant.isascii() else 0
                pattern = rf"\b{re.escape(variant)}\b" if variant.isascii() else re.escape(variant)
                if re.search(pattern, words, flags):
                    found.append(f"cell {cell.get('id')}: {variant!r} -> {zh!r}")
            if cell["cell_type"] == "markdown":
                plain = re.sub(r"```.*?```", "", piece, flags=re.DOTALL)
                for m in HARD_BREAK.finditer(plain):
                    found.append(f"cell {cell.get('id')}: hard line break at {plain[max(0, m.start() - 8):m.end() + 8]!r}")
                for m in NESTED_GLOSS.finditer(plain):
                    found.append(f"cell {cell.get('id')}: a gloss inside a gloss {m.group(0)!r}")
    return found


def test_the_glossary_is_a_table_of_terms_with_their_disallowed_variants():
    rows = glossary()
    assert len(rows) >= 60, f"the glossary has {len(rows)} rows"
    chosen = [zh for zh, _en, _v in rows]
    assert len(chosen) == len(set(chosen)), "a Chinese term appears twice"
    disallowed = {v: zh for zh, _en, variants in rows for v in variants}
    assert not set(disallowed) & set(chosen), f"a term is both chosen and disallowed: {set(disallowed) & set(chosen)}"
    for term in ("得分", "运行最大值", "形状", "重计算", "重新计算", "末端对齐", "kernel", "惰性", "内存带宽", "批量"):
        assert term in disallowed, f"{term} should be a disallowed variant"


def test_the_checks_catch_each_kind_of_drift():
    md = {"cell_type": "markdown", "id": "m",
          "source": "分数（score）在 `形状` 里没事，但这里的得分和形状不行。\n第二行"}
    code = {"cell_type": "code", "id": "c", "source": 'print(f"运行最大值 {m}")\nx = "形状"  # 数据，不是打印的\n'}
    nested = {"cell_type": "markdown", "id": "n", "source": "键/值缓存（key/value cache，即 KV 缓存（KV cache））。用融合内核（fused kernel）。"}  # noqa: E501
    nb = {"cells": [md, code, nested], "metadata": {}}
    path = ROOT / "build" / "test_glossary_probe.ipynb"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(nb, ensure_ascii=False), encoding="utf-8")
    try:
        found = problems(path)
    finally:
        path.unlink()
    assert any("'得分'" in f for f in found) and any("cell m: '形状'" in f for f in found), found
    assert any("hard line break" in f for f in found), found
    assert any("cell c: '运行最大值'" in f for f in found) and not any("cell c: '形状'" in f for f in found), found
    assert any("gloss inside a gloss" in f for f in found) and not any("'kernel'" in f for f in found), found


def test_every_zh_notebook_is_checked():
    english = [p for d in ("notebooks", "solutions", "exercises") for p in sorted((ROOT / d).glob("*.ipynb"))]
    assert len(english) >= 32 and len(ZH_NOTEBOOKS) == len(english), [p.relative_to(ROOT).as_posix() for p in ZH_NOTEBOOKS]
    assert set(KNOWN_DRIFT) <= {p.relative_to(ROOT).as_posix() for p in ZH_NOTEBOOKS}


@pytest.mark.parametrize(
    "path",
    [pytest.param(p, id=p.relative_to(ROOT).as_posix(),
                  marks=[pytest.mark.xfail(strict=True, reason=KNOWN_DRIFT[p.relative_to(ROOT).as_posix()])]
                  if p.relative_to(ROOT).as_posix() in KNOWN_DRIFT else [])
     for p in ZH_NOTEBOOKS],
)
def test_zh_notebook_follows_the_glossary(path: Path):
    found = problems(path)
    assert not found, f"{path.relative_to(ROOT)}:\n" + "\n".join(found)


# what nbgrader writes where a solution was, per edition (tinytf.course.build.nbgrader_root.nbgrader_config's stubs)
def _stubs(edition: str) -> list[str]:
    from tinytf.course.build.nbgrader_root import nbgrader_config

    c = nbgrader_config(ROOT / "build", edition=edition)
    return [line for s in (c.ClearSolutions.code_stub["python"], c.ClearSolutions.text_stub) for line in s.splitlines()]


def test_every_marker_a_chapter_names_is_in_that_editions_exercises():
    """A chapter that says "fill in the cells marked X" quotes a marker the student's exercises contain."""
    markers = {m for lang in ("en", "zh") for m in _stubs(lang) if "NotImplementedError" not in m}
    assert len(markers) == 4, markers
    checked = 0
    for chapters, exercises in ((ROOT / "notebooks", ROOT / "exercises"),
                                (ROOT / "notebooks" / "zh", ROOT / "exercises" / "zh")):
        released = "\n".join(p.read_text(encoding="utf-8") for p in sorted(exercises.glob("ex*.ipynb")))
        decoded = json.dumps(released, ensure_ascii=False)  # notebooks store "# 在这里…" as JSON text
        for chapter in sorted(chapters.glob("[0-9][0-9]_*.ipynb")):
            for cell in json.loads(chapter.read_text(encoding="utf-8"))["cells"]:
                if cell["cell_type"] != "markdown":
                    continue
                for quoted in re.findall(r"`([^`\n]+)`", _source(cell)):
                    if any(m.lstrip("# ") in quoted for m in markers):
                        checked += 1
                        assert quoted in released or quoted in decoded, (
                            f"{chapter.relative_to(ROOT)} cell {cell.get('id')} tells students to look for {quoted!r}, "
                            f"which no notebook in {exercises.relative_to(ROOT)}/ contains")
    assert checked >= 4, f"only {checked} quoted markers found in the chapters"
