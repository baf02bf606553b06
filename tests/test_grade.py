"""tinytf grade: a corpus of hostile and honest submissions graded in ONE run, in the grading sandbox.

The corpus (tests/_coursekit.build_corpus) is built from the committed exercises/ and solutions/:
ex01 for every case of issue 8, ex07 (a written answer) for the correct student, and (where bubblewrap runs)
the students of issue 34 who try to get out of the sandbox: the network, the solutions and other students'
files, writes outside their folder, a process left running.
"""

from __future__ import annotations

import csv
import hashlib
import html
import json
import os
import pickle
import re
import socket
import threading
import uuid
from pathlib import Path

import _coursekit as K
import psutil
import pytest

from tinytf.course.exercises import REPO
from tinytf.course.grade.feedback import sanitize_for_feedback
from tinytf.course.grade.gradebook import STATUSES, summary_text
from tinytf.course.grade.run import grade
from tinytf.course.grade.sandbox import bwrap_works, sandbox_mode
from tinytf.course.grade.verdict import classify_test_cell

pytestmark = pytest.mark.grading  # real grading runs: make unit, not make test-fast

CELL_TIMEOUT, NOTEBOOK_TIMEOUT = 10, 45


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _rows(path: Path) -> list[dict]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


# the sandbox tests run where bubblewrap works; CI (TINYTF_REQUIRE_SANDBOX=1) fails instead of skipping them
SANDBOX = bwrap_works() or os.environ.get("TINYTF_REQUIRE_SANDBOX") == "1"
needs_sandbox = pytest.mark.skipif(not SANDBOX, reason="bubblewrap cannot run here (apt-get install bubblewrap)")


class _Server:
    """A TCP server on 127.0.0.1 that counts the connections it accepts (the sandboxed students must make none)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port, self.accepted = self.sock.getsockname()[1], 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()


def _grade_corpus(base: Path) -> None:
    """The submissions, their checksums before grading, and one grading run of them (``base/out``)."""
    subs = base / "submissions"
    released = K.fresh_release("en")  # today's solutions released (once per session; exercises/ is checked by test_release)
    server, marker = _Server(), f"zz-sandbox-probe-{uuid.uuid4().hex[:8]}"
    probes = K.sandbox_probes(server.port, marker, REPO, subs) if SANDBOX else None
    expected = K.build_corpus(subs, released, REPO / "solutions", probes)
    before = {str(p.relative_to(subs)): _sha(p) for p in subs.rglob("*") if p.is_file()}
    results = grade(subs, base / "out", exercises=["ex01", "ex07"], jobs=2, timeout=CELL_TIMEOUT,
                    notebook_timeout=NOTEBOOK_TIMEOUT, memory_mb=3072, released=released, progress=False,
                    sandbox="bwrap" if SANDBOX else "none")
    server.sock.close()
    (base / "run.pickle").write_bytes(pickle.dumps({"expected": expected, "before": before, "results": results,
                                                    "accepted": server.accepted, "marker": marker}))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The hostile and honest class graded once per test run (on disk: a second set-up reads it)."""
    base = K.once_per_run(tmp_path_factory, "grade-corpus", _grade_corpus)
    run = pickle.loads((base / "run.pickle").read_bytes())
    print(f"\ngraded {len(run['results'])} notebooks (timings: make bench)\n" + (base / "out" / "grades.csv").read_text())
    return dict(run, released=K.fresh_release("en"), base=base, subs=base / "submissions", out=base / "out")


def test_every_submission_gets_its_expected_status_and_score(corpus):
    rows = _rows(corpus["out"] / "grades.csv")
    got = {(r["student"], r["exercise"]): (r["status"], float(r["score"]), float(r["max_score"])) for r in rows}
    expected = corpus["expected"]
    assert set(got) == {(s, ex) for s in expected for ex in ("ex01", "ex07")}, "one row per student and exercise"
    wrong = []
    for student, per_ex in expected.items():
        for ex, (status, score) in per_ex.items():
            g_status, g_score, g_max = got[(student, ex)]
            want = score if score >= 0 else None
            if g_status != status or (want is not None and g_score != want):
                wrong.append(f"{student}/{ex}: got {g_status} {g_score:g}/{g_max:g}, expected {status} {score}")
    assert not wrong, "\n".join(wrong)


