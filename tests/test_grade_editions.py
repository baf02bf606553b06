"""A class that mixes the two editions: a Chinese submission is graded exactly like its English twin
(same hidden tests, judges and points), the gradebook says which edition each one was, the feedback
page speaks the submission's language, and ``tinytf validate`` diagnoses a Chinese notebook in Chinese."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import _coursekit as K
import pytest

from tinytf.checks import Pitfall
from tinytf.course.check.validate import format_report, validate
from tinytf.course.exercises import REPO
from tinytf.course.grade.run import grade

pytestmark = pytest.mark.grading  # real grading runs: make unit, not make test-fast

EX, NAME = "ex01", "ex01_by_hand.ipynb"
CASE = json.loads((REPO / "tests" / "corpus" / EX / "divides_by_d.json").read_text(encoding="utf-8"))
FOLDERS = {"en": ("solutions", ""), "zh": ("solutions/zh", "zh")}


def _with_case(nb: dict, cells: dict[str, str]) -> dict:
    for cell in nb["cells"]:
        gid = cell["metadata"].get("nbgrader", {}).get("grade_id")
        if gid in cells:
            cell["source"] = cells[gid]
    return nb


def _grade_class(base: Path) -> None:
    """Three students per edition (correct, wrong: the corpus case, tampered), graded in one run."""
    released = K.fresh_release("en")  # both editions (zh/ inside), released once per session from today's solutions
    notebooks = {}
    for lang, (src, sub) in FOLDERS.items():
        notebooks[lang] = K.solved(K.load(released / sub / NAME), K.load(REPO / src / NAME))
    subs = base / "submissions"
    for lang, nb in notebooks.items():
        test_id = K.first_test_id(nb)
        K.save(nb, subs / f"correct_{lang}" / NAME)
        K.save(_with_case(json.loads(json.dumps(nb)), CASE["cells"]), subs / f"wrong_{lang}" / NAME)
        K.save(K.edited(nb, test_id, "assert True\n"), subs / f"tampered_{lang}" / NAME)
    grade(subs, base / "out", exercises=[EX], jobs=2, timeout=30, notebook_timeout=120, released=released, progress=False)


@pytest.fixture(scope="module")
def klass(tmp_path_factory):
    """A class of both editions graded once per test run (on disk: a second set-up reads it)."""
    base = K.once_per_run(tmp_path_factory, "editions-class", _grade_class)
    with (base / "out" / "grades.csv").open(newline="", encoding="utf-8") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    return {"base": base, "released": K.fresh_release("en"), "rows": rows, "out": base / "out", "subs": base / "submissions"}


def test_each_edition_is_graded_like_its_twin(klass):
    rows = klass["rows"]
    assert set(rows) == {f"{kind}_{lang}" for kind in ("correct", "wrong", "tampered") for lang in FOLDERS}
    for kind in ("correct", "wrong", "tampered"):
        en, zh = rows[f"{kind}_en"], rows[f"{kind}_zh"]
        assert (en["edition"], zh["edition"]) == ("en", "zh"), "the gradebook names each submission's edition"
        assert (zh["status"], zh["score"], zh["max_score"]) == (en["status"], en["score"], en["max_score"]), (kind, en, zh)
    assert rows["correct_zh"]["status"] == "needs-manual-grade"  # every autograded point; its written answer waits for an instructor
    assert float(rows["correct_zh"]["score"]) == float(rows["correct_zh"]["max_score"]) - 2
    assert rows["wrong_zh"]["status"] == CASE["grade"]["status"]
    assert float(rows["wrong_zh"]["score"]) == CASE["grade"]["score"], "the corpus case's points, in either edition"
    assert rows["tampered_zh"]["status"] == "tampered"


def test_per_cell_results_match_between_editions(klass):
    with (klass["out"] / "grades_per_cell.csv").open(newline="", encoding="utf-8") as f:
        cells = list(csv.DictReader(f))
    for kind in ("correct", "wrong", "tampered"):
        per = {lang: [(r["cell"], r["points"], r["status"]) for r in cells if r["student"] == f"{kind}_{lang}"] for lang in FOLDERS}
        assert per["en"] == per["zh"] and per["en"], kind


def test_feedback_pages_speak_the_submission_language(klass):
    page = {s: (klass["out"] / "feedback" / s / f"{EX}.html").read_text(encoding="utf-8") for s in klass["rows"]}
    for kind in ("correct", "wrong", "tampered"):
        assert "tinytf 评分" in page[f"{kind}_zh"] and "tinytf grading" not in page[f"{kind}_zh"], kind
        assert "tinytf grading" in page[f"{kind}_en"] and "tinytf 评分" not in page[f"{kind}_en"], kind
    assert "结果错误（独立检查发现）" in page["wrong_zh"] or "未通过" in page["wrong_zh"] or "错误（failed）" in page["wrong_zh"]
    assert "被篡改（tampered）" in page["tampered_zh"]
    assert "tampered" in page["tampered_en"] and "被篡改" not in page["tampered_en"]


def test_validate_diagnoses_a_chinese_notebook_in_chinese(klass):
    report = validate(klass["subs"] / "wrong_zh" / NAME, released_dir=klass["released"] / "zh")
    text = format_report(report)
    assert report.lang == "zh" and not report.ok
    pitfalls = {Pitfall(int(f["pitfall"])) for f in report.findings}
    assert {Pitfall[p] for p in CASE["validate"]["pitfalls"]} <= pitfalls, text
    assert Pitfall.SCALE.label("zh") in text and "修复：" + Pitfall.SCALE.entry.fix_zh in text, text
    assert "结果：未通过" in text and "Result:" not in text and "Test cells" not in text
    english = format_report(validate(klass["subs"] / "wrong_en" / NAME, released_dir=klass["released"]))
    assert Pitfall.SCALE.label() in english and "Result: FAILED" in english and "修复" not in english


def test_a_chinese_release_uses_chinese_stubs(klass):
    zh = Path(klass["released"] / "zh" / NAME).read_text(encoding="utf-8")
    en = Path(klass["released"] / NAME).read_text(encoding="utf-8")
    assert "在这里写你的代码" in zh and "YOUR CODE HERE" not in zh and "YOUR CODE HERE" in en
