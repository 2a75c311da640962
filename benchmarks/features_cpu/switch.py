"""Where the feature map's two eager paths cross: the outer product and one gather against
the triangle row by row, at d = 16, 32, 64 and 64 … 1,024 tokens; shuffled rounds in one
process, median µs. Usage: python benchmarks/features_cpu/switch.py
"""

import random
import statistics as st
import time

import torch

from taylorshift.ops.taylor_shift import features as F

torch.set_num_threads(2)
random.seed(0)


def run(x, gather):
    F.GATHER_MAX_ELEMENTS = 10**9 if gather else 0
    return F.features(x)


res = {}
cases = [(d, n, g) for d in (16, 32, 64) for n in (64, 128, 256, 512, 1024) for g in (True, False)]
xs = {(d, n): torch.randn(1, 1, n, d) for d in (16, 32, 64) for n in (64, 128, 256, 512, 1024)}
for _ in range(9):
    random.shuffle(cases)
    for d, n, g in cases:
        x = xs[(d, n)]
        run(x, g)
        t = time.perf_counter()
        for _ in range(20):
            run(x, g)
        res.setdefault((d, n, g), []).append((time.perf_counter() - t) / 20 * 1e6)
F.GATHER_MAX_ELEMENTS = 8192
for d in (16, 32, 64):
    for n in (64, 128, 256, 512, 1024):
        a = st.median(res[(d, n, True)])
        b = st.median(res[(d, n, False)])
        print(f"d={d} tokens={n}: gather {a:.0f} us, slices {b:.0f} us, slices/gather {b / a:.2f}")
