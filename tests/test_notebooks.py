"""Committed notebooks stay clean, parameterisable and shaped like a chapter (structure only;
`make notebooks`/`make run` execute them).

* every notebook under notebooks/, solutions/ and exercises/ is valid nbformat v4, has no outputs
  and no execution counts (students start from a blank slate; diffs stay readable);
* every chapter follows the skeleton the chapters share:

  1. a title cell: ``# NN · Title`` (NN = the file's number), then the learning goals as a
     numbered list;
  2. the ``parameters`` cell (tagged, the first code cell): ``device`` read from ``TINYTF_DEVICE``
     and ``fast`` — and papermill can override them;
  3. sections: at least three ``## `` headings; the numbered ones (``## 1. …``) count 1, 2, 3, …;
  4. ``## Summary`` (a bullet list), then ``## Check yourself`` (numbered questions and, in a
     ``<details>`` block, one numbered answer per question): the last two sections.

The headings are words, so they come from a :class:`Skeleton` per language (:data:`SKELETONS`): a
translated edition (notebooks/zh/) is checked by the same tests once its row names its folder and
headings.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
ALL = sorted(p for d in ("notebooks", "solutions", "exercises") for p in (ROOT / d).rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
MIN_GOALS, MIN_SECTIONS, MIN_SUMMARY_POINTS, MIN_QUESTIONS = 3, 3, 2, 3


@dataclass(frozen=True)
class Skeleton:
    """The words of a chapter's skeleton in one language; numbers, tags and code are shared."""

    lang: str
    folder: Path
    goals: str  # the lead-in of the learning goals in the title cell
    summary: str  # "## <summary>"
    check: str  # "## <check>"
    answers: str  # "<details><summary><answers></summary>" under the questions


SKELETONS = (
    Skeleton("en", ROOT / "notebooks", goals="**Learning goals.**", summary="Summary", check="Check yourself", answers="Answers"),
    # the Chinese edition: the headings its chapters use (see notebooks/zh/术语表.md for the terms)
    Skeleton("zh", ROOT / "notebooks" / "zh", goals="**学习目标**", summary="小结", check="自我检测", answers="参考答案"),
)
CHAPTERS = [(s, p) for s in SKELETONS for p in sorted(s.folder.glob("[0-9][0-9]_*.ipynb"))]
TITLE = re.compile(r"# (\d\d) · \S")  # "# 01 · Attention: …"
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


def _id(p: Path) -> str:
    return str(p.relative_to(ROOT))


def _chapter_id(value: Skeleton | Path) -> str:
    return _id(value) if isinstance(value, Path) else value.lang


def _read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=nbformat.NO_CONVERT)


def _markdown(nb: nbformat.NotebookNode) -> list[str]:
    """The markdown cells' text without fenced code blocks (a ``# comment`` there is not a heading)."""
    return [FENCE.sub("", c.source) for c in nb.cells if c.cell_type == "markdown"]


def _headings(nb: nbformat.NotebookNode, level: int) -> list[str]:
    mark = "#" * level + " "
    return [line[len(mark):].strip() for text in _markdown(nb) for line in text.splitlines() if line.startswith(mark)]


def _numbered(text: str) -> list[int]:
    """The numbers of a markdown numbered list (``1. …`` at the start of a line)."""
    return [int(n) for n in re.findall(r"^(\d+)\. ", text, re.M)]


def _section(text: str, heading: str, until: str | None = None) -> str:
    """The text after ``## heading`` in ``text``, up to ``until`` (a regex) or the next ``## ``."""
    start = re.search(rf"^## {re.escape(heading)}\s*$", text, re.M)
    assert start, f"no '## {heading}' heading"
    rest = text[start.end():]
    end = re.search(until or r"^## ", rest, re.M)
    return rest[: end.start()] if end else rest


@pytest.mark.parametrize("path", ALL, ids=_id)
def test_notebook_is_valid_and_clean(path: Path):
    nb = _read(path)
    assert nb.nbformat == 4, f"{_id(path)}: nbformat {nb.nbformat}, expected 4"
    nbformat.validate(nb)
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, (
        f"{_id(path)}: code cells {dirty} have outputs or execution counts. "
        f"Clear them: jupyter nbconvert --clear-output --inplace {_id(path)}"
    )
    assert nb.metadata.get("kernelspec", {}).get("language", "python") == "python"


def test_the_english_chapters_are_found():
    assert len([p for s, p in CHAPTERS if s.lang == "en"]) >= 9


@pytest.mark.parametrize("skeleton,path", CHAPTERS, ids=_chapter_id)
def test_chapter_starts_with_its_title_and_learning_goals(skeleton: Skeleton, path: Path):
    first = _read(path).cells[0]
    assert first.cell_type == "markdown", f"{_id(path)}: cell 1 must be the markdown title cell"
    title = TITLE.match(first.source.lstrip())
    assert title, f"{_id(path)}: cell 1 must start with '# NN · Title', got {first.source.lstrip()[:40]!r}"
    assert title.group(1) == path.name[:2], f"{_id(path)}: the title's number {title.group(1)} is not the file's"
    assert skeleton.goals in first.source, f"{_id(path)}: the title cell must state the learning goals ({skeleton.goals})"
    goals = _numbered(first.source.split(skeleton.goals, 1)[1])
    assert len(goals) >= MIN_GOALS and goals == list(range(1, len(goals) + 1)), (
        f"{_id(path)}: the learning goals must be a numbered list 1, 2, 3, … (at least {MIN_GOALS}), found {goals}"
    )
    titles = _headings(_read(path), 1)
    assert len(titles) == 1, f"{_id(path)}: the title must be the only '# ' heading, found {titles}"


