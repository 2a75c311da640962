"""The op sweep: time every implementation at each N, then peak memory of a subset.

Series (one implementation, pass, d and dtype, N ascending) run through
:class:`taylorshift.bench.runner.Series`: out of memory or an error is the point's result and
ends its series, and so does a point predicted to be too slow or too large; the points after
it are ``"skipped"``. Points after the sweep's budget are ``"over budget"``.
"""

from __future__ import annotations

import datetime
import gc
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import torch

from ... import vocab
from ...vocab import FORWARD_BACKWARD, PASSES
from .. import machine, measure
from ..core import GIB, OK, OVER_BUDGET
from ..load import NOISY_SHARE, CpuLoad
from ..runner import Budget, Series
from .analysis import analyse, theory_rows
from .cases import IMPLEMENTATIONS, RECIPE, Implementation, make_call, make_inputs, model_flops

__all__ = [
    "SCHEMA",
    "Settings",
    "count_points",
    "predicted_bytes",
    "run_sweep",
    "upgrade_results",
]

SCHEMA = "taylorshift.bench.op/1"


def upgrade_results(results: dict) -> dict:
    """``results`` (from ``results.json``) with passes and dtypes in the vocabulary of
    :mod:`taylorshift.vocab`, in place: files written before say ``"fwd"``, ``"fwd+bwd"``
    and ``"fp32"``, ``"bf16"``, ``"fp16"`` (the recorded ones under benchmarks/ stay so)."""
    for record in (*results.get("points", ()), *results.get("sdpa_backends", ())):
        if "pass" in record:
            record["pass"] = vocab.pass_name(record["pass"])
        if "dtype" in record:
            record["dtype"] = vocab.dtype_name(record["dtype"])
    config = results.get("config", {})
    for key, rename in (
        ("passes", vocab.pass_name),
        ("memory_passes", vocab.pass_name),
        ("dtypes", vocab.dtype_name),
    ):
        if key in config:
            config[key] = [rename(x) for x in config[key]]
    return results


# A memory point makes two calls (a time point at least min_reps plus warm-up), so it may
# take this many times --max-call-s per call.
MEMORY_CALL_FACTOR = 4

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
    dtypes: tuple[str, ...] = ("float32",)
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
    quiet_before_s: float = 0.0  # CPU: wait up to this long for quiet before each time point
    remeasure_noisy: bool = False  # CPU: after the time sweep, time still-noisy points again
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


def default_memory_limit(device: str) -> int:
    """Half the RAM on the CPU, 90 % of the GPU's memory on CUDA (8 GiB where unknown)."""
    share = 0.9 if torch.device(device).type == "cuda" else 0.5
    total = machine.memory_bytes(device)
    return 8 * GIB if total is None else int(share * total)


def _gflops(point: dict) -> float:
    """Achieved GFLOP/s of a time point: model FLOPs / median time."""
    return point["model_flops"] / point["median_s"] / 1e9


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


