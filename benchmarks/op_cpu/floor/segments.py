"""Where a forward + backward of the efficient form spends its time outside its two C calls,
measured in one process.

    python benchmarks/op_cpu/floor/segments.py [--rounds 15] 16x256 32x256 ...

For each d x N (B 1, H 4, dv = d, float32, no mask, normalised q and k, τ = 1, 2 threads):

1. In shuffled rounds, each timing as many back-to-back calls as the form runs in about
   20 ms (bound.py's ``per_call_rounds``):
   - ``form``: ``cpu_efficient_taylor_shift`` forward + ``torch.autograd.grad``, as a user
     calls it;
   - ``C passes``: its two C calls alone (``ts_efficient_forward``, then
     ``ts_efficient_backward``) on buffers allocated once, from Python through ctypes;
   - ``matmul``: a 4096² float32 matmul, for the rate;
   and ``ops``, the operation count at that rate (as bound.py: 6 feature products of
   2·N·D·d flops per head). Shares of the matmul rate: ``ops / form`` (the issue's measure,
   target ≥ 2/3) and ``ops / C passes`` (what the kernels reach with no Python around them).
2. The form again, 300 calls with the wrapper's C library replaced by a proxy that stamps
   the time around each C call: medians (µs) of the time before the forward's C call, the
   C forward, between the two C calls (the autograd graph, ``torch.autograd.grad`` and the
   backward's Python), the C backward and after it (freeing, returning the gradients).
3. The Python alone (every C kernel a no-op, as bound.py's ``wrapper``), one call at a time
   in shuffled order: right after another such call (hot), right after a real C backward
   call, and right after a 2 ms sleep. Medians (µs).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bound import per_call_rounds, without_kernels  # (this folder)

import taylorshift.ops.cpu.wrapper as wrapper
from taylorshift.ops.cpu.efficient import cpu_efficient_taylor_shift as kernels
from taylorshift.ops.taylor_shift.features import NORM_EPS

B, H = 1, 4


class Stamped:
    """The kernel library, each C call's start and end stamped into ``stamps``."""

    def __init__(self, library):
        self.library, self.stamps = library, {}

    def __getattr__(self, name):
        fn = getattr(self.library, name)

        def call(*args):
            self.stamps[name, 0] = time.perf_counter()
            status = fn(*args)
            self.stamps[name, 1] = time.perf_counter()
            return status

        return call


def inputs(d: int, n: int, gen: torch.Generator):
    q, k, v, g = (torch.randn(B, H, n, d, generator=gen) for _ in range(4))
    return q, k, v, g


def c_passes(q, k, v, g):
    """The form's two C calls on buffers allocated here once (the arguments of
    wrapper.forward_pass / backward_pass for this call: no mask, the float factor 1)."""
    lib = wrapper.library()
    _, _, n, d = q.shape
    bh = B * H
    rows, cols = wrapper.state_shape(d, d + 1)
    y, den, count = torch.empty(B, H, n, d), torch.empty(bh, n), torch.empty(bh)
    state = torch.empty(bh, rows, cols)
    gq, gk, gv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    threads = wrapper.kernel_threads()

    def run():
        wrapper.checked(lib.ts_efficient_forward(
            bh, n, n, d, d, q.data_ptr(), k.data_ptr(), v.data_ptr(), None, None, 1.0, 1,
            NORM_EPS, 0, 1, y.data_ptr(), den.data_ptr(), count.data_ptr(), state.data_ptr(),
            threads,
        ))  # fmt: skip
        wrapper.checked(lib.ts_efficient_backward(
            bh, n, n, d, d, q.data_ptr(), k.data_ptr(), v.data_ptr(), None, None, 1.0, 1,
            NORM_EPS, 0, 1, g.data_ptr(), y.data_ptr(), den.data_ptr(), count.data_ptr(),
            state.data_ptr(), gq.data_ptr(), gk.data_ptr(), gv.data_ptr(), None, threads,
        ))  # fmt: skip

    return run


def form_call(q, k, v, g):
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]

    def run():
        out = kernels(*leaves, None, 1.0, None, True)
        torch.autograd.grad(out, leaves, g)

    return run


