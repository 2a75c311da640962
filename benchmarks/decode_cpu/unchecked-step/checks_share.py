"""The share of `taylor_shift_decode`'s single-token step that its checks take.

    python benchmarks/decode_cpu/unchecked-step/checks_share.py

One layer's step of the model in ../report.md (B 1, H 8, d = dv = 32, a learnable-τ
tensor, float32, 2 threads) by the checked op (`inplace=True`) and by `decode_token`, 2,000
calls each per round, 15 rounds in alternating order; the state is the same tensor (its
values grow, which changes no operation's cost). Prints the medians in µs and the share.
"""

from __future__ import annotations

import statistics
import time

import torch

from taylorshift import TaylorShiftState, taylor_shift_decode
from taylorshift.ops.taylor_shift.decode import decode_token


def main(rounds: int = 15, calls: int = 2000) -> None:
    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, 1, 32, generator=g) for _ in range(3))
    tau = torch.ones(1, 8, 1, 1)
    state = TaylorShiftState.zeros(1, 8, 32, 32)
    cases = {
        "checked": lambda: taylor_shift_decode(q, k, v, state, temperature=tau, inplace=True),
        "decode_token": lambda: decode_token(q, k, v, state, tau),
    }
    times = {name: [] for name in cases}
    with torch.inference_mode():
        for r in range(rounds):
            for name in list(cases)[:: 1 if r % 2 else -1]:
                start = time.perf_counter()
                for _ in range(calls):
                    cases[name]()
                times[name].append((time.perf_counter() - start) / calls * 1e6)
    us = {name: statistics.median(ts) for name, ts in times.items()}
    share = 1 - us["decode_token"] / us["checked"]
    print(f"torch {torch.__version__}, 2 threads: checked {us['checked']:.1f} µs, "
          f"decode_token {us['decode_token']:.1f} µs; checks {share:.0%} of the step")  # fmt: skip


if __name__ == "__main__":
    main()
