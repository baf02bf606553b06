"""tinytf release: deterministic, nothing of a solution or a hidden test reaches exercises/, and the
released exercises, run untouched, fail their tests cleanly (NotImplementedError) without crashing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import _coursekit as K
import pytest

from tinytf.course.build.release import EDITION_FOLDERS, SUPPORT_FILES, release
from tinytf.course.exercises import REPO, find_notebooks


def _found(folder: str) -> dict[str, Path]:
    return find_notebooks(REPO / folder) if (REPO / folder).is_dir() else {}


# {(edition, exercise): path} for both editions: solutions/ -> exercises/, solutions/zh/ -> exercises/zh/
SOLUTIONS = {(lang, ex): p for lang, (src, _) in EDITION_FOLDERS.items() for ex, p in _found(src).items()}
RELEASED = {(lang, ex): p for lang, (_, out) in EDITION_FOLDERS.items() for ex, p in _found(out).items()}
KEYS = sorted(RELEASED)
assert len(KEYS) >= 20 and len(SOLUTIONS) == len(KEYS), "both editions of every exercise are released"


def _key_id(key: tuple[str, str]) -> str:
    return "-".join(key)
CLEAN_ERRORS = {"NotImplementedError", "NameError", "AssertionError"}


def test_release_is_byte_identical_and_strips_solutions_and_hidden_tests(tmp_path, monkeypatch):
    K.toy_solution(tmp_path / "sol")
    (a,) = release(tmp_path / "sol", tmp_path / "a")
    (b,) = release(tmp_path / "sol", tmp_path / "b")
    assert a.read_bytes() == b.read_bytes()
    text = a.read_text(encoding="utf-8")
    assert text.endswith("}\n") and text == json.dumps(json.loads(text), sort_keys=True, indent=1, ensure_ascii=False) + "\n"
    for secret in ("BEGIN SOLUTION", "END SOLUTION", "HIDDEN TESTS", "zq_hidden_probe", "zq hidden message", "return 2 * x", "zqwritten"):
        assert secret not in text, secret
    nb = json.loads(text)
    assert "raise NotImplementedError()" in K.src(K.cell_with(nb, "ex90_double"))
    assert "YOUR ANSWER HERE" in K.src(K.cell_with(nb, "ex90_why"))
    assert "double(2)" in K.src(K.cell_with(nb, "ex90_double_test")), "visible tests stay"
    ids = [c["id"] for c in nb["cells"]]
    assert len(set(ids)) == len(ids)
    import tinytf.course.build.release as release_mod

    writes = []
    write_atomic = release_mod.write_atomic
    monkeypatch.setattr(release_mod, "write_atomic", lambda path, data: (writes.append(Path(path)), write_atomic(path, data)))
    inode = a.stat().st_ino
    release(tmp_path / "sol", tmp_path / "a")
    assert writes == [], "an unchanged release does not rewrite the file"
    assert a.stat().st_ino == inode and a.read_text(encoding="utf-8") == text
    a.write_text(text.replace("double(2)", "double(3)"), encoding="utf-8")  # an exercise edited by hand is restored
    release(tmp_path / "sol", tmp_path / "a")
    assert writes == [a] and a.read_text(encoding="utf-8") == text


def test_release_copies_the_folders_matplotlibrc(tmp_path):
    K.toy_solution(tmp_path / "sol")
    (tmp_path / "sol" / "matplotlibrc").write_text("font.family: sans-serif\n", encoding="utf-8")
    release(tmp_path / "sol", tmp_path / "out")
    assert (tmp_path / "out" / "matplotlibrc").read_text(encoding="utf-8") == "font.family: sans-serif\n"
    for src, out in EDITION_FOLDERS.values():  # the committed exercises carry their solutions' settings
        for name in SUPPORT_FILES:
            assert (REPO / src / name).is_file() == (REPO / out / name).is_file(), f"run `make release` ({out}/{name})"
            if (REPO / src / name).is_file():
                assert (REPO / out / name).read_bytes() == (REPO / src / name).read_bytes(), f"{out}/{name} is stale"


@pytest.mark.grading  # nbgrader releases every exercise (once per session, shared)
@pytest.mark.parametrize("lang", sorted(EDITION_FOLDERS))
def test_committed_exercises_are_exactly_a_fresh_release(lang):
    src, out = EDITION_FOLDERS[lang]
    assert len(_found(src)) >= 10, f"{src}/ holds the instructor notebooks of every exercise"
    fresh = sorted(K.fresh_release(lang).glob("ex[0-9][0-9]*.ipynb"))  # this session's release of today's solutions
    committed = sorted(p.name for (lg, _), p in RELEASED.items() if lg == lang)
    assert sorted(p.name for p in fresh) == committed, f"run `make release` and commit {out}/"
    for path in fresh:
        assert (REPO / out / path.name).read_bytes() == path.read_bytes(), f"{out}/{path.name} is stale: run `make release`"


@pytest.mark.parametrize("ex", KEYS, ids=_key_id)
def test_nothing_of_a_solution_or_a_hidden_test_is_released(ex):
    sol = K.load(SOLUTIONS[ex])
    rel = K.load(RELEASED[ex])
    text = "\n".join(K.src(c) for c in rel["cells"])
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"):
        assert marker not in text
    hidden = K.hidden_tokens(sol)
    assert not K.leaks(text, hidden), K.leaks(text, hidden)[:5]
    leaked = sorted(line for line in K.solution_only_lines(sol) if line in text)
    assert not leaked, leaked[:5]
    # every test cell of the solution is in the release, locked, with the same points
    tests = {c["metadata"]["nbgrader"]["grade_id"]: c["metadata"]["nbgrader"] for c in sol["cells"]
             if c["metadata"].get("nbgrader", {}).get("grade")}
    got = {c["metadata"]["nbgrader"]["grade_id"]: c["metadata"]["nbgrader"] for c in rel["cells"]
           if c["metadata"].get("nbgrader", {}).get("grade")}
    assert set(got) == set(tests)
    assert all(got[g]["points"] == tests[g]["points"] for g in tests)


def _run_untouched(path: Path) -> tuple[list, bool]:
    import nbformat
    from nbclient import NotebookClient

    from tinytf.course.ipynb import kernel_config

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=60, kernel_name="python3", allow_errors=True, config=kernel_config(),  # validate's kernels
                            resources={"metadata": {"path": str(path.parent)}})
    probe = nbformat.v4.new_code_cell("print('kernel alive')")
    nb.cells.append(probe)
    with client.setup_kernel():
        for i, cell in enumerate(nb.cells):
            client.execute_cell(cell, i)
    alive = any("kernel alive" in o.get("text", "") for o in nb.cells[-1].outputs)
    return nb.cells[:-1], alive


@pytest.mark.grading  # executes every released notebook
@pytest.mark.parametrize("ex", KEYS, ids=_key_id)
def test_released_exercise_run_untouched_fails_its_tests_cleanly(ex, monkeypatch):
    monkeypatch.setenv("TINYTF_HEADLESS", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    cells, alive = _run_untouched(RELEASED[ex])  # each cell under nbclient's 60 s limit (a TimeoutError fails it)
    assert alive, "the kernel must survive the untouched exercise"
    errors = {}
    for cell in cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                errors[cell["metadata"].get("nbgrader", {}).get("grade_id", cell.get("id"))] = out["ename"]
    tests = [c["metadata"]["nbgrader"]["grade_id"] for c in cells
             if c["metadata"].get("nbgrader", {}).get("grade") and not c["metadata"]["nbgrader"].get("solution")]
    passing = [t for t in tests if t not in errors]
    assert tests and not passing, f"every test cell must fail untouched; passing: {passing}"
    assert set(errors.values()) <= CLEAN_ERRORS, f"unexpected errors: {errors}"
    assert "NotImplementedError" in errors.values()
    last = K.src(cells[-1])
    assert last == f'from tinytf.course import self_check\nself_check("{ex[1]}")', "the last cell is the two-line self-check"
    assert not any(o.get("output_type") == "error" for o in cells[-1].get("outputs", [])), "self_check never raises"


def test_the_shared_release_is_keyed_by_every_solution_byte(tmp_path):
    """The session's cached release (tests/_coursekit.fresh_release) can never hide an edited solution."""
    sol = tmp_path / "solutions"
    shutil.copytree(REPO / "solutions", sol)
    before = K.release_key(sol)
    assert K.release_key(sol) == before, "the key is deterministic"
    for nb in (sorted(sol.glob("ex*.ipynb"))[0], sorted((sol / "zh").glob("ex*.ipynb"))[-1]):
        nb.write_bytes(nb.read_bytes().replace(b"assert", b"assert ", 1))
        after = K.release_key(sol)
        assert after != before, f"editing one character of {nb.relative_to(tmp_path)} gives a new release"
        before = after