def test_correct_solution_gets_full_marks_and_written_answers_wait_for_a_human(corpus):
    cells = [r for r in _rows(corpus["out"] / "grades_per_cell.csv") if r["student"] == "a_correct"]
    auto = [r for r in cells if r["status"] != "needs-manual-grade"]
    assert auto and all(r["status"] == "ok" and r["points"] == r["max_points"] for r in auto), auto
    manual = [r for r in cells if r["status"] == "needs-manual-grade"]
    assert [r["cell"] for r in manual] == ["ex01_explain", "ex07_explain"] and {r["points"] for r in manual} == {"0"}
    ex01 = next(r for r in corpus["results"] if r.student == "a_correct" and r.exercise == "ex01")
    assert (ex01.score, ex01.max_score) == (12, 14)  # the written answer (2 points) is an instructor's


def test_per_cell_statuses_say_what_happened(corpus):
    cells = {(r["student"], r["cell"]): r for r in _rows(corpus["out"] / "grades_per_cell.csv")}
    assert all(r["status"] in STATUSES for r in cells.values())
    assert cells[("c_wrong", "ex01_scores")]["status"] == "failed"
    assert "scaling" in cells[("c_wrong", "ex01_scores")]["message"]  # the visible assert's message
    assert cells[("e_loop", "ex01_attention")]["status"] == "timeout"
    assert "whole-notebook limit" in cells[("f_loop_everywhere", "ex01_scores")]["message"]
    assert "kernel died" in cells[("h_os_exit", "ex01_softmax")]["message"]
    assert cells[("j_deleted_test", "ex01_softmax")]["status"] == "missing-cell"
    assert cells[("k_renamed_test", "ex01_scores")]["status"] == "missing-cell"
    assert cells[("m_edited_test", "ex01_scores")]["status"] == "tampered"
    n = cells[("n_monkeypatch", "ex01_softmax")]
    assert n["status"] == "tampered" and "torch.allclose" in n["message"] and "had been replaced" in n["message"], n
    assert cells[("n_monkeypatch", "ex01_attention")]["status"] == "ok", "Task 1d runs on tinytf's softmax: only Task 1c is lost"
    assert cells[("o_no_record", "ex01_hand_qk")]["status"] == "ok", "a rebound `record` does not stop judged_record's export"
    assert cells[("o_no_record", "ex01_softmax")]["status"] == "tampered"
    assert cells[("q_memory_hog", "ex01_hand_qk")]["status"] in ("failed", "error"), "MemoryError in the cell that defines hand_qk"
    # the visible tests that did not depend on the broken cell still earn their points
    assert cells[("d_raises", "ex01_softmax")]["status"] == "ok"


def test_feedback_exists_for_everyone_and_never_shows_hidden_tests(corpus):
    out = corpus["out"]
    tokens = set()
    for name in ("ex01_by_hand.ipynb", "ex07_kv_cache.ipynb"):
        tokens |= K.hidden_tokens(K.load(REPO / "solutions" / name), feedback=True)
    assert len(tokens) > 10, tokens
    for student, per_ex in corpus["expected"].items():
        for ex in per_ex:
            page = out / "feedback" / student / f"{ex}.html"
            assert page.exists(), page
            text = html.unescape(page.read_text(encoding="utf-8"))
            leaked = K.leaks(text, tokens)
            assert not leaked, f"{page}: hidden-test text in feedback: {leaked[:5]}"
            assert "HIDDEN TESTS" not in text
    good = html.unescape((out / "feedback" / "a_correct" / "ex01.html").read_text(encoding="utf-8"))
    assert "12 / 14 points" in good and "softmax_by_hand" in good


def test_submissions_are_never_modified_and_the_whole_notebook_limit_stops_a_loop_in_every_cell(corpus):
    after = {str(p.relative_to(corpus["subs"])): _sha(p) for p in corpus["subs"].rglob("*") if p.is_file()}
    assert after == corpus["before"]
    # without the whole-notebook limit the looping notebook alone would cost 12 cells x CELL_TIMEOUT = 120 s:
    # every one of its test cells says it was stopped by that limit, the limit it was given
    cells = [r for r in _rows(corpus["out"] / "grades_per_cell.csv")
             if r["student"] == "f_loop_everywhere" and r["exercise"] == "ex01" and r["cell"] != "ex01_explain"]  # the test cells
    limit = f"whole-notebook limit ({NOTEBOOK_TIMEOUT:g} s)"
    assert cells and all(r["status"] == "timeout" and limit in r["message"] for r in cells), cells
    summary = (corpus["out"] / "summary.txt").read_text()
    assert summary == summary_text(corpus["results"])
    assert f"students graded: {len(corpus['expected'])}" in summary and "ex01:" in summary


