"""Plot and tabulate the MQAR results of run_recall.py: test accuracy vs width per sequence
length, one line per attention kernel.

    python benchmarks/recall_cpu/plot_recall.py [results.json ...] [--out recall.png]

Several results files (same setup otherwise) are read together. Per kernel × seq_len ×
width, among the learning rates run with the most seeds, the one with the best mean
*validation* accuracy is chosen (a tie: the smaller), and the *test* accuracy at that
learning rate is reported as mean ± std over its seeds (std only with at least 2 seeds).
Prints the markdown tables of the report: the chosen cells, the learning-rate sweep, the
wall times.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from taylorshift.bench.files import write_figure
from taylorshift.data.recall import recall_vocab

HERE = Path(__file__).resolve().parent
LABELS = {
    "taylorshift": "TaylorShift (τ0 = 1, paper)",
    "taylorshift-tau8": "TaylorShift (τ0 = 8)",
    "softmax": "softmax (SDPA)",
    "linear": "linear (elu+1)",
}
COLOURS = {
    "taylorshift": "tab:orange",
    "taylorshift-tau8": "tab:red",
    "softmax": "tab:blue",
    "linear": "tab:green",
}
KERNEL_ORDER = ("softmax", "taylorshift-tau8", "taylorshift", "linear")
# softmax drawn large and hollow, so that a kernel level with it stays visible
STYLES = {"softmax": {"marker": "o", "ms": 11, "mfc": "none", "ls": "--"}}


def load_points(paths: list[Path]) -> tuple[dict, list[dict]]:
    """The setup of the first file and the finished points of all; a point made before the
    learning-rate and seed sweeps takes them from its file's setup."""
    setup, rows = None, []
    for path in paths:
        results = json.loads(path.read_text())
        setup = setup or results["setup"]
        for row in results["points"].values():
            if "error" in row:
                continue
            row = dict(row)
            row.setdefault("lr", results["setup"].get("lr"))
            row.setdefault("seed", results["setup"].get("seed"))
            rows.append(row)
    return setup, rows


def kernels_of(rows: list[dict]) -> list[str]:
    found = {r["kernel"] for r in rows}
    return [k for k in KERNEL_ORDER if k in found] + sorted(found - set(KERNEL_ORDER))


def chance(setup: dict) -> float:
    """Accuracy of guessing uniformly among the value ids."""
    return 1 / len(recall_vocab(setup["vocab_size"])[1])