def _parameters_cell(nb: nbformat.NotebookNode) -> tuple[int, nbformat.NotebookNode]:
    tagged = [(i, c) for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, f"expected exactly one cell tagged 'parameters', found {len(tagged)}"
    return tagged[0]


@pytest.mark.parametrize("skeleton,path", CHAPTERS, ids=_chapter_id)
def test_chapter_has_title_then_parameters_cell(skeleton: Skeleton, path: Path):
    nb = _read(path)
    index, cell = _parameters_cell(nb)
    assert cell.cell_type == "code"
    code_cells = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    assert code_cells[0] == index, f"{_id(path)}: the parameters cell must be the first code cell"
    assigned = {t.id: node.value for node in ast.parse(cell.source).body if isinstance(node, ast.Assign)
                for t in node.targets if isinstance(t, ast.Name)}
    assert {"device", "fast"} <= set(assigned), f"{_id(path)}: the parameters cell must define device and fast, defines {sorted(assigned)}"
    assert "TINYTF_DEVICE" in ast.unparse(assigned["device"]), f"{_id(path)}: device must be read from TINYTF_DEVICE"


@pytest.mark.parametrize("skeleton,path", CHAPTERS, ids=_chapter_id)
def test_chapter_has_sections_then_summary_and_check_yourself(skeleton: Skeleton, path: Path):
    sections = _headings(_read(path), 2)
    assert sections[-2:] == [skeleton.summary, skeleton.check], (
        f"{_id(path)}: the last two sections must be '## {skeleton.summary}' and '## {skeleton.check}', found {sections[-2:]}"
    )
    body = sections[:-2]
    assert len(body) >= MIN_SECTIONS, f"{_id(path)}: at least {MIN_SECTIONS} '## ' sections before the summary, found {body}"
    numbers = [int(m.group(1)) for m in (re.match(r"(\d+)\. ", s) for s in body) if m]
    assert numbers == list(range(1, len(numbers) + 1)), f"{_id(path)}: numbered sections must count 1, 2, 3, …, found {numbers}"


@pytest.mark.parametrize("skeleton,path", CHAPTERS, ids=_chapter_id)
def test_summary_and_check_yourself_have_their_parts(skeleton: Skeleton, path: Path):
    text = "\n".join(_markdown(_read(path)))
    points = re.findall(r"^[*-] ", _section(text, skeleton.summary), re.M)
    assert len(points) >= MIN_SUMMARY_POINTS, f"{_id(path)}: '## {skeleton.summary}' must be a bullet list"
    answers_tag = rf"<details>\s*<summary>{re.escape(skeleton.answers)}</summary>"
    questions = _numbered(_section(text, skeleton.check, until=answers_tag))
    assert len(questions) >= MIN_QUESTIONS and questions == list(range(1, len(questions) + 1)), (
        f"{_id(path)}: '## {skeleton.check}' must ask numbered questions 1, 2, 3, … (at least {MIN_QUESTIONS}), found {questions}"
    )
    answers = re.search(answers_tag + r"(.*?)</details>", text, re.S)
    assert answers, f"{_id(path)}: the answers to '## {skeleton.check}' belong in <details><summary>{skeleton.answers}</summary>"
    assert _numbered(answers.group(1)) == questions, f"{_id(path)}: one numbered answer per question"


@pytest.mark.parametrize("skeleton,path", CHAPTERS, ids=_chapter_id)
def test_papermill_can_override_the_parameters(skeleton: Skeleton, path: Path):
    import papermill
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    found = papermill.inspect_notebook(str(path))  # what `papermill --help-notebook` would list
    assert {"device", "fast"} <= set(found), f"{_id(path)}: papermill sees parameters {sorted(found)}"
    nb = parameterize_notebook(load_notebook_node(str(path)), {"device": "cuda", "fast": False}, kernel_name="python3", language="python")
    index, _ = _parameters_cell(nb)
    injected = nb.cells[index + 1]
    assert "injected-parameters" in injected.metadata.get("tags", [])
    scope: dict = {}
    exec(compile(injected.source, "injected", "exec"), scope)  # noqa: S102 - papermill's own generated code
    assert scope["device"] == "cuda" and scope["fast"] is False


@pytest.mark.parametrize("folder", ["notebooks", "notebooks/zh"])
def test_the_exercises_chapter_describes_every_exercise(folder: str):
    """Chapter 09's "What each one practises" list has a line for every exercise in solutions/ (a new exercise
    added to the course and the table but not to the list was ex12's omission)."""
    exercises = sorted(p.name[:4] for p in (ROOT / "solutions").glob("ex[0-9][0-9]_*.ipynb"))
    assert len(exercises) >= 12, exercises
    nb = nbformat.read(ROOT / folder / "09_exercises.ipynb", as_version=4)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    listed = re.findall(r"^- \*\*(ex\d\d)\*\* ", text, re.M)
    assert listed == exercises, f"{folder}/09_exercises.ipynb lists {listed}, the course has {exercises}"
