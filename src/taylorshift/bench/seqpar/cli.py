"""``taylorshift bench seqpar`` on the command line: bytes on paper (``--paper``) or times
measured in a process group, printed as tables and written as JSON (``--out``)."""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ...cliargs import positive_int
from .. import files, machine
from ..core import dtype_option
from .measure import DTYPES, Settings, run_spawned, run_torchrun
from .report import measured_table, paper_table

__all__ = ["HELP", "add_arguments", "run"]

HELP = (
    "sequence-parallel TaylorShift: bytes per layer against ring attention (--paper), and "
    "times over 1..P processes (gloo on the CPU, NCCL under torchrun)"
)
CAUSAL = {"both": (False, True), "yes": (True,), "no": (False,)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add(
        "--procs",
        type=positive_int,
        nargs="+",
        default=[2, 4],
        help="group sizes besides 1 (one spawn of the largest on the CPU; under torchrun, "
        "sizes below the world size, which is always measured) (default: 2 4)",
    )
    add(
        "--lengths",
        type=positive_int,
        nargs="+",
        default=[4096, 16384, 65536],
        help="sequence lengths, all ranks together (default: 4096 16384 65536)",
    )
    add("--batch", type=positive_int, default=1, help="batch B (default: 1)")
    add("--heads", type=positive_int, default=4, help="heads H (default: 4)")
    add("--head-dim", type=positive_int, default=16, help="d = dv (default: 16)")
    add("--dtype", type=dtype_option, choices=sorted(DTYPES), default="float32")
    add("--causal", choices=sorted(CAUSAL), default="both", help="(default: both)")
    add("--repeats", type=positive_int, default=5, help="timed calls per point (default: 5)")
    add(
        "--threads",
        type=positive_int,
        default=1,
        help="torch threads per process, the single-process baseline's included (CPU; default: 1)",
    )
    add("--out", type=Path, default=None, help="write the results as JSON to this file")
    add("--paper", action="store_true", help="print the bytes-per-layer table and exit")


def settings_from_args(args: argparse.Namespace) -> Settings:
    return Settings(
        procs=tuple(args.procs),
        lengths=tuple(args.lengths),
        batch=args.batch,
        heads=args.heads,
        head_dim=args.head_dim,
        dtype=args.dtype,
        causal=CAUSAL[args.causal],
        repeats=args.repeats,
        threads=args.threads,
    )


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``taylorshift bench seqpar``: the paper table, or measure and print the tables."""
    if args.paper:
        print(paper_table())
        return 0
    settings = settings_from_args(args)
    started, load_start = time.time(), machine.load_average()
    command = machine.command_line()
    if "WORLD_SIZE" in os.environ:  # under torchrun: every rank measures, rank 0 reports
        command = (
            f"torchrun --nproc-per-node={os.environ.get('LOCAL_WORLD_SIZE', '?')} -m {command}"
        )
        rows = run_torchrun(settings)
        if not rows:
            return 0
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        rows = run_spawned(settings)
        device = torch.device("cpu")
    result = {
        "command": command,
        "backend": "nccl" if device.type == "cuda" else "gloo",
        "machine": machine.machine_info(device),
        "settings": asdict(settings),
        "seconds": round(time.time() - started, 1),
        "load_average_start_end": [load_start, machine.load_average()],
        "rows": rows,
    }
    for clock in ("wall", "cpu"):
        print(f"\n{clock} time, ms (speed-up over P = 1):\n\n{measured_table(rows, clock)}")
    if args.out:
        files.write_json(args.out, result)
    return 0
