"""What a Chinese student reads in a code cell is Chinese: printed lines, assert and error messages,
figure labels and docstrings of every zh chapter, solution and exercise (code and units aside)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tinytf.course.build.displayed import displayed_texts, untranslated_texts

ROOT = Path(__file__).resolve().parents[1]
ZH = sorted(p for d in ("notebooks", "solutions", "exercises") for p in (ROOT / d / "zh").glob("*.ipynb"))


def test_the_chinese_notebooks_are_all_there():
    counts = {d: sum(1 for p in ZH if p.parts[-3] == d) for d in ("notebooks", "solutions", "exercises")}
    english = {d: len(list((ROOT / d).glob("*.ipynb"))) for d in counts}
    assert counts == english and counts["notebooks"] >= 12 and counts["solutions"] >= 11, counts


def test_displayed_texts_are_the_words_a_student_reads():
    src = ('def f(x):\n    """Scaled scores."""\n    return x\n'
           'print(f"T = {t}: {n} rows", y)\nassert ok, "rows sum to 1"\nax.set(xlabel="step", ylim=(0, 1))\n'
           'data = {"key": "a string used as data"}\nraise ValueError("bad shape")')
    assert displayed_texts(src) == ["Scaled scores.", "T =  :   rows", "rows sum to 1", "step", "bad shape"]


@pytest.mark.parametrize(("src", "english"), [
    ('print("row sums:", w.sum(-1))', ["row sums:"]),
    ('print("每行之和：", w.sum(-1))', []),
    ('ax.set_title(f"H={h}, head {col}")', ["H= , head "]),
    ('ax.set_title(f"H={h}，头 {col}")', []),
    ('def f():\n    """Softmax over the keys."""', ["Softmax over the keys."]),
    ('print("out：", out)', []),  # a full-width colon is Chinese punctuation: the label was translated
    ('print("ValueError:", err)', []),  # an exception's name is code
    ('print("max |a - b| =", (a - b).abs().max(), "MiB")', []),  # units and glossary words stay English
    ('window = 3\nprint("window", window)', []),  # the name of a variable the cell uses is code
    ('print(f"{name}: saved")', [": saved"]),
])
def test_untranslated_texts_finds_english_sentences_not_code(src: str, english: list[str]):
    assert untranslated_texts(src) == english


@pytest.mark.parametrize("path", ZH, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_chinese_notebook_prints_and_labels_in_chinese(path: Path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    found = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        try:
            found += [f"cell {cell.get('id')}: {t.strip()[:70]!r}" for t in untranslated_texts("".join(cell["source"]))]
        except SyntaxError:  # an unfinished exercise stub: nothing it prints runs yet
            continue
    assert not found, (f"{path.relative_to(ROOT)}: English a Chinese student reads (print, assert, raise, figure "
                       "label or docstring); translate it (notebooks/zh/术语表.md):\n" + "\n".join(found))
