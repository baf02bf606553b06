"""Sphinx configuration of the book (``make book``). The pages are assembled by
:mod:`tinytf.course.book` into ``build/book-src/``; this file is copied there.

Notebooks are never executed here (their outputs come from our own papermill run), MathJax is served
from the site itself (sphinx-mathjax-offline), and nothing is loaded from outside the site.
"""

from __future__ import annotations

project = "tinytf — attention by hand"
author = "the tinytf team"
language = "en"

extensions = ["myst_nb", "sphinx-mathjax-offline"]
nb_execution_mode = "off"  # outputs come from `make run`'s executed copies
nb_ipywidgets_js = {}  # no widget manager from a CDN: widgets appear as their static figures
myst_enable_extensions = ["dollarmath", "amsmath", "html_image"]
myst_heading_anchors = 3
suppress_warnings = ["myst.header", "mystnb.unknown_mime_type", "misc.highlighting_failure"]
exclude_patterns = ["_build", "**.ipynb_checkpoints"]

html_theme = "sphinx_book_theme"
html_title = "tinytf"
html_static_path = ["_static"]
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


def _twin(pagename: str) -> tuple[str, str]:
    """The page in the other language and that language's label."""
    if pagename.startswith("zh/"):
        return pagename[3:], "English"
    return "zh/" + pagename, "中文"


def _language_switch(app, pagename, templatename, context, doctree) -> None:
    """A link to the twin page at the top of every page (and ``lang`` set for Chinese pages)."""
    twin, label = _twin(pagename)
    if twin not in app.env.all_docs:
        return
    href = context["pathto"](twin)
    lang = "zh" if label == "中文" else "en"
    switch = f'<p class="tinytf-lang-switch"><a class="tinytf-twin" href="{href}" hreflang="{lang}">{label}</a></p>'
    context["body"] = switch + context.get("body", "")
    if pagename.startswith("zh/"):
        context["language"] = "zh-CN"


def setup(app):
    app.connect("html-page-context", _language_switch)
