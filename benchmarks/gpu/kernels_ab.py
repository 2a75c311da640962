#!/usr/bin/env python3
"""The decisive GPU numbers in one command: the fused efficient kernels old against new,
the op against SDPA, bf16 error against float64, d = 128.

    python3 benchmarks/gpu/kernels_ab.py --export 60b8fc1 build/ab_before      # CPU, git
    python3 benchmarks/gpu/kernels_ab.py OUT_DIR --before-src build/ab_before  # GPU, <= 480 s
    python3 benchmarks/gpu/kernels_ab.py OUT_DIR --before-src build/ab_before --dry-run

``--export REV DIR`` writes the package of revision REV into DIR as ``taylorshift_before``
(its torch.library operators renamed: ``export_before`` of benchmarks/op_cpu/workspace/ab.py),
so that both revisions' kernels load in one process on a machine without git history.

Steps, each in its own process with its own deadline (a share of ``--budget-s``; time an
earlier step leaves unused goes to the later ones). A step stops starting points at its
deadline, is killed a few seconds after it, and a step that fails or is killed is recorded
with what it measured, and the next one runs. OUT_DIR/results.json and OUT_DIR/report.md
are rewritten after every step, OUT_DIR/steps/STEP.json (the running step's points) after
every point; every step's output goes to OUT_DIR/log.txt.

1. ``environment``: GPU, versions, a measured bf16 matmul rate (8192³), the reference peak;
2. ``kernels``: the non-causal efficient kernels (``triton_efficient_taylor_shift``) of
   the exported revision and of this one, forward and forward + backward, bf16,
   B, H, d = dv = 4, 8, 64, N = 16,384 and 4,096: ms, model TFLOP/s, share of the matmul
   rate, and each CUDA kernel's time per call (torch.profiler);
3. ``op``: ``taylor_shift_attention(mode="efficient")`` and ``mode="direct"`` against
   SDPA (its backend named), forward and forward + backward, causal and not, bf16,
   B·H = 32, d = 64, N = 1K … 128K doubling while the step's time allows, eager;
4. ``op_graph``: the forward of the efficient op and of SDPA eager and replayed from a
   CUDA graph (captured under no_grad after warm-up on a side stream), N = 1K … 16K;
5. ``error``: the efficient op in bf16 against the naive reference in float64 (queries in
   chunks), output and q/k/v gradients, beside the naive reference's own bf16 error,
   N = 4,096 (causal and not) and 65,536;
6. ``d128``: step 3's non-causal forward and forward + backward at d = 128, N = 4K, 16K.

report.md holds the tables and the ratios against the issue's targets. The dry run runs
every step on the CPU under Triton's interpreter (TRITON_INTERPRET=1,
TAYLORSHIFT_TRITON=interpret), float16 for bf16 (the interpreter has none), B·H = 2,
N = 64 and 128, d = 16 (32 for "d128"), CPU timers, and records the CUDA-graph step as
skipped. benchmarks/gpu/README.md ("Old against new, the op against SDPA") has the device
tool's commands and how the FLOPs are counted.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

if "--dry-run" in sys.argv[1:]:  # read by triton and taylorshift when they are imported
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["TAYLORSHIFT_TRITON"] = "interpret"

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
sys.path[:0] = [p for p in (str(SRC), str(ROOT)) if p not in sys.path]
AB = ROOT / "benchmarks" / "op_cpu" / "workspace" / "ab.py"
PACKAGE = "taylorshift_before"


@dataclass(frozen=True)
class Sizes:
    """The sizes and timing of one kind of run (the GPU's, or the dry run's)."""

    batch: int
    heads: int
    d: int
    kernel_n: tuple[int, ...]
    op_n: tuple[int, ...]
    graph_n: tuple[int, ...]
    error: tuple[tuple[int, int, int, bool], ...]  # (N, B, H, causal)
    error_entries: int  # float64 entries of one reference chunk's (B·H, rows, N) matrices
    d_wide: int
    wide_n: tuple[int, ...]
    matmul_n: int
    timing: dict | None  # time_call's arguments; None: one call a point, its time
    calls_per_point: int  # first call, warm-up and timed calls of a long point
    max_call_s: float  # a point whose call is predicted longer is not timed
    profile_calls: int
    stop_margin_s: float  # a step stops this long before it is killed
    targets: dict = field(default_factory=dict)  # the N, or the dry run's stand-ins


GPU = Sizes(
    batch=4,
    heads=8,
    d=64,
    kernel_n=(16384, 4096),  # the targets' N first
    op_n=tuple(1024 * 2**i for i in range(8)),
    graph_n=(1024, 2048, 4096, 8192, 16384),
    error=((4096, 4, 2, False), (4096, 4, 2, True), (65536, 1, 2, False), (65536, 1, 2, True)),
    error_entries=1 << 28,
    d_wide=128,
    wide_n=(4096, 16384),
    matmul_n=8192,
    timing=dict(target_s=0.2, min_reps=3, max_reps=20, warmup_s=0.05, min_warmup=1),
    calls_per_point=5,
    max_call_s=2.5,
    profile_calls=3,
    stop_margin_s=12,
    targets=dict(fwd_bwd_from=4096, ratio_at=65536, kernels_at=16384, causal_from=8192),
)
DRY = Sizes(
    batch=1,
    heads=2,
    d=16,
    kernel_n=(64, 128),
    op_n=(64, 128),
    graph_n=(64, 128),
    error=((64, 1, 2, False), (64, 1, 2, True), (128, 1, 2, False)),
    error_entries=2 * 32 * 64,
    d_wide=32,
    wide_n=(64, 128),
    matmul_n=256,
    timing=None,
    calls_per_point=1,
    max_call_s=60.0,
    profile_calls=1,
    stop_margin_s=5,
    targets=dict(fwd_bwd_from=64, ratio_at=128, kernels_at=128, causal_from=128),
)

# The targets ("GPU at tensor-core speed"): (key, text).
TARGETS = (
    ("fwd_bwd_from", "non-causal forward + backward faster than SDPA from N ≤ {fwd_bwd_from:,}"),
    ("ratio_at", "non-causal forward + backward ≥ 10× faster than SDPA at N = {ratio_at:,}"),
    ("kernels_fwd", "kernels ≥ 40 % of the measured matmul rate, forward, N ≥ {kernels_at:,}"),
    (
        "kernels_fwd_bwd",
        "kernels ≥ 30 % of the matmul rate, forward + backward, N ≥ {kernels_at:,}",
    ),
    ("causal_from", "causal forward + backward faster than SDPA causal from N ≤ {causal_from:,}"),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, nargs="?", help="folder for report.md, results.json")
    parser.add_argument(
        "--export",
        nargs=2,
        metavar=("REV", "DIR"),
        help=f"write revision REV's package into DIR as {PACKAGE}; no run",
    )
    parser.add_argument(
        "--before-src",
        type=Path,
        help=f"a folder holding {PACKAGE} (from --export): the old kernels",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=480.0,
        help="wall-clock time of all steps together (default 480)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="CPU, Triton's interpreter, float16, tiny sizes"
    )
    parser.add_argument("--step", help=argparse.SUPPRESS)  # one step, in its own process
    parser.add_argument("--deadline-at", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.export:
        return export(args.export[0], Path(args.export[1]))
    if args.out is None:
        parser.error("OUT_DIR is required (or --export REV DIR)")
    if args.step:
        return run_step(args)
    return orchestrate(args)


# The export (CPU side, where git is)


def export(rev: str, folder: Path) -> int:
    """``ab.export_before(rev, folder)``: ``folder/taylorshift_before`` (replaced if there),
    with the full commit in ``taylorshift_before/REVISION``."""
    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    package = folder / PACKAGE
    if package.exists():
        shutil.rmtree(package)
    spec = importlib.util.spec_from_file_location("ab", AB)
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    ab.export_before(rev, folder)
    with contextlib.suppress(OSError):  # export_before leaves the archive's empty src/
        (folder / "src").rmdir()
    full = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", rev], check=True, capture_output=True, text=True
    ).stdout.strip()
    (package / "REVISION").write_text(f"{rev} {full}\n")
    print(f"exported {rev} ({full[:12]}) as {package}")
    return 0


# The steps and their shares of the budget


@dataclass(frozen=True)
class Step:
    name: str
    share_s: float  # seconds of a 480 s budget; scaled with --budget-s
    what: str
    needs_cuda: bool = False  # the dry run records it as skipped without starting it


STEPS = (
    Step("environment", 25, "GPU, versions, measured bf16 matmul rate"),
    Step("kernels", 95, "efficient non-causal kernels, old against new"),
    Step("op", 170, "the op (efficient, direct) against SDPA, eager"),
    Step("op_graph", 40, "forward eager and from a CUDA graph", needs_cuda=True),
    Step("error", 55, "bf16 error against float64"),
    Step("d128", 60, "d = 128, non-causal"),
)
FINAL_S = 5.0  # kept for the last report
MIN_STEP_S = 15.0  # a step with less time left is not started


def orchestrate(args) -> int:
    out: Path = args.out.resolve()
    (out / "steps").mkdir(parents=True, exist_ok=True)
    sizes = DRY if args.dry_run else GPU
    before = args.before_src.resolve() if args.before_src else None
    results: dict = {
        "dry_run": args.dry_run,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "budget_s": args.budget_s,
        "before_src": str(before) if before else None,
        "sizes": {k: v for k, v in vars(sizes).items() if k != "timing"},
        "steps": {},
    }
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(ROOT), env.get("PYTHONPATH", "")])
    log = out / "log.txt"
    log.write_text("")
    end = time.monotonic() + args.budget_s - FINAL_S
    scale = (args.budget_s - FINAL_S) / sum(s.share_s for s in STEPS)
    for i, step in enumerate(STEPS):
        later = scale * sum(s.share_s for s in STEPS[i + 1 :])
        limit = end - later - time.monotonic()
        start = time.monotonic()
        if step.needs_cuda and args.dry_run:
            record = {"status": "skipped", "reason": "no CUDA device in the dry run"}
        elif limit < MIN_STEP_S:
            record = {"status": "over budget", "reason": f"{limit:.0f} s left for it"}
        else:
            record = child(step.name, limit, args, sizes, before, out, env, log)
        record["seconds"] = round(time.monotonic() - start, 1)
        record["limit_s"] = round(limit, 1)
        results["steps"][step.name] = record
        print(
            f"[kernels_ab] {step.name}: {record['status']} in {record['seconds']} s "
            f"(limit {limit:.0f} s)",
            flush=True,
        )
        write(out / "results.json", json.dumps(results, indent=1) + "\n")
        try:
            text = report(results)
        except Exception:  # the record is safe in results.json; the next step still runs
            text = f"# kernels_ab.py: the report failed\n\n```\n{traceback.format_exc()}```\n"
        write(out / "report.md", text)
    bad = [n for n, r in results["steps"].items() if r["status"] not in ("ok", "skipped")]
    print(f"[kernels_ab] wrote {out}/report.md; steps not ok: {bad or 'none'}", flush=True)
    return 1 if bad else 0


def write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def child(name: str, limit: float, args, sizes: Sizes, before, out: Path, env, log) -> dict:
    """Run step ``name`` in its own process, killed after ``limit`` seconds; its record."""
    part = out / "steps" / f"{name}.json"
    part.unlink(missing_ok=True)
    deadline = time.time() + limit - sizes.stop_margin_s
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        str(out),
        "--step",
        name,
        "--deadline-at",
        f"{deadline:.3f}",
    ]
    cmd += ["--dry-run"] if args.dry_run else []
    cmd += ["--before-src", str(before)] if before else []
    try:
        done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=limit)
        code, text = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as err:
        code = "timeout"
        text = "".join(
            (s or b"").decode(errors="replace") if isinstance(s, bytes) else (s or "")
            for s in (err.stdout, err.stderr)
        )
    with log.open("a") as f:
        f.write(f"===== {name} (exit {code}) =====\n{text}\n")
    record = json.loads(part.read_text()) if part.is_file() else {}
    if code == "timeout":
        record["status"] = "timeout"
        record["reason"] = f"killed at its limit of {limit:.0f} s (points so far kept)"
    elif code != 0 or not record:
        record["status"] = "error"
        record.setdefault("error", text[-2000:] or f"exit {code}, no output")
    part.unlink(missing_ok=True)
    return record


# One step, in its own process


class Ctx:
    """What a step needs: sizes, device, dtype, its deadline and its record (saved after
    every point to OUT/steps/STEP.json)."""

    def __init__(self, args):
        import torch

        self.dry = args.dry_run
        self.sizes = DRY if self.dry else GPU
        self.device = torch.device("cpu" if self.dry else "cuda")
        self.cuda = self.device.type == "cuda"
        self.dtype = torch.float16 if self.dry else torch.bfloat16  # interpreter: no bf16
        self.deadline = args.deadline_at or math.inf
        self.out: Path = args.out.resolve()
        self.before: Path | None = args.before_src
        self.path = self.out / "steps" / f"{args.step}.json"
        self.record: dict = {
            "status": "running",
            "dtype": str(self.dtype).split(".")[-1],
            "points": [],
        }
        self.last: dict = {}  # series -> (N, seconds of its last timed call)
        self.gen = torch.Generator(device=self.device).manual_seed(0)

    def left(self) -> float:
        return self.deadline - time.time()

    def add(self, point: dict) -> dict:
        self.record["points"].append(point)
        self.save()
        print(json.dumps(point), flush=True)
        return point

    def save(self) -> None:
        from taylorshift.bench.files import write_json

        write_json(self.path, self.record)

    def peak_tflops(self) -> float | None:
        """The matmul rate measured by step 1 (from OUT/results.json)."""
        try:
            data = json.loads((self.out / "results.json").read_text())
        except (OSError, ValueError):
            return None
        return data["steps"].get("environment", {}).get("matmul_tflops")

    def randn(self, *shape, grad: bool = False, dtype=None):
        import torch

        x = torch.randn(shape, device=self.device, generator=self.gen).to(dtype or self.dtype)
        return x.requires_grad_(grad)

    def sync(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()

    def refuse(self, key, n: int, power: float) -> str:
        """Why a point of ``key`` at ``n`` is not to be timed ("" if it is): its call,
        predicted from the series' last one as ∝ N^power, is too long, or the point would
        not end before the deadline."""
        left = self.left()
        if left < 2:
            return f"deadline ({left:.0f} s left)"
        if key not in self.last:
            return ""
        n0, s0 = self.last[key]
        call = s0 * (n / n0) ** power
        if call > self.sizes.max_call_s:
            return f"a call predicted at {call:.1f} s (limit {self.sizes.max_call_s} s)"
        cost = self.sizes.calls_per_point * call + (self.sizes.timing or {}).get("target_s", 0)
        if cost > left:
            return f"predicted {cost:.0f} s, {left:.0f} s left"
        return ""

    def measure(self, key, n: int, fn) -> dict:
        """A first call (compiles; its time on the host), then ``time_call``; the dry run:
        one call (seconds under the interpreter, and it times nothing that counts)."""
        from taylorshift.bench.measure import time_call

        if self.sizes.timing is None:
            start = time.perf_counter()
            fn()
            seconds = time.perf_counter() - start
            self.last[key] = (n, seconds)
            return {"status": "ok", "ms": seconds * 1e3, "reps": 1}
        point = {}
        if self.cuda:
            start = time.perf_counter()
            fn()
            self.sync()
            point["first_call_s"] = round(time.perf_counter() - start, 3)
        res = time_call(fn, device=self.device, **self.sizes.timing)
        if res.status != "ok":
            return {"status": res.status, "error": res.error, **point}
        self.last[key] = (n, res.median_s)
        return {
            "status": "ok",
            "ms": res.median_s * 1e3,
            "q1_ms": res.q1_s * 1e3,
            "q3_ms": res.q3_s * 1e3,
            "reps": res.reps,
            **point,
        }


def run_step(args) -> int:
    import torch

    from taylorshift.ops.taylor_shift import fused

    ctx = Ctx(args)
    ctx.save()
    try:
        STEP_FUNCTIONS[args.step](ctx)
        if ctx.record["status"] == "running":
            ctx.record["status"] = "ok"
    except Exception as err:  # a failed step is a result; what it measured stays
        ctx.record["status"] = "error"
        ctx.record["error"] = f"{type(err).__name__}: {err}"[:1000]
        ctx.record["traceback"] = traceback.format_exc()[-3000:]
    if fused.FAILED:  # the public op fell back to the PyTorch form: its times are not kernels'
        ctx.record["kernel_fallbacks"] = {" ".join(map(str, k)): v for k, v in fused.FAILED.items()}
    if ctx.cuda:
        ctx.record["max_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    ctx.save()
    return 0


# FLOPs (taylorshift.theory; README.md, "How the FLOPs are counted")


def efficient_flops(bh: int, n: int, d: int, causal: bool, backward: bool) -> float:
    """The efficient form's model FLOPs: ``impl_ops_efficient`` per head (the feature map
    and the two (N, D) × (D, dv + 1) products, D = d(d+1)/2 + d + 1; causal adds the
    C-token diagonal blocks), × B·H, × 3 with the backward (which runs four such products
    where the forward runs two: the state gradient R and g_v, g_q and g_k)."""
    from taylorshift.ops.taylor_shift.fused import CAUSAL_CHUNK
    from taylorshift.theory import impl_ops_efficient

    flops = bh * impl_ops_efficient(n, n, d, d, causal, CAUSAL_CHUNK)
    return 3.0 * flops if backward else float(flops)


def sdpa_flops(bh: int, n: int, d: int, causal: bool, backward: bool) -> float:
    """Softmax attention's usual count: 4 N² d per head (QKᵀ and PV), half of it causal,
    × 3.5 with the backward (its five N² d products against the forward's two)."""
    flops = bh * 4.0 * n * n * d / (2 if causal else 1)
    return 3.5 * flops if backward else flops


def tflops(flops: float, point: dict) -> float | None:
    return flops / point["ms"] * 1e-9 if point.get("status") == "ok" else None


# 1. Environment


def step_environment(ctx: Ctx) -> None:
    import torch

    from taylorshift.bench.machine import machine_info
    from taylorshift.bench.measure import time_call

    info = machine_info(ctx.device)
    n = ctx.sizes.matmul_n
    dtype = torch.bfloat16 if ctx.cuda else torch.float32  # (CPU: bf16 matmuls are slow)
    a, b = ctx.randn(n, n, dtype=dtype), ctx.randn(n, n, dtype=dtype)
    a @ b
    res = time_call(lambda: a @ b, device=ctx.device, target_s=0.5, min_reps=10, max_reps=100)
    info.update(
        matmul_n=n,
        matmul_dtype=str(dtype).split(".")[-1],
        matmul_ms=res.median_s * 1e3,
        matmul_tflops=2 * n**3 / res.median_s / 1e12,
        env={k: os.environ.get(k) for k in ("TRITON_INTERPRET", "TAYLORSHIFT_TRITON")},
    )
    if ctx.cuda and shutil.which("nvidia-smi"):
        smi = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,clocks.max.sm",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=20,
        )
        info["nvidia_smi"] = smi.stdout.strip()
    if ctx.before and (ctx.before / PACKAGE / "REVISION").is_file():
        info["before_revision"] = (ctx.before / PACKAGE / "REVISION").read_text().strip()
    ctx.record.update(info)


