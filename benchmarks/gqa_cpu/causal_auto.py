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
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import shuffled_rounds  # (this folder's bench.py)
from taylorshift import taylor_shift_attention
from taylorshift.ops.taylor_shift import dispatch

POINTS = {16: (256, 512, 1024), 32: (512, 768, 1152), 64: (1536, 2048, 3072)}
HEADS, KV_HEADS = 8, 2


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
                rounds = shuffled_rounds(calls(d, n, backward), args.rounds)
                ratios = [got["auto"] / min(got["efficient"], got["direct"]) for got in rounds]
                med = {name: statistics.median(got[name] for got in rounds) * 1e3
                       for name in rounds[0]}  # fmt: skip
                pass_name = "forward + backward" if backward else "forward"
                print(
                    f"| {pass_name} | {d} | {n} | {med['efficient']:.2f} | {med['direct']:.2f} "
                    f"| {med['auto']:.2f} | {statistics.median(ratios):.2f} "
                    f"| {picked(d, n, backward)} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
