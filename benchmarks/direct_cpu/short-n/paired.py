"""The direct form at short N before and after this change, timed in one process.

The old ``direct.py`` (git revision given on the command line, default 8d33a56) is loaded
beside the current one as a second module of the same package; rounds alternate old, new
and SDPA on the same inputs. Shapes of the listops-cpu preset's attention: batch 32,
4 heads of 16, N = 50 with the last 10 keys padded, a learnable τ; forward + backward
(gradients of q, k, v and τ) and forward alone.
Usage: python benchmarks/direct_cpu/short-n/paired.py [REV]
"""

from __future__ import annotations

import importlib.util
import random
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from taylorshift.ops.taylor_shift import direct as new


def load_old(rev: str):
    source = subprocess.run(
        ["git", "show", f"{rev}:src/taylorshift/ops/taylor_shift/direct.py"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    spec = importlib.util.spec_from_loader("taylorshift.ops.taylor_shift._old_direct", None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "taylorshift.ops.taylor_shift"
    exec(compile(source, f"{rev}:direct.py", "exec"), module.__dict__)
    return module


def main(rev: str = "8d33a56", rounds: int = 15, calls: int = 50) -> None:
    old = load_old(rev)
    random.seed(0)
    torch.set_num_threads(1)
    b, h, n, d = 32, 4, 50, 16
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, generator=g, requires_grad=True) for _ in range(3))
    tau = torch.ones(1, h, 1, 1, requires_grad=True)
    keep = torch.ones(b, 1, 1, n, dtype=torch.bool)
    keep[..., 40:] = False
    grad = torch.randn(b, h, n, d, generator=g)

    def form(module, backward):
        def call():
            with torch.set_grad_enabled(backward):
                y = module.direct_taylor_shift(q, k, v, keep, False, tau, None, True, 2)
                if backward:
                    torch.autograd.grad(y, (q, k, v, tau), grad)

        return call

    def sdpa(backward):
        def call():
            with torch.set_grad_enabled(backward):
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
                if backward:
                    torch.autograd.grad(y, (q, k, v), grad)

        return call

    print(f"torch {torch.__version__}, 1 thread; old = {rev}")
    for backward in (True, False):
        cases = {"old": form(old, backward), "new": form(new, backward), "SDPA": sdpa(backward)}
        times = {name: [] for name in cases}
        order = list(cases.items())
        for _ in range(rounds):
            random.shuffle(order)  # no case always runs after the same one
            for name, call in order:
                call()
                t0 = time.perf_counter()
                for _ in range(calls):
                    call()
                times[name].append((time.perf_counter() - t0) / calls * 1e3)
        ratio = [o / w for o, w in zip(times["old"], times["new"], strict=True)]
        q1, _, q3 = statistics.quantiles(ratio, n=4)
        what = "forward + backward" if backward else "forward"
        cells = ", ".join(f"{k} {statistics.median(t):.3f} ms" for k, t in times.items())
        print(f"{what}: {cells}; old / new {statistics.median(ratio):.2f}x ({q1:.2f}–{q3:.2f})")


if __name__ == "__main__":
    main(*sys.argv[1:2])
