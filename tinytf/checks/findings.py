"""``Finding`` (one diagnosed problem, named by its :class:`~tinytf.checks.catalog.Pitfall`) and ``report``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..translation import _, current_language, ngettext
from .catalog import Pitfall

__all__ = ["Finding", "report", "found", "fix_sentence", "split_fix"]


def fix_sentence(fix: str, lang: str | None = None) -> str:
    """`` Fix: <fix>.`` in ``lang`` (the running notebook's by default), backticks dropped: how a message ends."""
    return _(" Fix: {fix}.", lang).format(fix=fix.replace("`", ""))


def split_fix(message: str) -> tuple[str, str]:
    """``(evidence, fix)``: a finding's message cut where its fix sentence begins (in either language)."""
    for lang in ("en", "zh"):
        mark = _(" Fix: {fix}.", lang).split("{fix}", 1)[0]
        if mark in message:
            evidence, fix = message.split(mark, 1)
            return evidence, fix
    return message, ""


@dataclass(frozen=True)
class Finding:
    """One diagnosed problem: ``pitfall`` (a :class:`Pitfall`; ``Pitfall.GENERAL`` = none of the
    named pitfalls), a short ``title`` and a ``message`` that explains the evidence and the fix.

    ``fix`` is this finding's own one-line fix, printed instead of the catalog's fix for ``pitfall`` where
    the catalog's would be wrong for what was found; empty = the catalog's fix is the fallback. Title,
    message and fix are said in the language of the notebook that ran the diagnosis (:mod:`tinytf.translation`);
    ``fix_zh`` is an explicit Chinese fix kept for findings written before the message catalog."""

    pitfall: Pitfall
    title: str
    message: str
    fix: str = ""
    fix_zh: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "pitfall", Pitfall(self.pitfall))  # a plain int from JSON becomes its name

    def __str__(self) -> str:
        tag = _("pitfall {number}").format(number=int(self.pitfall)) if self.pitfall else _("problem")
        return f"[{tag}] {self.title}: {self.text}"

    @property
    def text(self) -> str:
        """The message, ending with this finding's own fix when it has one the message does not state yet."""
        if self.fix and not split_fix(self.message)[1]:
            return self.message + fix_sentence(self.fix)
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
        said = fix_zh if fix_zh and current_language() == "zh" else fix
        return Finding(pitfall, title, message + fix_sentence(said), fix=said, fix_zh=fix_zh)
    if fix and pitfall is not Pitfall.GENERAL:
        message += fix_sentence(_(pitfall.fix))
    return Finding(pitfall, title, message)


def report(findings: Iterable[Finding], *, name: str | None = None) -> str:
    """A readable summary of ``findings`` (one paragraph per finding); says so when there are none."""
    findings = list(findings)
    head = f"{name}: " if name else ""
    if not findings:
        return head + _("OK - no problems found.")
    n = len(findings)
    lines = [head + ngettext("{n} problem found:", "{n} problems found:", n).format(n=n)]
    for f in findings:
        tag = f.pitfall.label()
        lines.append(f"  x [{tag}] {f.title}")
        lines.append(f"      {f.text}")
    return "\n".join(lines)
