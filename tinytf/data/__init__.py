"""Small text corpora that ship with tinytf, so character-level exercises need no download.

``load_corpus()`` returns the text of ``tinytf/data/workshop_notes.py`` (about 7 KB of plain ASCII
English written for this workbook: notes on attention, caches and training, repetitive enough for a
character-level model to learn in seconds on a CPU).
"""

from __future__ import annotations

__all__ = ["CORPORA", "load_corpus"]

CORPORA = ("workshop_notes",)


def load_corpus(name: str = "workshop_notes") -> str:
    """The text of a shipped corpus (a ``str``); ``name`` is one of :data:`CORPORA`."""
    if name not in CORPORA:
        raise ValueError(f"unknown corpus {name!r}: choose one of {CORPORA}")
    from .workshop_notes import TEXT

    return TEXT
