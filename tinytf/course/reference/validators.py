"""Validators shared by the judges of every exercise: one place for the student-facing messages.

A judge checks what a hidden test recorded (see :mod:`tinytf.course.reference.judging`); each helper here
``assert``s one property with a message a student can act on, and returns the value, converted
where that helps the next check (``tensor`` gives float32, ``number`` a ``float``)::

    out = tensor(value["out"], tuple(expected.shape), "attention_by_hand out")
    close(out, expected, "attention_by_hand out")

``shape_of`` describes a student's return value in a message (its shape, or its type).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import torch

from tinytf.checks.findings import difference_pattern, relation, shape_relation, tensor_relation

from ...translation import N_
from ...translation import gettext as _

__all__ = ["FLOATING", "tensor", "close", "float_inputs", "bool_mask", "number", "positive", "seconds", "has_keys", "shape_of", "differs",
           "should_be", "shapes", "how_off"]

FLOATING: Literal["floating"] = "floating"
"""``tensor(..., dtype=FLOATING)``: any floating-point dtype, every value finite (the default)."""


def tensor(value: Any, shape: Sequence[int] | None, what: str, *,
           dtype: torch.dtype | Literal["floating"] | None = FLOATING) -> torch.Tensor:
    """``value`` is a tensor of ``shape`` (``None``: any shape) and of ``dtype``.

    ``dtype=FLOATING`` (default): floating point with finite values, returned as float32;
    a ``torch.dtype``: exactly that dtype; ``None``: any dtype. Other values are returned unchanged.
    """
    assert isinstance(value, torch.Tensor), _("{what} must be a tensor, got {type}").format(what=what, type=type(value).__name__)
    if shape is not None:
        assert tuple(value.shape) == tuple(shape), _("{what} has shape {value_shape}, expected {shape}").format(what=what,
            value_shape=list(value.shape), shape=list(shape)) + _off(value.shape, shape)
    if isinstance(dtype, str):  # FLOATING
        assert value.is_floating_point(), _("{what} must be a floating-point tensor, got {value_dtype}").format(what=what,
            value_dtype=value.dtype)
        assert bool(torch.isfinite(value).all()), _("{what} contains inf or NaN").format(what=what)
        return value.float()
    if dtype is not None:
        assert value.dtype == dtype, _("{what} must have dtype {dtype}, got {value_dtype}").format(what=what, dtype=dtype,
            value_dtype=value.dtype)
    return value


def close(value: torch.Tensor, expected: torch.Tensor, what: str, *, given: str = "", atol: float = 1e-5, rtol: float = 1e-4,
          reference: str = N_("the reference"), suspects: dict[str, float] | None = None) -> None:
    """``value`` has the shape of ``expected`` and agrees with it (compared in float32): otherwise
    "``what`` differs from ``reference``: for ``given`` (the input shapes) it should be … starting […]; yours is …",
    and, when ``value`` is ``expected`` times a clean number, which (``suspects``: ``{meaning (translated): ratio}``);
    otherwise where the two differ (:func:`tinytf.checks.findings.difference_pattern`: "only dim 2 indices 0, 3 differ")."""
    assert tuple(value.shape) == tuple(expected.shape), _("{what} has shape {value_shape}, expected {expected_shape}").format(what=what,
        value_shape=list(value.shape), expected_shape=list(expected.shape)) + _off(value.shape, expected.shape)
    if not torch.allclose(value.float(), expected.float(), atol=atol, rtol=rtol):
        how = tensor_relation(value, expected, suspects=suspects) or difference_pattern(value, expected, spread=False)
        raise AssertionError(_("{what} differs from {reference}: {should_be}").format(what=what, reference=_(reference),
                             should_be=should_be(value, expected, given)) + (f" — {how}" if how else ""))


def _off(got: Sequence[int], want: Sequence[int]) -> str:
    how = shape_relation(list(got), list(want))
    return f" — {how}" if how else ""


def how_off(got: Any, want: float, *, suspects: dict[str, float] | None = None, step: tuple[str, float] | None = None) -> str:
    """For a message about a wrong number: " — exactly half the right value: dtype_bytes=4 looks ignored" when
    ``got`` is a clean ratio or one ``step`` off ``want`` (:func:`tinytf.checks.findings.relation`; ``suspects``' meanings
    and ``step``'s name translated by the caller), else ``""``."""
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        return ""
    how = relation(got, want, suspects=suspects, step=step)
    return f" — {how}" if how else ""


def float_inputs(*xs: Any, what: str = N_("the recorded inputs")) -> list[torch.Tensor]:
    """The recorded input tensors ``xs`` as float32 (a record a student tampered with is rejected)."""
    assert all(isinstance(x, torch.Tensor) and x.is_floating_point() for x in xs), _("{what} are not float tensors").format(what=_(what))
    return [x.float() for x in xs]


def bool_mask(mask: Any, what: str = N_("the recorded mask")) -> torch.Tensor:
    """The recorded ``mask`` is a bool tensor (True = may attend)."""
    assert isinstance(mask, torch.Tensor) and mask.dtype == torch.bool, _("{what} is not a bool tensor").format(what=_(what))
    return mask


def number(value: Any, what: str, *, positive: bool = False, unit: str = "") -> float:
    """``value`` is a finite real number (not a bool), ``>= 0`` — or ``> 0`` when ``positive``; as a float.

    ``unit`` (e.g. ``"seconds"``) is named in the messages.
    """
    of = _(" of {unit}").format(unit=_(unit)) if unit else ""
    assert isinstance(value, (int, float)) and not isinstance(value, bool), _("{what} must be a number{of}, got {type}").format(
        what=what, of=of, type=type(value).__name__)
    in_range = value > 0 if positive else value >= 0
    sign = _("positive") if positive else _("non-negative")
    assert math.isfinite(value) and in_range, _("{what} must be a {sign} finite number{of}, got {value}").format(what=what, sign=sign,
        of=of, value=value)
    return float(value)


def positive(value: Any, what: str) -> float:
    """``value`` is a finite number ``> 0`` (a byte count, a throughput, a loss); as a float."""
    return number(value, what, positive=True)


def seconds(value: Any, what: str) -> float:
    """``value`` is a positive, finite duration in seconds; as a float."""
    return number(value, what, positive=True, unit=N_("seconds"))


def has_keys(value: Any, keys: Iterable[str], what: str = N_("the record")) -> dict:
    """``value`` is a dict holding at least ``keys``: "the record must hold 'a' and 'b'"."""
    keys = list(keys)
    names = [repr(k) for k in keys]
    listed = names[0] if len(names) == 1 else _("{value_join} and {names}").format(value_join=', '.join(names[:-1]), names=names[-1])
    assert isinstance(value, dict) and set(keys) <= set(value), _("{what} must hold {listed}").format(what=_(what), listed=listed)
    return value


def differs(what: str, got: Any, want: torch.Tensor, given: str) -> str:
    """A message saying exactly what differs: ``what`` for ``given`` (the input shapes) should be ``want``'s
    shape starting with its first entries; the student's shape and first entries follow."""
    return f"{what} {should_be(got, want, given)}"


def should_be(got: Any, want: torch.Tensor, given: str = "") -> str:
    """``"for q [2, 5, 8] should be [2, 5, 7] starting [0.1, …]; yours is [2, 5, 7] starting […]"``
    (without ``given``: from "should be" on)."""
    def head(t: torch.Tensor) -> str:
        return ", ".join(f"{float(x):.4g}" for x in t.detach().reshape(-1)[:4].float()) + (", …" if t.numel() > 4 else "")

    mine = _("{got} starting [{head}]").format(got=shape_of(got), head=head(got)) if isinstance(got, torch.Tensor) else shape_of(got)
    where = _("for {given} ").format(given=given) if given else ""
    return _("{where}should be {want_shape} starting [{head}]; yours is {mine}").format(where=where, want_shape=list(want.shape),
        head=head(want), mine=mine)


def shapes(**inputs: Any) -> str:
    """The inputs a message is about: ``shapes(q=q, k=k, heads=2, mask=None)`` -> ``"q [2, 5, 8], k [2, 7, 8], heads 2"``
    (``None`` left out)."""
    return ", ".join(f"{name} {list(x.shape)}" if isinstance(x, torch.Tensor) else f"{name} {x}"
                     for name, x in inputs.items() if x is not None)


def shape_of(value: Any) -> list[int] | str:
    """For a message about a wrong return value: the tensor's shape as a list, else its type's name."""
    return list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
