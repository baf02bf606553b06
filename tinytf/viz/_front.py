"""Shared widget front end: a live ipywidgets UI in JupyterLab, a static figure when headless.

Every widget in the workbook is a *pure* figure function ``fn(**values) -> matplotlib Figure``
(testable without a browser) plus controls. :func:`interactive_figure` wires them together.

A figure function may come with an *updater* ``update(fig, **values) -> bool`` that redraws an
existing figure in place (``set_data``, ``set_text``, ...) and returns False when the new values
need a different structure (say, another token count), in which case the figure is rebuilt. The
live widget keeps one figure, updates it on every control change and sends it to the browser as
one PNG, the value of an ``ipywidgets.Image`` (a single Agg draw, no ``bbox_inches="tight"`` second pass), so a slider stays responsive.
"""

from __future__ import annotations

import os
import struct
import weakref
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..language import notebook_language
from ..translation import N_
from ..translation import gettext as _

__all__ = ["is_headless", "interactive_figure", "HEADLESS_ENV", "figure_or_message", "message_figure", "render_png", "png_bytes",
           "choices", "remember", "recall", "LiveFigure", "STATIC_NOTE", "STATIC_NOTE_ZH", "log_axes", "keep_legend"]

HEADLESS_ENV = "TINYTF_HEADLESS"

_PARTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Figure -> its updatable artists


# printed above the static figure of a widget (papermill, nbval, CI, the book)
STATIC_NOTE = N_("A static figure: run this notebook in JupyterLab for the live controls.")
STATIC_NOTE_ZH = _(STATIC_NOTE, "zh")


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


def choices(default: Any, options: Sequence[Any]) -> list[Any]:
    """Dropdown options: ``options`` plus ``default`` (so any starting value is selectable), sorted."""
    return sorted(set(options) | {default})


def remember(fig: Any, parts: Any) -> Any:
    """Attach ``parts`` (the artists an updater changes, and the structure they were built for) to ``fig``."""
    _PARTS[fig] = parts
    return fig


def recall(fig: Any) -> Any:
    """The parts :func:`remember` attached to ``fig`` (None for a figure built elsewhere)."""
    return _PARTS.get(fig)


def log_axes(ax: Any, *, base_x: float = 2, base_y: float = 10) -> None:
    """Log–log axes with major ticks only: the unlabelled minor ticks cost a live redraw ~2 ms each."""
    from matplotlib.ticker import NullLocator

    ax.set_xscale("log", base=base_x)
    ax.set_yscale("log", base=base_y)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_minor_locator(NullLocator())


def keep_legend(ax: Any, handles: Sequence[Any] | None = None, **kwargs: Any) -> Any:
    """``ax.legend(handles=..., **kwargs)``, except that a legend already built for the same handles only
    gets their new labels (building one costs a live redraw ~25 ms). ``handles`` default: every labelled artist."""
    handles = tuple(ax.get_legend_handles_labels()[0] if handles is None else handles)
    legend = ax.get_legend()
    if legend is not None and getattr(legend, "_tinytf_handles", None) == handles:
        for text, h in zip(legend.get_texts(), handles):
            text.set_text(h.get_label())
        return legend
    legend = ax.legend(handles=list(handles), **kwargs)
    legend._tinytf_handles = handles
    return legend


