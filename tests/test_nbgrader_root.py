"""The cached course roots (build/course-roots/<key>/): built once, reused, and rebuilt by any change
to what they are built from — a cache may never hide an edited solution."""

from __future__ import annotations

import json
import sqlite3

import _coursekit as K

from tinytf.course.build.nbgrader_root import alembic_head, cached_course_root, course_root_key
from tinytf.course.exercises import REPO, find_notebooks


def _edit_solution(path, old: str, new: str) -> None:
    nb = K.load(path)
    cell = next(c for c in nb["cells"] if old in K.src(c))
    cell["source"] = K.src(cell).replace(old, new)
    K.save(nb, path)


def test_a_cached_root_is_reused_until_a_solution_changes(tmp_path):
    sols = tmp_path / "solutions"
    K.toy_solution(sols)
    cache = tmp_path / "cache"
    first = cached_course_root(sols, ["ex90"], "en", cache=cache)
    db = first / "gradebook.db"
    assert db.is_file() and (first / "release" / "ex90" / "ex90_toy.ipynb").is_file()
    with sqlite3.connect(db) as con:  # stamped in process with what `alembic heads` prints (the test below)
        assert con.execute("SELECT version_num FROM alembic_version").fetchall() == [(alembic_head(),)]
    built = db.stat().st_mtime_ns
    again = cached_course_root(sols, ["ex90"], "en", cache=cache)
    assert again == first and db.stat().st_mtime_ns == built, "the same inputs reuse the root as it is"
    _edit_solution(sols / "ex90_toy.ipynb", "return 2 * x", "return x + x")
    edited = cached_course_root(sols, ["ex90"], "en", cache=cache)
    assert edited != first, "an edited solution gets a new root"
    source = json.loads((edited / "source" / "ex90" / "ex90_toy.ipynb").read_text(encoding="utf-8"))
    assert any("return x + x" in K.src(c) for c in source["cells"])
    released = (edited / "release" / "ex90" / "ex90_toy.ipynb").read_text(encoding="utf-8")
    assert "return x + x" not in released and "YOUR CODE HERE" in released, "and its release is generated anew"
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")) == sorted([first.name, edited.name])


def test_the_key_covers_solutions_released_copies_and_tinytf_source(tmp_path):
    sols = find_notebooks(K.toy_solution(tmp_path / "solutions").parent)
    assert list(sols) == ["ex90"]
    pkg = tmp_path / "pkg"
    (pkg / "course").mkdir(parents=True)
    (pkg / "course" / "grade.py").write_text("X = 1\n", encoding="utf-8")
    base = course_root_key(sols, source=pkg)
    assert course_root_key(sols, source=pkg) == base, "deterministic"
    (pkg / "course" / "grade.py").write_text("X = 2\n", encoding="utf-8")
    assert course_root_key(sols, source=pkg) != base, "a change to tinytf's source changes the key"
    released = tmp_path / "released"
    released.mkdir()
    with_release = course_root_key(sols, released, source=pkg)
    assert with_release == course_root_key(sols, source=pkg), "no released copy: the same key"
    (released / "ex90_toy.ipynb").write_text("{}", encoding="utf-8")
    assert course_root_key(sols, released, source=pkg) != with_release, "the released copy is part of the key"
    assert course_root_key(sols) != course_root_key(sols, source=pkg), "by default the key covers tinytf's own source"


def test_a_folders_matplotlibrc_goes_with_each_assignment_and_into_the_key(tmp_path):
    sols = find_notebooks(K.toy_solution(tmp_path / "solutions").parent)
    base = course_root_key(sols)
    (tmp_path / "solutions" / "matplotlibrc").write_text("font.family: sans-serif\n", encoding="utf-8")
    assert course_root_key(sols) != base, "the folder's matplotlibrc is part of the key"
    root = cached_course_root(tmp_path / "solutions", ["ex90"], "en", cache=tmp_path / "cache")
    for stage in ("source", "release"):  # nbgrader hands an assignment's other files to the students with it
        assert (root / stage / "ex90" / "matplotlibrc").read_text(encoding="utf-8") == "font.family: sans-serif\n", stage


def test_a_new_gradebook_is_stamped_with_the_schema_version_alembic_itself_reports(tmp_path):
    """nbgrader stamps a new gradebook with ``alembic heads`` (a subprocess each time); tinytf answers in process
    (the stamp of a course root: test_a_cached_root_is_reused_until_a_solution_changes). It must be exactly what
    alembic prints, so nbgrader's own ``nbgrader db upgrade`` still sees a current gradebook."""
    import subprocess
    import sys

    from nbgrader.dbutil import write_alembic_ini

    ini = tmp_path / "alembic.ini"  # nbgrader's own alembic.ini, as its `alembic heads` call writes it
    write_alembic_ini(str(ini), f"sqlite:///{tmp_path / 'probe.db'}")
    printed = subprocess.check_output([sys.executable, "-m", "alembic", "-c", str(ini), "heads"], text=True)
    assert printed.split()[0] == alembic_head()


def test_a_cached_course_root_is_keyed_by_the_whole_package():
    """Every file of tinytf (the judges, the model code the hidden tests call) is part of the key, not only
    the folder this module lives in."""
    from tinytf.course.build import nbgrader_root

    assert nbgrader_root.PACKAGE == REPO / "tinytf" and (nbgrader_root.PACKAGE / "attention.py").is_file()
