"""What the efficient form's wrappers cost around their C kernels, at two revisions, in one
process: forward + backward with every kernel call replaced by a no-op.

    python benchmarks/op_cpu/efficient-passes/overhead.py --before 089e6f9 [--rounds 15] \
        [--direct] [--kernels] [--points 16x256 64x1024 ...]

For the non-causal (``cpu_efficient_taylor_shift``) and the causal
(``cpu_causal_efficient_taylor_shift``) kernel forms (with ``--direct``, also the direct
kernel form ``cpu_direct_taylor_shift``), before and after, the library object
of every ``taylorshift.ops.cpu`` module is swapped for one whose functions return 0 at
once, so what is timed is the Python, the torch operations and the autograd bookkeeping
around the C calls (outputs are garbage); with ``--kernels`` the kernels stay, for the
whole cost of short calls in the same loop. Beside them, the floor: an autograd.Function
whose forward and backward only allocate their outputs. B 1, H 4, float32, 2 threads;
medians of shuffled rounds of 50 calls, in µs per forward + backward.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workspace"))
from ab import install_before, shuffled_rounds  # (benchmarks/op_cpu/workspace/ab.py)

# the ops/cpu modules that call kernels, at any revision (wrapper.py since 2026-11-26)
MODULES = ("efficient", "efficient_causal", "direct", "wrapper")
POINTS = ((16, 256), (16, 1024), (64, 1024))
CALLS = 50


class NoKernels:
    """Every kernel returns 0 (success) at once."""

    def __getattr__(self, name):
        return lambda *args: 0


class Floor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value):
        return torch.empty_like(value)

    @staticmethod
    def backward(ctx, grad):
        return torch.empty(grad.shape), torch.empty(grad.shape), torch.empty(grad.shape)


def forms(package: str, kernels: bool) -> dict:
    """The package's kernel forms, its ops/cpu modules emptied of kernels unless
    ``kernels``."""
    for name in MODULES:
        try:
            module = importlib.import_module(f"{package}.ops.cpu.{name}")
        except ModuleNotFoundError:  # (a revision without it)
            continue
        if not kernels and hasattr(module, "library"):
            module.library = NoKernels
    efficient = importlib.import_module(f"{package}.ops.cpu.efficient")
    causal = importlib.import_module(f"{package}.ops.cpu.efficient_causal")
    direct = importlib.import_module(f"{package}.ops.cpu.direct").cpu_direct_taylor_shift
    return {
        "non-causal": lambda *x: efficient.cpu_efficient_taylor_shift(*x, None, 1.0, None, True),
        "causal": lambda *x: causal.cpu_causal_efficient_taylor_shift(*x, None, 1.0, None, True),
        "direct": lambda *x: direct(*x, None, False, 1.0, None, True),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="a git revision of this repository")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--direct", action="store_true", help="the direct kernel form too")
    parser.add_argument("--kernels", action="store_true", help="keep the kernels")
    parser.add_argument("--points", nargs="+", default=[f"{d}x{n}" for d, n in POINTS])
    args = parser.parse_args()
    torch.set_num_threads(2)
    install_before(args.before)
    before = forms("taylorshift_before", args.kernels)
    after = forms("taylorshift", args.kernels)
    print(f"torch {torch.__version__}, 2 threads, B 1, H 4, float32, µs per "
          f"forward + backward, median of {args.rounds} rounds of {CALLS} calls, "
          f"{'the kernels' if args.kernels else 'no-op kernels'}")  # fmt: skip
    print("| form | d | N | before | after | before / after | floor |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    gen = torch.Generator().manual_seed(0)
    for d, n in (tuple(map(int, point.split("x"))) for point in args.points):
        q, k, v, g = (torch.randn(1, 4, n, d, generator=gen) for _ in range(4))
        leaves = [t.requires_grad_() for t in (q, k, v)]

        def loop(form, leaves=leaves, g=g):
            for _ in range(CALLS):
                torch.autograd.grad(form(*leaves), leaves, g)

        for kind in ("non-causal", "causal", "direct") if args.direct else ("non-causal", "causal"):
            fns = {
                "before": lambda f=before[kind]: loop(f),
                "after": lambda f=after[kind]: loop(f),
                "floor": lambda: loop(Floor.apply),
            }
            for fn in fns.values():
                fn()
            times = shuffled_rounds(fns, args.rounds)
            us = {key: statistics.median(ts) / CALLS * 1e6 for key, ts in times.items()}
            ratio = statistics.median(b / a for b, a in zip(times["before"], times["after"],
                                                            strict=True))  # fmt: skip
            print(f"| {kind} | {d} | {n} | {us['before']:.0f} | {us['after']:.0f} "
                  f"| {ratio:.2f} | {us['floor']:.0f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
