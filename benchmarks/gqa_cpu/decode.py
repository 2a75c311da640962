"""Decoding with grouped-query attention on the CPU: one token step of
``taylor_shift_decode(..., enable_gqa=True)`` (a state per key/value head) against the same
step with key and value repeated to the query heads (a state per query head), one process,
shuffled rounds, ratios paired by round.

    python benchmarks/gqa_cpu/decode.py [--rounds 11] [--threads 2]

B 1 and 8, H 8 query heads, Hkv 2 (G = 4), d = dv = 64, float32, a state of 512 tokens;
``inplace=True`` as a decoding loop calls it. Prints a markdown table of medians (µs per
step) and the state sizes.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from taylorshift import taylor_shift_decode

HEADS, KV_HEADS, D = 8, 2, 64


def per_call(fn, min_s=0.2) -> float:
    fn()
    calls, start = 0, time.perf_counter()
    while (spent := time.perf_counter() - start) < min_s or calls == 0:
        fn()
        calls += 1
    return spent / calls


def steps(batch):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(batch, HEADS, 512, D, generator=g)
    k, v = (torch.randn(batch, KV_HEADS, 512, D, generator=g) for _ in "kv")
    _, grouped_state = taylor_shift_decode(q, k, v, enable_gqa=True)
    kr, vr = (t.repeat_interleave(HEADS // KV_HEADS, dim=1) for t in (k, v))
    _, repeated_state = taylor_shift_decode(q, kr, vr)
    q1, k1, v1 = q[:, :, :1], k[:, :, :1], v[:, :, :1]
    kr1, vr1 = kr[:, :, :1], vr[:, :, :1]

    def grouped():
        taylor_shift_decode(q1, k1, v1, grouped_state, enable_gqa=True, inplace=True)

    def repeated():  # the caller repeats the new token's key and value each step
        taylor_shift_decode(q1, kr1, vr1, repeated_state, inplace=True)

    sizes = {"grouped": grouped_state.nbytes, "repeated": repeated_state.nbytes}
    return {"grouped": grouped, "repeated": repeated}, sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {args.threads} threads, H {HEADS}, Hkv {KV_HEADS}, "
        f"d = dv = {D}, float32, medians of {args.rounds} shuffled rounds; µs per step"
    )
    print("| B | repeated µs | grouped µs | repeated / grouped | state MB: repeated | grouped |")
    print("|---:|---:|---:|---:|---:|---:|")
    for batch in (1, 8):
        fns, sizes = steps(batch)
        times = {name: [] for name in fns}
        ratios = []
        for _ in range(args.rounds):
            order = list(fns)
            random.shuffle(order)
            got = {name: per_call(fns[name]) for name in order}
            for name, t in got.items():
                times[name].append(t)
            ratios.append(got["repeated"] / got["grouped"])
        rep, grp = (statistics.median(times[x]) * 1e6 for x in ("repeated", "grouped"))
        print(
            f"| {batch} | {rep:.0f} | {grp:.0f} | {statistics.median(ratios):.2f}× | "
            f"{sizes['repeated'] / 1e6:.1f} | {sizes['grouped'] / 1e6:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
