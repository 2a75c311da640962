"""The accuracy comparison of benchmarks/parity: its runs, how to run them, their summary.

    python benchmarks/parity/experiments.py list [GROUP ...]            # the commands
    (a GROUP is a name of GROUPS, or TASK:VARIANT for one pair; runs go in the order given)
    python benchmarks/parity/experiments.py run RUNS [GROUP ...] --jobs 2
    python benchmarks/parity/experiments.py summarize RUNS [--out DIR]

Every run is ``taylorshift train --preset <task preset> --seed <k> <variant's flags>`` into
``RUNS/<task>/<variant>-seed<k>``, one torch thread each. ``run`` starts the runs that are
missing, resumes the unfinished ones (``--resume``) and skips the finished, ``--jobs`` at a
time. ``summarize`` reads the metrics of every finished run (added to the runs of the
results.json already in ``--out``, so older runs need not be kept) and writes results.json,
table.md and one learning-curve figure per task.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from taylorshift.bench.files import write_figure, write_json, write_text
from taylorshift.train import read_metrics

# The text preset trains τ ten times faster and gives TaylorShift one local head by default
# since this comparison measured them (docs/accuracy.md); every text run here pins what it
# was run with, the paper's setting (factor 1, no local heads) unless the variant names its
# own, so a recorded command repeats its run.
PINNED = {
    "text": (
        "--set",
        "optim.lr_multipliers.temperature=1",
        "--set",
        "model.kernel_args.taylorshift.local_heads=0",
    )
}

TASKS = {  # task -> (preset, what the table reports, taps of the "-conv" variants)
    "listops": ("listops-cpu", "accuracy", 3),
    "digits": ("digits-cpu", "accuracy", 3),
    "text": ("text-bytes-cpu", "bits_per_byte", 4),
}
SEEDS = (0, 1, 2)


@dataclass(frozen=True)
class Variant:
    label: str
    flags: tuple[str, ...]


def _kernel_args(**args: object) -> tuple[str, ...]:
    flags: list[str] = []
    for key, value in args.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        flags += ["--set", f"model.overrides.kernel_args.{key}={text}"]
    return tuple(flags)


VARIANTS = {
    "softmax": Variant("softmax (SDPA)", ("--kernel", "softmax")),
    "direct": Variant("TaylorShift direct", ("--mode", "direct")),
    "efficient": Variant("TaylorShift efficient", ("--mode", "efficient")),
    "linear": Variant("linear attention (elu + 1)", ("--kernel", "linear")),
    # one variable at a time, on top of "direct" (or "softmax")
    "softmax-qknorm": Variant(
        "softmax, qk-norm", ("--kernel", "softmax", "--set", "model.overrides.qk_norm=true")
    ),
    "softmax-3x": Variant(
        "softmax, 3x epochs", ("--kernel", "softmax", "--set", "optim.epochs=30")
    ),
    "direct-3x": Variant(
        "TaylorShift, 3x epochs", ("--mode", "direct", "--set", "optim.epochs=30")
    ),
    "direct-tau2": Variant(
        "TaylorShift, τ0 = 2", ("--mode", "direct", *_kernel_args(temperature=2.0))
    ),
    "direct-tau4": Variant(
        "TaylorShift, τ0 = 4", ("--mode", "direct", *_kernel_args(temperature=4.0))
    ),
    "direct-tau8": Variant(
        "TaylorShift, τ0 = 8", ("--mode", "direct", *_kernel_args(temperature=8.0))
    ),
    "direct-taulr10": Variant(
        "TaylorShift, τ lr × 10",
        ("--mode", "direct", "--set", "optim.lr_multipliers.temperature=10"),
    ),
    "direct-taulr30": Variant(
        "TaylorShift, τ lr × 30",
        ("--mode", "direct", "--set", "optim.lr_multipliers.temperature=30"),
    ),
    "direct-logtau": Variant(
        "TaylorShift, log τ", ("--mode", "direct", *_kernel_args(log_temperature=True))
    ),
    "direct-nofactor": Variant(
        "TaylorShift, no sqrt(n/d)", ("--mode", "direct", *_kernel_args(output_factor=False))
    ),
    "direct-qknorm": Variant(
        "TaylorShift, qk-norm", ("--mode", "direct", "--set", "model.overrides.qk_norm=true")
    ),
    "direct-plain": Variant(
        "TaylorShift, plain scores (normalize=False)",
        ("--mode", "direct", *_kernel_args(normalize=False)),
    ),
    "direct-rebased": Variant(
        "TaylorShift, plain scores after LayerNorm with affine (ReBased's q/k map)",
        (
            "--mode",
            "direct",
            *_kernel_args(normalize=False),
            "--set",
            "model.overrides.qk_norm=true",
        ),
    ),
    "softmax-std002": Variant(
        "softmax, token table at 0.02 (old default)",
        ("--kernel", "softmax", "--set", "model.overrides.token_init_std=0.02"),
    ),
    "direct-std002": Variant(
        "TaylorShift, token table at 0.02 (old default)",
        ("--mode", "direct", "--set", "model.overrides.token_init_std=0.02"),
    ),
    # the short convolution on q, k, v (taps by task: centred 3 in encoders, causal 4)
    "softmax-conv": Variant("softmax + short conv", ("--kernel", "softmax", "{conv}")),
    "direct-conv": Variant("TaylorShift direct + short conv", ("--mode", "direct", "{conv}")),
    "efficient-conv": Variant(
        "TaylorShift efficient + short conv", ("--mode", "efficient", "{conv}")
    ),
    "linear-conv": Variant("linear attention + short conv", ("--kernel", "linear", "{conv}")),
    "direct-conv-taulr10": Variant(
        "TaylorShift direct + short conv, τ lr × 10",
        ("--mode", "direct", "{conv}", "--set", "optim.lr_multipliers.temperature=10"),
    ),
    # τ0 = 8 solved recall where τ0 = 1 did not (benchmarks/recall_cpu/short-conv)
    "direct-conv-taulr10-tau8": Variant(
        "TaylorShift direct + short conv, τ lr × 10, τ0 = 8",
        (
            "--mode",
            "direct",
            "{conv}",
            "--set",
            "optim.lr_multipliers.temperature=10",
            *_kernel_args(temperature=8.0),
        ),
    ),
    # one of the 4 heads a softmax over the last 32 tokens (Based's local precision)
    "direct-conv-taulr10-local1": Variant(
        "TaylorShift direct + short conv, τ lr × 10, 1 of 4 heads local softmax (window 32)",
        (
            "--mode",
            "direct",
            "{conv}",
            "--set",
            "optim.lr_multipliers.temperature=10",
            *_kernel_args(local_heads=1, window=32),
        ),
    ),
    "direct-conv-taulr10-local2": Variant(
        "TaylorShift direct + short conv, τ lr × 10, 2 of 4 heads local softmax (window 32)",
        (
            "--mode",
            "direct",
            "{conv}",
            "--set",
            "optim.lr_multipliers.temperature=10",
            *_kernel_args(local_heads=2, window=32),
        ),
    ),
    "direct-taulr10-local2": Variant(
        "TaylorShift direct, τ lr × 10, 2 of 4 heads local softmax (window 32)",
        (
            "--mode",
            "direct",
            "--set",
            "optim.lr_multipliers.temperature=10",
            *_kernel_args(local_heads=2, window=32),
        ),
    ),
    "direct-taulr10-local1": Variant(
        "TaylorShift direct, τ lr × 10, 1 of 4 heads local softmax (window 32)",
        (
            "--mode",
            "direct",
            "--set",
            "optim.lr_multipliers.temperature=10",
            *_kernel_args(local_heads=1, window=32),
        ),
    ),
}

GROUPS = {
    "compare": [(t, v) for t in TASKS for v in ("softmax", "direct", "efficient", "linear")],
    "conv": [(t, v) for t in TASKS for v in ("softmax-conv", "direct-conv", "efficient-conv")]
    + [("text", "linear-conv")],
    "listops-ablation": [
        ("listops", v)
        for v in (
            "softmax-3x",
            "direct-3x",
            "direct-tau2",
            "direct-tau4",
            "direct-taulr10",
            "softmax-qknorm",
            "direct-nofactor",
            "softmax-std002",
            "direct-std002",
        )
    ],
    # a sliding-window softmax head beside the Taylor heads (docs/local-heads.md)
    "text-local": [
        ("text", v)
        for v in (
            "direct-conv-taulr10-local1",
            "direct-conv-taulr10-local2",
            "direct-taulr10-local1",
        )
    ],
    "text-ablation": [
        ("text", v)
        for v in (
            "direct-logtau",
            "direct-nofactor",
            "direct-plain",
            "direct-rebased",
            "direct-taulr10",
            "direct-taulr30",
            "softmax-std002",
            "direct-std002",
        )
    ],
}


def run_dir(runs: Path, task: str, variant: str, seed: int) -> Path:
    return runs / task / f"{variant}-seed{seed}"


def command(runs: Path, task: str, variant: str, seed: int) -> list[str]:
    preset, _, taps = TASKS[task]
    out = run_dir(runs, task, variant, seed)
    flags: list[str] = list(PINNED.get(task, ()))  # first: a variant's own --set wins
    for flag in VARIANTS[variant].flags:
        flags += ["--set", f"model.overrides.short_conv={taps}"] if flag == "{conv}" else [flag]
    return [
        sys.executable, "-m", "taylorshift", "train", "--preset", preset, "--seed", str(seed),
        "--out", str(out), "--no-progress", "--set", "run.threads=1", *flags,
    ]  # fmt: skip


def state(folder: Path) -> str:
    """``missing``, ``unfinished`` or ``done`` (an ``end`` record at the schedule's end)."""
    if not (folder / "metrics.jsonl").exists():
        return "missing"
    records = read_metrics(folder)
    start = next((r for r in records if r["event"] == "start"), None)
    ends = [r for r in records if r["event"] == "end"]
    if start and ends and ends[-1]["step"] >= start["total_steps"]:
        return "done"
    return "unfinished"


def _pairs(group: str) -> list[tuple[str, str]]:
    """A group's (task, variant) pairs; ``TASK:VARIANT`` names a single pair."""
    if group in GROUPS:
        return GROUPS[group]
    task, _, variant = group.partition(":")
    if task in TASKS and variant in VARIANTS:
        return [(task, variant)]
    raise SystemExit(
        f"a group must be one of {', '.join(GROUPS)} or TASK:VARIANT with TASK in "
        f"{', '.join(TASKS)} and VARIANT in {', '.join(VARIANTS)}; got {group!r}"
    )


def planned(groups: list[str], seeds=SEEDS) -> list[tuple[str, str, int]]:
    """The runs of ``groups`` in the order given (a pair's seeds together), each once."""
    pairs = dict.fromkeys(p for g in groups or list(GROUPS) for p in _pairs(g))
    return [(t, v, s) for t, v in pairs for s in seeds]


def run_all(runs: Path, groups: list[str], jobs: int, seeds=SEEDS) -> None:
    def one(item: tuple[str, str, int]) -> str:
        task, variant, seed = item
        folder = run_dir(runs, task, variant, seed)
        now = state(folder)
        if now == "done":
            return f"done already: {folder}"
        argv = command(runs, task, variant, seed) + (["--resume"] if now == "unfinished" else [])
        folder.parent.mkdir(parents=True, exist_ok=True)
        with open(folder.parent / f"{folder.name}.log", "ab") as log:
            rc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT).returncode
        return f"rc {rc}: {folder}"

    with ThreadPoolExecutor(jobs) as pool:
        for line in pool.map(one, planned(groups, seeds)):
            print(line, flush=True)


