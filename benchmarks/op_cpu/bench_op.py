"""CPU benchmark of ``taylor_shift_attention``: time against SDPA, and peak memory, vs N.

    python benchmarks/op_cpu/bench_op.py [--quick] [--out DIR] [--profile] [--report-only]

One head, batch 1 (as the paper), float32, ``torch.set_num_threads(2)``, layout (B, H, N, d).

Time: for each head dim d and N on a log2 grid, the forward and the forward+backward of
SDPA, direct and efficient TaylorShift; warm-up, then repeated ``time.perf_counter`` runs,
median with min/max and quartiles. A point whose predicted call time or peak memory is over
budget is recorded as skipped (and so is the rest of its series); out-of-memory is a result.

Memory: for d = 64, the peak extra resident memory of one call, each point in a fresh
subprocess: after importing torch, a tiny warm-up call and allocating the inputs, reset the
RSS high-water mark and read it (VmHWM; ``ru_maxrss`` is recorded too), run the op once, and
read it again.

Writes results.json (every point, the machine, the command line), report.md and PNG plots
to --out (default: this script's folder); a progress line per point goes to stderr.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

import taylorshift
from taylorshift import taylor_shift_attention
from taylorshift.ops.taylor_shift.dispatch import direct_ops, efficient_ops
from taylorshift.ops.taylor_shift.efficient import default_chunk_size

THREADS = 2
DTYPE = torch.float32
BYTES = 4  # float32
GIB = 1 << 30
MIB = 1 << 20
PASSES = ("fwd", "fwd+bwd")

# Peak extra memory of the direct form in N² float32 entries, measured with this script's
# memory worker on this build at d = 64, N = 4096 (4.05 forward, 6.21 forward+backward),
# rounded up: only used to skip points that would not fit in the memory budget.
DIRECT_N2_FLOATS = {"fwd": 4.5, "fwd+bwd": 7.0}


@dataclass(frozen=True)
class Config:
    """What one run measures and the budgets that stop a series."""

    head_dims: tuple[int, ...]
    time_lengths: tuple[int, ...]
    mem_head_dim: int
    mem_lengths: tuple[int, ...]
    target_s: float  # timed seconds per point (the repetition count follows from it)
    min_reps: int
    max_reps: int
    max_call_s: float  # time sweep: skip a point whose predicted call takes longer
    mem_max_call_s: float  # memory sweep: the same, per subprocess
    max_bytes: int  # skip a point whose predicted peak memory is larger
    # The machine is shared: before a point, wait (at most max_wait_point_s, and
    # max_wait_total_s over the run) until other processes use <= quiet_share of the CPUs;
    # re-measure a point once when they used more than noisy_share while it was timed.
    quiet_share: float
    noisy_share: float
    max_wait_point_s: float
    max_wait_total_s: float


FULL = Config(
    head_dims=(16, 32, 64),
    time_lengths=tuple(2**i for i in range(6, 16)),  # 64 … 32768
    mem_head_dim=64,
    mem_lengths=tuple(2**i for i in range(10, 17)),  # 1024 … 65536
    target_s=1.5,
    min_reps=5,
    max_reps=40,
    max_call_s=8.0,
    mem_max_call_s=60.0,
    max_bytes=8 * GIB,
    quiet_share=0.1,
    noisy_share=0.2,
    max_wait_point_s=30.0,
    max_wait_total_s=480.0,
)
QUICK = Config(
    head_dims=(16, 32, 64),
    time_lengths=tuple(2**i for i in range(6, 12)),  # 64 … 2048
    mem_head_dim=64,
    mem_lengths=(1024, 2048, 4096),
    target_s=0.2,
    min_reps=3,
    max_reps=10,
    max_call_s=1.0,
    mem_max_call_s=10.0,
    max_bytes=2 * GIB,
    quiet_share=0.1,
    noisy_share=0.2,
    max_wait_point_s=5.0,
    max_wait_total_s=30.0,
)


# ---------------------------------------------------------------------------------------
# The forms under test: a call on (1, 1, N, d) inputs, a FLOP model and a memory model.


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


def _direct(q, k, v):
    return taylor_shift_attention(q, k, v, mode="direct")


def _efficient(q, k, v):
    return taylor_shift_attention(q, k, v, mode="efficient")


@dataclass(frozen=True)
class Form:
    name: str
    label: str
    call: Callable
    time_exponent: int  # call time ∝ N^exponent, to predict the next grid point

    def forward_flops(self, n: int, d: int) -> int:
        """Model FLOPs of one forward, per head (dv = d)."""
        if self.name == "sdpa":
            return 4 * n * n * d  # Q Kᵀ and P V; the softmax is not counted
        if self.name == "direct":
            return direct_ops(n, n, d, d)  # the paper's 4 N² d + 6 N²
        return efficient_ops(n, n, d, d, causal=False, chunk=n)  # symmetric features

    def peak_bytes(self, n: int, d: int, pass_: str) -> float:
        """A rough upper estimate of the extra peak memory of one call (for skipping)."""
        linear = 16 * n * d * BYTES + 64 * MIB
        if self.name == "direct":
            return DIRECT_N2_FLOATS[pass_] * n * n * BYTES + linear
        return linear


FORMS = {
    "sdpa": Form("sdpa", "SDPA", _sdpa, 2),
    "direct": Form("direct", "TaylorShift direct", _direct, 2),
    "efficient": Form("efficient", "TaylorShift efficient", _efficient, 1),
}


def model_flops(form: Form, n: int, d: int, pass_: str) -> int:
    """Forward FLOPs, or 3× them for forward+backward (backward ≈ 2 forwards)."""
    return form.forward_flops(n, d) * (3 if pass_ == "fwd+bwd" else 1)


def make_inputs(n: int, d: int, backward: bool, seed: int = 0):
    """q, k, v (1, 1, N, d) and the output gradient (1, 1, N, d), float32."""
    g = torch.Generator().manual_seed(seed)
    q, k, v, grad = (torch.randn(1, 1, n, d, generator=g, dtype=DTYPE) for _ in range(4))
    if backward:
        for t in (q, k, v):
            t.requires_grad_(True)
    return q, k, v, grad


def make_call(form: Form, q, k, v, grad, pass_: str) -> Callable[[], object]:
    """One forward, or one forward and backward (gradients of q, k, v, not accumulated)."""
    if pass_ == "fwd":
        return lambda: form.call(q, k, v)

    def fwd_bwd():
        out = form.call(q, k, v)
        return torch.autograd.grad(out, (q, k, v), grad)

    return fwd_bwd


def is_oom(err: BaseException) -> bool:
    text = str(err).lower()
    return isinstance(err, MemoryError) or "out of memory" in text or "allocate" in text


# ---------------------------------------------------------------------------------------
# Time sweep.


def time_point(call: Callable[[], object], cfg: Config) -> dict:
    """Warm-up, then ``reps`` timed calls; times in seconds."""
    warm = []
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        call()
        warm.append(time.perf_counter() - t0)
        # One warm-up call for a slow op; else at least 3 calls and 0.2 s.
        if warm[0] > 1.0 or (len(warm) >= 3 and time.perf_counter() - start >= 0.2):
            break
    estimate = min(warm[1:]) if len(warm) > 1 else warm[0]
    reps = max(cfg.min_reps, min(cfg.max_reps, math.ceil(cfg.target_s / max(estimate, 1e-6))))
    times = []
    cpu_before = cpu_counters()
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    background = background_load(cpu_before, cpu_counters())
    q1, _, q3 = statistics.quantiles(times, n=4) if len(times) > 1 else (times[0],) * 3
    return {
        "warmup_calls": len(warm),
        "reps": reps,
        "times_s": times,
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "q1_s": q1,
        "q3_s": q3,
        **background,
    }


def cpu_counters() -> tuple[float, list[int], float]:
    """(wall s, the machine's /proc/stat cpu jiffies, this process's CPU s, all threads)."""
    with open("/proc/stat") as f:
        jiffies = [int(x) for x in f.readline().split()[1:9]]
    t = os.times()
    return time.perf_counter(), jiffies, t.user + t.system


def background_load(before, after) -> dict:
    """Share of the machine's CPUs used by other processes, and stolen by the hypervisor,
    while the point was timed: (busy − ours) / (wall · CPUs); /proc/stat columns are user
    nice system idle iowait irq softirq steal."""
    wall = after[0] - before[0]
    delta = [a - b for a, b in zip(after[1], before[1], strict=True)]
    tick = os.sysconf("SC_CLK_TCK")
    busy = (sum(delta[:8]) - delta[3] - delta[4] - delta[7]) / tick
    capacity = wall * (os.cpu_count() or 1)
    return {
        "other_cpu_share": max(0.0, busy - (after[2] - before[2])) / capacity,
        "steal_share": delta[7] / tick / capacity,
    }


def over_budget(
    predicted_s: float | None, max_s: float, predicted_bytes: float, max_bytes: int
) -> str | None:
    """The reason to skip a point whose predicted call time or peak memory is too large."""
    if predicted_bytes > max_bytes:
        return (
            f"skipped: over budget (predicted {predicted_bytes / GIB:.1f} GiB"
            f" > {max_bytes / GIB:g} GiB)"
        )
    if predicted_s is not None and predicted_s > max_s:
        return f"skipped: over budget (predicted {predicted_s:.1f} s per call > {max_s:g} s)"
    return None


def run_time_sweep(cfg: Config, results: dict, save: Callable[[], None], gate: QuietGate) -> None:
    """Per (d, pass), the three forms are measured one after the other at each N, so that
    the forms compared at one N see about the same background load."""
    for d in cfg.head_dims:
        for pass_ in PASSES:
            stop_reason: dict[str, str | None] = dict.fromkeys(FORMS)
            previous: dict[str, tuple[int, float]] = {}  # (n, median_s) of the last point
            for n in cfg.time_lengths:
                for form in FORMS.values():
                    point = {"form": form.name, "pass": pass_, "d": d, "n": n}
                    point["model_flops"] = model_flops(form, n, d, pass_)
                    point["loadavg_1m"] = os.getloadavg()[0]
                    predicted_s = None
                    if form.name in previous:
                        n_prev, t_prev = previous[form.name]
                        predicted_s = t_prev * (n / n_prev) ** form.time_exponent
                    predicted_bytes = form.peak_bytes(n, d, pass_)
                    point["predicted_call_s"] = predicted_s
                    point["predicted_peak_bytes"] = predicted_bytes
                    if stop_reason[form.name] is None:
                        stop_reason[form.name] = over_budget(
                            predicted_s, cfg.max_call_s, predicted_bytes, cfg.max_bytes
                        )
                    if stop_reason[form.name] is not None:
                        point["status"] = stop_reason[form.name]
                    else:
                        point.update(measure_time(form, n, d, pass_, cfg, gate))
                        if point["status"] == "ok":
                            previous[form.name] = (n, point["median_s"])
                            point["gflops"] = point["model_flops"] / point["median_s"] / 1e9
                        else:
                            stop_reason[form.name] = f"skipped: after {point['status']} at N={n}"
                    results["time"].append(point)
                    progress("time", point)
            save()


class QuietGate:
    """Waits before a point until other processes leave the CPUs (mostly) idle."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.left_s = cfg.max_wait_total_s
        self.waited_s = 0.0

    def wait(self) -> dict:
        """Sample the background load over 0.3 s windows until it is low or time is up."""
        waited = 0.0
        limit = min(self.cfg.max_wait_point_s, self.left_s)
        while True:
            before = cpu_counters()
            time.sleep(0.3)
            share = background_load(before, cpu_counters())["other_cpu_share"]
            waited += 0.3
            if share <= self.cfg.quiet_share or waited >= limit:
                break
        extra = max(0.0, waited - 0.3)  # the first window is the check itself
        self.left_s -= extra
        self.waited_s += extra
        return {"waited_s": extra, "other_cpu_share_before": share}


