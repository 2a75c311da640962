"""What the custom op costs eagerly: the kernels' autograd.Function against their
``torch.library`` custom op (the path ``torch.compile`` takes), paired by round.

    python benchmarks/compile_cpu/kernels/custom_op.py

B 1, H 1, dv = d, float32, non-causal, forward + backward, 2 threads, 30 shuffled rounds
(benchmarks/op_cpu/workspace/ab.py); the same C calls on both paths.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "op_cpu" / "workspace"))
from ab import shuffled_rounds

from taylorshift.ops.cpu.wrapper import KernelFunction, cpu_forward


def main() -> None:
    torch.set_num_threads(2)
    print(f"torch {torch.__version__}, 2 threads, forward + backward, B 1, H 1, dv = d")
    factors = torch.ones(1)
    for d, n in ((16, 4096), (32, 1024)):
        q, k, v, g = (torch.randn(1, 1, n, d) for _ in range(4))
        leaves = [t.requires_grad_() for t in (q, k, v)]

        def function(leaves=leaves, g=g):
            out = KernelFunction.apply("efficient", 0, *leaves, None, 1.0, True, None)
            torch.autograd.grad(out, leaves, g)

        def custom_op(leaves=leaves, g=g):
            out = cpu_forward("efficient", 0, *leaves, None, factors, True)[0]
            torch.autograd.grad(out, leaves, g)

        for fn in (function, custom_op):
            fn()
        times = shuffled_rounds({"function": function, "custom op": custom_op}, 30)
        ms = {name: round(statistics.median(ts) * 1e3, 2) for name, ts in times.items()}
        print(f"d = {d}, N = {n}: {ms} ms", flush=True)


if __name__ == "__main__":
    main()
