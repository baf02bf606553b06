"""The student corpus through ``tinytf validate``: each case is clean exactly when it says so, names the
listed pitfalls (by catalog name), says the listed words, prints each finding's own fix, and the
notebook's self-check agrees with validate (a student never gets green from one and red from the other).
The grading run of the same cases is test_corpus.py's."""

from __future__ import annotations

import json
from pathlib import Path

import _corpus as C
import pytest

from tinytf.checks import Pitfall
from tinytf.course.check.validate import format_report, validate
from tinytf.course.messages import say

pytestmark = pytest.mark.grading  # real validate runs: make unit, not make test-fast


@pytest.fixture(scope="module")
def submissions(tmp_path_factory) -> Path:
    return C.submissions(tmp_path_factory)


@pytest.mark.parametrize("path", C.CASES, ids=C.case_id)
def test_validate_gives_the_expected_verdict(path, submissions):
    case = json.loads(path.read_text(encoding="utf-8"))
    nb = submissions / C.case_id(path) / C.RELEASED[case["exercise"]].name
    report = validate(nb, released_dir=C.REPO / "exercises")
    text = format_report(report)
    want = case["validate"]
    clean = report.ok and not report.findings
    assert clean == want["clean"], f"{C.case_id(path)} ({case['about']}): validate said\n{text}"
    named = {int(f["pitfall"]) for f in report.findings}
    for name in want["pitfalls"]:
        assert int(Pitfall[name]) in named, f"{C.case_id(path)}: validate must name {name}; it said\n{text}"
    for words in want["says"]:
        assert words in text, f"{C.case_id(path)}: validate must say {words!r}; it said\n{text}"
    assert "without encryption" not in text
    _assert_each_finding_prints_its_own_fix(report, text)
    assert report.self_check_ok == report.ok, (
        f"{C.case_id(path)}: the notebook's self-check says {'OK' if report.self_check_ok else 'FAILED'} but validate "
        f"says {'OK' if report.ok else 'FAILED'} — a student must never get green from one and red from the other\n{text}")


def _assert_each_finding_prints_its_own_fix(report, text: str) -> None:
    """A finding with its own fix prints that fix (in the report's language) as its fix line, never the catalog's."""
    lines = text.splitlines()
    for f in report.findings:
        own = f.get("fix")  # said in the report's language by the catalog, like title and evidence
        if not own:
            continue
        start = next(i for i, line in enumerate(lines) if line.startswith("  x [") and line.endswith(f" {f['title']}"))
        block = lines[start + 1 : next((j for j in range(start + 1, len(lines)) if not lines[j].startswith("      ")), len(lines))]
        assert block[-1] == "      " + say("fix", report.lang, fix=own), f"{f['title']}: its own fix must be its fix line\n{text}"
        pitfall = Pitfall(int(f["pitfall"]))
        if pitfall:
            catalog = pitfall.entry.fix_zh if report.lang == "zh" else pitfall.fix.replace("`", "")
            assert catalog not in "\n".join(block), f"{f['title']}: the catalog's fix {catalog!r} is wrong here\n{text}"
