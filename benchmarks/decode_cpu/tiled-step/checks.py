"""What the checks of ``taylor_shift_decode`` cost a step: the checked op against
``decode_token`` (the layer caches' unchecked step), both on the CPU kernel, in one process.

    python benchmarks/decode_cpu/tiled-step/checks.py [--rounds 15]

B 1, H 8, d = dv = 32, float32, 2 threads, a zero state updated in place by each call;
shuffled rounds, each timing 200 calls of each; prints the medians (µs a step).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from taylorshift import TaylorShiftState, taylor_shift_decode
from taylorshift.ops.taylor_shift.decode import decode_token

B, H, D, CALLS = 1, 8, 32, 200


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, 1, D, generator=gen) for _ in "qkv")
    checked_state, lean_state = (TaylorShiftState.zeros(B, H, D, D) for _ in range(2))
    fns = {
        "taylor_shift_decode (checked)": lambda: taylor_shift_decode(
            q, k, v, checked_state, inplace=True
        ),
        "decode_token": lambda: decode_token(q, k, v, lean_state),
    }
    times = {name: [] for name in fns}
    for _ in range(args.rounds):
        names = list(fns)
        random.shuffle(names)
        for name in names:
            fns[name]()
            start = time.perf_counter()
            for _ in range(CALLS):
                fns[name]()
            times[name].append((time.perf_counter() - start) / CALLS)
    print(f"torch {torch.__version__}, 2 threads, B {B}, H {H}, d = dv = {D}, float32, "
          f"medians of {args.rounds} shuffled rounds of {CALLS} calls")  # fmt: skip
    for name, ts in times.items():
        print(f"{name}: {statistics.median(ts) * 1e6:.1f} µs a step")


if __name__ == "__main__":
    main()
