"""What the course tools say to a student, in the student's language (English or Chinese).

``say(key, lang, **values)`` formats one message of :data:`MESSAGES` (English msgids; the Chinese is in the
message catalog, :mod:`tinytf.translation`). The grader keeps its gradebook messages in English (one language
for the instructor's CSV); :func:`translate` turns such a message into Chinese for a Chinese feedback page by
its known English phrases (:data:`PHRASES`, also in the catalog).
"""

from __future__ import annotations

import re

from ..translation import N_
from ..translation import gettext as _

__all__ = ["MESSAGES", "PHRASES", "STATUS_NAMES", "say", "status_name", "translate"]

MESSAGES: dict[str, str] = {
    # tinytf validate
    "header": N_("tinytf validate {path}  (exercise {ex})"),
    "tests": N_("Test cells (visible tests; the grader also runs hidden tests on fresh inputs):"),
    "tests_source": N_("Test cells (an instructor source: every visible and hidden test, as written here):"),
    "points": N_("{pts:g} pt"),
    "cell_error": N_("error in your cell {what}"),
    "diagnosis": N_("Diagnosis (tinytf.checks):"),
    "no_pitfall": N_("no known pitfall detected in your functions"),
    "fix": N_("Fix: {fix}"),
    "evidence": N_("{message}"),
    "result": N_("Result: {verdict} — {passed} of {total} test cells pass ({pts:g} of {max:g} autograded points on the visible tests)"),
    "verdict_ok": N_("OK"),
    "result_failed": N_("Result: FAILED"),
    "verdict_failed": N_("FAILED"),
    "not_implemented": N_("not implemented yet (a function it calls still raises NotImplementedError)"),
    "no_diagnosis": N_("the diagnosis did not run (the kernel stopped before it)"),
    "diagnosis_failed": N_("the diagnosis failed: {error}"),
    "no_release": N_("no released version of this exercise was found to compare with; test cells were not checked"),
    "stripped": N_("the notebook has no nbgrader cell metadata (an editor stripped it?): the grader cannot find any test cell; "
                   "start again from the released exercise and copy your answers over"),
    "deleted": N_("test cell {gid} was deleted or renamed: it is worth 0 when graded; copy it back from the released exercise"),
    "edited": N_("test cell {gid} was edited: edited test cells earn 0 when graded; the released version was run here instead"),
    "earlier_release": N_("test cell {gid} comes from an earlier release of {ex}; today's version was run (graded normally)"),
    "cannot_read": N_("cannot read {name}: {error}"),
    # a cell stopped for time (validate, the self-check, grade): slow is not wrong
    "stopped": N_("{where} was stopped after {ran:.0f} s: the limit is {limit:g} s per cell. This is no error in your code, it "
                  "was too slow here. Set fast = True in the parameters cell, use fewer steps, or give it longer: tinytf "
                  "validate --timeout 300 {path}"),
    "stopped_test": N_("stopped after {ran:.0f} s (the limit is {limit:g} s per cell): too slow, not wrong; see below"),
    "stopped_skipped": N_("not rerun: it was stopped for time above"),
    "diagnosis_stopped": N_("the diagnosis was stopped after {ran:.0f} s (its limit is {limit:g} s), so it says nothing about your "
                            "functions; give it longer: tinytf validate --timeout 300 {path}"),
    "sc_interrupted": N_("{ex} self-check was interrupted after {ran:.0f} s, before it finished (it reruns every visible test, and a "
                         "training test takes as long as its cell): set fast = True or use fewer steps, then run it again"),
    # self_check
    "sc_title": N_("{ex} self-check (the same check as tinytf validate, in this kernel):"),
    "no_saved": N_("the saved notebook {ex}_….ipynb was not found in this folder: its test cells were not compared with the "
                   "release (save it, or run tinytf validate on the file)"),
    "sc_error": N_("{ex} self-check could not run ({error})."),
    "sc_clean": N_("{ex} self-check: no known pitfall detected in your functions."),
    "sc_found": N_("{ex} self-check: {n} problem{s} found:"),
    "sc_full": N_("For the full check (runs the notebook and every visible test): tinytf validate {where}"),
    # feedback pages
    "fb_title": N_("tinytf grading: {ex} for {student}"),
    "fb_points": N_("**{total:g} / {best:g} points** (written answers are added by an instructor)."),
    "fb_note": N_("Note: {note}"),
    "fb_columns": N_("| test cell | points | status | details |"),
}