# 2. The kernels, old against new


KERNEL_NAMES = ("_state_kernel", "_apply_kernel", "_grad_kernel")


def before_module(ctx: Ctx):
    """The exported revision's ``ops.triton.efficient``, or the reason there is none."""
    if ctx.before is None:
        return None, "no --before-src given (export one with --export REV DIR)"
    if not (ctx.before / PACKAGE).is_dir():
        return None, f"no {PACKAGE} package in {ctx.before}"
    sys.path.insert(0, str(ctx.before))
    import importlib

    try:
        return importlib.import_module(f"{PACKAGE}.ops.triton.efficient"), ""
    except Exception as err:  # the new kernels are still timed
        return None, f"{PACKAGE} did not import: {type(err).__name__}: {err}"[:500]


def kernel_times(ctx: Ctx, fn) -> dict[str, float]:
    """ms per call of each CUDA kernel of ``fn`` (torch.profiler, grouped by name), the
    costliest first; the dry run: CPU ops, nested."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.cuda else [])
    calls = ctx.sizes.profile_calls
    with profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        ctx.sync()
    want = DeviceType.CUDA if ctx.cuda else DeviceType.CPU
    totals: dict[str, float] = {}
    for event in prof.events():
        if event.device_type == want:
            ms = event.time_range.elapsed_us() / 1e3 / calls
            totals[event.name] = totals.get(event.name, 0.0) + ms
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def step_kernels(ctx: Ctx) -> None:
    import torch

    from taylorshift.bench.runner import Series
    from taylorshift.ops.triton import efficient as new

    old, reason = before_module(ctx)
    revs = {"new": new} if old is None else {"new": new, "old": old}
    if old is None:
        ctx.record["old"] = {"status": "skipped", "reason": reason}
    ctx.record["launch"] = {rev: dict(m.LAUNCH[m.dot_kind(ctx.dtype)]) for rev, m in revs.items()}
    s = ctx.sizes
    bh, d = s.batch * s.heads, s.d
    peak = ctx.peak_tflops()
    series = {}
    for n in s.kernel_n:
        q, k, v = (ctx.randn(s.batch, s.heads, n, d, grad=True) for _ in range(3))
        g = ctx.randn(s.batch, s.heads, n, d)
        points = []
        for backward in (False, True):
            for rev, module in revs.items():
                op = module.triton_efficient_taylor_shift

                def call(op=op, backward=backward, q=q, k=k, v=v, g=g):
                    if backward:
                        torch.autograd.grad(op(q, k, v, None, 1.0, None, True), (q, k, v), g)
                    else:
                        with torch.no_grad():
                            op(q, k, v, None, 1.0, None, True)

                key = (rev, backward)
                point = {"rev": rev, "n": n, "d": d, "backward": backward}
                run = series.setdefault(key, Series())
                why = "" if run.skip(point) else ctx.refuse(key, n, 1)
                if why:
                    run.refuse(point, "over budget", why, end=why)
                elif "status" not in point:
                    run.run(point, lambda c=call, key=key, n=n: ctx.measure(key, n, c), f"N={n}")
                flops = efficient_flops(bh, n, d, False, backward)
                point.update(model_gflop=flops / 1e9, tflops=tflops(flops, point))
                if point["tflops"] and peak:
                    point["of_matmul"] = point["tflops"] / peak
                points.append((point, call))
                ctx.add(point)
        for point, call in points:  # then where each call's time goes
            if point["status"] != "ok" or ctx.left() < 10:
                continue
            try:
                kernels = kernel_times(ctx, call)
            except Exception as err:  # the profile is extra: its failure is noted
                point["profile_error"] = f"{type(err).__name__}: {err}"[:300]
                continue
            point["kernel_ms"] = dict(list(kernels.items())[:10])
            ours = sum(ms for name, ms in kernels.items() if any(k in name for k in KERNEL_NAMES))
            if ours and ctx.cuda:
                flops = point["model_gflop"] * 1e9
                point["kernels_ms"] = ours
                point["kernels_tflops"] = flops / ours * 1e-9
                if peak:
                    point["kernels_of_matmul"] = point["kernels_tflops"] / peak
            ctx.save()
        del q, k, v, g
        free()


def free() -> None:
    from taylorshift.bench.runner import free_cache

    free_cache()


# 3. The op against SDPA (and 6., the same at d = 128)


IMPLS = ("sdpa", "efficient", "direct")
POWER = {"sdpa": 2, "efficient": 1, "direct": 2}  # a call's growth with N (for predictions)


def op_call(impl: str, causal: bool):
    import torch

    from taylorshift import taylor_shift_attention

    if impl == "sdpa":
        return lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=causal
        )
    return lambda q, k, v: taylor_shift_attention(q, k, v, is_causal=causal, mode=impl)


def sweep(ctx: Ctx, ns, d: int, cases) -> None:
    """Every (causal, backward) of ``cases`` for every impl at each N, N growing; a series
    ends at its first failure or a call predicted too long."""
    import torch

    from taylorshift.bench.machine import sdpa_backend
    from taylorshift.bench.runner import Series

    s = ctx.sizes
    bh = s.batch * s.heads
    series: dict = {}
    for n in ns:
        try:
            q, k, v = (ctx.randn(s.batch, s.heads, n, d, grad=True) for _ in range(3))
            g = ctx.randn(s.batch, s.heads, n, d)
        except Exception as err:  # out of memory for the inputs alone: a result
            from taylorshift.bench.runner import failure

            ctx.add({"n": n, "d": d, "inputs": True, **failure(err)})
            break
        for causal, backward in cases:
            backend = sdpa_backend(q, k, v, is_causal=causal)
            for impl in IMPLS:
                call = op_call(impl, causal)

                def fn(call=call, backward=backward, q=q, k=k, v=v, g=g):
                    if backward:
                        torch.autograd.grad(call(q, k, v), (q, k, v), g)
                    else:
                        with torch.no_grad():
                            call(q, k, v)

                key = (impl, causal, backward, d)
                point = {"impl": impl, "n": n, "d": d, "causal": causal, "backward": backward}
                if impl == "sdpa":
                    point["backend"] = backend
                run = series.setdefault(key, Series())
                why = "" if run.skip(point) else ctx.refuse(key, n, POWER[impl])
                if why:
                    run.refuse(point, "over budget", why, end=why)
                elif "status" not in point:
                    run.run(point, lambda fn=fn, key=key, n=n: ctx.measure(key, n, fn), f"N={n}")
                if impl == "sdpa":
                    point["tflops"] = tflops(sdpa_flops(bh, n, d, causal, backward), point)
                elif impl == "efficient":
                    point["tflops"] = tflops(efficient_flops(bh, n, d, causal, backward), point)
                ctx.add(point)
        del q, k, v, g
        free()
        ctx.record["summary"] = summary(ctx.record["points"])


def summary(points: list[dict]) -> dict:
    """Per (causal, pass, d): SDPA ÷ efficient and SDPA ÷ direct at each N, and the N from
    which the efficient op is faster than SDPA (``find_crossover``)."""
    from taylorshift.bench.crossover import find_crossover

    table: dict = {}
    for p in points:
        if p.get("status") == "ok" and "impl" in p:
            case = f"{'causal' if p['causal'] else 'non-causal'} " + (
                "forward+backward" if p["backward"] else "forward"
            )
            table.setdefault(f"{case}, d {p['d']}", {}).setdefault(p["impl"], {})[p["n"]] = p["ms"]
    out = {}
    for case, by in table.items():
        sdpa = by.get("sdpa", {})
        entry: dict = {}
        for impl in ("efficient", "direct"):
            mine = by.get(impl, {})
            entry[f"sdpa_over_{impl}"] = {n: sdpa[n] / mine[n] for n in mine if n in sdpa}
        entry["efficient_wins"] = find_crossover(by.get("efficient", {}), sdpa).to_dict()
        out[case] = entry
    return out


def step_op(ctx: Ctx) -> None:
    cases = ((False, True), (False, False), (True, True), (True, False))  # the decisive first
    sweep(ctx, ctx.sizes.op_n, ctx.sizes.d, cases)


def step_d128(ctx: Ctx) -> None:
    sweep(ctx, ctx.sizes.wide_n, ctx.sizes.d_wide, ((False, True), (False, False)))


# 4. CUDA graphs


def step_op_graph(ctx: Ctx) -> None:
    import torch

    from taylorshift.bench.measure import time_call
    from taylorshift.bench.runner import Series, failure
    from taylorshift.ops.taylor_shift import fused

    if not ctx.cuda:
        ctx.record.update(status="skipped", reason="no CUDA device (dry run): CUDA graphs need one")
        return
    s = ctx.sizes
    for impl in ("sdpa", "efficient"):  # SDPA first: a broken capture cannot spoil it
        for causal in (False, True):
            run = Series()
            for n in s.graph_n:
                point = {"impl": impl, "n": n, "d": s.d, "causal": causal}
                if run.skip(point) or ctx.left() < 5:
                    point.setdefault("status", "over budget")
                    ctx.add(point)
                    continue
                q, k, v = (ctx.randn(s.batch, s.heads, n, s.d) for _ in range(3))
                call = op_call(impl, causal)

                def forward(call=call, q=q, k=k, v=v):
                    with torch.no_grad():
                        return call(q, k, v)

                try:
                    eager = ctx.measure((impl, causal, "eager"), n, forward)
                except Exception as err:  # out of memory, say: a result
                    eager = failure(err)
                point.update(eager_ms=eager.get("ms"), status=eager["status"])
                if eager["status"] != "ok":
                    point["error"] = eager.get("error", "")
                    run.stopped = f"after {eager['status']} at N={n}"
                    ctx.add(point)
                    continue
                failed_before = dict(fused.FAILED)
                try:
                    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
                    stream.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(stream):
                        for _ in range(3):
                            forward()
                    torch.cuda.current_stream().wait_stream(stream)
                    with torch.cuda.graph(graph):
                        static_out = forward()
                    res = time_call(graph.replay, device=ctx.device, **s.timing)
                    point.update(graph_ms=res.median_s * 1e3, status=res.status)
                    if point.get("eager_ms") and res.status == "ok":
                        point["eager_over_graph"] = point["eager_ms"] / point["graph_ms"]
                    del static_out, graph
                except Exception as err:  # a capture that fails is itself a finding
                    point.update(failure(err), capture_failed=True)
                    run.stopped = f"after the capture failed at N={n}"
                fell_back = [why for key, why in fused.FAILED.items() if key not in failed_before]
                if fell_back:  # the kernel failed under capture; the PyTorch form was captured
                    point["fell_back"] = "; ".join(fell_back)
                ctx.add(point)
                del q, k, v
                free()


# 5. Error against float64


def chunked_naive(q, k, v, g, causal: bool, rows: int):
    """``naive_taylor_shift_attention`` over query chunks of ``rows`` (each row of the
    output depends on its query alone; causal as a mask of the chunk's rows): the output
    in q's dtype and the gradients summed over chunks in float64."""
    import torch

    from taylorshift import naive_taylor_shift_attention

    n, nk = q.shape[-2], k.shape[-2]
    kl, vl = k.detach().requires_grad_(), v.detach().requires_grad_()
    grads = [torch.zeros(x.shape, dtype=torch.float64, device=x.device) for x in (q, k, v)]
    ys = []
    for start in range(0, n, rows):
        end = min(n, start + rows)
        ql = q[:, :, start:end].detach().requires_grad_()
        mask = None
        if causal:
            i = torch.arange(start, end, device=q.device)
            mask = i[:, None] >= torch.arange(nk, device=q.device)[None, :]
        y = naive_taylor_shift_attention(ql, kl, vl, mask, False)
        gq, gk, gv = torch.autograd.grad(y, (ql, kl, vl), g[:, :, start:end].to(y.dtype))
        grads[0][:, :, start:end] = gq.double()
        grads[1] += gk.double()
        grads[2] += gv.double()
        ys.append(y.detach())
    return torch.cat(ys, dim=2), grads


def rel_rms(a, e) -> float:
    """RMS of a - e over the RMS of e (float64)."""
    a, e = a.detach().double(), e.detach().double()
    return float((a - e).norm() / e.norm().clamp_min(1e-300))


def step_error(ctx: Ctx) -> None:
    import torch

    from taylorshift import taylor_shift_attention

    s = ctx.sizes
    last_ref_s = None  # (entries n²·B·H, seconds) of the last float64 reference
    for n, b, h, causal in s.error:
        point = {"n": n, "b": b, "h": h, "causal": causal}
        rows = max(1, min(n, s.error_entries // (b * h * n)))
        predicted = 0.0 if last_ref_s is None else last_ref_s[1] * n * n * b * h / last_ref_s[0]
        if 2.5 * predicted > ctx.left() - 5:
            point.update(
                status="over budget",
                reason=f"predicted {2.5 * predicted:.0f} s, {ctx.left():.0f} s left",
            )
            ctx.add(point)
            continue
        q, k, v = (ctx.randn(b, h, n, s.d, grad=True) for _ in range(3))
        g = ctx.randn(b, h, n, s.d)
        try:
            start = time.perf_counter()
            leaves = [x.detach().double() for x in (q, k, v)]
            exact, exact_grads = chunked_naive(*leaves, g.double(), causal, rows)
            ctx.sync()
            last_ref_s = (n * n * b * h, time.perf_counter() - start)
            y = taylor_shift_attention(q, k, v, is_causal=causal, mode="efficient")
            kernel_grads = torch.autograd.grad(y, (q, k, v), g)
            ref, ref_grads = chunked_naive(q, k, v, g, causal, rows)
            for who, out, grads in (("kernel", y, kernel_grads), ("reference", ref, ref_grads)):
                point[who] = {"out": rel_rms(out, exact)}
                for name, a, e in zip("qkv", grads, exact_grads, strict=True):
                    point[who][f"grad_{name}"] = rel_rms(a, e)
            point["kernel_over_reference"] = {
                key: point["kernel"][key] / max(point["reference"][key], 1e-300)
                for key in point["kernel"]
            }
            point.update(status="ok", rows_per_chunk=rows, float64_s=round(last_ref_s[1], 2))
        except Exception as err:  # out of memory, say: a result
            from taylorshift.bench.runner import failure

            point.update(failure(err))
        ctx.add(point)
        del q, k, v, g
        free()


STEP_FUNCTIONS = {
    "environment": step_environment,
    "kernels": step_kernels,
    "op": step_op,
    "op_graph": step_op_graph,
    "error": step_error,
    "d128": step_d128,
}


# The report


def markdown_table(headers, rows) -> str:
    from taylorshift.bench.core import markdown_table as table

    return table(headers, rows)


def report(results: dict) -> str:
    steps = results["steps"]
    sizes = results["sizes"]
    dry = results["dry_run"]
    env = steps.get("environment", {})
    lines = [
        "# Fused efficient kernels old against new; the op against SDPA"
        + (" (dry run on the CPU: no GPU numbers)" if dry else ""),
        "",
        f"Started {results['started']}: `{results['command']}`, budget "
        f"{results['budget_s']:.0f} s; B, H = {sizes['batch']}, {sizes['heads']}, "
        f"d = dv = {sizes['d']}, {steps.get('kernels', {}).get('dtype', '')}.",
        "",
    ]
    keys = (
        "gpu",
        "nvidia_smi",
        "gpu_capability",
        "gpu_memory_gib",
        "torch",
        "cuda",
        "triton",
        "git_revision",
        "sources_sha256",
        "before_revision",
        "matmul_n",
        "matmul_dtype",
        "matmul_tflops",
    )
    rows = [(k, f"{env[k]:.4g}" if isinstance(env[k], float) else env[k]) for k in keys if k in env]
    lines += ["## Machine", "", markdown_table(["what", "value"], rows), ""]
    rows = []
    for step in STEPS:
        r = steps.get(step.name)
        if r is None:
            continue
        parts = [r.get("reason", ""), r.get("error", "")]
        if r.get("points"):
            ok = sum(p.get("status") == "ok" for p in r["points"])
            parts.insert(0, f"{ok}/{len(r['points'])} points ok")
        if "old" in r:
            parts.append(f"old revision skipped: {r['old']['reason']}")
        if r.get("kernel_fallbacks"):
            parts.append(f"kernel fallbacks: {r['kernel_fallbacks']}")
        detail = "; ".join(part for part in parts if part)
        rows.append(
            (
                step.name,
                step.what,
                r["status"],
                f"{r['seconds']} / {r['limit_s']:.0f}",
                detail.replace("|", "/").replace("\n", " ")[:300],
            )
        )
    lines += [
        "## Steps",
        "",
        markdown_table(["step", "what", "status", "s / limit", "detail"], rows),
        "",
    ]
    lines += targets_section(steps, sizes["targets"], dry)
    lines += kernels_section(steps.get("kernels", {}))
    lines += op_section(steps.get("op", {}), "3. The op against SDPA, eager")
    lines += graph_section(steps.get("op_graph", {}))
    lines += error_section(steps.get("error", {}))
    lines += op_section(steps.get("d128", {}), f"6. d = dv = {sizes['d_wide']}, non-causal")
    lines += [
        "## How the FLOPs are counted",
        "",
        "Model FLOPs of the efficient form: `taylorshift.theory.impl_ops_efficient(N, N, "
        "d, dv, causal, 256)` per head × B·H (the feature map and the two (N, D) × "
        "(D, dv + 1) products, D = d(d+1)/2 + d + 1; causal adds its 256-token diagonal "
        "blocks), × 3 for forward + backward. SDPA: 4 N² d per head, half causal, × 3.5 "
        "for forward + backward. The matmul rate is step 1's 2 n³ / t. README.md, \"Old "
        'against new, the op against SDPA", has the reasons.',
        "",
    ]
    return "\n".join(lines) + "\n"


def _num(x, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}g}"


def _cell(point: dict | None, key: str = "ms") -> str:
    if point is None:
        return "–"
    if point.get("status") != "ok":
        return str(point.get("status"))
    return _num(point.get(key))


def _find(points, **want) -> dict | None:
    for p in points:
        if all(p.get(k) == v for k, v in want.items()):
            return p
    return None


def targets_section(steps: dict, at: dict, dry: bool) -> list[str]:
    op = steps.get("op", {})
    summ = summary(op.get("points", []))  # (also of a step killed before it wrote one)
    kernel_points = steps.get("kernels", {}).get("points", [])
    rows = []
    for key, text in TARGETS:
        measured, met = "not measured", "–"
        if key in ("fwd_bwd_from", "causal_from"):
            case = "causal" if key == "causal_from" else "non-causal"
            wins = summ.get(f"{case} forward+backward, d {_op_d(op)}", {}).get("efficient_wins")
            if wins:
                ratio = summ[f"{case} forward+backward, d {_op_d(op)}"]["sdpa_over_efficient"]
                r = ratio.get(at[key]) or ratio.get(str(at[key]))
                measured = (
                    f"faster from N {_describe(wins)}; SDPA ÷ efficient at {at[key]:,}: {_num(r)}"
                )
                first = wins["n_above"] if wins["status"] in ("below", "crossed") else None
                met = "yes" if first is not None and first <= at[key] else "no"
        elif key == "ratio_at":
            ratio = summ.get(f"non-causal forward+backward, d {_op_d(op)}", {}).get(
                "sdpa_over_efficient", {}
            )
            r = ratio.get(at["ratio_at"]) or ratio.get(str(at["ratio_at"]))
            if r is not None:
                measured, met = f"SDPA ÷ efficient = {r:.3g}", "yes" if r >= 10 else "no"
        else:
            backward = key == "kernels_fwd_bwd"
            bar = 0.3 if backward else 0.4
            p = _find(kernel_points, rev="new", n=at["kernels_at"], backward=backward)
            if p and p.get("status") == "ok":
                share = p.get("kernels_of_matmul")
                whose = "kernels' time (profiler)"
                if share is None:
                    share, whose = p.get("of_matmul"), "the op's time"
                if share is not None:
                    tf = p.get("kernels_tflops") or p.get("tflops")
                    measured = f"{100 * share:.1f} % ({tf:.3g} TFLOP/s, {whose})"
                    met = "yes" if share >= bar else "no"
        rows.append((text.format(**at), measured, met))
    note = (
        [
            "(Dry run: N are the dry run's stand-ins, CPU times under the interpreter: the "
            "verdicts mean nothing.)",
            "",
        ]
        if dry
        else []
    )
    return [
        "## Against the issue's targets",
        "",
        *note,
        markdown_table(["target", "measured", "met"], rows),
        "",
    ]


def _op_d(op: dict) -> int:
    points = op.get("points") or [{}]
    return points[0].get("d", 0)


def _describe(wins: dict) -> str:
    status = wins.get("status")
    if status == "crossed":
        return f"≈ {wins['n']:,.0f} (between {wins['n_below']:,} and {wins['n_above']:,})"
    if status == "below":
        return f"≤ {wins['n_above']:,} (the smallest N timed)"
    if status == "above":
        return f"> {wins['n_below']:,} (slower up to the largest N timed)"
    return "n/a (no common points)"


def kernels_section(r: dict) -> list[str]:
    points = r.get("points", [])
    if not points:
        return []

    def pct(x):
        return "–" if x is None else f"{100 * x:.1f}"

    rows = []
    for n in sorted({p["n"] for p in points}):
        for backward in (False, True):
            new = _find(points, rev="new", n=n, backward=backward) or {}
            old = _find(points, rev="old", n=n, backward=backward) or {}
            ratio = kernel_ratio = None
            if old.get("status") == new.get("status") == "ok":
                ratio = old["ms"] / new["ms"]
                if old.get("kernels_ms") and new.get("kernels_ms"):
                    kernel_ratio = old["kernels_ms"] / new["kernels_ms"]
            rows.append(
                (
                    f"{n:,}",
                    "fwd+bwd" if backward else "fwd",
                    _cell(old or None),
                    _cell(new or None),
                    _num(ratio),
                    _num(old.get("kernels_ms")),
                    _num(new.get("kernels_ms")),
                    _num(kernel_ratio),
                    _cell(old or None, "tflops"),
                    _cell(new or None, "tflops"),
                    pct(new.get("of_matmul")),
                    _num(old.get("kernels_tflops")),
                    _num(new.get("kernels_tflops")),
                    pct(new.get("kernels_of_matmul")),
                )
            )
    old_note = r.get("old", {}).get("reason")
    lines = [
        "## 2. The efficient kernels (non-causal), old against new",
        "",
        f"Old revision: skipped ({old_note})."
        if old_note
        else "`triton_efficient_taylor_shift` of the exported revision (old) and of this "
        "checkout (new) on the same inputs. ms: the call (CUDA events; the dry run: the host "
        "clock, one call); kernels ms: the "
        f"time of {', '.join(KERNEL_NAMES)} per call (torch.profiler); TFLOP/s: model "
        "FLOPs over either.",
        "",
    ]
    if r.get("launch"):
        lines += [f"Launch settings: `{json.dumps(r['launch'])}`", ""]
    headers = ["N", "pass", "old ms", "new ms", "old ÷ new", "old kernels ms"]
    headers += ["new kernels ms", "old ÷ new, kernels", "old TFLOP/s", "new TFLOP/s"]
    headers += ["new % of matmul", "old kernels TFLOP/s", "new kernels TFLOP/s"]
    headers += ["new kernels % of matmul"]
    lines += [markdown_table(headers, rows), ""]
    profiled = [p for p in points if p.get("kernel_ms")]
    if profiled:
        lines += ["Costliest kernels per call (ms; the dry run: CPU ops, nested):", ""]
    for p in profiled:
        per = ", ".join(f"{k[:60]} {v:.3g}" for k, v in list(p["kernel_ms"].items())[:6])
        lines.append(f"- {p['rev']}, N {p['n']:,}, {'fwd+bwd' if p['backward'] else 'fwd'}: {per}")
    return [*lines, ""] if profiled else lines


def op_section(r: dict, title: str) -> list[str]:
    points = r.get("points", [])
    if not points:
        return []
    lines = [f"## {title}", ""]
    for causal in (False, True):
        for backward in (True, False):
            mine = [
                p
                for p in points
                if p.get("causal") == causal and p.get("backward") == backward and "impl" in p
            ]
            if not mine:
                continue
            rows = []
            for n in sorted({p["n"] for p in mine}):
                by = {p["impl"]: p for p in mine if p["n"] == n}
                sdpa, eff, dire = by.get("sdpa"), by.get("efficient"), by.get("direct")

                def over(x, sdpa=sdpa):
                    ok = x and sdpa and x.get("status") == sdpa.get("status") == "ok"
                    return _num(sdpa["ms"] / x["ms"]) if ok else "–"

                rows.append(
                    (
                        f"{n:,}",
                        _cell(sdpa),
                        _cell(eff),
                        _cell(dire),
                        over(eff),
                        over(dire),
                        _cell(eff, "tflops"),
                        _cell(sdpa, "tflops"),
                        (sdpa or {}).get("backend", "–"),
                    )
                )
            case = f"{'causal' if causal else 'non-causal'}, {'forward + backward' if backward else 'forward'}"  # noqa: E501
            lines += [
                f"### {case}",
                "",
                markdown_table(
                    [
                        "N",
                        "SDPA ms",
                        "efficient ms",
                        "direct ms",
                        "SDPA ÷ efficient",
                        "SDPA ÷ direct",
                        "efficient TFLOP/s",
                        "SDPA TFLOP/s",
                        "SDPA backend",
                    ],
                    rows,
                ),
                "",
            ]
    bad = [p for p in points if p.get("status") not in ("ok", None) and p.get("reason")]
    if bad:
        lines += [
            "Not timed: "
            + "; ".join(
                f"{p.get('impl', 'inputs')} N {p['n']:,}: {p['status']} ({p['reason'][:80]})"
                for p in bad[:8]
            ),
            "",
        ]
    return lines


def graph_section(r: dict) -> list[str]:
    lines = ["## 4. Forward from a CUDA graph", ""]
    if r.get("status") == "skipped":
        return [*lines, f"Skipped: {r.get('reason')}.", ""]
    rows = [
        (
            p["impl"],
            "causal" if p["causal"] else "non-causal",
            f"{p['n']:,}",
            _num(p.get("eager_ms")),
            _num(p.get("graph_ms")),
            _num(p.get("eager_over_graph")),
            p["status"] if p["status"] != "ok" else "",
            (p.get("error") or p.get("fell_back") or "")[:120].replace("|", "/"),
        )
        for p in r.get("points", [])
    ]
    if not rows:
        return []
    return [
        *lines,
        markdown_table(
            ["impl", "case", "N", "eager ms", "graph ms", "eager ÷ graph", "status", "note"], rows
        ),
        "",
    ]


def error_section(r: dict) -> list[str]:
    points = r.get("points", [])
    if not points:
        return []
    rows = []
    for p in points:
        case = (f"{p['n']:,}", "causal" if p["causal"] else "non-causal", f"{p['b'] * p['h']}")
        if p.get("status") != "ok":
            rows.append((*case, p.get("status"), "", "", "", p.get("reason") or p.get("error")))
            continue
        for who in ("kernel", "reference"):
            e = p[who]
            rows.append(
                (
                    *case,
                    "efficient op" if who == "kernel" else "naive, same dtype",
                    *(f"{e[k]:.2e}" for k in ("out", "grad_q", "grad_k", "grad_v")),
                )
            )
    return [
        "## 5. Error against float64 (relative RMS against the naive reference in float64)",
        "",
        markdown_table(["N", "case", "B·H", "who", "output", "grad q", "grad k", "grad v"], rows),
        "",
    ]


if __name__ == "__main__":
    sys.exit(main())
