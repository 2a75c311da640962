"""The op sweep's plots: per kind (time, memory), dtype and pass one figure, a panel per
head dim, log-log, with the cost model's and the measured crossovers marked."""

from __future__ import annotations

import itertools
import math

from ...vocab import PASSES
from ..core import MIB, OK, SKIPPED
from ..figures import figure as new_figure
from ..figures import log_axes
from .analysis import METRIC_KEY, analyse, impl_names, label, series, theory_by_d
from .cases import COLOURS

__all__ = ["figure", "figure_names"]


def _interpolate(series: dict[int, float], n: float) -> float | None:
    """The series at ``n``, interpolated linearly in log-log between its grid points."""
    ns = sorted(series)
    for a, b in itertools.pairwise(ns):
        if a <= n <= b:
            t = (math.log(n) - math.log(a)) / (math.log(b) - math.log(a))
            return math.exp(math.log(series[a]) + t * (math.log(series[b]) - math.log(series[a])))
    return series.get(round(n))


def figure(results: dict, kind: str, dtype: str, pass_name: str):
    cfg = results["config"]
    ds = sorted(
        {
            p["d"]
            for p in results["points"]
            if (p["kind"], p["dtype"], p["pass"]) == (kind, dtype, pass_name)
        }
    )
    if not ds:
        return None
    key = METRIC_KEY[kind]
    scale = 1e3 if kind == "time" else 1 / MIB
    theory_d = theory_by_d(results)
    fig = new_figure(5.0 * len(ds), 4.4)
    axes = fig.subplots(1, len(ds), squeeze=False)[0]
    names = impl_names(results, kind)
    palette = iter(["tab:red", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:gray"])
    colours = {n: COLOURS.get(n) or next(palette, "black") for n in names}
    drawn_any = False
    for ax, d in zip(axes, ds, strict=True):
        match = {"kind": kind, "dtype": dtype, "pass": pass_name, "d": d}
        for name in names:
            pts = sorted(
                (
                    p
                    for p in results["points"]
                    if p["impl"] == name and all(p[k] == v for k, v in match.items())
                ),
                key=lambda p: p["n"],
            )
            ok = [p for p in pts if p["status"] == OK and (p[key] or 0) > 0]
            legend = label(results, name)
            failed = next((p for p in pts if p["status"] not in (OK, SKIPPED)), None)
            if failed is not None:
                legend += f" ({failed['status']} at N={failed['n']})"
            if not ok:
                continue
            drawn_any = True
            ns = [p["n"] for p in ok]
            ax.plot(
                ns,
                [p[key] * scale for p in ok],
                marker="o",
                ms=3.5,
                lw=1.6,
                color=colours[name],
                label=legend,
            )
            if kind == "time":
                ax.fill_between(
                    ns,
                    [p["min_s"] * scale for p in ok],
                    [p["max_s"] * scale for p in ok],
                    color=colours[name],
                    alpha=0.18,
                    lw=0,
                )
        th = theory_d.get(d)
        if th is not None:
            n_th, n_sym, sym = (
                (th["n0"], th["n0_symmetric"], "N0")
                if kind == "time"
                else (th["n1"], th["n1_symmetric"], "N1")
            )
            ax.axvline(n_th, ls="--", lw=1, color="black", label=f"theory {sym} = {n_th} (paper)")
            ax.axvline(
                n_sym, ls="--", lw=1, color="grey", label=f"theory {sym} = {n_sym} (symmetric form)"
            )
        for c in results.get("crossovers") or analyse(results):
            if (c["metric"], c["dtype"], c["pass"], c["d"]) != (kind, dtype, pass_name, d):
                continue
            if c["status"] != "crossed":
                continue
            mine = series(results["points"], key, impl=c["challenger"], **match)
            y = _interpolate(mine, c["n"])
            if y is None:
                continue
            marker = "*" if c["baseline"] == "direct" else "D"
            shaky = c.get("unreliable", False)  # hollow: timed on a busy machine
            ax.plot(
                [c["n"]],
                [y * scale],
                marker=marker,
                ms=11 if marker == "*" else 7,
                color="black",
                mfc="none" if shaky else "black",
                ls="none",
                zorder=5,
                label=f"measured: {c['challenger']} < {c['baseline']} at N ≈ {c['n']:.0f}"
                + (" (unreliable: busy machine)" if shaky else ""),
            )
        log_axes(ax, plain_x_ticks=True)
        ax.set_title(f"head dim d = {d}")
        ax.set_xlabel("sequence length N (tokens)")
        ax.set_ylabel(
            "time per call (ms, median; band: min–max)"
            if kind == "time"
            else "peak extra memory of one call (MiB)"
        )
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=7, loc="upper left")
    if not drawn_any:
        return None
    what = "Time per call" if kind == "time" else "Peak extra memory"
    fig.suptitle(
        f"{what} vs sequence length — {pass_name}, {dtype}, {cfg['device']}, "
        f"batch {cfg['batch']}, heads {cfg['heads']}\n(log-log; dashed lines: crossovers of the "
        "cost model; black marks: measured crossovers)",
        fontsize=10,
    )
    return fig


def figure_names(results: dict) -> list[tuple[str, str, str, str]]:
    """(file name, kind, dtype, pass) of every figure the results have data for."""
    out = []
    for kind in ("time", "memory"):
        combos = sorted(
            {
                (p["dtype"], p["pass"])
                for p in results["points"]
                if p["kind"] == kind and p["status"] == OK
            },
            key=lambda c: (c[0], PASSES.index(c[1])),
        )
        for dtype, pass_name in combos:
            tag = pass_name.replace("+", "_")
            out.append((f"{kind}_{tag}_{dtype}.png", kind, dtype, pass_name))
    return out
