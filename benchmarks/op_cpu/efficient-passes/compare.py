"""The efficient form's CPU kernels at two revisions, with SDPA and the matmul rate, in one
process.

    python benchmarks/op_cpu/efficient-passes/compare.py --before 089e6f9 [--forward] \
        [--causal] 16x256 32x1024 ...

The ``--before`` revision's package runs as ``taylorshift_before`` (benchmarks/op_cpu/
workspace/ab.py: ``git archive``, imports rewritten; its kernels build from its own
sources into their own cache file). For each d x N (B 1, H 4, dv = d, float32, no mask,
normalised q and k, τ = 1, 2 threads unless --threads): forward + backward (or forward
only) of ``cpu_efficient_taylor_shift`` (``--causal``: ``cpu_causal_efficient_taylor_shift``,
chunks of 256) before and after, SDPA (``is_causal`` with --causal) and a 4096² float32
matmul, in shuffled rounds. Prints medians (ms), the before / after and SDPA / after ratios
paired by round, and each revision's share of the matmul rate, counting 2·N·D·dv flops per
feature product and head (D = (d+1)(d+2)/2; 2 products forward, 6 forward + backward; the
causal chunks' direct blocks not counted), as benchmarks/op_cpu/cpu-kernel/compare.py does.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workspace"))
from ab import install_before, shuffled_rounds  # (benchmarks/op_cpu/workspace/ab.py)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("points", nargs="+", help="d x N, e.g. 16x256")
    parser.add_argument("--before", required=True, help="a git revision of this repository")
    parser.add_argument("--forward", action="store_true", help="forward only")
    parser.add_argument("--causal", action="store_true", help="the causal forms")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    install_before(args.before)
    if args.causal:
        from taylorshift_before.ops.cpu.efficient_causal import (
            cpu_causal_efficient_taylor_shift as before,
        )

        from taylorshift.ops.cpu.efficient_causal import cpu_causal_efficient_taylor_shift as after
    else:
        from taylorshift_before.ops.cpu.efficient import cpu_efficient_taylor_shift as before

        from taylorshift.ops.cpu.efficient import cpu_efficient_taylor_shift as after
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(4096, 4096, generator=gen), torch.randn(4096, 4096, generator=gen)
    what = ("forward" if args.forward else "forward + backward") + (
        ", causal" if args.causal else ""
    )
    print(f"torch {torch.__version__}, {args.threads} threads, {what}, B 1, H 4, dv = d, "
          f"float32, {args.rounds} rounds, before = {args.before}")  # fmt: skip
    print("| d | N | before ms | after ms | before / after | SDPA ms | SDPA / after "
          "| share of matmul rate before | after |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for d, n in (tuple(map(int, point.split("x"))) for point in args.points):
        q, k, v, g = (torch.randn(1, 4, n, d, generator=gen) for _ in range(4))
        leaves = [t.requires_grad_(not args.forward) for t in (q, k, v)]

        def run(form, leaves=leaves, g=g):
            out = form(*leaves)
            if not args.forward:
                torch.autograd.grad(out, leaves, g)

        fns = {
            "before": lambda: run(lambda *x: before(*x, None, 1.0, None, True)),
            "after": lambda: run(lambda *x: after(*x, None, 1.0, None, True)),
            "sdpa": lambda: run(
                lambda *x: F.scaled_dot_product_attention(*x, is_causal=args.causal)
            ),
            "matmul": lambda: a @ b,
        }
        for fn in fns.values():
            fn()
        times = shuffled_rounds(fns, 5 if n >= 8192 else args.rounds)
        med = {key: statistics.median(ts) for key, ts in times.items()}

        def paired(x: str, y: str = "after", times=times) -> str:
            ratios = (p / r for p, r in zip(times[x], times[y], strict=True))
            return f"{statistics.median(ratios):.2f}"

        big_d = (d + 1) * (d + 2) // 2
        flops = (2 if args.forward else 6) * 2 * 4 * n * big_d * d
        rate = 2 * 4096**3 / med["matmul"]
        print(f"| {d} | {n} | {med['before'] * 1e3:.2f} | {med['after'] * 1e3:.2f} "
              f"| {paired('before')} | {med['sdpa'] * 1e3:.2f} | {paired('sdpa')} "
              f"| {flops / med['before'] / rate:.0%} | {flops / med['after'] / rate:.0%} |",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
