"""The scalar argument checks: what each accepts, returns and refuses, and the messages."""

from __future__ import annotations

import math
import re
from fractions import Fraction

import pytest
import torch

from taylorshift._validate import (
    check_bool,
    check_choice,
    check_int,
    check_number,
    check_probability,
    check_str,
    value_range,
)


class IntSubclass(int):
    """An int of another type (as numpy's ints are Integral): returned as a plain int."""


def refused(error, check, *args, **kwargs) -> str:
    with pytest.raises(error) as info:
        check(*args, **kwargs)
    assert type(info.value) is error
    return str(info.value)


@pytest.mark.parametrize(
    ("value", "kwargs", "expected"),
    [
        (0, {}, 0),
        (-7, {}, -7),
        (1, {"ge": 1}, 1),
        (3, {"ge": 0, "le": 3}, 3),
        (IntSubclass(5), {"ge": 1}, 5),
        (None, {"allow_none": True}, None),
    ],
    ids=["zero", "negative", "at-ge", "at-le", "int-subclass", "none"],
)
def test_check_int_accepts(value, kwargs, expected):
    got = check_int("n", value, **kwargs)
    assert got == expected
    assert type(got) is type(expected)


@pytest.mark.parametrize(
    ("value", "kwargs", "message"),
    [
        (True, {}, "n must be an int; got True"),
        (False, {"ge": 0}, "n must be an int >= 0; got False"),
        (1.0, {"ge": 1}, "n must be a positive int; got 1.0"),
        ("3", {}, "n must be an int; got '3'"),
        (None, {"ge": 1}, "n must be a positive int; got None"),
        ("x", {"ge": 1, "allow_none": True}, "n must be a positive int or None; got 'x'"),
    ],
    ids=["true", "false", "float", "str", "none", "str-optional"],
)
def test_check_int_refuses_a_wrong_type(value, kwargs, message):
    assert refused(TypeError, check_int, "n", value, **kwargs) == message


@pytest.mark.parametrize(
    ("value", "kwargs", "message"),
    [
        (0, {"ge": 1}, "n must be a positive int; got 0"),
        (-1, {"ge": 0}, "n must be an int >= 0; got -1"),
        (1, {"ge": 2}, "n must be an int >= 2; got 1"),
        (4, {"ge": 0, "le": 3}, "n must be an int in [0, 3]; got 4"),
        (9, {"le": 8}, "n must be an int <= 8; got 9"),
    ],
    ids=["zero", "negative", "below-ge", "above-le", "only-le"],
)
def test_check_int_refuses_a_wrong_value(value, kwargs, message):
    assert refused(ValueError, check_int, "n", value, **kwargs) == message


@pytest.mark.parametrize(
    ("value", "kwargs"),
    [
        (0.5, {"gt": 0}),
        (2, {"gt": 0}),
        (0, {"ge": 0, "lt": 1}),
        (1, {"gt": 0, "le": 1}),
        (Fraction(1, 4), {}),
        (-3.5, {}),
        (math.inf, {"finite": False, "gt": 0}),
    ],
    ids=["float", "int", "at-ge", "at-le", "fraction", "unbounded", "inf-allowed"],
)
def test_check_number_accepts_and_returns_a_float(value, kwargs):
    got = check_number("x", value, **kwargs)
    assert type(got) is float
    assert got == float(value)


def test_check_number_none_only_when_allowed():
    assert check_number("x", None, allow_none=True) is None
    assert refused(TypeError, check_number, "x", None, gt=0) == "x must be a number > 0; got None"


@pytest.mark.parametrize(
    ("error", "value", "kwargs", "message"),
    [
        (TypeError, True, {"gt": 0}, "x must be a number > 0; got True"),
        (TypeError, "1e-3", {}, "x must be a number; got '1e-3'"),
        (TypeError, [1], {"gt": 0, "allow_none": True}, "x must be a number > 0 or None; got [1]"),
        (ValueError, 0, {"gt": 0}, "x must be a number > 0; got 0"),
        (ValueError, -0.5, {"ge": 0}, "x must be a number >= 0; got -0.5"),
        (ValueError, 1.0, {"ge": 0, "lt": 1}, "x must be a number in [0, 1); got 1.0"),
        (ValueError, 0.0, {"gt": 0, "le": 1}, "x must be a number in (0, 1]; got 0.0"),
        (ValueError, 2, {"lt": 2}, "x must be a number < 2; got 2"),
        (ValueError, math.inf, {"gt": 0}, "x must be a finite number > 0; got inf"),
        (ValueError, math.nan, {}, "x must be a finite number; got nan"),
        (ValueError, math.nan, {"gt": 0, "finite": False}, "x must be a number > 0; got nan"),
    ],
    ids=[
        "bool", "str", "list", "gt", "ge", "lt", "gt-le", "only-lt", "inf", "nan", "nan-bounds",
    ],
)  # fmt: skip
def test_check_number_refuses(error, value, kwargs, message):
    assert refused(error, check_number, "x", value, **kwargs) == message


def test_check_probability():
    assert check_probability("p", 0) == 0.0
    assert check_probability("p", 0.999) == 0.999
    for value in (1, 1.0, -0.1, math.nan):
        message = refused(ValueError, check_probability, "p", value)
        assert message.startswith("p must be a number in [0, 1); got ")
    assert refused(TypeError, check_probability, "p", False) == (
        "p must be a number in [0, 1); got False"
    )


def test_check_bool():
    assert check_bool("flag", True) is True
    assert check_bool("flag", False) is False
    for value in (0, 1, None, "true", 1.0):
        assert (
            refused(TypeError, check_bool, "flag", value) == f"flag must be a bool; got {value!r}"
        )


def test_check_str():
    assert check_str("col", "text") == "text"
    assert check_str("col", "", allow_empty=True) == ""
    assert refused(ValueError, check_str, "col", "") == "col must be a non-empty str; got ''"
    assert refused(TypeError, check_str, "col", 3) == "col must be a non-empty str; got 3"
    assert refused(TypeError, check_str, "col", None, allow_empty=True) == (
        "col must be a str; got None"
    )


def test_check_choice():
    assert check_choice("mode", "b", ("a", "b")) == "b"
    assert check_choice("size", 2, iter([1, 2])) == 2  # any iterable of choices
    assert refused(ValueError, check_choice, "mode", "c", ["a", "b"]) == (
        "mode must be one of 'a', 'b'; got 'c'"
    )
    assert refused(TypeError, check_choice, "mode", None, ("a", "b")) == (
        "mode must be one of 'a', 'b'; got None"
    )
    assert refused(TypeError, check_choice, "mode", 1, ("a", "b")) == (
        "mode must be one of 'a', 'b'; got 1"
    )


def test_long_values_are_cut_in_the_message():
    message = refused(TypeError, check_int, "n", "x" * 1000)
    assert len(message) < 120
    assert re.fullmatch(r"n must be an int; got 'x+\.\.\.", message)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_value_range_is_min_and_max(dtype):
    t = torch.randint(0, 200, (3, 17), generator=torch.Generator().manual_seed(0)).to(dtype)
    t[1, 5], t[2, 9] = 0, 201
    assert value_range(t) == (0, 201)
    assert value_range(t[:1, 2:3]) == (int(t[0, 2]), int(t[0, 2]))
    assert all(isinstance(v, int) for v in value_range(t))
