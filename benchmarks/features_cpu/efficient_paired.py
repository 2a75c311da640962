"""The efficient form with the old switch of the feature map (gather up to 64 tokens) and
the new one (up to 8,192 elements and 2^18 outer-product values), alternated in shuffled
rounds in one process.
Forward + backward of ``taylor_shift_attention(mode="efficient")``, batch 1, one head,
float32, two threads. Usage: python benchmarks/features_cpu/efficient_paired.py
"""

from __future__ import annotations

import random
import statistics
import time

import torch

from taylorshift.ops import taylor_shift_attention
from taylorshift.ops.taylor_shift import features

NEW = features.GATHER_MAX_ELEMENTS, features.GATHER_MAX_OUTER


def main(rounds: int = 11) -> None:
    random.seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("d | N | old ms | new ms | old / new (paired, q1–q3)")
    for d in (16, 32, 64):
        for n in (128, 256, 512):
            g = torch.Generator().manual_seed(0)
            q, k, v = (torch.randn(1, 1, n, d, generator=g, requires_grad=True) for _ in range(3))
            grad = torch.randn(1, 1, n, d, generator=g)

            def call(q=q, k=k, v=v, grad=grad):
                out = taylor_shift_attention(q, k, v, mode="efficient")
                torch.autograd.grad(out, (q, k, v), grad)

            times = {"old": [], "new": []}
            settings = [("old", (64 * d, 1 << 62)), ("new", NEW)]
            for _ in range(rounds):
                random.shuffle(settings)
                for name, limit in settings:
                    features.GATHER_MAX_ELEMENTS, features.GATHER_MAX_OUTER = limit
                    call()
                    t0 = time.perf_counter()
                    for _ in range(20):
                        call()
                    times[name].append((time.perf_counter() - t0) / 20 * 1e3)
            features.GATHER_MAX_ELEMENTS, features.GATHER_MAX_OUTER = NEW
            ratio = [o / w for o, w in zip(times["old"], times["new"], strict=True)]
            q1, _, q3 = statistics.quantiles(ratio, n=4)
            print(
                f"{d} | {n} | {statistics.median(times['old']):.3f} | "
                f"{statistics.median(times['new']):.3f} | "
                f"{statistics.median(ratio):.2f}x ({q1:.2f}–{q3:.2f})"
            )


if __name__ == "__main__":
    main()
