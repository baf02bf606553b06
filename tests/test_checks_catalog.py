"""tinytf.checks.catalog: every pitfall points at a chapter section that exists."""

from __future__ import annotations


def test_every_pitfall_points_at_a_section_that_exists():
    """The catalog's "NN_chapter.ipynb § heading" must name a real notebook and the start of one of its headings."""
    import json
    import re
    from pathlib import Path

    from tinytf.checks.catalog import CATALOG

    root = Path(__file__).resolve().parents[1] / "notebooks"
    for pitfall, entry in CATALOG.items():
        name, _, section = entry.section.partition(" § ")
        path = root / name
        assert path.exists(), f"{pitfall.name}: {name} is not a chapter"
        if not section:
            continue
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        headings = [re.sub(r"^#+\s*", "", line) for c in cells if c["cell_type"] == "markdown"
                    for line in "".join(c["source"]).splitlines() if line.startswith("#")]
        assert any(h.startswith(section) for h in headings), f"{pitfall.name}: no heading of {name} starts with {section!r}"
