"""Shared widget front end: a live ipywidgets UI in JupyterLab, a static figure when headless.

Every widget in the workbook is a *pure* figure function ``fn(**values) -> matplotlib Figure``
(testable without a browser) plus controls. :func:`interactive_figure` wires them together.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["is_headless", "interactive_figure", "HEADLESS_ENV"]

HEADLESS_ENV = "TINYTF_HEADLESS"


def is_headless() -> bool:
    """True when no live widget front end will render: ``TINYTF_HEADLESS=1`` (set by ``make test``,
    ``make run`` and CI for nbval/papermill) or no IPython kernel at all (a plain script)."""
    flag = os.environ.get(HEADLESS_ENV, "").strip().lower()
    if flag in ("1", "true", "yes", "on"):
        return True
    if flag in ("0", "false", "no", "off"):
        return False
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return True
    ip = get_ipython()
    return ip is None or not hasattr(ip, "kernel")


def _show(fig: Any) -> None:
    from IPython.display import display

    display(fig)
    import matplotlib.pyplot as plt

    plt.close(fig)


def interactive_figure(
    figure_fn: Callable[..., Any],
    controls: Mapping[str, Any],
    *,
    fixed: Mapping[str, Any] | None = None,
    layout: Callable[[list[Any]], Any] | None = None,
) -> Any:
    """Show ``figure_fn(**control values, **fixed)`` with live controls, or statically when headless.

    ``controls`` maps keyword names to ipywidgets value widgets. Returns the ipywidgets container
    (live) or the rendered Figure (headless), so callers and tests can inspect it.
    """
    fixed = dict(fixed or {})

    def values() -> dict[str, Any]:
        return {name: w.value for name, w in controls.items()} | fixed

    if is_headless():
        fig = figure_fn(**values())
        _show(fig)
        return fig

    import ipywidgets as widgets

    out = widgets.Output()

    def redraw(_change: Any = None) -> None:
        with out:
            out.clear_output(wait=True)
            _show(figure_fn(**values()))

    for w in controls.values():
        w.observe(redraw, names="value")
    boxes = list(controls.values())
    panel = layout(boxes) if layout else widgets.HBox(boxes, layout=widgets.Layout(flex_flow="row wrap"))
    ui = widgets.VBox([panel, out])
    redraw()
    from IPython.display import display

    display(ui)
    return ui
