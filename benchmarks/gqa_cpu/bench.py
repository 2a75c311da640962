"""Grouped-query attention on the CPU: ``enable_gqa=True`` against the same call with key
and value repeated to the query heads (what a caller without it does), one process, the two
in shuffled rounds, ratios paired by round.

    python benchmarks/gqa_cpu/bench.py [--rounds 11] [--threads 2] [--causal-only]

B 1, H 8 query heads, Hkv = 2 key/value heads (G = 4), dv = d, float32, key padding of
the last eighth of the keys, non-causal and causal (both share the key side: the causal
calls of the efficient form through the grouped CPU causal kernel). Each timing is a loop
of calls lasting about 0.2 s; prints a markdown table of medians.
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import time

import torch

from taylorshift import taylor_shift_attention

POINTS = [  # (mode, causal, d, N)
    ("efficient", False, 32, 2048),
    ("efficient", False, 64, 1024),
    ("efficient", False, 64, 4096),
    ("direct", False, 32, 512),
    ("direct", False, 64, 1024),
    ("efficient", True, 16, 4096),
    ("efficient", True, 32, 2048),
    ("efficient", True, 64, 2048),
]
HEADS, KV_HEADS = 8, 2


def timed(fn, min_s=0.2) -> float:
    """Median-free loop timing: seconds per call over a loop of at least min_s."""
    fn()
    calls, start = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        spent = time.perf_counter() - start
        if spent >= min_s:
            return spent / calls


def shuffled_rounds(fns: dict, rounds: int) -> list[dict]:
    """``rounds`` rounds of ``timed`` seconds per call of each function, in a shuffled order
    each round: one dict per round (for ratios paired by round)."""
    out = []
    for _ in range(rounds):
        order = list(fns)
        random.shuffle(order)
        out.append({name: timed(fns[name]) for name in order})
    return out


def cases(mode, causal, d, n, backward):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, HEADS, n, d, generator=g, requires_grad=backward)
    k = torch.randn(1, KV_HEADS, n, d, generator=g, requires_grad=backward)
    v = torch.randn(1, KV_HEADS, n, d, generator=g, requires_grad=backward)
    pad = torch.ones(1, 1, 1, n, dtype=torch.bool)
    pad[..., n - n // 8 :] = False
    groups = HEADS // KV_HEADS

    def grouped():
        out = taylor_shift_attention(q, k, v, pad, causal, mode=mode, enable_gqa=True)
        if backward:
            out.sum().backward()

    def repeated():
        kr, vr = (t.repeat_interleave(groups, dim=1) for t in (k, v))
        out = taylor_shift_attention(q, kr, vr, pad, causal, mode=mode)
        if backward:
            out.sum().backward()

    return {"grouped": grouped, "repeated": repeated}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--causal-only", action="store_true", help="only the causal points")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"{args.threads} threads, B 1, H {HEADS}, Hkv {KV_HEADS}, dv = d, float32, "
        f"key padding, medians of {args.rounds} shuffled rounds; ms per call"
    )
    print("| mode | causal | pass | d | N | repeated | grouped | repeated / grouped |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for mode, causal, d, n in POINTS:
        if args.causal_only and not causal:
            continue
        for backward in (False, True):
            rounds = shuffled_rounds(cases(mode, causal, d, n, backward), args.rounds)
            ratios = [got["repeated"] / got["grouped"] for got in rounds]
            rep, grp = (statistics.median(got[x] for got in rounds) * 1e3
                        for x in ("repeated", "grouped"))  # fmt: skip
            pass_name = "forward + backward" if backward else "forward"
            print(
                f"| {mode} | {'yes' if causal else 'no'} | {pass_name} | {d} | {n} | "
                f"{rep:.2f} | {grp:.2f} | {statistics.median(ratios):.2f}× |",
                flush=True,
            )


if __name__ == "__main__":
    main()
