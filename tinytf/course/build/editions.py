"""The two editions (English and Chinese) of every notebook, and the rules that keep them in step.

A Chinese twin lives beside its English notebook in a ``zh/`` folder with the same file name
(``notebooks/zh/03_multi_head.ipynb``). Twins have the same cells (ids, types, metadata); their code
cells are *the same program*: their syntax trees (:mod:`ast`) are identical once the words a student
reads are masked (:func:`tinytf.course.build.displayed.masked_program`: comments, docstrings, printed and
displayed text, assert and error messages, figure labels).

Everything else (names, numbers, strings used as data, calls, arguments, format specs, defaults) must match:
a translation never changes what runs. nbgrader's markers and metadata are identical. The edition is read
from notebook metadata (``metadata.tinytf.edition``), never guessed from a path.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tinytf.language import LANGUAGES, edition_of

from .displayed import displayed_texts, masked_program, needs_translation, untranslated_texts

__all__ = [
    "EDITIONS",
    "edition",
    "twin_path",
    "english_path",
    "code_tokens",
    "masked_program",
    "code_difference",
    "compare_twins",
    "needs_translation",
    "displayed_texts",
    "untranslated_texts",
]

EDITIONS = LANGUAGES
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


def _short(node: ast.AST) -> str:
    text = ast.unparse(node).replace("\n", " ")
    return text if len(text) <= 90 else text[:87] + "..."


def _differ(a: Any, b: Any, at: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """``(node, twin node, statement, twin statement)``: the innermost located nodes around the first
    difference and the statement holding them; None if equal."""
    if type(a) is not type(b):
        return (a, b, *at[2:]) if hasattr(a, "lineno") and hasattr(b, "lineno") else at
    if isinstance(a, ast.stmt):
        at = (a, b, a, b)
    elif isinstance(a, ast.AST) and hasattr(a, "lineno"):
        at = (a, b, *at[2:])
    if isinstance(a, list):
        if len(a) != len(b):
            return at
        return next((r for x, y in zip(a, b) if (r := _differ(x, y, at))), None)
    if isinstance(a, ast.AST):
        return next((r for f in a._fields if (r := _differ(getattr(a, f, None), getattr(b, f, None), at))), None)
    return None if a == b else at


def _first_difference(a: ast.Module, b: ast.Module) -> str | None:
    found = _differ(a, b, (None, None, None, None))
    if found is None:
        return None
    x, y, sx, sy = found
    if x is None:
        return f"the English has {len(a.body)} statements, the twin {len(b.body)}"
    where = "" if sx is x else f" in `{_short(sx)}`"
    return f"English line {x.lineno} `{_short(x)}`, twin `{_short(y)}`{where}"


def _token_difference(a: str, b: str) -> str | None:
    ta, tb = code_tokens(a), code_tokens(b)
    if ta == tb:
        return None
    for i, (x, y) in enumerate(zip(ta, tb)):
        if x != y:
            return f"token {i}: English {x[1]!r}, twin {y[1]!r}"
    return f"the English has {len(ta)} tokens, the twin {len(tb)}"


def code_difference(en: str, zh: str) -> str | None:
    """How the twin's code differs from the English as a program (None if it is the same program).

    Code that does not parse in either edition (an unfinished exercise stub) is compared token by token
    without comments instead."""
    try:
        en_tree = masked_program(en)
    except SyntaxError:
        return _token_difference(en, zh)
    try:
        zh_tree = masked_program(zh)
    except SyntaxError as exc:
        return f"the twin does not parse ({exc.msg}, line {exc.lineno}) but the English does"
    return _first_difference(en_tree, zh_tree)


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
            difference = code_difference(a, b)
        except (tokenize.TokenError, SyntaxError, IndentationError) as exc:
            return problems + [f"code does not tokenize: {exc}"]
        if difference:
            problems.append(f"code differs from the English twin: {difference}")
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
