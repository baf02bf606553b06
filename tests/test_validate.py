"""tinytf validate and self_check: a wrong answer is named (pitfall), deleted/edited test cells are caught,
the exit status says whether anything is wrong, and self_check never raises."""

from __future__ import annotations

import json
import re

import _coursekit as K
import pytest

from tinytf.course.cli import main
from tinytf.course.nbgrader_root import REPO
from tinytf.course.validate import diagnose_json, self_check, validate

pytestmark = pytest.mark.grading  # real validate/grade runs: make unit, not make test-fast


@pytest.fixture(scope="module")
def released():
    """A release of today's solutions (made once per session: tests/_coursekit.fresh_release)."""
    return K.fresh_release("en")


def test_validate_names_the_pitfall_and_catches_deleted_and_edited_tests(released, tmp_path, capsys):
    rel, sol = K.load(released / "ex01_by_hand.ipynb"), K.load(REPO / "solutions" / "ex01_by_hand.ipynb")
    nb = K.edited(K.solved(rel, sol), "ex01_scores_answer", K.WRONG_SCORES)  # forgets 1/sqrt(d)
    nb = K.without_cell(nb, "ex01_hand_qk")
    nb = K.edited(nb, "ex01_softmax", "assert True  # tests are for other people")
    path = K.save(nb, tmp_path / "ex01_by_hand.ipynb")
    rc = main(["validate", str(path), "--released", str(released), "--timeout", "60"])
    out = capsys.readouterr().out
    print(out)
    assert rc == 1
    assert "FAIL    ex01_scores" in out
    assert "PASS    ex01_attention" in out, "Task 1d runs on tinytf's scores: the wrong scores_by_hand costs only Task 1b"
    assert "pitfall 1" in out and "sqrt" in out, "the diagnosis names the missing scale"
    assert "test cell ex01_hand_qk was deleted" in out and "test cell ex01_softmax was edited" in out
    assert re.search(r"PASS    ex01_hand_qk \(2 pt, cell \d+ \(under \"[^\"]+\"\)\) \[deleted\]", out), (
        "the released test is run in place of the deleted one, and the line says where it is, as JupyterLab shows it")
    assert re.search(r"PASS    ex01_softmax \(4 pt, cell \d+ .*\) \[edited\]", out)
    assert "Result: FAILED" in out


def test_validate_passes_a_correct_notebook_and_fails_an_untouched_or_unreadable_one(released, tmp_path, capfd):
    rel, sol = K.load(released / "ex01_by_hand.ipynb"), K.load(REPO / "solutions" / "ex01_by_hand.ipynb")
    good = K.save(K.solved(rel, sol), tmp_path / "good" / "ex01_by_hand.ipynb")
    bad = K.save("{ not a notebook", tmp_path / "bad" / "ex01_by_hand.ipynb")
    rc = main(["validate", str(good), "--released", str(released)])
    out, err = capfd.readouterr()  # file descriptors: the kernel's own stderr too
    assert rc == 0, out
    assert "Result: OK" in out and "no known pitfall" in out
    assert "without encryption" not in err, "our kernels get CurveZMQ keys, so ipykernel has nothing to warn about"
    assert main(["validate", str(bad), "--released", str(released)]) == 2
    assert "cannot read" in capfd.readouterr().out


def test_self_check_never_raises_and_explains(capsys):
    self_check("ex01")  # pytest's __main__ has none of the student's functions
    out = capsys.readouterr().out
    assert "ex01 self-check" in out and "tinytf validate exercises/ex01" in out
    self_check("ex99")  # no such exercise: says so, does not raise
    assert "could not run" in capsys.readouterr().out

    def stub(*args, **kwargs):
        raise NotImplementedError()

    data = json.loads(diagnose_json("ex01", {"scores_by_hand": stub, "softmax_by_hand": stub, "attention_by_hand": stub}))
    assert "findings" in data and data["findings"], "unimplemented functions are reported, not raised"


def test_cells_are_named_the_way_a_student_sees_them():
    from tinytf.course.notebook import describe_cell

    cells = [{"cell_type": "markdown", "source": "## Task 1b — scaling\n\nDivide the scores."},
             {"cell_type": "code", "source": "x = 1"},
             {"cell_type": "code", "source": "def scores_by_hand(q, k):\n    return q @ k.T\n\nclass Helper:\n    pass"},
             {"cell_type": "code", "source": "def broken(:"}]
    assert describe_cell(cells, 1) == 'cell 2 (under "Task 1b — scaling")'
    assert describe_cell(cells, 2) == "cell 3 (defines scores_by_hand, Helper)"
    assert describe_cell(cells, 3) == "cell 4 (defines broken)", "a cell with a syntax error is still found by its def"
    assert describe_cell(cells, 0) == "cell 1"


def _run_in_kernel(path) -> str:
    """Run a notebook the way JupyterLab's "Run All" does (kernel in its folder); the last cell's text."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    return "".join(o.get("text", "") for o in nb.cells[-1].outputs)


def test_the_self_check_cell_and_validate_agree_on_a_deleted_test_cell(released, tmp_path, monkeypatch):
    """One way to check work: the two-line self-check runs validate's check in the student's kernel, so
    a deleted test cell (which nbgrader's own validate misses) is red in both."""
    monkeypatch.setenv("TINYTF_HEADLESS", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    rel, sol = K.load(REPO / "exercises" / "ex01_by_hand.ipynb"), K.load(REPO / "solutions" / "ex01_by_hand.ipynb")
    solved = K.solved(rel, sol)
    assert K.src(solved["cells"][-1]) == 'from tinytf.course import self_check\nself_check("ex01")'
    good = K.save(solved, tmp_path / "good" / "ex01_by_hand.ipynb")
    out = _run_in_kernel(good)
    assert "ex01 self-check" in out and "Result: OK" in out, out
    bad = K.save(K.without_cell(solved, "ex01_hand_qk"), tmp_path / "bad" / "ex01_by_hand.ipynb")
    out = _run_in_kernel(bad)
    assert "test cell ex01_hand_qk was deleted" in out and "Result: FAILED" in out, out
    report = validate(bad)
    assert not report.ok and report.self_check_ok is False and any("ex01_hand_qk was deleted" in s for s in report.structure)


def test_self_check_speaks_the_notebook_language(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TINYTF_LANG", "zh")
    self_check("ex01")
    out = capsys.readouterr().out
    assert "ex01 自检" in out and "tinytf validate exercises/zh/ex01_by_hand.ipynb" in out and "Result" not in out, out
