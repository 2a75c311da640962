"""Timing and peak-memory measurement shared by every benchmark.

Time: warm-up calls, then repeated timed calls; the median with min/max and quartiles. On
CUDA each call is timed with CUDA events (the device's own clock, no host-side jitter); on
the CPU with ``time.perf_counter``. The repetition count follows from a target time per
point, bounded below and above.

Peak memory: on CUDA, ``torch.cuda.max_memory_allocated`` around one call (the allocator's
own high-water mark). On the CPU torch's allocations are plain ``malloc``/``mmap``, which
``tracemalloc`` does not see; we run the call in a fresh process and read its
resident-set high-water mark (``VmHWM``) before and after the call, the mark reset after the
set-up (``/proc/self/clear_refs``), so the number is the extra memory of the call itself.
The worker builds its callable from a *recipe*: ``"module:function"`` plus JSON keyword
arguments; the function builds the inputs and returns a zero-argument callable.

The workers are forked (``os.fork``) from a server process, one per calling thread, that
has imported torch and this package and done nothing else (``python -m
taylorshift.bench.measure``): a point at N = 2,048 took 0.78 s with its inputs and call,
where a new interpreter took 3.51 s, most of it importing (benchmarks/bench_cpu/
forked-memory; most of ``taylorshift bench --quick``'s time went there). Nothing has run
in the server, so a worker starts without tensors, thread pools or memory freed by earlier
points; it takes the caller's ``sys.path``, working directory and environment variables
(those read at start-up, such as the allocator's, are the server's).

Out of memory is a result, never a crash: :func:`is_oom` recognises the exceptions, and a
worker killed by the kernel's OOM killer is reported as ``"oom"``.
"""

from __future__ import annotations

import gc
import importlib
import json
import math
import os
import select
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from .core import ERROR_CHARS, OK, OOM, is_oom, status_of

__all__ = [
    "MemoryResult",
    "TimeResult",
    "cuda_peak_memory",
    "is_oom",
    "measure_memory",
    "run_recipe",
    "time_call",
]


@dataclass
class TimeResult:
    """One timed point. ``status`` is ``"ok"``, ``"oom"`` or ``"error: <type>"``."""

    status: str
    median_s: float = math.nan
    min_s: float = math.nan
    max_s: float = math.nan
    q1_s: float = math.nan
    q3_s: float = math.nan
    reps: int = 0
    warmup_calls: int = 0
    clock: str = ""
    error: str = ""
    times_s: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _clock(device: torch.device) -> tuple[str, Callable[[Callable[[], object]], float]]:
    """The clock that fits the device: a function that runs ``fn`` once and returns seconds."""
    if device.type == "cuda":

        def timed(fn):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3

        return "cuda-event", timed

    def timed(fn):
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    return "perf_counter", timed


def time_call(
    fn: Callable[[], object],
    *,
    device: torch.device | str = "cpu",
    target_s: float = 0.5,
    min_reps: int = 3,
    max_reps: int = 50,
    warmup_s: float = 0.1,
    min_warmup: int = 2,
) -> TimeResult:
    """Time ``fn`` (a zero-argument callable running the work once) on ``device``.

    Warm-up: at least ``min_warmup`` calls and ``warmup_s`` seconds, or a single call when
    that call alone takes longer than 1 s. Then ``reps`` timed calls, ``reps`` chosen so
    that they take about ``target_s`` in all, within [min_reps, max_reps]. Exceptions that
    mean out of memory give ``status="oom"``; other exceptions give ``"error: <type>"``.
    """
    device = torch.device(device)
    clock, timed = _clock(device)
    try:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        warm: list[float] = []
        start = time.perf_counter()
        while True:
            warm.append(timed(fn))
            if warm[0] > 1.0:
                break
            if len(warm) >= min_warmup and time.perf_counter() - start >= warmup_s:
                break
        estimate = min(warm[1:]) if len(warm) > 1 else warm[0]
        reps = max(min_reps, min(max_reps, math.ceil(target_s / max(estimate, 1e-7))))
        times = [timed(fn) for _ in range(reps)]
    except (RuntimeError, MemoryError) as err:
        if device.type == "cuda":
            torch.cuda.empty_cache()  # leave the failed point's cached blocks to the next one
        return TimeResult(status=status_of(err), clock=clock, error=str(err)[:ERROR_CHARS])
    q1, _, q3 = statistics.quantiles(times, n=4) if len(times) > 1 else (times[0],) * 3
    return TimeResult(
        status=OK,
        median_s=statistics.median(times),
        min_s=min(times),
        max_s=max(times),
        q1_s=q1,
        q3_s=q3,
        reps=reps,
        warmup_calls=len(warm),
        clock=clock,
        times_s=times,
    )


