"""The efficient forward with features formed inside its products (a C prototype) against
the PyTorch efficient form, in one process.

    python benchmarks/op_cpu/cpu-kernel-prototype/forward.py 16x256 16x1024 32x1024 \\
        64x1024 64x4096 64x16384

Builds kernels.c (gcc, ``-O3 -march=native -fopenmp``) into a temporary folder, checks the
prototype against the float64 efficient form, then times, for each d x N (B 1, H 4, dv = d,
float32, non-causal, no mask, normalised q and k, τ = 1, 2 threads): the PyTorch form
(``efficient_taylor_shift``), the prototype (torch for the set-up: normalisation, padded
copies, the state's unpacking; C for the two products) and a 4096² matmul, in shuffled
rounds. Prints medians, the share of the matmul rate (counting 2·N·D·dv flops for each of
the two products per head, D = d(d+1)/2 + d + 1: the work of the form, not of the
prototype's padding) and the PyTorch /
prototype ratio paired by round. docs/cpu-kernel.md has the design.
"""

from __future__ import annotations

import ctypes
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from taylorshift.ops.taylor_shift.efficient import efficient_taylor_shift

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "workspace"))
from ab import shuffled_rounds  # noqa: E402  (benchmarks/op_cpu/workspace/ab.py)


def build() -> ctypes.CDLL:
    out = Path(tempfile.mkdtemp(prefix="ts-cpu-kernel-")) / "libkernels.so"
    subprocess.run(
        ["gcc", "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-o", str(out),
         str(HERE / "kernels.c")],
        check=True,
    )  # fmt: skip
    lib = ctypes.CDLL(str(out))
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.padded_pairs.argtypes, lib.padded_pairs.restype = [i], i
    lib.state_update_b.argtypes = [i, p, i, i, i, p, i, p, i]
    lib.readout_b.argtypes = [i, p, i, i, p, i, i, p]
    lib.pair_grad_b.argtypes = [i, p, i, i, p, i, p, i, p]
    return lib


LIB = build()
_PAIRS: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}


def unpacking(e: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded position of each pair (a, b >= a) and its weight: w = ((1 + s)² + 1)/2, so the
    pairs of x~ x~ᵀ count ½ on the diagonal and 1 off it (each off-diagonal pair twice)."""
    if e not in _PAIRS:
        index, weight, offset = [], [], 0
        for a in range(e):
            for b in range(a, e):
                index.append(offset + b - a)
                weight.append(0.5 if a == b else 1.0)
            offset += (e - a + 7) & ~7
        _PAIRS[e] = torch.tensor(index), torch.tensor(weight).unsqueeze(-1)
    return _PAIRS[e]


def prototype(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    b, h, n, d = q.shape
    dv, bh, e = v.shape[-1], b * h, d + 1
    stride, cols = e + 16, (dv + 1 + 5) // 6 * 6  # [v, 1] padded to whole register tiles
    qn = q / q.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    kn = k / k.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    keys = torch.zeros(bh, n, stride)
    keys[..., :d], keys[..., d] = kn.reshape(bh, n, d), 1.0
    values = torch.zeros(bh, n, cols)
    values[..., :dv], values[..., dv] = v.reshape(bh, n, dv), 1.0
    padded = LIB.padded_pairs(e)
    state_t = torch.zeros(bh, cols, padded)
    LIB.state_update_b(bh, keys.data_ptr(), n, e, stride, values.data_ptr(), cols,
                       state_t.data_ptr(), padded)  # fmt: skip
    index, weight = unpacking(e)
    state = (state_t.transpose(1, 2)[:, index, :] * weight).contiguous()
    n16 = (n + 15) // 16 * 16
    queries = torch.zeros(bh, e, n16)
    queries[:, :d, :n], queries[:, d, :] = qn.reshape(bh, n, d).transpose(1, 2), 1.0
    y_t = torch.empty(bh, cols, n16)
    LIB.readout_b(bh, queries.data_ptr(), n16, e, state.data_ptr(), state.shape[1], cols,
                  y_t.data_ptr())  # fmt: skip
    y = y_t[:, :, :n].transpose(1, 2) + 0.5 * values.sum(1, keepdim=True)
    return (y[..., :dv] / y[..., dv : dv + 1] * math.sqrt(n / d)).reshape(b, h, n, dv)


def main() -> None:
    torch.set_num_threads(2)
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 300, 32, generator=gen, dtype=torch.float64) for _ in range(3))
    exact = efficient_taylor_shift(q, k, v, None, 1.0, None, True)
    mine = (prototype(q.float(), k.float(), v.float()).double() - exact).abs().max().item()
    theirs = efficient_taylor_shift(q.float(), k.float(), v.float(), None, 1.0, None, True)
    theirs = (theirs.double() - exact).abs().max().item()
    print(f"torch {torch.__version__}, 2 threads; max error against float64 at (1, 4, 300, 32): "
          f"prototype {mine:.2e}, PyTorch form in float32 {theirs:.2e}")  # fmt: skip
    a, b = torch.randn(4096, 4096, generator=gen), torch.randn(4096, 4096, generator=gen)
    print("| d | N | PyTorch form ms | % of matmul rate | prototype ms | % | PyTorch / prototype "
          "(paired) | matmul GFLOP/s |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for d, n in (tuple(map(int, point.split("x"))) for point in sys.argv[1:]):
        q, k, v = (torch.randn(1, 4, n, d, generator=gen) for _ in range(3))
        big_d = d * (d + 1) // 2 + d + 1
        flops = 2 * (2 * 4 * n * big_d * d)  # two products of 2·N·D·dv flops per head
        fns = {
            "torch": lambda q=q, k=k, v=v: efficient_taylor_shift(q, k, v, None, 1.0, None, True),
            "prototype": lambda q=q, k=k, v=v: prototype(q, k, v),
            "matmul": lambda: a @ b,
        }
        with torch.no_grad():
            for fn in fns.values():
                fn()
            times = shuffled_rounds(fns, 5 if n >= 8192 else 15)
        med = {key: statistics.median(ts) for key, ts in times.items()}
        rate = 2 * 4096**3 / med["matmul"]
        pairs = zip(times["torch"], times["prototype"], strict=True)
        ratio = statistics.median(x / y for x, y in pairs)
        print(f"| {d} | {n} | {med['torch'] * 1e3:.1f} | {flops / med['torch'] / rate:.0%} "
              f"| {med['prototype'] * 1e3:.1f} | {flops / med['prototype'] / rate:.0%} "
              f"| {ratio:.2f} | {rate / 1e9:.0f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
