"""Chinese text in figures: pick an installed CJK font, or say how to get one.

matplotlib's default font (DejaVu Sans) has no Chinese glyphs: a token such as ``猫`` would be drawn
as an empty box ("tofu") with a "Glyph missing" warning. :func:`use_cjk_font` puts the first
installed CJK font in front of the sans-serif list (Latin text keeps its usual look); where none is
installed it prints one message saying how to install one, and :func:`displayable` spells Chinese
characters as code points (``U+732B``) so every label still names a different token (the explorer
then writes its axis labels and title in English, which needs no CJK glyph either).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["CJK_FONTS", "has_cjk", "find_cjk_font", "use_cjk_font", "displayable", "NO_FONT_MESSAGE", "NO_FONT_MESSAGE_ZH"]

# in order of preference: Debian/Ubuntu (fonts-noto-cjk, fonts-wqy-*), Adobe, macOS, Windows
CJK_FONTS = (
    "Noto Sans CJK SC", "Noto Sans CJK JP", "Noto Sans SC", "Source Han Sans SC", "Source Han Sans CN",
    "WenQuanYi Zen Hei", "WenQuanYi Micro Hei", "PingFang SC", "Heiti SC", "Microsoft YaHei", "SimHei",
)
NO_FONT_MESSAGE = (
    "No Chinese (CJK) font is installed, so the explorer shows Chinese tokens as code points (U+732B) "
    "and its labels in English. "
    "Install one and restart the kernel: Debian/Ubuntu `sudo apt-get install fonts-noto-cjk`; "
    "Fedora `sudo dnf install google-noto-sans-cjk-fonts`; macOS and Windows already have one."
)
NO_FONT_MESSAGE_ZH = (
    "没有找到中文字体，注意力探索器中的中文 token 暂以码位（如 U+732B）显示，图中的标注暂用英文。安装一个中文字体后重启内核即可："
    "Debian/Ubuntu 运行 `sudo apt-get install fonts-noto-cjk`，Fedora 运行 "
    "`sudo dnf install google-noto-sans-cjk-fonts`；macOS 和 Windows 自带中文字体。"
)
# file names of those fonts, for a font installed after matplotlib cached its font list
_FILES = re.compile(r"NotoSans(Mono)?CJK|NotoSansSC|SourceHanSans|wqy|PingFang|STHeiti|msyh|simhei", re.IGNORECASE)
_CJK = re.compile(r"[\u2e80-\u9fff\uf900-\ufaff\uff00-\uffef]")
_state: dict[str, object] = {}


def has_cjk(text: str) -> bool:
    """True when ``text`` holds a Chinese/Japanese/Korean character (or full-width punctuation)."""
    return bool(_CJK.search(text))


def find_cjk_font() -> str | None:
    """The family name of the first installed font of :data:`CJK_FONTS`, or None."""
    if "font" not in _state:
        from matplotlib import font_manager

        def first() -> str | None:
            installed = {f.name for f in font_manager.fontManager.ttflist}
            return next((name for name in CJK_FONTS if name in installed), None)

        font = first()
        if font is None:  # matplotlib's cached list predates the font: add the files it can find now
            for path in font_manager.findSystemFonts():
                if _FILES.search(path):
                    try:
                        font_manager.fontManager.addfont(path)
                    except (OSError, RuntimeError, ValueError):  # a font file matplotlib cannot read
                        continue
            font = first()
        _state["font"] = font
    return _state["font"]  # type: ignore[return-value]


def use_cjk_font(texts: Iterable[str] = ()) -> bool:
    """Make matplotlib able to draw the CJK characters in ``texts``; True when it can.

    With no CJK character in ``texts`` nothing changes (True). Otherwise the installed CJK font goes
    first in ``rcParams["font.sans-serif"]``; without one, :data:`NO_FONT_MESSAGE` is printed once
    per process and False is returned (then pass labels through :func:`displayable`).
    """
    if not any(has_cjk(t) for t in texts):
        return True
    import matplotlib

    font = find_cjk_font()
    if font is None:
        if not _state.get("warned"):
            from ..language import notebook_language

            print(NO_FONT_MESSAGE_ZH if notebook_language() == "zh" else NO_FONT_MESSAGE)
            _state["warned"] = True
        return False
    families = list(matplotlib.rcParams["font.sans-serif"])
    if families[:1] != [font]:
        matplotlib.rcParams["font.sans-serif"] = [font, *[f for f in families if f != font]]
        matplotlib.rcParams["font.family"] = "sans-serif"
        matplotlib.rcParams["axes.unicode_minus"] = False  # CJK fonts often lack U+2212
    return True


def displayable(text: str, cjk_ok: bool) -> str:
    """``text`` itself when CJK can be drawn, else with each CJK character written as ``U+XXXX``."""
    return text if cjk_ok else _CJK.sub(lambda m: f"U+{ord(m.group()):04X}", text)
