"""tinytf grade --shard and tinytf gradebook merge: a stable split of the students, checked merges (fast: no grading).

Merging real shard runs into the single run's gradebook, byte for byte, is tests/test_grade.py's job.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tinytf.course.cli import main
from tinytf.course.grade.gradebook import CellResult, ExerciseResult, aggregate, write_gradebook
from tinytf.course.grade.students import SHARD_ENV, merge, parse_shard, shard_of, write_shard_info

STUDENTS = [f"student{i:03d}" for i in range(60)] + ["Zoë Ångström", "a.b@uni.example"]


def _result(student: str, ex: str, points: float = 1.0) -> ExerciseResult:
    cells = [CellResult(student, ex, f"{ex}_t1", points, 2.0, "ok" if points == 2.0 else "failed", ""),
             CellResult(student, ex, f"{ex}_why", 0.0, 1.0, "needs-manual-grade", "written answer")]
    return aggregate(student, ex, cells, "")


def _gradebook(folder: Path, students: list[str], exercises=("ex01", "ex02"), shard: tuple[int, int] | None = None) -> Path:
    results = [_result(s, ex, float(len(s) % 3)) for s in students for ex in exercises]
    write_gradebook(results, folder)
    if shard is not None:
        write_shard_info(folder, shard, exercises, students)
    return folder


def test_every_student_is_in_exactly_one_shard_and_adding_students_moves_no_one():
    for n in (1, 2, 3, 7):
        shards = {s: shard_of(s, n) for s in STUDENTS}
        assert all(0 <= k < n for k in shards.values())
        more = {s: shard_of(s, n) for s in STUDENTS + [f"late{i}" for i in range(20)]}
        assert all(more[s] == k for s, k in shards.items()), "a student's shard depends on the student alone"
    assert len({shard_of(s, 3) for s in STUDENTS}) == 3, "62 students fill all three shards"
    assert shard_of("a_correct", 4) == 0 and shard_of("p_invalid_json", 4) == 3, "sha256-based: the same on every machine"


def test_parse_shard_takes_the_index_from_the_batch_system():
    assert parse_shard("1/4", {}) == (1, 4)
    assert parse_shard("auto/4", {"SLURM_ARRAY_TASK_ID": "3"}) == (3, 4)
    assert parse_shard("auto/4", {"JOB_COMPLETION_INDEX": "0"}) == (0, 4)
    with pytest.raises(ValueError, match=" nor ".join(SHARD_ENV)):
        parse_shard("auto/4", {})
    with pytest.raises(ValueError, match="not below the number of shards 4"):
        parse_shard("auto/4", {"SLURM_ARRAY_TASK_ID": "4"})  # --array=1-4 instead of 0-3
    with pytest.raises(ValueError, match="not below"):
        parse_shard("2/2", {})
    for bad in ("3", "a/2", "1/0", "-1/2", "1/x"):
        with pytest.raises(ValueError):
            parse_shard(bad, {})


def test_merged_shards_are_the_gradebook_of_everyone(tmp_path):
    n = 3
    parts = [_gradebook(tmp_path / f"out{k}", [s for s in STUDENTS if shard_of(s, n) == k], shard=(k, n)) for k in range(n)]
    whole = _gradebook(tmp_path / "whole", STUDENTS)
    merge(parts[::-1], tmp_path / "merged")
    for name in ("grades.csv", "grades_per_cell.csv", "summary.txt"):
        assert (tmp_path / "merged" / name).read_bytes() == (whole / name).read_bytes(), name
    page = Path("feedback") / "Zoë Ångström" / "ex02.html"
    assert (tmp_path / "merged" / page).read_bytes() == (whole / page).read_bytes()


def test_an_empty_shard_still_merges(tmp_path):
    a = _gradebook(tmp_path / "a", STUDENTS[:5], shard=(0, 2))
    b = _gradebook(tmp_path / "b", [], shard=(1, 2))
    assert len(merge([a, b], tmp_path / "m")) == 10


def test_merge_refuses_overlapping_missing_or_mismatched_shards(tmp_path):
    a = _gradebook(tmp_path / "a", STUDENTS[:5], shard=(0, 2))
    with pytest.raises(ValueError, match="overlapping shards"):
        merge([a, _gradebook(tmp_path / "b", STUDENTS[4:9], shard=(1, 2))], tmp_path / "m")
    with pytest.raises(ValueError, match="overlapping|exactly once"):
        merge([a, a], tmp_path / "m")
    with pytest.raises(ValueError, match="different exercises"):
        merge([a, _gradebook(tmp_path / "c", STUDENTS[5:9], exercises=("ex01",), shard=(1, 2))], tmp_path / "m")
    with pytest.raises(ValueError, match="missing: \\[1, 2\\]"):
        merge([_gradebook(tmp_path / "d", STUDENTS[:5], shard=(0, 3))], tmp_path / "m")
    with pytest.raises(ValueError, match="different splits"):
        merge([a, _gradebook(tmp_path / "e", STUDENTS[5:9], shard=(1, 3))], tmp_path / "m")
    assert not (tmp_path / "m").exists(), "nothing is written when the shards do not fit together"


def test_cli_errors_are_one_clear_line(tmp_path, monkeypatch, capsys):
    for name in SHARD_ENV:
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "subs").mkdir()
    assert main(["grade", str(tmp_path / "subs"), "--shard", "auto/4", "--quiet"]) == 2
    assert "SLURM_ARRAY_TASK_ID" in capsys.readouterr().err
    a = _gradebook(tmp_path / "a", STUDENTS[:3], shard=(0, 2))
    assert main(["gradebook", "merge", str(a), str(a), "--out", str(tmp_path / "m")]) == 2
    assert "tinytf gradebook merge:" in capsys.readouterr().err
    b = _gradebook(tmp_path / "b", STUDENTS[3:6], shard=(1, 2))
    assert main(["gradebook", "merge", str(a), str(b), "--out", str(tmp_path / "m")]) == 0
    assert "students graded: 6" in capsys.readouterr().out
