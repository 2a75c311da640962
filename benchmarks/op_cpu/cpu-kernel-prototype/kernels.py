"""The prototype's two kernels alone (kernels.c), on random inputs already laid out.

    python benchmarks/op_cpu/cpu-kernel-prototype/kernels.py

B·H = 4, N = 4,096, dv = d, 2 threads: GFLOP/s of the state update and of the readout
(2·N·E(E+1)/2·cols flops each, E = d + 1, cols = dv + 1 padded to a multiple of 6), median
(taylorshift.bench.measure.time_call), beside a 4096² float32 matmul.
"""

from __future__ import annotations

import torch
from forward import LIB

from taylorshift.bench.measure import time_call


def seconds(fn) -> float:
    """Median seconds of ``fn`` (the project's ``time_call``: warm-up, then about 0.5 s)."""
    return time_call(fn).median_s


def main() -> None:
    torch.set_num_threads(2)
    a, b = torch.randn(4096, 4096), torch.randn(4096, 4096)
    print(f"4096² matmul: {2 * 4096**3 / seconds(lambda: a @ b) / 1e9:.0f} GFLOP/s")
    for d in (16, 32, 64):
        update, readout = rates(d)
        print(f"d = {d}: update {update:.0f} GFLOP/s, readout {readout:.0f} GFLOP/s")


def rates(d: int, bh: int = 4, n: int = 4096) -> tuple[float, float]:
    """GFLOP/s of the two kernels at head dim d."""
    e, cols = d + 1, (d + 1 + 5) // 6 * 6
    stride, pairs, padded = e + 16, e * (e + 1) // 2, LIB.padded_pairs(e)
    keys, values = torch.randn(bh, n, stride), torch.randn(bh, n, cols)
    state_t = torch.zeros(bh, cols, padded)
    queries, state = torch.randn(bh, e, n), torch.randn(bh, pairs, cols)
    y_t = torch.empty(bh, cols, n)
    flops = 2 * bh * n * pairs * cols
    update = seconds(lambda: LIB.state_update_b(
        bh, keys.data_ptr(), n, e, stride, values.data_ptr(), cols, state_t.data_ptr(), padded
    ))  # fmt: skip
    readout = seconds(lambda: LIB.readout_b(
        bh, queries.data_ptr(), n, e, state.data_ptr(), pairs, cols, y_t.data_ptr()
    ))  # fmt: skip
    return flops / update / 1e9, flops / readout / 1e9


if __name__ == "__main__":
    main()
