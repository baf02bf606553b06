"""What a student reads in a code cell, told apart from what runs.

:func:`masked_program` is a cell's syntax tree with the words a student reads masked (the twin rule of
:mod:`tinytf.course.build.editions` compares those trees). Masked are comments, docstrings and the text of

- ``print(...)`` / ``display(...)`` / ``Markdown(...)`` / ``HTML(...)`` strings: a string literal, the
  literal parts of an f-string (its ``{expressions}`` stay, in the same order), ``+`` / ``%`` /
  ``.format`` / ``"sep".join([...])`` of those, either branch of ``a if c else b``;
- assert messages and the message of ``raise SomeError("...")``;
- figure text: the first argument of ``set_title``/``set_xlabel``/``set_ylabel``/``title``/``xlabel``/
  ``ylabel``/``suptitle``/``set_label``/``annotate``, the third of ``text``/``figtext``, the label lists
  of ``legend([...])``, and the keywords ``label``, ``title``, ``xlabel``, ``ylabel``, ``*_label``,
  ``*_title``, ``labels``, ``xticklabels``, ``yticklabels`` of any call, and a progress bar's ``desc``.

:func:`displayed_texts` lists those words; :func:`untranslated_texts` and :func:`needs_translation` find the
ones a Chinese notebook left in English.
"""

from __future__ import annotations

import ast
import re
from typing import Any

__all__ = ["masked_program", "displayed_texts", "untranslated_texts", "needs_translation", "KEPT_ENGLISH"]

_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
_CHINESE_TEXT = re.compile(r"[\u3000-\u303f\u3400-\u9fff\uf900-\ufaff\uff00-\uffef]")  # also 。，：（）


_MASK = "…"  # what a masked text becomes: every translation of a sentence compares equal
_DISPLAY_OBJECTS = {"Markdown", "HTML"}
_FIRST_ARG_TEXT = {"set_title", "set_xlabel", "set_ylabel", "set_zlabel", "title", "xlabel", "ylabel", "suptitle", "supxlabel", "supylabel",
                   "set_label", "annotate"}
_THIRD_ARG_TEXT = {"text", "figtext"}
_TEXT_KEYWORDS = {"label", "title", "xlabel", "ylabel", "zlabel", "suptitle", "desc"}  # desc: a progress bar
_TEXT_LIST_KEYWORDS = {"labels", "xticklabels", "yticklabels"}
_LINE_MAGIC = re.compile(r"^([ \t]*)([%!].*)$", re.MULTILINE)


