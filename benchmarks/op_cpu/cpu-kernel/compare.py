"""The library's CPU kernels (taylorshift/ops/cpu) against the PyTorch efficient form, the
prototype of benchmarks/op_cpu/cpu-kernel-prototype and SDPA, in one process.

    python benchmarks/op_cpu/cpu-kernel/compare.py [--forward] [--causal] 16x256 32x1024 ...

For each d x N (B 1, H 4, dv = d, float32, non-causal, no mask, normalised q and k, τ = 1,
2 threads unless --threads): forward + backward (or forward only with --forward) of the
PyTorch form (``efficient_taylor_shift``), the kernels (``cpu_efficient_taylor_shift``),
the prototype (forward + backward, non-causal only) and SDPA, in shuffled rounds
(benchmarks/op_cpu/workspace/ab.py). Prints medians (ms), the PyTorch / kernels ratio and
the prototype / kernels ratio paired by round, and the kernels' share of a 4096² matmul's
rate timed in the same rounds (counting 2·N·D·dv flops per feature product and head:
2 products forward, 6 forward + backward (2 for the state gradient, 2 for g_v, 2 for the
two pair gradients), D = d(d+1)/2 + d + 1). ``--causal``: the causal forms
(``causal_efficient_taylor_shift``, ``cpu_causal_efficient_taylor_shift``, SDPA with
``is_causal=True``), chunks of 256 tokens; the share then counts the same products (the
state products see each token once, as non-causal; the chunks' direct blocks are not
counted).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from taylorshift.ops.cpu.efficient import cpu_efficient_taylor_shift
from taylorshift.ops.cpu.efficient_causal import cpu_causal_efficient_taylor_shift
from taylorshift.ops.taylor_shift.efficient import efficient_taylor_shift
from taylorshift.ops.taylor_shift.efficient_causal import causal_efficient_taylor_shift

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "workspace"))
sys.path.insert(0, str(HERE.parent / "cpu-kernel-prototype"))
from ab import shuffled_rounds  # noqa: E402  (benchmarks/op_cpu/workspace/ab.py)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("points", nargs="+", help="d x N, e.g. 64x4096")
    parser.add_argument("--forward", action="store_true", help="forward only")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-prototype", action="store_true")
    parser.add_argument("--causal", action="store_true", help="the causal forms")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch_form, kernels = efficient_taylor_shift, cpu_efficient_taylor_shift
    if args.causal:
        torch_form, kernels = causal_efficient_taylor_shift, cpu_causal_efficient_taylor_shift
    prototype = None
    if not (args.forward or args.no_prototype or args.causal):
        from backward import Prototype  # builds the prototype's kernels.c

        prototype = Prototype.apply
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(4096, 4096, generator=gen), torch.randn(4096, 4096, generator=gen)
    what = ("forward" if args.forward else "forward + backward") + (
        ", causal" if args.causal else ""
    )
    print(f"torch {torch.__version__}, {args.threads} threads, {what}, B 1, H 4, dv = d, float32")
    print("| d | N | PyTorch form ms | kernels ms | PyTorch / kernels | prototype / kernels "
          "| SDPA ms | SDPA / kernels | kernels' share of matmul rate |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for d, n in (tuple(map(int, point.split("x"))) for point in args.points):
        q, k, v, g = (torch.randn(1, 4, n, d, generator=gen) for _ in range(4))
        leaves = [t.requires_grad_(not args.forward) for t in (q, k, v)]

        def run(form, leaves=leaves, g=g):
            out = form(*leaves)
            if not args.forward:
                torch.autograd.grad(out, leaves, g)

        fns = {
            "torch": lambda: run(lambda *x: torch_form(*x, None, 1.0, None, True)),
            "kernels": lambda: run(lambda *x: kernels(*x, None, 1.0, None, True)),
            "sdpa": lambda: run(
                lambda *x: F.scaled_dot_product_attention(*x, is_causal=args.causal)
            ),
            "matmul": lambda: a @ b,
        }
        if prototype is not None:
            fns["prototype"] = lambda: run(prototype)
        for fn in fns.values():
            fn()
        times = shuffled_rounds(fns, 5 if n >= 8192 else 15)
        med = {key: statistics.median(ts) for key, ts in times.items()}

        def paired(x: str, y: str = "kernels", times=times) -> str:
            if x not in times:
                return "-"
            ratios = (a / b for a, b in zip(times[x], times[y], strict=True))
            return f"{statistics.median(ratios):.2f}"

        big_d = d * (d + 1) // 2 + d + 1
        flops = (2 if args.forward else 6) * 2 * 4 * n * big_d * d
        rate = 2 * 4096**3 / med["matmul"]
        print(f"| {d} | {n} | {med['torch'] * 1e3:.1f} | {med['kernels'] * 1e3:.1f} "
              f"| {paired('torch')} | {paired('prototype')} | {med['sdpa'] * 1e3:.1f} "
              f"| {paired('sdpa')} | {flops / med['kernels'] / rate:.0%} |",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
