"""Run a function on P processes joined in a gloo group on the CPU, collect what each returns.

One spawn per world size runs many cases (starting processes costs seconds, a case
milliseconds); the processes are forked from a server that has imported torch
(``tests.helpers.forkserver``), which saves each its import. Each process writes its result
(JSON) to a file; the parent waits with a deadline, ends the processes it started if they
overrun, and returns the results by rank.
"""

from __future__ import annotations

import datetime
import importlib
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..helpers import forkserver

# A collective that waits longer than this raises (a rank that failed leaves the others
# waiting): a bug shows as an error in seconds, not as a hung test.
COLLECTIVE_TIMEOUT_S = 30
DEADLINE_S = 180

_empty = torch.empty


def _poisoned_empty(*args, **kwargs):
    """torch.empty filled with NaN, so code that reads memory it never wrote fails."""
    t = _empty(*args, **kwargs)
    if t.is_floating_point():
        t.fill_(float("nan"))
    return t


def _entry(rank: int, world_size: int, store_path: str, out_dir: str, target: str) -> None:
    torch.set_num_threads(1)
    torch.empty = _poisoned_empty
    dist.init_process_group(
        "gloo",
        store=dist.FileStore(store_path, world_size),
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    )
    try:
        module, name = target.split(":")
        result = getattr(importlib.import_module(module), name)(rank, world_size)
        path = Path(out_dir) / f"rank{rank}.json"
        path.with_suffix(".tmp").write_text(json.dumps(result))
        path.with_suffix(".tmp").rename(path)
    finally:
        dist.destroy_process_group()
    # Done and reported: leave without the interpreter's teardown. Gloo's threads can
    # outlive the group by a moment, and a C++ thread destroyed while still joinable aborts
    # the process (SIGABRT, "terminate called without an active exception": seen once on
    # CI after every case had run), which would fail a run whose results are all in.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_spawned(target: str, world_size: int, workdir: Path) -> list:
    """``module:function`` called as ``function(rank, world_size)`` on each of
    ``world_size`` processes; returns the JSON-able results, by rank."""
    workdir.mkdir(parents=True, exist_ok=True)
    args = (world_size, str(workdir / "store"), str(workdir), target)
    forkserver()  # its preload: the processes start with torch imported
    context = mp.start_processes(
        _entry, args=args, nprocs=world_size, join=False, start_method="forkserver"
    )
    deadline = time.monotonic() + DEADLINE_S
    try:
        while not context.join(timeout=max(0.0, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"{world_size} processes running {target} overran {DEADLINE_S} s"
                )
    except mp.ProcessExitedException as e:
        written = [r for r in range(world_size) if (workdir / f"rank{r}.json").exists()]
        raise RuntimeError(
            f"{e} while running {target}; ranks that had written their results: {written}"
        ) from e
    finally:
        for process in context.processes:
            if process.is_alive():
                process.terminate()
                process.join(5)
    return [json.loads((workdir / f"rank{r}.json").read_text()) for r in range(world_size)]