def mean_std(values: list[float]) -> tuple[float, float | None]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def cells(rows: list[dict]) -> dict[tuple, dict]:
    """(kernel, seq_len, width) -> the chosen learning rate's summary."""
    by_lr: dict[tuple, dict[float, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        by_lr[(r["kernel"], r["seq_len"], r["width"])][r["lr"]].append(r)
    chosen = {}
    for key, lrs in by_lr.items():
        sweep = {lr: statistics.fmean(r["val_accuracy"] for r in runs) for lr, runs in lrs.items()}
        # Only the learning rates run with the most seeds compete (a rate dropped after its
        # first seed cannot win on one lucky run); a tie goes to the smaller rate.
        most = max(len(runs) for runs in lrs.values())
        lr = max(sorted(lr for lr in lrs if len(lrs[lr]) == most), key=sweep.get)
        runs = sorted(lrs[lr], key=lambda r: r["seed"])
        mean, std = mean_std([r["test_accuracy"] for r in runs])
        chosen[key] = {
            "lr": lr,
            "sweep": dict(sorted(sweep.items())),
            "seeds": [r["seed"] for r in runs],
            "test": [r["test_accuracy"] for r in runs],
            "mean": mean,
            "std": std,
            "wall_s": statistics.fmean(r["wall_s"] for r in runs),
            "steps": max(r["steps"] for r in runs),
        }
    return chosen


def plot(setup: dict, chosen: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    seq_lens = sorted({n for _, n, _ in chosen})
    widths = sorted({w for _, _, w in chosen})
    kernels = kernels_of([{"kernel": k} for k, _, _ in chosen])
    fig = Figure(figsize=(4 * len(seq_lens), 3.6))
    axes = fig.subplots(1, len(seq_lens), sharey=True, squeeze=False)[0]
    for ax, n in zip(axes, seq_lens, strict=True):
        for kernel in kernels:
            points = [(w, chosen[(kernel, n, w)]) for w in widths if (kernel, n, w) in chosen]
            if points:
                ax.errorbar(
                    [w for w, _ in points],
                    [c["mean"] for _, c in points],
                    yerr=[c["std"] or 0.0 for _, c in points],
                    **STYLES.get(kernel, {"marker": "o"}),
                    capsize=3,
                    color=COLOURS.get(kernel),
                    label=LABELS.get(kernel, kernel),
                )
        pairs = setup.get("num_pairs") or n // setup["pairs_divisor"]
        ax.axhline(chance(setup), color="grey", ls=":", lw=1, label="chance (1 / values)")
        ax.axhline(1 / pairs, color="grey", ls="--", lw=1, label="1 / pairs (copy any value)")
        steps = sorted({c["steps"] for (_, m, _), c in chosen.items() if m == n})
        ax.set(
            title=f"seq_len {n}, {pairs} pairs, {'/'.join(map(str, steps))} steps",
            xlabel=f"model width (head_dim {setup['head_dim']})",
            xticks=widths,
            ylim=(0, 1.02),
        )
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy (queried values)")
    axes[-1].legend(fontsize=7, loc="lower left")
    conv = setup.get("short_conv", 0)
    fig.suptitle(
        f"MQAR on the CPU: {setup['depth']}-layer LM"
        + (f" with a {conv}-tap short conv" if conv else "")
        + f", batch {setup['batch_size']}, vocab "
        f"{setup['vocab_size']}; best lr per point, mean ± std over seeds",
        fontsize=10,
    )
    write_figure(path, fig)


def table(chosen: dict, cell) -> str:
    """Markdown table: one row per kernel, one column per (seq_len, width), ``cell(c)``."""
    seq_lens = sorted({n for _, n, _ in chosen})
    widths = sorted({w for _, _, w in chosen})
    cols = [(n, w) for n in seq_lens for w in widths]
    head = "| kernel | " + " | ".join(f"N={n}, D={w}" for n, w in cols) + " |"
    lines = [head, "|---" * (len(cols) + 1) + "|"]
    for kernel in kernels_of([{"kernel": k} for k, _, _ in chosen]):
        row = [chosen.get((kernel, *key)) for key in cols]
        text = ["–" if c is None else cell(c) for c in row]
        lines.append(f"| {LABELS.get(kernel, kernel)} | " + " | ".join(text) + " |")
    return "\n".join(lines)


def accuracy_cell(c: dict) -> str:
    text = f"{100 * c['mean']:.1f}"
    if c["std"] is not None:
        text += f" ± {100 * c['std']:.1f}"
    return text + ("" if len(c["seeds"]) > 1 else " (1 seed)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, nargs="*", default=[HERE / "results.json"])
    parser.add_argument("--out", type=Path, default=HERE / "recall.png")
    args = parser.parse_args()
    setup, rows = load_points(args.results)
    if not rows:
        raise SystemExit(f"no finished points in {', '.join(map(str, args.results))}")
    chosen = cells(rows)
    plot(setup, chosen, args.out)
    print("Test accuracy (%) over the queried values, at the best learning rate:\n")
    print(table(chosen, accuracy_cell))
    print("\nThe learning rate chosen (best mean validation accuracy):\n")
    print(table(chosen, lambda c: f"{c['lr']:g}"))
    print("\nValidation accuracy (%) per learning rate, mean over seeds:\n")
    print(
        table(chosen, lambda c: ", ".join(f"{lr:g}: {100 * a:.1f}" for lr, a in c["sweep"].items()))
    )
    print("\nWall time per run (s, training + evaluation, mean over seeds):\n")
    print(table(chosen, lambda c: f"{c['wall_s']:.0f}"))


if __name__ == "__main__":
    main()
