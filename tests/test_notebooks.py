"""Committed notebooks stay clean and parameterisable (structure only; `make notebooks`/`make run`
execute them).

* every notebook under notebooks/, solutions/ and exercises/ is valid nbformat v4, has no outputs
  and no execution counts (students start from a blank slate; diffs stay readable);
* every chapter in notebooks/ starts with a markdown title, then a code cell tagged ``parameters``
  that reads ``TINYTF_DEVICE`` and defines ``device`` and ``fast`` — and papermill can override them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
ALL = sorted(p for d in ("notebooks", "solutions", "exercises") for p in (ROOT / d).rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
CHAPTERS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _id(p: Path) -> str:
    return str(p.relative_to(ROOT))


def _read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=nbformat.NO_CONVERT)


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


def _parameters_cell(nb: nbformat.NotebookNode) -> tuple[int, nbformat.NotebookNode]:
    tagged = [(i, c) for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, f"expected exactly one cell tagged 'parameters', found {len(tagged)}"
    return tagged[0]


@pytest.mark.parametrize("path", CHAPTERS, ids=_id)
def test_chapter_has_title_then_parameters_cell(path: Path):
    nb = _read(path)
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.lstrip().startswith("# "), f"{_id(path)}: cell 1 must be a markdown '# title'"
    index, cell = _parameters_cell(nb)
    assert cell.cell_type == "code"
    code_cells = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    assert code_cells[0] == index, f"{_id(path)}: the parameters cell must be the first code cell"
    assert "TINYTF_DEVICE" in cell.source, f"{_id(path)}: the parameters cell must read TINYTF_DEVICE"
    body = ast.parse(cell.source).body
    assigned = {t.id for node in body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)}
    assert {"device", "fast"} <= assigned, f"{_id(path)}: the parameters cell must define device and fast, defines {sorted(assigned)}"


@pytest.mark.parametrize("path", CHAPTERS, ids=_id)
def test_papermill_can_override_the_parameters(path: Path):
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
