"""The efficient form's chunk size against the caches: forward and forward + backward of
``taylor_shift_attention(mode="efficient")`` with the default chunk target
(``efficient.CHUNK_ELEMENTS`` feature elements per (B·H, C, D) block) set to each value of
``--targets``, alternated in shuffled rounds in one process, beside a 4096² float32 matmul
for the machine's rate.

Usage: python benchmarks/op_cpu/chunk/sweep.py [--rounds 7] [--targets 16 18 20 22]
(targets are log2 of the element count; 22 is the default before this study).
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import time

import torch

from taylorshift.ops import taylor_shift_attention
from taylorshift.ops.taylor_shift import efficient
from taylorshift.ops.taylor_shift.features import feature_dim

CASES = [  # (d, N), batch 1, 4 heads, float32
    (16, 4096),
    (32, 4096),
    (64, 4096),
    (64, 16384),
]


def efficient_flops(n: int, d: int, dv: int, heads: int, backward: bool) -> float:
    """The forward's two products φ(k)ᵀ[v, 1] and φ(q) S (2 FLOPs per multiply-add);
    forward + backward counted as 3× the forward, as for a matmul."""
    fwd = heads * 2 * 2 * n * feature_dim(d) * (dv + 1)
    return 3 * fwd if backward else fwd


def matmul_gflops(size: int = 4096, repeats: int = 5) -> float:
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best / 1e9


def time_call(fn, min_time: float = 0.3) -> float:
    fn()
    reps, elapsed = 0, 0.0
    t0 = time.perf_counter()
    while elapsed < min_time or reps < 2:
        fn()
        reps += 1
        elapsed = time.perf_counter() - t0
    return elapsed / reps * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--targets", type=int, nargs="+", default=[16, 17, 18, 19, 20, 22])
    p.add_argument("--cases", type=str, nargs="*", default=None, help="d:N pairs")
    args = p.parse_args()
    cases = [tuple(map(int, c.split(":"))) for c in args.cases] if args.cases else CASES
    random.seed(0)
    default = efficient.CHUNK_ELEMENTS
    print(
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; batch 1, 4 heads, float32"
    )
    print(f"matmul 4096² float32: {matmul_gflops():.1f} GFLOP/s (best of 5)")
    print(
        "pass | d | N | 2^target | chunk (tokens) | ms (median) | q1–q3 | GFLOP/s | "
        "vs 2^22 (paired median)"
    )
    for d, n in cases:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 4, n, d, generator=g, requires_grad=True) for _ in range(3))
        grad = torch.randn(1, 4, n, d, generator=g)

        def forward(q=q, k=k, v=v):
            with torch.no_grad():
                taylor_shift_attention(q, k, v, mode="efficient")

        def train(q=q, k=k, v=v, grad=grad):
            out = taylor_shift_attention(q, k, v, mode="efficient")
            torch.autograd.grad(out, (q, k, v), grad)

        for pass_name, fn in (("forward", forward), ("forward+backward", train)):
            times = {t: [] for t in args.targets}
            for _ in range(args.rounds):
                order = list(args.targets)
                random.shuffle(order)
                for t in order:
                    efficient.CHUNK_ELEMENTS = 1 << t
                    times[t].append(time_call(fn))
            efficient.CHUNK_ELEMENTS = default
            flops = efficient_flops(n, d, d, 4, pass_name != "forward")
            for t in args.targets:
                efficient.CHUNK_ELEMENTS = 1 << t
                chunk = efficient.balanced_chunk(n, efficient.default_chunk_size(4, d, d))
                efficient.CHUNK_ELEMENTS = default
                med = statistics.median(times[t])
                q1, _, q3 = statistics.quantiles(times[t], n=4)
                base = times.get(22)
                pairs = zip(base or [], times[t], strict=bool(base))
                rel = f"{statistics.median([b / x for b, x in pairs]):.2f}x" if base else "-"
                print(
                    f"{pass_name} | {d} | {n} | {t} | {chunk} | {med:.1f} | "
                    f"{q1:.1f}–{q3:.1f} | {flops / med / 1e6:.1f} | {rel}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
