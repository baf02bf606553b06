"""The Chinese edition stays in step with the English one: same cells, same code, same grading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tinytf.course.build.editions import (
    code_difference,
    code_tokens,
    compare_twins,
    edition,
    english_path,
    needs_translation,
    twin_path,
)

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


def test_code_tokens_ignore_comments_only():
    assert code_tokens("x = 1  # one\n# note\ny = x") == code_tokens("x = 1  # 一\n# 注释\ny = x")
    assert code_tokens("x = 1") != code_tokens("x = 2")


# (English, a faithful Chinese twin): the words a student reads change, the program does not
TRANSLATED = [
    ("x = 1  # one\n# note\ny = x", "x = 1  # 一\n# 注释\ny = x"),
    ('print("row sums:", w.sum(-1))', 'print("每行之和：", w.sum(-1))'),
    ('print(f"T = {t:>5}: {n:,} elements")', 'print(f"T = {t:>5}：共 {n:,} 个元素")'),
    ('print(f"{\'d_k\':>5} | {\'logit std\':>9}")', 'print(f"{\'d_k\':>5} | {\'对数几率标准差\':>2}")'),
    ('print("read from " + str(p), "ok" if good else "bad")', 'print("读取自 " + str(p), "正常" if good else "有误")'),
    ('assert w.sum() == 1, "rows sum to 1"', 'assert w.sum() == 1, "每行之和为 1"'),
    ('assert ok, f"found {sorted(a)}"', 'assert ok, f"找到的是 {sorted(a)}"'),
    ('raise RuntimeError("out of blocks")', 'raise RuntimeError("块用完了")'),
    ('ax.plot(x, y, "o-", label=f"{n}-norm")', 'ax.plot(x, y, "o-", label=f"{n} 归一化")'),
    ('ax.set(title="spread", xlabel="d_k (width)", ylabel="std", ylim=(0, 1))',
     'ax.set(title="分布", xlabel="d_k（宽度）", ylabel="标准差", ylim=(0, 1))'),
    ('ax.set_title(f"head {h}"); plt.xlabel("step"); fig.suptitle("loss")',
     'ax.set_title(f"头 {h}"); plt.xlabel("步"); fig.suptitle("损失")'),
    ('ax.legend(["a", "b"], loc="upper right"); ax.text(0, 1, "peak", color="r")',
     'ax.legend(["甲", "乙"], loc="upper right"); ax.text(0, 1, "峰值", color="r")'),
    ('plot(measured_label=f"on {dev}", xticklabels=[f"rank {r}" for r in rs])',
     'plot(measured_label=f"在 {dev} 上", xticklabels=[f"进程 {r}" for r in rs])'),
    ('log = train(model, steps, desc="copy task")', 'log = train(model, steps, desc="复制任务")'),
    ('display(Markdown("\\n".join(["| exercise | title |", "|---|---|"])))',
     'display(Markdown("\\n".join(["| 练习 | 标题 |", "|---|---|"])))'),
    ('def f(x):\n    """Scaled scores."""\n    return x', 'def f(x):\n    """缩放后的分数。"""\n    return x'),
    ('print(f"-> {\'hidden\' if t >= n else \'exposed\'}")', 'print(f"-> {\'能隐藏\' if t >= n else \'暴露\'}")'),
    ("%%writefile {WORK}/a.py\nimport os  # the os\nprint('rank', os.getpid())",
     "%%writefile {WORK}/a.py\nimport os  # 操作系统\nprint('进程', os.getpid())"),
]

# (English, a twin that is a different program): each must be caught
CHANGED = [
    ("x = 1", "x = 2"),                                              # a number
    ("y = x + 1", "y = z + 1"),                                      # a name
    ('w = d["loss"]', 'w = d["损失"]'),                               # a string used as data
    ('print(d["loss"])', 'print(d["损失"])'),                         # ... even inside a print
    ("y = f(x)", "y = g(x)"),                                        # a call
    ("y = f(x, 1)", "y = f(x)"),                                     # an argument
    ('print(f"{a} then {b}")', 'print(f"{b} 然后 {a}")'),             # the printed expressions, reordered
    ('print(f"{x:.3f}")', 'print(f"{x:.2f}")'),                       # a format spec
    ('print("a", "b", sep=", ")', 'print("甲", "乙", sep="，")'),       # a keyword of print
    ('ax.plot(x, y, "o-")', 'ax.plot(x, y, "s-")'),                   # a figure's data string
    ('s = "rank"', 's = "进程"'),                                      # a string outside the masked places
    ('assert w.sum() == 1, "rows"', 'assert w.sum() == 2, "rows"'),  # the asserted condition
    ('print(f"{\'a\' if t >= n else \'b\'}")', 'print(f"{\'a\' if t > n else \'b\'}")'),  # a printed choice's condition
    ("%%writefile {WORK}/a.py\nx = 1", "%%writefile {WORK}/b.py\nx = 1"),  # a cell magic's line
    ("%%writefile {WORK}/a.py\nx = 1", "%%writefile {WORK}/a.py\nx = 2"),  # the file it writes
]


@pytest.mark.parametrize(("en", "zh"), TRANSLATED, ids=[en[:30] for en, _ in TRANSLATED])
def test_translated_words_leave_the_same_program(en: str, zh: str):
    assert code_difference(en, zh) is None


@pytest.mark.parametrize(("en", "zh"), CHANGED, ids=[f"{en[:20]} -> {zh[:20]}" for en, zh in CHANGED])
def test_a_changed_program_is_caught(en: str, zh: str):
    assert len(CHANGED) == 15
    assert code_difference(en, zh) is not None


def test_the_difference_names_the_line_and_the_statement():
    assert code_difference("a = 1\nfor i in r:\n    print(f'x {i}', y)", "a = 1\nfor i in r:\n    print(f'甲 {i}', z)") \
        == "English line 3 `y`, twin `z` in `print(f'{i}', y)`"
    assert code_difference("a = 1\nb = 2", "a = 1") == "the English has 2 statements, the twin 1"
    assert "does not parse" in code_difference("x = 1", "x = (")
    assert code_difference("x = = 1  # stub", "x = = 1  # 桩") is None  # neither parses: tokens, comments aside
    assert code_difference("x = = 1", "x = = 2") == "token 3: English '1', twin '2'"


def test_compare_twins_names_the_cell_and_the_difference():
    en = {"cells": [{"id": "a", "cell_type": "code", "metadata": {}, "source": "x = 1  # one\n"}]}
    zh = {"cells": [{"id": "a", "cell_type": "code", "metadata": {}, "source": "x = 2  # 一\n"}]}
    [msg] = compare_twins(en, zh, "notebooks/zh/x.ipynb")
    assert msg == "notebooks/zh/x.ipynb cell 0 (id a): code differs from the English twin: English line 1 `1`, twin `2` in `x = 1`"
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
