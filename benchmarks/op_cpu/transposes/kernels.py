"""The readout and the pair gradient kernels at two revisions, called directly, in one
process.

    python benchmarks/op_cpu/transposes/kernels.py --before 1a23590 16x256 16x1024 ...

The ``--before`` revision's package runs as ``taylorshift_before`` (benchmarks/op_cpu/
workspace/ab.py), its kernels built from its own sources. For each d x N (4 heads, dv = d,
float32, 2 threads) the same inputs go to ``ts_readout`` (the forward's finished readout,
with counts and denominators), ``ts_pair_grad`` and ``ts_state`` (unchanged: a control) of
both libraries, the calls of blas_shapes.py; each timing repeats a call for about 20 ms,
in shuffled rounds. Prints the medians (ms a call) and the before / after ratio paired by
round.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workspace"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "efficient-passes"))
from ab import install_before, repeated, shuffled_rounds  # (benchmarks/op_cpu/workspace/ab.py)
from blas_shapes import calls  # (benchmarks/op_cpu/efficient-passes/blas_shapes.py)

from taylorshift.ops.cpu.build import library

KERNELS = ("readout kernel", "gradient kernel", "state kernel")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("points", nargs="+", help="d x N, e.g. 16x4096")
    parser.add_argument("--before", required=True, help="a git revision of this repository")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(2)
    install_before(args.before)
    libs = {
        "before": importlib.import_module("taylorshift_before.ops.cpu.build").library(),
        "after": library(),
    }
    print(f"torch {torch.__version__}, 2 threads, 4 heads, dv = d, float32, {args.rounds} "
          f"rounds, before = {args.before}; ms a call")  # fmt: skip
    print("| kernel | d | N | before | after | before / after |")
    print("|---|---:|---:|---:|---:|---:|")
    for d, n in (tuple(map(int, point.split("x"))) for point in args.points):
        fns = {}
        for rev, lib in libs.items():
            made, _ = calls(lib, d, n, 4, 2, torch.Generator().manual_seed(0))
            fns.update({(kernel, rev): made[kernel] for kernel in KERNELS})
        start = time.perf_counter()
        fns["readout kernel", "after"]()
        times = max(1, round(0.02 / (time.perf_counter() - start)))
        timed = {key: repeated(fn, times) for key, fn in fns.items()}
        for fn in timed.values():
            fn()
        per_call = {key: [t / times for t in ts]
                    for key, ts in shuffled_rounds(timed, args.rounds).items()}  # fmt: skip
        for kernel in KERNELS:
            before, after = per_call[kernel, "before"], per_call[kernel, "after"]
            ratio = statistics.median(b / a for b, a in zip(before, after, strict=True))
            ms = [statistics.median(ts) * 1e3 for ts in (before, after)]
            print(f"| {kernel.split()[0]} | {d} | {n} | {ms[0]:.3f} | {ms[1]:.3f} "
                  f"| {ratio:.2f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
