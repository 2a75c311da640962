"""Causal grouped-query attention on the CPU: what the op runs (``kernel``: up to b52cd16's
record, causal.txt, key and value repeated to the query heads, then the fused causal
kernel; since the fifteenth session the grouped CPU causal kernel, README.md) against the
grouped PyTorch causal form (a state per key/value head, ``causal_efficient_taylor_shift``
called directly), forward + backward, one process, shuffled rounds.

    python benchmarks/gqa_cpu/causal.py [--rounds 7] [--threads 2]

B 1, H 8, Hkv 2, dv = d, float32, N = 2,048. Prints ms per call (medians) and the ratio.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from taylorshift import taylor_shift_attention
from taylorshift.ops.taylor_shift.efficient_causal import causal_efficient_taylor_shift


def calls(d: int, n: int) -> dict:
    """The two forward + backward calls at head dim d and length n."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 8, n, d, generator=g, requires_grad=True)
    k, v = (torch.randn(1, 2, n, d, generator=g, requires_grad=True) for _ in "kv")

    def kernel():
        out = taylor_shift_attention(q, k, v, is_causal=True, mode="efficient", enable_gqa=True)
        out.sum().backward()

    def grouped():
        causal_efficient_taylor_shift(q, k, v, None, 1.0, None, True).sum().backward()

    return {"kernel": kernel, "grouped": grouped}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, B 1, H 8, Hkv 2, float32, "
          f"forward + backward, medians of {args.rounds} shuffled rounds; ms per call")  # fmt: skip
    print("| d | N | kernel, repeated ms | grouped PyTorch form ms | grouped / kernel |")
    print("|---:|---:|---:|---:|---:|")
    for d, n in [(32, 2048), (64, 2048)]:
        fns = calls(d, n)
        for fn in fns.values():
            fn()
        times = {name: [] for name in fns}
        ratios = []
        for _ in range(args.rounds):
            got = {}
            for name in random.sample(list(fns), len(fns)):
                start = time.perf_counter()
                fns[name]()
                got[name] = time.perf_counter() - start
            for name, t in got.items():
                times[name].append(t)
            ratios.append(got["grouped"] / got["kernel"])
        kern, grp = (statistics.median(times[x]) * 1e3 for x in ("kernel", "grouped"))
        print(f"| {d} | {n} | {kern:.0f} | {grp:.0f} | {statistics.median(ratios):.2f}× |",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
