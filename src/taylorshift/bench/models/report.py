"""The files of ``bench models``: results.json, results.csv (one flat row per model row),
report.md (tables with units, Pareto fronts, the machine, the command) and the PNGs; the
summary printed at the end."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Sequence
from pathlib import Path

from .. import files
from ..core import OK, markdown_table, mib
from .pareto import METRICS
from .plots import plot_curves, plot_heads, plot_pareto

__all__ = ["report_markdown", "summary", "write_outputs"]


def _flat(row: dict) -> dict:
    """A row for CSV: the curve as 'batch:samples/s' pairs, overrides as JSON."""
    flat = {k: v for k, v in row.items() if k not in ("curve", "errors", "overrides")}
    flat["overrides"] = json.dumps(row.get("overrides", {}), sort_keys=True)
    flat["curve"] = " ".join(
        f"{p['batch']}:{p['samples_per_s']:.6g}"
        if p["status"] == OK
        else f"{p['batch']}:{p['status']}"
        for p in row.get("curve", [])
    )
    return flat


def _si(value: float | None, unit: str = "") -> str:
    if value is None:
        return "–"
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}".rstrip()
    return f"{value:.3g} {unit}".rstrip()


def _cell(row: dict, status_key: str, text: str) -> str:
    status = row.get(status_key)
    return text if status == OK else (status or "–")


def _rate(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _step_ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1e3:.4g}"


# The columns both tables end with: (header, cell of a row).
_MEASURED = (
    ("throughput (samples/s)", lambda r: _cell(r, "throughput_status", _rate(r["throughput"]))),
    ("best batch", lambda r: "–" if r["best_batch"] is None else str(r["best_batch"])),
    ("train step (ms)", lambda r: _cell(r, "train_status", _step_ms(r["train_step_s"]))),
    ("train memory (MiB)", lambda r: _cell(r, "train_memory_status", mib(r["train_memory_bytes"]))),
    (
        "inference memory (MiB)",
        lambda r: _cell(r, "inference_memory_status", mib(r["inference_memory_bytes"])),
    ),
    ("accuracy (%)", lambda r: "–" if r["accuracy"] is None else f"{r['accuracy']:.2f}"),
)


def _table(first: Sequence[tuple[str, object]], rows: Sequence[dict]) -> str:
    columns = [*first, *_MEASURED]
    body = [[cell(r) for _, cell in columns] for r in rows]
    return markdown_table([header for header, _ in columns], body)


def _flops(key: str):
    return lambda r: _cell(r, "flops_status", _si(r[key]))


def _main_table(rows: Sequence[dict]) -> str:
    first = (
        ("row", lambda r: f"`{r['name']}`" + ("" if r["status"] == OK else f" ({r['status']})")),
        ("params", lambda r: _si(r["params"])),
        ("FLOPs fwd / sample", _flops("flops_forward")),
        ("FLOPs train / sample", _flops("flops_train")),
    )
    return _table(first, rows)


def _heads_table(rows: Sequence[dict]) -> str:
    first = (
        ("h", lambda r: str(r["heads"] or r["overrides"].get("num_heads"))),
        ("d = dim/h", lambda r: str(r["head_dim"] or "–")),
        ("kernel", lambda r: r["kernel"] + (f" ({r['mode']})" if r["mode"] else "")),
        ("params", lambda r: _si(r["params"])),
        ("FLOPs fwd / sample", _flops("flops_forward")),
    )
    ordered = sorted(rows, key=lambda r: (r["kernel"], r["mode"] or "", r["heads"] or 0))
    return _table(first, ordered)


def _curve_lines(rows: Sequence[dict]) -> list[str]:
    lines = []
    for r in rows:
        points = ", ".join(
            f"{p['batch']}: {_rate(p['samples_per_s'])}"
            if p["status"] == OK
            else f"{p['batch']}: {p['status']}"
            for p in r["curve"]
        )
        lines.append(f"- `{r['name']}`: {points or '–'} (stopped: {r['throughput_stop']})")
    return lines


def report_markdown(results: dict) -> str:
    """report.md: tables with units, the machine, versions and the exact command."""
    rows = [r for r in results["rows"] if r["group"] == "models"]
    heads = [r for r in results["rows"] if r["group"] == "heads"]
    cfg = results["config"]
    info = results["machine"]
    out = [
        "# Model efficiency (`taylorshift bench models`)",
        "",
        f"Command: `{results['command']}`",
        "",
        f"Device {cfg['device']}, dtype {cfg['dtype']}; training step (forward, cross-entropy, "
        f"backward, AdamW) at batch {cfg['train_batch']}; inference memory at batch 1; "
        f"throughput at the best batch of 1, 2, 4, ... ≤ {cfg['max_batch']}. "
        f"Wall time {results['elapsed_s']:.1f} s"
        + (f" of a {cfg['budget_s']:g} s budget." if cfg.get("budget_s") else "."),
        "",
        "FLOPs: `torch.utils.flop_counter.FlopCounterMode` on one sample (matrix products, "
        "convolutions, attention; elementwise work not counted); train = forward + backward. "
        "Memory: measured peak extra of one call "
        f"({_memory_method(rows + heads)}) plus the bytes of parameters, buffers and (training) "
        "AdamW state. Cells that are not numbers are statuses (oom, over budget, skipped).",
        "",
    ]
    if rows:
        out += ["## Models", "", _main_table(rows), ""]
    if heads:
        out += [
            f"## Heads at fixed width: `{heads[0]['model']}`, dim {heads[0]['dim']}, "
            f"{heads[0]['seq_len']} tokens",
            "",
            _heads_table(heads),
            "",
        ]
    out += ["## Throughput by batch size (samples/s)", "", *_curve_lines(rows + heads), ""]
    acc = results.get("accuracy")
    if acc:
        out += ["## Pareto fronts (accuracy against each metric)", ""]
        for metric in METRICS:
            names = results["pareto"].get(metric.key, [])
            shown = ", ".join(f"`{n}`" for n in names) or "–"
            out.append(f"- {metric.label} ([{metric.file}]({metric.file})): {shown}")
        if acc.get("unmatched"):
            out += [
                "",
                "Accuracy entries matching no row: "
                + ", ".join(f"`{n}`" for n in acc["unmatched"]),
            ]
        out.append("")
    sdpa = sorted({r["sdpa_backend"] for r in rows + heads if r["sdpa_backend"]})
    out += [
        "## Machine",
        "",
        markdown_table(["", ""], [[k, "–" if v is None else str(v)] for k, v in info.items()]),
        "",
        f"SDPA backend of the softmax rows: {', '.join(sdpa) if sdpa else 'n/a'}.",
        "",
    ]
    return "\n".join(out)


def _memory_method(rows: Sequence[dict]) -> str:
    methods = sorted({r["memory_method"] for r in rows if r["memory_method"]})
    return ", ".join(methods) if methods else "not measured"


def write_outputs(results: dict, out: str | Path, *, plots: bool = True) -> list[Path]:
    """results.json, results.csv, report.md and (``plots``) the PNGs, written atomically.

    The old order ``write_outputs(out, results)`` still works, with a DeprecationWarning.
    """
    if isinstance(out, dict) and isinstance(results, (str, os.PathLike)):
        warnings.warn(
            "write_outputs(out, results) is now write_outputs(results, out)",
            DeprecationWarning,
            stacklevel=2,
        )
        results, out = out, results
    out = Path(out)
    written = files.write_results(out, results, map(_flat, results["rows"]), report_markdown)
    if not plots:
        return written
    rows = results["rows"]
    written.append(files.write_figure(out / "throughput-vs-batch.png", plot_curves(rows)))
    heads = [r for r in rows if r["group"] == "heads"]
    if heads:
        written.append(files.write_figure(out / "heads-sweep.png", plot_heads(heads)))
    if any(r.get("accuracy") is not None for r in rows):
        for metric in METRICS:
            written.append(files.write_figure(out / metric.file, plot_pareto(rows, metric)))
    return written


def summary(results: dict) -> str:
    """The terminal summary: the tables of report.md."""
    rows = [r for r in results["rows"] if r["group"] == "models"]
    heads = [r for r in results["rows"] if r["group"] == "heads"]
    parts = []
    if rows:
        parts.append(_main_table(rows))
    if heads:
        parts.append(_heads_table(heads))
    parts.append(f"{len(results['rows'])} rows in {results['elapsed_s']:.1f} s")
    return "\n\n".join(parts)
