"""The blocked direct form against the autograd one it replaced, and SDPA, in one run.

Forward + backward of the direct form, fp32, one thread, median of 5 after 2 warm-ups.
The old form is read from git (``--old REV``, default the commit before the change), so
both run in the same process on the same inputs.

    python benchmarks/direct_cpu/bench_direct.py [--old eb16f47] > benchmarks/direct_cpu/results.txt
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from taylorshift.ops.taylor_shift import direct as new

ROOT = Path(__file__).resolve().parents[2]
CASES = [  # (B, H, N, d, causal): the LM preset, ListOps-CPU, digits, a long causal head
    (32, 4, 256, 16, True),
    (32, 4, 50, 16, False),
    (4, 4, 1024, 16, False),
    (1, 4, 2048, 64, True),
]


def load_old(rev: str):
    source = subprocess.run(
        ["git", "show", f"{rev}:src/taylorshift/ops/taylor_shift/direct.py"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    path = Path(tempfile.mkdtemp()) / "direct_old.py"
    path.write_text(source)
    name = "taylorshift.ops.taylor_shift.direct_old"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def median_ms(fn, reps: int = 5) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", default="eb16f47", help="git revision of the old direct form")
    args = parser.parse_args()
    torch.set_num_threads(1)
    old = load_old(args.old)
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"python {sys.version.split()[0]}, 1 thread, old = {args.old}")  # fmt: skip
    print("| B | H | N | d | causal | old ms | new ms | old / new | SDPA ms | new / SDPA |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for b, h, n, d, causal in CASES:
        q, k, v = (torch.randn(b, h, n, d, requires_grad=True) for _ in range(3))
        tau = torch.ones(1, h, 1, 1, requires_grad=True)

        def run(module, q=q, k=k, v=v, tau=tau, causal=causal):
            module.direct_taylor_shift(q, k, v, None, causal, tau, None, True, 2).sum().backward()

        def sdpa(q=q, k=k, v=v, causal=causal):
            F.scaled_dot_product_attention(q, k, v, is_causal=causal).sum().backward()

        t_old, t_new, t_sdpa = (
            median_ms(lambda: run(old)),
            median_ms(lambda: run(new)),
            median_ms(sdpa),
        )
        print(f"| {b} | {h} | {n} | {d} | {causal} | {t_old:.1f} | {t_new:.1f} | "
              f"{t_old / t_new:.2f} | {t_sdpa:.1f} | {t_new / t_sdpa:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
