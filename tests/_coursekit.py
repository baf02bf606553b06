# ruff: noqa: E501
"""Helpers for the course-tooling tests: a toy nbgrader exercise and student-notebook surgery."""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import os
import shutil
from pathlib import Path
from typing import Any

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

TOY_JUDGES = '''
from tinytf.course.reference.judging import judge

@judge("ex90_double_test")
def _(value, x):
    assert value == 2 * x, "double(x) should be 2 * x"

@judge("ex90_square_test")
def _(value, x):
    assert value == x * x, "square(x) should be x * x"
'''


def _meta(grade_id: str, **kw) -> dict:
    d = {"schema_version": 3, "grade_id": grade_id, "solution": False, "grade": False, "locked": True, "task": False}
    d.update(kw)
    return {"nbgrader": d}


def toy_solution(folder: Path) -> Path:
    """``folder/ex90_toy.ipynb``: two solution cells, two test cells (hidden parts record), one written answer."""
    nb = new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"},
                                "language_info": {"name": "python"}})
    nb.cells = [
        new_markdown_cell("# Toy exercise", metadata=_meta("ex90_intro")),
        new_code_cell("import random\n\nimport torch\n\nfrom tinytf.course.reference.judging import record", metadata=_meta("ex90_setup")),
        new_code_cell('def double(x):\n    """x: an int."""\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION',
                      metadata=_meta("ex90_double", solution=True, locked=False)),
        new_code_cell("assert torch.equal(torch.tensor(double(2)), torch.tensor(4)), 'double(2) should be 4'\n### BEGIN HIDDEN TESTS\nzq_hidden_probe = random.randint(5, 99)\n"
                      "assert torch.equal(torch.tensor(double(zq_hidden_probe)), torch.tensor(2 * zq_hidden_probe)), 'zq hidden message'\n"
                      "record('ex90_double_test', double(zq_hidden_probe), x=zq_hidden_probe)\n### END HIDDEN TESTS",
                      metadata=_meta("ex90_double_test", grade=True, points=2)),
        new_code_cell('def square(x):\n    """x: an int."""\n    ### BEGIN SOLUTION\n    return x * x\n    ### END SOLUTION',
                      metadata=_meta("ex90_square", solution=True, locked=False)),
        new_code_cell("assert square(3) == 9, 'square(3) should be 9'\n### BEGIN HIDDEN TESTS\nzq_other_probe = random.randint(5, 99)\n"
                      "assert square(zq_other_probe) == zq_other_probe ** 2\nrecord('ex90_square_test', square(zq_other_probe), x=zq_other_probe)\n"
                      "### END HIDDEN TESTS", metadata=_meta("ex90_square_test", grade=True, points=1)),
        new_markdown_cell("Why is doubling linear?\n\n### BEGIN SOLUTION\nBecause zqwritten reasons.\n### END SOLUTION",
                          metadata=_meta("ex90_why", solution=True, grade=True, locked=False, points=1)),
        new_code_cell('print("done")', metadata=_meta("ex90_end")),
    ]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "ex90_toy.ipynb"
    nbformat.write(nb, path)
    return path


def load(path: Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def src(cell: dict) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def solved(released: dict, solution: dict) -> dict:
    """The released notebook with each solution region filled in from the instructor notebook."""
    nb = copy.deepcopy(released)
    sol = {c["metadata"].get("nbgrader", {}).get("grade_id"): c for c in solution["cells"]}
    for cell in nb["cells"]:
        meta = cell["metadata"].get("nbgrader", {})
        if meta.get("solution") and meta.get("grade_id") in sol:
            cell["source"] = "\n".join(line for line in src(sol[meta["grade_id"]]).split("\n") if "### BEGIN SOLUTION" not in line
                                       and "### END SOLUTION" not in line)
    return nb


def cell_with(nb: dict, grade_id: str) -> dict:
    return next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)


def first_solution_cell(nb: dict) -> dict:
    return next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("solution") and c["cell_type"] == "code")


def first_test_id(nb: dict) -> str:
    return next(c["metadata"]["nbgrader"]["grade_id"] for c in nb["cells"]
                if c["metadata"].get("nbgrader", {}).get("grade") and not c["metadata"]["nbgrader"].get("solution"))


def prepend(nb: dict, code: str) -> dict:
    """A copy with ``code`` put at the top of the first solution cell."""
    nb = copy.deepcopy(nb)
    cell = first_solution_cell(nb)
    cell["source"] = code + "\n" + src(cell)
    return nb


def every_solution_cell(nb: dict, code: str) -> dict:
    nb = copy.deepcopy(nb)
    for cell in nb["cells"]:
        if cell["metadata"].get("nbgrader", {}).get("solution") and cell["cell_type"] == "code":
            cell["source"] = code + "\n" + src(cell)
    return nb


