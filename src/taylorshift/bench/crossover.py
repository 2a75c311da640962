"""Empirical crossovers: the sequence length from which one form beats another.

Given the measured costs of a *challenger* (e.g. efficient TaylorShift, linear in N) and a
*baseline* (e.g. direct TaylorShift or SDPA, quadratic in N) at the same grid of N, the
crossover is where log(challenger / baseline) changes sign for the last time from positive
(challenger dearer) to negative, found by linear interpolation in (log N, log ratio) between
the two grid points around the change. Costs that are straight lines in log-log between the
grid points (powers of N) are interpolated exactly.

Only grid points where both were measured count. If the challenger wins at every point the
crossover lies at or below the grid ("below"); if it never wins, above it ("above").
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields

__all__ = ["Crossover", "find_crossover"]


@dataclass(frozen=True)
class Crossover:
    """Where the challenger starts to win.

    status: ``"crossed"`` (``n`` interpolated between ``n_below`` and ``n_above``),
    ``"below"`` (it wins from the smallest common N, ``n_above``, on: the crossover is at
    most that), ``"above"`` (it loses up to the largest common N, ``n_below``),
    ``"no data"`` (fewer than one common point).
    sign_changes: how often the winner changes along the grid (more than one means noise
    or a real double crossing near ``n``).
    """

    status: str
    n: float | None = None
    n_below: int | None = None
    n_above: int | None = None
    sign_changes: int = 0
    points: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Crossover:
        """The crossover of :meth:`to_dict` (other keys of ``data`` are ignored)."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})

    def describe(self) -> str:
        """Short text for tables: '≈ 1234', '≤ 64', '> 4096' or 'n/a'."""
        if self.status == "crossed":
            return f"≈ {self.n:.0f}"
        if self.status == "below":
            return f"≤ {self.n_above}"
        if self.status == "above":
            return f"> {self.n_below}"
        return "n/a"


def _usable(x: float | None) -> bool:
    return x is not None and math.isfinite(x) and x > 0


def find_crossover(
    challenger: Mapping[int, float | None], baseline: Mapping[int, float | None]
) -> Crossover:
    """The N from which ``challenger`` costs less than ``baseline`` (costs by N: seconds,
    bytes, ...; missing, zero, negative or non-finite values are ignored)."""
    ns = sorted(n for n in challenger if n in baseline)
    ns = [n for n in ns if _usable(challenger[n]) and _usable(baseline[n])]
    if not ns:
        return Crossover(status="no data")
    logs = [math.log(challenger[n] / baseline[n]) for n in ns]  # > 0: challenger dearer
    wins = [lr < 0 for lr in logs]
    changes = sum(a != b for a, b in itertools.pairwise(wins))
    if all(wins):
        return Crossover("below", n_above=ns[0], sign_changes=0, points=len(ns))
    if not wins[-1]:
        return Crossover("above", n_below=ns[-1], sign_changes=changes, points=len(ns))
    # The last loss; the challenger wins at every point after it.
    i = max(j for j, w in enumerate(wins) if not w)
    n0, n1 = ns[i], ns[i + 1]
    r0, r1 = logs[i], logs[i + 1]  # r0 >= 0 > r1
    t = r0 / (r0 - r1)
    n = math.exp(math.log(n0) + t * (math.log(n1) - math.log(n0)))
    return Crossover("crossed", n=n, n_below=n0, n_above=n1, sign_changes=changes, points=len(ns))
