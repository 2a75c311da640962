"""How close to the matmul rate the efficient form can get once a call's fixed cost is paid,
measured in one process.

    python benchmarks/op_cpu/floor/bound.py [--rounds 15] 16x256 16x1024 32x256 ...

For each d x N (B 1, H 4, dv = d, float32, no mask, normalised q and k, τ = 1, 2 threads),
forward and forward + backward, in shuffled rounds, each timing as many back-to-back calls
as the form runs in about 20 ms (warm caches: the floor at its lowest):

- ``form``: ``cpu_efficient_taylor_shift`` as it is;
- ``wrapper``: the same code with every C kernel a no-op during the call (the modules'
  kernel library swapped), i.e. the Python, torch and autograd cost around the kernels;
- ``floor``: an ``autograd.Function`` whose forward and backward only allocate their
  outputs: what any op called from PyTorch pays, whatever its kernels (its fastest round,
  not the median: the ceiling below is then the most generous the run allows);
- ``ops``: the operation count (2·N·D·dv flops per feature product and head, D =
  (d+1)(d+2)/2, 2 products forward and 6 forward + backward, as in efficient-passes/
  compare.py) at the rate of a 4096² float32 matmul timed in the same rounds.

Prints medians (ms) and three shares of the matmul rate: the form's (``ops / form``, the
issue's measure, target ≥ 2/3), the best any kernels could reach above the floor
(``ops / (ops + floor)``: kernels at the full matmul rate and nothing but the floor around
them), and the kernels' own (``ops / (form − wrapper)``).
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
from ab import repeated, shuffled_rounds  # (benchmarks/op_cpu/workspace/ab.py)
from overhead import MODULES, Floor, NoKernels  # (benchmarks/op_cpu/efficient-passes/)

from taylorshift.ops.cpu.efficient import cpu_efficient_taylor_shift as kernels

TIMED_S = 0.02  # calls per timing: as many as the form runs in about 20 ms (warm caches)


def without_kernels(fn):
    """``fn`` with the kernel library of every ops/cpu module a no-op during the call (the
    backward included when ``fn`` runs it)."""
    modules = [importlib.import_module(f"taylorshift.ops.cpu.{name}") for name in MODULES]
    modules = [module for module in modules if hasattr(module, "library")]

    def call(*args):
        real = [module.library for module in modules]
        for module in modules:
            module.library = NoKernels
        try:
            return fn(*args)
        finally:
            for module, library in zip(modules, real, strict=True):
                module.library = library

    return call


def per_call_rounds(fns: dict, rounds: int) -> dict:
    """Seconds per call of each function in ``rounds`` shuffled rounds, each timing as many
    back-to-back calls as ``fns["form"]`` runs in about 20 ms (one call of ``"matmul"``)."""
    for fn in fns.values():
        fn()
    start = time.perf_counter()
    fns["form"]()
    calls = max(1, round(TIMED_S / (time.perf_counter() - start)))
    timed = {key: fn if key == "matmul" else repeated(fn, calls) for key, fn in fns.items()}
    return {key: [t / (1 if key == "matmul" else calls) for t in ts]
            for key, ts in shuffled_rounds(timed, rounds).items()}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("points", nargs="+", help="d x N, e.g. 16x256")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(4096, 4096, generator=gen), torch.randn(4096, 4096, generator=gen)
    print(f"torch {torch.__version__}, 2 threads, B 1, H 4, dv = d, float32, medians of "
          f"{args.rounds} shuffled rounds; ms, and shares of the 4096² matmul rate")  # fmt: skip
    print("| pass | d | N | form | wrapper | floor | ops | ops / form | ops / (ops + floor) "
          "| ops / (form − wrapper) |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for d, n in (tuple(map(int, point.split("x"))) for point in args.points):
        q, k, v, g = (torch.randn(1, 4, n, d, generator=gen) for _ in range(4))
        for backward in (False, True):
            leaves = [t.detach().requires_grad_(backward) for t in (q, k, v)]

            def run(form, leaves=leaves, backward=backward, g=g):
                out = form(*leaves)
                if backward:
                    torch.autograd.grad(out, leaves, g)

            fns = {
                "form": lambda: run(lambda *x: kernels(*x, None, 1.0, None, True)),
                "wrapper": without_kernels(
                    lambda: run(lambda *x: kernels(*x, None, 1.0, None, True))
                ),
                "floor": lambda: run(Floor.apply),
                "matmul": lambda: a @ b,
            }
            times = per_call_rounds(fns, args.rounds)
            med = {key: statistics.median(ts) for key, ts in times.items()}
            big_d = (d + 1) * (d + 2) // 2
            ops = (6 if backward else 2) * 2 * 4 * n * big_d * d / (2 * 4096**3 / med["matmul"])
            form, wrapper, floor = med["form"], med["wrapper"], min(times["floor"])
            print(f"| {'forward + backward' if backward else 'forward'} | {d} | {n} "
                  f"| {form * 1e3:.3f} | {wrapper * 1e3:.3f} | {floor * 1e3:.3f} "
                  f"| {ops * 1e3:.3f} | {ops / form:.0%} | {ops / (ops + floor):.0%} "
                  f"| {ops / (form - wrapper):.0%} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
