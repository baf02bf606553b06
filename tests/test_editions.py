"""The Chinese edition stays in step with the English one: same cells, same code, same grading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tinytf.course.editions import code_tokens, compare_twins, edition, english_path, needs_translation, twin_path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("notebooks", "solutions", "exercises")


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _twins() -> list[Path]:
    return sorted(p for d in FOLDERS for p in (ROOT / d / "zh").glob("*.ipynb"))


def test_every_chinese_notebook_has_an_english_original():
    orphans = [str(p.relative_to(ROOT)) for p in _twins() if not english_path(p).exists()]
    assert not orphans, f"Chinese notebooks without an English original: {orphans}"


@pytest.mark.parametrize("zh", _twins(), ids=lambda p: str(p.relative_to(ROOT)))
def test_twin_matches_english(zh: Path):
    rel = zh.relative_to(ROOT)
    zh_nb, en_nb = _load(zh), _load(english_path(zh))
    assert edition(zh_nb) == "zh", f"{rel}: set metadata.tinytf.edition = 'zh' (the edition is read from metadata)"
    assert edition(en_nb) == "en", f"{english_path(zh).relative_to(ROOT)}: an English notebook must not say edition 'zh'"
    problems = compare_twins(en_nb, zh_nb, str(rel))
    assert not problems, "\n".join(problems)
    untranslated = [f"{rel} cell {i} (id {c.get('id')}): markdown is not translated: {''.join(c['source'])[:80]!r}"
                    for i, c in enumerate(zh_nb["cells"]) if needs_translation(c)]
    assert not untranslated, "\n".join(untranslated)


def test_code_comparison_ignores_comments_only():
    assert code_tokens("x = 1  # one\n# note\ny = x") == code_tokens("x = 1  # 一\n# 注释\ny = x")
    assert code_tokens("print('hi')") != code_tokens("print('你好')")
    assert code_tokens("x = 1") != code_tokens("x = 2")


def test_compare_twins_names_the_cell_and_the_token():
    en = {"cells": [{"id": "a", "cell_type": "code", "metadata": {}, "source": "x = 1  # one\n"}]}
    zh = {"cells": [{"id": "a", "cell_type": "code", "metadata": {}, "source": "x = 2  # 一\n"}]}
    [msg] = compare_twins(en, zh, "notebooks/zh/x.ipynb")
    assert "notebooks/zh/x.ipynb cell 0 (id a): code differs from the English twin" in msg and "'1'" in msg and "'2'" in msg
    zh["cells"][0]["source"] = "x = 1\n"
    assert compare_twins(en, zh) == []
    zh["cells"][0]["metadata"] = {"nbgrader": {"points": 2}}
    assert "metadata" in compare_twins(en, zh)[0]


def test_lost_nbgrader_marker_is_caught():
    src = "def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\n"
    en = {"cells": [{"id": "a", "cell_type": "code", "metadata": {}, "source": src}]}
    zh = {"cells": [{"id": "a", "cell_type": "code", "metadata": {}, "source": src.replace("    ### END SOLUTION\n", "")}]}
    assert any("markers" in p for p in compare_twins(en, zh))


def test_untranslated_markdown_is_caught_but_maths_is_not():
    assert needs_translation({"cell_type": "markdown", "source": "## Summary\n\nThe weights sum to one."})
    assert not needs_translation({"cell_type": "markdown", "source": "## 小结\n\n权重之和为一。"})
    assert not needs_translation({"cell_type": "markdown", "source": "$$\\mathrm{softmax}(QK^T/\\sqrt{d})V$$"})
    assert twin_path("notebooks/01_attention.ipynb") == Path("notebooks/zh/01_attention.ipynb")