@dataclass
class MemoryResult:
    """Peak extra memory of one call. ``method`` says how it was read."""

    status: str
    peak_extra_bytes: int = 0
    method: str = ""
    call_s: float = math.nan
    error: str = ""
    details: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def cuda_peak_memory(fn: Callable[[], object], device: torch.device | str) -> MemoryResult:
    """Extra allocated bytes at the peak of one call of ``fn``, above what was allocated before."""
    device = torch.device(device)
    try:
        fn()  # lazy initialisation (cuBLAS workspaces, autotuning) is not the call's memory
        torch.cuda.synchronize(device)
        gc.collect()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize(device)
        call_s = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated(device)
        del out
    except (RuntimeError, MemoryError) as err:
        torch.cuda.empty_cache()
        return MemoryResult(
            status=status_of(err), method="cuda max_memory_allocated", error=str(err)[:ERROR_CHARS]
        )
    return MemoryResult(
        status=OK,
        peak_extra_bytes=peak - before,
        method="cuda max_memory_allocated",
        call_s=call_s,
        details={"allocated_before_bytes": before},
    )


def run_recipe(recipe: str, kwargs: dict) -> Callable[[], object]:
    """Import ``"package.module:function"`` and call it with ``kwargs``: a zero-arg callable."""
    module_name, sep, name = recipe.partition(":")
    if not sep or not module_name or not name:
        raise ValueError(f"recipe must be 'module:function'; got {recipe!r}")
    builder = getattr(importlib.import_module(module_name), name)
    fn = builder(**kwargs)
    if not callable(fn):
        raise TypeError(f"recipe {recipe!r} must return a callable; got {type(fn).__name__}")
    return fn


def _proc_status_bytes(field_name: str) -> int:
    """A kB field of /proc/self/status (VmRSS: resident now; VmHWM: its high-water mark)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field_name)


def _reset_peak_rss() -> bool:
    """Reset the RSS high-water mark to the current RSS (Linux >= 4.0: clear_refs 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def memory_worker(recipe: str, kwargs: dict, threads: int | None) -> dict:
    """Runs in the fresh process: the extra resident memory at the peak of one call.

    ``ru_maxrss`` is not used: a process spawned by a large parent inherits the parent's
    high-water mark, so its delta reads 0 below that mark. VmHWM is the process's own mark.
    """
    if threads:
        torch.set_num_threads(threads)
    fn = run_recipe(recipe, kwargs)
    fn()  # first call: lazy initialisation (thread pool, kernels) is not the call's memory
    gc.collect()
    reset = _reset_peak_rss()
    rss_before = _proc_status_bytes("VmRSS")
    hwm_before = _proc_status_bytes("VmHWM")
    t0 = time.perf_counter()
    out = fn()
    call_s = time.perf_counter() - t0
    hwm_after = _proc_status_bytes("VmHWM")
    del out
    return {
        "peak_extra_bytes": hwm_after - (hwm_before if reset else rss_before),
        "call_s": call_s,
        "details": {
            "peak_reset": reset,
            "rss_before_bytes": rss_before,
            "vmhwm_before_bytes": hwm_before,
            "vmhwm_after_bytes": hwm_after,
        },
    }


def measure_memory(
    recipe: str,
    kwargs: dict,
    *,
    device: torch.device | str = "cpu",
    threads: int | None = None,
    timeout_s: float = 600.0,
) -> MemoryResult:
    """Peak extra memory of one call of the callable a recipe builds.

    CUDA: in this process, with the allocator's statistics. CPU: in a fresh process (Linux),
    the resident-set high-water mark. The recipe's kwargs must be JSON-serialisable.
    """
    device = torch.device(device)
    if device.type == "cuda":
        try:
            fn = run_recipe(recipe, kwargs)
        except (RuntimeError, MemoryError) as err:
            if not is_oom(err):
                raise
            torch.cuda.empty_cache()
            return MemoryResult(status=OOM, method="cuda max_memory_allocated", error=str(err))
        return cuda_peak_memory(fn, device)
    method = "fresh-process VmHWM"
    if not os.path.exists("/proc/self/status"):
        return MemoryResult(status="error: unsupported", method=method, error="needs Linux /proc")
    request = {
        "recipe": recipe,
        "kwargs": kwargs,
        "threads": threads,
        "timeout_s": timeout_s,
        "sys_path": sys.path,
        "cwd": os.getcwd(),
        "environ": dict(os.environ),
    }
    reply = _fork_server().run(request)
    if reply.get("timed_out"):
        return MemoryResult(
            status="over budget", method=method, error=f"worker timed out after {timeout_s:g} s"
        )
    answer, code = reply.get("answer"), reply["exit_code"]
    if answer is None or "error" in answer:
        # no answer: the worker died before it sent one (the OOM killer sends SIGKILL)
        oom = code in (-signal.SIGKILL, 137) or (answer is not None and answer["oom"])
        status = OOM if oom else f"error: rc={code}"
        error = answer["error"] if answer else f"the worker ended with exit code {code}"
        return MemoryResult(status=status, method=method, error=error[:ERROR_CHARS])
    return MemoryResult(status=OK, method=method, **answer)


# glibc serves allocations below its mmap threshold (which grows up to 32 MiB as large blocks
# are freed) from the heap and keeps freed blocks for reuse: the measured call would reuse
# the warm-up call's memory and the high-water mark would not rise. A fixed threshold of
# 128 KiB makes every large tensor its own mapping, returned to the system when freed. Set
# for the server, so for every worker it forks.
def _worker_env() -> dict[str, str]:
    return {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 << 10)}


