"""Every exercise, in both editions, instructor source and released copy, has one skeleton.

1. the title cell ``# Exercise N — …`` whose intro states ``Total: P points``, then the ``parameters`` cell;
2. parts ``## Part A — title (p points)`` (``## A 部分 — 标题（p 分）``), lettered A, B, C … in order; a
   part's points are the points of the graded cells under it, and every graded cell lies in a part;
3. autograded test cells that open with ``# Visible checks`` (``# 可见检查``), checks a student can read;
   in the instructor source their hidden tests assert nothing themselves: they call the task's probe and
   record through the judge (``judged_record("<the cell's grade id>", …)``), so that the hidden test and the
   grader's judge cannot disagree;
4. test cells bind private names only (``_x``): they never rebind a name of the student's;
5. exactly one short written answer (a graded markdown cell), in the last part, whose heading says that an
   instructor reads it;
6. a ``## Summary`` (``## 小结``), then the self-check: the last two cells;
7. every cell carries nbgrader metadata with a grade id of its own (``exNN_…``);
8. one convention for type hints: every function and method the notebook defines annotates its
   parameters and its return value.
"""

from __future__ import annotations

import ast
import json
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXPECTED_EXERCISES = 12


@dataclass(frozen=True)
class Words:
    """The skeleton's words in one edition."""

    lang: str
    title: re.Pattern[str]
    total: re.Pattern[str]
    part: re.Pattern[str]
    visible: str
    manual: str
    summary: str


EN = Words("en", re.compile(r"# Exercise (\d+) — \S"), re.compile(r"Total: (\d+) points"),
           re.compile(r"## Part ([A-Z]) — .+ \((\d+) points?(, read by an instructor)?\)$"), "# Visible check", "read by an instructor",
           "## Summary")
ZH = Words("zh", re.compile(r"# 练习 (\d+) — \S"), re.compile(r"总分：(\d+) 分"),
           re.compile(r"## ([A-Z]) 部分 — .+（(\d+) 分(，由教师阅读)?）$"), "# 可见检查", "由教师阅读", "## 小结")
FOLDERS = [(EN, ROOT / "solutions", True), (EN, ROOT / "exercises", False),
           (ZH, ROOT / "solutions" / "zh", True), (ZH, ROOT / "exercises" / "zh", False)]
NOTEBOOKS = [(words, path, source) for words, folder, source in FOLDERS for path in sorted(folder.glob("ex[0-9][0-9]_*.ipynb"))]
HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", re.S)


def _id(value) -> str:
    return str(value.relative_to(ROOT)) if isinstance(value, Path) else ""


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _src(cell: dict) -> str:
    return "".join(cell["source"])


def _meta(cell: dict) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _is_test(cell: dict) -> bool:
    return cell["cell_type"] == "code" and bool(_meta(cell).get("grade")) and not _meta(cell).get("solution")


def _bound(tree: ast.Module) -> set[str]:
    """The names a cell binds in the notebook's globals (not inside its functions)."""
    names: set[str] = set()

    def targets(node: ast.AST) -> None:
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, (ast.Tuple, ast.List)):
            for elt in node.elts:
                targets(elt)
        elif isinstance(node, ast.Starred):
            targets(node.value)

    def walk(stmts: list[ast.stmt]) -> None:
        for s in stmts:
            if isinstance(s, ast.Assign):
                for t in s.targets:
                    targets(t)
            elif isinstance(s, (ast.AugAssign, ast.AnnAssign)):
                targets(s.target)
            elif isinstance(s, ast.For):
                targets(s.target)
                walk(s.body + s.orelse)
            elif isinstance(s, (ast.While, ast.If)):
                walk(s.body + s.orelse)
            elif isinstance(s, ast.With):
                for item in s.items:
                    if item.optional_vars is not None:
                        targets(item.optional_vars)
                walk(s.body)
            elif isinstance(s, ast.Try):
                walk(s.body + s.orelse + s.finalbody)
                for handler in s.handlers:
                    if handler.name:
                        names.add(handler.name)
                    walk(handler.body)
            elif isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(s.name)
            elif isinstance(s, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in s.names)

    walk(tree.body)
    names.update(n.target.id for n in ast.walk(tree) if isinstance(n, ast.NamedExpr) and isinstance(n.target, ast.Name))
    return names


def test_every_exercise_is_here_in_both_editions():
    for _words, folder, _ in FOLDERS:
        found = sorted(p.name for p in folder.glob("ex[0-9][0-9]_*.ipynb"))
        assert len(found) == EXPECTED_EXERCISES, f"{_id(folder)}: {len(found)} exercises, expected {EXPECTED_EXERCISES}: {found}"
    assert len(NOTEBOOKS) == 4 * EXPECTED_EXERCISES