def remeasure_noisy(cfg: Config, results: dict, gate: QuietGate) -> None:
    """Measure again, once, the points still timed under background load after the sweep,
    keeping the quieter of the two (the series budgets are not revisited)."""
    for p in results["time"]:
        if p["status"] != "ok" or p["other_cpu_share"] <= cfg.noisy_share:
            continue
        again = measure_time(FORMS[p["form"]], p["n"], p["d"], p["pass"], cfg, gate)
        if again["status"] == "ok" and again["other_cpu_share"] < p["other_cpu_share"]:
            old = {k: p[k] for k in ("median_s", "min_s", "max_s", "other_cpu_share")}
            p.update(again, remeasured_after_sweep=old)
            p["gflops"] = p["model_flops"] / p["median_s"] / 1e9
        progress("time", p)


def measure_time(form: Form, n: int, d: int, pass_: str, cfg: Config, gate: QuietGate) -> dict:
    gc.collect()
    try:
        q, k, v, grad = make_inputs(n, d, backward=pass_ == "fwd+bwd")
        call = make_call(form, q, k, v, grad, pass_)
        result = {**gate.wait(), **time_point(call, cfg)}
        if result["other_cpu_share"] > cfg.noisy_share:
            retry = {**gate.wait(), **time_point(call, cfg)}
            first, result = sorted((result, retry), key=lambda r: r["other_cpu_share"])[::-1]
            result["retried"] = {
                k: first[k] for k in ("median_s", "min_s", "max_s", "other_cpu_share")
            }
    except (RuntimeError, MemoryError) as err:
        if is_oom(err):
            return {"status": "oom", "error": str(err)[:300]}
        return {"status": f"error: {type(err).__name__}", "error": str(err)[:300]}
    finally:
        q = k = v = grad = call = None
        gc.collect()
    return {"status": "ok", **result}


