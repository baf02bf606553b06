"""An Agg canvas that renders each glyph once: the same pixels, without re-rasterising every text at every redraw.

matplotlib (3.11) draws a text glyph by glyph: FreeType rasterises each glyph at its sub-pixel
position (a 26.6 fixed-point offset) and Agg blends the bitmap in. A live widget redraws the same
tick labels, legend entries and titles at every control change, so most of that work repeats.
:class:`GlyphCacheCanvas` keeps each glyph's bitmap keyed by (font file, size, dpi, glyph, angle,
the fractional 1/64-pixel part of its position): FreeType renders a glyph shifted by whole pixels
as the same bitmap shifted, so pasting a cached bitmap at the integer part gives exactly the pixels
of a fresh rendering. The text layout (``font._layout``) is cached per (text, font properties, dpi).

Only the glyph rasterisation path of matplotlib's Agg renderer is replaced, and only where its
private hooks exist (``_draw_text_glyphs_and_boxes``, ``_render_glyph``); elsewhere, and for
mathtext boxes or non-antialiased text, the stock renderer draws.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg, get_hinting_flag

__all__ = ["GlyphCacheCanvas", "SUPPORTED"]

try:
    from matplotlib.ft2font import RenderMode
except ImportError:  # pragma: no cover - older matplotlib: no glyph-by-glyph path
    RenderMode = None
SUPPORTED = RenderMode is not None and hasattr(RendererAgg, "_draw_text_glyphs_and_boxes")

_GLYPHS: dict[tuple, tuple[np.ndarray, int, int]] = {}  # key -> (bitmap [h, w] uint8, left, top) at offset frac
_LAYOUTS: dict[tuple, tuple] = {}  # (text, font props, rc fonts, dpi) -> ((font, glyph, x, y), ...)
_METRICS: dict[tuple, tuple[float, float, float]] = {}  # (font props, rc fonts, dpi) -> line metrics
_MAX = 200_000  # entries: a bound on memory (a few hundred bytes each), cleared when reached


def _rc_fonts() -> tuple:
    import matplotlib

    rc = matplotlib.rcParams
    return tuple(tuple(rc[k]) for k in ("font.family", "font.sans-serif", "font.serif", "font.monospace"))


class _GlyphCacheRenderer(RendererAgg):
    """:class:`RendererAgg` with cached glyph bitmaps, text layouts and line metrics (see the module docstring)."""

    def _get_font_height_metrics(self, prop: Any) -> tuple[float, float, float]:
        """``(ascent, descent, line gap)`` in pixels exactly as ``Text._get_layout`` reads them from the font
        (its OS/2 table, else hhea), once per font, size and dpi: matplotlib reads the tables again at every
        layout of every text (a fifth of a redraw with the CJK font's large tables). ``Text`` asks its
        renderer through this hook first."""
        key = (hash(prop), _rc_fonts(), self.dpi)
        got = _METRICS.get(key)
        if got is None:
            got = _METRICS[key] = _font_height_metrics(prop, self.dpi)
        return got

    def draw_text(self, gc: Any, x: float, y: float, s: str, prop: Any, angle: float, ismath: Any = False,
                  mtext: Any = None) -> None:
        if ismath or not SUPPORTED:
            return super().draw_text(gc, x, y, s, prop, angle, ismath, mtext)
        features = mtext.get_fontfeatures() if mtext is not None else None
        language = mtext.get_language() if mtext is not None else None
        key = (s, hash(prop), _rc_fonts(), self.dpi, None if features is None else tuple(features), language)
        items = _LAYOUTS.get(key)
        if items is None:
            font = self._prepare_font(prop)
            items = tuple((it.ft_object, it.glyph_index, it.x, it.y)
                          for it in font._layout(s, flags=get_hinting_flag(), features=features, language=language))
            if len(_LAYOUTS) >= _MAX:
                _LAYOUTS.clear()
            _LAYOUTS[key] = items
        size = prop.get_size_in_points()
        self._draw_text_glyphs_and_boxes(gc, x, y, angle, [(f, size, g, 0, 1, dx, dy) for f, g, dx, dy in items], [])

    def _draw_text_glyphs_and_boxes(self, gc: Any, x: float, y: float, angle: float, glyphs: Any, boxes: Any) -> None:
        if boxes or not gc.get_antialiased():
            return super()._draw_text_glyphs_and_boxes(gc, x, y, angle, glyphs, boxes)
        cos, sin = math.cos(math.radians(angle)), math.sin(math.radians(angle))
        flags = get_hinting_flag()
        height = int(self.height)
        for font, size, glyph_index, slant, extend, dx, dy in glyphs:  # dy is upwards
            px = round(0x40 * (x + dx * cos - dy * sin))
            py = round(0x40 * (self.height - y + dx * sin + dy * cos))  # FreeType's y is upwards
            key = (font.fname, size, self.dpi, glyph_index, slant, extend, angle, px & 0x3F, py & 0x3F, flags)
            hit = _GLYPHS.get(key)
            if hit is None:
                font.set_size(size, self.dpi)
                matrix = (0x10000 * np.array([[cos, -sin], [sin, cos]]) @ [[extend, extend * slant], [0, 1]]).round().astype(int)
                font._set_transform(matrix, [px & 0x3F, py & 0x3F])  # the fractional part only
                bitmap = font._render_glyph(glyph_index, flags, RenderMode.NORMAL)
                if len(_GLYPHS) >= _MAX:
                    _GLYPHS.clear()
                hit = _GLYPHS[key] = (np.array(bitmap.buffer, dtype=np.uint8), bitmap.left, bitmap.top)
            buffer, left, top = hit
            # whole pixels of the position (>> 6 floors, as the fractional part & 0x3F is its complement)
            self._renderer.draw_text_image(buffer, left + (px >> 6), height - (top + (py >> 6)) + buffer.shape[0], 0, gc)


def _font_height_metrics(prop: Any, dpi: float) -> tuple[float, float, float]:
    """matplotlib 3.11's ``Text._get_layout`` computation of the line metrics of ``prop`` at ``dpi``
    (``(None, None, None)`` when the font has neither table: the caller then measures "lp")."""
    from matplotlib.font_manager import fontManager, get_font

    font = get_font(fontManager._find_fonts_by_props(prop))
    for name, gap, ascent, descent in (("OS/2", "sTypoLineGap", "sTypoAscender", "sTypoDescender"),
                                       ("hhea", "lineGap", "ascent", "descent")):
        table = font.get_sfnt_table(name)
        if table is None:
            continue
        scale = 1 / font.get_sfnt_table("head")["unitsPerEm"] * prop.get_size_in_points() * dpi / 72
        return table[ascent] * scale, -table[descent] * scale, table[gap] * scale
    return None, None, None  # type: ignore[return-value]


class GlyphCacheCanvas(FigureCanvasAgg):
    """A :class:`FigureCanvasAgg` whose renderer caches glyph bitmaps: ``GlyphCacheCanvas(fig)`` adopts ``fig``."""

    def get_renderer(self) -> Any:
        w, h = self.get_width_height(physical=True)
        key = w, h, self.figure.dpi
        if getattr(self, "_lastKey", None) != key or not isinstance(getattr(self, "renderer", None), _GlyphCacheRenderer):
            self.renderer = _GlyphCacheRenderer(w, h, self.figure.dpi)
            self._lastKey = key
        return self.renderer