def segments(form, calls: int = 300) -> dict:
    """Medians (µs) of the form's time before, in, between and after its two C calls."""
    real = wrapper.library
    stamped = Stamped(real())
    wrapper.library = lambda: stamped
    parts = {key: [] for key in ("before", "C forward", "between", "C backward", "after")}
    try:
        for _ in range(calls):
            start = time.perf_counter()
            form()
            end = time.perf_counter()
            s = stamped.stamps
            f0, f1 = s["ts_efficient_forward", 0], s["ts_efficient_forward", 1]
            b0, b1 = s["ts_efficient_backward", 0], s["ts_efficient_backward", 1]
            for key, t in zip(parts, (f0 - start, f1 - f0, b0 - f1, b1 - b0, end - b1),
                              strict=True):  # fmt: skip
                parts[key].append(t)
    finally:
        wrapper.library = real
    return {key: statistics.median(ts) * 1e6 for key, ts in parts.items()}


def python_alone(form, passes, rounds: int = 200) -> dict:
    """Medians (µs) of one call of the form with no-op kernels, right after another such
    call, after a real C backward call (``passes``), and after a 2 ms sleep."""
    empty = without_kernels(form)
    before = {"hot": empty, "after C passes": passes, "after 2 ms asleep": lambda: time.sleep(2e-3)}
    times = {key: [] for key in before}
    for _ in range(rounds):
        keys = list(before)
        random.shuffle(keys)
        for key in keys:
            before[key]()
            start = time.perf_counter()
            empty()
            times[key].append(time.perf_counter() - start)
    return {key: statistics.median(ts) * 1e6 for key, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("points", nargs="+", help="d x N, e.g. 32x256")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(4096, 4096, generator=gen), torch.randn(4096, 4096, generator=gen)
    print(f"torch {torch.__version__}, 2 threads, B {B}, H {H}, dv = d, float32, forward + "
          f"backward; medians of {args.rounds} shuffled rounds")  # fmt: skip
    rows = []
    for d, n in (tuple(map(int, point.split("x"))) for point in args.points):
        operands = inputs(d, n, gen)
        form, passes = form_call(*operands), c_passes(*operands)
        fns = {"form": form, "C passes": passes, "matmul": lambda: a @ b}
        med = {key: statistics.median(ts) for key, ts in per_call_rounds(fns, args.rounds).items()}
        big_d = (d + 1) * (d + 2) // 2
        ops = 6 * 2 * H * n * big_d * d / (2 * 4096**3 / med["matmul"])
        rows.append((d, n, ops, med, segments(form), python_alone(form, passes)))
        print(f"  done {d}x{n}", file=sys.stderr, flush=True)
    print("\n| d | N | ops (ms) | form (ms) | C passes (ms) | ops / form | ops / C passes "
          "| form − C passes (ms) |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for d, n, ops, med, _, _ in rows:
        form, passes = med["form"], med["C passes"]
        print(f"| {d} | {n} | {ops * 1e3:.3f} | {form * 1e3:.3f} | {passes * 1e3:.3f} "
              f"| {ops / form:.0%} | {ops / passes:.0%} "
              f"| {(form - passes) * 1e3:.3f} |")  # fmt: skip
    print("\nThe form's time around its C calls (µs, medians of 300 calls):\n")
    keys = list(rows[0][4])
    print("| d | N | " + " | ".join(keys) + " | outside the C calls |")
    print("|---:|---:|" + "---:|" * (len(keys) + 1))
    for d, n, _, _, seg, _ in rows:
        outside = seg["before"] + seg["between"] + seg["after"]
        print(f"| {d} | {n} | " + " | ".join(f"{seg[key]:.0f}" for key in keys)
              + f" | {outside:.0f} |")  # fmt: skip
    print("\nThe same Python with no-op kernels, one call (µs, medians of 200):\n")
    keys = list(rows[0][5])
    print("| d | N | " + " | ".join(keys) + " |")
    print("|---:|---:|" + "---:|" * len(keys))
    for d, n, _, _, _, alone in rows:
        print(f"| {d} | {n} | " + " | ".join(f"{alone[key]:.0f}" for key in keys) + " |")


if __name__ == "__main__":
    main()
