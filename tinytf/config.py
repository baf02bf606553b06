"""``ModelConfig``: every architectural choice of a :class:`tinytf.TinyLanguageModel` in one object.

The sizes (vocab, dim, heads, layers, max_tokens, expansion) *and* the choices that do not change any
parameter shape (norm placement, dropout, attention backend, biases). The weights alone cannot tell a
post-norm model from a pre-norm one, so a checkpoint must carry the whole config next to them.

Every architectural choice is validated here, once, by the ``check_*`` functions below (with the
allowed :data:`NORMS` and :data:`BACKENDS`); this module imports nothing of the model. The modules that
build a model take the config (``TransformerBlock(config)``, ``CausalSelfAttention(config)``); their
keyword constructors (``TransformerBlock(dim=64, heads=4)``) make a ``ModelConfig`` of those keywords,
so they validate the same way and say the same things.

Adding a field: give it a default here (a dict from an older checkpoint then loads with it), check it
in ``__post_init__`` and read it in the one module that uses it. ``to_dict``/``from_dict`` and the
checkpoint comparison pick it up by themselves.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from .translation import N_
from .translation import gettext as _

__all__ = [
    "ModelConfig", "NORMS", "BACKENDS", "check_heads", "check_norm", "check_backend", "check_dropout", "check_kv_heads",
    "check_window", "check_positions", "module_config", "POSITIONS", "ROPE_LAYOUTS", "ROPE_SCALINGS",
]

NORMS = ("pre", "post")  # where each block normalises: before attention/FFN (modern) or after the residual sum (2017)
BACKENDS = ("explicit", "sdpa", "tiled")  # tinytf's attention written out, PyTorch's fused kernel, the online softmax
# where a token is (chapter 13): a learned table (the seed's), a fixed sinusoidal table, rotary q/k (RoPE), a linear bias
# on the scores (ALiBi), or nothing at all
POSITIONS = ("learned", "sinusoidal", "rope", "alibi", "none")
ROPE_LAYOUTS = ("half", "interleaved")  # pairs (i, i + r/2) as GPT-NeoX and Llama; pairs (2i, 2i + 1) as RoFormer and GPT-J
ROPE_SCALINGS = ("linear", "ntk", "yarn")  # position interpolation, NTK-aware base, YaRN's NTK-by-parts (+ its temperature)

_SIZES = {
    "vocab": N_("the number of token ids"),
    "layers": N_("the number of Transformer blocks"),
    "max_tokens": N_("the longest sequence trained on: the number of rows of a learned position table"),
    "expansion": N_("the FFN hidden width is expansion * dim"),
}


def _integer(name: str, value: Any) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise ValueError(_("{name} must be an integer, got {value!r} ({type})").format(name=name, value=value, type=type(value).__name__))
    return operator.index(value)


def check_heads(dim: int, heads: int) -> None:
    """``ValueError`` unless ``heads`` divides ``dim`` (each head gets ``d_head = dim / heads`` channels)."""
    if heads < 1 or dim < 1:
        raise ValueError(_("dim and heads must be positive, got dim={dim}, heads={heads}").format(dim=dim, heads=heads))
    if dim % heads != 0:
        near = [h for h in range(1, dim + 1) if dim % h == 0 and abs(h - heads) <= max(2, heads)]
        raise ValueError(
            _("dim={dim} is not divisible by heads={heads}: each head needs d_head = dim / heads channels. Choose heads among the "
              "divisors of {dim} (e.g. {near}) or change dim.").format(dim=dim, heads=heads, near=near)
        )


def check_norm(norm: str) -> str:
    """``norm`` if it is one of :data:`NORMS` (``"pre"``, ``"post"``), else a ``ValueError``."""
    if norm not in NORMS:
        raise ValueError(_("norm must be 'pre' or 'post', got {norm!r}").format(norm=norm))
    return norm


def check_backend(backend: str) -> str:
    """``backend`` if it is one of :data:`BACKENDS`, else a ``ValueError``."""
    if backend not in BACKENDS:
        raise ValueError(_("backend must be one of {backends}, got {backend!r}").format(backends=BACKENDS, backend=backend))
    return backend


def check_dropout(p: float) -> float:
    """``p`` as a float if it is a probability in ``[0, 1)``, else a ``ValueError``."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
        raise ValueError(
            _("dropout must be a probability in [0, 1), got {p!r}: it is the chance of zeroing an activation while training (0.0 "
              "switches dropout off).").format(p=p)
        )
    return float(p)


