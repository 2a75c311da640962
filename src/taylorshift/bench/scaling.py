"""``taylorshift bench scaling``: how large the efficient form's intermediates get, and why the
paper normalises (its Table 1, Figure 5 and Algorithm 1).

The paper's setting (§3.3, Appendix B.2): rows of Q, K and V drawn uniformly from the unit
sphere, the mean vector norm of each intermediate of efficient-TaylorShift, for N from 1 to
10⁵ and several d. The intermediates, with V' = [1, V] (the ones column gives the
denominator):

    A_mod       = (K⊠K)ᵀ V'                (d², d+1)   one matrix: its (Frobenius) norm
    squared     = (QKᵀ)^{⊙2} V' = (Q⊠Q) A_mod   (N, d+1)   mean row norm
    linear      = QKᵀ V' = Q (Kᵀ V')        (N, d+1)   mean row norm
    denominator = Y_denom = ½ squared + linear + Σ_j V'_j, first column   (N,)   mean |·|
    output      = Y = Y_nom / Y_denom        (N, d)     mean row norm

"plain" is Eq. (3) as written; "normalised" is Algorithm 1: q, k L2-normalised (τ = 1) and
multiplied by α = d^¼, V' = [sqrt(d/N) 1, V] / N, Taylor coefficients (½, α², α⁴) — the
same attention output times sqrt(N/d). Every intermediate is computed here with plain torch
(row-wise tensor squares as in the paper's Algorithm 1, lines 1-3), independently of the op.

Beside the measurements: the paper's fitted formulas (Table 1, plain only) and our exact
root-mean-square values, E‖·‖² derived from the moments of s = q·k for unit vectors
(E s² = 1/d, E s⁴ = 3/(d(d+2))); docs/bench-scaling.md has the derivation. The N at which
an intermediate's largest entry would pass float16's maximum (65504) is extrapolated from a
power-law fit of the measured largest entries over the largest N of the grid.
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from pathlib import Path

import torch

from ..cliargs import positive_int
from . import files, machine
from .core import INSTALL_HINT, dtype_option, dtypes, markdown_table, missing_modules
from .figures import figure, log_axes

HELP = (
    "mean norms of the efficient form's intermediates vs N and d, with and without the "
    "paper's normalisation (its Table 1 / Figure 5)"
)

INTERMEDIATES = ("A_mod", "squared", "linear", "denominator", "output")
LABELS = {
    "A_mod": "(K⊠K)ᵀV' = A_mod",
    "squared": "(QKᵀ)²V'",
    "linear": "QKᵀV'",
    "denominator": "Y_denom",
    "output": "Y",
}
# The paper's Table 1 (plain intermediates; fitted, not derived), as text and as a function.
PAPER_TEXT = {
    "A_mod": "(N+1)/√d",
    "squared": "N/d",
    "linear": "√N (4d+1)/(4d)",
    "denominator": "N (d+2)/(2d)",
    "output": "√(d/N)",
}
VARIANTS = ("plain", "normalised")
VALUES = ("sphere", "gaussian")
DTYPES = dtypes("float64", "float32")
FLOAT16_MAX = 65504.0
DEFAULT_N = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536)
DEFAULT_D = (8, 16, 32, 64)
QUICK_N = (1, 4, 16, 64, 256, 1024, 4096)
QUICK_D = (4, 8, 16)
MAX_D = 256
KEY_CHUNK = 4096
# Points of the grid (the largest N) that the overflow extrapolation fits.
FIT_POINTS = 3


def paper_formula(name: str, n: int, d: int) -> float:
    """The paper's Table 1 value of an intermediate's mean size (plain, unit-sphere rows)."""
    return {
        "A_mod": (n + 1) / math.sqrt(d),
        "squared": n / d,
        "linear": math.sqrt(n) * (4 * d + 1) / (4 * d),
        "denominator": n * (d + 2) / (2 * d),
        "output": math.sqrt(d / n),
    }[name]


def predicted(name: str, variant: str, n: int, d: int, values: str = "sphere") -> float:
    """Our root-mean-square size of an intermediate (exact, except ``output``: large-N ≈).

    q, k uniform on the unit sphere; v on the unit sphere (m = E‖v‖² = 1) or standard normal
    (m = d). Denominator: the exact mean. Output: Σ w v / Σ w ≈ sqrt(m E w² / N) / E w.
    """
    m = 1.0 if values == "sphere" else float(d)
    s2, s4 = 1 / d, 3 / (d * (d + 2))  # E s², E s⁴ of s = q·k
    ew = 1 + s2 / 2  # E w(s), w = 1 + s + s²/2
    ew2 = 1 + 2 * s2 + s4 / 4  # E w(s)²
    if variant == "plain":
        sq = {
            "A_mod": n * (1 + m) + n * (n - 1) * s2,
            "squared": n * (1 + m) * s4 + n * (n - 1) * s2 * s2,
            "linear": n * (1 + m) * s2,
        }
        if name in sq:
            return math.sqrt(sq[name])
        if name == "denominator":
            return n * ew
        return math.sqrt(m * ew2 / n) / ew
    # Algorithm 1: V̂_j = [c, v_j]/N with c² = d/N; Q̂·K̂ = √d s; coefficients (½, √d, d).
    c2 = d / n
    sq = {
        "A_mod": d * (n * (c2 + m) + n * (n - 1) * c2 * s2) / n**2,
        "squared": d * d * (n * (c2 + m) * s4 + n * (n - 1) * s2 * s2 * c2) / n**2,
        "linear": d * n * s2 * (c2 + m) / n**2,
    }
    if name in sq:
        return math.sqrt(sq[name])
    if name == "denominator":
        return d * math.sqrt(c2) * ew
    return math.sqrt(m * ew2 / d) / ew


def draw(n: int, d: int, values: str, dtype: torch.dtype, generator: torch.Generator):
    """Q, K (N, d) with rows uniform on the unit sphere; V likewise or standard normal."""

    def sphere():
        x = torch.randn(n, d, generator=generator, dtype=torch.float64)
        return (x / torch.linalg.vector_norm(x, dim=-1, keepdim=True)).to(dtype)

    q, k = sphere(), sphere()
    v = sphere() if values == "sphere" else torch.randn(n, d, generator=generator).to(dtype)
    return q, k, v


def tensor_square(x: torch.Tensor) -> torch.Tensor:
    """x⊠x: row-wise outer products, flattened: (N, d) -> (N, d²) (Algorithm 1, lines 1-3)."""
    n, d = x.shape
    return (x.reshape(n, d, 1) * x.reshape(n, 1, d)).reshape(n, d * d)


def intermediates(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, variant: str, queries: int
) -> dict[str, tuple[float, float]]:
    """{name: (mean norm, largest |entry|)} of one draw, with or without the normalisation.

    The key-side sums run over all N keys (in chunks of KEY_CHUNK rows); the query-side
    means over the first ``queries`` query rows (the rows are exchangeable).
    """
    n, d = k.shape
    ones = torch.ones(n, 1, dtype=v.dtype)
    if variant == "plain":
        qh, kh, vh = q, k, torch.cat([ones, v], dim=-1)
        c_lin, c_const = 1.0, 1.0
    else:
        alpha = d**0.25
        qh = alpha * q / torch.linalg.vector_norm(q, dim=-1, keepdim=True)
        kh = alpha * k / torch.linalg.vector_norm(k, dim=-1, keepdim=True)
        vh = torch.cat([math.sqrt(d / n) * ones, v], dim=-1) / n
        c_lin, c_const = alpha**2, alpha**4

    a_mod = torch.zeros(d * d, d + 1, dtype=v.dtype)
    for j in range(0, n, KEY_CHUNK):
        a_mod += tensor_square(kh[j : j + KEY_CHUNK]).T @ vh[j : j + KEY_CHUNK]
    kv = kh.T @ vh  # (d, d+1)
    column_sum = vh.sum(0)  # (d+1,)

    qs = qh[:queries]
    squared = tensor_square(qs) @ a_mod  # (M, d+1)
    linear = qs @ kv
    y_hat = 0.5 * squared + c_lin * linear + c_const * column_sum
    denominator = y_hat[:, 0]
    output = y_hat[:, 1:] / denominator[:, None]

    def rows(x):
        return torch.linalg.vector_norm(x, dim=-1).mean().item(), x.abs().max().item()

    return {
        "A_mod": (torch.linalg.vector_norm(a_mod).item(), a_mod.abs().max().item()),
        "squared": rows(squared),
        "linear": rows(linear),
        "denominator": (denominator.abs().mean().item(), denominator.abs().max().item()),
        "output": rows(output),
    }


def measure(
    ns, ds, seeds: int, dtype: torch.dtype, values: str, queries: int, progress=None
) -> list[dict]:
    """One row per (variant, intermediate, d, N): mean norm over draws, spread, largest entry."""
    out = []
    for d in ds:
        for n in ns:
            found = {(var, name): [] for var in VARIANTS for name in INTERMEDIATES}
            for s in range(seeds):
                g = torch.Generator().manual_seed(1_000_003 * s + 1009 * n + d)
                q, k, v = draw(n, d, values, dtype, g)
                for var in VARIANTS:
                    for name, value in intermediates(q, k, v, var, queries).items():
                        found[var, name].append(value)
            for (var, name), draws in found.items():
                norms = [x for x, _ in draws]
                mean = sum(norms) / len(norms)
                spread = (
                    math.sqrt(sum((x - mean) ** 2 for x in norms) / (len(norms) - 1))
                    if len(norms) > 1
                    else 0.0
                )
                pred = predicted(name, var, n, d, values)
                out.append(
                    {
                        "variant": var,
                        "intermediate": name,
                        "d": d,
                        "n": n,
                        "mean_norm": mean,
                        "std_over_draws": spread,
                        "max_abs": max(m for _, m in draws),
                        "predicted": pred,
                        "measured_over_predicted": mean / pred,
                        "paper": paper_formula(name, n, d) if var == "plain" else None,
                    }
                )
            if progress is not None:
                progress(d, n)
    return out


def overflow_length(points: list[tuple[int, float]]) -> tuple[float | None, float]:
    """(N at which the largest entry reaches FLOAT16_MAX, fitted exponent) from (N, max|x|).

    A least-squares line in (log N, log max) over the last FIT_POINTS points; None when the
    exponent is below 0.05 (the entries do not grow with N). Already over inside the grid:
    interpolated in (log N, log max) between the last point below and the first above.
    """
    points = sorted((n, m) for n, m in points if n > 0 and m > 0)
    first_over = next((i for i, (_, m) in enumerate(points) if m >= FLOAT16_MAX), None)
    over = None
    if first_over == 0:
        over = float(points[0][0])
    elif first_over is not None:
        (n0, m0), (n1, m1) = points[first_over - 1], points[first_over]
        t = math.log(FLOAT16_MAX / m0) / math.log(m1 / m0)
        over = math.exp(math.log(n0) + t * math.log(n1 / n0))
    tail = points[-FIT_POINTS:]
    if len(tail) < 2:
        return over, math.nan
    xs = [math.log(n) for n, _ in tail]
    ys = [math.log(m) for _, m in tail]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    if over is not None:
        return over, slope
    if slope < 0.05:
        return None, slope
    return math.exp(mx + (math.log(FLOAT16_MAX) - my) / slope), slope


def overflow_table(rows: list[dict]) -> list[dict]:
    table = []
    keys = sorted(
        {(r["variant"], r["intermediate"], r["d"]) for r in rows},
        key=lambda k: (VARIANTS.index(k[0]), INTERMEDIATES.index(k[1]), k[2]),
    )
    for var, name, d in keys:
        pts = [
            (r["n"], r["max_abs"])
            for r in rows
            if (r["variant"], r["intermediate"], r["d"]) == (var, name, d)
        ]
        n_over, slope = overflow_length(pts)
        table.append(
            {
                "variant": var,
                "intermediate": name,
                "d": d,
                "max_abs_at_largest_n": max(pts)[1],
                "growth_exponent": slope,
                "float16_overflow_n": n_over,
            }
        )
    return table


# Outputs.


def _num(x: float | None) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    return f"{x:.3g}"


def _overflow_text(n: float | None) -> str:
    return "never (does not grow with N)" if n is None else f"{n:,.0f}"


def report_markdown(result: dict) -> str:
    rows, settings = result["rows"], result["settings"]
    ns, ds = settings["n"], settings["d"]
    by = {(r["variant"], r["intermediate"], r["d"], r["n"]): r for r in rows}
    out = [
        "# Size of the efficient form's intermediates (TaylorShift Table 1 / Figure 5)",
        "",
        f"Command: `{result['command']}`  ",
        f"Machine: {result['machine']['cpu_model']}, torch {result['machine']['torch']}",
        "",
        f"Rows of Q, K uniform on the unit sphere, V {settings['values_text']}; "
        f"{settings['seeds']} draws per (N, d), {settings['dtype']}, query-side means over "
        f"at most {settings['queries']} query rows. *plain*: Eq. (3) with V' = [1, V]; "
        "*normalised*: Algorithm 1 (q, k normalised, times α = d^¼, V' = [√(d/N) 1, V]/N, "
        "coefficients ½, √d, d). Each cell: measured mean norm (our predicted RMS value); "
        "A_mod is one matrix (its norm), Y_denom the mean of |Y_denom|.",
        "",
        "![mean norms](scaling.png)",
        "",
    ]
    for var in VARIANTS:
        for d in ds:
            out += [f"## {var}, d = {d}", ""]
            table = []
            for n in ns:
                table.append(
                    [n]
                    + [
                        f"{_num(by[var, name, d, n]['mean_norm'])} "
                        f"({_num(by[var, name, d, n]['predicted'])})"
                        for name in INTERMEDIATES
                    ]
                )
            out += [markdown_table(["N", *[LABELS[x] for x in INTERMEDIATES]], table), ""]
    n_last = ns[-1]
    out += [
        f"## Against the paper's Table 1 (plain, N = {n_last})",
        "",
        "The paper's formulas were fitted to its measurements (Appendix B.2); ours are "
        "derived for the setting above (docs/bench-scaling.md).",
        "",
    ]
    table = []
    for name in INTERMEDIATES:
        for d in ds:
            r = by["plain", name, d, n_last]
            table.append(
                [
                    LABELS[name],
                    d,
                    _num(r["mean_norm"]),
                    _num(r["predicted"]),
                    f"{PAPER_TEXT[name]} = {_num(r['paper'])}",
                    _num(r["mean_norm"] / r["paper"]),
                ]
            )
    out += [
        markdown_table(
            ["intermediate", "d", "measured", "ours", "paper", "measured / paper"], table
        ),
        "",
        "## float16 overflow",
        "",
        f"The N from which an intermediate's largest entry passes float16's maximum "
        f"({FLOAT16_MAX:g}): interpolated where the grid passes it, else extrapolated from a "
        f"power law fitted to the largest entries at the {FIT_POINTS} largest N (exponent "
        "shown).",
        "",
    ]
    table = [
        [
            r["variant"],
            LABELS[r["intermediate"]],
            r["d"],
            _num(r["max_abs_at_largest_n"]),
            _num(r["growth_exponent"]),
            _overflow_text(r["float16_overflow_n"]),
        ]
        for r in result["overflow"]
    ]
    out += [
        markdown_table(
            ["variant", "intermediate", "d", f"max |x| at N={n_last}", "exponent", "overflow N"],
            table,
        ),
        "",
    ]
    return "\n".join(out)


def make_figure(result: dict):
    """Figure 5's layout: one log-log panel per d, a colour per intermediate, solid plain,
    dashed normalised, dotted our prediction; the float16 maximum as a grey line."""
    rows, ds = result["rows"], result["settings"]["d"]
    cols = min(4, len(ds))
    nrows = math.ceil(len(ds) / cols)
    fig = figure(4.2 * cols, 3.4 * nrows + 1.2)
    axes = fig.subplots(nrows, cols, squeeze=False).ravel()
    colours = dict(zip(INTERMEDIATES, ("C0", "C1", "C2", "C3", "C4"), strict=True))
    for ax, d in zip(axes, ds, strict=False):
        for name in INTERMEDIATES:
            for var, style in (("plain", "-"), ("normalised", "--")):
                pts = sorted(
                    (r["n"], r["mean_norm"], r["predicted"])
                    for r in rows
                    if (r["variant"], r["intermediate"], r["d"]) == (var, name, d)
                )
                ns = [p[0] for p in pts]
                ax.plot(
                    ns,
                    [p[1] for p in pts],
                    style,
                    color=colours[name],
                    marker=".",
                    label=f"{LABELS[name]} ({var})",
                )
                ax.plot(ns, [p[2] for p in pts], ":", color=colours[name], linewidth=0.8)
        ax.axhline(FLOAT16_MAX, color="grey", linewidth=0.8)
        log_axes(ax, x_base=10)
        ax.set_title(f"d = {d}")
        ax.set_xlabel("N")
        ax.set_ylabel("mean norm")
        ax.grid(True, which="major", alpha=0.3)
    for ax in axes[len(ds) :]:
        ax.set_visible(False)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=5, fontsize="small", frameon=False)
    fig.suptitle(
        "Mean norm of efficient-TaylorShift intermediates: solid plain, dashed normalised "
        "(Algorithm 1),\ndotted predicted; grey: float16 max",
        fontsize="medium",
    )
    return fig


def write_outputs(
    results: dict, out: str | Path, plots: bool = True, *, plot: bool | None = None
) -> list[Path]:
    """results.json, results.csv, report.md and (``plots``) scaling.png, written atomically."""
    if plot is not None:
        warnings.warn(
            "write_outputs(..., plot=) is now write_outputs(..., plots=)",
            DeprecationWarning,
            stacklevel=2,
        )
        plots = plot
    figure = ("scaling.png", make_figure) if plots else None
    return files.write_results(out, results, results["rows"], report_markdown, figure=figure)


# Command line.


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--n",
        nargs="+",
        type=positive_int,
        metavar="N",
        help=f"sequence lengths (default: {' '.join(map(str, DEFAULT_N))}; "
        f"--quick: up to {QUICK_N[-1]})",
    )
    parser.add_argument(
        "--d",
        nargs="+",
        type=positive_int,
        metavar="D",
        help=f"head dims, at most {MAX_D} (default: {' '.join(map(str, DEFAULT_D))}; "
        f"--quick: {' '.join(map(str, QUICK_D))})",
    )
    parser.add_argument(
        "--seeds", type=positive_int, help="random draws per (N, d) (default: 3; --quick: 2)"
    )
    parser.add_argument(
        "--dtype",
        type=dtype_option,
        choices=sorted(DTYPES),
        default="float64",
        help="dtype of the inputs and sums (default: float64; fp64, fp32 accepted)",
    )
    parser.add_argument(
        "--values",
        choices=VALUES,
        default="sphere",
        help="rows of V: uniform on the unit sphere as the paper states (default), or "
        "standard normal (norm ≈ √d)",
    )
    parser.add_argument(
        "--queries",
        type=positive_int,
        default=1024,
        help="query rows the query-side means run over (default: %(default)s)",
    )
    parser.add_argument("--quick", action="store_true", help="a smaller grid: seconds, not minutes")
    files.add_output_options(parser, "bench-scaling")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    big = [d for d in args.d or () if d > MAX_D]
    if big:
        parser.error(f"--d expected head dims of at most {MAX_D}; got {', '.join(map(str, big))}")
    if not args.no_plots and missing_modules("matplotlib"):
        print(
            "bench scaling draws its figure with matplotlib, which is not installed: "
            f"{INSTALL_HINT} (or pass --no-plot)",
            file=sys.stderr,
        )
        return 1
    ns = sorted(set(args.n or (QUICK_N if args.quick else DEFAULT_N)))
    ds = sorted(set(args.d or (QUICK_D if args.quick else DEFAULT_D)))
    seeds = args.seeds or (2 if args.quick else 3)
    out = files.fresh_folder(args.out, args.overwrite, parser)  # (before any measurement)

    def progress(d, n):
        print(f"  d={d} N={n}", file=sys.stderr, flush=True)

    rows = measure(ns, ds, seeds, DTYPES[args.dtype], args.values, args.queries, progress)
    result = {
        "machine": machine.machine_info("cpu"),
        "command": machine.command_line(),
        "settings": {
            "n": ns,
            "d": ds,
            "seeds": seeds,
            "dtype": args.dtype,
            "values": args.values,
            "values_text": "uniform on the unit sphere"
            if args.values == "sphere"
            else "standard normal",
            "queries": args.queries,
            "paper_table1": PAPER_TEXT,
        },
        "rows": rows,
        "overflow": overflow_table(rows),
    }
    written = write_outputs(result, out, plots=not args.no_plots)
    print(f"Wrote {', '.join(str(p) for p in written)}")
    print()
    print("float16 overflow (N from which the largest entry passes 65504):")
    for r in result["overflow"]:
        if r["intermediate"] in ("A_mod", "denominator", "squared"):
            print(
                f"  {r['variant']:>10}  {LABELS[r['intermediate']]:<18} d={r['d']:<4} "
                f"{_overflow_text(r['float16_overflow_n'])}"
            )
    return 0
