"""What the ``tests/test_checks_*.py`` files read off a diagnosis: the pitfalls it names and its titles."""

from __future__ import annotations

from tinytf.checks import Finding


def pitfalls(findings: list[Finding]) -> set[int]:
    """The pitfalls named by ``findings``."""
    return {f.pitfall for f in findings}


def titles(findings: list[Finding]) -> str:
    """The titles of ``findings``, joined with `` | ``."""
    return " | ".join(f.title for f in findings)
