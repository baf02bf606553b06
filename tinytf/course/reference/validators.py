"""Validators shared by the judges of every exercise: one place for the student-facing messages.

A judge checks what a hidden test recorded (see :mod:`tinytf.course.judges`); each helper here
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

from tinytf.checks.findings import relation, shape_relation, tensor_relation

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
    assert isinstance(value, torch.Tensor), f"{what} must be a tensor, got {type(value).__name__}"
    if shape is not None:
        assert tuple(value.shape) == tuple(shape), f"{what} has shape {list(value.shape)}, expected {list(shape)}{_off(value.shape, shape)}"
    if isinstance(dtype, str):  # FLOATING
        assert value.is_floating_point(), f"{what} must be a floating-point tensor, got {value.dtype}"
        assert bool(torch.isfinite(value).all()), f"{what} contains inf or NaN"
        return value.float()
    if dtype is not None:
        assert value.dtype == dtype, f"{what} must have dtype {dtype}, got {value.dtype}"
    return value


def close(value: torch.Tensor, expected: torch.Tensor, what: str, *, given: str = "", atol: float = 1e-5, rtol: float = 1e-4,
          reference: str = "the reference", suspects: dict[str, float] | None = None) -> None:
    """``value`` has the shape of ``expected`` and agrees with it (compared in float32): otherwise
    "``what`` differs from ``reference``: for ``given`` (the input shapes) it should be … starting […]; yours is …",
    and, when ``value`` is ``expected`` times a clean number, which (``suspects``: ``{meaning: ratio}``)."""
    assert tuple(value.shape) == tuple(expected.shape), (
        f"{what} has shape {list(value.shape)}, expected {list(expected.shape)}{_off(value.shape, expected.shape)}")
    if not torch.allclose(value.float(), expected.float(), atol=atol, rtol=rtol):
        how = tensor_relation(value, expected, suspects=suspects)
        raise AssertionError(f"{what} differs from {reference}: {should_be(value, expected, given)}" + (f" — {how}" if how else ""))


def _off(got: Sequence[int], want: Sequence[int]) -> str:
    how = shape_relation(list(got), list(want))
    return f" — {how}" if how else ""


def how_off(got: Any, want: float, *, suspects: dict[str, float] | None = None, step: tuple[str, float] | None = None) -> str:
    """For a message about a wrong number: " — exactly half the right value: dtype_bytes=4 looks ignored" when
    ``got`` is a clean ratio or one ``step`` off ``want`` (:func:`tinytf.checks.findings.relation`), else ``""``."""
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        return ""
    how = relation(got, want, suspects=suspects, step=step)
    return f" — {how}" if how else ""


def float_inputs(*xs: Any, what: str = "the recorded inputs") -> list[torch.Tensor]:
    """The recorded input tensors ``xs`` as float32 (a record a student tampered with is rejected)."""
    assert all(isinstance(x, torch.Tensor) and x.is_floating_point() for x in xs), f"{what} are not float tensors"
    return [x.float() for x in xs]


def bool_mask(mask: Any, what: str = "the recorded mask") -> torch.Tensor:
    """The recorded ``mask`` is a bool tensor (True = may attend)."""
    assert isinstance(mask, torch.Tensor) and mask.dtype == torch.bool, f"{what} is not a bool tensor"
    return mask


def number(value: Any, what: str, *, positive: bool = False, unit: str = "") -> float:
    """``value`` is a finite real number (not a bool), ``>= 0`` — or ``> 0`` when ``positive``; as a float.

    ``unit`` (e.g. ``"seconds"``) is named in the messages.
    """
    of = f" of {unit}" if unit else ""
    assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{what} must be a number{of}, got {type(value).__name__}"
    in_range = value > 0 if positive else value >= 0
    sign = "positive" if positive else "non-negative"
    assert math.isfinite(value) and in_range, f"{what} must be a {sign} finite number{of}, got {value}"
    return float(value)


def positive(value: Any, what: str) -> float:
    """``value`` is a finite number ``> 0`` (a byte count, a throughput, a loss); as a float."""
    return number(value, what, positive=True)


def seconds(value: Any, what: str) -> float:
    """``value`` is a positive, finite duration in seconds; as a float."""
    return number(value, what, positive=True, unit="seconds")


def has_keys(value: Any, keys: Iterable[str], what: str = "the record") -> dict:
    """``value`` is a dict holding at least ``keys``: "the record must hold 'a' and 'b'"."""
    keys = list(keys)
    names = [repr(k) for k in keys]
    listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    assert isinstance(value, dict) and set(keys) <= set(value), f"{what} must hold {listed}"
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

    mine = f"{shape_of(got)} starting [{head(got)}]" if isinstance(got, torch.Tensor) else shape_of(got)
    where = f"for {given} " if given else ""
    return f"{where}should be {list(want.shape)} starting [{head(want)}]; yours is {mine}"


def shapes(**inputs: Any) -> str:
    """The inputs a message is about: ``shapes(q=q, k=k, heads=2, mask=None)`` -> ``"q [2, 5, 8], k [2, 7, 8], heads 2"``
    (``None`` left out)."""
    return ", ".join(f"{name} {list(x.shape)}" if isinstance(x, torch.Tensor) else f"{name} {x}"
                     for name, x in inputs.items() if x is not None)


def shape_of(value: Any) -> list[int] | str:
    """For a message about a wrong return value: the tensor's shape as a list, else its type's name."""
    return list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