@pytest.mark.parametrize(("words", "path", "source"), NOTEBOOKS, ids=[_id(p) for _, p, _ in NOTEBOOKS])
def test_every_cell_has_nbgrader_metadata_and_its_own_grade_id(words, path, source):
    ex = path.name[:4]
    gids = [_meta(c).get("grade_id") for c in _cells(path)]
    missing = [c.get("id") for c in _cells(path) if not _meta(c)]
    assert not missing, f"{_id(path)}: cells without nbgrader metadata: {missing}"
    assert all(g and g.startswith(f"{ex}_") for g in gids), f"{_id(path)}: grade ids must start with {ex}_: {gids}"
    assert len(set(gids)) == len(gids), f"{_id(path)}: repeated grade ids {sorted(g for g in gids if gids.count(g) > 1)}"


@pytest.mark.parametrize(("words", "path", "source"), NOTEBOOKS, ids=[_id(p) for _, p, _ in NOTEBOOKS])
def test_title_parameters_parts_with_their_points_summary_and_self_check(words, path, source):
    cells = _cells(path)
    ex = path.name[:4]
    title = words.title.match(_src(cells[0]))
    assert cells[0]["cell_type"] == "markdown" and title and int(title[1]) == int(ex[2:]), f"{_id(path)}: title cell"
    assert cells[1]["cell_type"] == "code" and "parameters" in cells[1]["metadata"].get("tags", []), f"{_id(path)}: parameters cell second"
    assert [c["cell_type"] for c in cells[-2:]] == ["markdown", "code"] and _src(cells[-1]).strip().endswith(f'self_check("{ex}")'), (
        f"{_id(path)}: the self-check is last")
    summary = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown" and _src(c).startswith(words.summary)]
    assert summary == [len(cells) - 3], f"{_id(path)}: one {words.summary!r} cell, right before the self-check"

    parts: list[list] = []  # [letter, points in the heading, points of its graded cells, written?, heading]
    for cell in cells[: summary[0]]:
        heading = _src(cell).split("\n")[0] if cell["cell_type"] == "markdown" else ""
        if heading.startswith("## ") and not words.part.match(heading):
            assert not re.match(r"## (Part|[A-Z] 部分)", heading), f"{_id(path)}: malformed part heading {heading!r}"
        match = words.part.match(heading)
        if match:
            parts.append([match[1], int(match[2]), 0, False, heading])
        elif _meta(cell).get("grade"):
            assert parts, f"{_id(path)}: graded cell {_meta(cell)['grade_id']} before the first part"
            parts[-1][2] += _meta(cell)["points"]
            parts[-1][3] |= cell["cell_type"] == "markdown"
    assert [p[0] for p in parts] == [chr(ord("A") + i) for i in range(len(parts))] and len(parts) >= 3, (
        f"{_id(path)}: parts must be lettered A, B, C … in order: {[p[0] for p in parts]}")
    for letter, stated, graded, written, heading in parts:
        assert stated == graded, f"{_id(path)}: part {letter} says {stated} points, its graded cells hold {graded}: {heading!r}"
        assert written == (words.manual in heading), f"{_id(path)}: part {letter}: only the written answer's heading says {words.manual!r}"
    total = words.total.search(_src(cells[0]))
    points = sum(_meta(c)["points"] for c in cells if _meta(c).get("grade"))
    assert total and int(total[1]) == points, f"{_id(path)}: the intro must state the total of {points} points"
    manual = [c for c in cells if _meta(c).get("grade") and c["cell_type"] == "markdown"]
    assert len(manual) == 1 and _meta(manual[0]).get("solution") and parts[-1][3], (
        f"{_id(path)}: exactly one written answer, in the last part")


@pytest.mark.parametrize(("words", "path", "source"), NOTEBOOKS, ids=[_id(p) for _, p, _ in NOTEBOOKS])
def test_test_cells_show_visible_checks_and_record_hidden_tests_through_the_judge(words, path, source):
    tests = [c for c in _cells(path) if _is_test(c)]
    assert len(tests) >= 2, f"{_id(path)}: at least two autograded test cells"
    for cell in tests:
        gid, text = _meta(cell)["grade_id"], _src(cell)
        assert text.startswith(words.visible), f"{_id(path)}: {gid} must open with {words.visible!r}, opens with {text[:40]!r}"
        hidden = HIDDEN.findall(text)
        if not source:
            assert not hidden and "HIDDEN" not in text, f"{_id(path)}: {gid} released with its hidden tests"
            continue
        assert len(hidden) == 1, f"{_id(path)}: {gid} needs one hidden-test block"
        code = ast.parse(textwrap.dedent(hidden[0]))
        asserts = [n for n in ast.walk(code) if isinstance(n, ast.Assert)]
        assert not asserts, f"{_id(path)}: {gid}'s hidden tests assert themselves; let the judge decide (judged_record)"
        calls = re.findall(r'judged_record\("([^"]+)"', hidden[0])
        assert calls == [gid], (f"{_id(path)}: {gid}'s hidden tests must record through its judge once: "
                                f"judged_record({gid!r}, …); found {calls}")


