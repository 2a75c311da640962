"""Figures of the benchmarks: matplotlib's object API (no pyplot state, nothing to close),
imported only when a figure is drawn. ``taylorshift.bench.files.write_figure`` writes them."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["figure", "log_axes", "log_if_wide"]


def figure(width: float = 6.4, height: float = 4.4):
    """A new figure of ``width`` × ``height`` inches with constrained layout."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def log_axes(ax, *, x_base: int = 2, y: bool = True, plain_x_ticks: bool = False) -> None:
    """Logarithmic x (base ``x_base``: sizes on a doubling grid) and, with ``y``, y axes;
    ``plain_x_ticks`` labels x ticks 64, 128, ... rather than 2⁶, 2⁷, ..."""
    ax.set_xscale("log", base=x_base)
    if plain_x_ticks:
        from matplotlib.ticker import FuncFormatter

        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    if y:
        ax.set_yscale("log")


def log_if_wide(ax, values: Sequence[float], axis: str = "x") -> None:
    """A logarithmic axis when the positive ``values`` span more than a factor of 20."""
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) > 20:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
