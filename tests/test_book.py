"""tinytf.course.build.executed and tinytf.course.build.book without a browser: where executed copies go, what their
reuse is keyed on, that execution keeps figures as images, how a chapter becomes a page, and the
glossary's words for jieba."""

from __future__ import annotations

import json

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from tinytf.course.build import book, executed
from tinytf.course.exercises import REPO


def test_executed_copies_are_named_by_their_path():
    assert executed.executed_path(REPO / "notebooks" / "01_attention.ipynb") == executed.EXECUTED / "01_attention.ipynb"
    assert executed.executed_path(REPO / "notebooks" / "zh" / "02_masks.ipynb") == executed.EXECUTED / "zh" / "02_masks.ipynb"
    assert (executed.executed_path(REPO / "solutions" / "zh" / "ex01_by_hand.ipynb")
            == executed.EXECUTED / "solutions" / "zh" / "ex01_by_hand.ipynb")
    with pytest.raises(ValueError, match="not in the repository"):
        executed.executed_path(REPO.parent / "elsewhere.ipynb")


def test_every_chapter_of_both_editions_is_executed():
    sources = book.chapter_sources()
    en = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert len(en) >= 11 and len(sources) == 2 * len(en)
    assert [p.name for p in sources[len(en):]] == [p.name for p in en]  # the Chinese twins, same names


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A two-cell notebook under the repository's build/ (copies are named by their path in the repository)
    and a private package folder standing in for tinytf/, so the key's package part can be changed."""
    folder = REPO / "build" / "test-book" / tmp_path.name
    folder.mkdir(parents=True)
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "mod.py").write_text("x = 1\n")
    monkeypatch.setattr(executed, "PACKAGE", pkg)
    executed._package_digest.cache_clear()
    nb = new_notebook(cells=[new_code_cell('device = "auto"', metadata={"tags": ["parameters"]}),
                             new_code_cell("import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 2])\nplt.show()")])
    nb.metadata.update(kernelspec={"name": "python3", "language": "python", "display_name": "Python 3"},
                       language_info={"name": "python"})
    path = folder / "figure.ipynb"
    nbformat.write(nb, path)
    yield path, tmp_path / "executed", pkg
    executed._package_digest.cache_clear()
    import shutil

    shutil.rmtree(folder, ignore_errors=True)


def test_the_key_changes_with_the_notebook_the_package_and_the_device(scratch):
    nb, _, pkg = scratch
    key = executed.execution_key(nb)
    assert executed.execution_key(nb) == key and executed.execution_key(nb, "cuda") != key
    (pkg / "mod.py").write_text("x = 2\n")
    executed._package_digest.cache_clear()
    assert executed.execution_key(nb) != key, "a library change re-executes"
    changed = executed.execution_key(nb)
    (pkg / "course" / "build").mkdir(parents=True)
    (pkg / "course" / "build" / "book.py").write_text("# the book's builder: no chapter imports it\n")
    executed._package_digest.cache_clear()
    assert executed.execution_key(nb) == changed, "editing the book's builder does not re-execute"
    nb.write_text(nb.read_text().replace("[1, 2]", "[1, 3]"))
    assert executed.execution_key(nb) != changed, "a notebook change re-executes"
    changed = executed.execution_key(nb)
    (nb.parent / "matplotlibrc").write_text("font.family: sans-serif\n")
    assert executed.execution_key(nb) != changed, "another font for the folder's figures re-executes"


@pytest.mark.slow  # one papermill run (a few seconds)
def test_execute_keeps_figures_as_images_and_reuses_only_an_up_to_date_copy(scratch, monkeypatch):
    nb, root, pkg = scratch
    out = executed.execute(nb, root=root)
    done = json.loads(out.read_text(encoding="utf-8"))
    outputs = [o for c in done["cells"] for o in c.get("outputs", [])]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 1, "the figure is an image, not '<Figure size ...>'"
    assert done["metadata"]["tinytf"]["execution_key"] == executed.execution_key(nb)
    assert any("injected-parameters" in c["metadata"].get("tags", []) for c in done["cells"])

    class NoPool:  # an up-to-date copy starts no worker at all
        def __init__(self, *args, **kwargs):
            raise AssertionError("an up-to-date copy was executed again")

    with monkeypatch.context() as m:
        m.setattr(executed, "ProcessPoolExecutor", NoPool)
        assert executed.execute(nb, root=root) == out, "an up-to-date copy is reused"
    (pkg / "mod.py").write_text("x = 3\n")
    executed._package_digest.cache_clear()
    nbformat.write(nbformat.v4.new_notebook(cells=[*nbformat.read(nb, as_version=4).cells, new_code_cell("1 / 0")],
                                            metadata=nbformat.read(nb, as_version=4).metadata), nb)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        executed.execute(nb, root=root)  # the package and the notebook changed: executed again, and its last cell fails
    failed = out.with_name(f"{out.stem}.failed.ipynb")
    assert not out.exists(), "a failed run leaves no copy to reuse"
    assert failed.exists() and "ZeroDivisionError" in failed.read_text(), "the partial run is kept, with the error"


def test_a_chapter_page_hides_the_injected_parameters_cell(tmp_path):
    nb = new_notebook(cells=[new_code_cell("device = 'auto'", metadata={"tags": ["parameters"]}),
                             new_code_cell('# Parameters\ndevice = "cpu"\n', metadata={"tags": ["injected-parameters"]}),
                             new_code_cell("x = 1")])
    nbformat.write(nb, tmp_path / "c.ipynb")
    tags = [c["metadata"].get("tags", []) for c in book.book_page(tmp_path / "c.ipynb")["cells"]]
    assert tags == [["parameters"], ["injected-parameters", "remove-cell"], []]


def test_the_glossary_gives_jieba_its_chinese_terms():
    terms = book.glossary_terms()
    assert len(terms) >= 40
    for t in ("掩码", "因果掩码", "填充掩码", "缓存", "多头注意力", "分组查询注意力"):
        assert t in terms, t
    assert not [t for t in terms if any(ch.isascii() for ch in t)], "jieba words: no Latin letters, spaces or slashes"


def test_missing_glyphs_are_found_in_stream_outputs():
    warning = "/x.py:3: UserWarning: Glyph 25439 (\\N{CJK UNIFIED IDEOGRAPH-635F}) missing from font(s) DejaVu Sans.\n"
    nb = {"cells": [{"cell_type": "code", "outputs": [{"output_type": "stream", "name": "stderr", "text": [warning, warning]},
                                                      {"output_type": "stream", "name": "stdout", "text": "ok\n"}]},
                    {"cell_type": "markdown", "source": "missing from font"}]}
    assert executed.missing_glyphs(nb) == [warning.strip()]
    assert executed.missing_glyphs({"cells": [{"cell_type": "code", "outputs": []}]}) == []
