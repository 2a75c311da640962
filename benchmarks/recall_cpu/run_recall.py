"""Multi-query associative recall (MQAR) on the CPU: softmax vs TaylorShift vs linear attention.

    python benchmarks/recall_cpu/run_recall.py --steps 2000 --batch-size 16 --jobs 2

Trains one small causal LM (``lm-tiny`` with the width, depth and heads given here) per grid
point ``kernel × seq_len × width`` on the ``recall`` task, with the same data, steps,
learning rate and seed everywhere, and records the test accuracy over the queried values.
Each point runs in-process through ``taylorshift.train`` (``resolve_config`` + ``train``) in
a temporary run folder; ``--jobs`` points run at once in worker processes of
``--threads`` torch threads each.

The results file (default ``results.json`` beside this script) is rewritten atomically after
every finished point and the run is resumable: points already in it are skipped, so the
same command continues an interrupted sweep. A file made with other settings (steps, lr,
...) is refused rather than mixed with. See report.md for the recorded run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shlex
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import torch

from taylorshift.atomic import write_atomic
from taylorshift.bench.machine import machine_info

HERE = Path(__file__).resolve().parent
# name -> (model.kernel, model overrides): the kernels and kernel settings compared
KERNELS = {
    # the paper's: learnable τ per head, initially 1 (pinned: the recall preset starts
    # TaylorShift at τ0 = 8 now)
    "taylorshift": ("taylorshift", {"kernel_args": {"temperature": 1.0}}),
    "taylorshift-tau8": ("taylorshift", {"kernel_args": {"temperature": 8.0}}),
    "softmax": ("softmax", {}),
    "linear": ("linear", {}),
}


def point_key(kernel: str, seq_len: int, width: int, lr: float, seed: int) -> str:
    return f"{kernel}/N{seq_len}/D{width}/lr{lr:g}/seed{seed}"


def grid(args: argparse.Namespace) -> list[tuple[str, int, int, float, int]]:
    """The points, most expensive first (long sequences, TaylorShift, wide) so that a pool of
    workers does not end on one long point."""
    cost = {k: 3 if v[0] == "taylorshift" else 1 for k, v in KERNELS.items()}
    points = [
        (k, n, w, lr, seed)
        for k in args.kernels
        for n in args.seq_lens
        for w in args.widths
        for lr in args.lrs
        for seed in args.seeds
    ]
    return sorted(points, key=lambda p: (-p[1] * cost.get(p[0], 1), -p[2], p[0], p[3], p[4]))


def setup_of(args: argparse.Namespace) -> dict:
    """Everything that changes what a point computes (a resumed file must agree on it)."""
    return {
        "preset": "recall",
        "model": "lm-tiny",
        "depth": args.depth,
        "head_dim": args.head_dim,
        "qk_norm": args.qk_norm,
        "vocab_size": args.vocab_size,
        "pairs_divisor": args.pairs_divisor,
        "num_pairs": args.num_pairs,
        "short_conv": args.short_conv,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "warmup_fraction": args.warmup_fraction,
        "val_samples": args.val_samples,
        "test_samples": args.test_samples,
        "threads": args.threads,
        "set": dict(args.set),
    }


def pairs_of(setup: dict, seq_len: int) -> int:
    """Key-value pairs per sequence: ``--num-pairs`` at every length, else seq_len / divisor."""
    return setup.get("num_pairs") or seq_len // setup["pairs_divisor"]


def overrides_for(
    setup: dict, kernel: str, seq_len: int, width: int, lr: float, seed: int, out_dir: str
) -> dict:
    """Dotted-key overrides of the ``recall`` preset for one point: one epoch of exactly
    ``steps`` batches (fresh samples throughout), warm-up then cosine over that epoch."""
    if width % setup["head_dim"]:
        raise ValueError(f"width {width} is not a multiple of head_dim {setup['head_dim']}")
    num_pairs = pairs_of(setup, seq_len)
    overrides = {
        "data.task": "recall",
        "data.options": {
            "seq_len": seq_len,
            "num_pairs": num_pairs,
            "vocab_size": setup["vocab_size"],
        },
        "data.split_options": {
            "train": {"num_samples": setup["steps"] * setup["batch_size"]},
            "val": {"num_samples": setup["val_samples"]},
            "test": {"num_samples": setup["test_samples"]},
        },
        "data.batch_size": setup["batch_size"],
        "model.name": setup["model"],
        "model.kernel": KERNELS[kernel][0],
        "model.overrides": {
            **KERNELS[kernel][1],
            "dim": width,
            "depth": setup["depth"],
            "num_heads": width // setup["head_dim"],
            "qk_norm": setup["qk_norm"],
            "short_conv": setup["short_conv"],
        },
        "optim.lr": lr,
        "optim.epochs": 1,
        "optim.warmup_epochs": setup["warmup_fraction"],
        "run.seed": seed,
        "run.device": "cpu",
        "run.threads": setup["threads"],
        "run.progress": False,
        "run.log_every": 25,
        "run.out_dir": out_dir,
    }
    for key, value in setup.get("set", {}).items():
        if key.startswith("model.overrides."):
            overrides["model.overrides"][key.removeprefix("model.overrides.")] = value
        else:
            overrides[key] = value
    return overrides


def parse_setting(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` of ``--set``: VALUE is JSON when it parses, else text."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--set takes KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def run_point(setup: dict, kernel: str, seq_len: int, width: int, lr: float, seed: int) -> dict:
    """Train and test one point (in a worker process); a dict for the results file."""
    from taylorshift.train import read_metrics, resolve_config, train

    with tempfile.TemporaryDirectory(prefix="recall-") as out_dir:
        config = resolve_config(
            "recall", overrides=overrides_for(setup, kernel, seq_len, width, lr, seed, out_dir)
        )
        start = time.perf_counter()
        try:
            result = train(config)
        except Exception as error:  # a non-finite loss is a result, not a crash of the sweep
            return {"error": f"{type(error).__name__}: {error}"}
        wall = time.perf_counter() - start
        records = read_metrics(out_dir)
    first = records[0]
    train_records = [r for r in records if r["event"] == "train"]
    losses = result.losses
    tail = losses[-min(50, len(losses)) :]
    return {
        "kernel": kernel,
        "seq_len": seq_len,
        "width": width,
        "lr": lr,
        "seed": seed,
        "num_heads": width // setup["head_dim"],
        "num_pairs": pairs_of(setup, seq_len),
        "parameters": first.get("parameters"),
        "steps": result.step,
        "test_accuracy": result.test["accuracy"],
        "test_loss": result.test["loss"],
        "test_queries": result.test["samples"],
        "val_accuracy": result.eval["accuracy"],
        "final_train_loss": sum(tail) / len(tail),
        "train_curve": [(r["step"], r["loss"]) for r in train_records],
        "wall_s": wall,
        # wall time per step, evaluation and setup included; samples_per_s is training only
        "ms_per_step": 1000 * wall / max(result.step, 1),
        "samples_per_s": sorted(r["samples_per_s"] for r in train_records)[len(train_records) // 2]
        if train_records
        else None,
    }


def load_results(path: Path, setup: dict) -> dict:
    if not path.exists():
        return {"setup": setup, "points": {}}
    results = json.loads(path.read_text())
    if results.get("setup") != setup:
        old = results.get("setup", {})
        diff = [f"{k}: {old.get(k)!r} -> {v!r}" for k, v in setup.items() if old.get(k) != v]
        raise SystemExit(
            f"{path} was made with other settings ({'; '.join(diff)}); "
            "pass another --out or the same settings"
        )
    return results


def save(path: Path, results: dict) -> None:
    write_atomic(path, (json.dumps(results, indent=1) + "\n").encode())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--kernels", nargs="+", choices=list(KERNELS), default=["taylorshift", "softmax", "linear"]
    )
    p.add_argument("--seq-lens", nargs="+", type=int, default=[64, 128, 256])
    p.add_argument("--widths", nargs="+", type=int, default=[32, 64])
    p.add_argument("--head-dim", type=int, default=16, help="heads = width / head_dim")
    p.add_argument("--depth", type=int, default=2)
    p.add_argument(
        "--qk-norm",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="LayerNorm on each head's queries and keys (see report.md for why)",
    )
    p.add_argument("--vocab-size", type=int, default=64)
    p.add_argument(
        "--pairs-divisor", type=int, default=16, help="num_pairs = seq_len // this (Zoology's)"
    )
    p.add_argument(
        "--num-pairs", type=int, default=None, help="pairs at every length (not seq_len / divisor)"
    )
    p.add_argument("--steps", type=int, default=2000, help="optimizer steps per point")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument(
        "--short-conv",
        type=int,
        default=0,
        help="taps of the causal short convolution on q, k, v (0: none)",
    )
    p.add_argument(
        "--lrs", nargs="+", type=float, default=[3e-3], help="learning rates (one run each)"
    )
    p.add_argument("--warmup-fraction", type=float, default=0.1, help="of the steps")
    p.add_argument("--val-samples", type=int, default=256)
    p.add_argument("--test-samples", type=int, default=1024)
    p.add_argument(
        "--set",
        type=parse_setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another dotted override of the recall preset for every point, e.g. "
        "optim.lr_multipliers='{\"temperature\": 10}' or model.overrides.kernel_args=...",
    )
    p.add_argument("--seeds", nargs="+", type=int, default=[0], help="run seeds")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--jobs", type=int, default=1, help="points trained at once")
    p.add_argument("--out", type=Path, default=HERE / "results.json")
    p.add_argument("--dry-run", action="store_true", help="list the points to run and stop")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    setup = setup_of(args)
    results = load_results(args.out, setup)
    done = {k for k, v in results["points"].items() if "error" not in v}
    todo = [p for p in grid(args) if point_key(*p) not in done]
    print(f"{len(todo)} points to run, {len(done)} already in {args.out}", flush=True)
    if args.dry_run:
        for p in todo:
            print("  " + point_key(*p))
        return
    results["machine"] = machine_info("cpu")
    results.setdefault("commands", []).append(
        " ".join(shlex.quote(a) for a in ["python", *sys.argv])
    )
    results["torch"] = torch.__version__
    results["jobs"] = args.jobs
    save(args.out, results)
    start = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=context) as pool:
        futures = {pool.submit(run_point, setup, *p): p for p in todo}
        for future in as_completed(futures):
            point = futures[future]
            row = future.result()
            results["points"][point_key(*point)] = row
            save(args.out, results)
            elapsed = time.perf_counter() - start
            if "error" in row:
                print(f"{point_key(*point)}: {row['error']} ({elapsed:.0f} s)", flush=True)
                continue
            acc = row["test_accuracy"]
            print(
                f"{point_key(*point)}: test accuracy {acc:.3f}, train loss "
                f"{row['final_train_loss']:.3f}, {row['ms_per_step']:.0f} ms/step, "
                f"{row['wall_s']:.0f} s (elapsed {elapsed:.0f} s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
