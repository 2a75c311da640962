"""The op at two revisions of this repository, SDPA and the authors' code, interleaved.

    python benchmarks/op_cpu/compare.py --before eb16f47 --after HEAD \\
        --authors /path/to/tobna/TaylorShift --out benchmarks/op_cpu/compare

Each implementation runs in its own worker process (a revision is checked out into a
temporary git worktree and put first on PYTHONPATH; the authors' ``taylor_shift.py`` is
loaded from their checkout, with stand-ins for the training-code modules it imports at the
top, so nothing of theirs is copied here). The driver walks the grid point by point and
asks every worker in turn for a few timed calls, several rounds per point, so that all
implementations at one point see the same machine state; a point's time is the median
over its rounds. The fp32 matmul rate (4096² × 4096²) is measured in the same run, between
the points, for the "share of the matmul rate" column.

Implementations: ``<rev>:efficient``, ``<rev>:direct``, ``<rev>:auto`` (the public op
with that mode), ``sdpa`` (torch's fused kernel, in the "after" worker) and
``authors:efficient`` / ``authors:direct`` (their ``TaylorShiftAttention._efficient_attention``
and ``_direct_attention`` on the same q, k, v, temperature 1).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

WORKER = r"""
import json, sys, time, types, importlib.util, math
import torch
import torch.nn.functional as F
torch.set_num_threads(int(sys.argv[1]))
kind = sys.argv[2]
authors = None
if kind == "authors":
    for name in ("timm", "timm.models", "timm.models.vision_transformer", "vit", "utils"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["timm.models.vision_transformer"].Block = object
    sys.modules["vit"].TimmViT = object
    sys.modules["utils"].list_flatten = lambda x: x
    spec = importlib.util.spec_from_file_location("authors_taylor_shift", sys.argv[3])
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    authors = mod.TaylorShiftAttention
else:
    from taylorshift import taylor_shift_attention

def make(impl, b, h, n, d):
    if impl == "sdpa":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v)
    if kind == "authors":
        layer = authors(h * d, num_heads=h)
        fn = layer._efficient_attention if impl == "efficient" else layer._direct_attention
        return lambda q, k, v: fn(q, k, v)
    return lambda q, k, v: taylor_shift_attention(q, k, v, mode=impl)

for line in sys.stdin:
    job = json.loads(line)
    if job.get("matmul"):
        a = torch.randn(4096, 4096); b_ = torch.randn(4096, 4096)
        a @ b_
        t = time.perf_counter(); a @ b_; dt = time.perf_counter() - t
        print(json.dumps({"gflops": 2 * 4096 ** 3 / dt / 1e9}), flush=True)
        continue
    b, h, n, d = job["B"], job["H"], job["N"], job["d"]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, generator=g) for _ in range(3))
    train = job["pass"] == "forward+backward"
    if train:
        for t in (q, k, v): t.requires_grad_()
    fn = make(job["impl"], b, h, n, d)
    def call():
        y = fn(q, k, v)
        if train:
            torch.autograd.grad(y.sum(), (q, k, v))
    try:
        for _ in range(job["warmup"]): call()
        times = []
        for _ in range(job["calls"]):
            t = time.perf_counter(); call(); times.append(time.perf_counter() - t)
        print(json.dumps({"times": times}), flush=True)
    except Exception as err:  # recorded as a result (out of memory, a failure)
        print(json.dumps({"error": f"{type(err).__name__}: {err}"[:300]}), flush=True)