class _Sweep:
    """The state of one sweep: the points so far, the clock, the budgets."""

    def __init__(self, s: Settings, progress: Callable[[dict], None] | None):
        self.s = s
        self.progress = progress
        self.budget = Budget(s.budget_s)
        self.points: list[dict] = []
        self.sdpa_backends: list[dict] = []
        self.cpu = CpuLoad() if torch.device(s.device).type == "cpu" else None
        self.quiet_left_s = s.quiet_wait_s
        self.waited_s = 0.0
        self.lock = threading.Lock()

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
            backward=pass_name == FORWARD_BACKWARD,
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

    def wait_quiet(self, limit_s: float) -> bool:
        """Wait (CPU, within --quiet-wait-s and the budget) for other processes to calm down;
        whether there was time to wait at all."""
        if self.cpu is None or self.quiet_left_s <= 0 or self.budget.over():
            return False
        waited = self.cpu.wait_quiet(min(limit_s, self.quiet_left_s))
        self.quiet_left_s -= waited
        self.waited_s += waited
        return True

    def time_point(self, call: Callable[[], object]) -> dict:
        """Time a call; on a busy CPU, wait for quiet (within budget) and time it again."""
        if self.s.quiet_before_s > 0:
            self.wait_quiet(self.s.quiet_before_s)
        result = self.time_one(call)
        share = result.get("other_cpu_share")
        if (
            result["status"] == OK
            and share is not None
            and share > NOISY_SHARE
            and self.wait_quiet(10.0)
        ):
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
        series = {impl.name: Series() for impl in impls}
        last: dict[str, tuple[int, float]] = {}  # impl -> (n, min s) of its last ok point
        backend = self.backend(dtype, d, pass_name)
        for n in s.ns:
            inputs = None

            def timed(impl: Implementation, n: int = n) -> dict:
                nonlocal inputs
                if inputs is None:
                    inputs = make_inputs(
                        n,
                        d,
                        heads=s.heads,
                        batch=s.batch,
                        dtype=dtype,
                        device=s.device,
                        backward=pass_name == FORWARD_BACKWARD,
                        seed=s.seed,
                    )
                return self.time_point(make_call(impl, *inputs, pass_name))

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
                point["model_flops"] = model_flops(impl.family, n, d, pass_name, s.batch * s.heads)
                if self.gate(series[impl.name], point, pred_s, pred_b):
                    series[impl.name].run(point, lambda impl=impl: timed(impl), f"N={n}")
                    if point["status"] == OK:  # predict from the fastest call: robust to load
                        last[impl.name] = (n, point["min_s"])
                        point["gflops"] = _gflops(point)
                self.add(point)
            inputs = None
            gc.collect()
            if torch.device(s.device).type == "cuda":
                torch.cuda.empty_cache()

    def gate(
        self,
        series: Series,
        point: dict,
        pred_s: float | None,
        pred_b: float,
        max_call_s: float | None = None,
    ) -> bool:
        """Whether to measure ``point``; if not, record why (a point predicted too slow or
        too large ends its series: the larger ones would be too)."""
        s = self.s
        max_call_s = s.max_call_s if max_call_s is None else max_call_s
        if series.skip(point):
            return False
        if self.budget.over():
            reason = f"the sweep's budget of {s.budget_s:g} s (--budget-s) is used up"
            series.refuse(point, OVER_BUDGET, reason)
            return False
        if pred_b > s.max_memory_bytes:
            reason = (
                f"predicted peak {pred_b / GIB:.2f} GiB > {s.max_memory_bytes / GIB:.3g} GiB "
                "(--max-memory-gib)"
            )
            series.refuse(point, OVER_BUDGET, reason, end="after over budget (memory)")
            return False
        if pred_s is not None and pred_s > max_call_s:
            limit = (
                "--max-call-s"
                if max_call_s == s.max_call_s
                else (f"{MEMORY_CALL_FACTOR} × --max-call-s for a memory point")
            )
            reason = f"predicted {pred_s:.3g} s per call > {max_call_s:g} s ({limit})"
            series.refuse(point, OVER_BUDGET, reason, end="after over budget (time)")
            return False
        return True

    def remeasure_noisy(self) -> None:
        """After the time sweep: time once more, after waiting for quiet, every point that
        other processes still disturbed, and keep the quieter of the two (the series and
        their budgets are not revisited)."""
        s = self.s
        for p in [p for p in self.points if p["kind"] == "time" and p["status"] == OK]:
            share = p.get("other_cpu_share")
            if share is None or share <= NOISY_SHARE or not self.wait_quiet(10.0):
                continue
            inputs = make_inputs(
                p["n"],
                p["d"],
                heads=s.heads,
                batch=s.batch,
                dtype=p["dtype"],
                device=s.device,
                backward=p["pass"] == FORWARD_BACKWARD,
                seed=s.seed,
            )
            again = self.time_one(make_call(IMPLEMENTATIONS[p["impl"]], *inputs, p["pass"]))
            if again["status"] == OK and (again.get("other_cpu_share") or 0.0) < share:
                old = {k: p.get(k) for k in ("median_s", "min_s", "max_s", "other_cpu_share")}
                p.update(again, remeasured_after_sweep=old)
                p["gflops"] = _gflops(p)
            del inputs
            gc.collect()

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
        series = Series()
        last: tuple[int, float, float] | None = None  # (n, call s, peak bytes)
        max_call_s = MEMORY_CALL_FACTOR * s.max_call_s
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
            if self.gate(series, point, pred_s, pred_b, max_call_s):
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
                series.run(
                    point,
                    lambda kwargs=kwargs: measure.measure_memory(
                        RECIPE,
                        kwargs,
                        device=s.device,
                        threads=s.threads or torch.get_num_threads(),
                        timeout_s=60 + 3 * max_call_s,
                    ).to_dict(),
                    f"N={n}",
                )
                if point["status"] == OK:
                    last = (n, point["call_s"], point["peak_extra_bytes"])
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
            elapsed_s=sweep.budget.elapsed(),
            quiet_waited_s=sweep.waited_s,
            loadavg_end=machine.load_average(),
        )
        return results

    results["loadavg_start"] = machine.load_average()
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
        if s.remeasure_noisy and sweep.cpu is not None:
            sweep.remeasure_noisy()
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
