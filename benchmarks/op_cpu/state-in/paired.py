"""A causal call with a prefix state in and none out (a rank of sequence parallelism, a
segment continuing a state) on the CPU kernel: the sweep that stops adding keys where
later queries stop reading them (a negative chunk, efficient_causal.c) against the sweep
that adds every key of the block as for a state out, which such calls ran before.

    python benchmarks/op_cpu/state-in/paired.py > benchmarks/op_cpu/state-in/paired.txt

B 1, H 4, dv = d, float32, 2 threads, a prefix of 64 keys. Both are the same
``StateFunction`` of ``ops/cpu/efficient_causal.py`` in one process, one library, called
with the chunk negated (now) and not (before): forward under ``torch.inference_mode()`` and
forward + backward (gradients of q, k, v and the prefix's sums). Each point: 20 rounds in
shuffled order (benchmarks/op_cpu/workspace/ab.py), medians and the ratio paired by round.
"""

from __future__ import annotations

import platform
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workspace"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "compile_cpu" / "state"))
from ab import shuffled_rounds
from paired import prefix, timed_call  # (benchmarks/compile_cpu/state: the same prefix)

from taylorshift.ops.cpu.efficient_causal import StateFunction, default_chunk

POINTS = [(16, 512), (16, 2048), (32, 512), (32, 2048), (64, 512), (64, 2048), (64, 4096)]
ROUNDS = 20


def sweep(option: int):
    """StateFunction from the prefix ``sums``: (y, the kernel's state buffer)."""

    def call(q, k, v, sums):
        return StateFunction.apply(q, k, v, None, 1.0, True, None, option, sums)

    return call


def main() -> None:
    torch.set_num_threads(2)
    torch.manual_seed(0)
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"2 threads, B 1, H 4, dv = d, float32, {ROUNDS} shuffled rounds")  # fmt: skip
    for d, n in POINTS:
        chunk = default_chunk(d)
        q, k, v, g = (torch.randn(1, 4, n, d) for _ in range(4))
        leaves = [t.requires_grad_() for t in (q, k, v, prefix(d))]
        fns = {"before (every key)": sweep(chunk), "now (no key past use)": sweep(-chunk)}
        for backward in (False, True):
            calls = {name: timed_call(fn, backward, leaves, g) for name, fn in fns.items()}
            for call in (*calls.values(), *calls.values()):  # warm-up
                call()
            times = shuffled_rounds(calls, ROUNDS)
            ms = {name: round(statistics.median(ts) * 1e3, 3) for name, ts in times.items()}
            before, now = times["before (every key)"], times["now (no key past use)"]
            ratio = statistics.median(a / b for a, b in zip(before, now, strict=True))
            pass_name = "forward + backward" if backward else "forward"
            print(f"d = {d}, N = {n} (chunks of {chunk}), {pass_name}: {ms} ms; "
                  f"before / now {ratio:.2f}x", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
