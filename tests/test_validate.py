"""tinytf validate and self_check: a wrong answer is named (pitfall), deleted/edited test cells are caught,
the exit status says whether anything is wrong, and self_check never raises."""

from __future__ import annotations

import re

import _coursekit as K
import pytest

from tinytf.course import self_check
from tinytf.course.build.release import release
from tinytf.course.check.selfcheck import diagnose
from tinytf.course.check.validate import validate
from tinytf.course.cli import main
from tinytf.course.exercises import REPO

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

    findings = diagnose("ex01", {"scores_by_hand": stub, "softmax_by_hand": stub, "attention_by_hand": stub})
    assert findings and all(f["pitfall"] == 0 for f in findings), "unimplemented functions are reported, not raised"


def test_cells_are_named_the_way_a_student_sees_them():
    from tinytf.course.ipynb import describe_cell

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

    from tinytf.course.ipynb import kernel_config

    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True, config=kernel_config(),
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



def _slow_toy(folder):
    """``folder/ex90_slow.ipynb``: a toy exercise with no imports (nothing slow but what a test makes slow)."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    def meta(gid, **kw):
        return {"nbgrader": {"schema_version": 3, "grade_id": gid, "solution": False, "grade": False, "locked": True,
                             "task": False, **kw}}

    nb = new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nb.cells = [new_code_cell("import time", metadata=meta("ex90_setup")),
                new_code_cell("def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION",
                              metadata=meta("ex90_double", solution=True, locked=False)),
                new_code_cell("assert double(2) == 4\n### BEGIN HIDDEN TESTS\nassert double(5) == 10, 'hidden'\n### END HIDDEN TESTS",
                              metadata=meta("ex90_double_test", grade=True, points=2)),
                new_code_cell("def square(x):\n    ### BEGIN SOLUTION\n    return x * x\n    ### END SOLUTION",
                              metadata=meta("ex90_square", solution=True, locked=False)),
                new_code_cell("assert square(3) == 9", metadata=meta("ex90_square_test", grade=True, points=1))]
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / "ex90_slow.ipynb")


def test_a_cell_stopped_for_time_is_said_in_words_not_as_a_keyboard_interrupt(tmp_path):
    """A slow cell (here: one that sleeps past a 2 s limit, and a function too slow for its test) is
    reported as stopped for time — which cell, the limit, what to do — never as a KeyboardInterrupt;
    the diagnosis then runs on what was defined and does not rerun the stopped test."""
    from tinytf.course.check.validate import format_report

    released = tmp_path / "released"
    _slow_toy(tmp_path / "src")
    release(tmp_path / "src", released)
    nb = K.solved(K.load(released / "ex90_slow.ipynb"), K.load(tmp_path / "src" / "ex90_slow.ipynb"))
    nb = K.edited(nb, "ex90_double", "def double(x):\n    time.sleep(60)\n    return 2 * x")
    nb = K.add_cell(nb, "time.sleep(60)  # a long training loop", index=1)
    for lang, words in (("en", ("was stopped after", "the limit is 2 s per cell", "fast = True", "--timeout 300")),
                        ("zh", ("后被停止", "每个单元的时间限制是 2 秒", "fast = True", "--timeout 300"))):
        nb.setdefault("metadata", {})["tinytf"] = {"edition": lang}
        path = K.save(nb, tmp_path / lang / "ex90_slow.ipynb")
        report = validate(path, released_dir=released, timeout=2)
        text = format_report(report)
        assert len(report.stopped) == 2, text  # the sleeping cell and the test whose double sleeps
        assert report.stopped[0].startswith(("cell 2 ", "第 2 个单元")) and report.stopped[1].startswith(("cell 4 ", "第 4 个单元")), text
        assert all(w in line for w in words for line in report.stopped), text
        double = next(c for c in report.cells if c.grade_id == "ex90_double_test")
        assert double.status == "timeout" and ("2 s" in double.message or "2 秒" in double.message), text
        assert next(c for c in report.cells if c.grade_id == "ex90_square_test").status == "pass", text
        assert "KeyboardInterrupt" not in text and not report.diagnosis_error and not report.cell_errors, text
        assert not report.ok


def test_grade_says_a_stopped_cell_in_words_in_both_languages():
    """grade's side of a cell stopped for time: the limit, how long it had run, what to do; in Chinese too."""
    from tinytf.course.grade.verdict import classify_test_cell
    from tinytf.course.messages import translate

    cell = {"cell_type": "code", "execution_count": 3, "source": "train_check()", "metadata": {"execution": {
        "iopub.execute_input": "2026-01-01T10:00:00.000000Z", "shell.execute_reply": "2026-01-01T10:01:01.500000Z"}},
        "outputs": [{"output_type": "error", "ename": "KeyboardInterrupt", "evalue": "", "traceback": []},
                    {"output_type": "error", "ename": "CellTimeoutError", "evalue": "", "traceback": []}]}
    status, msg = classify_test_cell(cell, 60)
    assert status == "timeout" and "limit of 60 s" in msg and "had run 62 s" in msg and "fast = True" in msg, msg
    assert "KeyboardInterrupt" not in msg
    zh = translate(msg, "zh")
    assert "时间限制（60 秒）" in zh and "fast = True" in zh and "已被停止" in zh and "ran past" not in zh, zh


def test_an_instructor_source_is_checked_as_a_source(tmp_path):
    """``tinytf validate solutions/exNN_….ipynb``: the source's own tests run, hidden ones too, and a correct
    source passes (exit 0); a source whose hidden test fails is FAILED; a student's copy is compared with
    the release as before."""
    _slow_toy(tmp_path / "src")
    released = tmp_path / "released"
    release(tmp_path / "src", released)
    source = tmp_path / "src" / "ex90_slow.ipynb"
    assert main(["validate", str(source), "--released", str(released), "--timeout", "30"]) == 0
    report = validate(source, released_dir=released, timeout=30)
    assert report.source and report.ok and [c.status for c in report.cells] == ["pass", "pass"] and not report.structure
    broken = K.edited(K.load(source), "ex90_double", "def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x if x < 5 else 0\n"
                      "    ### END SOLUTION")
    report = validate(K.save(broken, tmp_path / "broken" / "ex90_slow.ipynb"), released_dir=released, timeout=30)
    assert report.source and not report.ok and report.cells[0].status == "fail" and "hidden" in report.cells[0].message
    student = K.solved(K.load(released / "ex90_slow.ipynb"), K.load(source))
    student = K.edited(student, "ex90_square_test", "assert True")
    report = validate(K.save(student, tmp_path / "student" / "ex90_slow.ipynb"), released_dir=released, timeout=30)
    assert not report.source and report.problems == {"ex90_square_test": "edited"} and not report.ok
