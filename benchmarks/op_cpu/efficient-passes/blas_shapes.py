"""Each feature product of the efficient form in the library's kernels against MKL's
product of the same shape on materialised features, in one process.

    python benchmarks/op_cpu/efficient-passes/blas_shapes.py 16x256 16x4096 32x1024 ...

For each d x N (4 heads, dv = d, u = [v, 1]: nu = d + 1 columns, float32, 2 threads unless
--threads), with Φ (N, D) the quadratic features of normalised x (D = (d+1)(d+2)/2):

    state     S = Φᵀ U     ts_state            against torch.bmm(Φᵀ, U), Φᵀ contiguous
    readout   Y = Φ S      ts_readout          against torch.bmm(Φ, S)
    gradient  W = U Sᵀ     ts_pair_grad        against torch.bmm(U, Sᵀ)

(the kernels form Φ inside their products; ts_pair_grad also contracts W with x, O(N D)
more). Each counted as 2·N·D·nu flops per head and set against a 4096² float32 matmul
timed in the same shuffled rounds: the rate a product of these skinny shapes reaches in
MKL, with its features given for free, is the realistic ceiling for the kernels' share.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

from taylorshift.ops.cpu.build import library
from taylorshift.ops.cpu.wrapper import ptr, state_shape

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workspace"))
from ab import shuffled_rounds  # (benchmarks/op_cpu/workspace/ab.py)


def features(x: torch.Tensor) -> torch.Tensor:
    """Φ (BH, N, D): x_a x_b (a <= b), x_a, 1, row by row of [x, 1]'s triangle."""
    ones = torch.ones(*x.shape[:-1], 1)
    xt = torch.cat([x, ones], -1)
    e = xt.shape[-1]
    a, b = torch.triu_indices(e, e)
    return (xt[..., a] * xt[..., b]).contiguous()


def calls(lib, d: int, n: int, bh: int, threads: int, gen: torch.Generator):
    """The six timed calls of one point (kernels and MKL products) and D."""
    x = torch.nn.functional.normalize(torch.randn(bh, n, d, generator=gen), dim=-1)
    v = torch.randn(bh, n, d, generator=gen)
    nu = d + 1
    u = torch.cat([v, torch.ones(bh, n, 1)], -1).contiguous()
    rows, cols = state_shape(d, nu)
    state = torch.empty(bh, rows, cols)
    y, den, gx = torch.empty(bh, n, d), torch.empty(bh, n), torch.empty(bh, n, d)
    count = torch.full((bh,), float(n))
    phi = features(x)
    phi_t = phi.transpose(1, 2).contiguous()
    s = torch.randn(bh, phi.shape[-1], nu, generator=gen)
    s_t = s.transpose(1, 2)
    fns = {
        "state kernel": lambda: lib.ts_state(bh, n, d, ptr(x), ptr(v), d, 1, None, ptr(state),
                                             0, threads),
        "state MKL": lambda: torch.bmm(phi_t, u),
        "readout kernel": lambda: lib.ts_readout(bh, n, d, ptr(x), ptr(state), cols, ptr(y), d,
                                                 None, ptr(count), 1, ptr(den), threads),
        "readout MKL": lambda: torch.bmm(phi, s),
        "gradient kernel": lambda: lib.ts_pair_grad(bh, n, d, ptr(x), ptr(v), d, 1, None,
                                                    ptr(state), cols, ptr(gx), threads),
        "gradient MKL": lambda: torch.bmm(u, s_t),
    }  # fmt: skip
    return fns, phi.shape[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("points", nargs="+", help="d x N, e.g. 16x4096")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lib, threads, bh = library(), args.threads, 4
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(4096, 4096, generator=gen), torch.randn(4096, 4096, generator=gen)
    print(f"torch {torch.__version__}, {threads} threads, {bh} heads, dv = d, float32, "
          f"{args.rounds} rounds; share of the 4096² matmul rate (ms in brackets)")  # fmt: skip
    print("| d | N | state: kernel | state: MKL | readout: kernel | readout: MKL "
          "| gradient: kernel | gradient: MKL |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for d, n in (tuple(map(int, point.split("x"))) for point in args.points):
        fns, big_d = calls(lib, d, n, bh, threads, gen)
        fns["matmul"] = lambda: a @ b
        for fn in fns.values():
            fn()
        times = shuffled_rounds(fns, args.rounds)
        med = {key: statistics.median(ts) for key, ts in times.items()}
        rate = 2 * 4096**3 / med["matmul"]
        flops = 2 * bh * n * big_d * (d + 1)
        cells = [f"{flops / med[key] / rate:.0%} ({med[key] * 1e3:.2f})" for key in fns
                 if key != "matmul"]  # fmt: skip
        print(f"| {d} | {n} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
