"""Course tooling: release exercises, validate a student's notebook, grade a class.

This package imports the model code; the model code never imports it.
"""

__all__ = ["self_check"]


def __getattr__(name: str):
    """``from tinytf.course import self_check`` — the two-line last cell of every exercise — without
    importing the course tools up front."""
    if name == "self_check":
        from .check.selfcheck import self_check

        return self_check
    raise AttributeError(f"module 'tinytf.course' has no attribute {name!r}")
