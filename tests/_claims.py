"""Helpers for the chapter-claims tests: a chapter's markdown in both editions, and a check that a
phrase the prose states is still there (line breaks in the markdown count as spaces)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LANGS = ("en", "zh")


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def editions(name: str) -> dict[str, Path]:
    """``{"en": notebooks/NAME, "zh": notebooks/zh/NAME}``; both must exist."""
    paths = {"en": ROOT / "notebooks" / name, "zh": ROOT / "notebooks" / "zh" / name}
    missing = [str(p) for p in paths.values() if not p.exists()]
    assert not missing, f"missing editions: {missing}"
    return paths


def prose(name: str) -> dict[str, str]:
    """Each edition's markdown, all cells joined, whitespace runs collapsed to one space."""
    return {lang: " ".join("\n".join("".join(c["source"]) for c in _cells(p) if c["cell_type"] == "markdown").split())
            for lang, p in editions(name).items()}


def code_cell(name: str, cell_id: str) -> ast.Module:
    """The English edition's code cell ``cell_id``, parsed (the twins' code is the same: test_editions)."""
    [cell] = [c for c in _cells(editions(name)["en"]) if c["id"] == cell_id]
    assert cell["cell_type"] == "code", f"{name} cell {cell_id} is not a code cell"
    return ast.parse("".join(cell["source"]))


def stated(texts: dict[str, str], *phrases: str | dict[str, str]) -> None:
    """Every phrase occurs in every edition; a dict gives the phrase per language."""
    assert set(texts) == set(LANGS)
    for phrase in phrases:
        for lang in LANGS:
            want = phrase[lang] if isinstance(phrase, dict) else phrase
            assert want in texts[lang], f"the {lang} edition no longer states {want!r}"