class _ForkServer:
    """``python -m taylorshift.bench.measure``: reads one JSON request per line, forks a
    worker for it, answers one JSON line (see :func:`_serve`)."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "taylorshift.bench.measure"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=_worker_env(),
        )
        # at garbage collection or exit: close its input, so that it ends, and reap it
        weakref.finalize(self, _stop_server, self.process)

    def alive(self) -> bool:
        return self.process.poll() is None

    def run(self, request: dict) -> dict:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the memory server ended (exit code {self.process.poll()})")
        return json.loads(line)


def _stop_server(process: subprocess.Popen) -> None:
    for pipe in (process.stdin, process.stdout):
        pipe.close()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


_servers = threading.local()


def _fork_server() -> _ForkServer:
    """This thread's server (started at its first point; it ends when its pipes close)."""
    server = getattr(_servers, "server", None)
    if server is None or not server.alive():
        server = _servers.server = _ForkServer()
    return server


def _serve() -> None:
    """The server loop: per request, fork a worker, wait for its answer at most
    ``timeout_s`` (then SIGKILL it), reap it and reply with its answer and exit code."""
    for line in sys.stdin:
        request = json.loads(line)
        readable, writable = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker
            os.close(readable)
            _worker(request, writable)
        os.close(writable)
        reply: dict = {"timed_out": False}
        if select.select([readable], [], [], request["timeout_s"])[0]:
            with os.fdopen(readable, "rb") as answer:
                data = answer.read()  # to EOF: the worker has exited or is exiting
            reply["answer"] = json.loads(data) if data else None
        else:
            os.close(readable)
            os.kill(pid, signal.SIGKILL)
            reply["timed_out"] = True
        _, status = os.waitpid(pid, 0)
        reply["exit_code"] = os.waitstatus_to_exitcode(status)
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


def _worker(request: dict, channel: int) -> None:
    """The forked worker: one :func:`memory_worker` call; its result (or its error) goes to
    ``channel``. Never returns."""
    code = 0
    try:
        os.dup2(2, 1)  # the server's stdout is its reply channel, not the worker's
        sys.path[:] = request["sys_path"]
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["environ"])
        answer = memory_worker(request["recipe"], request["kwargs"], request["threads"])
    except BaseException as err:  # every failure is the point's result
        message = "".join(traceback.format_exception_only(type(err), err)).strip()
        answer = {"error": message, "oom": is_oom(err)}
        code = 1
    try:
        with os.fdopen(channel, "wb") as out:
            out.write(json.dumps(answer).encode())
    finally:
        os._exit(code)


if __name__ == "__main__":
    _serve()