# a gradebook status (its code) -> the status said on a student's page
STATUS_NAMES: dict[str, str] = {
    "ok": N_("ok"), "failed": N_("failed"), "error": N_("error"), "timeout": N_("timeout"), "missing-cell": N_("missing-cell"),
    "tampered": N_("tampered"), "unreadable": N_("unreadable"), "missing-submission": N_("missing-submission"),
    "needs-manual-grade": N_("needs-manual-grade"),
}

# the grader's English phrases (finish.py, grade.py), translated where they occur; longest first when applied
PHRASES: tuple[str, ...] = (
    N_("this test cell is missing from the submission (deleted, renamed, or metadata stripped)"),
    N_("this test cell is missing from the graded notebook"),
    N_("written answer: an instructor grades it"),
    N_("this test comes from an earlier release of "),
    N_("; today's version was run"),
    N_("this locked test cell was edited; edited test cells earn 0"),
    N_("the cell passed but exported no result for the independent check"),
    N_("wrong result (found by the independent check): "),
    N_("had been replaced; the independent check: "),
    N_("the cell passed only because "),
    N_("the cell ran past the per-cell time limit"),
    N_(" and was stopped: too slow, not wrong. Set fast = True in the parameters cell or use fewer steps"),
    N_("ran past the per-cell time limit"),
    N_(" it had run "),
    N_("the notebook's kernel died (os._exit, a crash, or the memory limit) and grading stopped"),
    N_("the notebook ran past the whole-notebook limit"),
    N_("and was stopped"),
    N_("nbgrader could not grade this notebook: "),
    N_("the submission has no nbgrader cell metadata (stripped?)"),
    N_("not implemented yet"),
    N_("a hidden test"),
)


def say(key: str, lang: str = "en", **values: object) -> str:
    """Message ``key`` in ``lang`` (``"zh"`` or English), formatted with ``values``."""
    return _(MESSAGES[key], lang).format(**values)


def status_name(status: str, lang: str = "en") -> str:
    """A gradebook status for a student page: the code itself in English; in another language its name, then the code."""
    if lang == "en" or status not in STATUS_NAMES:
        return status
    return _("{name} ({code})", lang).format(name=_(STATUS_NAMES[status], lang), code=status)


_FULL_WIDTH = "（），。：；"
_CJK = "\u4e00-\u9fff"
# a space a translated phrase left next to full-width punctuation ("限制（600 秒） ，已被停止")
_SPACE_BY_PUNCT = re.compile(rf"(?<=[{_FULL_WIDTH}{_CJK}]) +(?=[{_FULL_WIDTH}])|(?<=[{_FULL_WIDTH}]) +(?=[{_FULL_WIDTH}{_CJK}])")


def translate(message: str, lang: str = "en") -> str:
    """A grader message in ``lang``: its known English phrases (:data:`PHRASES`) translated; the rest
    (a test's own assertion text, shapes and numbers) is kept as it is."""
    if lang == "en" or not message:
        return message
    for en in PHRASES:
        message = message.replace(en, _(en, lang))
    message = re.sub(r"\bcell (\d+) \(defines ([^)]*)\)",
                     lambda m: _("cell {number} (defines {names})", lang).format(number=m[1], names=m[2]), message)
    message = re.sub(r"\bcell (\d+)\b", lambda m: _("cell {number}", lang).format(number=m[1]), message)
    message = re.sub(r" of ([\d.]+) s\b|\(([\d.]+) s\)", lambda m: _("({seconds} s)", lang).format(seconds=m[1] or m[2]), message)
    return _SPACE_BY_PUNCT.sub("", message)