def progress(kind: str, p: dict) -> None:
    where = f"{kind:4s} {p['form']:9s} {p['pass']:7s} d={p['d']:3d} N={p['n']:6d}"
    if p["status"] != "ok":
        msg = p["status"]
    elif kind == "time":
        msg = (
            f"median {p['median_s'] * 1e3:10.3f} ms  [{p['min_s'] * 1e3:.3f}, "
            f"{p['max_s'] * 1e3:.3f}]  x{p['reps']}  {p['gflops']:.1f} GFLOP/s"
            f"  others {p['other_cpu_share']:.0%} steal {p['steal_share']:.0%}"
        )
    else:
        msg = f"peak extra {p['peak_extra_bytes'] / MIB:9.1f} MiB  ({p['call_s']:.2f} s)"
    print(f"[{time.strftime('%H:%M:%S')}] {where}  {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# Memory sweep: one fresh subprocess per point.


def proc_status_bytes(field: str) -> int:
    """A kB field of /proc/self/status (VmRSS: resident now, VmHWM: its high-water mark)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_peak_rss() -> bool:
    """Reset the RSS high-water mark to the current RSS (Linux ≥ 4.0, clear_refs 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def max_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def memory_worker(spec: dict) -> dict:
    """Runs in a fresh process: the peak extra memory of one call of one form.

    The peak is read two ways, ``getrusage().ru_maxrss`` and VmHWM. In a process spawned by a
    large parent, ``ru_maxrss`` starts at the parent's high-water mark (Linux keeps the
    larger of the process's own mark and the one carried over fork/exec), so its delta is
    0 whenever the call stays below the parent's peak; VmHWM is the process's own mark,
    reset after the set-up, and is the number reported.
    """
    torch.set_num_threads(THREADS)
    form, pass_ = FORMS[spec["form"]], spec["pass"]
    n, d = spec["n"], spec["d"]
    backward = pass_ == "fwd+bwd"
    # A tiny call first so that lazy initialisation (kernels, thread pool) is not counted.
    make_call(form, *make_inputs(64, d, backward, seed=1), pass_)()
    q, k, v, grad = make_inputs(n, d, backward)
    gc.collect()
    reset_ok = reset_peak_rss()
    rss_before = proc_status_bytes("VmRSS")
    hwm_before = proc_status_bytes("VmHWM")
    maxrss_before = max_rss_bytes()
    t0 = time.perf_counter()
    out = make_call(form, q, k, v, grad, pass_)()
    call_s = time.perf_counter() - t0
    hwm_after = proc_status_bytes("VmHWM")
    maxrss_after = max_rss_bytes()
    del out
    return {
        "peak_extra_bytes": hwm_after - hwm_before,
        "peak_reset": reset_ok,
        "rss_before_bytes": rss_before,
        "vmhwm_before_bytes": hwm_before,
        "vmhwm_after_bytes": hwm_after,
        "ru_maxrss_before_bytes": maxrss_before,
        "ru_maxrss_after_bytes": maxrss_after,
        "ru_maxrss_delta_bytes": maxrss_after - maxrss_before,
        "call_s": call_s,
    }


def predicted_time(results: dict, form: Form, n: int, d: int, pass_: str) -> float | None:
    """Extrapolate the time sweep's largest measured N for this series to N."""
    done = [
        p
        for p in results["time"]
        if (p["form"], p["pass"], p["d"], p["status"]) == (form.name, pass_, d, "ok")
    ]
    if not done:
        return None
    last = max(done, key=lambda p: p["n"])
    return last["median_s"] * (n / last["n"]) ** form.time_exponent


def run_memory_sweep(cfg: Config, results: dict, save: Callable[[], None]) -> None:
    d = cfg.mem_head_dim
    for pass_ in PASSES:
        for form in FORMS.values():
            stop_reason = None
            for n in cfg.mem_lengths:
                point = {"form": form.name, "pass": pass_, "d": d, "n": n}
                point["input_bytes"] = 3 * n * d * BYTES
                point["output_bytes"] = (4 if pass_ == "fwd+bwd" else 1) * n * d * BYTES
                predicted_s = predicted_time(results, form, n, d, pass_)
                predicted_bytes = form.peak_bytes(n, d, pass_)
                point["predicted_call_s"] = predicted_s
                point["predicted_peak_bytes"] = predicted_bytes
                if stop_reason is None:
                    stop_reason = over_budget(
                        predicted_s, cfg.mem_max_call_s, predicted_bytes, cfg.max_bytes
                    )
                if stop_reason is not None:
                    point["status"] = stop_reason
                else:
                    point.update(spawn_memory_worker(point, cfg))
                    if point["status"] != "ok":
                        stop_reason = f"skipped: after {point['status']} at N={n}"
                results["memory"].append(point)
                progress("mem", point)
            save()


def spawn_memory_worker(point: dict, cfg: Config) -> dict:
    spec = {k: point[k] for k in ("form", "pass", "d", "n")}
    timeout = 3 * cfg.mem_max_call_s + 60
    cmd = [sys.executable, str(Path(__file__).resolve()), "--mem-worker", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": f"skipped: over budget (worker timed out after {timeout:.0f} s)"}
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-3:]
        killed = proc.returncode in (-9, 137)
        oom = killed or any(is_oom(RuntimeError(line)) for line in tail)
        status = "oom" if oom else f"error: rc={proc.returncode}"
        return {"status": status, "error": " | ".join(tail)[:300]}
    return {"status": "ok", **json.loads(proc.stdout.strip().splitlines()[-1])}


# ---------------------------------------------------------------------------------------
# Analysis: crossovers, the theory's N0, the memory fit.


def paper_n0(d: int) -> int:
    """The paper's speed crossover N0 = (4d³ + 10d² + 9d + 4) / (4d + 6), rounded up."""
    return math.ceil((4 * d**3 + 10 * d**2 + 9 * d + 4) / (4 * d + 6))


def theory_crossovers(d: int) -> dict:
    """Paper N0 and our symmetric form's, from taylorshift.theory when it exists."""
    try:
        from taylorshift import theory  # type: ignore[attr-defined]

        return {
            "paper_n0": theory.speed_crossover(d),
            "symmetric_n0": theory.speed_crossover(d, symmetric=True),
            "source": "taylorshift.theory.speed_crossover",
        }
    except (ImportError, AttributeError, TypeError):
        # Op counts of the running implementation (dispatch.py): efficient 2N·c_e,
        # direct N²·c_d, equal at N = 2 c_e / c_d.
        per_pair = direct_ops(1, 1, d, d)
        symmetric = efficient_ops(1, 1, d, d, causal=False, chunk=1) / per_pair
        return {
            "paper_n0": paper_n0(d),
            "symmetric_n0": math.ceil(symmetric),
            "source": "paper formula (SPEC §3); symmetric from dispatch.py op counts",
        }


def series(results: dict, form: str, pass_: str, d: int) -> dict[int, float]:
    return {
        p["n"]: p["median_s"]
        for p in results["time"]
        if (p["form"], p["pass"], p["d"], p["status"]) == (form, pass_, d, "ok")
    }


def crossover(fast: dict[int, float], slow: dict[int, float]) -> dict:
    """The N from which ``fast`` stays faster than ``slow`` (median times).

    log-log linear interpolation of the time ratio between the two grid points that
    bracket the last change of sign; 'below'/'not reached' when there is none.
    """
    ns = sorted(set(fast) & set(slow))
    if not ns:
        return {"kind": "no data"}
    log_ratio = [math.log(fast[n] / slow[n]) for n in ns]
    if log_ratio[-1] >= 0:
        return {
            "kind": "not reached",
            "n_max": ns[-1],
            "ratio_at_n_max": fast[ns[-1]] / slow[ns[-1]],
        }
    i = len(ns) - 1
    while i > 0 and log_ratio[i - 1] < 0:
        i -= 1
    if i == 0:
        return {"kind": "below", "n_min": ns[0], "ratio_at_n_min": fast[ns[0]] / slow[ns[0]]}
    n0, n1, r0, r1 = ns[i - 1], ns[i], log_ratio[i - 1], log_ratio[i]
    log_n = math.log(n0) + (math.log(n1) - math.log(n0)) * r0 / (r0 - r1)
    return {"kind": "interpolated", "n": math.exp(log_n), "bracket": [n0, n1]}


def linear_fit(xs: list[float], ys: list[float]) -> dict:
    """Least-squares y = a x + b with R²."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    a = sxy / sxx
    b = my - a * mx
    ss_res = sum((y - (a * x + b)) ** 2 for x, y in zip(xs, ys, strict=True))
    ss_tot = sum((y - my) ** 2 for y in ys)
    return {"slope": a, "intercept": b, "r2": 1 - ss_res / ss_tot if ss_tot > 0 else 1.0}


def throughput_model(results: dict, d: int, pass_: str) -> dict:
    """Explain the efficient-vs-SDPA crossover by FLOPs and achieved FLOP/s.

    Model FLOPs are equal at N_flop (efficient ∝ N, SDPA ∝ N²); with achieved throughputs
    P_sdpa and P_eff the times are equal at N_flop · P_sdpa / P_eff. The throughputs are
    taken (geometric mean) over the two largest N where both were measured.
    """
    sdpa, eff = FORMS["sdpa"], FORMS["efficient"]
    n_flop = eff.forward_flops(1, d) / sdpa.forward_flops(1, d)  # 2c/(4d) for F = 2cN, 4N²d
    both = {}
    for p in results["time"]:
        if (p["pass"], p["d"], p["status"]) == (pass_, d, "ok") and p["form"] in (
            "sdpa",
            "efficient",
        ):
            both.setdefault(p["n"], {})[p["form"]] = p["gflops"]
    ns = sorted(n for n, v in both.items() if len(v) == 2)[-2:]
    cross = crossover(series(results, "efficient", pass_, d), series(results, "sdpa", pass_, d))
    if cross["kind"] == "interpolated":
        ns = cross["bracket"]
    if not ns:
        return {"flop_equal_n": n_flop}
    ratio = math.exp(statistics.fmean(math.log(both[n]["sdpa"] / both[n]["efficient"]) for n in ns))
    return {
        "flop_equal_n": n_flop,
        "at_n": ns,
        "gflops_sdpa": [both[n]["sdpa"] for n in ns],
        "gflops_efficient": [both[n]["efficient"] for n in ns],
        "throughput_ratio": ratio,
        "predicted_crossover_n": n_flop * ratio,
    }


def fit_start(form: str, d: int) -> int:
    """Smallest N of the memory fit: for the efficient form two default chunks, from which
    the working set of its per-chunk buffers has its full size (it is not linear below)."""
    if form != "efficient":
        return 0
    return 2 * default_chunk_size(1, d, d)


def analyse(results: dict, cfg: Config) -> dict:
    out = {"crossovers": {}, "memory_fit": {}}
    for d in cfg.head_dims:
        entry = {"theory": theory_crossovers(d)}
        for pass_ in PASSES:
            eff = series(results, "efficient", pass_, d)
            entry[pass_] = {
                "efficient_vs_sdpa": crossover(eff, series(results, "sdpa", pass_, d)),
                "efficient_vs_direct": crossover(eff, series(results, "direct", pass_, d)),
                "direct_vs_sdpa": crossover(
                    series(results, "direct", pass_, d), series(results, "sdpa", pass_, d)
                ),
            }
            entry[pass_]["throughput_model"] = throughput_model(results, d, pass_)
        out["crossovers"][str(d)] = entry
    for pass_ in PASSES:
        for form in FORMS:
            pts = [
                p
                for p in results["memory"]
                if (p["form"], p["pass"], p["status"]) == (form, pass_, "ok")
            ]
            pts.sort(key=lambda p: p["n"])
            n_fit_min = fit_start(form, cfg.mem_head_dim)
            pts = [p for p in pts if p["n"] >= n_fit_min]
            if len(pts) >= 2:
                fit = linear_fit([p["n"] for p in pts], [p["peak_extra_bytes"] for p in pts])
                fit["n_range"] = [pts[0]["n"], pts[-1]["n"]]
                # Growth between the two largest N: bytes per extra token, and per extra N².
                a, b = pts[-2], pts[-1]
                grow = b["peak_extra_bytes"] - a["peak_extra_bytes"]
                fit["marginal_bytes_per_token"] = grow / (b["n"] - a["n"])
                fit["bytes_per_n2_at_n_max"] = b["peak_extra_bytes"] / b["n"] ** 2
                out["memory_fit"][f"{form} {pass_}"] = fit
    return out


# ---------------------------------------------------------------------------------------
# Machine, output files.


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = line.split(":", 1)[1].split()
                    return sorted(f for f in flags if f.startswith(("avx", "amx", "fma")))
    except OSError:
        pass
    return []


def git_revision() -> str:
    root = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        return rev + (" (with uncommitted changes)" if dirty else "")
    except OSError:
        return "unknown"


def sdpa_backend(d: int) -> dict:
    """What torch reports for SDPA on these inputs: the fused-kernel choice and the aten ops."""
    from torch.nn.attention import SDPBackend
    from torch.profiler import profile

    info = {}
    for pass_ in PASSES:
        q, k, v, grad = make_inputs(128, d, backward=pass_ == "fwd+bwd")
        choice = torch._fused_sdp_choice(q, k, v)
        with profile() as prof:
            make_call(FORMS["sdpa"], q, k, v, grad, pass_)()
        ops = sorted({e.name for e in prof.events() if "scaled_dot_product" in e.name})
        info[pass_] = {"fused_sdp_choice": SDPBackend(choice).name, "aten_ops": ops}
    return info


def machine_info() -> dict:
    import matplotlib
    import numpy

    return {
        "cpu_model": cpu_model(),
        "cpu_flags": cpu_flags(),
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_parallel": torch.__config__.parallel_info().splitlines()[-1].strip(),
        "mkl": torch.backends.mkl.is_available(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "numpy": numpy.__version__,
        "matplotlib": matplotlib.__version__,
        "taylorshift": taylorshift.__version__,
        "git_revision": git_revision(),
        "op_sources_sha256": op_sources_hash(),
    }


def op_sources_hash() -> str:
    """sha256 over the op's source files, to tell which working tree was measured."""
    import hashlib

    folder = Path(taylorshift.__file__).resolve().parent / "ops" / "taylor_shift"
    h = hashlib.sha256()
    for path in sorted(folder.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def save_json(path: Path, results: dict) -> None:
    write_atomic(path, (json.dumps(results, indent=1) + "\n").encode())


# ---------------------------------------------------------------------------------------
# Plots.

COLOURS = {"sdpa": "tab:blue", "direct": "tab:orange", "efficient": "tab:green"}


def save_figure(fig, path: Path) -> None:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    write_atomic(path, buf.getvalue())


def plot_time(results: dict, analysis: dict, cfg: Config, out: Path) -> list[str]:
    import matplotlib.pyplot as plt

    names = []
    for pass_ in PASSES:
        fig, axes = plt.subplots(1, len(cfg.head_dims), figsize=(5.2 * len(cfg.head_dims), 4.4))
        for ax, d in zip(axes, cfg.head_dims, strict=True):
            for form in FORMS.values():
                pts = sorted(
                    (p["n"], p)
                    for p in results["time"]
                    if (p["form"], p["pass"], p["d"], p["status"]) == (form.name, pass_, d, "ok")
                )
                if not pts:
                    continue
                ns = [n for n, _ in pts]
                med = [p["median_s"] * 1e3 for _, p in pts]
                lo = [p["min_s"] * 1e3 for _, p in pts]
                hi = [p["max_s"] * 1e3 for _, p in pts]
                ax.plot(ns, med, "o-", color=COLOURS[form.name], label=form.label, ms=4)
                ax.fill_between(ns, lo, hi, color=COLOURS[form.name], alpha=0.2, lw=0)
            theory = analysis["crossovers"][str(d)]["theory"]
            ax.axvline(theory["paper_n0"], color="k", ls="--", lw=1, label="paper N0")
            ax.axvline(theory["symmetric_n0"], color="grey", ls=":", lw=1, label="symmetric N0")
            cross = analysis["crossovers"][str(d)][pass_]["efficient_vs_sdpa"]
            if cross["kind"] == "interpolated":
                ax.axvline(cross["n"], color="tab:red", ls="-.", lw=1, label="measured eff = SDPA")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length N (tokens)")
            ax.set_ylabel("time per call (ms), median; band min–max")
            ax.set_title(f"d = {d}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        what = "forward" if pass_ == "fwd" else "forward + backward"
        fig.suptitle(f"CPU time of one {what}, batch 1, 1 head, fp32, {THREADS} threads")
        name = "time_fwd.png" if pass_ == "fwd" else "time_fwd_bwd.png"
        save_figure(fig, out / name)
        plt.close(fig)
        names.append(name)
    return names


def plot_gflops(results: dict, cfg: Config, out: Path) -> str:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(cfg.head_dims), figsize=(5.2 * len(cfg.head_dims), 4.2))
    for ax, d in zip(axes, cfg.head_dims, strict=True):
        for form in FORMS.values():
            for pass_, style in zip(PASSES, ("o-", "s--"), strict=True):
                pts = sorted(
                    (p["n"], p["gflops"])
                    for p in results["time"]
                    if (p["form"], p["pass"], p["d"], p["status"]) == (form.name, pass_, d, "ok")
                )
                if pts:
                    ax.plot(
                        *zip(*pts, strict=True),
                        style,
                        color=COLOURS[form.name],
                        label=f"{form.label} {pass_}",
                        ms=3,
                    )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length N (tokens)")
        ax.set_ylabel("achieved GFLOP/s (model FLOPs / median time)")
        ax.set_title(f"d = {d}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Achieved throughput (model FLOPs: see report.md)")
    save_figure(fig, out / "gflops.png")
    plt.close(fig)
    return "gflops.png"


def plot_memory(results: dict, analysis: dict, cfg: Config, out: Path) -> str:
    """Top: every form, log-log. Bottom: SDPA and efficient on linear axes with their fits."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8.8))
    for col, pass_ in enumerate(PASSES):
        ref = sorted({(p["n"], p["input_bytes"]) for p in results["memory"] if p["pass"] == pass_})
        for row, forms in enumerate((list(FORMS), ["sdpa", "efficient"])):
            ax = axes[row][col]
            for name in forms:
                pts = sorted(
                    (p["n"], p["peak_extra_bytes"] / MIB)
                    for p in results["memory"]
                    if (p["form"], p["pass"], p["status"]) == (name, pass_, "ok")
                )
                if pts:
                    ax.plot(
                        *zip(*pts, strict=True), "o-", color=COLOURS[name], label=FORMS[name].label
                    )
                fit = analysis["memory_fit"].get(f"{name} {pass_}")
                if fit and ref and name != "direct":
                    ns = [n for n, _ in ref if n >= fit["n_range"][0]]
                    ax.plot(
                        ns,
                        [(fit["slope"] * n + fit["intercept"]) / MIB for n in ns],
                        ":",
                        color=COLOURS[name],
                        label=(
                            f"fit: {fit['slope']:.0f} B/token + {fit['intercept'] / MIB:.1f} MiB"
                        ),
                    )
            if ref:
                ax.plot(
                    [n for n, _ in ref],
                    [b / MIB for _, b in ref],
                    "--",
                    color="k",
                    lw=1,
                    label="size of q, k, v (reference)",
                )
            if row == 0:
                ax.set_xscale("log", base=2)
                ax.set_yscale("log")
            ax.set_xlabel("sequence length N (tokens)" + (", log scale" if row == 0 else ""))
            ax.set_ylabel("peak extra RSS of one call (MiB)")
            what = "forward" if pass_ == "fwd" else "forward + backward"
            ax.set_title(what + (", all forms" if row == 0 else ", linear axes"))
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(f"Peak memory vs N, d = {cfg.mem_head_dim}, fresh process per point, fp32")
    fig.tight_layout()
    save_figure(fig, out / "memory.png")
    plt.close(fig)
    return "memory.png"


# ---------------------------------------------------------------------------------------
# Report.


def fmt_ms(p: dict | None) -> str:
    if p is None:
        return "–"
    if p["status"] != "ok":
        return "skipped" if p["status"].startswith("skipped") else p["status"]
    return f"{p['median_s'] * 1e3:.3g} ({p['min_s'] * 1e3:.3g}–{p['max_s'] * 1e3:.3g})"


def fmt_cross(c: dict) -> str:
    if c["kind"] == "interpolated":
        a, b = c["bracket"]
        return f"≈ {c['n']:.0f} (between {a} and {b})"
    if c["kind"] == "below":
        return f"< {c['n_min']} (faster at every measured N, ratio {c['ratio_at_n_min']:.2f})"
    if c["kind"] == "not reached":
        return f"not reached by N = {c['n_max']} (time ratio there {c['ratio_at_n_max']:.2f})"
    return "no data"


def lookup(results: dict, kind: str, form: str, pass_: str, d: int, n: int) -> dict | None:
    for p in results[kind]:
        if (p["form"], p["pass"], p["d"], p["n"]) == (form, pass_, d, n):
            return p
    return None


def time_tables(results: dict, cfg: Config) -> list[str]:
    lines = []
    for d in cfg.head_dims:
        for pass_ in PASSES:
            lines += [
                f"#### d = {d}, {pass_}",
                "",
                "| N | SDPA ms | direct ms | efficient ms | eff/SDPA | eff/direct | GFLOP/s "
                "SDPA / direct / eff | background CPU |",
                "|---:|---|---|---|---:|---:|---|---:|",
            ]
            for n in cfg.time_lengths:
                row = {f: lookup(results, "time", f, pass_, d, n) for f in FORMS}
                ok = {f: p for f, p in row.items() if p and p["status"] == "ok"}

                def ratio(other, ok=ok):
                    if "efficient" in ok and other in ok:
                        return f"{ok['efficient']['median_s'] / ok[other]['median_s']:.2f}"
                    return "–"

                gf = " / ".join(f"{ok[f]['gflops']:.1f}" if f in ok else "–" for f in FORMS)
                bg = max((p["other_cpu_share"] for p in ok.values()), default=None)
                bg_cell = "–" if bg is None else f"{bg:.0%}"
                lines.append(
                    f"| {n} | {fmt_ms(row['sdpa'])} | {fmt_ms(row['direct'])} | "
                    f"{fmt_ms(row['efficient'])} | {ratio('sdpa')} | {ratio('direct')} | {gf} "
                    f"| {bg_cell} |"
                )
            lines.append("")
    return lines


def memory_table(results: dict, cfg: Config) -> list[str]:
    lines = [
        "| pass | N | q,k,v MiB | outputs MiB | SDPA MiB | direct MiB | efficient MiB "
        "| efficient peak / N (B/token) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for pass_ in PASSES:
        for n in cfg.mem_lengths:
            row = {f: lookup(results, "memory", f, pass_, cfg.mem_head_dim, n) for f in FORMS}
            any_p = next(p for p in row.values() if p is not None)

            def cell(p):
                if p is None:
                    return "–"
                if p["status"] != "ok":
                    return "skipped" if p["status"].startswith("skipped") else p["status"]
                return f"{p['peak_extra_bytes'] / MIB:.1f}"

            eff = row["efficient"]
            per_token = (
                f"{eff['peak_extra_bytes'] / n:.0f}" if eff and eff["status"] == "ok" else "–"
            )
            lines.append(
                f"| {pass_} | {n} | {any_p['input_bytes'] / MIB:.1f} | "
                f"{any_p['output_bytes'] / MIB:.1f} | {cell(row['sdpa'])} | "
                f"{cell(row['direct'])} | {cell(row['efficient'])} | {per_token} |"
            )
    return lines


def findings(results: dict, analysis: dict, cfg: Config) -> list[str]:
    """Sentences computed from the measured numbers (no judgement beyond them)."""
    lines = []
    for d in cfg.head_dims:
        entry = analysis["crossovers"][str(d)]
        n0 = entry["theory"]["paper_n0"]
        for pass_ in PASSES:
            c = entry[pass_]["efficient_vs_sdpa"]
            text = f"- d = {d}, {pass_}: efficient vs SDPA {fmt_cross(c)}"
            if c["kind"] == "interpolated":
                text += f"; {c['n'] / n0:.2f} × the paper's N0 = {n0}"
            cd = entry[pass_]["efficient_vs_direct"]
            text += f"; efficient vs direct {fmt_cross(cd)}."
            tm = entry[pass_]["throughput_model"]
            if "throughput_ratio" in tm:
                gs = ", ".join(f"{g:.0f}" for g in tm["gflops_sdpa"])
                ge = ", ".join(f"{g:.0f}" for g in tm["gflops_efficient"])
                at = " and ".join(str(n) for n in tm["at_n"])
                text += (
                    f" Model FLOPs of efficient and SDPA are equal at N ≈ {tm['flop_equal_n']:.0f};"
                    f" at N = {at} SDPA achieves {gs} GFLOP/s and efficient {ge} GFLOP/s"
                    f" ({tm['throughput_ratio']:.1f}×), which puts equal times at"
                    f" N ≈ {tm['flop_equal_n']:.0f} × {tm['throughput_ratio']:.1f}"
                    f" ≈ {tm['predicted_crossover_n']:.0f}."
                )
            lines.append(text)
    lines.append("")
    d = cfg.mem_head_dim
    lines.append(
        f"- memory, for reference: at d = {d} the output alone is {d * BYTES} bytes/token "
        f"(fwd), the output and the gradients of q, k, v {4 * d * BYTES} bytes/token "
        "(fwd+bwd); both are part of the peak."
    )
    for key, fit in analysis["memory_fit"].items():
        lo, hi = fit["n_range"]
        if key.startswith("direct"):
            lines.append(
                f"- memory, {key}: {fit['bytes_per_n2_at_n_max']:.1f} bytes per N² at N = {hi}"
                f" ({fit['bytes_per_n2_at_n_max'] / BYTES:.2f} float32 N×N matrices)."
            )
            continue
        lines.append(
            f"- memory, {key}: {fit['slope']:.0f} bytes/token + {fit['intercept'] / MIB:.1f} MiB"
            f" (least squares over N = {lo}…{hi}, R² = {fit['r2']:.4f}); between the two "
            f"largest N {fit['marginal_bytes_per_token']:.0f} bytes per extra token."
        )
    return lines


def write_report(results: dict, analysis: dict, cfg: Config, out: Path, figures: list[str]):
    m = results["machine"]
    sdpa = results["sdpa_backend"]
    time_ok = [p for p in results["time"] if p["status"] == "ok"]
    n_retried = sum("retried" in p for p in time_ok)
    n_remeasured = sum("remeasured_after_sweep" in p for p in time_ok)
    n_noisy = sum(p["other_cpu_share"] > cfg.noisy_share for p in time_ok)
    mem_ok = [p for p in results["memory"] if p["status"] == "ok"]
    ru_total = len(mem_ok)
    ru_agree = sum(p["ru_maxrss_delta_bytes"] == p["peak_extra_bytes"] for p in mem_ok)
    theory_source = analysis["crossovers"][str(cfg.head_dims[0])]["theory"]["source"]
    lines = [
        "# TaylorShift op on CPU: time against SDPA, peak memory",
        "",
        f"Recorded {results['date']} with `{results['command']}` "
        f"({'quick' if results['quick'] else 'full'} mode, {results['wall_s'] / 60:.1f} min).",
        "",
        "## Machine",
        "",
        f"- CPU: {m['cpu_model']}, {m['logical_cpus']} logical CPUs, "
        f"torch threads {m['torch_threads']}, {m['memory_gib']:.0f} GiB RAM; "
        f"flags {' '.join(m['cpu_flags'])}",
        f"- {m['platform']}; Python {m['python']}; torch {m['torch']} "
        f"(CPU capability {m['torch_cpu_capability']}, {m['torch_parallel']}, "
        f"MKL {m['mkl']}, oneDNN {m['mkldnn']}); taylorshift {m['taylorshift']} "
        f"at {m['git_revision']} (op sources sha256 {m['op_sources_sha256']})",
        f"- The machine is shared: load average (1 min) {results['loadavg_start'][0]:.2f} "
        f"at start, {results['loadavg_end'][0]:.2f} at end. Each time point records the "
        "share of the CPUs other processes used while it was timed (`background CPU` in the "
        f"tables, from /proc/stat); before each point the run waited for it to fall to "
        f"{cfg.quiet_share:.0%} ({results['quiet_wait_s']:.0f} s waited in all, at most "
        f"{cfg.max_wait_point_s:g} s per point), and a point timed with more than "
        f"{cfg.noisy_share:.0%} was measured again and the quieter run kept "
        f"({n_retried} points), and once more after the sweep if still above "
        f"({n_remeasured} points; {n_noisy} remain above {cfg.noisy_share:.0%}).",
        "",
        "## Method",
        "",
        "- One head, batch 1, float32, layout (1, 1, N, d), dv = d, `torch.randn` inputs. "
        "TaylorShift with its defaults (normalize=True, temperature 1, order 2); "
        '`mode="direct"` materialises N×N, `mode="efficient"` is the chunked linear form.',
        "- SDPA: `F.scaled_dot_product_attention(q, k, v)`; torch reports the backend "
        + "; ".join(
            f"d = {d}: {v['fwd']['fused_sdp_choice']} "
            f"(`{', '.join(sorted(set(v['fwd']['aten_ops'] + v['fwd+bwd']['aten_ops'])))}`)"
            for d, v in sdpa.items()
        )
        + " (its memory is in the table below).",
        f"- Time: warm-up (≥ 3 calls and 0.2 s, or 1 call if it takes > 1 s), then "
        f"{cfg.min_reps}–{cfg.max_reps} calls (about {cfg.target_s:g} s per point), "
        "`time.perf_counter`; table cells are median (min–max) in ms. fwd+bwd = forward + "
        "`torch.autograd.grad` w.r.t. q, k, v (inputs require grad only there). A series "
        f"stops when the next point is predicted to take > {cfg.max_call_s:g} s per call or "
        f"> {cfg.max_bytes / GIB:g} GiB (recorded as skipped).",
        "- Model FLOPs per forward: SDPA 4N²d (the two matmuls); direct 4N²d + 6N² (the "
        "paper's count); efficient = `dispatch.efficient_ops` = 2N·(d(d+1)/2 + 2D(d+1)), "
        "D = d(d+1)/2 + d + 1 (symmetric features). fwd+bwd counts 3× the forward. "
        "GFLOP/s = model FLOPs / median time.",
        f"- Memory (d = {cfg.mem_head_dim}): a fresh subprocess per point imports torch, "
        "runs a tiny (N = 64) warm-up call, allocates the inputs (and the output gradient), "
        "resets the RSS high-water mark (`/proc/self/clear_refs` 5), reads it (VmHWM in "
        "`/proc/self/status`), runs the op once, and reads it again: the difference is the "
        "peak extra memory of the call, outputs and gradients included. "
        "`getrusage(RUSAGE_SELF).ru_maxrss` is recorded as well but not used: in a child of "
        "this (large) benchmark process it starts at the parent's high-water mark, which "
        "Linux carries over fork/exec, so its delta stays 0 below that mark "
        f"({ru_agree} of {ru_total} points have equal VmHWM and ru_maxrss deltas).",
        "- Paper N0 from SPEC §3; symmetric N0 = where our implementation's op counts "
        f"(dispatch.py) cross (source: {theory_source}).",
        "",
        "## Crossovers (median times, log-log interpolation between grid points)",
        "",
        "| d | paper N0 | symmetric N0 | pass | efficient faster than SDPA from | "
        "efficient faster than direct from | direct faster than SDPA from |",
        "|---:|---:|---:|---|---|---|---|",
    ]
    for d in cfg.head_dims:
        e = analysis["crossovers"][str(d)]
        for pass_ in PASSES:
            lines.append(
                f"| {d} | {e['theory']['paper_n0']} | {e['theory']['symmetric_n0']} | {pass_} | "
                f"{fmt_cross(e[pass_]['efficient_vs_sdpa'])} | "
                f"{fmt_cross(e[pass_]['efficient_vs_direct'])} | "
                f"{fmt_cross(e[pass_]['direct_vs_sdpa'])} |"
            )
    lines += ["", "## Findings (generated from the numbers below)", ""]
    lines += findings(results, analysis, cfg)
    commentary = out / "commentary.md"
    if commentary.exists():
        lines += ["", commentary.read_text().strip()]
    lines += ["", "## Figures", ""]
    lines += [f"![{f}]({f})" for f in figures]
    lines += ["", "## Time (ms per call)", ""]
    lines += time_tables(results, cfg)
    lines += [
        f"## Peak extra memory of one call (d = {cfg.mem_head_dim}, MiB)",
        "",
        "q,k,v = size of the inputs (reference, not included in the peak); outputs = the "
        "output, plus the three input gradients for fwd+bwd (included in the peak).",
        "",
    ]
    lines += memory_table(results, cfg)
    skipped = [
        f"- {kind} {p['form']} {p['pass']} d={p['d']} N={p['n']}: {p['status']}"
        for kind in ("time", "memory")
        for p in results[kind]
        if p["status"] != "ok"
    ]
    if skipped:
        lines += ["", "## Points not measured", "", *skipped]
    write_atomic(out / "report.md", ("\n".join(lines) + "\n").encode())


# ---------------------------------------------------------------------------------------
# Profile of one efficient call.


def profile_efficient(out: Path, n: int = 4096, head_dims: tuple[int, ...] = (16, 64)) -> None:
    """torch.profiler tables (ops by self CPU time) of 5 efficient calls per case, after a
    quiet wait and warm-up; written to profile_efficient.txt."""
    from torch.profiler import profile

    text = [
        f"Recorded {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}"
        f" with `{' '.join([Path(sys.executable).name, *sys.argv])}`, torch {torch.__version__},"
        f" {THREADS} threads. Profiler overhead inflates the totals; compare shares.",
        "",
    ]
    gate = QuietGate(FULL)
    for d in head_dims:
        for pass_ in PASSES:
            q, k, v, grad = make_inputs(n, d, backward=pass_ == "fwd+bwd")
            call = make_call(FORMS["efficient"], q, k, v, grad, pass_)
            for _ in range(3):
                call()
            gate.wait()
            with profile() as prof:
                for _ in range(5):
                    call()
            table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
            text += [f"efficient {pass_}, N = {n}, d = {d}, 5 calls", table, ""]
    write_atomic(out / "profile_efficient.txt", "\n".join(text).encode())


# ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small grid, a few minutes")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also profile the efficient form (N=4096, d=16 and 64); with --report-only, "
        "this is the only measurement",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="measure nothing: redo analysis, plots and report.md from --out/results.json",
    )
    parser.add_argument("--mem-worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.mem_worker:
        print(json.dumps(memory_worker(json.loads(args.mem_worker))))
        return 0
    if args.report_only:
        results = json.loads((args.out / "results.json").read_text())
        fields = results["config"]
        cfg = Config(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})
        if args.profile:
            torch.set_num_threads(THREADS)
            profile_efficient(args.out)
        finish(results, cfg, args.out)
        return 0

    torch.set_num_threads(THREADS)
    cfg = QUICK if args.quick else FULL
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    results = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "quick": args.quick,
        "config": asdict(cfg),
        "machine": machine_info(),
        "sdpa_backend": {d: sdpa_backend(d) for d in cfg.head_dims},
        "loadavg_start": os.getloadavg(),
        "time": [],
        "memory": [],
        "complete": False,
    }

    def save() -> None:
        results["wall_s"] = time.perf_counter() - start
        save_json(out / "results.json", results)

    gate = QuietGate(cfg)
    run_time_sweep(cfg, results, save, gate)
    remeasure_noisy(cfg, results, gate)
    results["quiet_wait_s"] = gate.waited_s
    run_memory_sweep(cfg, results, save)
    if args.profile:
        profile_efficient(out)
    results["loadavg_end"] = os.getloadavg()
    results["complete"] = True
    save()
    finish(results, cfg, out)
    print(f"done in {results['wall_s'] / 60:.1f} min: {out}", file=sys.stderr)
    return 0


def finish(results: dict, cfg: Config, out: Path) -> None:
    """Analysis into results.json, then the plots and report.md."""
    results["analysis"] = analyse(results, cfg)
    save_json(out / "results.json", results)
    figures = plot_time(results, results["analysis"], cfg, out)
    figures.append(plot_gflops(results, cfg, out))
    figures.append(plot_memory(results, results["analysis"], cfg, out))
    write_report(results, results["analysis"], cfg, out, figures)


if __name__ == "__main__":
    sys.exit(main())