# Summary


def collect(runs: Path) -> dict:
    """{task: {variant: {seed: run summary}}} of the finished runs under ``runs``."""
    results: dict = {}
    for task, (_, metric, _) in TASKS.items():
        for folder in sorted((runs / task).glob("*-seed*")):
            if not folder.is_dir() or state(folder) != "done":
                continue
            variant, seed = folder.name.rsplit("-seed", 1)
            records = read_metrics(folder)
            evals = [r for r in records if r["event"] == "eval"]
            test = [r for r in evals if r["split"] == "test"][-1]
            train = [r for r in records if r["event"] == "train"]
            baselines = {r["split"]: r for r in records if r["event"] == "baseline"}
            start = records[0]
            results.setdefault(task, {}).setdefault(variant, {})[int(seed)] = {
                "test": test[metric],
                "test_loss": test["loss"],
                "val": [(r["step"], r[metric]) for r in evals if r["split"] == "val"],
                "train_loss": [(r["step"], r["loss"]) for r in train],
                "samples_per_s": statistics.median(r["samples_per_s"] for r in train),
                "bigram_bpb": baselines.get("test", {}).get("bigram_bpb"),
                "unigram_bpb": baselines.get("test", {}).get("unigram_bpb"),
                "python": start.get("python"),
                "torch": start.get("torch"),
            }
    return results


