"""Sequence-parallel TaylorShift: bytes sent per layer (on paper) and measured times.

On the CPU, gloo (spawns max(--procs) processes; group sizes 1 and ``--procs`` are ranks
0..P-1 of them, measured back to back at each point)::

    python -m taylorshift.distributed.bench --procs 2 4 --lengths 4096 16384 65536 \\
        --out benchmarks/seqpar_cpu/results.json

On GPUs, NCCL (one process per GPU; group sizes 1, ``--procs`` below the world size, and
the world)::

    torchrun --standalone --nproc-per-node=8 -m taylorshift.distributed.bench \\
        --lengths 65536 262144 1048576 --out results-nccl.json

Times are the median over ``--repeats`` calls of the slowest rank's time (ranks start each
call together, after a barrier): wall time, and the CPU time of the rank's process
(``time.process_time``, its own work: less disturbed by other load on a shared machine).
Forward runs under ``torch.no_grad``, forward + backward differentiates q, k and v.
Layout (B, H, N_r, d) per rank, dv = d, the balanced split of ``sequence_shard``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ..ops.taylor_shift.features import compute_dtype, feature_dim
from .sequence_parallel import sequence_parallel_taylor_shift, sequence_shard

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def state_elements(d: int, dv: int) -> int:
    """Elements of one (batch, head) state, D (dv + 1): the count is its corner entry."""
    return feature_dim(d) * (dv + 1)


def bytes_per_rank(
    n: int,
    d: int,
    dv: int,
    *,
    heads: int = 1,
    batch: int = 1,
    ranks: int,
    causal: bool,
    state_bytes: int = 4,
    kv_bytes: int = 2,
) -> dict[str, float]:
    """Bytes each rank sends for one attention layer, ours against ring attention.

    Ours: the state, B·H·D·(dv + 1) elements of ``state_bytes`` (float32 for 16-bit inputs);
    non-causal one all-reduce forward and one backward, each 2 (P − 1)/P of the buffer per
    rank (ring or reduce-scatter + all-gather algorithm); causal one all-gather each way,
    (P − 1) buffers per rank. Ring attention: each rank's K and V blocks, B·H·(N/P)·(d + dv)
    elements of ``kv_bytes``, travel P − 1 hops forward; backward K, V and their gradient
    accumulators dK, dV travel P − 1 hops (twice the forward; causal or not, as in
    zig-zag/striped ring attention, which keep every hop busy).
    """
    state = batch * heads * state_elements(d, dv) * state_bytes
    ours = (ranks - 1) * state if causal else 2 * (ranks - 1) / ranks * state
    ring = (ranks - 1) * batch * heads * (n / ranks) * (d + dv) * kv_bytes
    return {
        "ours_forward": ours,
        "ours_backward": ours,
        "ring_forward": ring,
        "ring_backward": 2 * ring,
    }


def crossover_tokens(
    d: int, dv: int, *, ranks: int, causal: bool, state_bytes: int = 4, kv_bytes: int = 2
) -> dict[str, float]:
    """Sequence length N (all ranks together) below which ring attention sends fewer bytes.

    Forward: non-causal N* = 2 D (dv + 1) s / ((d + dv) s_kv), whatever P (both sides grow
    as P − 1); causal N* = P D (dv + 1) s / ((d + dv) s_kv) (the all-gather sends P/2 times
    an all-reduce). Forward + backward: ring sends 3× its forward, ours 2×: N* · 2/3.
    """
    ours = bytes_per_rank(1, d, dv, ranks=ranks, causal=causal, state_bytes=state_bytes)
    ring_per_token = bytes_per_rank(1, d, dv, ranks=ranks, causal=causal, kv_bytes=kv_bytes)[
        "ring_forward"
    ]
    forward = ours["ours_forward"] / ring_per_token
    return {"forward": forward, "forward_backward": forward * 2 / 3}


def paper_table(
    head_dims=(16, 32, 64, 128),
    lengths=(4096, 65536, 1 << 20),
    ranks=(4, 8),
    *,
    state_bytes: int = 4,
    kv_bytes: int = 2,
) -> str:
    """Markdown: MiB each rank sends per layer and head (B = H = 1; multiply by B·H),
    forward + backward, ours against ring attention, and the crossovers N*."""
    lines = [
        "| d = dv | state per head | P | N | ours, non-causal (MiB) | ours, causal (MiB) "
        "| ring attention (MiB) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for d in head_dims:
        state_kib = state_elements(d, d) * state_bytes / 1024
        for p in ranks:
            for n in lengths:
                cells = []
                for causal in (False, True):
                    b = bytes_per_rank(n, d, d, ranks=p, causal=causal, state_bytes=state_bytes,
                                       kv_bytes=kv_bytes)  # fmt: skip
                    cells.append((b["ours_forward"] + b["ours_backward"]) / 2**20)
                ring = (b["ring_forward"] + b["ring_backward"]) / 2**20
                lines.append(
                    f"| {d} | {state_kib:,.1f} KiB | {p} | {n:,} | {cells[0]:,.3f} | "
                    f"{cells[1]:,.3f} | {ring:,.3f} |"
                )
    lines += [
        "",
        "Crossover N* (ring attention sends less below it), forward / forward + backward:",
        "",
        "| d = dv | non-causal, any P | causal, P = 2 | causal, P = 4 | causal, P = 8 |",
        "|---:|---:|---:|---:|---:|",
    ]
    for d in head_dims:
        cells = []
        for causal, p in ((False, 2), (True, 2), (True, 4), (True, 8)):
            c = crossover_tokens(
                d, d, ranks=p, causal=causal, state_bytes=state_bytes, kv_bytes=kv_bytes
            )
            cells.append(f"{c['forward']:,.0f} / {c['forward_backward']:,.0f}")
        lines.append(f"| {d} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def measured_table(rows: list[dict], clock: str = "wall") -> str:
    """Markdown: median ms by N and group size, speed-up against one process in brackets.

    ``clock``: ``"wall"`` (elapsed time of the slowest rank) or ``"cpu"`` (CPU time of the
    busiest rank's process: its own work, less disturbed by other load on the machine).
    """
    suffix = {"wall": "_s", "cpu": "_cpu_s"}[clock]
    sizes = sorted({r["ranks"] for r in rows})
    by = {(r["causal"], r["n"], r["ranks"]): r for r in rows}
    head = " | ".join(f"P = {p}" for p in sizes)
    lines = [
        f"| pass | causal | N | {head} | collective alone, P = {sizes[-1]} |",
        "|---|---|---:|" + "---:|" * len(sizes) + "---:|",
    ]
    for key, name in (("forward" + suffix, "fwd"), ("forward_backward" + suffix, "fwd+bwd")):
        for causal in sorted({r["causal"] for r in rows}):
            for n in sorted({r["n"] for r in rows}):
                base = by.get((causal, n, 1))
                cells = []
                for p in sizes:
                    r = by.get((causal, n, p))
                    if r is None:
                        cells.append("–")
                        continue
                    ms = f"{r[key] * 1e3:,.1f}"
                    if base is not None and p != 1:
                        ms += f" ({base[key] / r[key]:.2f}×)"
                    cells.append(ms)
                last = by.get((causal, n, sizes[-1]))
                collective = "–" if last is None else f"{last['collective_s'] * 1e3:.2f}"
                lines.append(
                    f"| {name} | {'yes' if causal else 'no'} | {n:,} | "
                    + " | ".join(cells)
                    + f" | {collective} |"
                )
    return "\n".join(lines)


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


def _sweep(args, device: torch.device) -> list[dict]:
    """Every point at every group size, the sizes back to back for each point, so that a
    change of load on a shared machine hits them alike. Group size p is ranks 0..p-1 (the
    others wait); p = 1 is the single-process form. Rank 0 returns the rows."""
    world, rank = dist.get_world_size(), dist.get_rank()
    sizes = sorted({1, world, *(p for p in args.procs if 1 < p < world)})
    # Every rank creates every group, in the same order; p = world is the default group.
    groups = {p: None if p == world else dist.new_group(list(range(p))) for p in sizes}
    dtype = DTYPES[args.dtype]
    rows = []
    for causal in args.causal:
        for n in args.lengths:
            for p in sizes:
                if rank < p:
                    times = measure(
                        n, args.batch, args.heads, args.head_dim, causal, args.repeats,
                        groups[p], dtype=dtype, device=device,
                    )  # fmt: skip
                    collective = measure_collective(
                        args.batch, args.heads, args.head_dim, causal, args.repeats,
                        groups[p], device, dtype,
                    )  # fmt: skip
                    row = {"ranks": p, "causal": causal, "n": n, **times}
                    state = args.batch * args.heads * state_elements(args.head_dim, args.head_dim)
                    state *= compute_dtype(dtype).itemsize  # the buffer of each collective
                    rows.append({**row, "collective_s": collective, "state_bytes": state})
                    if rank == 0:
                        print(_format_row(rows[-1]), flush=True)
                _barrier(None, device)
    return rows if rank == 0 else []


def _format_row(row: dict) -> str:
    kind = "causal" if row["causal"] else "non-causal"
    return (
        f"P={row['ranks']} {kind:>10} N={row['n']:>7}  fwd {row['forward_s'] * 1e3:9.2f} ms  "
        f"fwd+bwd {row['forward_backward_s'] * 1e3:9.2f} ms  "
        f"collective {row['collective_s'] * 1e3:7.3f} ms"
    )


def _spawned(rank: int, world: int, store: str, args, out: str) -> None:
    torch.set_num_threads(args.threads)
    dist.init_process_group(
        "gloo", store=dist.FileStore(store, world), rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=600),
    )  # fmt: skip
    try:
        rows = _sweep(args, torch.device("cpu"))
        if rank == 0:
            Path(out).write_text(json.dumps(rows))
    finally:
        dist.destroy_process_group()


def _machine(device: torch.device) -> dict:
    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "processor": _cpu_name(),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return info


def _load_average() -> float | None:
    """The 1-minute load average (the machine may be shared), or None where unknown."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _torchrun(args) -> list[dict]:
    """Under torchrun: NCCL on CUDA (gloo without), group sizes up to the world."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(args.threads)
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        return _sweep(args, device)
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m taylorshift.distributed.bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--procs",
        type=int,
        nargs="+",
        default=[2, 4],
        help="group sizes besides 1 (one spawn of the largest on the CPU; under torchrun, "
        "sizes below the world size, which is always measured)",
    )
    parser.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        default=[4096, 16384, 65536],
        help="sequence lengths (all ranks together)",
    )
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=16, help="d = dv")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads per process, the single-process baseline's included (CPU)",
    )
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    parser.add_argument(
        "--paper", action="store_true", help="print the bytes-per-layer table and exit"
    )
    args = parser.parse_args(argv)  # fmt: skip
    if args.paper:
        print(paper_table())
        return 0
    args.causal = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]

    started, load_start = time.time(), _load_average()
    launcher = [Path(sys.executable).name]
    if "WORLD_SIZE" in os.environ:
        launcher = ["torchrun", f"--nproc-per-node={os.environ.get('LOCAL_WORLD_SIZE', '?')}"]
    if "WORLD_SIZE" in os.environ:
        rows = _torchrun(args)
        if not rows:
            return 0
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        backend = "nccl" if device.type == "cuda" else "gloo"
    else:
        device, backend = torch.device("cpu"), "gloo"
        world = max(args.procs)
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "rows.json")
            torch.multiprocessing.start_processes(
                _spawned, args=(world, os.path.join(tmp, "store"), args, out), nprocs=world
            )
            rows = json.loads(Path(out).read_text())
    result = {
        "command": " ".join([*launcher, "-m", "taylorshift.distributed.bench",
                             *(argv if argv is not None else sys.argv[1:])]),
        "backend": backend,
        "machine": _machine(device),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "seconds": round(time.time() - started, 1),
        "load_average_start_end": [load_start, _load_average()],
        "rows": rows,
    }  # fmt: skip
    for clock in ("wall", "cpu"):
        print(f"\n{clock} time, ms (speed-up over P = 1):\n\n{measured_table(rows, clock)}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
