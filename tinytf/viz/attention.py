"""The attention explorer: a sentence, a seeded multi-head attention, and its weight heatmap.

Pure part (testable without a browser):

* :func:`explorer_weights` (in :mod:`tinytf.viz.attention_weights`, re-exported here) turns the
  options into tokens, weights ``[H, T, T]`` and the allowed mask ``[T, T]``;
* :func:`attention_figure` draws one head's weights as a matplotlib Figure — token labels on both
  axes, blocked cells grey and hatched.

Front end: :func:`attention_explorer` wires ipywidgets controls to :func:`attention_figure` through
:func:`tinytf.viz.interactive_figure` (live in JupyterLab, the static figure when headless).

Everything is deterministic: each token's embedding is drawn from a generator seeded by the token's
text (the same word always gets the same vector), positions and the attention weights come from
``seed``, so the same options always give the same picture.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..translation import N_
from ..translation import gettext as _
from ._front import interactive_figure, recall, remember
from .attention_weights import DIM, MASKS, PAD, SCALINGS, TOKENIZERS, explorer_weights, tokenize
from .cells import CellLabels
from .fonts import displayable, use_cjk_font

__all__ = [
    "attention_figure",
    "update_attention_figure",
    "attention_explorer",
    "explorer_weights",
    "tokenize",
    "MASKS",
    "SCALINGS",
    "TOKENIZERS",
    "PAD",
]

# the options as the controls show them (values stay the names in attention_weights)
_OPTION_LABELS = {"none": N_("none"), "causal": N_("causal"), "padding": N_("padding"), "both": N_("both"),
                  "temperature": N_("temperature"), "auto": N_("auto"), "words": N_("words"), "chars": N_("chars")}


def _labelled(options: tuple[str, ...]) -> list[tuple[str, str]]:
    """``[(label, value), ...]`` for a Dropdown: each option in the student's language, its value unchanged."""
    return [(_(_OPTION_LABELS[o]) if o in _OPTION_LABELS else o, o) for o in options]


@dataclass
class _Heatmap:
    """The artists :func:`update_attention_figure` changes, and the structure they were built for."""

    key: tuple  # (tokens, annotate, lang) — see _structure
    image: Any
    title: Any
    cells: CellLabels | None  # the numbers in the cells (annotate) or None
    hatches: list = field(default_factory=list)

    def artists(self) -> list:
        """What an update changes, in drawing order (spines over the image, as in a full draw)."""
        ax = self.image.axes
        cells = [self.cells] if self.cells is not None else []
        return [self.image, *self.hatches, *ax.spines.values(), *cells, self.title]


def _heatmap_data(head: int, heads: int, annotate: bool | None, options: dict[str, Any]) -> dict[str, Any]:
    """Everything the heatmap shows, computed (and validated) before any artist is touched."""
    if not 0 <= head < heads:
        raise ValueError(_("head must lie in [0, {value}] for heads={heads}, got {head}").format(value=heads - 1, heads=heads, head=head))
    tokens, weights, allowed, scale = explorer_weights(heads=heads, **options)
    t, scaling, temperature = len(tokens), options["scaling"], options["temperature"]
    # a Chinese font when the tokens or the labels (one of them stands for all: same language) need one;
    # without one, the tokens as code points and the labels in English
    cjk_ok = use_cjk_font([*tokens, _("key (attended to)")])
    lang = None if cjk_ok else "en"
    scale_txt = {"1/sqrt(d)": f"1/sqrt({DIM // heads})", "none": "1"}.get(scaling, f"1/({temperature:g}·sqrt({DIM // heads}))")
    return {
        "tokens": tuple(tokens),
        "labels": tuple(displayable(w, cjk_ok) for w in tokens),
        "lang": lang,  # the labels' language: None is the notebook's
        "w": weights[head].numpy(),  # [T, T]
        "blocked": ~allowed.numpy(),  # [T, T]
        "annotate": t <= 12 if annotate is None else annotate,
        "title": _("head {head} of {heads} · mask: {mask} · scale {scale_txt} = {scale:.3f}", lang).format(head=head,
            heads=heads, mask=_(_OPTION_LABELS.get(options["mask"], options["mask"]), lang), scale_txt=scale_txt, scale=scale),
    }


def _structure(data: dict[str, Any]) -> tuple:
    """What a figure's artists were built for: another value needs another figure."""
    return data["tokens"], data["annotate"], data["lang"]


def _heatmap_layout(data: dict[str, Any]) -> tuple[Any, _Heatmap]:
    """The figure for ``data``'s tokens: axes, tick labels, colour bar, an empty image and title."""
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.patches import Rectangle

    tokens, annotate = data["tokens"], data["annotate"]
    t = len(tokens)
    size = 2.2 + 0.42 * t
    fig, ax = plt.subplots(figsize=(size + 1.2, size))
    cmap = plt.get_cmap("viridis").with_extremes(bad="#d9d9d9")  # masked cells: light grey (and hatched)
    im = ax.imshow(np.zeros((t, t)), cmap=cmap, vmin=0.0, vmax=1.0)
    hatches = [Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", edgecolor="#8c8c8c", lw=0, visible=False)
               for i in range(t) for j in range(t)]  # one per cell, shown where the mask blocks it
    for patch in hatches:
        ax.add_artist(patch)  # add_artist, not add_patch: the image already fixed the limits
    cells = CellLabels(ax, (t, t), fontsize=7) if annotate else None  # over the hatches, as ax.text was
    labels, lang = data["labels"], data["lang"]
    ax.set_xticks(range(t), labels, rotation=60, ha="right")
    ax.set_yticks(range(t), labels)
    ax.set_xlabel(_("key (attended to)", lang))
    ax.set_ylabel(_("query (attending)", lang))
    title = ax.set_title("", fontsize=9, y=1.0)  # y given: no per-draw title placement
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label=_("weight (each row sums to 1)", lang))
    return fig, _Heatmap(_structure(data), im, title, cells, hatches)