def _mean_std(values: list[float]) -> tuple[float, float | None]:
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else None


def summary(results: dict) -> dict:
    rows: dict = {}
    for task, variants in results.items():
        for variant, seeds in variants.items():
            values = [s["test"] for s in seeds.values()]
            mean, std = _mean_std(values)
            rows.setdefault(task, {})[variant] = {
                "label": VARIANTS[variant].label if variant in VARIANTS else variant,
                "seeds": sorted(seeds),
                "test": values,
                "mean": mean,
                "std": std,
                "samples_per_s": statistics.median(s["samples_per_s"] for s in seeds.values()),
            }
    return rows


def table(task: str, rows: dict, results: dict) -> str:
    metric = TASKS[task][1]
    percent = metric == "accuracy"
    unit = "test accuracy (%)" if percent else "test bits per byte (lower is better)"
    lines = [
        f"| variant | {unit}, mean ± std | per seed | Δ vs softmax | train samples/s |",
        "|---|---|---|---|---|",
    ]
    scale = 100.0 if percent else 1.0
    digits = 1 if percent else 3
    ref = rows.get("softmax", {}).get("mean")
    order = [v for v in VARIANTS if v in rows] + [v for v in rows if v not in VARIANTS]
    for variant in order:
        r = rows[variant]
        std = "n/a" if r["std"] is None else f"{r['std'] * scale:.{digits}f}"
        per = ", ".join(f"{v * scale:.{digits}f}" for v in r["test"])
        delta = "" if ref is None else f"{(r['mean'] - ref) * scale:+.{digits}f}"
        lines.append(
            f"| {r['label']} | {r['mean'] * scale:.{digits}f} ± {std} | {per} | {delta} | "
            f"{r['samples_per_s']:.0f} |"
        )
    if metric == "bits_per_byte":
        any_run = next(iter(next(iter(results[task].values())).values()))
        lines.append(
            f"\nCount baselines of the test split: unigram {any_run['unigram_bpb']:.3f}, "
            f"bigram {any_run['bigram_bpb']:.3f} bits per byte."
        )
    return "\n".join(lines) + "\n"