def without_cell(nb: dict, grade_id: str) -> dict:
    nb = copy.deepcopy(nb)
    nb["cells"] = [c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") != grade_id]
    return nb


def renamed(nb: dict, grade_id: str, new_id: str) -> dict:
    nb = copy.deepcopy(nb)
    cell_with(nb, grade_id)["metadata"]["nbgrader"]["grade_id"] = new_id
    return nb


def edited(nb: dict, grade_id: str, new_source: str) -> dict:
    nb = copy.deepcopy(nb)
    cell_with(nb, grade_id)["source"] = new_source
    return nb


def stripped(nb: dict) -> dict:
    nb = copy.deepcopy(nb)
    for cell in nb["cells"]:
        cell["metadata"].pop("nbgrader", None)
    return nb


def save(nb: dict | str | bytes, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(nb, bytes):
        path.write_bytes(nb)
    elif isinstance(nb, str):
        path.write_text(nb, encoding="utf-8")
    else:
        path.write_text(json.dumps(nb, indent=1), encoding="utf-8")
    return path


def _split_regions(solution: dict, region: str) -> tuple[list[str], list[str]]:
    """The lines inside nbgrader's ``### BEGIN <region>`` … ``### END <region>`` blocks, and the rest."""
    inside, outside = [], []
    for cell in solution["cells"]:
        on = False
        for line in src(cell).split("\n"):
            if f"BEGIN {region}" in line:
                on = True
            elif f"END {region}" in line:
                on = False
            else:
                (inside if on else outside).append(line)
    return inside, outside


def hidden_tokens(solution: dict, *, feedback: bool = False) -> set[str]:
    """Distinctive text of the hidden-test blocks that appears nowhere outside them: whole lines (>= 12
    chars), identifiers (>= 6 chars; with ``feedback`` only those with '_' or a digit, which HTML
    boilerplate does not contain) and string literals (>= 8 chars)."""
    import re

    inside, outside = _split_regions(solution, "HIDDEN TESTS")
    ids = [c["metadata"].get("nbgrader", {}).get("grade_id", "") for c in solution["cells"]]
    rest = "\n".join(outside + ids)
    tokens = {line.strip() for line in inside if len(line.strip()) >= 12 and line.strip() not in rest}
    words = {w for line in inside for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]{5,}", line) if w not in rest}
    if feedback:
        words = {w for w in words if re.search(r"[_0-9]", w.strip("_"))} | {w for w in words if w.startswith("_")}
    tokens |= words
    tokens |= {m for line in inside for m in re.findall(r"""['"]([^'"]{8,})['"]""", line) if m not in rest}
    return tokens


def solution_only_lines(solution: dict) -> set[str]:
    """Distinctive lines (>= 10 chars, not just words) of the solution regions that appear nowhere
    outside them: what must never reach a student (released exercises, the book)."""
    import re

    inside, outside = _split_regions(solution, "SOLUTION")
    inside = [line.strip() for line in inside]
    rest = "\n".join(outside)
    return {line for line in inside if len(line) >= 10 and line not in rest and not re.fullmatch(r"[#\s\w]*", line)}


def leaks(text: str, tokens: set[str]) -> list[str]:
    """The tokens found in ``text`` (identifiers as whole words)."""
    import re

    found = []
    for t in sorted(tokens):
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", t):
            if re.search(rf"(?<![A-Za-z0-9_]){re.escape(t)}(?![A-Za-z0-9_])", text):
                found.append(t)
        elif t in text:
            found.append(t)
    return found


# ---- the grading corpus on the real exercises ------------------------------------------------------

WRONG_SCORES = 'def scores_by_hand(q, k):\n    """Forgets the 1/sqrt(d) scale."""\n    return q @ k.transpose(-2, -1)'
WRONG_SOFTMAX = ('def softmax_by_hand(scores):\n    """Stable exp, but forgets to divide by the row sum."""\n'
                 '    return (scores - scores.amax(dim=-1, keepdim=True)).exp()')
LOOP_ON_4D = ('def attention_by_hand(q, k, v):\n    """Loops forever on 4-D inputs (the hidden test)."""\n    while q.dim() == 4:\n        pass\n'
              '    w = softmax_by_hand(scores_by_hand(q, k))\n    return w @ v, w')
PATCH_CHECKS = "import torch\ntorch.allclose = lambda *a, **k: True\ntorch.testing.assert_close = lambda *a, **k: None"


def add_cell(nb: dict, code: str, index: int | None = None) -> dict:
    nb = copy.deepcopy(nb)
    cell = {"cell_type": "code", "execution_count": None, "id": f"student-{len(nb['cells'])}", "metadata": {}, "outputs": [], "source": code}
    nb["cells"].insert(len(nb["cells"]) if index is None else index, cell)
    return nb


def sandbox_probes(port: int, marker: str, repo: Path, subs: Path) -> dict[str, str]:
    """Code for the students who try to get out of the grading sandbox (issue 34): each prints what it got, one
    ``sandbox-probe`` line per attempt, and carries on (so it is graded normally). ``port``: a server the test
    runs on 127.0.0.1; ``marker``: the name of the files they try to write outside and of the process they leave."""
    network = f"""import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=3).sendall(b"leak")
    print("sandbox-probe network: CONNECTED")
except OSError as err:
    print("sandbox-probe network:", type(err).__name__)"""
    reads = f"""import glob
for what, pattern in [("solutions", {str(repo / "solutions" / "ex01_by_hand.ipynb")!r}),
                      ("cached course roots", {str(repo / "build" / "course-roots" / "*" / "source" / "ex01" / "*.ipynb")!r}),
                      ("job gradebooks", "/tmp/tinytf-grade-*/jobs/*/gradebook.db"),
                      ("job sources", "/tmp/tinytf-grade-*/jobs/*/source/ex01/*.ipynb"),
                      ("another student", {str(subs / "a_correct" / "ex01_by_hand.ipynb")!r}),
                      ("other submissions", "/tmp/tinytf-grade-*/jobs/*.submitted.ipynb")]:
    for path in glob.glob(pattern) or [pattern]:
        try:
            open(path, "rb").read()
            print("sandbox-probe read", what, "READ", path)
        except OSError as err:
            print("sandbox-probe read", what, type(err).__name__)"""
    writes = f"""import glob, os
others = [d + "/ex01_softmax.pt" for d in glob.glob("/tmp/tinytf-grade-*/jobs/*.records") if d != os.environ.get("TINYTF_RECORD_DIR")]
for path in [{str(repo / "tinytf" / marker)!r}, {str(subs / "a_correct" / marker)!r}, "/tmp/{marker}", *others]:
    try:
        open(path, "w").write("x")
        print("sandbox-probe write WROTE", path)
    except OSError as err:
        print("sandbox-probe write", type(err).__name__)"""
    daemon = f"""import subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", {marker!r}], start_new_session=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)"""
    return {"s_network": network, "t_reads_secrets": reads, "u_writes_outside": writes, "v_daemon": daemon}


def build_corpus(dest: Path, exercises: Path, solutions: Path, probes: dict[str, str] | None = None
                 ) -> dict[str, dict[str, tuple[str, float]]]:
    """Write SUBMISSIONS under ``dest`` covering every case of issue 8 on ex01 (and ex07 for one student), and
    with ``probes`` (:func:`sandbox_probes`) the students who try to get out of the sandbox (each graded normally).

    Returns ``{student: {exercise: (expected status, expected score)}}`` for ex01 and ex07.
    """
    name1, name7 = "ex01_by_hand.ipynb", "ex07_kv_cache.ipynb"
    rel1, sol1 = load(exercises / name1), load(solutions / name1)
    good = solved(rel1, sol1)
    good7 = solved(load(exercises / name7), load(solutions / name7))
    # the limits are wall-clock limits: this student's loops wait rather than spin (e_loop spins), so the 45 s they
    # take until the whole-notebook limit stops them do not take a core from every other test running meanwhile
    idle_loop = "import time\nwhile True:\n    time.sleep(0.05)"
    loops = every_solution_cell(good, idle_loop)
    for i in range(8):  # students may add cells too: an infinite loop in every one of them
        loops = add_cell(loops, idle_loop, index=len(loops["cells"]) - 2 - i)
    cases: dict[str, tuple[Any, str, float]] = {
        "a_correct": (good, "needs-manual-grade", 12),  # every autograded point; the written answer waits
        "b_untouched": (rel1, "error", 0),
        "c_wrong": (edited(good, "ex01_scores_answer", WRONG_SCORES), "failed", 9),  # Task 1d runs on tinytf's scores
        "d_raises": (prepend(good, "raise RuntimeError('student code raised')"), "failed", 10),
        "e_loop": (edited(good, "ex01_attention_answer", LOOP_ON_4D), "timeout", 9),
        "f_loop_everywhere": (loops, "timeout", 0),
        "g_sys_exit": (prepend(good, "import sys\nsys.exit(3)"), "failed", 10),
        "h_os_exit": (edited(good, "ex01_scores_answer", "import os\nos._exit(0)"), "error", 0),
        "i prints megabytes (odd folder name)": (prepend(good, "print('x' * 3_000_000)\nfor i in range(30_000):\n    print(i)"),
                                                 "needs-manual-grade", 12),
        "j_deleted_test": (without_cell(good, "ex01_softmax"), "missing-cell", 8),
        "k_renamed_test": (renamed(good, "ex01_scores", "ex01_scores_mine"), "missing-cell", 9),
        "l_stripped_metadata": (stripped(good), "missing-cell", 0),
        "m_edited_test": (edited(edited(good, "ex01_scores_answer", WRONG_SCORES), "ex01_scores", "assert True"), "tampered", 9),
        "n_monkeypatch": (prepend(edited(good, "ex01_softmax_answer", WRONG_SOFTMAX), PATCH_CHECKS), "tampered", 8),
        # the hidden tests record through judged_record, not the notebook's name `record`: rebinding it stops no export,
        # so the patched softmax is caught (tampered) and the honest answers keep their points
        "o_no_record": (prepend(edited(good, "ex01_softmax_answer", WRONG_SOFTMAX), PATCH_CHECKS + "\nrecord = lambda *a, **k: None"),
                        "tampered", 8),
        "p_invalid_json": ('{"cells": [ this is not json', "unreadable", 0),
        "q_memory_hog": (prepend(good, "hog = bytearray(8 * 1024 ** 3)"), "failed", 10),
        **{student: (prepend(good, code), "needs-manual-grade", 12) for student, code in (probes or {}).items()},
    }
    expected: dict[str, dict[str, tuple[str, float]]] = {}
    for student, (nb, status, score) in cases.items():
        save(nb, dest / student / name1)
        expected[student] = {"ex01": (status, score), "ex07": ("missing-submission", 0)}
    save(good7, dest / "a_correct" / name7)
    expected["a_correct"]["ex07"] = ("needs-manual-grade", -1)  # -1: all autograded points (checked separately)
    (dest / "r_nothing").mkdir(parents=True, exist_ok=True)
    expected["r_nothing"] = {"ex01": ("missing-submission", 0), "ex07": ("missing-submission", 0)}
    return expected


REPO_ROOT = Path(__file__).resolve().parents[1]


# -- one fresh release per test session, shared by the test files (and their xdist workers) ------------

CACHE = REPO_ROOT / "build" / "test-cache"


def release_key(solutions: Path = REPO_ROOT / "solutions") -> str:
    """What a release of both editions depends on: every solution notebook of ``solutions/`` and
    ``solutions/zh/``, tinytf's source and nbgrader's version (the course roots' own key)."""
    from tinytf.course.build.nbgrader_root import course_root_key
    from tinytf.course.exercises import find_notebooks

    both = {f"{lang}/{ex}": p for lang, folder in (("en", solutions), ("zh", solutions / "zh"))
            for ex, p in find_notebooks(folder).items()}
    return course_root_key(both)


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def fresh_release(lang: str = "en") -> Path:
    """The folder of a release of every exercise of edition ``lang`` made from today's solutions.

    Laid out like ``exercises/``: the English release at the top, the Chinese one in ``zh/`` (so
    ``fresh_release("en")`` is also the ``released=`` folder of a class that mixes the editions).
    Made once and kept under ``build/test-cache/`` by a key over the solutions (both editions), the
    tinytf package and nbgrader's version: editing a solution (or the release code) gives a new key and
    so a new release; a stale copy is never used. Several xdist workers wait for one another instead of
    releasing twice. Read-only for the tests: copy what you change.
    """
    from tinytf.course.build.release import EDITION_FOLDERS, release

    key = release_key()
    root = CACHE / f"released-{key}"
    with _locked(CACHE / "released.lock"):
        if not (root / ".complete").exists():
            shutil.rmtree(root, ignore_errors=True)
            for src, out in EDITION_FOLDERS.values():
                release(REPO_ROOT / src, root / Path(out).relative_to("exercises"))
            (root / ".complete").write_text(key)
    return root / Path(EDITION_FOLDERS[lang][1]).relative_to("exercises")


def once_per_run(tmp_path_factory, name: str, build) -> Path:
    """A folder built once per test run and shared by every xdist worker: ``build(folder)`` fills it.

    A module fixture may be set up more than once in one run (a worker that runs another file's tests
    in between tears it down), and two workers may need the same grading run or corpus;
    the folder lives in the run's shared temporary root (pytest-xdist's documented pattern for
    session-wide work), so the second set-up reads what the first one wrote. A failed build leaves no
    ``.complete`` marker and is built again. Read-only for the tests: copy what you change.
    """
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # popen-gwN's parent: the same folder for every worker of this run
    folder = root / f"once-{name}"
    with _locked(root / f"once-{name}.lock"):
        if not (folder / ".complete").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            build(folder)
            (folder / ".complete").write_text(name)
    return folder
