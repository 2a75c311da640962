"""The causal efficient form's CPU kernels at a revision before and now (its chunks' blocks in
the direct kernel), beside the causal direct kernel and SDPA, in one process.

    python benchmarks/op_cpu/direct-kernel/causal_ab.py --before 0a1b2c3 16x256 64x1024 ...

For each d x N (B 1, H 4, dv = d, float32, causal, no mask, normalised q and k, τ = 1,
2 threads): forward + backward of ``cpu_causal_efficient_taylor_shift`` at ``--before``
(exported as ``taylorshift_before``, benchmarks/op_cpu/workspace/ab.py) and in the working
tree, ``cpu_direct_taylor_shift`` (causal) and SDPA (``is_causal=True``), in shuffled
rounds. Prints medians (ms) and ratios paired by round.
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
    parser.add_argument("points", nargs="+", help="d x N, e.g. 64x1024")
    parser.add_argument("--before", required=True, help="a git revision of this repository")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    install_before(args.before, "ts-causal-ab-")
    from taylorshift_before.ops.cpu.efficient_causal import (
        cpu_causal_efficient_taylor_shift as before,
    )

    from taylorshift.ops.cpu.direct import cpu_direct_taylor_shift
    from taylorshift.ops.cpu.efficient_causal import cpu_causal_efficient_taylor_shift as after

    gen = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, {args.threads} threads, forward + backward, causal, "
          f"B 1, H 4, dv = d, float32, {args.rounds} rounds; before = {args.before}")  # fmt: skip
    print("| d | N | before ms | after ms | before / after | direct kernel ms "
          "| after / direct | SDPA ms | after / SDPA |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for d, n in (tuple(map(int, point.split("x"))) for point in args.points):
        q, k, v, g = (torch.randn(1, 4, n, d, generator=gen) for _ in range(4))
        leaves = [t.requires_grad_() for t in (q, k, v)]

        def run(form, leaves=leaves, g=g):
            torch.autograd.grad(form(*leaves), leaves, g)

        fns = {
            "before": lambda: run(lambda *x: before(*x, None, 1.0, None, True)),
            "after": lambda: run(lambda *x: after(*x, None, 1.0, None, True)),
            "direct": lambda: run(
                lambda *x: cpu_direct_taylor_shift(*x, None, True, 1.0, None, True)
            ),
            "sdpa": lambda: run(lambda *x: F.scaled_dot_product_attention(*x, is_causal=True)),
        }
        times = shuffled_rounds(fns, args.rounds)
        med = {name: statistics.median(ts) * 1e3 for name, ts in times.items()}

        def paired(x, y, times=times):
            return statistics.median(p / r for p, r in zip(times[x], times[y], strict=True))

        print(f"| {d} | {n:,} | {med['before']:.2f} | {med['after']:.2f} | "
              f"{paired('before', 'after'):.2f}× | {med['direct']:.2f} | "
              f"{paired('after', 'direct'):.2f} | {med['sdpa']:.2f} | "
              f"{paired('after', 'sdpa'):.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
