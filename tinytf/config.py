"""``ModelConfig``: every architectural choice of a :class:`tinytf.TinyLanguageModel` in one object.

The sizes (vocab, dim, heads, layers, max_tokens, expansion) *and* the choices that do not change any
parameter shape (norm placement, dropout, attention backend, biases). The weights alone cannot tell a
post-norm model from a pre-norm one, so a checkpoint must carry the whole config next to them.

Adding a field: give it a default here (a dict from an older checkpoint then loads with it), check it
in ``__post_init__`` and pass it on where the model is built. ``to_dict``/``from_dict`` and the
checkpoint comparison pick it up by themselves.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from .block import _check_norm
from .grouped import check_kv_heads
from .heads import _check_backend, _check_heads
from .masks import check_window

__all__ = ["ModelConfig"]

_SIZES = {
    "vocab": "the number of token ids",
    "layers": "the number of Transformer blocks",
    "max_tokens": "the number of rows of the position table",
    "expansion": "the FFN hidden width is expansion * dim",
}


def _integer(name: str, value: Any) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise ValueError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    return operator.index(value)


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
    ``window``: sliding-window attention over the last ``window`` tokens (None = full causal attention).
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

    def __post_init__(self) -> None:
        for name in ("vocab", "dim", "heads", "layers", "max_tokens", "expansion"):
            object.__setattr__(self, name, _integer(name, getattr(self, name)))  # numpy/torch ints -> int
        for name, what in _SIZES.items():
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer ({what}), got {getattr(self, name)}")
        _check_heads(self.dim, self.heads)
        _check_norm(self.norm)
        _check_backend(self.backend)
        p = self.dropout
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
            raise ValueError(
                f"dropout must be a probability in [0, 1), got {p!r}: it is the chance of zeroing an activation "
                "while training (0.0 switches dropout off)."
            )
        object.__setattr__(self, "dropout", float(p))
        if not isinstance(self.bias, bool):
            raise ValueError(f"bias must be True or False, got {self.bias!r} ({type(self.bias).__name__})")
        kv = check_kv_heads(self.heads, None if self.kv_heads is None else _integer("kv_heads", self.kv_heads))
        object.__setattr__(self, "kv_heads", None if kv == self.heads else kv)  # canonical: MHA is None
        if self.window is not None:
            object.__setattr__(self, "window", check_window(self.window))

    @property
    def n_kv_heads(self) -> int:
        """The number of K/V heads: ``kv_heads``, or ``heads`` when it is None (multi-head attention)."""
        return self.heads if self.kv_heads is None else self.kv_heads

    def to_dict(self) -> dict[str, Any]:
        """Plain ``{field: value}`` (ints, a float, strings, a bool, None): safe for JSON and ``weights_only``."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelConfig:
        """The inverse of :meth:`to_dict`. Missing fields take their defaults (so a dict saved before a
        field existed still loads); an unknown key is a ``ValueError`` naming it."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a model config must be a dict of {{field: value}}, got {type(data).__name__}")
        known = [f.name for f in fields(cls)]
        unknown = [k for k in data if k not in known]
        if unknown:
            raise ValueError(
                f"unknown ModelConfig field(s) {unknown}; the known fields are {known}. "
                "Fix the spelling, or upgrade tinytf if the config was written by a newer version."
            )
        return cls(**data)
