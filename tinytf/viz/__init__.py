"""Figures and widgets. Pure figure functions return a matplotlib Figure; each widget wraps one
with ipywidgets controls and falls back to the static figure in headless runs; ``update_*_figure``
redraws a figure in place for new values (what the live widgets do on a control change)."""

from __future__ import annotations

from ._front import interactive_figure, is_headless, png_bytes
from .attention import attention_explorer, attention_figure, update_attention_figure
from .cache import cache_explorer, cache_figure, update_cache_figure
from .memory import memory_explorer, memory_figure, update_memory_figure
from .positions import rope_decay_explorer, rope_decay_figure
from .precision import finite_explorer, finite_figure, update_finite_figure
from .tiled import online_softmax_figure, online_softmax_stepper, update_online_softmax_figure

__all__ = ["interactive_figure", "is_headless", "png_bytes", "attention_figure", "attention_explorer", "memory_figure", "memory_explorer",
           "cache_figure", "cache_explorer", "update_attention_figure", "update_cache_figure", "update_memory_figure",
           "online_softmax_figure", "online_softmax_stepper", "update_online_softmax_figure", "finite_figure", "finite_explorer",
           "update_finite_figure", "rope_decay_figure", "rope_decay_explorer"]
