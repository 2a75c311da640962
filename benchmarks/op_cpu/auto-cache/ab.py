"""`mode="auto"` against `mode="direct"` at short N, before and after its decisions are
kept per call shape, in one process.

    python benchmarks/op_cpu/auto-cache/ab.py --before 55f6603 --rounds 40

B 1, H 4, N = 256 (where `auto` runs the direct form), d = 16, 32, 64, float32, forward
under ``torch.no_grad`` and forward + backward, 2 threads, no calibration file (the CPU
prior decides). Each round calls, in a shuffled order, 20 times each: the direct form, and
`auto` of the package at ``--before`` and of the working tree. Prints the medians and the
ratios to the direct form, paired by round.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workspace"))
from ab import install_before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="a git revision of this repository")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(2)
    install_before(args.before, "ts-auto-ab-")
    from taylorshift_before import taylor_shift_attention as before

    from taylorshift import taylor_shift_attention as after

    random.seed(0)
    print(f"torch {torch.__version__}, 2 threads, N = 256; before = {args.before}")
    for backward in (False, True):
        for d in (16, 32, 64):
            g = torch.Generator().manual_seed(d)
            q, k, v = (torch.randn(1, 4, 256, d, generator=g, requires_grad=True) for _ in "qkv")
            cases = {
                "direct": lambda q=q, k=k, v=v: after(q, k, v, mode="direct"),
                "auto before": lambda q=q, k=k, v=v: before(q, k, v),
                "auto after": lambda q=q, k=k, v=v: after(q, k, v),
            }
            times = {name: [] for name in cases}
            for _ in range(args.rounds):
                for name in random.sample(list(cases), len(cases)):
                    call = cases[name]
                    start = time.perf_counter()
                    for _ in range(args.calls):
                        with torch.set_grad_enabled(backward):
                            y = call()
                            if backward:
                                y.sum().backward()
                    times[name].append((time.perf_counter() - start) / args.calls * 1e3)
            ms = {name: statistics.median(ts) for name, ts in times.items()}
            ratios = {
                name: sorted(a / b for a, b in zip(times[name], times["direct"], strict=True))
                for name in ("auto before", "auto after")
            }
            quarter = args.rounds // 4
            cells = "; ".join(
                f"{name} / direct {statistics.median(r):.3f} "
                f"({r[quarter]:.2f}-{r[3 * quarter]:.2f})"
                for name, r in ratios.items()
            )
            what = "forward + backward" if backward else "forward"
            print(
                f"d={d} {what}: direct {ms['direct']:.3f} ms, auto before "
                f"{ms['auto before']:.3f}, auto after {ms['auto after']:.3f}; {cells}"
            )


if __name__ == "__main__":
    main()
