"""The figures of ``bench models``: accuracy against each metric with its Pareto front,
throughput against batch size, and the head-count sweep."""

from __future__ import annotations

from collections.abc import Sequence

from ..core import MIB, OK
from ..figures import figure, log_axes, log_if_wide
from .pareto import Metric, metric_value, pareto_front

__all__ = ["plot_curves", "plot_heads", "plot_pareto"]


def plot_pareto(rows: Sequence[dict], metric: Metric):
    """A scatter of accuracy against ``metric``; front points black, the front drawn."""
    points = [
        (metric_value(r, metric), r["accuracy"], r["name"])
        for r in rows
        if r.get("accuracy") is not None and metric_value(r, metric) is not None
    ]
    on = pareto_front([(x, y) for x, y, _ in points], better=metric.better)
    fig = figure()
    ax = fig.add_subplot()
    for (x, y, name), keep in zip(points, on, strict=True):
        ax.scatter(
            x, y, s=36, edgecolors="black", facecolors="black" if keep else "white", zorder=3
        )
        ax.annotate(name, (x, y), fontsize=6, xytext=(4, 3), textcoords="offset points")
    log_if_wide(ax, [x for x, _, _ in points])
    front = sorted((x, y) for (x, y, _), keep in zip(points, on, strict=True) if keep)
    if front:
        # The staircase bounding the dominated region, carried to the edges of the axes:
        # lower-is-better fronts rise to the right, higher-is-better ones fall.
        (x0, x1), (y0, _) = ax.get_xlim(), ax.get_ylim()
        xs, ys = (list(v) for v in zip(*front, strict=True))
        if metric.better == "lower":
            xs, ys, where = [xs[0], *xs, x1], [y0, *ys, ys[-1]], "post"
        else:
            xs, ys, where = [x0, *xs, xs[-1]], [ys[0], *ys, y0], "pre"
        ax.step(xs, ys, where=where, color="black", linewidth=1, zorder=2, label="Pareto front")
        ax.set_xlim(x0, x1)
        ax.set_ylim(bottom=y0)
        ax.legend(loc="best", fontsize=7)
    else:
        ax.text(
            0.5,
            0.5,
            "no row has both an accuracy and this metric",
            ha="center",
            transform=ax.transAxes,
        )
    ax.set_xlabel(f"{metric.label}, {metric.better} is better")
    ax.set_ylabel("accuracy (%)")
    ax.grid(True, alpha=0.3)
    return fig


def plot_curves(rows: Sequence[dict]):
    """Inference throughput against batch size, one line per row."""
    fig = figure(7.0, 4.6)
    ax = fig.add_subplot()
    for r in rows:
        good = [p for p in r["curve"] if p["status"] == OK]
        if good:
            ax.plot(
                [p["batch"] for p in good],
                [p["samples_per_s"] for p in good],
                marker="o",
                markersize=3,
                label=r["name"],
            )
    log_axes(ax)
    ax.set_xlabel("batch size")
    ax.set_ylabel("inference throughput (samples/s)")
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_lines():
        ax.legend(fontsize=6)
    return fig


def plot_heads(rows: Sequence[dict]):
    """The head-count sweep: throughput and inference memory against h, one line per kernel."""
    fig = figure(9.0, 3.8)
    axes = fig.subplots(1, 2)
    by_kernel: dict[str, list[dict]] = {}
    for r in rows:
        by_kernel.setdefault(r["kernel"] + (f" ({r['mode']})" if r["mode"] else ""), []).append(r)
    for label, group in by_kernel.items():
        group = sorted(group, key=lambda r: r["heads"] or 0)
        for ax, key, scale in (
            (axes[0], "throughput", 1.0),
            (axes[1], "inference_memory_bytes", MIB),
        ):
            pts = [(r["heads"], r[key] / scale) for r in group if r[key] is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=label)
    axes[0].set_ylabel("inference throughput (samples/s)")
    axes[1].set_ylabel("inference memory at batch 1 (MiB)")
    for ax in axes:
        log_axes(ax, y=False)
        ax.set_xlabel("heads h (fixed width)")
        ax.grid(True, alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=7)
    return fig