def _heatmap_fill(parts: _Heatmap, data: dict[str, Any]) -> None:
    """Put ``data``'s weights, blocked cells, numbers and title into the artists."""
    import numpy as np

    w, blocked = data["w"], data["blocked"]
    parts.image.set_data(np.ma.masked_array(w, mask=blocked))
    for patch, hide in zip(parts.hatches, blocked.ravel()):
        patch.set_visible(bool(hide))  # blocked reads as "blocked", not "0"
    if parts.cells is not None:  # blocked cells get no number
        parts.cells.set_cells(["" if b else f"{x:.2f}" for x, b in zip(w.ravel().tolist(), blocked.ravel().tolist())],
                              ["black" if x > 0.55 else "white" for x in w.ravel().tolist()])
    parts.title.set_text(data["title"])


def attention_figure(
    sentence: str = "the cat sat on the mat",
    *,
    tokenizer: str = "auto",
    heads: int = 2,
    head: int = 0,
    mask: str = "causal",
    scaling: str = "1/sqrt(d)",
    temperature: float = 1.0,
    pad_to: int | None = None,
    pad_side: str = "right",
    seed: int = 0,
    annotate: bool | None = None,
) -> Any:
    """One head's attention weights as a heatmap (a matplotlib Figure; nothing is shown).

    Rows are queries, columns are keys, both labelled with the tokens. Cells the mask blocks are
    drawn grey and hatched (their weight is exactly 0); allowed cells use a colour scale from 0 to 1.
    ``annotate`` writes each weight into its cell (default: when there are at most 12 tokens).
    See :func:`explorer_weights` for the other options; :func:`update_attention_figure` redraws it.
    """
    options = dict(sentence=sentence, tokenizer=tokenizer, mask=mask, scaling=scaling, temperature=temperature,
                   pad_to=pad_to, pad_side=pad_side, seed=seed)
    data = _heatmap_data(head, heads, annotate, options)
    fig, parts = _heatmap_layout(data)
    _heatmap_fill(parts, data)
    fig.tight_layout()
    return remember(fig, parts)


def update_attention_figure(fig: Any, sentence: str = "the cat sat on the mat", *, heads: int = 2, head: int = 0,
                            annotate: bool | None = None, **options: Any) -> bool:
    """Redraw an :func:`attention_figure` in place for new options (same keywords).

    Returns False, leaving ``fig`` as it was, when the tokens (their number or text) changed, or
    ``fig`` was not built by :func:`attention_figure`: then build a new one. Raises ``ValueError``
    like :func:`attention_figure`, before touching ``fig``.
    """
    parts = recall(fig)
    options = {"tokenizer": "auto", "mask": "causal", "scaling": "1/sqrt(d)", "temperature": 1.0, "pad_to": None,
               "pad_side": "right", "seed": 0} | options | {"sentence": sentence}
    data = _heatmap_data(head, heads, annotate, options)
    if not isinstance(parts, _Heatmap) or parts.key != _structure(data):
        return False
    _heatmap_fill(parts, data)
    return True


def attention_explorer(
    sentence: str = "the cat sat on the mat",
    *,
    tokenizer: str = "auto",
    heads: int = 2,
    head: int = 0,
    mask: str = "causal",
    scaling: str = "1/sqrt(d)",
    temperature: float = 1.0,
    seed: int = 0,
) -> Any:
    """Interactive :func:`attention_figure`: sentence, tokeniser, heads, head, mask, scaling, temperature.

    In JupyterLab this shows live controls and returns the ipywidgets container; when headless
    (``TINYTF_HEADLESS=1``, papermill, nbval, CI) it shows the static figure and returns it.
    """
    import ipywidgets as widgets

    divisors = [h for h in range(1, DIM + 1) if DIM % h == 0 and h <= 8]
    if heads not in divisors:
        raise ValueError(_("heads must be one of {divisors} (the explorer's model has dim {DIM}), got {heads}").format(divisors=divisors,
            DIM=DIM, heads=heads))
    style = {"description_width": "initial"}
    controls = {
        "sentence": widgets.Text(value=sentence, description=_("sentence"), continuous_update=False,
                                 layout=widgets.Layout(width="340px")),
        "tokenizer": widgets.Dropdown(options=_labelled(TOKENIZERS), value=tokenizer, description=_("tokens"),
                                      layout=widgets.Layout(width="180px")),
        "mask": widgets.Dropdown(options=_labelled(MASKS), value=mask, description=_("mask"), layout=widgets.Layout(width="180px")),
        "scaling": widgets.Dropdown(options=_labelled(SCALINGS), value=scaling, description=_("scaling"),
                                    layout=widgets.Layout(width="210px")),
        "temperature": widgets.FloatLogSlider(value=temperature, base=10, min=-1, max=1, step=0.05, description=_("temperature"),
                                              continuous_update=False, style=style),
        "heads": widgets.Dropdown(options=divisors, value=heads, description=_("heads"), layout=widgets.Layout(width="150px")),
        "head": widgets.IntSlider(value=head, min=0, max=heads - 1, description=_("head"), continuous_update=False),
    }

    def sync_head(change: dict) -> None:  # keep head < heads; runs before the redraw observer
        controls["head"].max = change["new"] - 1

    controls["heads"].observe(sync_head, names="value")
    return interactive_figure(attention_figure, controls, fixed={"seed": seed}, update_fn=update_attention_figure)
