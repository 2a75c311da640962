"""The direct form's CPU kernel (taylorshift/ops/cpu/direct.c) against the PyTorch direct
form and SDPA, in one process.

    python benchmarks/op_cpu/direct-kernel/compare.py [--forward] [--causal] [--mask] \
        [--heads H] [--batch B] 16x50 32x256 64x1024 ...

For each d x N (dv = d, float32, normalised q and k, τ a tensor per head as in a model,
2 threads unless --threads): forward + backward (or forward only with --forward) of the
PyTorch direct form (``direct_taylor_shift``, what ``mode="direct"`` ran before the
kernel), the kernel (``cpu_direct_taylor_shift``) and SDPA with the same mask, in shuffled
rounds (benchmarks/op_cpu/workspace/ab.py). ``--mask``: key padding with lengths drawn
from N/5 … N (one row full), as a padded batch; ``--causal``: causal. Prints medians (ms),
the ratios paired by round, and the kernel's share of a 4096² matmul's rate timed in the
same rounds, counting 2·Nq·Nk·(d + dv) flops per head forward and 2·Nq·Nk·(4d + 3dv)
forward + backward (the five backward products recompute the scores), halved when causal.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from taylorshift.ops.cpu.direct import cpu_direct_taylor_shift
from taylorshift.ops.taylor_shift.direct import direct_taylor_shift

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workspace"))
from ab import shuffled_rounds  # (benchmarks/op_cpu/workspace/ab.py)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("points", nargs="+", help="d x N, e.g. 16x50")
    parser.add_argument("--forward", action="store_true", help="forward only")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--mask", action="store_true", help="key padding")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(4096, 4096, generator=gen), torch.randn(4096, 4096, generator=gen)
    bsz, h = args.batch, args.heads
    what = "forward" if args.forward else "forward + backward"
    what += (", causal" if args.causal else "") + (", key padding" if args.mask else "")
    print(f"torch {torch.__version__}, {args.threads} threads, {what}, B {bsz}, H {h}, "
          f"dv = d, float32, {args.rounds} rounds")  # fmt: skip
    print("| d | N | PyTorch direct ms | kernel ms | PyTorch / kernel | SDPA ms "
          "| kernel / SDPA | kernel's share of matmul rate |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for d, n in (tuple(map(int, point.split("x"))) for point in args.points):
        q, k, v, g = (torch.randn(bsz, h, n, d, generator=gen) for _ in range(4))
        tau = torch.ones(1, h, 1, 1)
        leaves = [t.requires_grad_(not args.forward) for t in (q, k, v, tau)]
        mask = None
        if args.mask:
            lengths = torch.randint(max(1, n // 5), n + 1, (bsz,), generator=gen)
            lengths[0] = n
            mask = (torch.arange(n)[None, :] < lengths[:, None])[:, None, None, :]
            mask = mask.expand(bsz, h, 1, n)

        def run(form, leaves=leaves, g=g):
            out = form(*leaves)
            if not args.forward:
                torch.autograd.grad(out, leaves[:3], g)

        sdpa_mask, sdpa_causal = mask, args.causal
        if args.causal and mask is not None:  # SDPA takes one of the two: combine them
            sdpa_mask, sdpa_causal = mask & torch.ones(n, n, dtype=torch.bool).tril(), False

        def sdpa(q, k, v, _tau, mask=sdpa_mask, causal=sdpa_causal):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)

        def form_of(fn, mask=mask):
            return lambda *x: fn(*x[:3], mask, args.causal, x[3], None, True)

        torch_direct, kernel = form_of(direct_taylor_shift), form_of(cpu_direct_taylor_shift)
        fns = {
            "torch": lambda f=torch_direct: run(f),
            "kernel": lambda f=kernel: run(f),
            "sdpa": lambda: run(sdpa),
            "matmul": lambda: torch.mm(a, b),
        }
        times = shuffled_rounds(fns, args.rounds)
        med = {name: statistics.median(ts) for name, ts in times.items()}

        def paired(x, y, times=times):
            return statistics.median(p / r for p, r in zip(times[x], times[y], strict=True))

        per_head = (d + d) if args.forward else (4 * d + 3 * d)
        flops = 2 * n * n * per_head * bsz * h * (0.5 if args.causal else 1.0)
        rate = flops / med["kernel"]
        matmul_rate = 2 * 4096**3 / med["matmul"]
        print(f"| {d} | {n:,} | {med['torch'] * 1e3:.2f} | {med['kernel'] * 1e3:.2f} | "
              f"{paired('torch', 'kernel'):.2f}× | {med['sdpa'] * 1e3:.2f} | "
              f"{paired('kernel', 'sdpa'):.2f} | {100 * rate / matmul_rate:.0f} % |")  # fmt: skip


if __name__ == "__main__":
    main()