KEEP = ("a_correct", "p_invalid_json", "r_nothing")  # one notebook to run, one unreadable, one missing


def _subset(corpus: dict, subs: Path, out: Path, **kw) -> Path:
    """Copy the KEEP students' submissions to ``subs`` and grade them on ex01 into ``out``."""
    for student in KEEP:
        (subs / student).mkdir(parents=True, exist_ok=True)
        for f in (corpus["subs"] / student).glob("*"):
            (subs / student / f.name).write_bytes(f.read_bytes())
    grade(subs, out, exercises=["ex01"], jobs=2, timeout=CELL_TIMEOUT,
          notebook_timeout=NOTEBOOK_TIMEOUT, memory_mb=3072, released=corpus["released"], progress=False, **kw)
    return out


@pytest.fixture
def keep_run(corpus, tmp_path_factory) -> Path:
    """The KEEP students graded again on ex01, once per test run: the re-run and the whole for the shards."""
    return K.once_per_run(tmp_path_factory, "grade-keep", lambda base: _subset(corpus, base / "subs", base / "out")) / "out"


def test_rerun_gives_the_same_gradebook(corpus, keep_run):
    keep = KEEP
    for name in ("grades.csv", "grades_per_cell.csv"):
        first = [r for r in _rows(corpus["out"] / name) if r["student"] in keep and r["exercise"] == "ex01"]
        assert _rows(keep_run / name) == first, name
    for student in keep:
        for page in (corpus["out"] / "feedback" / student).glob("ex01.html"):
            assert (keep_run / "feedback" / student / page.name).read_bytes() == page.read_bytes(), page


def test_two_shards_merged_are_byte_identical_to_one_run(corpus, keep_run, tmp_path):
    from tinytf.course.grade.students import merge, shard_of

    assert sorted({shard_of(s, 2) for s in KEEP}) == [0, 1], "both shards grade someone"
    whole = keep_run  # the KEEP students in one run
    shards = [_subset(corpus, tmp_path / "subs", tmp_path / f"shard{k}", shard=(k, 2)) for k in (1, 0)]
    merge(shards, tmp_path / "merged")
    for name in ("grades.csv", "grades_per_cell.csv", "summary.txt"):
        assert (tmp_path / "merged" / name).read_bytes() == (whole / name).read_bytes(), name
    pages = sorted(p.relative_to(whole) for p in (whole / "feedback").rglob("*.html"))
    assert pages == sorted(p.relative_to(tmp_path / "merged") for p in (tmp_path / "merged" / "feedback").rglob("*.html"))
    assert pages and all((tmp_path / "merged" / p).read_bytes() == (whole / p).read_bytes() for p in pages)
    assert not (tmp_path / "merged" / "shard.json").exists(), "the merged gradebook is the single run's, file for file"


# ---- pure helpers and the sandbox (fast) ---------------------------------------------------------------


def test_classify_hides_messages_raised_inside_hidden_tests():
    source = "assert f(2) == 4, 'visible message'\n### BEGIN HIDDEN TESTS\nassert f(9) == 18, 'secret message'\n### END HIDDEN TESTS"
    cell = {"cell_type": "code", "execution_count": 7, "source": source, "metadata": {},
            "outputs": [{"output_type": "error", "ename": "AssertionError", "evalue": "secret message",
                         "traceback": ["Cell In[7], line 3", "AssertionError: secret message"]}]}
    status, msg = classify_test_cell(cell)
    assert status == "failed" and "secret" not in msg and "hidden test" in msg
    cell["outputs"][0].update(evalue="visible message", traceback=["\x1b[0;32mCell In[7], line 1\x1b[0m"])
    assert classify_test_cell(cell) == ("failed", "AssertionError: visible message (line 1)")
    cell["outputs"][0].update(ename="CellTimeoutError")
    assert classify_test_cell(cell)[0] == "timeout"
    cell["outputs"] = []
    assert classify_test_cell(cell) == ("ok", "")


