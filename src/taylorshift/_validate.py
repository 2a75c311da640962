"""Checks of scalar arguments (ints, numbers, flags, names), one message format for all.

Every check returns the value it accepts and raises with the message
``"{name} must be {expected}; got {value!r}"``: ``TypeError`` when the value has the wrong
Python type, ``ValueError`` when it has the right type but a wrong value. A bool is never
accepted as an int or a number.

    check_int("seq_len", 0, ge=1)  # ValueError: seq_len must be a positive int; got 0
    check_number("lr", "1e-3", gt=0)  # TypeError: lr must be a number > 0; got '1e-3'
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal, TypedDict, TypeVar, overload

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack needs Python 3.11

T = TypeVar("T")


class _IntBounds(TypedDict, total=False):
    ge: int | None
    le: int | None


class _NumberBounds(TypedDict, total=False):
    gt: float | None
    ge: float | None
    lt: float | None
    le: float | None
    finite: bool


_MAX_SHOWN = 80  # characters of a refused value's repr in the message


def is_finite(x: float) -> bool:
    """``math.isfinite(x)`` for a float, spelt as comparisons (NaN fails both): under
    ``torch.compile(dynamic=True)`` Dynamo cannot trace ``math.isfinite`` or ``math.isnan``,
    even of a constant, and a check of the op's arguments must not break its graph."""
    return -math.inf < x < math.inf


def values_readable() -> bool:
    """Whether a check may read tensor values (``int(t.max())``): not while torch.compile
    traces (a graph cannot branch on values) nor inside torch.func transforms (``vmap``
    cannot read them); such checks then leave the error to the operation itself."""
    import torch

    if torch.compiler.is_compiling():
        return False
    return not torch._C._are_functorch_transforms_active()


def value_range(t) -> tuple[int, int]:
    """(min, max) of a non-empty integer tensor, read in one transfer (one host sync on an
    accelerator, where ``int(t.min())`` and ``int(t.max())`` make two)."""
    import torch

    low, high = torch.aminmax(t)
    return tuple(torch.stack((low, high)).tolist())


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def _refuse(error: type[Exception], name: str, expected: str, value: object) -> Exception:
    return error(f"{name} must be {expected}; got {_show(value)}")


def _bounds(gt=None, ge=None, lt=None, le=None) -> str:
    """The words for the given bounds: " > 0", " >= 1", " in [0, 1)", " <= 5" or ""."""
    low = gt if gt is not None else ge
    high = lt if lt is not None else le
    if low is not None and high is not None:
        opening, closing = "(" if gt is not None else "[", ")" if lt is not None else "]"
        return f" in {opening}{low}, {high}{closing}"
    if low is not None:
        return f" {'>' if gt is not None else '>='} {low}"
    if high is not None:
        return f" {'<' if lt is not None else '<='} {high}"
    return ""


def _within(value, gt=None, ge=None, lt=None, le=None) -> bool:
    return (
        (gt is None or value > gt)
        and (ge is None or value >= ge)
        and (lt is None or value < lt)
        and (le is None or value <= le)
    )


# The overloads tell a type checker that None comes back only with allow_none=True; the
# bounds they accept are the ones spelled out (with their defaults) by the implementation.
@overload
def check_int(
    name: str, value: object, *, allow_none: Literal[False] = False, **bounds: Unpack[_IntBounds]
) -> int: ...
@overload
def check_int(
    name: str, value: object, *, allow_none: bool, **bounds: Unpack[_IntBounds]
) -> int | None: ...
def check_int(
    name: str,
    value: object,
    *,
    ge: int | None = None,
    le: int | None = None,
    allow_none: bool = False,
) -> int | None:
    """``value`` as an int in ``[ge, le]`` (either bound optional); None only with
    ``allow_none``. Any integral type is accepted (numpy ints too) and returned as ``int``."""
    if value is None and allow_none:
        return None
    expected = "a positive int" if ge == 1 and le is None else f"an int{_bounds(ge=ge, le=le)}"
    expected += " or None" if allow_none else ""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise _refuse(TypeError, name, expected, value)
    if not _within(value, ge=ge, le=le):
        raise _refuse(ValueError, name, expected, value)
    return int(value)


@overload
def check_number(
    name: str,
    value: object,
    *,
    allow_none: Literal[False] = False,
    **bounds: Unpack[_NumberBounds],
) -> float: ...
@overload
def check_number(
    name: str, value: object, *, allow_none: bool, **bounds: Unpack[_NumberBounds]
) -> float | None: ...
def check_number(
    name: str,
    value: object,
    *,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
    finite: bool = True,
    allow_none: bool = False,
) -> float | None:
    """``value`` (any real number but a bool) as a float within the given bounds: ``gt`` >,
    ``ge`` >=, ``lt`` <, ``le`` <=; finite unless ``finite=False``; None only with
    ``allow_none``. NaN is outside every bound."""
    if value is None and allow_none:
        return None
    expected = f"a number{_bounds(gt, ge, lt, le)}" + (" or None" if allow_none else "")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _refuse(TypeError, name, expected, value)
    number = float(value)
    bounded = (gt is not None or ge is not None) and (lt is not None or le is not None)
    if finite and not bounded and not is_finite(number):
        raise _refuse(ValueError, name, expected.replace("a number", "a finite number"), value)
    if number != number or not _within(number, gt, ge, lt, le):  # (NaN: see is_finite)
        raise _refuse(ValueError, name, expected, value)
    return number


def check_probability(name: str, value: object) -> float:
    """``value`` as a float in [0, 1): a dropout rate, a held-out fraction."""
    return check_number(name, value, ge=0, lt=1)


def check_bool(name: str, value: object) -> bool:
    """``value`` if it is True or False (not 0, 1 or None)."""
    if not isinstance(value, bool):
        raise _refuse(TypeError, name, "a bool", value)
    return value


def check_str(name: str, value: object, *, allow_empty: bool = False) -> str:
    """``value`` if it is a str, non-empty unless ``allow_empty``."""
    expected = "a str" if allow_empty else "a non-empty str"
    if not isinstance(value, str):
        raise _refuse(TypeError, name, expected, value)
    if not value and not allow_empty:
        raise _refuse(ValueError, name, expected, value)
    return value


def check_choice(name: str, value: T, choices: Iterable[T]) -> T:
    """``value`` if it is one of ``choices``; TypeError when no choice has its type."""
    choices = tuple(choices)
    if value in choices:
        return value
    expected = f"one of {', '.join(map(repr, choices))}"
    wrong_type = not any(type(value) is type(c) for c in choices)
    raise _refuse(TypeError if wrong_type else ValueError, name, expected, value)
