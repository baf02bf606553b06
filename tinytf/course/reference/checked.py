"""``judged_record``: a hidden test's last line, so that the hidden test and the grader's judge agree.

``judged_record(grade_id, value, **inputs)`` runs the judge of ``grade_id`` on the value (as the
grader will see it, on the CPU) and raises ``AssertionError`` with the judge's message when it
rejects; otherwise it records like :func:`tinytf.course.record.record`. A wrong answer then fails its
own test cell with the same message (status ``failed``); only a notebook that fools its kernel
(patched checks) passes there and fails the clean-process judge (``tampered``).
"""

from __future__ import annotations

from typing import Any

from ..record import record, to_plain

__all__ = ["judged_record"]


def judged_record(grade_id: str, value: Any, **inputs: Any) -> None:
    """Assert that the judge of ``grade_id`` accepts ``value`` for ``inputs``, then ``record`` them."""
    from ..judges import run_judge

    passed, message = run_judge(grade_id, to_plain(value), to_plain(inputs))
    assert passed, message
    record(grade_id, value, **inputs)
