"""``taylorshift bench``: the op sweep — time and peak memory of attention vs sequence length.

For each dtype, head dim d, pass (forward, or forward and backward) and sequence length N
on a grid, every implementation of a small registry (:data:`IMPLEMENTATIONS`: SDPA, the
materialised softmax of the paper's baseline, direct and efficient TaylorShift) runs on
inputs of layout (B, H, N, d). Time comes from :func:`taylorshift.bench.measure.time_call`
(warm-up, median with min/max); peak memory from
:func:`taylorshift.bench.measure.measure_memory` (a fresh process per point on the CPU, the
allocator's statistics on CUDA) for a subset of head dims. Then the crossovers — from which
N the efficient form beats the direct one, and the best softmax — are set beside the cost
model of :mod:`taylorshift.theory`, and ``results.json``, ``results.csv``, ``report.md``
and plots are written.

Nothing stops the sweep: out of memory, errors and points over a budget are results with
their status (``"ok"``, ``"oom"``, ``"error: <type>"``, ``"over budget"``, ``"skipped"``).
A series (one implementation, pass, d and dtype) stops at its first failure or over-budget
point; the rest of it is recorded as ``"skipped"``. docs/bench.md describes the method.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import importlib
import itertools
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import theory
from ..cliargs import format_table, non_negative_float, positive_float, positive_int
from ..ops import taylor_shift_attention
from ..ops.taylor_shift import direct_taylor_shift, efficient_taylor_shift
from . import files, machine, measure
from .crossover import Crossover, find_crossover

__all__ = [
    "IMPLEMENTATIONS",
    "Implementation",
    "Settings",
    "analyse",
    "build_call",
    "register_implementation",
    "run_sweep",
    "write_outputs",
]

HELP = (
    "time and peak memory of attention implementations vs sequence length, and where "
    "efficient TaylorShift starts to win (the op sweep)"
)
INSTALL_HINT = "pip install 'taylorshift[bench]'"
RECIPE = "taylorshift.bench.op:build_call"
SCHEMA = "taylorshift.bench.op/1"

PASSES = ("fwd", "fwd+bwd")
PASS_TEXT = {"fwd": "forward", "fwd+bwd": "forward + backward"}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

OK = "ok"
OOM = "oom"
OVER_BUDGET = "over budget"
SKIPPED = "skipped"

MIB = 1 << 20
GIB = 1 << 30
# Other processes using more than this share of the CPUs while a point is timed make it
# "noisy": it is timed once more after waiting for the machine to calm down (full runs).
NOISY_SHARE = 0.2
QUIET_SHARE = 0.1
# A memory point makes two calls (a time point at least min_reps plus warm-up), so it may
# take this many times --max-call-s per call.
MEMORY_CALL_FACTOR = 4
MIN_LOAD_WINDOW_S = 0.2  # shorter timings get no load figure (other_cpu_share = None)


# The implementations: a registry of plain callables on (B, H, N, d) tensors.


@dataclass(frozen=True)
class Implementation:
    """An attention implementation the sweep can measure.

    Attributes:
        name: the registry key, used on the command line (``--impl``) and in the results.
        label: the name in tables and plot legends.
        fn: ``fn(q, k, v) -> out``, all (B, H, N, d), non-causal, no mask.
        family: ``"softmax"``, ``"taylorshift-direct"`` or ``"taylorshift-efficient"``.
            Crossovers compare each efficient implementation with the fastest (leanest) of
            the direct ones and of the softmax ones at each N.
        time_exponent: call time grows at most like N**time_exponent; predicts the next
            point of a series from the previous one (skip what would take too long).
        n2_matrices: (fwd, fwd+bwd) estimates of the N × N float32 matrices held at the
            peak per (batch, head); predicts memory (skip what would not fit). 0 for
            implementations that never hold one.
        devices: device types it runs on (a Triton kernel would say ``("cuda",)``).
        module: imported by the fresh memory-worker process when it does not know ``name``:
            the module whose import registers the implementation.
    """

    name: str
    label: str
    fn: Callable[[Tensor, Tensor, Tensor], Tensor]
    family: str
    time_exponent: float
    n2_matrices: tuple[float, float] = (0.0, 0.0)
    devices: tuple[str, ...] = ("cpu", "cuda")
    module: str = ""

    def describe(self) -> dict:
        """The JSON-ready part (no callable), stored in results.json for the report."""
        return {
            "label": self.label,
            "family": self.family,
            "time_exponent": self.time_exponent,
            "n2_matrices": list(self.n2_matrices),
        }


FAMILIES = ("softmax", "taylorshift-direct", "taylorshift-efficient")
IMPLEMENTATIONS: dict[str, Implementation] = {}


def register_implementation(impl: Implementation, *, replace: bool = False) -> Implementation:
    """Add ``impl`` to :data:`IMPLEMENTATIONS` (``--impl`` accepts its name from then on)."""
    if impl.family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}; got {impl.family!r}")
    if impl.name in IMPLEMENTATIONS and not replace:
        raise ValueError(f"implementation {impl.name!r} is registered already")
    if not impl.module:
        impl = dataclasses.replace(impl, module=getattr(impl.fn, "__module__", "") or "")
    IMPLEMENTATIONS[impl.name] = impl
    return impl


def sdpa(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """torch's fused ``scaled_dot_product_attention`` (backend chosen by torch)."""
    return F.scaled_dot_product_attention(q, k, v)


def softmax_naive(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """softmax(Q Kᵀ / √d) V with the (N, N) weights materialised: the paper's baseline."""
    weights = torch.softmax((q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1]), dim=-1)
    return weights @ v  # (B, H, N, N) @ (B, H, N, d)