def test_sanitize_for_feedback_strips_hidden_tests_and_test_outputs():
    from tinytf.course.grade.gradebook import CellResult

    nb = {"cells": [
        {"cell_type": "code", "source": "x = 1\n### BEGIN HIDDEN TESTS\nzz_secret = 2\n### END HIDDEN TESTS", "outputs": [
            {"output_type": "error", "ename": "AssertionError", "evalue": "zz_secret", "traceback": ["zz_secret"]}],
         "metadata": {"nbgrader": {"grade": True, "solution": False, "grade_id": "t1", "points": 1}}},
        {"cell_type": "code", "source": "print('y' * 50000)", "metadata": {},
         "outputs": [{"output_type": "stream", "name": "stdout", "text": "y" * 50000}]},
    ]}
    clean = sanitize_for_feedback(nb, [CellResult("s", "ex90", "t1", 0, 1, "failed", "AssertionError (a hidden test)")])
    text = json.dumps(clean)
    assert "zz_secret" not in text and "HIDDEN" not in text
    assert len(clean["cells"][1]["outputs"][0]["text"]) < 11_000
    assert "zz_secret" in json.dumps(nb), "the input notebook is not modified"


def _probe_lines(corpus: dict, student: str) -> list[str]:
    """The ``sandbox-probe`` lines a sandboxed student printed, from its feedback page."""
    page = html.unescape((corpus["out"] / "feedback" / student / "ex01.html").read_text(encoding="utf-8"))
    return re.findall(r"sandbox-probe (?:network|read|write)[^<\n\"']*(?=\n|<)", page)  # outputs; the code's strings end in quotes


@needs_sandbox
def test_a_sandboxed_submission_reaches_no_server_and_is_graded_normally(corpus):
    assert corpus["accepted"] == 0, "a student's kernel connected to a server on the grading machine's 127.0.0.1"
    assert _probe_lines(corpus, "s_network") == ["sandbox-probe network: ConnectionRefusedError"]
    assert corpus["expected"]["s_network"]["ex01"] == ("needs-manual-grade", 12)  # and test_every_submission… holds it


@needs_sandbox
def test_a_sandboxed_submission_cannot_read_solutions_gradebooks_or_other_students(corpus):
    lines = _probe_lines(corpus, "t_reads_secrets")
    assert len(lines) == 6, lines  # one attempt per target: nothing found by a pattern is tried as the pattern itself
    assert not [line for line in lines if "READ" in line], lines
    assert all(line.endswith(("FileNotFoundError", "PermissionError")) for line in lines), lines


@needs_sandbox
def test_a_sandboxed_submission_writes_nothing_outside_its_folder(corpus):
    lines = _probe_lines(corpus, "u_writes_outside")
    assert len(lines) >= 3 and not [line for line in lines if "WROTE" in line and "/tmp/zz" not in line], lines
    marker = corpus["marker"]
    assert not (REPO / "tinytf" / marker).exists() and not (corpus["subs"] / "a_correct" / marker).exists()
    assert not (Path("/tmp") / marker).exists(), "the sandbox's /tmp is its own"
    # the records of the students graded beside it were out of reach: their verdicts are test_every_submission…'s


def test_a_process_a_submission_leaves_running_dies_with_its_job(corpus):
    marker = corpus["marker"]
    left = [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]
    assert not left, f"a process the notebook started in a session of its own outlived grading: {left}"


def test_sandbox_mode_says_why_it_cannot_confine_a_kernel(monkeypatch, capsys):
    import tinytf.course.grade.sandbox as sandbox

    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    monkeypatch.setattr(sandbox, "_SAID", set())
    monkeypatch.setenv("TINYTF_LANG", "en")
    sandbox.bwrap_works.cache_clear()
    try:
        with pytest.raises(ValueError, match="apt-get install bubblewrap"):
            sandbox_mode("bwrap")
        assert sandbox_mode("auto") == "none" and sandbox_mode("auto") == "none"
        assert capsys.readouterr().err.count("resource limits only") == 1, "auto says it once"
        assert sandbox_mode("none") == "none"
        with pytest.raises(ValueError, match="choose one of auto, bwrap, none"):
            sandbox_mode("docker")
        monkeypatch.setattr(sandbox, "_SAID", set())  # a Chinese-speaking instructor (TINYTF_LANG=zh) reads it in Chinese
        monkeypatch.setenv("TINYTF_LANG", "zh")
        assert sandbox_mode("auto") == "none"
        assert "评分只在资源限制" in capsys.readouterr().err
        with pytest.raises(ValueError, match="没有安装 bubblewrap"):
            sandbox_mode("bwrap")
    finally:
        sandbox.bwrap_works.cache_clear()


