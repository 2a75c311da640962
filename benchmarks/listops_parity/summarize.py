"""Summarise the ListOps accuracy-parity runs: mean ± std of test accuracy per variant, curves.

    python benchmarks/listops_parity/summarize.py RUNS_DIR [--out DIR]

RUNS_DIR holds one run folder per (variant, seed), named ``<variant>-seed<k>`` as written by
the command in report.md; each has the metrics.jsonl of ``taylorshift train``.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from pathlib import Path

from taylorshift.bench.files import write_figure, write_json, write_text
from taylorshift.train import read_metrics

LABELS = {
    "softmax": "softmax (SDPA)",
    "direct": "TaylorShift direct",
    "efficient": "TaylorShift efficient",
}


def collect(runs: Path) -> dict:
    out: dict = defaultdict(dict)
    for run in sorted(p for p in runs.iterdir() if p.is_dir() and "-seed" in p.name):
        variant, seed = run.name.rsplit("-seed", 1)
        records = read_metrics(run)
        evals = [r for r in records if r["event"] == "eval"]
        test = [r for r in evals if r["split"] == "test"]
        out[variant][int(seed)] = {
            "test_accuracy": test[-1]["accuracy"] if test else None,
            "test_loss": test[-1]["loss"] if test else None,
            "val": [(r["step"], r["accuracy"]) for r in evals if r["split"] == "val"],
            "train": [(r["step"], r["loss"]) for r in records if r["event"] == "train"],
            "samples_per_s": statistics.median(
                r["samples_per_s"] for r in records if r["event"] == "train"
            ),
        }
    return dict(out)


def summary(results: dict) -> dict:
    rows = {}
    for variant, seeds in results.items():
        acc = [s["test_accuracy"] for s in seeds.values() if s["test_accuracy"] is not None]
        rows[variant] = {
            "seeds": sorted(seeds),
            "test_accuracy": acc,
            "mean": statistics.mean(acc) if acc else None,
            "std": statistics.stdev(acc) if len(acc) > 1 else None,
            "samples_per_s": statistics.median(s["samples_per_s"] for s in seeds.values()),
        }
    return rows


def plot(results: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4))
    ax_loss, ax_val = fig.subplots(1, 2)
    colours = {"softmax": "tab:blue", "direct": "tab:orange", "efficient": "tab:green"}
    for variant, seeds in sorted(results.items()):
        for i, (_, run) in enumerate(sorted(seeds.items())):
            label = LABELS.get(variant, variant) if i == 0 else None
            c = colours.get(variant)
            ax_loss.plot(*zip(*run["train"], strict=True), color=c, alpha=0.7, lw=1, label=label)
            ax_val.plot(
                *zip(*run["val"], strict=True), color=c, alpha=0.8, marker="o", ms=3, label=label
            )
    ax_loss.set(
        xlabel="training step",
        ylabel="training loss (cross-entropy)",
        title="Training loss, 3 seeds per variant",
    )
    ax_val.set(
        xlabel="training step",
        ylabel="validation accuracy",
        title="Validation accuracy after each epoch",
    )
    for ax in (ax_loss, ax_val):
        ax.grid(alpha=0.3)
        ax.legend()
    write_figure(path, fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = parser.parse_args()
    results = collect(args.runs)
    rows = summary(results)
    write_json(args.out / "results.json", {"summary": rows, "runs": results})
    plot(results, args.out / "curves.png")
    lines = [
        "| variant | test accuracy, mean ± std (%) | per seed (%) | train samples/s |",
        "|---|---|---|---|",
    ]
    for variant in ("softmax", "direct", "efficient"):
        r = rows.get(variant)
        if r is None or r["mean"] is None:
            continue
        per = ", ".join(f"{a * 100:.1f}" for a in r["test_accuracy"])
        std = f"{r['std'] * 100:.1f}" if r["std"] is not None else "n/a"
        lines.append(
            f"| {LABELS[variant]} | {r['mean'] * 100:.1f} ± {std} | {per} | "
            f"{r['samples_per_s']:.0f} |"
        )
    write_text(args.out / "table.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
