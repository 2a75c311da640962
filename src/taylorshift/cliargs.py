"""Argument types and plain-text tables shared by the ``taylorshift`` subcommands.

Each type raises ``argparse.ArgumentTypeError`` with the expected and the actual value, so
argparse reports ``argument --x: expected ..., got ...`` and exits with status 2.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

__all__ = ["format_table", "non_negative_float", "positive_float", "positive_int", "share"]


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _finite_float(text: str, expected: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value:g}")
    return value


def positive_float(text: str) -> float:
    value = _finite_float(text, "a positive number")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value:g}")
    return value


def non_negative_float(text: str) -> float:
    value = _finite_float(text, "a number >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value:g}")
    return value


def share(text: str) -> float:
    """A number in (0, 1]: a part of a whole, e.g. a probability mass."""
    value = _finite_float(text, "a number in (0, 1]")
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {value:g}")
    return value


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Right-aligned plain-text table, column widths fitted to the contents."""
    cells = [list(headers)] + [[str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