@pytest.mark.parametrize(("words", "path", "source"), NOTEBOOKS, ids=[_id(p) for _, p, _ in NOTEBOOKS])
def test_test_cells_never_rebind_the_students_names(words, path, source):
    for cell in _cells(path):
        if _is_test(cell):
            public = sorted(n for n in _bound(ast.parse(_src(cell))) if not n.startswith("_"))
            assert not public, f"{_id(path)}: test cell {_meta(cell)['grade_id']} binds {public}: use private names (_x) or a function"


@pytest.mark.parametrize(("words", "path", "source"), NOTEBOOKS, ids=[_id(p) for _, p, _ in NOTEBOOKS])
def test_every_function_the_notebook_defines_has_type_hints(words, path, source):
    for cell in _cells(path):
        if cell["cell_type"] != "code" or _is_test(cell):
            continue
        for node in ast.walk(ast.parse(_src(cell))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                bare = [a.arg for a in args if a.annotation is None and a.arg not in ("self", "cls")]
                bare += [f"*{a.arg}" for a in (node.args.vararg, node.args.kwarg) if a is not None and a.annotation is None]
                assert not bare and node.returns is not None, (
                    f"{_id(path)}: {_meta(cell).get('grade_id')}: {node.name} needs type hints on {bare or []}"
                    f"{' and its return value' if node.returns is None else ''}")


def test_the_checks_catch_a_drifted_exercise():
    """The skeleton's checks fail on the habits of the older generations."""
    old_test = {"cell_type": "code", "metadata": {"nbgrader": {"grade": True, "solution": False, "grade_id": "ex01_x", "points": 1}},
                "source": ["# Test: rows sum to one\n", "v = torch.ones(3)\n", "### BEGIN HIDDEN TESTS\n",
                           "assert f(v).sum() == 3\n", "record(\"ex01_x\", f(v))\n", "### END HIDDEN TESTS\n"]}
    assert not _src(old_test).startswith(EN.visible)
    assert _bound(ast.parse(_src(old_test))) == {"v"}
    hidden = HIDDEN.findall(_src(old_test))[0]
    assert any(isinstance(n, ast.Assert) for n in ast.walk(ast.parse(hidden)))
    assert not re.findall(r'judged_record\("([^"]+)"', hidden)
    assert not EN.part.match("### Task 1a — pen and paper (2 points)") and not EN.part.match("## Part A — the cache")
    assert EN.part.match("## Part A — the cache (3 points)") and ZH.part.match("## A 部分 — 缓存（3 分）")
    unhinted = ast.parse("def f(q, k: int) -> int:\n    return k\n").body[0]
    assert [a.arg for a in unhinted.args.args if a.annotation is None] == ["q"]


@pytest.mark.parametrize("readme", ["README.md", "README.zh.md"])
def test_the_readmes_exercise_table_gives_each_exercises_points(readme):
    """The instructors' table (autograded, written, total per exercise) is the notebooks' own count."""
    rows = re.findall(r"^\| (ex\d\d) [^|]+\| [^|]+\| (\d+) \| (\d+) \| (\d+) \|", (ROOT / readme).read_text(encoding="utf-8"), re.M)
    assert len(rows) == EXPECTED_EXERCISES, f"{readme}: {len(rows)} rows in the exercise table, expected {EXPECTED_EXERCISES}"
    for ex, auto, written, total in rows:
        cells = _cells(next((ROOT / "solutions").glob(f"{ex}_*.ipynb")))
        graded = [c for c in cells if _meta(c).get("grade")]
        got = (sum(_meta(c)["points"] for c in graded if c["cell_type"] == "code"),
               sum(_meta(c)["points"] for c in graded if c["cell_type"] == "markdown"))
        assert (int(auto), int(written), int(total)) == (*got, sum(got)), (
            f"{readme}: {ex} says {auto} + {written} = {total}, the notebook {got}")