def message_figure(err: Exception) -> Any:
    """A small figure stating why nothing could be drawn (the live UI shows it instead of raising)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 1.2))
    ax.axis("off")
    ax.text(0.0, 0.5, _("cannot draw: {error}").format(error=err), wrap=True, va="center", fontsize=9, color="#b00020")
    return fig


def figure_or_message(figure_fn: Callable[..., Any], **options: Any) -> Any:
    """``figure_fn(**options)``, or a :func:`message_figure` for a ``ValueError`` (say, an empty sentence)."""
    try:
        return figure_fn(**options)
    except ValueError as err:
        return message_figure(err)


def render_png(fig: Any) -> bytes:
    """``fig`` as PNG bytes at its own dpi: one Agg draw and a fast lossless PNG encoding (:func:`png_bytes`).

    The canvas renders each glyph once (:mod:`tinytf.viz.glyphs`: pixel for pixel what Agg draws).
    A figure whose remembered parts name the artists an update changes (``parts.artists()``) is
    blitted: the rest (axes, tick labels, colour bar) is drawn once and kept as a background, and
    each later call restores it and draws only those artists, in the order given.
    """
    from .glyphs import GlyphCacheCanvas  # matplotlib's Agg: kept out of `import tinytf`

    canvas = fig.canvas if isinstance(fig.canvas, GlyphCacheCanvas) else GlyphCacheCanvas(fig)  # the same pixels as Agg
    parts = recall(fig)
    if hasattr(parts, "artists"):
        _blit(fig, canvas, list(parts.artists()))
    else:
        canvas.draw()
    pixels = np.asarray(canvas.buffer_rgba())
    if fig.patch.get_visible() and fig.patch.get_facecolor()[3] == 1.0:
        pixels = pixels[..., :3]  # an opaque figure: the alpha channel is 255 everywhere, a quarter of the bytes
    return png_bytes(pixels)


def png_bytes(pixels: Any) -> bytes:
    """``pixels: [H, W, 3 or 4]`` uint8 (RGB or RGBA) as a PNG: every row with filter type 1 ("Sub": each
    byte minus the same channel one pixel to the left, so flat colour becomes runs of zeros), zlib level 1
    with the run-length strategy. Lossless (PIL decodes the same pixels: tests/test_viz_front.py) and
    about twice as fast as PIL's encoder at its fastest settings, whose adaptive filter choice per row
    costs more than the compression; the file is somewhat larger, which a kernel-to-browser message
    does not notice."""
    h, w, c = pixels.shape
    flat = np.ascontiguousarray(pixels, dtype=np.uint8).reshape(h, w * c)
    rows = np.empty((h, w * c + 1), np.uint8)
    rows[:, 0] = 1
    rows[:, 1 : c + 1] = flat[:, :c]
    np.subtract(flat[:, c:], flat[:, :-c], out=rows[:, c + 1 :])  # uint8: modulo 256, as PNG defines it
    z = zlib.compressobj(1, zlib.DEFLATED, 15, 9, zlib.Z_RLE)
    data = z.compress(rows.tobytes()) + z.flush()

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", w, h, 8, {3: 2, 4: 6}[c], 0, 0, 0)  # 8 bits, truecolour (+ alpha)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def _blit(fig: Any, canvas: Any, artists: list[Any]) -> None:
    """Restore ``fig``'s cached background (drawing it first if there is none for this size) and
    draw ``artists`` over it."""
    key = (canvas.get_width_height(physical=True), fig.dpi)
    cached = getattr(fig, "_tinytf_background", None)
    if cached is None or cached[0] != key:
        for a in artists:
            a.set_animated(True)  # left out of the full draw: the background
        try:
            canvas.draw()
            fig._tinytf_background = (key, canvas.copy_from_bbox(fig.bbox))
        finally:
            for a in artists:
                a.set_animated(False)
    else:
        canvas.restore_region(cached[1])
    for a in artists:
        fig.draw_artist(a)


def _show(fig: Any) -> None:
    from IPython.display import display

    display(fig)
    import matplotlib.pyplot as plt

    plt.close(fig)


class LiveFigure:
    """One figure kept across control changes: updated in place when ``update_fn`` can, rebuilt otherwise.

    ``redraw(**values)`` returns the current figure; ``rebuilt`` counts the figures built so far.
    """

    def __init__(self, figure_fn: Callable[..., Any], update_fn: Callable[..., bool] | None = None) -> None:
        self.figure_fn, self.update_fn = figure_fn, update_fn
        self.fig: Any = None
        self.rebuilt = 0
        self._message = False

    def redraw(self, **values: Any) -> Any:
        """Bring the figure up to date with ``values`` (a message figure for a ``ValueError``)."""
        import matplotlib.pyplot as plt

        try:
            if self.fig is not None and not self._message and self.update_fn is not None and self.update_fn(self.fig, **values):
                return self.fig
            fig, self._message = self.figure_fn(**values), False
        except ValueError as err:
            fig, self._message = message_figure(err), True
        plt.close(fig)  # kept out of pyplot: the inline backend must not show it again at the end of the cell
        if self.fig is not None:
            plt.close(self.fig)
        self.fig = fig
        self.rebuilt += 1
        return fig


def interactive_figure(
    figure_fn: Callable[..., Any],
    controls: Mapping[str, Any],
    *,
    fixed: Mapping[str, Any] | None = None,
    layout: Callable[[list[Any]], Any] | None = None,
    update_fn: Callable[..., bool] | None = None,
) -> Any:
    """Show ``figure_fn(**control values, **fixed)`` with live controls, or statically when headless.

    ``controls`` maps keyword names to ipywidgets value widgets; ``update_fn(fig, **values)``, when
    given, redraws the current figure in place (see the module docstring). Returns the ipywidgets
    container (live; ``.live`` is its :class:`LiveFigure`, ``.controls`` the controls, ``.image`` the Image widget
    showing the PNG) or the rendered Figure (headless), so callers and tests can inspect it. Nothing in the live
    path waits for, or expects an answer from, a front end: headless clients (papermill, nbclient) run it too.
    """
    fixed = dict(fixed or {})

    def values() -> dict[str, Any]:
        return {name: w.value for name, w in controls.items()} | fixed

    if is_headless():
        fig = figure_or_message(figure_fn, **values())
        print(_(STATIC_NOTE, notebook_language()))
        _show(fig)
        return fig

    import ipywidgets as widgets
    from IPython.display import display

    # the figure is the value of an Image widget, not a display() inside an Output widget: nbclient (papermill,
    # nbval's peers) mimics an Output widget's front end by sending a comm_msg on the shell socket while it
    # waits there for the cell's execute_reply, and under load that reply can go unseen and the run hangs
    # (jupyter/nbclient#312). An Image's new value is one comm_msg from the kernel that nothing answers.
    image = widgets.Image(format="png")
    live = LiveFigure(figure_fn, update_fn)

    def redraw(_change: Any = None) -> None:
        image.value = render_png(live.redraw(**values()))

    for w in controls.values():
        w.observe(redraw, names="value")
    boxes = list(controls.values())
    panel = layout(boxes) if layout else widgets.HBox(boxes, layout=widgets.Layout(flex_flow="row wrap"))
    ui = widgets.VBox([panel, image])
    ui.live, ui.controls, ui.image = live, dict(controls), image
    redraw()
    display(ui)
    return ui
