"""The two editions (English and Chinese) of every notebook, and the rules that keep them in step.

A Chinese twin lives beside its English notebook in a ``zh/`` folder with the same file name
(``notebooks/zh/03_multi_head.ipynb``). Twins have the same cells (ids, types, metadata); their code
cells are the same program once comments are removed (compared as :mod:`tokenize` token streams, so
a translated comment can never change code); nbgrader's markers and metadata are identical. The
edition is read from notebook metadata (``metadata.tinytf.edition``), never guessed from a path.
"""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tinytf.language import LANGUAGES, edition_of

__all__ = [
    "EDITIONS",
    "edition",
    "twin_path",
    "english_path",
    "code_tokens",
    "compare_twins",
    "needs_translation",
]

EDITIONS = LANGUAGES
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
# nbgrader's region markers are comments, so the token comparison alone would not see a lost one
_MARKER = re.compile(r"^\s*#+\s*(BEGIN|END) (SOLUTION|HIDDEN TESTS)\b.*$", re.MULTILINE)
_SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER}


def edition(nb: dict[str, Any]) -> str:
    """``"zh"`` or ``"en"``: the notebook's ``metadata.tinytf.edition`` (English when absent)."""
    return edition_of(nb)


def twin_path(english: str | Path, lang: str = "zh") -> Path:
    """``notebooks/03_x.ipynb`` -> ``notebooks/zh/03_x.ipynb``."""
    p = Path(english)
    return p.parent / lang / p.name


def english_path(twin: str | Path) -> Path:
    """``notebooks/zh/03_x.ipynb`` -> ``notebooks/03_x.ipynb``."""
    p = Path(twin)
    return p.parent.parent / p.name


def _source(cell: dict[str, Any]) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def code_tokens(source: str) -> list[tuple[int, str]]:
    """The token stream of a code cell without comments and blank lines: what runs."""
    tokens: Iterator[tokenize.TokenInfo] = tokenize.generate_tokens(io.StringIO(source + "\n").readline)
    return [(t.type, t.string) for t in tokens if t.type not in _SKIP]


def _first_difference(a: list[tuple[int, str]], b: list[tuple[int, str]]) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"token {i}: English {x[1]!r}, twin {y[1]!r}"
    return f"the English has {len(a)} tokens, the twin {len(b)}"


def _comparable_metadata(cell: dict[str, Any]) -> dict[str, Any]:
    """Cell metadata without nbgrader's ``checksum`` of a released cell: it hashes the source, comments
    included, so it differs between twins by design (the grader compares each edition with its own)."""
    meta = dict(cell.get("metadata", {}))
    if isinstance(meta.get("nbgrader"), dict):
        meta["nbgrader"] = {k: v for k, v in meta["nbgrader"].items() if k != "checksum"}
    return meta


def _cell_problems(en: dict[str, Any], zh: dict[str, Any]) -> list[str]:
    if en.get("cell_type") != zh.get("cell_type"):
        return [f"cell type {zh.get('cell_type')} differs from the English {en.get('cell_type')}"]
    problems = []
    if _comparable_metadata(en) != _comparable_metadata(zh):
        problems.append("cell metadata (tags, nbgrader grade id/points/locked) differs from the English twin")
    if en["cell_type"] == "code":
        a, b = _source(en), _source(zh)
        try:
            ta, tb = code_tokens(a), code_tokens(b)
        except (tokenize.TokenError, SyntaxError, IndentationError) as exc:
            return problems + [f"code does not tokenize: {exc}"]
        if ta != tb:
            problems.append(f"code differs from the English twin: {_first_difference(ta, tb)}")
        if _MARKER.findall(a) != _MARKER.findall(b):
            problems.append("nbgrader BEGIN/END markers differ from the English twin")
    return problems


def compare_twins(en_nb: dict[str, Any], zh_nb: dict[str, Any], where: str = "") -> list[str]:
    """Every way ``zh_nb`` is out of step with ``en_nb``, as messages naming the cell (empty if none)."""
    head = f"{where} " if where else ""
    en_cells, zh_cells = en_nb.get("cells", []), zh_nb.get("cells", [])
    en_ids, zh_ids = [c.get("id") for c in en_cells], [c.get("id") for c in zh_cells]
    if en_ids != zh_ids:
        missing = [i for i in en_ids if i not in zh_ids]
        extra = [i for i in zh_ids if i not in en_ids]
        return [f"{head}cells do not align with the English twin by id (missing {missing}, extra {extra}; "
                "order must match too): copy the English notebook and translate its cells in place"]
    problems = []
    for i, (en, zh) in enumerate(zip(en_cells, zh_cells)):
        problems += [f"{head}cell {i} (id {zh.get('id')}): {p}" for p in _cell_problems(en, zh)]
    return problems


def needs_translation(cell: dict[str, Any]) -> bool:
    """True for a markdown cell with English prose and no Chinese (code and maths alone are fine)."""
    if cell.get("cell_type") != "markdown":
        return False
    text = _source(cell)
    if _CJK.search(text):
        return False
    prose = re.sub(r"```.*?```|`[^`]*`|\$\$.*?\$\$|\$[^$]*\$|<[^>]+>|\[[^\]]*\]\([^)]*\)", " ", text, flags=re.DOTALL)
    return len(re.findall(r"[A-Za-z]{3,}", prose)) >= 3