def check_kv_heads(heads: int, kv_heads: int | None) -> int:
    """The number of K/V heads: ``heads`` when ``kv_heads`` is None; a ``ValueError`` unless it divides ``heads``."""
    if kv_heads is None:
        return heads
    divisors = [g for g in range(1, heads + 1) if heads % g == 0]
    if isinstance(kv_heads, bool) or not isinstance(kv_heads, int) or kv_heads < 1 or heads % kv_heads != 0:
        raise ValueError(
            _("kv_heads={kv_heads!r} does not divide heads={heads}: every K/V head is shared by the same number (heads / kv_heads) of "
              "query heads. Choose kv_heads among {divisors} ({heads} = multi-head, 1 = multi-query), or None for multi-head attention.")
                  .format(kv_heads=kv_heads, heads=heads, divisors=divisors)
        )
    return kv_heads


def check_window(window: int) -> int:
    """``window`` as an int; ``ValueError`` unless it is a positive integer (the query itself counts)."""
    if isinstance(window, bool) or not hasattr(window, "__index__") or int(window) < 1:
        raise ValueError(
            _("window must be a positive integer (each query sees the last `window` keys, itself included), got window={window!r}. "
              "window=1 lets a token see only itself; None switches the window off.").format(window=window)
        )
    return int(window)


def _rope_fields(c: ModelConfig) -> dict[str, Any]:
    """The RoPE fields of ``c`` that differ from their defaults."""
    defaults = {"rope_base": 10000.0, "rotary_dim": None, "rope_layout": "half", "rope_scaling": None, "rope_factor": 1.0}
    return {k: getattr(c, k) for k, v in defaults.items() if getattr(c, k) != v}


def check_positions(c: ModelConfig) -> None:
    """``ValueError`` naming the fix unless the position choice of ``c`` and its RoPE fields fit together:
    ``positions`` one of :data:`POSITIONS`; for ``"rope"`` an even ``rotary_dim <= d_head``, ``rope_base > 1``, a layout of
    :data:`ROPE_LAYOUTS`, a scaling of :data:`ROPE_SCALINGS` (or None) with ``rope_factor >= 1``; RoPE fields only with
    ``"rope"``; ``"alibi"`` not with the tiled backend (its bias is a [H, Tq, Tk] tensor the tiles never form)."""
    if c.positions not in POSITIONS:
        raise ValueError(_("positions must be one of {choices}, got {positions!r}").format(choices=POSITIONS, positions=c.positions))
    if c.positions != "rope":
        extra = _rope_fields(c)
        if extra:
            raise ValueError(_("{extra} configure rotary positions, but positions={positions!r}. Set positions='rope', or leave those "
                               "fields at their defaults.").format(extra=extra, positions=c.positions))
        if c.positions == "alibi" and c.backend == "tiled":
            raise ValueError(_("positions='alibi' adds a bias [H, Tq, Tk] to the scores, which backend='tiled' never forms. Use "
                               "backend='explicit' or 'sdpa' with ALiBi."))
        return
    r = c.head_dim if c.rotary_dim is None else c.rotary_dim
    if r < 2 or r > c.head_dim or r % 2:
        raise ValueError(_("RoPE rotates pairs of channels: rotary_dim must be even and at most d_head = dim / heads = {head_dim}, "
                           "got rotary_dim={r} (dim={dim}, heads={heads}). Choose an even rotary_dim <= {head_dim}, or None for all "
                           "of d_head{even}.").format(head_dim=c.head_dim, r=r, dim=c.dim, heads=c.heads,
                                                      even=_(" (d_head itself is odd: change dim or heads)") if c.head_dim % 2 else ""))
    if not c.rope_base > 1.0:
        raise ValueError(_("rope_base must be > 1 (the angle of pair i is position / rope_base^(2i / rotary_dim)), got {base!r}. "
                           "10000 is RoFormer's and Llama 2's value, 500000 Llama 3's.").format(base=c.rope_base))
    if c.rope_layout not in ROPE_LAYOUTS:
        raise ValueError(_("rope_layout must be 'half' (pairs i, i + r/2: GPT-NeoX, Llama) or 'interleaved' (pairs 2i, 2i + 1: "
                           "RoFormer, GPT-J), got {layout!r}").format(layout=c.rope_layout))
    if c.rope_scaling is not None and c.rope_scaling not in ROPE_SCALINGS:
        raise ValueError(_("rope_scaling must be None or one of {choices}, got {scaling!r}").format(choices=ROPE_SCALINGS,
                                                                                                  scaling=c.rope_scaling))
    if not c.rope_factor >= 1.0 or (c.rope_factor != 1.0 and c.rope_scaling is None):
        raise ValueError(_("rope_factor={factor!r} stretches the trained length max_tokens by that factor: it must be >= 1 and "
                           "comes with a rope_scaling ({choices}).").format(factor=c.rope_factor, choices=ROPE_SCALINGS))


