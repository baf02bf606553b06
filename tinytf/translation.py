"""What tinytf says to a student, in the student's language: gettext over one catalog.

Every sentence the package prints, raises or draws is written in English and wrapped where it is
written: ``_("q and k must have the same width d: q {q}, k {k}").format(q=..., k=...)`` (named
placeholders, so that a translation can reorder them). The Chinese lives in
``tinytf/locale/zh_CN/LC_MESSAGES/tinytf.po`` (compiled to ``tinytf.mo``, shipped with the package;
``make messages`` extracts, updates and compiles it with Babel).

The language is chosen when a message is said, not when the module is imported:
:func:`tinytf.language.notebook_language` (``TINYTF_LANG`` first, then the running notebook's edition).
``gettext`` is ``_`` under its long name, for functions that use ``_`` as a throwaway variable;
``N_`` marks a message that is stored now and translated later (a table's column, a catalog row).
"""

from __future__ import annotations

import gettext as _gettext
import os
from functools import cache, lru_cache
from pathlib import Path

from .language import LANGUAGES, notebook_language

__all__ = ["DOMAIN", "LOCALE_DIR", "LOCALES", "N_", "_", "current_language", "gettext", "ngettext", "pgettext",
           "translations"]

DOMAIN = "tinytf"
LOCALE_DIR = Path(__file__).resolve().parent / "locale"
LOCALES = {"zh": "zh_CN"}  # tinytf's language code -> the catalog's locale folder


@cache
def translations(lang: str) -> _gettext.NullTranslations:
    """The catalog of ``lang`` (``"zh"``); English (and any language without a catalog) says the msgid itself."""
    locale = LOCALES.get(lang)
    if locale is None:
        return _gettext.NullTranslations()
    return _gettext.translation(DOMAIN, localedir=str(LOCALE_DIR), languages=[locale], fallback=True)


@lru_cache(maxsize=64)
def _language_for(env: str, session: str, cwd: str) -> str:
    return notebook_language()


def current_language(lang: str | None = None) -> str:
    """``lang`` when it is one of :data:`tinytf.language.LANGUAGES`, else the running notebook's language.

    The notebook's language is looked up once per (``TINYTF_LANG``, ``JPY_SESSION_NAME``, working directory):
    reading the folder's notebooks for every message would be slow."""
    if lang in LANGUAGES:
        return lang
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = ""
    return _language_for(os.environ.get("TINYTF_LANG", ""), os.environ.get("JPY_SESSION_NAME", ""), cwd)


def _(message: str, lang: str | None = None) -> str:
    """``message`` in ``lang`` (default: the running notebook's language)."""
    return translations(current_language(lang)).gettext(message)


gettext = _


def ngettext(singular: str, plural: str, n: int, lang: str | None = None) -> str:
    """``singular`` or ``plural`` (chosen by ``n``) in ``lang``; format it with ``n`` yourself."""
    return translations(current_language(lang)).ngettext(singular, plural, n)


def pgettext(context: str, message: str, lang: str | None = None) -> str:
    """``message`` in ``lang`` where the same English word means different things (``context`` says which)."""
    return translations(current_language(lang)).pgettext(context, message)


def N_(message: str) -> str:
    """Mark ``message`` for the catalog without translating it now (translate it with ``_`` when it is said)."""
    return message
