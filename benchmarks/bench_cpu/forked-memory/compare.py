"""Peak memory of a forked worker against a new interpreter's, on the same recipes.

    python benchmarks/bench_cpu/forked-memory/compare.py --rounds 3

``taylorshift.bench.measure.measure_memory`` forks each CPU worker from a server that has
imported torch; before 2026-11-26 each worker was a new interpreter. Both run the same
``memory_worker`` (warm-up on small inputs, reset of the high-water mark, the call) with
glibc's mmap threshold fixed at 128 KiB; here the new-interpreter worker is started as the
old code started it (``MALLOC_MMAP_THRESHOLD_`` in its environment). Recipe: the op
benchmark's ``build_call`` (B 1, H 4, N 2,048, d 32, float32, 2 threads). Prints the peak
extra KiB of every round and the seconds per point.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from taylorshift.bench.measure import measure_memory

RECIPE = "taylorshift.bench.op.cases:build_call"
BASE = {"n": 2048, "d": 32, "heads": 4, "batch": 1, "dtype": "float32", "device": "cpu",
        "seed": 0, "module": None, "warmup_n": 64}  # fmt: skip


def new_interpreter(kwargs: dict) -> int:
    code = (
        "import json; from taylorshift.bench.measure import memory_worker; "
        f"print(json.dumps(memory_worker({RECIPE!r}, {kwargs!r}, 2)))"
    )
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 << 10)}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True)  # fmt: skip
    return json.loads(run.stdout.strip().splitlines()[-1])["peak_extra_bytes"]


def forked(kwargs: dict) -> int:
    return measure_memory(RECIPE, kwargs, threads=2).peak_extra_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print("| impl | pass | new interpreter (KiB) | forked (KiB) |")
    print("|---|---|---|---|")
    seconds = {"new interpreter": [], "forked": []}
    for impl in ("sdpa", "direct", "efficient"):
        for pass_name in ("forward", "forward+backward"):
            kwargs = {**BASE, "impl": impl, "pass_name": pass_name}
            peaks = {}
            for name, fn in (("new interpreter", new_interpreter), ("forked", forked)):
                peaks[name] = []
                for _ in range(args.rounds):
                    start = time.perf_counter()
                    peaks[name].append(fn(kwargs) >> 10)
                    seconds[name].append(time.perf_counter() - start)
            cells = " | ".join(", ".join(map(str, p)) for p in peaks.values())
            print(f"| {impl} | {pass_name} | {cells} |", flush=True)
    for name, times in seconds.items():
        times = sorted(times)
        print(f"{name}: median {times[len(times) // 2]:.2f} s per point "
              f"(the first forked point starts the server)")  # fmt: skip


if __name__ == "__main__":
    main()
