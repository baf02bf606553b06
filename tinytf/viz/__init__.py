"""Figures and widgets. Pure figure functions return a matplotlib Figure; each widget wraps one
with ipywidgets controls and falls back to the static figure in headless runs."""

from __future__ import annotations

from ._front import interactive_figure, is_headless
from .attention import attention_explorer, attention_figure
from .cache import cache_explorer, cache_figure
from .memory import memory_explorer, memory_figure

__all__ = ["interactive_figure", "is_headless", "attention_figure", "attention_explorer", "memory_figure", "memory_explorer",
           "cache_figure", "cache_explorer"]
