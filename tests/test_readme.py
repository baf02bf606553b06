"""README.zh.md is the whole README in Chinese: every heading of README.md has its Chinese counterpart.

Headings are paired by order and level (fenced code is skipped, so a ``# comment`` in a shell block is not a
heading): the two files have the same outline, each Chinese heading is written in Chinese and keeps the
English heading's code (``tinytf``, ``transformers``), and the Chinese README covers what an instructor
needs — the module table, grading, isolation, JupyterHub — and the CJK font the figures need.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CJK = re.compile(r"[\u3400-\u9fff]")


def headings(path: Path) -> list[tuple[int, str]]:
    """``(level, text)`` of every markdown heading outside fenced code blocks."""
    out, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        m = re.match(r"^(#{1,6})\s+(.+?)\s*#*\s*$", line)
        if m and not fenced:
            out.append((len(m.group(1)), m.group(2)))
    return out


def test_headings_skip_fenced_code(tmp_path):
    md = tmp_path / "x.md"
    md.write_text("# Title\n\n```bash\n# a comment\n```\n\n## Part\n### Sub\n", encoding="utf-8")
    assert headings(md) == [(1, "Title"), (2, "Part"), (3, "Sub")]


def test_every_heading_of_the_readme_has_a_chinese_counterpart():
    en, zh = headings(ROOT / "README.md"), headings(ROOT / "README.zh.md")
    assert len(en) >= 15, en
    assert [lvl for lvl, _ in zh] == [lvl for lvl, _ in en], (
        "README.zh.md's outline differs from README.md's:\n"
        + "\n".join(f"{'#' * a} {x}  <->  {'#' * b} {y}" for (a, x), (b, y) in zip(en + [(0, "")] * 99, zh + [(0, "")] * 99)
                    if (a, b) != (0, 0)))
    for (_, e), (_, z) in zip(en, zh):
        assert CJK.search(z), f"the counterpart of {e!r} is not in Chinese: {z!r}"
        for code in re.findall(r"`[^`]+`", e):
            assert code in z, f"{z!r} (for {e!r}) drops {code}"


def _modules(readme: str) -> set[str]:
    """The modules named in the second column of the module map (``| layer | `a.py`, `b.py` | concept |``)."""
    rows = re.findall(r"^\| [1-6] [^|]+\| ([^|]+) \|", readme, re.M)
    return {name for row in rows for name in re.findall(r"`([a-z_]+(?:\.py|/))`", row)}


def test_the_chinese_readme_is_complete_for_instructors():
    text = (ROOT / "README.zh.md").read_text(encoding="utf-8")
    modules = _modules((ROOT / "README.md").read_text(encoding="utf-8"))
    assert len(modules) >= 20, modules
    assert modules == _modules(text), "the module table differs"
    for must in ("tinytf grade", "grades_per_cell.csv", "needs-manual-grade", "docker run --rm --network none",
                 "JupyterHub", "tinytf gradebook merge", "fonts-noto-cjk", "make lab-zh"):
        assert must in text, f"README.zh.md does not say {must!r}"
    assert "README.md#" not in text, "README.zh.md still sends readers to a section of the English README"
