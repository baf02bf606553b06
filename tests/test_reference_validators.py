"""The judges' shared validators (tinytf/course/reference/validators.py): what they accept, what
they return, and the student-facing message of each rejection."""

from __future__ import annotations

import math

import pytest
import torch

from tinytf.checks import Finding, Pitfall
from tinytf.course.reference import call_student, check_parts, stub_or, swapped
from tinytf.course.reference.validators import (
    bool_mask,
    close,
    float_inputs,
    has_keys,
    how_off,
    number,
    positive,
    seconds,
    shape_of,
    shapes,
    tensor,
)


def _message(fn, *args, **kwargs) -> str:
    with pytest.raises(AssertionError) as err:
        fn(*args, **kwargs)
    return str(err.value)


def test_tensor_checks_type_shape_and_dtype():
    x = torch.ones(2, 3, dtype=torch.float64)
    assert tensor(x, (2, 3), "out").dtype == torch.float32  # floats come back as float32
    assert _message(tensor, [1.0], (1,), "out") == "out must be a tensor, got list"
    assert _message(tensor, x, (3, 2), "out") == "out has shape [2, 3], expected [3, 2]"
    assert _message(tensor, x.long(), (2, 3), "out") == "out must be a floating-point tensor, got torch.int64"
    assert _message(tensor, x / 0, (2, 3), "out") == "out contains inf or NaN"
    mask = torch.ones(2, 3, dtype=torch.bool)
    assert tensor(mask, None, "mask", dtype=torch.bool) is mask
    assert _message(tensor, x, None, "mask", dtype=torch.bool) == "mask must have dtype torch.bool, got torch.float64"
    assert tensor(x.long(), (2, 3), "ids", dtype=None).dtype == torch.int64  # any dtype, unchanged


def test_close_checks_the_shape_before_the_values():
    a = torch.zeros(2, 3)
    close(a, a + 1e-7, "w")
    assert _message(close, a, a[:1], "w") == (  # allclose would broadcast
        "w has shape [2, 3], expected [1, 3] — dim 0 has one more (2) than it should (1)")
    assert _message(close, a, a + 1, "w", reference="tinytf") == (
        "w differs from tinytf: should be [2, 3] starting [1, 1, 1, 1, …]; yours is [2, 3] starting [0, 0, 0, 0, …]")
    x = torch.zeros(2, 5)
    assert _message(close, a, a + 1, "w", given=shapes(x=x, heads=2, mask=None)) == (
        "w differs from the reference: for x [2, 5], heads 2 should be [2, 3] starting [1, 1, 1, 1, …]; "
        "yours is [2, 3] starting [0, 0, 0, 0, …]"), "which output, for which inputs, the correct shape and first entries"


def test_recorded_inputs_and_masks():
    q, k = float_inputs(torch.ones(2, dtype=torch.float64), torch.ones(2))
    assert q.dtype == k.dtype == torch.float32
    assert _message(float_inputs, torch.ones(2), torch.ones(2).long()) == "the recorded inputs are not float tensors"
    assert _message(bool_mask, torch.ones(2)) == "the recorded mask is not a bool tensor"


def test_numbers():
    assert number(0, "leak") == 0.0 and positive(2, "bytes") == 2.0 and seconds(0.5, "t") == 0.5
    assert _message(number, True, "leak") == "leak must be a number, got bool"
    assert _message(number, -1.0, "leak") == "leak must be a non-negative finite number, got -1.0"
    assert _message(positive, 0, "bytes") == "bytes must be a positive finite number, got 0"
    assert _message(seconds, float("nan"), "t") == "t must be a positive finite number of seconds, got nan"
    assert _message(seconds, "1", "t") == "t must be a number of seconds, got str"


def test_has_keys_and_shape_of():
    assert has_keys({"a": 1, "b": 2, "c": 3}, ("a", "b")) == {"a": 1, "b": 2, "c": 3}
    assert _message(has_keys, {"a": 1}, ("a", "b", "c")) == "the record must hold 'a', 'b' and 'c'"
    assert _message(has_keys, [], ("a",), "the report") == "the report must hold 'a'"
    assert shape_of(torch.zeros(2, 1)) == [2, 1] and shape_of((1, 2)) == "tuple"


def test_student_calls_and_parts_never_raise():
    def stub(*args):
        raise NotImplementedError

    _, problem = call_student("f", stub)
    assert problem.title == "f is not implemented yet" and problem.pitfall is Pitfall.GENERAL
    _, problem = call_student("f", lambda: 1 / 0)
    assert problem.title == "f raises ZeroDivisionError"
    ns = {"a": lambda: None, "b": lambda: None}
    found = check_parts(ns, [("a", lambda fn: []), (("a", "c", "d"), lambda *fns: []), ("b", lambda fn: 1 / 0)])
    assert [f.title for f in found] == ["c is missing", "d is missing", "b could not be checked"]
    raised = [Finding(Pitfall.SCALE, "x", "your code raised NotImplementedError")]
    assert [f.title for f in stub_or("g", raised)] == ["g is not implemented yet"]
    assert stub_or("g", raised[:0]) == []


def test_swapped_binds_for_the_duration_and_restores_names_and_class_attributes():
    ns = {"f": "mine"}
    with swapped(ns, f="tinytf", g="new"):
        assert ns == {"f": "tinytf", "g": "new"}
    assert ns == {"f": "mine"}, "the student's object is back and a name that was not there is gone"

    class Base:
        def __init__(self):
            self.who = "student"

    class Child(Base):  # inherits __init__, as PostNormBlock inherits PreNormBlock's
        pass

    def reference(self):
        self.who = "tinytf"

    with swapped(Base, __init__=reference):
        assert Child().who == "tinytf"
    assert Child().who == "student" and "__init__" not in vars(Child)
    with pytest.raises(KeyError), swapped(ns, f="tinytf"):
        raise KeyError("a failing test cell")
    assert ns == {"f": "mine"}, "restored after an error too"


def test_a_clean_ratio_or_an_off_by_one_is_named():
    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
    assert _message(close, x / 8, x / math.sqrt(8), "scores").endswith("— exactly 1/sqrt(8) = 1/2.83 of the right value")
    assert _message(close, 2 * x, x, "out", suspects={"counted twice": 2.0}).endswith("— exactly twice the right value: counted twice")
    assert "exactly" not in _message(close, x + 1, x, "out")  # no single factor: nothing to name
    assert _message(tensor, x[:1], (2, 3), "out") == "out has shape [1, 3], expected [2, 3] — dim 0 has one less (1) than it should (2)"
    assert how_off(51200, 102400, suspects={"only the keys": 0.5}) == " — exactly half the right value: only the keys"
    assert how_off(7, 6, step=("tile", 1)) == " — one tile more than the right value (off by one)"
    assert how_off(6, 6) == "" and how_off("6", 5) == "" and how_off(True, 2) == ""