def _is_str(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


_SEEN: list[list[str]] = []  # the words masked by the innermost masked_program call, for untranslated_texts


def _text(node: ast.expr) -> ast.expr:
    """``node`` with the words of a displayed string masked; names, calls and numbers inside stay."""
    if _is_str(node):
        if _SEEN:
            _SEEN[-1].append(node.value)
        return ast.Constant(_MASK)
    if isinstance(node, ast.JoinedStr):  # literal parts (and {"literals"}) go; the {expressions} stay, in order
        if _SEEN:
            _SEEN[-1].append(" ".join(v.value for v in node.values if _is_str(v)))
            _SEEN[-1].extend(v.value.value for v in node.values if isinstance(v, ast.FormattedValue) and _is_str(v.value))
        kept = [v for v in node.values if isinstance(v, ast.FormattedValue) and not _is_str(v.value)]
        for v in kept:
            v.value = _text(v.value)  # {"a" if c else "b"}: the words go, the condition stays
        return ast.JoinedStr(kept)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        node.left = _text(node.left)
        if isinstance(node.op, ast.Add):
            node.right = _text(node.right)
    elif isinstance(node, ast.IfExp):
        node.body, node.orelse = _text(node.body), _text(node.orelse)
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr == "format":
            node.func.value = _text(node.func.value)
        elif node.func.attr == "join" and _is_str(node.func.value):
            node.args = [_items(a) for a in node.args]
    return node


def _items(node: ast.expr) -> ast.expr:
    """A list of displayed strings (legend labels, table rows): each item masked."""
    if isinstance(node, (ast.List, ast.Tuple)):
        node.elts = [_text(e) for e in node.elts]
    elif isinstance(node, (ast.ListComp, ast.GeneratorExp)):
        node.elt = _text(node.elt)
    return node


def _callee(func: ast.expr) -> str:  # print, ax.set_title -> "print", "set_title"
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


class _Masker(ast.NodeTransformer):
    """Masks the words a student reads (see the module docstring); children first, so nesting works."""

    def visit_Call(self, node: ast.Call) -> ast.Call:
        self.generic_visit(node)
        name, method = _callee(node.func), isinstance(node.func, ast.Attribute)
        if (name == "print" and not method) or name == "display" or name in _DISPLAY_OBJECTS:
            node.args = [_text(a) for a in node.args]
        elif method and name in _FIRST_ARG_TEXT and node.args:
            node.args[0] = _text(node.args[0])
        elif method and name in _THIRD_ARG_TEXT and len(node.args) >= 3:
            node.args[2] = _text(node.args[2])
        elif method and name == "legend":
            node.args = [_items(a) for a in node.args]
        for kw in node.keywords:
            if kw.arg in _TEXT_KEYWORDS or (kw.arg or "").endswith(("_label", "_title")):
                kw.value = _text(kw.value)
            elif kw.arg in _TEXT_LIST_KEYWORDS:
                kw.value = _items(kw.value)
        return node

    def visit_Assert(self, node: ast.Assert) -> ast.Assert:
        self.generic_visit(node)
        if node.msg is not None:
            node.msg = _text(node.msg)
        return node

    def visit_Raise(self, node: ast.Raise) -> ast.Raise:
        self.generic_visit(node)
        if isinstance(node.exc, ast.Call):
            node.exc.args = [_text(a) for a in node.exc.args]
        return node

    def generic_visit(self, node: ast.AST) -> ast.AST:
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body \
                and isinstance(body[0], ast.Expr) and _is_str(body[0].value):
            body[0].value = _text(body[0].value)  # a docstring
        return super().generic_visit(node)


def masked_program(source: str) -> ast.Module:
    """The syntax tree of a code cell with comments, docstrings and displayed words masked: what twins share.

    IPython syntax is kept as data: a leading ``%%magic args`` line and each ``%line`` / ``!shell`` line
    become calls with their exact text; the body of a cell magic is parsed as Python (``%%writefile x.py``).
    Raises ``SyntaxError`` for code that does not parse."""
    head: list[ast.stmt] = []
    if source.startswith("%%"):
        first, _, source = source.partition("\n")
        head = ast.parse(f"_ipython_cell_magic_({first!r})").body
    source = _LINE_MAGIC.sub(lambda m: f"{m[1]}_ipython_line_magic_({m[2]!r})", source)
    tree = _Masker().visit(ast.parse(source))
    tree.body[:0] = head
    return tree


def displayed_texts(source: str) -> list[str]:
    """The words a student reads in a code cell, in order: every string :func:`masked_program` masks
    (printed and displayed text, assert and error messages, figure labels, docstrings; an f-string's
    literal parts joined by spaces). Raises ``SyntaxError`` for code that does not parse."""
    _SEEN.append([])
    try:
        masked_program(source)
        return _SEEN[-1]
    finally:
        _SEEN.pop()


# words that stay English in the Chinese edition (notebooks/zh/术语表.md keeps them; units; Python's own words)
KEPT_ENGLISH = frozenset({
    "token", "tokens", "batch", "shape", "softmax", "dtype", "logits", "ids", "mask", "kernel", "notebook",
    "MiB", "GiB", "KiB", "MB", "GB", "FLOPs", "FLOP", "sqrt", "exp", "log", "max", "min", "sum", "std", "mean",
    "True", "False", "None", "NaN", "nan", "inf", "cpu", "cuda", "GPU", "CPU", "CUDA", "SDPA", "sdpa", "TFLOP", "lse", "tinytf", "MACs",
    "rank",  # notebooks/zh/术语表.md keeps rank in English
})
_WORD = re.compile(r"(?<![\w.{\[])[A-Za-z]{3,}(?![\w(\[])")


def _identifiers(source: str) -> set[str]:
    """Every name the cell's code uses (variables, attributes, arguments, functions, imports) and every
    word-like string it uses as data (``method="tiled"``, a dict's keys): the displayed words are masked first."""
    names: set[str] = set()
    for node in ast.walk(masked_program(source)):
        names.update(getattr(node, f) for f in ("id", "attr", "arg", "name") if isinstance(getattr(node, f, None), str))
        if isinstance(node, ast.alias):
            names.update(node.name.split(".") + [node.asname or ""])
        elif _is_str(node) and node.value.isidentifier():
            names.add(node.value)
    return names


def untranslated_texts(source: str) -> list[str]:
    """The :func:`displayed_texts` of a Chinese code cell that are still English: no Chinese character and
    a word of three or more letters outside code (``a_b``, ``x.y``, ``f(``, a name the cell's code uses,
    ``ValueError``), units and :data:`KEPT_ENGLISH`."""
    code = KEPT_ENGLISH | _identifiers(source)
    found = []
    for text in displayed_texts(source):
        bare = re.sub(r"`[^`]*`|\{[^}]*\}|\S*[_=/\\]\S*|\w+(Error|Warning|Exception)\b", " ", text)
        if not _CHINESE_TEXT.search(text) and any(w not in code for w in _WORD.findall(bare)):
            found.append(text)
    return found


def needs_translation(cell: dict[str, Any]) -> bool:
    """True for a markdown cell with English prose and no Chinese (code and maths alone are fine)."""
    if cell.get("cell_type") != "markdown":
        return False
    src = cell.get("source", "")
    text = "".join(src) if isinstance(src, list) else src
    if _CJK.search(text):
        return False
    prose = re.sub(r"```.*?```|`[^`]*`|\$\$.*?\$\$|\$[^$]*\$|<[^>]+>|\[[^\]]*\]\([^)]*\)", " ", text, flags=re.DOTALL)
    return len(re.findall(r"[A-Za-z]{3,}", prose)) >= 3
