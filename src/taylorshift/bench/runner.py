"""Running points: out of memory and errors become results, a failure ends its series.

A *series* is the points of one case measured in order of growing size (one implementation
at N = 64, 128, ... or one model at batch 1, 2, 4, ...). When a point runs out of memory or
raises, the larger ones would too, or take long to fail: :class:`Series` records the failure
as the point's result and every later point as ``"skipped"``, with the reason. A tool that
predicts a point to be too slow or too large ends the series the same way
(:meth:`Series.refuse`). :class:`Budget` is the wall-clock allowance of a whole run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from .core import ERROR_CHARS, OK, SKIPPED, status_of

__all__ = ["Budget", "Series", "failure", "free_cache"]


def free_cache(device: torch.device | str | None = None) -> None:
    """Give the CUDA allocator's cached blocks back (``device`` None: whenever CUDA is here),
    so that a failed or finished point does not crowd the next one."""
    if (device is None or torch.device(device).type == "cuda") and torch.cuda.is_available():
        torch.cuda.empty_cache()


def failure(err: BaseException, device: torch.device | str | None = None) -> dict:
    """A point's result for an exception: ``{"status": "oom" or "error: <type>", "error":
    message}``. Frees the CUDA cache (the failed point's blocks) for the next point."""
    free_cache(device)
    return {"status": status_of(err), "error": str(err)[:ERROR_CHARS]}


class Series:
    """The points of one series, measured in order; the first failure ends it."""

    def __init__(self) -> None:
        self.stopped: str = ""  # why the rest of the series is skipped ("" while it runs)

    def skip(self, point: dict) -> bool:
        """Mark ``point`` skipped if the series has ended; whether it was."""
        if not self.stopped:
            return False
        point["status"], point["reason"] = SKIPPED, self.stopped
        return True

    def refuse(self, point: dict, status: str, reason: str, *, end: str = "") -> dict:
        """Record ``point`` as not measured (``status``, ``reason``); ``end``: also end the
        series, with this reason for the points after it."""
        point["status"], point["reason"] = status, reason
        if end:
            self.stopped = end
        return point

    def run(self, point: dict, measure: Callable[[], dict], where: str) -> dict:
        """Fill ``point`` with ``measure()``'s result (a dict with a ``status``); an exception
        is the result ``oom`` or ``error: <type>``. A point that is not ``ok`` ends the series:
        the next ones are skipped "after <status> at <where>"."""
        try:
            result = measure()
        except Exception as err:  # building the inputs, or not a RuntimeError
            result = failure(err)
        point.update(result)
        if point["status"] != OK:
            point["reason"] = point.get("error", "")
            self.stopped = f"after {point['status']} at {where}"
        return point


class Budget:
    """A wall-clock allowance for a whole run (``None``: unlimited)."""

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def remaining(self) -> float:
        if self.seconds is None:
            return math.inf
        return self.seconds - self.elapsed()

    def over(self) -> bool:
        return self.remaining() <= 0
