"""Plot and tabulate the MQAR results of run_recall.py: test accuracy vs width per sequence
length, one line per attention kernel.

    python benchmarks/recall_cpu/plot_recall.py [results.json] [--out recall.png]

Also prints the markdown table of report.md (test accuracy per kernel × seq_len × width).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from taylorshift.bench.files import write_figure

HERE = Path(__file__).resolve().parent
LABELS = {"taylorshift": "TaylorShift", "softmax": "softmax (SDPA)", "linear": "linear (elu+1)"}
COLOURS = {"taylorshift": "tab:orange", "softmax": "tab:blue", "linear": "tab:green"}
KERNEL_ORDER = ("softmax", "taylorshift", "linear")


def load_points(path: Path) -> tuple[dict, list[dict]]:
    results = json.loads(path.read_text())
    rows = [row for row in results["points"].values() if "error" not in row]
    return results["setup"], rows


def kernels_of(rows: list[dict]) -> list[str]:
    found = {r["kernel"] for r in rows}
    return [k for k in KERNEL_ORDER if k in found] + sorted(found - set(KERNEL_ORDER))


def chance(setup: dict) -> float:
    """Accuracy of guessing uniformly among the value ids."""
    num_values = setup["vocab_size"] - 2 - (setup["vocab_size"] - 2) // 2
    return 1 / num_values


def plot(setup: dict, rows: list[dict], path: Path) -> None:
    from matplotlib.figure import Figure

    seq_lens = sorted({r["seq_len"] for r in rows})
    widths = sorted({r["width"] for r in rows})
    fig = Figure(figsize=(4 * len(seq_lens), 3.6))
    axes = fig.subplots(1, len(seq_lens), sharey=True, squeeze=False)[0]
    top = min(1.0, max(0.5, max(r["test_accuracy"] for r in rows) + 0.1))
    for ax, n in zip(axes, seq_lens, strict=True):
        for kernel in kernels_of(rows):
            points = sorted(
                (r["width"], r["test_accuracy"])
                for r in rows
                if r["seq_len"] == n and r["kernel"] == kernel
            )
            if points:
                ax.plot(
                    *zip(*points, strict=True),
                    marker="o",
                    color=COLOURS.get(kernel),
                    label=LABELS.get(kernel, kernel),
                )
        pairs = n // setup["pairs_divisor"]
        ax.axhline(chance(setup), color="grey", ls=":", lw=1, label="chance (1 / values)")
        ax.axhline(1 / pairs, color="grey", ls="--", lw=1, label="1 / pairs (copy any value)")
        ax.set(
            title=f"seq_len {n}, {pairs} pairs",
            xlabel=f"model width (head_dim {setup['head_dim']})",
            xticks=widths,
            ylim=(0, top),
        )
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy (queried values)")
    axes[-1].legend(fontsize=8, loc="upper left")
    fig.suptitle(
        f"MQAR on the CPU: {setup['depth']}-layer LM, {setup['steps']} steps × batch "
        f"{setup['batch_size']}, lr {setup['lr']:g}, vocab {setup['vocab_size']}, "
        f"seed {setup['seed']}",
        fontsize=10,
    )
    write_figure(path, fig)


def table(rows: list[dict], cell) -> str:
    """Markdown table: one row per kernel, one column per (seq_len, width), ``cell(row)``."""
    seq_lens = sorted({r["seq_len"] for r in rows})
    widths = sorted({r["width"] for r in rows})
    by = {(r["kernel"], r["seq_len"], r["width"]): r for r in rows}
    cols = [(n, w) for n in seq_lens for w in widths]
    head = "| kernel | " + " | ".join(f"N={n}, D={w}" for n, w in cols) + " |"
    lines = [head, "|---" * (len(cols) + 1) + "|"]
    for kernel in kernels_of(rows):
        cells = [by.get((kernel, *key)) for key in cols]
        cells = ["–" if r is None else cell(r) for r in cells]
        lines.append(f"| {LABELS.get(kernel, kernel)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, nargs="?", default=HERE / "results.json")
    parser.add_argument("--out", type=Path, default=HERE / "recall.png")
    args = parser.parse_args()
    setup, rows = load_points(args.results)
    if not rows:
        raise SystemExit(f"no finished points in {args.results}")
    plot(setup, rows, args.out)
    print("Test accuracy (%) over the queried values:\n")
    print(table(rows, lambda r: f"{100 * r['test_accuracy']:.1f}"))
    print("\nWall time per point (s, training + evaluation):\n")
    print(table(rows, lambda r: f"{r['wall_s']:.0f}"))


if __name__ == "__main__":
    main()