@dataclass(frozen=True)
class ModelConfig:
    """The architecture of a :class:`tinytf.TinyLanguageModel` (used by :mod:`tinytf.memory` too).

    ``norm``: ``"pre"`` or ``"post"`` (see :class:`tinytf.TransformerBlock`); ``dropout``: probability
    in ``[0, 1)`` on attention weights and residual branches; ``backend``: ``"explicit"``, ``"sdpa"`` or
    ``"tiled"`` (which trains only with ``dropout=0``);
    ``bias``: whether the Linear layers of attention and FFN have bias vectors;
    ``kv_heads``: K/V heads, a divisor of ``heads`` (1 = multi-query; None = ``heads``, multi-head
    attention — a value equal to ``heads`` is stored as None, so the two configs are equal and a
    checkpoint saved before the field existed loads as what it was); :attr:`n_kv_heads` is the number;
    ``window``: sliding-window attention over the last ``window`` tokens (None = full causal attention);
    ``positions``: where a token is — ``"learned"`` (a table of ``max_tokens`` rows, the default), ``"sinusoidal"``
    (a fixed table), ``"rope"`` (q and k rotated, :mod:`tinytf.rope`), ``"alibi"`` (a linear bias, :mod:`tinytf.alibi`) or
    ``"none"``. Only ``"learned"`` limits a sequence to ``max_tokens``; for the others it is the length trained on.
    RoPE's own fields: ``rope_base``, ``rotary_dim`` (None = ``d_head``), ``rope_layout`` (``"half"`` or ``"interleaved"``),
    ``rope_scaling`` (None, ``"linear"``, ``"ntk"``, ``"yarn"``) and ``rope_factor`` (the length multiple it stretches to).
    """

    vocab: int = 100
    dim: int = 32
    heads: int = 4
    layers: int = 2
    max_tokens: int = 64
    expansion: int = 4
    norm: str = "pre"
    dropout: float = 0.0
    backend: str = "explicit"
    bias: bool = True
    kv_heads: int | None = None
    window: int | None = None
    positions: str = "learned"
    rope_base: float = 10000.0
    rotary_dim: int | None = None
    rope_layout: str = "half"
    rope_scaling: str | None = None
    rope_factor: float = 1.0

    def __post_init__(self) -> None:
        for name in ("vocab", "dim", "heads", "layers", "max_tokens", "expansion"):
            object.__setattr__(self, name, _integer(name, getattr(self, name)))  # numpy/torch ints -> int
        for name, what in _SIZES.items():
            if getattr(self, name) < 1:
                raise ValueError(_("{name} must be a positive integer ({what}), got {value}").format(name=name, what=_(what),
                    value=getattr(self, name)))
        check_heads(self.dim, self.heads)
        check_norm(self.norm)
        check_backend(self.backend)
        object.__setattr__(self, "dropout", check_dropout(self.dropout))
        if not isinstance(self.bias, bool):
            raise ValueError(_("bias must be True or False, got {bias!r} ({type})").format(bias=self.bias, type=type(self.bias).__name__))
        kv = check_kv_heads(self.heads, None if self.kv_heads is None else _integer("kv_heads", self.kv_heads))
        object.__setattr__(self, "kv_heads", None if kv == self.heads else kv)  # canonical: MHA is None
        if self.window is not None:
            object.__setattr__(self, "window", check_window(self.window))
        for name in ("rope_base", "rope_factor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(_("{name} must be a number, got {value!r}").format(name=name, value=value))
            object.__setattr__(self, name, float(value))
        if self.rotary_dim is not None:
            object.__setattr__(self, "rotary_dim", _integer("rotary_dim", self.rotary_dim))
        check_positions(self)

    @property
    def n_kv_heads(self) -> int:
        """The number of K/V heads: ``kv_heads``, or ``heads`` when it is None (multi-head attention)."""
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def head_dim(self) -> int:
        """The width of one head: ``d_head = dim // heads``."""
        return self.dim // self.heads

    @property
    def rotary_width(self) -> int:
        """The channels RoPE rotates per head: ``rotary_dim``, or ``d_head`` when it is None."""
        return self.head_dim if self.rotary_dim is None else self.rotary_dim

    def to_dict(self) -> dict[str, Any]:
        """Plain ``{field: value}`` (ints, a float, strings, a bool, None): safe for JSON and ``weights_only``."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelConfig:
        """The inverse of :meth:`to_dict`. Missing fields take their defaults (so a dict saved before a
        field existed still loads); an unknown key is a ``ValueError`` naming it."""
        if not isinstance(data, Mapping):
            raise ValueError(_("a model config must be a dict of {{field: value}}, got {type}").format(type=type(data).__name__))
        known = [f.name for f in fields(cls)]
        unknown = [k for k in data if k not in known]
        if unknown:
            raise ValueError(
                _("unknown ModelConfig field(s) {unknown}; the known fields are {known}. Fix the spelling, or upgrade tinytf if the "
                  "config was written by a newer version.").format(unknown=unknown, known=known)
            )
        return cls(**data)


def module_config(init: Callable[..., None], first: ModelConfig | int, given: Mapping[str, Any]) -> ModelConfig:
    """The config a module is built from: ``TransformerBlock(config)`` or ``TransformerBlock(dim=64, heads=4, ...)``.

    ``first`` is the constructor's first argument, ``given`` the others by name. A :class:`ModelConfig` is
    used as it is (already validated), and then every other argument must keep the default of ``init``'s
    signature; an ``int`` is the ``dim`` of a new ``ModelConfig(dim=first, **given)``, validated here."""
    if not isinstance(first, ModelConfig):
        return ModelConfig(dim=first, **given)
    params = inspect.signature(init).parameters
    extra = {name: value for name, value in given.items() if value is not params[name].default and value != params[name].default}
    if extra:
        owner = init.__qualname__.removesuffix(".__init__")
        raise ValueError(
            _("{owner}(config, ...) takes every size and choice from the config, but also got {extra}. Put them in the config instead: "
              "{owner}(dataclasses.replace(config, {settings})).")
                  .format(owner=owner, extra=extra, settings=', '.join(f'{k}={v!r}' for k, v in extra.items()))
        )
    return first
