"""The op sweep's report: results.csv, report.md (tables, findings generated from the
numbers, the method, the machine), the plots, and the summary printed at the end."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from ...cliargs import format_table
from ...vocab import PASSES
from .. import files
from ..core import GIB, MIB, OK, markdown_table, ms
from ..load import NOISY_SHARE, QUIET_SHARE
from .analysis import analyse, best, impl_names, label, theory_by_d
from .plots import figure, figure_names

__all__ = ["CSV_COLUMNS", "findings", "report_markdown", "summary", "write_outputs"]


CSV_COLUMNS = (
    "kind",
    "impl",
    "family",
    "pass",
    "dtype",
    "device",
    "d",
    "n",
    "heads",
    "batch",
    "status",
    "reason",
    "median_s",
    "min_s",
    "max_s",
    "q1_s",
    "q3_s",
    "reps",
    "warmup_calls",
    "clock",
    "other_cpu_share",
    "peak_extra_bytes",
    "method",
    "call_s",
    "predicted_call_s",
    "predicted_peak_bytes",
    "model_flops",
    "gflops",
    "sdpa_backend",
    "error",
)


def _point_index(results: dict) -> dict[tuple, dict]:
    return {
        (p["kind"], p["impl"], p["dtype"], p["pass"], p["d"], p["n"]): p for p in results["points"]
    }


def _cell_time(p: dict | None) -> str:
    if p is None:
        return "–"
    if p["status"] != OK:
        return p["status"]
    return f"{ms(p['median_s'])} [{ms(p['min_s'])}, {ms(p['max_s'])}]"


def _ratio(a: float | None, b: float | None) -> str:
    if not a or not b:
        return "–"
    return f"{a / b:.2f}"


def _groups(results: dict, kind: str) -> list[tuple[str, str, int]]:
    keys = {(p["dtype"], p["pass"], p["d"]) for p in results["points"] if p["kind"] == kind}
    return sorted(keys, key=lambda g: (g[0], g[2], PASSES.index(g[1])))


def _time_tables(results: dict) -> list[str]:
    index = _point_index(results)
    names = impl_names(results, "time")
    out = []
    for dtype, pass_name, d in _groups(results, "time"):
        ns = sorted({p["n"] for p in results["points"] if p["kind"] == "time" and p["d"] == d})
        headers = ["N", *[f"{label(results, n)} ms" for n in names]]
        effs = [
            n
            for n in names
            if results["implementations"].get(n, {}).get("family") == "taylorshift-efficient"
        ]
        for e in effs:
            headers += [f"{e} / direct", f"{e} / best softmax"]
        rows = []
        pts = [
            p
            for p in results["points"]
            if (p["kind"], p["dtype"], p["pass"], p["d"]) == ("time", dtype, pass_name, d)
        ]
        for n in ns:
            row: list[object] = [n]
            row += [_cell_time(index.get(("time", name, dtype, pass_name, d, n))) for name in names]
            for e in effs:
                mine = index.get(("time", e, dtype, pass_name, d, n))
                t = mine["median_s"] if mine and mine["status"] == OK else None
                row.append(_ratio(t, best(pts, "taylorshift-direct", "median_s").get(n)))
                row.append(_ratio(t, best(pts, "softmax", "median_s").get(n)))
            rows.append(row)
        out.append(f"### d = {d}, {pass_name}, {dtype}\n")
        out.append(markdown_table(headers, rows, "r" * len(headers)) + "\n")
    return out


def _impl_tables(results: dict, kind: str, unit: str, value) -> list[str]:
    """Per dtype, pass and d a table of N against the implementations, a cell per point:
    ``value(point)`` where it was measured, else its status."""
    index = _point_index(results)
    names = impl_names(results, kind)
    out = []
    for dtype, pass_name, d in _groups(results, kind):
        ns = sorted({p["n"] for p in results["points"] if p["kind"] == kind and p["d"] == d})
        rows = []
        for n in ns:
            row: list[object] = [n]
            for name in names:
                p = index.get((kind, name, dtype, pass_name, d, n))
                if p is None:
                    row.append("–")
                elif p["status"] != OK:
                    row.append(p["status"])
                else:
                    row.append(value(p))
            rows.append(row)
        out.append(f"### d = {d}, {pass_name}, {dtype}\n")
        headers = ["N", *[f"{label(results, n)} {unit}" for n in names]]
        out.append(markdown_table(headers, rows, "r" * len(headers)) + "\n")
    return out


def _memory_tables(results: dict) -> list[str]:
    return _impl_tables(results, "memory", "MiB", lambda p: f"{p['peak_extra_bytes'] / MIB:.1f}")


def _gflops_tables(results: dict) -> list[str]:
    """Achieved GFLOP/s (results from before model FLOPs were recorded have none)."""
    if not any("gflops" in p for p in results["points"]):
        return []
    return _impl_tables(results, "time", "GFLOP/s", lambda p: f"{p['gflops']:.3g}")


def _vs_theory(n: float | None, ref: int) -> str:
    return f"{n / ref:.2f}×" if n else "–"


def _crossovers_with_theory(results: dict) -> Iterator[tuple[dict, dict]]:
    """Each crossover (recorded, or analysed from the points) with the theory of its d;
    crossovers at a d without theory are skipped."""
    theory_d = theory_by_d(results)
    for c in results.get("crossovers") or analyse(results):
        th = theory_d.get(c["d"])
        if th is not None:
            yield c, th


def _crossover_rows(results: dict) -> list[list[object]]:
    rows = []
    for c, th in _crossovers_with_theory(results):
        if c["metric"] == "time":
            refs = f"N0 {th['n0']} · sym {th['n0_symmetric']} · A100 {th['n0_a100_estimate']}"
            ratio = _vs_theory(c["n"], th["n0"])
        else:
            refs = f"N1 {th['n1']} · sym {th['n1_symmetric']}"
            ratio = _vs_theory(c["n"], th["n1"])
        rows.append(
            [
                c["metric"],
                c["d"],
                c["pass"],
                c["dtype"],
                f"{c['challenger']} vs {c['baseline']}",
                c["text"],
                ratio,
                refs,
            ]
        )
    return rows


def findings(results: dict) -> list[str]:
    """Short sentences generated from the numbers: what a reader should take away."""
    out = []
    for c, th in _crossovers_with_theory(results):
        what = "faster than" if c["metric"] == "time" else "leaner than"
        base = "direct TaylorShift" if c["baseline"] == "direct" else "the best softmax"
        where = f"d = {c['d']}, {c['pass']}, {c['dtype']}"
        ref_name, ref = ("N0", th["n0"]) if c["metric"] == "time" else ("N1", th["n1"])
        sym = th["n0_symmetric"] if c["metric"] == "time" else th["n1_symmetric"]
        if c["status"] == "crossed":
            text = (
                f"{where}: {c['challenger']} is {what} {base} from N ≈ {c['n']:.0f} "
                f"(between {c['n_below']} and {c['n_above']}); theory {ref_name} = {ref} "
                f"(× {c['n'] / ref:.2f}), symmetric {sym}"
            )
            if c["sign_changes"] > 1:
                text += f"; the winner changed {c['sign_changes']} times along the grid (noise?)"
        elif c["status"] == "above":
            text = f"{where}: {c['challenger']} is not {what} {base} up to N = {c['n_below']}"
            text += f" (theory {ref_name} = {ref})"
        elif c["status"] == "below":
            text = (
                f"{where}: {c['challenger']} is {what} {base} at every N measured, from "
                f"N = {c['n_above']} (theory {ref_name} = {ref})"
            )
        else:
            continue
        out.append(text + ".")
    backends = sorted({b["backend"] for b in results.get("sdpa_backends", [])})
    if backends:
        out.append(f"SDPA ran with the {', '.join(backends)} backend(s) (torch's choice).")
    counts: dict[str, int] = {}
    for p in results["points"]:
        if p["status"] != OK:
            counts[p["status"]] = counts.get(p["status"], 0) + 1
    if counts:
        parts = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
        out.append(f"Points not measured: {parts} (listed at the end).")
    again = sum("remeasured_after_sweep" in p for p in results["points"])
    if again:
        out.append(
            f"{again} time points were timed once more after the sweep, on a quieter machine "
            "(--remeasure-noisy; the earlier times are in remeasured_after_sweep)."
        )
    noisy = [p for p in results["points"] if (p.get("other_cpu_share") or 0) > NOISY_SHARE]
    if noisy:
        out.append(
            f"{len(noisy)} time points ran while other processes used more than "
            f"{NOISY_SHARE:.0%} of the CPUs: their times are less reliable."
        )
    if not results.get("complete", True):
        out.append("The sweep did not complete (interrupted or crashed): results are partial.")
    return out


def report_markdown(results: dict, figures: Sequence[str] = ()) -> str:
    m = results["machine"]
    cfg = results["config"]
    hw = m.get("gpu") or m.get("cpu_model")
    lines = [
        "# TaylorShift op benchmark: time and peak memory vs sequence length",
        "",
        f"Recorded {results.get('created', '?')} in {results.get('elapsed_s', 0):.0f} s"
        + (" (--quick)" if cfg.get("quick") else "")
        + ".",
        "",
        "## Machine",
        "",
        f"- device {m.get('device')}: {hw}; {m.get('logical_cpus')} logical CPUs, "
        f"torch threads {m.get('torch_threads')}, {m.get('memory_gib')} GiB RAM"
        + (f"; GPU memory {m['gpu_memory_gib']} GiB, CUDA {m.get('cuda')}" if m.get("gpu") else ""),
        f"- {m.get('platform')}; Python {m.get('python')}; torch {m.get('torch')} "
        f"(CPU capability {m.get('torch_cpu_capability')}); taylorshift {m.get('taylorshift')}"
        + (f"; triton {m['triton']}" if m.get("triton") else "")
        + (f"; CPU kernels {m['cpu_kernels']}" if m.get("cpu_kernels") else ""),
        f"- source: git {m.get('git_revision')}; package sources sha256 {m.get('sources_sha256')}",
        f"- load average (1 min) {_load(results.get('loadavg_start'))} at the start, "
        f"{_load(results.get('loadavg_end'))} at the end"
        + _busy(results.get("other_cpu_share_start")),
        "",
        "## Command",
        "",
        "```",
        results.get("command", ""),
        "```",
        "",
        "## Method",
        "",
        f"- Inputs (B, H, N, d) = ({cfg['batch']}, {cfg['heads']}, N, d), standard normal, "
        f"dv = d, no mask, non-causal; dtypes {', '.join(cfg['dtypes'])}.",
        "- Implementations: "
        + "; ".join(f"`{n}` = {label(results, n)}" for n in results.get("implementations", {}))
        + ". TaylorShift with its defaults (normalize=True, order 2).",
        f"- Time: `taylorshift.bench.measure.time_call` — warm-up, then {cfg['min_reps']}–"
        f"{cfg['max_reps']} calls (about {cfg['target_s']:g} s per point), median and "
        "[min, max]. forward+backward = the forward and `torch.autograd.grad` of q, k, v "
        "with a fixed output gradient.",
        *_quiet_method(results),
        "- Memory: peak extra memory of one call (inputs excluded, outputs and gradients "
        "included), "
        + (
            "a fresh process per point reading its resident-set high-water mark (VmHWM)"
            if torch.device(cfg["device"]).type == "cpu"
            else "`torch.cuda.max_memory_allocated`"
        )
        + f"; d = {', '.join(map(str, cfg['memory_ds']))}.",
        f"- Budgets: a point predicted to take more than {cfg['max_call_s']:g} s per call or "
        f"{cfg['max_memory_bytes'] / GIB:.3g} GiB is `over budget` and ends its series (the "
        f"rest `skipped`), as does out of memory; the sweep stops measuring after "
        f"{cfg['budget_s']:g} s.",
        "- Crossovers: where log(efficient / baseline) changes sign for the last time, "
        "interpolated in log-log between grid points; baseline = the best direct or the "
        "best softmax implementation at each N. Theory from `taylorshift.theory` (paper "
        "N0, N1; our symmetric form; the paper's A100 estimate N0 + 18 d).",
        "",
        "## Crossovers (measured vs theory)",
        "",
        markdown_table(
            ["metric", "d", "pass", "dtype", "comparison", "measured N", "÷ N0 or N1", "theory"],
            _crossover_rows(results),
            align="lrllllrl",
        ),
        "",
        "## Findings (generated from the numbers)",
        "",
        *[f"- {f}" for f in findings(results)],
        "",
    ]
    if figures:
        lines += ["## Figures", "", *[f"![{f}]({f})" for f in figures], ""]
    time_tables = _time_tables(results)
    if time_tables:
        lines += ["## Time per call (ms: median [min, max])", "", *time_tables]
    gflops_tables = _gflops_tables(results)
    if gflops_tables:
        lines += [
            "## Achieved GFLOP/s (model FLOPs / median time; `model_flops` in results.csv)",
            "",
            *gflops_tables,
        ]
    memory_tables = _memory_tables(results)
    if memory_tables:
        lines += ["## Peak extra memory of one call (MiB)", "", *memory_tables]
    if results.get("sdpa_backends"):
        lines += ["## SDPA backend", ""]
        lines += [
            f"- d = {b['d']}, {b['pass']}, {b['dtype']}: {b['backend']}"
            for b in results["sdpa_backends"]
        ]
        lines.append("")
    missing = [p for p in results["points"] if p["status"] != OK]
    lines += ["## Points not measured", ""]
    if not missing:
        lines.append("None.")
    for p in missing:
        lines.append(
            f"- {p['kind']} {p['impl']} {p['pass']} {p['dtype']} d={p['d']} N={p['n']}: "
            f"{p['status']}" + (f" ({p['reason']})" if p.get("reason") else "")
        )
    return "\n".join(lines) + "\n"


def _quiet_method(results: dict) -> list[str]:
    """The method line of the quiet gate, where the sweep used it (CPU)."""
    cfg = results["config"]
    before, again = cfg.get("quiet_before_s") or 0, cfg.get("remeasure_noisy")
    if not (before or again):
        return []
    text = "- Quiet gate: "
    if before:
        text += (
            f"before each time point the sweep waited up to {before:g} s for other processes "
            f"to use at most {QUIET_SHARE:.0%} of the CPUs; "
        )
    text += f"a point timed while they used more than {NOISY_SHARE:.0%} was timed again"
    if again:
        text += ", and once more after the sweep if still above (`--remeasure-noisy`)"
    waited = results.get("quiet_waited_s") or 0.0
    return [text + f"; {waited:.0f} s waited in all (`--quiet-wait-s` {cfg['quiet_wait_s']:g})."]


def _load(value) -> str:
    return f"{value[0]:.2f}" if value else "?"


def _busy(share: float | None) -> str:
    if share is None:
        return ""
    return f"; other processes used {share:.0%} of the CPUs just before the sweep"


def write_outputs(
    results: dict, out: str | os.PathLike, *, plots: bool = True, json_file: bool = True
) -> list[Path]:
    """results.json (unless ``json_file=False``), results.csv, report.md and the PNGs."""
    out = Path(out)
    written = []
    if json_file:
        written.append(files.write_json(out / "results.json", results))
    written.append(files.write_csv(out / "results.csv", results["points"], CSV_COLUMNS))
    figures = []
    if plots:
        for name, kind, dtype, pass_name in figure_names(results):
            fig = figure(results, kind, dtype, pass_name)
            if fig is not None:
                written.append(files.write_figure(out / name, fig))
                figures.append(name)
    written.append(files.write_text(out / "report.md", report_markdown(results, figures)))
    return written


def summary(results: dict) -> str:
    """The crossover table printed at the end of a run."""

    rows = []
    theory_d = theory_by_d(results)
    by_key: dict[tuple, dict[str, str]] = {}
    for c in results.get("crossovers") or analyse(results):
        key = (c["metric"], c["d"], c["pass"], c["dtype"], c["challenger"])
        by_key.setdefault(key, {})[c["baseline"]] = c["text"]
    for (metric, d, pass_name, dtype, challenger), texts in by_key.items():
        th = theory_d.get(d, {})
        if metric == "time":
            refs = [th.get("n0"), th.get("n0_symmetric"), th.get("n0_a100_estimate")]
        else:
            refs = [th.get("n1"), th.get("n1_symmetric"), ""]
        rows.append(
            [
                metric,
                d,
                pass_name,
                dtype,
                challenger,
                texts.get("direct", "n/a"),
                texts.get("softmax", "n/a"),
                *refs,
            ]
        )
    headers = [
        "metric",
        "d",
        "pass",
        "dtype",
        "impl",
        "vs direct",
        "vs best softmax",
        "paper N0/N1",
        "symmetric",
        "A100 N0+18d",
    ]
    if not rows:
        return "No crossovers: nothing was measured."
    return (
        "Crossovers: the N from which the efficient form is faster (time) or leaner "
        "(memory) than\nthe direct form and than the best softmax; beside them the cost "
        "model's N0 (time) or N1 (memory),\nfor the paper's form and our symmetric one, and "
        "the paper's measured A100 estimate N0 + 18 d\n\n" + format_table(headers, rows)
    )
