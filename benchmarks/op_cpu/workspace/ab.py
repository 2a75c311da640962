"""The efficient form at two revisions in one process, shuffled rounds, with page faults.

    python benchmarks/op_cpu/workspace/ab.py --before 2e9c023 --rounds 15 \\
        --out benchmarks/op_cpu/workspace/ab.md

The ``--before`` revision's package is exported from git into a temporary folder under
the name ``taylorshift_before`` (its absolute imports rewritten), so both revisions run in
the same process and every round times each (revision, pass) once in a shuffled order.
Also counts minor page faults per call (``getrusage``), which is deterministic enough to
compare where times are noisy.
"""

from __future__ import annotations

import argparse
import io
import platform
import random
import re
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch

from taylorshift.atomic import write_atomic

ROOT = Path(__file__).resolve().parents[3]
POINTS = [(16, 256), (16, 512), (32, 256), (32, 512), (32, 1024), (64, 512), (64, 1024),
          (64, 4096)]  # fmt: skip


def export_before(rev: str, into: Path) -> None:
    """git archive of src/taylorshift at ``rev`` as the package ``taylorshift_before``."""
    data = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "src/taylorshift"],
        check=True, capture_output=True,
    ).stdout  # fmt: skip
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        archive.extractall(into, filter="data")
    package = into / "taylorshift_before"
    (into / "src" / "taylorshift").rename(package)
    for path in package.rglob("*.py"):
        text = re.sub(r"\b(from|import) taylorshift\b", r"\1 taylorshift_before", path.read_text())
        # its torch.library operators under their own namespace: the two revisions register
        # operators of the same names, which torch refuses twice in one process
        text = re.sub(r"([\"'])taylorshift::", r"\1taylorshift_before::", text)
        text = re.sub(r"Library\(([\"'])taylorshift\1", r"Library(\1taylorshift_before\1", text)
        text = re.sub(r"\btorch\.ops\.taylorshift\b", "torch.ops.taylorshift_before", text)
        path.write_text(text)


def install_before(rev: str, prefix: str = "ts-ab-") -> Path:
    """``export_before(rev, …)`` into a new temporary folder put first on ``sys.path``, so
    that ``import taylorshift_before`` finds it; returns the folder."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    export_before(rev, tmp)
    sys.path.insert(0, str(tmp))
    return tmp


def shuffled_rounds(fns: dict, rounds: int) -> dict:
    """Seconds per call of each function, one call of each per round in a shuffled order."""
    times = {key: [] for key in fns}
    for _ in range(rounds):
        keys = list(fns)
        random.shuffle(keys)
        for key in keys:
            start = time.perf_counter()
            fns[key]()
            times[key].append(time.perf_counter() - start)
    return times


def repeated(fn, times: int):
    """A function that calls ``fn`` ``times`` times (one timing of a short call)."""

    def calls():
        for _ in range(times):
            fn()

    return calls


def medians_ms(times: dict) -> dict:
    """The median of each key's seconds, in milliseconds."""
    return {key: statistics.median(ts) * 1e3 for key, ts in times.items()}


def faults_per_call(fn, calls: int = 5) -> float:
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        fn()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="a git revision of this repository")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--points", nargs="+", default=[f"{d}x{n}" for d, n in POINTS],
                        help="d x N pairs, e.g. 16x512")  # fmt: skip
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    install_before(args.before)
    from taylorshift_before.ops.taylor_shift.efficient import efficient_taylor_shift as before

    from taylorshift.ops.taylor_shift.efficient import efficient_taylor_shift as after

    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    lines = [
        f"# Efficient form, {args.before} (before) against {head} (after), one process",
        "",
        f"    {' '.join(sys.argv)}",
        "",
        f"{time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}, "
        f"torch {torch.__version__}, {args.threads} threads, B 1, H 4, float32, non-causal, "
        f"median of {args.rounds} shuffled rounds; > 1: after is faster.",
        "",
        "| d | N | fwd before ms | fwd after ms | ratio | fwd+bwd before ms | fwd+bwd after ms "
        "| ratio | faults/call fwd+bwd before | after |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    gen = torch.Generator().manual_seed(0)
    for d, n in (tuple(map(int, p.split("x"))) for p in args.points):
        q, k, v = (torch.randn(1, 4, n, d, generator=gen, requires_grad=True) for _ in range(3))
        fns = {}
        for label, op in (("before", before), ("after", after)):
            fns[label, "f"] = lambda op=op, q=q, k=k, v=v: op(
                q.detach(), k.detach(), v.detach(), None, 1.0, None, True
            )
            fns[label, "b"] = lambda op=op, q=q, k=k, v=v: (
                op(q, k, v, None, 1.0, None, True).sum().backward()
            )
        for fn in fns.values():
            fn()
            fn()
        faults = {label: faults_per_call(fns[label, "b"]) for label in ("before", "after")}
        ms = medians_ms(shuffled_rounds(fns, args.rounds))
        row = (f"| {d} | {n} | {ms['before', 'f']:.2f} | {ms['after', 'f']:.2f} "
               f"| {ms['before', 'f'] / ms['after', 'f']:.2f} | {ms['before', 'b']:.2f} "
               f"| {ms['after', 'b']:.2f} | {ms['before', 'b'] / ms['after', 'b']:.2f} "
               f"| {faults['before']:.0f} | {faults['after']:.0f} |")  # fmt: skip
        print(row, flush=True)
        lines.append(row)
    write_atomic(args.out, ("\n".join(lines) + "\n").encode())


if __name__ == "__main__":
    main()