"""


class Worker:
    def __init__(self, name: str, pythonpath: str | None, threads: int, kind: str, extra=()):
        env = dict(os.environ)
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(threads), kind, *extra],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip

    def ask(self, job: dict) -> dict:
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def checkout(rev: str, where: Path) -> str:
    sha = subprocess.run(
        ["git", "rev-parse", rev], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    subprocess.run(
        ["git", "worktree", "add", "--detach", "-f", str(where), sha],
        cwd=ROOT, check=True, capture_output=True,
    )  # fmt: skip
    return sha


def efficient_flops(n: int, d: int) -> float:
    """Model FLOPs of the symmetric efficient form, forward, one head (docs/theory.md)."""
    big_d = d * (d + 1) // 2 + d + 1
    return 2 * n * big_d * (d + 1) * 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="eb16f47")
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("--authors", type=Path, help="a checkout of tobna/TaylorShift")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dims", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--lengths", type=int, nargs="+",
                        default=[64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384])  # fmt: skip
    parser.add_argument("--passes", nargs="+", default=["forward", "forward+backward"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=0.3, help="seconds per call batch")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="ts-compare-"))
    revs = {"before": args.before, "after": args.after}
    shas = {label: checkout(rev, tmp / label) for label, rev in revs.items()}
    workers = {
        label: Worker(label, str(tmp / label / "src"), args.threads, "repo") for label in revs
    }
    if args.authors:
        workers["authors"] = Worker(
            "authors", None, args.threads, "authors", (str(args.authors / "taylor_shift.py"),)
        )
    impls = [("after", "sdpa")]
    impls += [(label, m) for label in revs for m in ("efficient", "direct", "auto")]
    if args.authors:
        impls += [("authors", "efficient"), ("authors", "direct")]

    rows, matmul = [], []
    started = time.time()
    try:
        for d in args.dims:
            for pass_ in args.passes:
                stopped: set[tuple[str, str]] = set()
                for n in args.lengths:
                    matmul.append(workers["after"].ask({"matmul": True})["gflops"])
                    point = {"d": d, "N": n, "pass": pass_, "B": args.batch, "H": args.heads}
                    samples: dict[str, list[float]] = {}
                    errors: dict[str, str] = {}
                    calls = {}
                    for round_ in range(args.rounds):
                        for worker, impl in impls:
                            key = f"{worker}:{impl}"
                            if (worker, impl) in stopped or key in errors:
                                continue
                            warmup = 1 if round_ else 2
                            job = {**point, "impl": impl, "warmup": warmup,
                                   "calls": calls.get(key, 1)}  # fmt: skip
                            reply = workers[worker].ask(job)
                            if "error" in reply:
                                errors[key] = reply["error"]
                                continue
                            t = statistics.median(reply["times"])
                            calls[key] = max(1, min(20, int(args.budget_s / max(t, 1e-6))))
                            samples.setdefault(key, []).append(t)
                    for key, ts in samples.items():
                        med = statistics.median(ts)
                        rows.append({**point, "impl": key, "ms": med * 1e3,
                                     "spread_ms": (max(ts) - min(ts)) * 1e3})  # fmt: skip
                        if med > 8.0:  # the next point would take far too long
                            stopped.add(tuple(key.split(":", 1)))
                    for key, err in errors.items():
                        rows.append({**point, "impl": key, "ms": None, "error": err})
                    print(f"d={d} {pass_} N={n} done ({time.time() - started:.0f} s)", flush=True)
    finally:
        for w in workers.values():
            w.close()
        for label in revs:
            subprocess.run(["git", "worktree", "remove", "--force", str(tmp / label)], cwd=ROOT)

    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    meta = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "revisions": shas,
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": args.threads,
        "matmul_gflops": {
            "median": statistics.median(matmul),
            "min": min(matmul),
            "max": max(matmul),
        },
        "seconds": round(time.time() - started),
    }
    from taylorshift.bench.files import write_json, write_text

    write_json(args.out / "results.json", {"meta": meta, "rows": rows})
    write_text(args.out / "table.md", table(rows, meta))
    print(table(rows, meta))


def table(rows: list[dict], meta: dict) -> str:
    """Per (d, pass): ms of every implementation by N, and after's efficient share of the
    matmul rate (model FLOPs / time / measured GFLOP/s)."""
    rate = meta["matmul_gflops"]["median"]
    out = [f"fp32 matmul rate in this run: {rate:.0f} GFLOP/s (median)\n"]
    groups: dict[tuple[int, str], dict[int, dict[str, dict]]] = {}
    for r in rows:
        groups.setdefault((r["d"], r["pass"]), {}).setdefault(r["N"], {})[r["impl"]] = r
    for (d, pass_), by_n in groups.items():
        impls = sorted({i for cells in by_n.values() for i in cells})
        out.append(f"\n### d = {d}, {pass_} (ms, median of rounds)\n")
        out.append("| N | " + " | ".join(impls) + " | after:efficient % of matmul rate |")
        out.append("|---" * (len(impls) + 2) + "|")
        for n, cells in sorted(by_n.items()):
            vals = []
            for i in impls:
                c = cells.get(i)
                if c is None:
                    vals.append("–")
                elif c.get("ms") is None:
                    vals.append("error")
                else:
                    vals.append(f"{c['ms']:.2f}")
            eff = cells.get("after:efficient")
            share = ""
            if eff and eff.get("ms"):
                flops = (
                    efficient_flops(n, d) * eff["H"] * eff["B"] * (3 if "backward" in pass_ else 1)
                )
                share = f"{flops / (eff['ms'] / 1e3) / 1e9 / rate * 100:.0f} %"
            out.append(f"| {n} | " + " | ".join(vals) + f" | {share} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
