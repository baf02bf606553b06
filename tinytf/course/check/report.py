"""The report of an exercise check and its plain-language text: what ``tinytf validate`` (the nbclient
runner, :mod:`tinytf.course.check.validate`) and the self-check (in the kernel, :mod:`tinytf.course.check.selfcheck`)
both fill and print, so that the two never word a verdict differently."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...translation import N_
from ...translation import gettext as _
from ..messages import say

__all__ = ["CellCheck", "Report", "finding_lines", "format_report"]

# a test cell's status and problem as the report names them (translated with their context when said)
_LABELS = {"pass": N_("PASS"), "fail": N_("FAIL"), "error": N_("ERROR"), "timeout": N_("TIMEOUT"), "not-run": N_("NOT RUN")}
_PROBLEMS = (N_("deleted"), N_("edited"), N_("earlier release"))


@dataclass
class CellCheck:
    """One test cell: ``status`` is pass / fail / error / timeout / not-run."""

    grade_id: str
    points: float
    status: str
    message: str = ""
    problem: str = ""  # "deleted", "renamed", "edited" or ""
    where: str = ""  # how to find it in JupyterLab: "cell 9 (under \"Task 1b — scaling\")"


@dataclass
class Report:
    path: str
    exercise: str
    cells: list[CellCheck] = field(default_factory=list)
    structure: list[str] = field(default_factory=list)  # deleted / edited / stripped cells
    cell_errors: list[str] = field(default_factory=list)  # errors in the student's own cells
    findings: list[dict[str, Any]] = field(default_factory=list)
    diagnosis_error: str = ""
    fatal: str = ""  # the notebook could not be read or run at all
    problems: dict[str, str] = field(default_factory=dict)  # grade_id -> "deleted" / "edited"
    self_check_ok: bool | None = None  # the in-kernel self-check's verdict at the end of validate's run
    lang: str = "en"  # the notebook's edition (metadata.tinytf.edition): the report speaks it
    stopped: list[str] = field(default_factory=list)  # cells stopped for time, said in words
    notes: list[str] = field(default_factory=list)  # said, but nothing wrong (a test from an earlier release)
    source: bool = False  # an instructor source (solutions/): its own tests, hidden ones too, ran as written
    released: Path | None = None  # the released notebook it was compared with

    @property
    def ok(self) -> bool:
        """True when the notebook ran (no cell stopped for time), every visible test passed and nothing was deleted or edited."""
        return (not self.fatal and not self.structure and not self.stopped and all(c.status == "pass" for c in self.cells)
                and not self.findings)


def finding_lines(f: dict[str, Any], lang: str) -> list[str]:
    """One diagnosed finding as two or three lines: the pitfall's name, the evidence, the fix.

    The fix is the finding's own (``f["fix"]``) when it has one, else the catalog's for its pitfall, in ``lang``.
    Title, evidence and own fix come as the diagnosis said them (one message catalog): in the language of the
    kernel that ran it, which ``tinytf validate`` and the self-check set to the notebook's.
    """
    from tinytf.checks.catalog import Pitfall
    from tinytf.checks.findings import split_fix

    try:
        pitfall = Pitfall(int(f["pitfall"]))
    except ValueError:  # a number the catalog does not know (a newer diagnosis)
        return [f"  x [{_('pitfall {number}', lang).format(number=f['pitfall'])}] {f['title']}", f"      {f['message']}"]
    own = str(f.get("fix") or "")
    evidence, said_fix = split_fix(str(f["message"]))
    lines = [f"  x [{pitfall.label(lang)}] {f['title']}"]
    if lang != "zh" and not own:
        return [*lines, f"      {f['message']}"]
    fix = own or (_(pitfall.fix, lang) if pitfall is not Pitfall.GENERAL else said_fix.rstrip("."))
    lines.append("      " + say("evidence", lang, message=evidence))
    return [*lines, "      " + say("fix", lang, fix=fix)] if fix else lines


def format_report(r: Report, title: str | None = None) -> str:
    """The plain-language text ``tinytf validate`` (and, with its own ``title``, the self-check) prints,
    in the notebook's language."""
    lang = r.lang
    lines = [title or say("header", lang, path=r.path, ex=r.exercise)]
    if r.fatal and not r.cells:
        return "\n".join([*lines, f"  x {r.fatal}", say("result_failed", lang)])
    for s in r.structure:
        lines.append(f"  ! {s}")
    for s in r.notes:
        lines.append(f"  i {s}")
    lines.append(say("tests_source" if r.source else "tests", lang))
    labels = {k: _(v, lang) for k, v in _LABELS.items()}
    for c in r.cells:
        problem = _(c.problem, lang) if c.problem in _PROBLEMS else c.problem
        extra = f" [{problem}]" if problem else ""
        msg = f"  {c.message}" if c.message else ""
        pts = say("points", lang, pts=c.points)
        if lang == "zh":
            lines.append(f"  {labels[c.status]:<4} {c.grade_id}（{pts}{'，' + c.where if c.where else ''}）{extra}{msg}")
        else:
            lines.append(f"  {labels[c.status]:<7} {c.grade_id} ({pts}{', ' + c.where if c.where else ''}){extra}{msg}")
    for e in r.cell_errors:
        lines.append("  ! " + say("cell_error", lang, what=e))
    for e in r.stopped:
        lines.append("  ! " + e)
    if r.fatal:
        lines.append(f"  x {r.fatal}")
    lines.append(say("diagnosis", lang))
    if r.diagnosis_error:
        lines.append(f"  {r.diagnosis_error}")
    elif not r.findings:
        lines.append("  " + say("no_pitfall", lang))
    else:
        for f in r.findings:
            lines += finding_lines(f, lang)
    verdict = say("verdict_ok" if r.ok else "verdict_failed", lang)
    lines.append(say("result", lang, verdict=verdict, passed=sum(c.status == "pass" for c in r.cells), total=len(r.cells),
                     pts=sum(c.points for c in r.cells if c.status == "pass"), max=sum(c.points for c in r.cells)))
    return "\n".join(lines)
