"""``taylorshift bench`` on the command line: the sweep's options, ``--report-only``, the
progress bar and the summary."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ...cliargs import non_negative_float, positive_float, positive_int
from ...vocab import PASSES
from .. import files
from ..core import (
    GIB,
    INSTALL_HINT,
    dtype_option,
    missing_modules,
    parse_device,
    pass_option,
)
from ..load import NOISY_SHARE
from .analysis import analyse, theory_rows
from .cases import DTYPES, IMPLEMENTATIONS
from .report import summary, write_outputs
from .sweep import (
    DEFAULT_D,
    DEFAULT_MEMORY_D,
    FULL_MEMORY_N,
    FULL_N,
    FULL_N_CUDA,
    MEMORY_CALL_FACTOR,
    QUICK,
    QUICK_MEMORY_N,
    QUICK_N,
    SCHEMA,
    Settings,
    count_points,
    default_memory_limit,
    run_sweep,
    upgrade_results,
)

__all__ = ["HELP", "add_arguments", "run", "settings_from_args"]

HELP = (
    "time and peak memory of attention implementations vs sequence length, and where "
    "efficient TaylorShift starts to win (the op sweep)"
)


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
    "quiet_before_s",
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
        help=f"implementations: {', '.join(IMPLEMENTATIONS)} (default: all that run on the "
        "device, except the compiled ones, which take seconds to compile per point)",
    )
    add(
        "--pass",
        dest="passes",
        nargs="+",
        type=pass_option,
        choices=PASSES,
        help="forward, forward+backward (forward and gradients of q, k, v) (default: both; "
        "the old names fwd and fwd+bwd are accepted)",
    )
    add(
        "--dtype",
        nargs="+",
        type=dtype_option,
        choices=tuple(DTYPES),
        help="dtypes (default: bfloat16 on CUDA, float32 on the CPU; fp32, bf16, fp16 are "
        "accepted too)",
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
        type=pass_option,
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
    add(
        "--quiet-before-s",
        type=non_negative_float,
        metavar="S",
        help="CPU: before each time point wait up to S seconds for other processes to calm "
        "down, within --quiet-wait-s (default: 0, no wait)",
    )
    add(
        "--remeasure-noisy",
        action="store_true",
        help="CPU: after the time sweep, time each point still timed under load once more "
        "(after waiting for quiet, within --quiet-wait-s) and keep the quieter",
    )
    add("--threads", type=positive_int, help="torch CPU threads (default: torch's own)")
    add("--seed", type=int, help="seed of the random inputs (default: 0)")
    files.add_output_options(parser, None)
    add(
        "--report-only",
        type=Path,
        metavar="DIR",
        help="only rewrite report.md, results.csv and the plots from DIR/results.json",
    )


def settings_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Settings:
    """The sweep's settings; bad values go through ``parser.error`` (exit status 2)."""
    device = parse_device(args.device, parser)
    if args.impl is None:
        impls = tuple(n for n, i in IMPLEMENTATIONS.items() if i.is_default_on(device.type))
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
                f"implementation for --device {device}"
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
            dict.fromkeys(args.dtype or ("bfloat16" if device.type == "cuda" else "float32",))
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
        else default_memory_limit(str(device)),
        "threads": args.threads,
        "remeasure_noisy": args.remeasure_noisy,
    }
    for name in ("max_call_s", "budget_s", "target_s", "quiet_wait_s", "quiet_before_s", "seed"):
        if getattr(args, name) is not None:
            given[name] = getattr(args, name)
    return dataclasses.replace(base, **given)


def _report_only(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    given = [name for name in SWEEP_OPTIONS if getattr(args, name) is not None]
    given += [name for name in ("quick", "no_memory", "remeasure_noisy") if getattr(args, name)]
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
        upgrade_results(results)  # results.json written before: fwd, fp32, ...
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
    missing = missing_modules(
        *(["tqdm"] if args.report_only is None else []),
        *([] if args.no_plots else ["matplotlib.figure"]),
    )
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
    out = files.fresh_folder(args.out or "bench-results", args.overwrite, parser)
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
