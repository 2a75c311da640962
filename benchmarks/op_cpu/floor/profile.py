"""Where a forward + backward of the CPU kernel form spends its CPU time: ``perf record``
attached to a loop of calls, then the samples by function.

    python benchmarks/op_cpu/floor/profile.py 16x4096 [--seconds 15] [--out perf.data]

B 1, H 4, dv = d, float32, normalised q and k, τ = 1, 2 threads; 20 warm-up calls, then
``perf record`` (Linux perf on the PATH) attached to this process while the loop runs for
``--seconds``. Prints the time per call and the samples by shared object and by symbol
(``perf report --sort dso`` / ``--sort symbol``, the first rows). Samples are CPU time of
both threads: an OpenMP thread that spins while the other works counts too.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import tempfile
import time

import torch

from taylorshift.ops.cpu.efficient import cpu_efficient_taylor_shift


def report(data: str, sort: str) -> str:
    """``perf report`` of ``data`` sorted by ``sort``: one line a row, share and name."""
    done = subprocess.run(
        ["perf", "report", "-i", data, "--no-children", "--sort", sort, "--stdio"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    rows = []
    for line in done.stdout.splitlines():
        words = [w for w in line.split() if w not in ("-", "[.]", "[k]")]
        if words and words[0].endswith("%") and not line.lstrip().startswith("#"):
            rows.append(f"{words[0]:>8}  {' '.join(words[1:])}")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("point", help="d x N, e.g. 16x4096")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--out", default=None, help="perf data file (default: a temporary)")
    args = parser.parse_args()
    d, n = map(int, args.point.split("x"))
    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(0)
    q, k, v, g = (torch.randn(1, 4, n, d, generator=gen) for _ in range(4))
    leaves = [t.requires_grad_() for t in (q, k, v)]

    def step():
        y = cpu_efficient_taylor_shift(*leaves, None, 1.0, None, True)
        torch.autograd.grad(y, leaves, g)

    for _ in range(20):
        step()
    data = args.out or os.path.join(tempfile.mkdtemp(), "perf.data")
    perf = subprocess.Popen(["perf", "record", "-q", "-o", data, "-p", str(os.getpid())])
    time.sleep(1.0)  # perf attached
    start, calls = time.perf_counter(), 0
    while time.perf_counter() - start < args.seconds:
        step()
        calls += 1
    elapsed = time.perf_counter() - start
    perf.send_signal(signal.SIGINT)
    perf.wait()
    print(f"torch {torch.__version__}, 2 threads, B 1, H 4, d = dv = {d}, N = {n}, float32: "
          f"{calls} calls, {elapsed / calls * 1e3:.3f} ms per forward + backward")  # fmt: skip
    print("\nby shared object:\n" + "\n".join(report(data, "dso").splitlines()[:8]))
    print("\nby symbol:\n" + "\n".join(report(data, "symbol").splitlines()[:20]))


if __name__ == "__main__":
    main()
