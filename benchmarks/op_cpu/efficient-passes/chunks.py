"""The causal efficient kernels' chunk size, forward + backward, in one process.

    python benchmarks/op_cpu/efficient-passes/chunks.py 16x1024 16x4096 32x1024 64x2048 ...

For each d x N (B 1, H 4, dv = d, float32, no mask, 2 threads unless --threads):
``cpu_causal_efficient_taylor_shift`` with chunks of 64, 128, 256 and 512 tokens and SDPA
with ``is_causal=True``, in shuffled rounds (benchmarks/op_cpu/workspace/ab.py); medians
in ms. The intra-chunk blocks cost ∝ N·C·(d + dv), the state products ∝ N·D·dv whatever
C is, each chunk a few kernel calls: the best C grows with d.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from taylorshift.ops.cpu.efficient_causal import cpu_causal_efficient_taylor_shift

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workspace"))
from ab import shuffled_rounds  # (benchmarks/op_cpu/workspace/ab.py)

CHUNKS = (64, 128, 256, 512)


def calls(d: int, n: int, gen: torch.Generator) -> dict:
    """The timed forward + backward of each chunk size and of SDPA at one point."""
    q, k, v, g = (torch.randn(1, 4, n, d, generator=gen) for _ in range(4))
    leaves = [t.requires_grad_() for t in (q, k, v)]

    def run(form):
        torch.autograd.grad(form(*leaves), leaves, g)

    fns = {
        c: (lambda c=c: run(lambda *x: cpu_causal_efficient_taylor_shift(
            *x, None, 1.0, None, True, c)))
        for c in CHUNKS
    }  # fmt: skip
    fns["sdpa"] = lambda: run(lambda *x: F.scaled_dot_product_attention(*x, is_causal=True))
    return fns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("points", nargs="+", help="d x N, e.g. 16x1024")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, {args.threads} threads, causal forward + backward, B 1, "
          f"H 4, dv = d, float32, {args.rounds} rounds, ms")  # fmt: skip
    print("| d | N | " + " | ".join(f"C = {c}" for c in CHUNKS) + " | SDPA |")
    print("|---:|---:|" + "---:|" * (len(CHUNKS) + 1))
    for d, n in (tuple(map(int, point.split("x"))) for point in args.points):
        fns = calls(d, n, gen)
        for fn in fns.values():
            fn()
        times = shuffled_rounds(fns, args.rounds)
        med = [f"{statistics.median(times[key]) * 1e3:.2f}" for key in fns]
        print(f"| {d} | {n} | " + " | ".join(med) + " |", flush=True)


if __name__ == "__main__":
    main()
