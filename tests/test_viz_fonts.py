"""Chinese in figures: the explorer tokenises Chinese by character and draws it with a CJK font, with
no missing-glyph warning; without a font it says how to install one and still labels every token."""

from __future__ import annotations

import os
import warnings

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from tinytf.viz import attention as att  # noqa: E402
from tinytf.viz import fonts  # noqa: E402

SENTENCE = "猫坐在垫子上"


def test_chinese_is_tokenised_by_character_by_default_and_english_by_word():
    assert att.tokenize(SENTENCE) == list(SENTENCE)
    assert att.tokenize("the cat sat") == ["the", "cat", "sat"]
    assert att.tokenize("注意力 attention", "words") == ["注意力", "attention"], "an explicit mode is obeyed"
    assert fonts.has_cjk("掩码") and fonts.has_cjk("，") and not fonts.has_cjk("mask ä")


def _draw(sentence: str) -> tuple[list[str], list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig = att.attention_figure(sentence, mask="causal")
        fig.canvas.draw()  # glyphs are looked up when the text is drawn
        labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
        plt.close(fig)
    return labels, [w for w in caught if "Glyph" in str(w.message) or "missing from font" in str(w.message)]


def test_a_chinese_explorer_figure_renders_without_missing_glyphs():
    if fonts.find_cjk_font() is None:
        if os.environ.get("TINYTF_REQUIRE_CJK_FONT"):
            pytest.fail("no CJK font found although CI installs fonts-noto-cjk: " + fonts.NO_FONT_MESSAGE)
        pytest.skip("no CJK font installed here (CI installs fonts-noto-cjk)")
    labels, glyph_warnings = _draw(SENTENCE)
    assert labels == list(SENTENCE)
    assert not glyph_warnings, [str(w.message) for w in glyph_warnings]
    assert matplotlib.rcParams["font.sans-serif"][0] == fonts.find_cjk_font()


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_without_a_cjk_font_one_message_and_code_point_labels(monkeypatch, capsys, lang):
    monkeypatch.setenv("TINYTF_LANG", lang)
    monkeypatch.setattr(fonts, "_state", {"font": None})
    labels, glyph_warnings = _draw(SENTENCE)
    labels_again, _ = _draw("你好")
    fig = att.attention_figure(SENTENCE, mask="causal")
    chrome = [fig.axes[0].get_xlabel(), fig.axes[0].get_ylabel(), fig.axes[0].get_title(), fig.axes[1].get_ylabel()]
    plt.close(fig)
    out = capsys.readouterr().out
    message = fonts.NO_FONT_MESSAGE_ZH if lang == "zh" else fonts.NO_FONT_MESSAGE
    assert "fonts-noto-cjk" in message and out.count(message) == 1, "the install hint, in the notebook's language, once"
    assert labels == [f"U+{ord(c):04X}" for c in SENTENCE] and len(set(labels)) == len(SENTENCE)
    assert labels_again == ["U+4F60", "U+597D"]
    assert not glyph_warnings, "code points and English labels need no CJK glyph"
    assert chrome[:2] == ["key (attended to)", "query (attending)"] and chrome[2].startswith("head 0 of 2 · mask: causal")
    assert chrome[3] == "weight (each row sums to 1)" and not any(fonts.has_cjk(c) for c in chrome), chrome


def test_english_figures_leave_the_fonts_alone(monkeypatch):
    monkeypatch.setattr(fonts, "_state", {"font": None})
    before = list(matplotlib.rcParams["font.sans-serif"])
    assert fonts.use_cjk_font(["the", "cat"]) is True
    assert matplotlib.rcParams["font.sans-serif"] == before


ZH_FOLDERS = ("notebooks/zh", "solutions/zh", "exercises/zh")


@pytest.mark.parametrize("folder", ZH_FOLDERS)
def test_every_chinese_folder_draws_its_labels_with_a_cjk_font(folder):
    """A Chinese chapter's or exercise's own labels (``ax.set_title("损失")``) are drawn with the font its
    folder's matplotlibrc names: matplotlib, started in that folder as Jupyter starts a kernel, draws
    Chinese without a missing glyph."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    assert len(list((root / folder).glob("*.ipynb"))) >= 11, f"{folder} holds the Chinese notebooks"
    rc = root / folder / "matplotlibrc"
    assert rc.is_file() and rc.read_bytes() == (root / "notebooks/zh/matplotlibrc").read_bytes(), \
        f"{folder}/matplotlibrc must be notebooks/zh/matplotlibrc (exercises/zh gets it from `make release`)"
    if fonts.find_cjk_font() is None:
        if os.environ.get("TINYTF_REQUIRE_CJK_FONT"):
            pytest.fail("no CJK font found although CI installs fonts-noto-cjk: " + fonts.NO_FONT_MESSAGE)
        pytest.skip("no CJK font installed here (CI installs fonts-noto-cjk)")
    code = ("import warnings, matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot as plt\n"
            "fig, ax = plt.subplots(); ax.set_title('损失（学习率）'); ax.set_xlabel('步')\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always'); fig.canvas.draw()\n"
            "print([str(x.message) for x in w if 'missing from font' in str(x.message)])")
    run = subprocess.run([sys.executable, "-c", code], cwd=root / folder, capture_output=True, text=True, check=True,
                         env={k: v for k, v in os.environ.items() if k != "MATPLOTLIBRC"})
    assert run.stdout.strip() == "[]", run.stdout
