"""Eager against compiled efficient form with the CPU kernels, paired by round in one
process (the sweep of README.md times them in separate windows).

    python benchmarks/compile_cpu/kernels/paired.py

B 1, H 1, dv = d, float32, non-causal, forward + backward, 2 threads; 30 shuffled rounds
(benchmarks/op_cpu/workspace/ab.py) of ``taylor_shift_attention(mode="efficient")`` eager
and under ``torch.compile(fullgraph=True, dynamic=False)``. Prints the medians (ms) and
the eager / compiled ratio paired by round.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "op_cpu" / "workspace"))
from ab import shuffled_rounds

from taylorshift import taylor_shift_attention


def op(*x: torch.Tensor) -> torch.Tensor:
    return taylor_shift_attention(*x, mode="efficient")


def main() -> None:
    torch.set_num_threads(2)
    print(f"torch {torch.__version__}, 2 threads, forward + backward, B 1, H 1, dv = d")
    compiled_op = torch.compile(op, fullgraph=True, dynamic=False)
    for d, n in ((16, 4096), (32, 1024), (64, 4096)):
        q, k, v, g = (torch.randn(1, 1, n, d) for _ in range(4))
        leaves = [t.requires_grad_() for t in (q, k, v)]

        def eager(leaves=leaves, g=g):
            torch.autograd.grad(op(*leaves), leaves, g)

        def compiled(leaves=leaves, g=g):
            torch.autograd.grad(compiled_op(*leaves), leaves, g)

        for fn in (eager, compiled, eager, compiled):  # warm-up, compilation
            fn()
        times = shuffled_rounds({"eager": eager, "compiled": compiled}, 30)
        pairs = zip(times["eager"], times["compiled"], strict=True)
        ratio = statistics.median(a / b for a, b in pairs)
        ms = {name: round(statistics.median(ts) * 1e3, 2) for name, ts in times.items()}
        print(f"d = {d}, N = {n}: {ms} ms; eager / compiled (paired) {ratio:.2f}", flush=True)


if __name__ == "__main__":
    main()