def test_every_released_test_cell_is_in_its_editions_manifest():
    """``make release`` records every release's test cells (releases.json next to the notebooks)."""
    from tinytf.course.build.release import earlier_release, load_manifest
    from tinytf.course.ipynb import cell_source, is_test_cell, nbgrader_meta

    assert len(KEYS) == 2 * len(_found("solutions")) >= 22, KEYS  # every exercise, two editions
    for lang, ex in KEYS:
        manifest = load_manifest(RELEASED[(lang, ex)].parent)
        tests = [c for c in K.load(RELEASED[(lang, ex)])["cells"] if is_test_cell(c)]
        assert tests and all(earlier_release(manifest, ex, nbgrader_meta(c)["grade_id"], cell_source(c)) for c in tests), (lang, ex)


def test_release_adds_to_the_manifest_and_never_forgets(tmp_path):
    from tinytf.course.build.release import load_manifest

    K.toy_solution(tmp_path / "src")
    release(tmp_path / "src", tmp_path / "out")
    first = load_manifest(tmp_path / "out")
    assert set(first["ex90"]) == {"ex90_double_test", "ex90_square_test"} and all(len(v) == 1 for v in first["ex90"].values())
    nb = K.load(tmp_path / "src" / "ex90_toy.ipynb")
    K.cell_with(nb, "ex90_square_test")["source"] = "assert square(4) == 16, 'square(4) should be 16'"
    K.save(nb, tmp_path / "src" / "ex90_toy.ipynb")
    release(tmp_path / "src", tmp_path / "out")
    second = load_manifest(tmp_path / "out")
    assert second["ex90"]["ex90_double_test"] == first["ex90"]["ex90_double_test"]
    assert second["ex90"]["ex90_square_test"][0] == first["ex90"]["ex90_square_test"][0] and len(second["ex90"]["ex90_square_test"]) == 2