def test_feedback_joins_stream_chunks_so_pages_do_not_depend_on_timing():
    cell = {"cell_type": "code", "metadata": {}, "source": "print('a'); print('b')",
            "outputs": [{"output_type": "stream", "name": "stdout", "text": "exp:\n"},
                        {"output_type": "stream", "name": "stdout", "text": "tensor([1.])\n"},
                        {"output_type": "stream", "name": "stderr", "text": "warn\n"}]}
    whole = dict(cell, outputs=[{"output_type": "stream", "name": "stdout", "text": "exp:\ntensor([1.])\n"},
                                {"output_type": "stream", "name": "stderr", "text": "warn\n"}])
    split_page = sanitize_for_feedback({"cells": [cell]}, [])
    whole_page = sanitize_for_feedback({"cells": [whole]}, [])
    assert split_page == whole_page
    assert [o["text"] for o in split_page["cells"][0]["outputs"]] == ["exp:\ntensor([1.])\n", "warn\n"]


def test_tampered_needs_evidence_a_wrong_answer_alone_is_failed():
    from tinytf.course.grade.verdict import CellSpec, _cell_status
    from tinytf.course.reference.judging import judge

    @judge("ex99_evidence_test")
    def _(value, x):
        assert value == 2 * x, "double(x) should be 2 * x"

    spec = CellSpec("ex99_evidence_test", "auto", 1, "assert double(2) == 4")
    cell = {"cell_type": "code", "source": "assert double(2) == 4", "outputs": [], "metadata": {}}
    executed = {"ex99_evidence_test": cell}

    def status(rec):
        return _cell_status(spec, cell, executed, {"ex99_evidence_test": rec} if rec else {}, False, "")

    assert status({"value": 4, "inputs": {"x": 2}, "interference": []}) == ("ok", "")
    wrong, msg = status({"value": 5, "inputs": {"x": 2}, "interference": []})
    assert wrong == "failed" and "double(x) should be 2 * x" in msg, "a wrong answer the judge catches is failed, not tampered"
    assert status({"value": 5, "inputs": {"x": 2}})[0] == "failed", "records written before this rule carry no evidence"
    forged, msg = status({"value": 5, "inputs": {"x": 2}, "interference": ["torch.allclose"]})
    assert forged == "tampered" and "torch.allclose" in msg
    assert status(None)[0] == "tampered", "a cell that passed yet exported nothing bypassed record()"


def test_record_lists_replaced_checking_functions(monkeypatch):
    import torch

    from tinytf.course.reference import judging as record

    assert record.interference() == []
    monkeypatch.setattr(torch, "allclose", lambda *a, **k: True)
    monkeypatch.setattr(torch.testing, "assert_close", lambda *a, **k: None)
    assert record.interference() == ["torch.allclose", "torch.testing.assert_close"]
    monkeypatch.setattr(record, "record", lambda *a, **k: None)
    assert "tinytf.course.reference.judging.record" in record.interference()


def test_a_feedback_page_shows_what_the_student_displayed_without_running_it(tmp_path):
    from tinytf.course.grade.feedback import feedback_page
    from tinytf.course.grade.gradebook import CellResult

    shown = {"output_type": "display_data", "metadata": {},
             "data": {"text/html": "<b>zq-bold</b><script>alert('zq-xss')</script>", "text/plain": "x"}}
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "markdown", "id": "m", "metadata": {}, "source": "An answer <img src=x onerror=alert('zq-md')>"},
        {"cell_type": "code", "id": "c", "metadata": {}, "execution_count": 1, "source": "display(HTML(...))", "outputs": [shown]}]}
    page = feedback_page(tmp_path, "ex90", "s1", "ex90_toy.ipynb", [CellResult("s1", "ex90", "t", 1, 1, "ok", "")], "", nb)
    text = page.read_text(encoding="utf-8")
    assert "zq-bold" in text and "tinytf grading: ex90 for s1" in text, "the page shows the student's output and the summary"
    body = text.split("<body")[1]
    assert "<script>alert('zq-xss')" not in body, "a student's displayed script is text on the page, not a script"
    assert not re.search(r"<img[^>]*onerror", body), "nor does an attribute of a student's markdown run"
