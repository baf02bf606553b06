"""Sphinx configuration of the books (``make book``). :mod:`tinytf.course.build.book` assembles each language's
pages in ``build/book-src/<lang>/``, copies this file there and runs one Sphinx build per language
(``-D language=en`` or ``-D language=zh_CN``) into ``build/book/<lang>/``.

Notebooks are never executed here (their outputs come from our own papermill run), MathJax is served
from the site itself (sphinx-mathjax-offline), and nothing is loaded from outside the site. The Chinese
book's search index is segmented by jieba (``html_search_language = "zh"``), with the glossary's terms
as its dictionary (``_jieba_terms.txt``, written at assembly).
"""

from __future__ import annotations

from pathlib import Path

project = "tinytf — attention by hand"
author = "the tinytf team"
language = "en"  # the Chinese build passes -D language=zh_CN

extensions = ["myst_nb", "sphinx-mathjax-offline"]
nb_execution_mode = "off"  # outputs come from tinytf.course.build.book's executed copies
nb_ipywidgets_js = {}  # no widget manager from a CDN: widgets appear as their static figures
myst_enable_extensions = ["dollarmath", "amsmath", "html_image"]
myst_heading_anchors = 3
suppress_warnings = ["myst.header", "mystnb.unknown_mime_type", "misc.highlighting_failure"]
exclude_patterns = ["_build", "**.ipynb_checkpoints"]

_HERE = Path(__file__).resolve().parent
_TERMS = _HERE / "_jieba_terms.txt"
if _TERMS.is_file():
    html_search_options = {"dict": str(_TERMS)}  # added to jieba's own dictionary: 因果掩码 is one word
    try:
        import logging

        import jieba

        jieba.setLogLevel(logging.WARNING)  # not "Building prefix dict ..." on every build
    except ImportError:  # the index is then built without Chinese words; tests/ui/test_book.py fails on it
        pass

html_theme = "sphinx_book_theme"
html_title = "tinytf"
html_static_path = ["_static"]
templates_path = ["_templates"]
html_css_files = ["tinytf.css"]
html_theme_options = {
    "show_navbar_depth": 1,
    "use_download_button": False,
    "use_fullscreen_button": False,
    "use_repository_button": False,
    "navigation_with_keys": False,
}
html_show_sourcelink = False
html_copy_source = False
html_context = {"default_mode": "light"}  # the theme's light/dark switch starts from a valid mode

LABELS = {"en": "English", "zh": "中文"}
SPECIAL = ("genindex", "search")  # pages every build writes, with no source


def _lang(config) -> str:
    return "zh" if str(config.language).startswith("zh") else "en"


def _search_language(app, config) -> None:
    """The Chinese book is indexed as Chinese (jieba splits words), not as English (split at spaces)."""
    if _lang(config) == "zh":
        config.html_search_language = "zh"


def _twin(app, pagename: str) -> tuple[str, str] | None:
    """The relative link to the same page in the other language's book, and that language's label."""
    other = "en" if _lang(app.config) == "zh" else "zh"
    there = Path(app.srcdir).parent / other
    if pagename not in SPECIAL and not any((there / f"{pagename}{s}").is_file() for s in (".md", ".ipynb")):
        return None
    return "../" * (pagename.count("/") + 1) + f"{other}/{pagename}.html", other


def _language_switch(app, pagename, templatename, context, doctree) -> None:
    """A link to the twin page (in the other book) at the top of every page, search and index included."""
    twin = _twin(app, pagename)
    if twin is None:
        return
    href, other = twin
    context["tinytf_switch"] = (f'<p class="tinytf-lang-switch"><a class="tinytf-twin" href="{href}" hreflang="{other}">'
                                f"{LABELS[other]}</a></p>")  # placed by _templates/layout.html


def _chinese_search_page(app, config) -> None:
    """The search page's summary in Chinese: translations Sphinx's zh_CN catalog lacks (tinytf-search-zh.js)."""
    if _lang(config) == "zh":
        app.add_js_file("tinytf-search-zh.js", priority=600)  # after Sphinx's translations.js


def setup(app):
    app.connect("config-inited", _search_language)
    app.connect("config-inited", _chinese_search_page)
    app.connect("html-page-context", _language_switch)