def _earliest_release(path: str) -> dict | None:
    import subprocess

    try:
        commits = subprocess.run(["git", "-C", str(REPO), "rev-list", "HEAD", "--", path], capture_output=True, text=True,
                                 check=True).stdout.split()
        return json.loads(subprocess.run(["git", "-C", str(REPO), "show", f"{commits[-1]}:{path}"], capture_output=True,
                                         text=True, check=True).stdout) if commits else None
    except (OSError, subprocess.CalledProcessError):
        return None


def test_a_submission_on_an_earlier_release_grades_like_the_same_answers_on_todays(tmp_path):
    """ex01's first release (from git history) had other ex01_scores and ex01_attention tests: the same
    answers on it and on today's release get the same statuses and points, never `tampered`; validate
    says the tests come from an earlier release."""
    from tinytf.course.check.validate import format_report, validate
    from tinytf.course.grade.run import grade

    old = _earliest_release("exercises/ex01_by_hand.ipynb")
    assert old is not None, "no git history of exercises/ex01_by_hand.ipynb: run the tests in a clone of the repository"
    today, sol = K.load(REPO / "exercises" / "ex01_by_hand.ipynb"), K.load(REPO / "solutions" / "ex01_by_hand.ipynb")
    changed = [g for g in ("ex01_hand_qk", "ex01_scores", "ex01_softmax", "ex01_attention")
               if K.src(K.cell_with(old, g)).strip() != K.src(K.cell_with(today, g)).strip()]
    assert changed, "the earliest release differs from today's in some test cell"
    subs = tmp_path / "subs"
    K.save(K.solved(today, sol), subs / "today" / "ex01_by_hand.ipynb")
    earlier = K.save(K.solved(old, sol), subs / "earlier" / "ex01_by_hand.ipynb")
    report = validate(earlier)
    assert report.ok and not report.structure and len(report.notes) == len(changed), format_report(report)
    assert all("earlier release of ex01" in n for n in report.notes)
    results = grade(subs, tmp_path / "out", exercises=["ex01"], timeout=120, released=REPO / "exercises", progress=False)
    cells = {r.student: {c.cell: (c.status, c.points) for c in r.cells} for r in results}
    tests = ("ex01_hand_qk", "ex01_scores", "ex01_softmax", "ex01_attention")  # the written answer ex01_explain came later
    assert [{g: cells[s][g] for g in tests} for s in ("earlier", "today")] == [{g: cells["today"][g] for g in tests}] * 2, cells
    messages = {c.cell: c.message for r in results if r.student == "earlier" for c in r.cells}
    assert all("earlier release of ex01" in messages[g] for g in changed), messages
