"""Where the grouped causal efficient form overtakes the direct form on the CPU, and what
``mode="auto"`` picks there: one process, the three calls in shuffled rounds.

    python benchmarks/gqa_cpu/causal_auto.py [--rounds 5] [--threads 2]

B 1, H 8, Hkv 2 (G = 4), dv = d, float32, causal, ``enable_gqa=True``, forward and forward +
backward. ``efficient``: the grouped CPU causal kernel; ``direct``: the direct form (key
and value repeated inside the op); ``auto``: what the op picks, named in the last column.
Prints ms per call (medians) and auto's time over the faster form's (paired by round).
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import time

import torch

from taylorshift import taylor_shift_attention
from taylorshift.ops.taylor_shift import dispatch

POINTS = {16: (256, 512, 1024), 32: (512, 768, 1152), 64: (1536, 2048, 3072)}
HEADS, KV_HEADS = 8, 2


def timed(fn, min_s=0.2) -> float:
    """Seconds per call over a loop of at least min_s."""
    fn()
    calls, start = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        spent = time.perf_counter() - start
        if spent >= min_s:
            return spent / calls


def calls(d: int, n: int, backward: bool) -> dict:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, HEADS, n, d, generator=g, requires_grad=backward)
    k, v = (torch.randn(1, KV_HEADS, n, d, generator=g, requires_grad=backward) for _ in "kv")

    def call(mode):
        def run():
            out = taylor_shift_attention(q, k, v, is_causal=True, mode=mode, enable_gqa=True)
            if backward:
                out.sum().backward()

        return run

    return {mode: call(mode) for mode in ("efficient", "direct", "auto")}


def picked(d: int, n: int, backward: bool) -> str:
    """The form ``auto`` runs for this call (the routing's own decision, spied on)."""
    seen = []
    real = dispatch.decide_mode

    def spy(*args, **kwargs):
        decision = real(*args, **kwargs)
        seen.append(decision.mode)
        return decision

    dispatch.decide_mode = spy
    try:
        calls(d, n, backward)["auto"]()
    finally:
        dispatch.decide_mode = real
    return seen[-1] if seen else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"{args.threads} threads, B 1, H {HEADS}, Hkv {KV_HEADS}, dv = d, float32, causal, "
        f"medians of {args.rounds} shuffled rounds; ms per call"
    )
    print("| pass | d | N | efficient (grouped) | direct | auto | auto / faster | auto ran |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for backward in (False, True):
        for d, lengths in POINTS.items():
            for n in lengths:
                fns = calls(d, n, backward)
                times = {name: [] for name in fns}
                ratios = []
                for _ in range(args.rounds):
                    order = list(fns)
                    random.shuffle(order)
                    got = {name: timed(fns[name]) for name in order}
                    for name, t in got.items():
                        times[name].append(t)
                    ratios.append(got["auto"] / min(got["efficient"], got["direct"]))
                med = {name: statistics.median(ts) * 1e3 for name, ts in times.items()}
                pass_name = "forward + backward" if backward else "forward"
                print(
                    f"| {pass_name} | {d} | {n} | {med['efficient']:.2f} | {med['direct']:.2f} "
                    f"| {med['auto']:.2f} | {statistics.median(ratios):.2f} "
                    f"| {picked(d, n, backward)} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
