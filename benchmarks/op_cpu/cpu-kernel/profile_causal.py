"""Where the causal form's time goes with the CPU kernels: torch.profiler over 20 calls.

    python benchmarks/op_cpu/cpu-kernel/profile_causal.py > \\
        benchmarks/op_cpu/cpu-kernel/profile_causal.txt

B 1, H 4, N = 1,024, d = dv = 32, float32, forward + backward, 2 threads, chunks of 256.
The self time of ``CpuCausalEfficientFunction`` (and its backward) is the C kernels plus
Python; ``aten::bmm`` and the elementwise operations are the intra-chunk blocks (the direct
form's weighted sums in torch).
"""

from __future__ import annotations

import torch
from torch.profiler import profile

from taylorshift.ops.cpu.efficient_causal import cpu_causal_efficient_taylor_shift


def main() -> None:
    torch.set_num_threads(2)
    q, k, v, g = (torch.randn(1, 4, 1024, 32) for _ in range(4))
    leaves = [t.requires_grad_() for t in (q, k, v)]

    def call():
        out = cpu_causal_efficient_taylor_shift(*leaves, None, 1.0, None, True)
        torch.autograd.grad(out, leaves, g)

    for _ in range(5):
        call()
    with profile() as prof:
        for _ in range(20):
            call()
    print(f"torch {torch.__version__}, 2 threads, B 1, H 4, N 1024, d 32, 20 calls")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