def plot(task: str, results: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    metric = TASKS[task][1]
    fig = Figure(figsize=(11, 4))
    ax_loss, ax_val = fig.subplots(1, 2)
    variants = [v for v in VARIANTS if v in results[task]]
    for i, variant in enumerate(variants):
        colour = f"C{i % 10}"
        for j, (_, run) in enumerate(sorted(results[task][variant].items())):
            label = VARIANTS[variant].label if j == 0 else None
            steps, losses = zip(*run["train_loss"], strict=True)
            ax_loss.plot(steps, losses, color=colour, alpha=0.6, lw=0.8, label=label)
            steps, values = zip(*run["val"], strict=True)
            ax_val.plot(steps, values, color=colour, alpha=0.8, marker="o", ms=2, lw=1, label=label)
    ax_loss.set(
        xlabel="training step", ylabel="training loss (nats)", title=f"{task}: training loss"
    )
    ylabel = "validation accuracy" if metric == "accuracy" else "validation bits per byte"
    ax_val.set(xlabel="training step", ylabel=ylabel, title=f"{task}: validation, every epoch")
    for ax in (ax_loss, ax_val):
        ax.grid(alpha=0.3)
    ax_val.legend(fontsize=7)
    write_figure(path, fig)


def merged(recorded: dict, found: dict) -> dict:
    """The runs of an earlier ``results.json`` with those found now added (a run found now
    replaces its recorded copy), so that a new variant joins the comparison without its
    older runs' folders."""
    results = {task: {v: dict(seeds) for v, seeds in variants.items()}
               for task, variants in recorded.items()}  # fmt: skip
    for task, variants in found.items():
        for variant, seeds in variants.items():
            results.setdefault(task, {}).setdefault(variant, {}).update(seeds)
    return results


def summarize(runs: Path, out: Path) -> None:
    results = collect(runs)
    if (out / "results.json").exists():
        recorded = json.loads((out / "results.json").read_text())["runs"]
        recorded = {t: {v: {int(k): r for k, r in seeds.items()} for v, seeds in vs.items()}
                    for t, vs in recorded.items()}  # fmt: skip
        results = merged(recorded, results)
    rows = summary(results)
    write_json(out / "results.json", {"summary": rows, "runs": results})
    parts = []
    for task in results:
        parts.append(f"### {task} ({TASKS[task][0]})\n\n{table(task, rows[task], results)}")
        plot(task, results, out / f"curves_{task}.png")
    write_text(out / "table.md", "\n".join(parts))
    print("\n".join(parts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    listing = sub.add_parser("list", help="print the commands")
    listing.add_argument("groups", nargs="*")
    listing.add_argument("--runs", type=Path, default=Path("runs/parity"))
    running = sub.add_parser("run", help="run what is missing or unfinished")
    running.add_argument("runs", type=Path)
    running.add_argument("groups", nargs="*")
    running.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    for sub_parser in (listing, running):  # more seeds for a row whose spread is wide
        sub_parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    summing = sub.add_parser("summarize", help="tables and curves of the finished runs")
    summing.add_argument("runs", type=Path)
    summing.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = parser.parse_args()
    if args.action == "list":
        for task, variant, seed in planned(args.groups, args.seeds):
            print(shlex.join(command(args.runs, task, variant, seed)))
    elif args.action == "run":
        run_all(args.runs, args.groups, args.jobs, args.seeds)
    else:
        summarize(args.runs, args.out)


if __name__ == "__main__":
    main()
