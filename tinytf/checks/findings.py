"""``Finding`` (one diagnosed problem, named by its :class:`~tinytf.checks.catalog.Pitfall`) and ``report``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .catalog import Pitfall

__all__ = ["Finding", "report", "found"]


@dataclass(frozen=True)
class Finding:
    """One diagnosed problem: ``pitfall`` (a :class:`Pitfall`; ``Pitfall.GENERAL`` = none of the
    named pitfalls), a short ``title`` and a ``message`` that explains the evidence and the fix.

    ``fix`` (and its Chinese ``fix_zh``) is this finding's own one-line fix, printed instead of the
    catalog's fix for ``pitfall`` where the catalog's would be wrong for what was found; empty = the
    catalog's fix is the fallback."""

    pitfall: Pitfall
    title: str
    message: str
    fix: str = ""
    fix_zh: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "pitfall", Pitfall(self.pitfall))  # a plain int from JSON becomes its name

    def __str__(self) -> str:
        tag = f"pitfall {int(self.pitfall)}" if self.pitfall else "problem"
        return f"[{tag}] {self.title}: {self.text}"

    @property
    def text(self) -> str:
        """The message, ending with this finding's own fix when it has one the message does not state yet."""
        if self.fix and " Fix: " not in self.message:
            return f"{self.message} Fix: {self.fix.replace('`', '')}."
        return self.message


def found(pitfall: Pitfall, title: str, evidence: str, *, where: str = "", fix: bool | str = True,
          fix_zh: str = "") -> Finding:
    """A finding whose message is ``evidence``, then ``where`` (the inputs that show it), then the fix:
    ``fix`` when it is a string (this finding's own, with its Chinese ``fix_zh``), else the catalog's
    one-line fix for ``pitfall`` (the single source of that wording; none with ``fix=False``)."""
    message = evidence.rstrip()
    if where:
        message += " " + where
    if isinstance(fix, str):
        return Finding(pitfall, title, message + f" Fix: {fix.replace('`', '')}.", fix=fix, fix_zh=fix_zh)
    if fix and pitfall is not Pitfall.GENERAL:
        message += f" Fix: {pitfall.fix.replace('`', '')}."
    return Finding(pitfall, title, message)


def report(findings: Iterable[Finding], *, name: str | None = None) -> str:
    """A readable summary of ``findings`` (one paragraph per finding); says so when there are none."""
    findings = list(findings)
    head = f"{name}: " if name else ""
    if not findings:
        return f"{head}OK - no problems found."
    lines = [f"{head}{len(findings)} problem{'s' if len(findings) > 1 else ''} found:"]
    for f in findings:
        tag = f.pitfall.label()
        lines.append(f"  x [{tag}] {f.title}")
        lines.append(f"      {f.text}")
    return "\n".join(lines)