def taylorshift_direct(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return taylor_shift_attention(q, k, v, mode="direct")


def taylorshift_efficient(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return taylor_shift_attention(q, k, v, mode="efficient")


def pytorch_direct(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The PyTorch direct form, never routed to a fused kernel (to compare with one)."""
    return direct_taylor_shift(q, k, v, None, False, 1.0, None, True, 2)


def pytorch_efficient(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The PyTorch efficient form, never routed to a fused kernel (to compare with one)."""
    return efficient_taylor_shift(q, k, v, None, 1.0, None, True)


def triton_direct(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    from ..ops.triton.direct import triton_direct_taylor_shift

    return triton_direct_taylor_shift(q, k, v, None, False, 1.0, None, True)


def triton_efficient(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    from ..ops.triton.efficient import triton_efficient_taylor_shift

    return triton_efficient_taylor_shift(q, k, v, None, 1.0, None, True)


# n2_matrices of the direct form: measured with the memory worker on a CPU at d = 64,
# N = 4096..16384 (4.0 forward, 6.1 forward+backward), rounded up.
for _impl in (
    Implementation("sdpa", "SDPA", sdpa, "softmax", 2),
    Implementation("softmax-naive", "softmax (naive)", softmax_naive, "softmax", 2, (3.0, 5.0)),
    Implementation(
        "direct", "TaylorShift direct", taylorshift_direct, "taylorshift-direct", 2, (4.5, 7.0)
    ),
    Implementation(
        "efficient", "TaylorShift efficient", taylorshift_efficient, "taylorshift-efficient", 1
    ),
    # On CUDA the public op ("direct", "efficient") runs the fused Triton kernels where they
    # apply; these name each path explicitly, so both can be measured in one sweep.
    Implementation(
        "direct-pytorch",
        "TaylorShift direct (PyTorch)",
        pytorch_direct,
        "taylorshift-direct",
        2,
        (4.5, 7.0),
        devices=("cuda",),
    ),
    Implementation(
        "efficient-pytorch",
        "TaylorShift efficient (PyTorch)",
        pytorch_efficient,
        "taylorshift-efficient",
        1,
        devices=("cuda",),
    ),
    Implementation(
        "direct-triton",
        "TaylorShift direct (Triton)",
        triton_direct,
        "taylorshift-direct",
        2,
        devices=("cuda",),
    ),
    Implementation(
        "efficient-triton",
        "TaylorShift efficient (Triton)",
        triton_efficient,
        "taylorshift-efficient",
        1,
        devices=("cuda",),
    ),
):
    register_implementation(_impl)
del _impl

COLOURS = {
    "sdpa": "tab:blue",
    "softmax-naive": "tab:purple",
    "direct": "tab:orange",
    "efficient": "tab:green",
    "direct-pytorch": "tab:brown",
    "efficient-pytorch": "tab:olive",
    "direct-triton": "tab:red",
    "efficient-triton": "tab:cyan",
}


def _implementation(name: str, module: str | None = None) -> Implementation:
    if name not in IMPLEMENTATIONS and module:
        importlib.import_module(module)
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"impl must be one of {sorted(IMPLEMENTATIONS)}; got {name!r}")
    return IMPLEMENTATIONS[name]


def make_inputs(
    n: int,
    d: int,
    *,
    heads: int = 1,
    batch: int = 1,
    dtype: str = "fp32",
    device: str = "cpu",
    backward: bool = False,
    seed: int = 0,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """q, k, v and the fixed output gradient, each (B, H, N, d), standard normal."""
    g = torch.Generator().manual_seed(seed)
    shape = (batch, heads, n, d)
    q, k, v, grad = (
        torch.randn(shape, generator=g).to(device=device, dtype=DTYPES[dtype]) for _ in range(4)
    )
    if backward:
        for t in (q, k, v):
            t.requires_grad_(True)
    return q, k, v, grad


def make_call(
    impl: Implementation, q: Tensor, k: Tensor, v: Tensor, grad: Tensor, pass_name: str
) -> Callable[[], object]:
    """One forward, or one forward and the gradients of q, k, v (not accumulated)."""
    if pass_name == "fwd":
        return lambda: impl.fn(q, k, v)

    def forward_backward():
        out = impl.fn(q, k, v)
        return torch.autograd.grad(out, (q, k, v), grad)

    return forward_backward


def build_call(
    impl: str,
    n: int,
    d: int,
    heads: int = 1,
    batch: int = 1,
    dtype: str = "fp32",
    device: str = "cpu",
    pass_name: str = "fwd",
    seed: int = 0,
    module: str | None = None,
    warmup_n: int | None = None,
) -> Callable[[], object]:
    """The memory recipe (``"taylorshift.bench.op:build_call"``): inputs built, one call.

    With ``warmup_n`` the first call runs on small (``warmup_n``-token) inputs and every
    later call on the real ones. The memory worker calls once to initialise lazily, then
    measures the next call; a full-size first call would leave its freed blocks in the
    process's heap (glibc keeps blocks below its dynamic mmap threshold, up to 32 MiB), and
    the measured call would reuse them without raising the resident-set high-water mark.
    """
    implementation = _implementation(impl, module)

    def call_at(length: int, seed: int) -> Callable[[], object]:
        inputs = make_inputs(
            length,
            d,
            heads=heads,
            batch=batch,
            dtype=dtype,
            device=device,
            backward=pass_name == "fwd+bwd",
            seed=seed,
        )
        return make_call(implementation, *inputs, pass_name)

    first = call_at(warmup_n, seed + 1) if warmup_n else None
    call = call_at(n, seed)
    if first is None:
        return call
    pending = [first]

    def warm_then_real() -> object:
        return pending.pop()() if pending else call()

    return warm_then_real


# Settings of one sweep.

FULL_N = tuple(2**i for i in range(6, 16))  # 64 … 32768
FULL_N_CUDA = tuple(2**i for i in range(6, 17))  # 64 … 65536
FULL_MEMORY_N = tuple(2**i for i in range(8, 17))  # 256 … 65536
QUICK_N = tuple(2**i for i in range(6, 13))  # 64 … 4096
QUICK_MEMORY_N = (512, 1024, 2048, 4096)
DEFAULT_D = (16, 32, 64)
DEFAULT_MEMORY_D = 64


@dataclass(frozen=True)
class Settings:
    """Everything one sweep measures, and the budgets that bound it."""

    ns: tuple[int, ...] = FULL_N
    ds: tuple[int, ...] = DEFAULT_D
    impls: tuple[str, ...] = ("sdpa", "softmax-naive", "direct", "efficient")
    passes: tuple[str, ...] = PASSES
    dtypes: tuple[str, ...] = ("fp32",)
    device: str = "cpu"
    heads: int = 1
    batch: int = 1
    memory: bool = True
    memory_ds: tuple[int, ...] = (DEFAULT_MEMORY_D,)
    memory_ns: tuple[int, ...] = FULL_MEMORY_N
    memory_passes: tuple[str, ...] = PASSES
    memory_jobs: int = 1  # fresh memory processes side by side (CPU)
    max_call_s: float = 5.0  # predicted seconds per call above which a point is skipped
    max_memory_bytes: int = 8 * GIB  # predicted peak above which a point is skipped
    budget_s: float = 1200.0  # the whole sweep; later points are "over budget"
    target_s: float = 0.5  # timed seconds per point (the repetition count follows)
    warmup_s: float = 0.1
    min_reps: int = 5
    max_reps: int = 50
    quiet_wait_s: float = 120.0  # waiting for a quiet CPU, over the whole sweep (0: never)
    threads: int | None = None
    seed: int = 0
    quick: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


# --quick: a grid that shows the efficient-vs-direct crossovers of d = 16 … 64 and the
# memory crossover at d = 64 in about a minute on a 2-core CPU.
QUICK = {
    "ns": QUICK_N,
    "memory_ns": QUICK_MEMORY_N,
    "max_call_s": 1.0,
    "budget_s": 150.0,
    "target_s": 0.1,
    "warmup_s": 0.05,
    "min_reps": 3,
    "max_reps": 20,
    "quiet_wait_s": 0.0,
    "quick": True,
}


def _default_memory_limit(device: str) -> int:
    if torch.device(device).type == "cuda":
        return int(0.9 * torch.cuda.get_device_properties(torch.device(device)).total_memory)
    try:
        return int(0.5 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return 8 * GIB


# Background load of the CPU (Linux /proc/stat), to tell quiet from noisy points.


class CpuLoad:
    """The share of the machine's CPUs that *other* processes use, between two samples."""

    @staticmethod
    def sample() -> tuple[float, float, float] | None:
        """(wall s, busy CPU s of the machine, CPU s of this process), or None off Linux."""
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:9]]
        except (OSError, ValueError):
            return None
        # user nice system idle iowait irq softirq steal: busy = all but idle, iowait, steal
        busy = sum(fields) - fields[3] - fields[4] - fields[7]
        own = os.times()
        return time.perf_counter(), busy / os.sysconf("SC_CLK_TCK"), own.user + own.system

    @staticmethod
    def other_share(before, after) -> float | None:
        if before is None or after is None:
            return None
        wall = after[0] - before[0]
        if wall < MIN_LOAD_WINDOW_S:  # /proc/stat counts in clock ticks (10 ms): too coarse
            return None
        others = (after[1] - before[1]) - (after[2] - before[2])
        return max(0.0, others) / (wall * (os.cpu_count() or 1))

    def wait_quiet(self, limit_s: float, window_s: float = 0.25) -> float:
        """Sleep in short windows until others use <= QUIET_SHARE or ``limit_s`` passed."""
        waited = 0.0
        while waited < limit_s:
            before = self.sample()
            time.sleep(window_s)
            waited += window_s
            share = self.other_share(before, self.sample())
            if share is None or share <= QUIET_SHARE:
                break
        return waited


# The sweep.


def _base_point(kind: str, impl: Implementation, pass_name, dtype, d, n, s: Settings) -> dict:
    return {
        "kind": kind,
        "impl": impl.name,
        "family": impl.family,
        "pass": pass_name,
        "dtype": dtype,
        "device": s.device,
        "d": d,
        "n": n,
        "heads": s.heads,
        "batch": s.batch,
        "status": "",
        "reason": "",
    }


def predicted_bytes(
    impl: Implementation, n: int, d: int, pass_name: str, s: Settings, sdpa_backend: str = ""
) -> float:
    """A rough upper estimate of a call's peak memory (to skip what would not fit).

    Counted in float32 whatever the dtype: half-precision inputs are accumulated in float32.
    """
    rows = s.batch * s.heads
    n2 = impl.n2_matrices[PASSES.index(pass_name)]
    if impl.name == "sdpa" and sdpa_backend == "MATH":  # the unfused backend materialises
        n2 = IMPLEMENTATIONS["softmax-naive"].n2_matrices[PASSES.index(pass_name)]
    linear = 16 * rows * n * d * 4  # inputs, outputs, gradients, buffers
    return n2 * rows * n * n * 4 + linear


def _failure(err: Exception) -> dict:
    """A point's result for an exception: ``oom`` or ``error: <type>``, with the message."""
    status = OOM if measure.is_oom(err) else f"error: {type(err).__name__}"
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"status": status, "error": str(err)[:300]}


class _Sweep:
    """The state of one sweep: the points so far, the clock, the budgets."""

    def __init__(self, s: Settings, progress: Callable[[dict], None] | None):
        self.s = s
        self.progress = progress
        self.start = time.perf_counter()
        self.points: list[dict] = []
        self.sdpa_backends: list[dict] = []
        self.cpu = CpuLoad() if torch.device(s.device).type == "cpu" else None
        self.quiet_left_s = s.quiet_wait_s
        self.waited_s = 0.0
        self.lock = threading.Lock()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def out_of_time(self) -> bool:
        return self.elapsed() > self.s.budget_s

    def add(self, point: dict) -> None:
        with self.lock:
            self.points.append(point)
        if self.progress is not None:
            self.progress(point)

    def backend(self, dtype: str, d: int, pass_name: str) -> str:
        for b in self.sdpa_backends:
            if (b["dtype"], b["d"], b["pass"]) == (dtype, d, pass_name):
                return b["backend"]
        return ""

    def record_backend(self, dtype: str, d: int, pass_name: str) -> None:
        if "sdpa" not in self.s.impls or self.backend(dtype, d, pass_name):
            return
        q, k, v, _ = make_inputs(
            128,
            d,
            heads=self.s.heads,
            batch=self.s.batch,
            dtype=dtype,
            device=self.s.device,
            backward=pass_name == "fwd+bwd",
        )
        self.sdpa_backends.append(
            {"dtype": dtype, "d": d, "pass": pass_name, "backend": machine.sdpa_backend(q, k, v)}
        )

    # Time.

    def time_one(self, call: Callable[[], object]) -> dict:
        s = self.s
        before = self.cpu.sample() if self.cpu else None
        result = measure.time_call(
            call,
            device=s.device,
            target_s=s.target_s,
            min_reps=s.min_reps,
            max_reps=s.max_reps,
            warmup_s=s.warmup_s,
        ).to_dict()
        if self.cpu:
            result["other_cpu_share"] = self.cpu.other_share(before, self.cpu.sample())
        return result

    def time_point(self, call: Callable[[], object]) -> dict:
        """Time a call; on a busy CPU, wait for quiet (within budget) and time it again."""
        result = self.time_one(call)
        share = result.get("other_cpu_share")
        if (
            result["status"] == OK
            and share is not None
            and share > NOISY_SHARE
            and self.quiet_left_s > 0
            and not self.out_of_time()
        ):
            waited = self.cpu.wait_quiet(min(10.0, self.quiet_left_s))
            self.quiet_left_s -= waited
            self.waited_s += waited
            again = self.time_one(call)
            if again["status"] == OK and (again.get("other_cpu_share") or 0.0) < share:
                first, result = result, again
            else:
                first = again
            result["remeasured"] = {
                k: first.get(k) for k in ("median_s", "min_s", "max_s", "other_cpu_share")
            }
        return result

    def run_time(self) -> None:
        s = self.s
        for dtype in s.dtypes:
            for d in s.ds:
                for pass_name in s.passes:
                    self.record_backend(dtype, d, pass_name)
                    self.time_series(dtype, d, pass_name)

    def time_series(self, dtype: str, d: int, pass_name: str) -> None:
        """All implementations at one N, then the next N (so they see the same load)."""
        s = self.s
        impls = [IMPLEMENTATIONS[name] for name in s.impls]
        stopped: dict[str, str] = {}  # impl -> why the rest of its series is skipped
        last: dict[str, tuple[int, float]] = {}  # impl -> (n, min s) of its last ok point
        backend = self.backend(dtype, d, pass_name)
        for n in s.ns:
            inputs = None
            for impl in impls:
                point = _base_point("time", impl, pass_name, dtype, d, n, s)
                if impl.name == "sdpa":
                    point["sdpa_backend"] = backend
                pred_s = None
                if impl.name in last:
                    n_prev, t_prev = last[impl.name]
                    pred_s = t_prev * (n / n_prev) ** impl.time_exponent
                pred_b = predicted_bytes(impl, n, d, pass_name, s, backend)
                point["predicted_call_s"] = pred_s
                point["predicted_peak_bytes"] = pred_b
                status, reason = self.gate(impl.name, stopped, pred_s, pred_b)
                if status is None:
                    try:
                        if inputs is None:
                            inputs = make_inputs(
                                n,
                                d,
                                heads=s.heads,
                                batch=s.batch,
                                dtype=dtype,
                                device=s.device,
                                backward=pass_name == "fwd+bwd",
                                seed=s.seed,
                            )
                        result = self.time_point(make_call(impl, *inputs, pass_name))
                    except Exception as err:  # building the inputs, or not a RuntimeError
                        result = _failure(err)
                    point.update(result)
                    status = point["status"]
                    if status == OK:  # predict from the fastest call: robust to load
                        last[impl.name] = (n, point["min_s"])
                    else:
                        point["reason"] = point.get("error", "")
                        stopped[impl.name] = f"after {status} at N={n}"
                else:
                    point["status"], point["reason"] = status, reason
                self.add(point)
            inputs = None
            gc.collect()
            if torch.device(s.device).type == "cuda":
                torch.cuda.empty_cache()

    def gate(
        self,
        name: str,
        stopped: dict[str, str],
        pred_s: float | None,
        pred_b: float,
        max_call_s: float | None = None,
    ) -> tuple[str | None, str]:
        """(status, reason) for a point not to measure, or (None, "") to measure it."""
        s = self.s
        max_call_s = s.max_call_s if max_call_s is None else max_call_s
        if name in stopped:
            return SKIPPED, stopped[name]
        if self.out_of_time():
            return OVER_BUDGET, f"the sweep's budget of {s.budget_s:g} s (--budget-s) is used up"
        if pred_b > s.max_memory_bytes:
            stopped[name] = "after over budget (memory)"
            return OVER_BUDGET, (
                f"predicted peak {pred_b / GIB:.2f} GiB > {s.max_memory_bytes / GIB:.3g} GiB "
                "(--max-memory-gib)"
            )
        if pred_s is not None and pred_s > max_call_s:
            stopped[name] = "after over budget (time)"
            limit = (
                "--max-call-s"
                if max_call_s == s.max_call_s
                else (f"{MEMORY_CALL_FACTOR} × --max-call-s for a memory point")
            )
            return OVER_BUDGET, f"predicted {pred_s:.3g} s per call > {max_call_s:g} s ({limit})"
        return None, ""

    # Memory.

    def run_memory(self) -> None:
        s = self.s
        series = [
            (dtype, d, pass_name, IMPLEMENTATIONS[name])
            for dtype in s.dtypes
            for d in s.memory_ds
            for pass_name in s.memory_passes
            for name in s.impls
        ]
        for dtype, d, pass_name, _ in series:
            self.record_backend(dtype, d, pass_name)
        jobs = s.memory_jobs if torch.device(s.device).type == "cpu" else 1
        if jobs <= 1:
            for args in series:
                self.memory_series(*args)
            return
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            for future in [pool.submit(self.memory_series, *args) for args in series]:
                future.result()

    def _timed(self, impl: str, dtype: str, d: int, pass_name: str) -> dict[int, float]:
        with self.lock:
            return {
                p["n"]: p["min_s"]
                for p in self.points
                if p["kind"] == "time"
                and p["status"] == OK
                and (p["impl"], p["dtype"], p["d"], p["pass"]) == (impl, dtype, d, pass_name)
            }

    def memory_series(self, dtype: str, d: int, pass_name: str, impl: Implementation) -> None:
        """One series of fresh-process points, N ascending (each predicts the next)."""
        s = self.s
        timed = self._timed(impl.name, dtype, d, pass_name)
        backend = self.backend(dtype, d, pass_name)
        stopped: dict[str, str] = {}
        last: tuple[int, float, float] | None = None  # (n, call s, peak bytes)
        for n in s.memory_ns:
            point = _base_point("memory", impl, pass_name, dtype, d, n, s)
            if impl.name == "sdpa":
                point["sdpa_backend"] = backend
            below = [m for m in timed if m <= n]
            pred_s = None
            if below:
                m = max(below)
                pred_s = timed[m] * (n / m) ** impl.time_exponent
            elif last is not None:
                pred_s = last[1] * (n / last[0]) ** impl.time_exponent
            pred_b = predicted_bytes(impl, n, d, pass_name, s, backend)
            if last is not None and last[2] > 0:
                exponent = 2 if max(impl.n2_matrices) > 0 else 1
                pred_b = max(pred_b, last[2] * (n / last[0]) ** exponent)
            point["predicted_call_s"] = pred_s
            point["predicted_peak_bytes"] = pred_b
            max_call_s = MEMORY_CALL_FACTOR * s.max_call_s
            status, reason = self.gate(impl.name, stopped, pred_s, pred_b, max_call_s)
            if status is None:
                kwargs = {
                    "impl": impl.name,
                    "n": n,
                    "d": d,
                    "heads": s.heads,
                    "batch": s.batch,
                    "dtype": dtype,
                    "device": s.device,
                    "pass_name": pass_name,
                    "seed": s.seed,
                    "module": impl.module,
                    "warmup_n": min(n, 64),
                }
                try:
                    result = measure.measure_memory(
                        RECIPE,
                        kwargs,
                        device=s.device,
                        threads=s.threads or torch.get_num_threads(),
                        timeout_s=60 + 3 * max_call_s,
                    ).to_dict()
                except Exception as err:  # CUDA runs the recipe in this process
                    result = _failure(err)
                point.update(result)
                if point["status"] == OK:
                    last = (n, point["call_s"], point["peak_extra_bytes"])
                else:
                    point["reason"] = point.get("error", "")
                    stopped[impl.name] = f"after {point['status']} at N={n}"
            else:
                point["status"], point["reason"] = status, reason
            self.add(point)


def count_points(s: Settings) -> int:
    """How many points a sweep records (measured or not): the progress bar's total."""
    per = len(s.dtypes) * len(s.impls)
    total = per * len(s.ds) * len(s.passes) * len(s.ns)
    if s.memory:
        total += per * len(s.memory_ds) * len(s.memory_passes) * len(s.memory_ns)
    return total


def run_sweep(
    s: Settings,
    *,
    progress: Callable[[dict], None] | None = None,
    save: Callable[[dict], None] | None = None,
) -> dict:
    """Measure everything ``s`` asks for; the results as a JSON-ready dict.

    ``progress`` is called after each point; ``save`` with the partial results after each
    series of the time sweep, and if the sweep stops early (so a crash or Ctrl-C leaves what
    was measured).
    """
    sweep = _Sweep(s, progress)
    threads = torch.get_num_threads()
    if s.threads:
        torch.set_num_threads(s.threads)
    results = {
        "schema": SCHEMA,
        "tool": "taylorshift bench",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": machine.command_line(),
        "config": s.to_dict(),
        "machine": machine.machine_info(s.device),
        "implementations": {name: IMPLEMENTATIONS[name].describe() for name in s.impls},
        "complete": False,
    }

    def snapshot() -> dict:
        with sweep.lock:
            points = list(sweep.points)
        results.update(
            points=points,
            sdpa_backends=list(sweep.sdpa_backends),
            elapsed_s=sweep.elapsed(),
            quiet_waited_s=sweep.waited_s,
            loadavg_end=os.getloadavg() if hasattr(os, "getloadavg") else None,
        )
        return results

    results["loadavg_start"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    if sweep.cpu is not None:  # how busy the machine is before we start
        before = sweep.cpu.sample()
        time.sleep(0.5)
        results["other_cpu_share_start"] = sweep.cpu.other_share(before, sweep.cpu.sample())
    try:
        if save is not None:
            inner = sweep.progress

            def progress_and_save(point: dict) -> None:
                if inner is not None:
                    inner(point)
                if point["kind"] == "time" and point["n"] == s.ns[-1]:
                    save(snapshot())

            sweep.progress = progress_and_save
        sweep.run_time()
        if s.memory:
            sweep.run_memory()
        results["complete"] = True
    finally:
        torch.set_num_threads(threads)
        snapshot()
        if save is not None and not results["complete"]:
            save(results)  # interrupted or crashed: keep what was measured
    results["crossovers"] = analyse(results)
    results["theory"] = theory_rows(results)
    return results


# Analysis.


def theory_rows(results: dict) -> list[dict]:
    cfg = results["config"]
    ds = sorted(set(cfg["ds"]) | set(cfg.get("memory_ds") or ()))
    return [asdict(row) for row in theory.crossover_table(ds)]


def _series(points: Iterable[dict], key: str, **match) -> dict[int, float]:
    return {
        p["n"]: p[key]
        for p in points
        if p["status"] == OK and all(p.get(k) == v for k, v in match.items())
    }


def _best(points: list[dict], family: str, key: str, **match) -> dict[int, float]:
    """Per N the lowest cost among the implementations of a family."""
    best: dict[int, float] = {}
    for p in points:
        if p["family"] != family or p["status"] != OK:
            continue
        if not all(p.get(k) == v for k, v in match.items()):
            continue
        value = p[key]
        if value is not None and value > 0 and (p["n"] not in best or value < best[p["n"]]):
            best[p["n"]] = value
    return best


METRIC_KEY = {"time": "median_s", "memory": "peak_extra_bytes"}
BASELINES = {"direct": "taylorshift-direct", "softmax": "softmax"}


def analyse(results: dict) -> list[dict]:
    """Crossovers of every efficient implementation against the best direct and the best
    softmax implementation, per metric, dtype, pass and d (see :func:`find_crossover`)."""
    points = results["points"]
    out = []
    groups = sorted(
        {(p["kind"], p["dtype"], p["pass"], p["d"]) for p in points},
        key=lambda g: (g[0] != "time", g[1], g[3], PASSES.index(g[2])),
    )
    challengers = sorted({p["impl"] for p in points if p["family"] == "taylorshift-efficient"})
    for kind, dtype, pass_name, d in groups:
        key = METRIC_KEY[kind]
        match = {"kind": kind, "dtype": dtype, "pass": pass_name, "d": d}
        for challenger in challengers:
            mine = _series(points, key, impl=challenger, **match)
            for baseline, family in BASELINES.items():
                cross = find_crossover(mine, _best(points, family, key, **match))
                out.append(
                    {
                        "metric": kind,
                        "dtype": dtype,
                        "pass": pass_name,
                        "d": d,
                        "challenger": challenger,
                        "baseline": baseline,
                        **cross.to_dict(),
                        "text": cross.describe(),
                    }
                )
    return out


def _crossover(row: dict) -> Crossover:
    fields = ("status", "n", "n_below", "n_above", "sign_changes", "points")
    return Crossover(**{k: row[k] for k in fields})


def _theory_by_d(results: dict) -> dict[int, dict]:
    return {row["d"]: row for row in results.get("theory") or theory_rows(results)}


# Output files: results.json, results.csv, report.md, plots.

CSV_COLUMNS = (
    "kind",
    "impl",
    "family",
    "pass",
    "dtype",
    "device",
    "d",
    "n",
    "heads",
    "batch",
    "status",
    "reason",
    "median_s",
    "min_s",
    "max_s",
    "q1_s",
    "q3_s",
    "reps",
    "warmup_calls",
    "clock",
    "other_cpu_share",
    "peak_extra_bytes",
    "method",
    "call_s",
    "predicted_call_s",
    "predicted_peak_bytes",
    "sdpa_backend",
    "error",
)


def _ms(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    ms = x * 1e3
    return f"{ms:.3g}" if ms < 1000 else f"{ms:,.0f}"


def _label(results: dict, name: str) -> str:
    return results.get("implementations", {}).get(name, {}).get("label", name)


def _impl_names(results: dict, kind: str) -> list[str]:
    order = list(results.get("implementations", {}))
    seen = {p["impl"] for p in results["points"] if p["kind"] == kind}
    return [n for n in order if n in seen] + sorted(seen - set(order))


def _md_table(headers: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> str:
    align = align or "r" * len(headers)
    marks = [":---" if a == "l" else "---:" for a in align]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(marks) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _point_index(results: dict) -> dict[tuple, dict]:
    return {
        (p["kind"], p["impl"], p["dtype"], p["pass"], p["d"], p["n"]): p for p in results["points"]
    }


def _cell_time(p: dict | None) -> str:
    if p is None:
        return "–"
    if p["status"] != OK:
        return p["status"]
    return f"{_ms(p['median_s'])} [{_ms(p['min_s'])}, {_ms(p['max_s'])}]"


def _ratio(a: float | None, b: float | None) -> str:
    if not a or not b:
        return "–"
    return f"{a / b:.2f}"


def _groups(results: dict, kind: str) -> list[tuple[str, str, int]]:
    keys = {(p["dtype"], p["pass"], p["d"]) for p in results["points"] if p["kind"] == kind}
    return sorted(keys, key=lambda g: (g[0], g[2], PASSES.index(g[1])))


def _time_tables(results: dict) -> list[str]:
    index = _point_index(results)
    names = _impl_names(results, "time")
    out = []
    for dtype, pass_name, d in _groups(results, "time"):
        ns = sorted({p["n"] for p in results["points"] if p["kind"] == "time" and p["d"] == d})
        headers = ["N", *[f"{_label(results, n)} ms" for n in names]]
        effs = [
            n
            for n in names
            if results["implementations"].get(n, {}).get("family") == "taylorshift-efficient"
        ]
        for e in effs:
            headers += [f"{e} / direct", f"{e} / best softmax"]
        rows = []
        pts = [
            p
            for p in results["points"]
            if (p["kind"], p["dtype"], p["pass"], p["d"]) == ("time", dtype, pass_name, d)
        ]
        for n in ns:
            row: list[object] = [n]
            row += [_cell_time(index.get(("time", name, dtype, pass_name, d, n))) for name in names]
            for e in effs:
                mine = index.get(("time", e, dtype, pass_name, d, n))
                t = mine["median_s"] if mine and mine["status"] == OK else None
                row.append(_ratio(t, _best(pts, "taylorshift-direct", "median_s").get(n)))
                row.append(_ratio(t, _best(pts, "softmax", "median_s").get(n)))
            rows.append(row)
        out.append(f"### d = {d}, {PASS_TEXT[pass_name]}, {dtype}\n")
        out.append(_md_table(headers, rows) + "\n")
    return out


def _memory_tables(results: dict) -> list[str]:
    index = _point_index(results)
    names = _impl_names(results, "memory")
    out = []
    for dtype, pass_name, d in _groups(results, "memory"):
        ns = sorted({p["n"] for p in results["points"] if p["kind"] == "memory" and p["d"] == d})
        rows = []
        for n in ns:
            row: list[object] = [n]
            for name in names:
                p = index.get(("memory", name, dtype, pass_name, d, n))
                if p is None:
                    row.append("–")
                elif p["status"] != OK:
                    row.append(p["status"])
                else:
                    row.append(f"{p['peak_extra_bytes'] / MIB:.1f}")
            rows.append(row)
        out.append(f"### d = {d}, {PASS_TEXT[pass_name]}, {dtype}\n")
        out.append(_md_table(["N", *[f"{_label(results, n)} MiB" for n in names]], rows) + "\n")
    return out


def _vs_theory(n: float | None, ref: int) -> str:
    return f"{n / ref:.2f}×" if n else "–"


def _crossover_rows(results: dict) -> list[list[object]]:
    theory_d = _theory_by_d(results)
    rows = []
    for c in results.get("crossovers") or analyse(results):
        th = theory_d.get(c["d"])
        if th is None:
            continue
        if c["metric"] == "time":
            refs = f"N0 {th['n0']} · sym {th['n0_symmetric']} · A100 {th['n0_a100_estimate']}"
            ratio = _vs_theory(c["n"], th["n0"])
        else:
            refs = f"N1 {th['n1']} · sym {th['n1_symmetric']}"
            ratio = _vs_theory(c["n"], th["n1"])
        rows.append(
            [
                c["metric"],
                c["d"],
                PASS_TEXT[c["pass"]],
                c["dtype"],
                f"{c['challenger']} vs {c['baseline']}",
                c["text"],
                ratio,
                refs,
            ]
        )
    return rows


def findings(results: dict) -> list[str]:
    """Short sentences generated from the numbers: what a reader should take away."""
    theory_d = _theory_by_d(results)
    out = []
    for c in results.get("crossovers") or analyse(results):
        th = theory_d.get(c["d"])
        if th is None:
            continue
        what = "faster than" if c["metric"] == "time" else "leaner than"
        base = "direct TaylorShift" if c["baseline"] == "direct" else "the best softmax"
        where = f"d = {c['d']}, {PASS_TEXT[c['pass']]}, {c['dtype']}"
        ref_name, ref = ("N0", th["n0"]) if c["metric"] == "time" else ("N1", th["n1"])
        sym = th["n0_symmetric"] if c["metric"] == "time" else th["n1_symmetric"]
        if c["status"] == "crossed":
            text = (
                f"{where}: {c['challenger']} is {what} {base} from N ≈ {c['n']:.0f} "
                f"(between {c['n_below']} and {c['n_above']}); theory {ref_name} = {ref} "
                f"(× {c['n'] / ref:.2f}), symmetric {sym}"
            )
            if c["sign_changes"] > 1:
                text += f"; the winner changed {c['sign_changes']} times along the grid (noise?)"
        elif c["status"] == "above":
            text = f"{where}: {c['challenger']} is not {what} {base} up to N = {c['n_below']}"
            text += f" (theory {ref_name} = {ref})"
        elif c["status"] == "below":
            text = (
                f"{where}: {c['challenger']} is {what} {base} at every N measured, from "
                f"N = {c['n_above']} (theory {ref_name} = {ref})"
            )
        else:
            continue
        out.append(text + ".")
    backends = sorted({b["backend"] for b in results.get("sdpa_backends", [])})
    if backends:
        out.append(f"SDPA ran with the {', '.join(backends)} backend(s) (torch's choice).")
    counts: dict[str, int] = {}
    for p in results["points"]:
        if p["status"] != OK:
            counts[p["status"]] = counts.get(p["status"], 0) + 1
    if counts:
        parts = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
        out.append(f"Points not measured: {parts} (listed at the end).")
    noisy = [p for p in results["points"] if (p.get("other_cpu_share") or 0) > NOISY_SHARE]
    if noisy:
        out.append(
            f"{len(noisy)} time points ran while other processes used more than "
            f"{NOISY_SHARE:.0%} of the CPUs: their times are less reliable."
        )
    if not results.get("complete", True):
        out.append("The sweep did not complete (interrupted or crashed): results are partial.")
    return out


def report_markdown(results: dict, figures: Sequence[str] = ()) -> str:
    m = results["machine"]
    cfg = results["config"]
    hw = m.get("gpu") or m.get("cpu_model")
    lines = [
        "# TaylorShift op benchmark: time and peak memory vs sequence length",
        "",
        f"Recorded {results.get('created', '?')} in {results.get('elapsed_s', 0):.0f} s"
        + (" (--quick)" if cfg.get("quick") else "")
        + ".",
        "",
        "## Machine",
        "",
        f"- device {m.get('device')}: {hw}; {m.get('logical_cpus')} logical CPUs, "
        f"torch threads {m.get('torch_threads')}, {m.get('memory_gib')} GiB RAM"
        + (f"; GPU memory {m['gpu_memory_gib']} GiB, CUDA {m.get('cuda')}" if m.get("gpu") else ""),
        f"- {m.get('platform')}; Python {m.get('python')}; torch {m.get('torch')} "
        f"(CPU capability {m.get('torch_cpu_capability')}); taylorshift {m.get('taylorshift')}"
        + (f"; triton {m['triton']}" if m.get("triton") else ""),
        f"- source: git {m.get('git_revision')}; package sources sha256 {m.get('sources_sha256')}",
        f"- load average (1 min) {_load(results.get('loadavg_start'))} at the start, "
        f"{_load(results.get('loadavg_end'))} at the end"
        + _busy(results.get("other_cpu_share_start")),
        "",
        "## Command",
        "",
        "```",
        results.get("command", ""),
        "```",
        "",
        "## Method",
        "",
        f"- Inputs (B, H, N, d) = ({cfg['batch']}, {cfg['heads']}, N, d), standard normal, "
        f"dv = d, no mask, non-causal; dtypes {', '.join(cfg['dtypes'])}.",
        "- Implementations: "
        + "; ".join(f"`{n}` = {_label(results, n)}" for n in results.get("implementations", {}))
        + ". TaylorShift with its defaults (normalize=True, order 2).",
        f"- Time: `taylorshift.bench.measure.time_call` — warm-up, then {cfg['min_reps']}–"
        f"{cfg['max_reps']} calls (about {cfg['target_s']:g} s per point), median and "
        "[min, max]. forward+backward = the forward and `torch.autograd.grad` of q, k, v "
        "with a fixed output gradient.",
        "- Memory: peak extra memory of one call (inputs excluded, outputs and gradients "
        "included), "
        + (
            "a fresh process per point reading its resident-set high-water mark (VmHWM)"
            if torch.device(cfg["device"]).type == "cpu"
            else "`torch.cuda.max_memory_allocated`"
        )
        + f"; d = {', '.join(map(str, cfg['memory_ds']))}.",
        f"- Budgets: a point predicted to take more than {cfg['max_call_s']:g} s per call or "
        f"{cfg['max_memory_bytes'] / GIB:.3g} GiB is `over budget` and ends its series (the "
        f"rest `skipped`), as does out of memory; the sweep stops measuring after "
        f"{cfg['budget_s']:g} s.",
        "- Crossovers: where log(efficient / baseline) changes sign for the last time, "
        "interpolated in log-log between grid points; baseline = the best direct or the "
        "best softmax implementation at each N. Theory from `taylorshift.theory` (paper "
        "N0, N1; our symmetric form; the paper's A100 estimate N0 + 18 d).",
        "",
        "## Crossovers (measured vs theory)",
        "",
        _md_table(
            ["metric", "d", "pass", "dtype", "comparison", "measured N", "÷ N0 or N1", "theory"],
            _crossover_rows(results),
            align="lrllllrl",
        ),
        "",
        "## Findings (generated from the numbers)",
        "",
        *[f"- {f}" for f in findings(results)],
        "",
    ]
    if figures:
        lines += ["## Figures", "", *[f"![{f}]({f})" for f in figures], ""]
    time_tables = _time_tables(results)
    if time_tables:
        lines += ["## Time per call (ms: median [min, max])", "", *time_tables]
    memory_tables = _memory_tables(results)
    if memory_tables:
        lines += ["## Peak extra memory of one call (MiB)", "", *memory_tables]
    if results.get("sdpa_backends"):
        lines += ["## SDPA backend", ""]
        lines += [
            f"- d = {b['d']}, {PASS_TEXT[b['pass']]}, {b['dtype']}: {b['backend']}"
            for b in results["sdpa_backends"]
        ]
        lines.append("")
    missing = [p for p in results["points"] if p["status"] != OK]
    lines += ["## Points not measured", ""]
    if not missing:
        lines.append("None.")
    for p in missing:
        lines.append(
            f"- {p['kind']} {p['impl']} {p['pass']} {p['dtype']} d={p['d']} N={p['n']}: "
            f"{p['status']}" + (f" ({p['reason']})" if p.get("reason") else "")
        )
    return "\n".join(lines) + "\n"


def _load(value) -> str:
    return f"{value[0]:.2f}" if value else "?"


def _busy(share: float | None) -> str:
    if share is None:
        return ""
    return f"; other processes used {share:.0%} of the CPUs just before the sweep"


# Plots (matplotlib imported here only).


def _interpolate(series: dict[int, float], n: float) -> float | None:
    """The series at ``n``, interpolated linearly in log-log between its grid points."""
    ns = sorted(series)
    for a, b in itertools.pairwise(ns):
        if a <= n <= b:
            t = (math.log(n) - math.log(a)) / (math.log(b) - math.log(a))
            return math.exp(math.log(series[a]) + t * (math.log(series[b]) - math.log(series[a])))
    return series.get(round(n))


def _figure(results: dict, kind: str, dtype: str, pass_name: str):
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    cfg = results["config"]
    ds = sorted(
        {
            p["d"]
            for p in results["points"]
            if (p["kind"], p["dtype"], p["pass"]) == (kind, dtype, pass_name)
        }
    )
    if not ds:
        return None
    key = METRIC_KEY[kind]
    scale = 1e3 if kind == "time" else 1 / MIB
    theory_d = _theory_by_d(results)
    fig = Figure(figsize=(5.0 * len(ds), 4.4), layout="constrained")
    axes = fig.subplots(1, len(ds), squeeze=False)[0]
    names = _impl_names(results, kind)
    palette = iter(["tab:red", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:gray"])
    colours = {n: COLOURS.get(n) or next(palette, "black") for n in names}
    drawn_any = False
    for ax, d in zip(axes, ds, strict=True):
        match = {"kind": kind, "dtype": dtype, "pass": pass_name, "d": d}
        for name in names:
            pts = sorted(
                (
                    p
                    for p in results["points"]
                    if p["impl"] == name and all(p[k] == v for k, v in match.items())
                ),
                key=lambda p: p["n"],
            )
            ok = [p for p in pts if p["status"] == OK and (p[key] or 0) > 0]
            label = _label(results, name)
            failed = next((p for p in pts if p["status"] not in (OK, SKIPPED)), None)
            if failed is not None:
                label += f" ({failed['status']} at N={failed['n']})"
            if not ok:
                continue
            drawn_any = True
            ns = [p["n"] for p in ok]
            ax.plot(
                ns,
                [p[key] * scale for p in ok],
                marker="o",
                ms=3.5,
                lw=1.6,
                color=colours[name],
                label=label,
            )
            if kind == "time":
                ax.fill_between(
                    ns,
                    [p["min_s"] * scale for p in ok],
                    [p["max_s"] * scale for p in ok],
                    color=colours[name],
                    alpha=0.18,
                    lw=0,
                )
        th = theory_d.get(d)
        if th is not None:
            n_th, n_sym, sym = (
                (th["n0"], th["n0_symmetric"], "N0")
                if kind == "time"
                else (th["n1"], th["n1_symmetric"], "N1")
            )
            ax.axvline(n_th, ls="--", lw=1, color="black", label=f"theory {sym} = {n_th} (paper)")
            ax.axvline(
                n_sym, ls="--", lw=1, color="grey", label=f"theory {sym} = {n_sym} (symmetric form)"
            )
        for c in results.get("crossovers") or analyse(results):
            if (c["metric"], c["dtype"], c["pass"], c["d"]) != (kind, dtype, pass_name, d):
                continue
            if c["status"] != "crossed":
                continue
            mine = _series(results["points"], key, impl=c["challenger"], **match)
            y = _interpolate(mine, c["n"])
            if y is None:
                continue
            marker = "*" if c["baseline"] == "direct" else "D"
            ax.plot(
                [c["n"]],
                [y * scale],
                marker=marker,
                ms=11 if marker == "*" else 7,
                color="black",
                ls="none",
                zorder=5,
                label=f"measured: {c['challenger']} < {c['baseline']} at N ≈ {c['n']:.0f}",
            )
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
        ax.set_yscale("log")
        ax.set_title(f"head dim d = {d}")
        ax.set_xlabel("sequence length N (tokens)")
        ax.set_ylabel(
            "time per call (ms, median; band: min–max)"
            if kind == "time"
            else "peak extra memory of one call (MiB)"
        )
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=7, loc="upper left")
    if not drawn_any:
        return None
    what = "Time per call" if kind == "time" else "Peak extra memory"
    fig.suptitle(
        f"{what} vs sequence length — {PASS_TEXT[pass_name]}, {dtype}, {cfg['device']}, "
        f"batch {cfg['batch']}, heads {cfg['heads']}\n(log-log; dashed lines: crossovers of the "
        "cost model; black marks: measured crossovers)",
        fontsize=10,
    )
    return fig


def figure_names(results: dict) -> list[tuple[str, str, str, str]]:
    """(file name, kind, dtype, pass) of every figure the results have data for."""
    out = []
    for kind in ("time", "memory"):
        combos = sorted(
            {
                (p["dtype"], p["pass"])
                for p in results["points"]
                if p["kind"] == kind and p["status"] == OK
            },
            key=lambda c: (c[0], PASSES.index(c[1])),
        )
        for dtype, pass_name in combos:
            tag = pass_name.replace("+", "_")
            out.append((f"{kind}_{tag}_{dtype}.png", kind, dtype, pass_name))
    return out


def write_outputs(
    results: dict, out: str | os.PathLike, *, plots: bool = True, json_file: bool = True
) -> list[Path]:
    """results.json (unless ``json_file=False``), results.csv, report.md and the PNGs."""
    out = Path(out)
    written = []
    if json_file:
        written.append(files.write_json(out / "results.json", results))
    written.append(files.write_csv(out / "results.csv", results["points"], CSV_COLUMNS))
    figures = []
    if plots:
        for name, kind, dtype, pass_name in figure_names(results):
            fig = _figure(results, kind, dtype, pass_name)
            if fig is not None:
                written.append(files.write_figure(out / name, fig))
                figures.append(name)
    written.append(files.write_text(out / "report.md", report_markdown(results, figures)))
    return written


def summary(results: dict) -> str:
    """The crossover table printed at the end of a run."""

    rows = []
    theory_d = _theory_by_d(results)
    by_key: dict[tuple, dict[str, str]] = {}
    for c in results.get("crossovers") or analyse(results):
        key = (c["metric"], c["d"], c["pass"], c["dtype"], c["challenger"])
        by_key.setdefault(key, {})[c["baseline"]] = c["text"]
    for (metric, d, pass_name, dtype, challenger), texts in by_key.items():
        th = theory_d.get(d, {})
        if metric == "time":
            refs = [th.get("n0"), th.get("n0_symmetric"), th.get("n0_a100_estimate")]
        else:
            refs = [th.get("n1"), th.get("n1_symmetric"), ""]
        rows.append(
            [
                metric,
                d,
                pass_name,
                dtype,
                challenger,
                texts.get("direct", "n/a"),
                texts.get("softmax", "n/a"),
                *refs,
            ]
        )
    headers = [
        "metric",
        "d",
        "pass",
        "dtype",
        "impl",
        "vs direct",
        "vs best softmax",
        "paper N0/N1",
        "symmetric",
        "A100 N0+18d",
    ]
    if not rows:
        return "No crossovers: nothing was measured."
    return (
        "Crossovers: the N from which the efficient form is faster (time) or leaner "
        "(memory) than\nthe direct form and than the best softmax; beside them the cost "
        "model's N0 (time) or N1 (memory),\nfor the paper's form and our symmetric one, and "
        "the paper's measured A100 estimate N0 + 18 d\n\n" + format_table(headers, rows)
    )


# Command line.


def _grid(values: Sequence[int]) -> str:
    return " ".join(map(str, values)) if len(values) <= 4 else f"{values[0]} … {values[-1]}"


# Options that shape a sweep (all default to None, so that --quick and the device can fill
# them in, and --report-only can refuse them).
SWEEP_OPTIONS = (
    "n",
    "d",
    "impl",
    "passes",
    "dtype",
    "device",
    "heads",
    "batch",
    "memory_d",
    "memory_n",
    "memory_pass",
    "memory_jobs",
    "max_call_s",
    "max_memory_gib",
    "budget_s",
    "target_s",
    "quiet_wait_s",
    "threads",
    "seed",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add(
        "--quick",
        action="store_true",
        help=f"a short sweep (1–2 minutes on a 2-core CPU): N {_grid(QUICK_N)}, "
        f"memory at N {_grid(QUICK_MEMORY_N)}, smaller budgets",
    )
    add(
        "--n",
        nargs="+",
        type=positive_int,
        metavar="N",
        help=f"sequence lengths (default: {_grid(FULL_N)} by powers of 2, to "
        f"{FULL_N_CUDA[-1]} on CUDA; --quick: {_grid(QUICK_N)})",
    )
    add(
        "--d",
        nargs="+",
        type=positive_int,
        metavar="D",
        help=f"head dims (default: {_grid(DEFAULT_D)})",
    )
    add(
        "--impl",
        nargs="+",
        metavar="NAME",
        help=f"implementations (default: all that run on the device: {', '.join(IMPLEMENTATIONS)})",
    )
    add(
        "--pass",
        dest="passes",
        nargs="+",
        choices=PASSES,
        help="fwd (forward), fwd+bwd (forward and gradients of q, k, v) (default: both)",
    )
    add(
        "--dtype",
        nargs="+",
        choices=tuple(DTYPES),
        help="dtypes (default: bf16 on CUDA, fp32 on the CPU)",
    )
    add("--device", help="cpu, cuda or cuda:i (default: cuda if available, else cpu)")
    add("--heads", type=positive_int, help="heads H of the (B, H, N, d) inputs (default: 1)")
    add("--batch", type=positive_int, help="batch B of the (B, H, N, d) inputs (default: 1)")
    add("--no-memory", action="store_true", help="time only: no peak-memory sweep")
    add(
        "--memory-d",
        nargs="+",
        type=positive_int,
        metavar="D",
        help=f"head dims of the memory sweep (default: {DEFAULT_MEMORY_D} if in --d, else "
        "the largest --d)",
    )
    add(
        "--memory-n",
        nargs="+",
        type=positive_int,
        metavar="N",
        help=f"sequence lengths of the memory sweep (default: {_grid(FULL_MEMORY_N)}; "
        f"--quick: {_grid(QUICK_MEMORY_N)})",
    )
    add(
        "--memory-pass",
        nargs="+",
        choices=PASSES,
        help="passes of the memory sweep (default: both)",
    )
    add(
        "--memory-jobs",
        type=positive_int,
        help="fresh memory processes run side by side on the CPU (default: 2, at most the "
        "CPU count; always 1 on CUDA)",
    )
    add(
        "--max-call-s",
        type=positive_float,
        metavar="S",
        help="skip a point predicted to take longer per call, and the rest of its series; "
        f"memory points may take {MEMORY_CALL_FACTOR}× as long (default: 5; --quick: 1)",
    )
    add(
        "--max-memory-gib",
        type=positive_float,
        metavar="GIB",
        help="skip a point predicted to need more memory (default: half the RAM on the "
        "CPU, 90%% of the GPU's memory on CUDA)",
    )
    add(
        "--budget-s",
        type=positive_float,
        metavar="S",
        help="time budget of the whole sweep; points after it are 'over budget' "
        "(default: 1200; --quick: 150)",
    )
    add(
        "--target-s",
        type=positive_float,
        metavar="S",
        help="timed seconds per point; the repetition count follows (default: 0.5; --quick: 0.1)",
    )
    add(
        "--quiet-wait-s",
        type=non_negative_float,
        metavar="S",
        help="CPU: seconds in all to wait for other processes to calm down before timing "
        "a noisy point again (default: 120; --quick: 0, no re-timing)",
    )
    add("--threads", type=positive_int, help="torch CPU threads (default: torch's own)")
    add("--seed", type=int, help="seed of the random inputs (default: 0)")
    add("--out", type=Path, help="output folder (default: bench-results)")
    add(
        "--report-only",
        type=Path,
        metavar="DIR",
        help="only rewrite report.md, results.csv and the plots from DIR/results.json",
    )
    add("--no-plots", action="store_true", help="write no PNGs (matplotlib not needed)")


def settings_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Settings:
    """The sweep's settings; bad values go through ``parser.error`` (exit status 2)."""
    device_text = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device_text)
    except RuntimeError:
        parser.error(f"--device: expected cpu, cuda or cuda:i; got {device_text!r}")
    if device.type not in ("cpu", "cuda"):
        parser.error(f"--device: expected cpu, cuda or cuda:i; got {device_text!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(
            f"--device: expected an available device; got {device_text!r} but CUDA is not available"
        )
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        parser.error(
            f"--device: expected cuda:0 … cuda:{torch.cuda.device_count() - 1}; got {device_text!r}"
        )
    if args.impl is None:
        impls = tuple(n for n, i in IMPLEMENTATIONS.items() if device.type in i.devices)
    else:
        impls = tuple(dict.fromkeys(args.impl))
        unknown = [n for n in impls if n not in IMPLEMENTATIONS]
        if unknown:
            parser.error(
                f"--impl: expected names from {', '.join(IMPLEMENTATIONS)}; "
                f"got {', '.join(map(repr, unknown))}"
            )
        wrong = [n for n in impls if device.type not in IMPLEMENTATIONS[n].devices]
        if wrong:
            parser.error(
                f"--impl: {', '.join(wrong)} runs on "
                f"{'/'.join(IMPLEMENTATIONS[wrong[0]].devices)} only; expected an "
                f"implementation for --device {device_text}"
            )
    base = Settings(**(QUICK if args.quick else {}))
    ds = tuple(sorted(set(args.d or base.ds)))
    if args.n:
        ns = tuple(sorted(set(args.n)))
    else:
        ns = FULL_N_CUDA if device.type == "cuda" and not args.quick else base.ns
    memory_d = args.memory_d or ((DEFAULT_MEMORY_D,) if DEFAULT_MEMORY_D in ds else (max(ds),))
    given = {
        "ns": ns,
        "ds": ds,
        "impls": impls,
        "passes": tuple(dict.fromkeys(args.passes or base.passes)),
        "dtypes": tuple(
            dict.fromkeys(args.dtype or ("bf16" if device.type == "cuda" else "fp32",))
        ),
        "device": str(device),
        "heads": args.heads or base.heads,
        "batch": args.batch or base.batch,
        "memory": not args.no_memory,
        "memory_ds": tuple(sorted(set(memory_d))),
        "memory_ns": tuple(sorted(set(args.memory_n or base.memory_ns))),
        "memory_passes": tuple(dict.fromkeys(args.memory_pass or base.memory_passes)),
        "memory_jobs": min(args.memory_jobs or 2, os.cpu_count() or 1),
        "max_memory_bytes": int(args.max_memory_gib * GIB)
        if args.max_memory_gib is not None
        else _default_memory_limit(str(device)),
        "threads": args.threads,
    }
    for name in ("max_call_s", "budget_s", "target_s", "quiet_wait_s", "seed"):
        if getattr(args, name) is not None:
            given[name] = getattr(args, name)
    return dataclasses.replace(base, **given)


def _missing_dependencies(progress: bool, plots: bool) -> list[str]:
    missing = []
    if progress:
        try:
            import tqdm  # noqa: F401
        except ImportError:
            missing.append("tqdm")
    if plots:
        try:
            import matplotlib.figure  # noqa: F401
        except ImportError:
            missing.append("matplotlib")
    return missing


def _report_only(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    given = [name for name in SWEEP_OPTIONS if getattr(args, name) is not None]
    given += [name for name in ("quick", "no_memory") if getattr(args, name)]
    if args.out is not None:
        given.append("out")
    if given:
        flags = ", ".join("--" + ("pass" if g == "passes" else g.replace("_", "-")) for g in given)
        parser.error(
            f"--report-only rewrites the files in its folder from results.json; "
            f"expected no sweep options with it, got {flags}"
        )
    folder = args.report_only
    path = folder / "results.json"
    if not path.is_file():
        parser.error(
            f"--report-only: expected a folder holding results.json; got {str(folder)!r}"
            " (no results.json there)"
        )
    try:
        results = json.loads(path.read_text())
        if results.get("schema") != SCHEMA:
            raise ValueError(f"schema {results.get('schema')!r}, expected {SCHEMA!r}")
        results["crossovers"] = analyse(results)
        results["theory"] = theory_rows(results)
    except (ValueError, KeyError, TypeError) as err:
        parser.error(
            f"--report-only: expected results.json written by taylorshift bench; "
            f"{path} does not parse: {err}"
        )
    written = write_outputs(results, folder, plots=not args.no_plots, json_file=False)
    print(summary(results))
    print(f"\nrewrote {', '.join(p.name for p in written)} in {folder}")
    return 0


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``taylorshift bench``: sweep, write the files into ``--out``, print the crossovers."""
    missing = _missing_dependencies(progress=args.report_only is None, plots=not args.no_plots)
    if missing:
        print(
            f"error: taylorshift bench needs {' and '.join(missing)}: {INSTALL_HINT}"
            + ("" if args.no_plots else " (or pass --no-plots if only matplotlib is missing)"),
            file=sys.stderr,
        )
        return 1
    if args.report_only is not None:
        return _report_only(args, parser)
    settings = settings_from_args(args, parser)
    out = Path(args.out or "bench-results")
    from tqdm import tqdm

    bar = tqdm(
        total=count_points(settings),
        unit="pt",
        desc="bench",
        dynamic_ncols=True,
        file=sys.stderr,
        mininterval=0.5,
    )

    def progress(p: dict) -> None:
        where = f"{p['kind']} {p['impl']} {p['pass']} {p['dtype']} d={p['d']}"
        bar.set_description(where, refresh=False)
        bar.set_postfix_str(f"N={p['n']} {p['status']}", refresh=False)
        bar.update()

    def save(partial: dict) -> None:
        files.write_json(out / "results.json", partial)

    try:
        results = run_sweep(settings, progress=progress, save=save)
    except KeyboardInterrupt:
        bar.close()
        print(
            f"interrupted: the points measured so far are in {out / 'results.json'}; "
            f"taylorshift bench --report-only {out} makes a report of them",
            file=sys.stderr,
        )
        return 130
    bar.close()
    busy = results.get("other_cpu_share_start")
    if busy is not None and busy > NOISY_SHARE:
        print(
            f"note: other processes used {busy:.0%} of the CPUs when the sweep started; "
            "times on a busy machine are slower and noisier (see other_cpu_share per point)",
            file=sys.stderr,
        )
    written = write_outputs(results, out, plots=not args.no_plots)
    print(summary(results))
    print(
        f"\n{len(results['points'])} points in {results['elapsed_s']:.0f} s; wrote "
        f"{', '.join(p.name for p in written)} to {out}"
    )
    return 0
