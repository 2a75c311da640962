"""Timing sequence-parallel TaylorShift in a process group: every rank runs its shard, the
group's time of a call is its slowest rank's. On the CPU the sweep spawns gloo processes; under
torchrun it joins the group torchrun set up (NCCL on GPUs)."""

from __future__ import annotations

import datetime
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from ...distributed.sequence_parallel import sequence_parallel_taylor_shift, sequence_shard
from ...ops.taylor_shift.features import compute_dtype, feature_dim
from ..core import dtypes
from .costs import state_elements

__all__ = ["Settings", "measure", "measure_collective", "run_spawned", "run_torchrun"]

DTYPES = dtypes("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class Settings:
    """What one sweep measures (picklable: spawned processes receive it)."""

    procs: tuple[int, ...] = (2, 4)
    lengths: tuple[int, ...] = (4096, 16384, 65536)
    batch: int = 1
    heads: int = 4
    head_dim: int = 16
    dtype: str = "float32"
    causal: tuple[bool, ...] = (False, True)
    repeats: int = 5
    threads: int = 1


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _slowest(*seconds: float, group, device: torch.device) -> list[float]:
    """The largest of the ranks' values of each (the group's time for the call)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return list(seconds)
    t = torch.tensor(seconds, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.tolist()


def _barrier(group, device: torch.device) -> None:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        if device.type == "cuda":
            dist.barrier(group=group, device_ids=[device.index])
        else:
            dist.barrier(group=group)


def measure(
    n: int,
    batch: int,
    heads: int,
    head_dim: int,
    causal: bool,
    repeats: int,
    group=None,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    warmup: int = 1,
) -> dict[str, float]:
    """Median seconds of one forward and one forward + backward of this rank's shard.

    Call it on every rank of ``group`` (or in a single process with ``group=None`` and no
    process group): the ranks hold the balanced split of ``n`` tokens.
    """
    device = torch.device(device)
    world, rank = 1, 0
    if dist.is_available() and dist.is_initialized():
        world, rank = dist.get_world_size(group), dist.get_rank(group)
    local = sequence_shard(n, rank, world)
    m = local.stop - local.start
    g = torch.Generator().manual_seed(1000 + rank)
    q, k, v, grad = (
        torch.randn(batch, heads, m, head_dim, generator=g).to(device, dtype) for _ in range(4)
    )

    def forward():
        with torch.no_grad():
            sequence_parallel_taylor_shift(q, k, v, is_causal=causal, group=group)

    def forward_backward():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        y = sequence_parallel_taylor_shift(*leaves, is_causal=causal, group=group)
        torch.autograd.grad(y, leaves, grad)

    times = {}
    for name, fn in (("forward", forward), ("forward_backward", forward_backward)):
        wall, cpu = [], []
        for i in range(warmup + repeats):
            _barrier(group, device)
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            _sync(device)
            t1, c1 = time.perf_counter(), time.process_time()
            seconds = _slowest(t1 - t0, c1 - c0, group=group, device=device)
            if i >= warmup:
                wall.append(seconds[0])
                cpu.append(seconds[1])
        times[f"{name}_s"] = statistics.median(wall)
        times[f"{name}_min_s"] = min(wall)
        times[f"{name}_cpu_s"] = statistics.median(cpu)
    return times


def measure_collective(
    batch: int, heads: int, head_dim: int, causal: bool, repeats: int, group, device, dtype
) -> float:
    """Median seconds of the forward collective alone, on a state-sized buffer."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return 0.0
    state = torch.randn(
        batch, heads, feature_dim(head_dim), head_dim + 1, dtype=compute_dtype(dtype)
    ).to(device)
    parts = [torch.empty_like(state) for _ in range(dist.get_world_size(group))]
    samples = []
    for i in range(1 + repeats):
        _barrier(group, device)
        t0 = time.perf_counter()
        if causal:
            dist.all_gather(parts, state, group=group)
        else:
            dist.all_reduce(state, group=group)
        _sync(device)
        (seconds,) = _slowest(time.perf_counter() - t0, group=group, device=device)
        if i:
            samples.append(seconds)
    return statistics.median(samples)


def _sweep(s: Settings, device: torch.device) -> list[dict]:
    """Every point at every group size, the sizes back to back for each point, so that a
    change of load on a shared machine hits them alike. Group size p is ranks 0..p-1 (the
    others wait); p = 1 is the single-process form. Rank 0 returns the rows."""
    world, rank = dist.get_world_size(), dist.get_rank()
    sizes = sorted({1, world, *(p for p in s.procs if 1 < p < world)})
    # Every rank creates every group, in the same order; p = world is the default group.
    groups = {p: None if p == world else dist.new_group(list(range(p))) for p in sizes}
    dtype = DTYPES[s.dtype]
    rows = []
    for causal in s.causal:
        for n in s.lengths:
            for p in sizes:
                if rank < p:
                    times = measure(
                        n, s.batch, s.heads, s.head_dim, causal, s.repeats,
                        groups[p], dtype=dtype, device=device,
                    )  # fmt: skip
                    collective = measure_collective(
                        s.batch, s.heads, s.head_dim, causal, s.repeats,
                        groups[p], device, dtype,
                    )  # fmt: skip
                    row = {"ranks": p, "causal": causal, "n": n, **times}
                    state = s.batch * s.heads * state_elements(s.head_dim, s.head_dim)
                    state *= compute_dtype(dtype).itemsize  # the buffer of each collective
                    rows.append({**row, "collective_s": collective, "state_bytes": state})
                    if rank == 0:
                        print(_format_row(rows[-1]), flush=True)
                _barrier(None, device)
    return rows if rank == 0 else []


def _format_row(row: dict) -> str:
    kind = "causal" if row["causal"] else "non-causal"
    return (
        f"P={row['ranks']} {kind:>10} N={row['n']:>7}  forward {row['forward_s'] * 1e3:9.2f} ms  "
        f"forward+backward {row['forward_backward_s'] * 1e3:9.2f} ms  "
        f"collective {row['collective_s'] * 1e3:7.3f} ms"
    )


def _spawned(rank: int, world: int, store: str, s: Settings, out: str) -> None:
    torch.set_num_threads(s.threads)
    dist.init_process_group(
        "gloo", store=dist.FileStore(store, world), rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=600),
    )  # fmt: skip
    try:
        rows = _sweep(s, torch.device("cpu"))
        if rank == 0:
            Path(out).write_text(json.dumps(rows))
    finally:
        dist.destroy_process_group()


def run_spawned(s: Settings) -> list[dict]:
    """On the CPU: spawn max(procs) gloo processes, measure, return rank 0's rows."""
    world = max(s.procs)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        torch.multiprocessing.start_processes(
            _spawned, args=(world, os.path.join(tmp, "store"), s, out), nprocs=world
        )
        return json.loads(Path(out).read_text())


def run_torchrun(s: Settings) -> list[dict]:
    """Under torchrun: NCCL on CUDA (gloo without), group sizes up to the world."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(s.threads)
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        return _sweep(s, device)
    finally:
        dist.destroy_process_group()
