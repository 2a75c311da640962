"""``taylorshift bench calibrate``: measure where the efficient form overtakes the direct one.

For each dtype, causal or not, pass ("forward", or "forward+backward": the gradients of q, k
and v too) and head dim d, both forms of ``taylor_shift_attention`` are timed
(``measure.time_call``) on self-attention (B = 1, H heads, N tokens, dv = d) over a grid of
N around the op-count crossover, walking up the grid and stopping once the efficient form has
won twice in a row;
``crossover.find_crossover`` interpolates the crossover N̂. The results go into
``calibration.json`` in the cache directory (see ``taylorshift.ops.taylor_shift.calibration``),
keyed by the device (CPU model or GPU name, torch and CUDA versions), and ``mode="auto"``
uses them from then on. docs/calibration.md explains the rule.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch

from ..cliargs import format_table, positive_float, positive_int
from ..ops.taylor_shift import calibration, dispatch
from ..ops.taylor_shift.efficient_causal import DEFAULT_CAUSAL_CHUNK
from ..ops.taylor_shift.interface import taylor_shift_attention
from ..theory import impl_crossover
from ..vocab import FORWARD, FORWARD_BACKWARD, PASSES, pass_name
from . import files, machine
from .core import OK, dtype_option, dtypes, parse_device, pass_option
from .crossover import Crossover, find_crossover
from .measure import time_call

HELP = "measure the direct/efficient crossover on this device and store it for mode='auto'"

DTYPES = dtypes("float32", "float16", "bfloat16", "float64")
DEFAULT_D = {"cpu": (16, 32, 64), "cuda": (16, 32, 64, 128)}
QUICK_D = (8, 16)
DEFAULT_DTYPES = {"cpu": ("float32",), "cuda": ("float32", "bfloat16", "float16")}
CAUSAL = {"no": (False,), "yes": (True,), "both": (False, True)}
PASS_CHOICES = {FORWARD: (FORWARD,), FORWARD_BACKWARD: (FORWARD_BACKWARD,), "both": PASSES}
# Grid: the op-count crossover times 2**k; quick uses fewer points and shorter timings.
GRID_STEPS = range(-3, 4)
QUICK_GRID_STEPS = range(-2, 3)
MIN_N = 8
CONFIRM = 2  # efficient wins in a row that end the walk up the grid
EXTEND = 4  # doublings of N past the default grid while the crossover is not confirmed
# Share of the device's memory a direct-form point may plan to use (its N x N blocks).
MEMORY_SHARE = 0.25


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device", default="cpu", help="device to calibrate: cpu, cuda, cuda:1 (default: cpu)"
    )
    parser.add_argument(
        "--dtype",
        nargs="+",
        type=dtype_option,
        choices=sorted(DTYPES),
        metavar="DTYPE",
        help="dtypes, of " + ", ".join(sorted(DTYPES)) + " (fp32, bf16, fp16, fp64 also "
        "accepted; default: float32 on the CPU; float32 bfloat16 float16 on CUDA)",
    )
    parser.add_argument(
        "--d",
        nargs="+",
        type=positive_int,
        metavar="D",
        help="head dims (default: 16 32 64 on the CPU, 16 32 64 128 on CUDA; --quick: 8 16)",
    )
    parser.add_argument(
        "--n",
        nargs="+",
        type=positive_int,
        metavar="N",
        help="sequence lengths to time, for every d (default: the op-count crossover of each d "
        "times 1/8 .. 8 in factors of 2; --quick: 1/4 .. 4)",
    )
    parser.add_argument(
        "--causal",
        choices=sorted(CAUSAL),
        default="both",
        help="calibrate the non-causal form, the causal one or both (default: both)",
    )
    parser.add_argument(
        "--pass",
        dest="passes",
        type=pass_option,
        choices=sorted(PASS_CHOICES),
        default="both",
        help="forward, forward+backward (the gradients of q, k, v too) or both (default: "
        "both; the old names train, fwd and fwd+bwd are accepted)",
    )
    parser.add_argument(
        "--heads",
        type=positive_int,
        help="heads per call, batch 1 (default: 8; --quick: 2)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer head dims and grid points, short timings: a rough calibration in a minute",
    )
    parser.add_argument(
        "--budget-s",
        type=positive_float,
        help="seconds for the whole measurement, shared out over the (dtype, causal, pass, d) "
        "cases; a case out of time keeps what it measured (default: 1200; --quick: 60)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        help="where calibration.json lives (default: $TAYLORSHIFT_CACHE_DIR, else "
        "$XDG_CACHE_HOME/taylorshift, else ~/.cache/taylorshift)",
    )
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--show", action="store_true", help="print the stored calibration")
    action.add_argument("--clear", action="store_true", help="delete the stored calibration")


# Reading and writing the file.


def empty_calibration() -> dict:
    return {
        "format": calibration.CALIBRATION_FORMAT,
        "version": calibration.CALIBRATION_VERSION,
        "devices": {},
    }


def read_file(path: Path) -> tuple[dict | None, str]:
    """(contents, "") for a usable file; (None, why) when missing, corrupt or foreign."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        return None, "missing"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        return None, f"unreadable ({type(err).__name__}: {err})"
    try:
        parsed = calibration.parse_calibration(data, str(path))
    except calibration.CalibrationError as err:
        return None, f"not a calibration ({err})"
    if parsed is None:
        version = calibration.CALIBRATION_VERSION
        return None, f"format version {data.get('version')!r}, not {version}"
    for device in data["devices"].values():  # a file written before: its entries renamed
        device["entries"] = calibration.upgrade_entries(device["entries"])
    return data, ""


def merge_entries(data: dict, key: str, device_record: dict, entries: dict) -> dict:
    """The file's contents with ``entries`` of device ``key`` added (replacing equal keys)."""
    device = data["devices"].setdefault(key, {"entries": {}})
    device.update({k: v for k, v in device_record.items() if k != "entries"})
    device["entries"].update(entries)
    return data


# Measuring.


def make_call(form: str, n: int, d: int, heads: int, dtype, device, causal: bool, passes: str):
    """A zero-argument callable running one form on (1, heads, n, d) self-attention."""
    passes = pass_name(passes)
    g = torch.Generator().manual_seed(n * 1009 + d)
    q, k, v = (
        torch.randn(1, heads, n, d, generator=g).to(device=device, dtype=dtype) for _ in range(3)
    )
    if passes == FORWARD:

        def forward():
            with torch.no_grad():
                return taylor_shift_attention(q, k, v, is_causal=causal, mode=form)

        return forward
    for t in (q, k, v):
        t.requires_grad_(True)
    grad = torch.randn(1, heads, n, d, generator=g).to(device=device, dtype=dtype)

    def forward_backward():
        out = taylor_shift_attention(q, k, v, is_causal=causal, mode=form)
        return torch.autograd.grad(out, (q, k, v), grad)

    return forward_backward


def direct_bytes(n: int, d: int, heads: int, causal: bool) -> int:
    """The direct form's extra memory for one call of N tokens, float32, as ``auto`` counts it
    (``dispatch.working_set_bytes``: its blocks of scores, the weights kept for the backward
    of small calls; the CPU kernel needs less), plus q, k, v, the output and their
    gradients."""
    extra = dispatch.working_set_bytes("direct", n, n, d, d, causal, heads, 4)
    return extra + 8 * heads * n * d * 4


def memory_limit(device: torch.device) -> int:
    return int(MEMORY_SHARE * (machine.memory_bytes(device) or 8 << 30))


def default_grid(d: int, causal: bool, quick: bool) -> list[int]:
    n_theory = impl_crossover(d, d, causal, DEFAULT_CAUSAL_CHUNK)
    steps = QUICK_GRID_STEPS if quick else GRID_STEPS
    return sorted({max(MIN_N, round(n_theory * 2.0**k)) for k in steps})


def measure_case(
    *,
    d: int,
    grid: list[int],
    heads: int,
    dtype_name: str,
    device: torch.device,
    causal: bool,
    passes: str,
    deadline: float,
    target_s: float,
    extend: int = 0,
    log=None,
) -> dict:
    """Time both forms along ``grid`` (ascending) until the efficient one has won CONFIRM times
    in a row, the grid ends or ``deadline`` (perf_counter) passes; the entry to store.

    ``extend``: how many doublings of N past the grid's end to try when the crossover is not
    confirmed there (the memory limit on the direct form ends the walk too).
    """
    dtype = DTYPES[dtype_name]
    points, wins, stopped = [], 0, "grid end"
    limit = memory_limit(device)
    todo = list(grid)
    while todo:
        n = todo.pop(0)
        if time.perf_counter() > deadline:
            stopped = "budget"
            break
        point: dict = {"n": n}
        for form in ("efficient", "direct"):
            if form == "direct" and direct_bytes(n, d, heads, causal) > limit:
                point[f"{form}_status"], point[f"{form}_s"] = "skipped: memory", None
                continue
            fn = make_call(form, n, d, heads, dtype, device, causal, passes)
            result = time_call(fn, device=device, target_s=target_s, max_reps=30, warmup_s=0.05)
            point[f"{form}_status"] = result.status
            point[f"{form}_s"] = result.median_s if result.status == OK else None
            point[f"{form}_iqr_s"] = [result.q1_s, result.q3_s] if result.status == OK else None
            del fn
        points.append(point)
        eff, direct = point["efficient_s"], point["direct_s"]
        if log is not None:
            log(f"  N={n}: efficient {_fmt_s(eff)}, direct {_fmt_s(direct)}")
        # A direct point that could not run (memory) counts as a win for the efficient form.
        won = eff is not None and (direct is None or eff < direct)
        wins = wins + 1 if won else 0
        if wins >= CONFIRM:
            stopped = "confirmed"
            break
        if not todo and extend > 0 and direct is not None:
            todo.append(2 * n)  # not confirmed yet: walk on past the grid
            extend -= 1
    crossover = find_crossover(
        {p["n"]: p["efficient_s"] for p in points}, {p["n"]: p["direct_s"] for p in points}
    )
    return {
        "dtype": dtype_name,
        "causal": causal,
        "pass": passes,
        "d": d,
        "dv": d,
        "batch": 1,
        "heads": heads,
        "crossover": crossover.to_dict(),
        "theory_n": impl_crossover(d, d, causal, DEFAULT_CAUSAL_CHUNK),
        "grid": grid,
        "stopped": stopped,
        "points": points,
        "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _fmt_s(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.3g} ms"


# Output.


def _measured_text(entry: dict) -> str:
    return Crossover.from_dict(entry["crossover"]).describe()


def summary_rows(entries: list[dict]) -> list[list[str]]:
    rows = []
    for e in entries:
        # (what the op reads is checked; the rest a hand-made file may lack)
        theory = e.get("theory_n") or impl_crossover(
            e["d"], e["dv"], e["causal"], DEFAULT_CAUSAL_CHUNK
        )
        found = e["crossover"]
        ratio = f"{found['n'] / theory:.2f}" if found["status"] == "crossed" else ""
        rows.append(
            [
                e["dtype"],
                "causal" if e["causal"] else "full",
                e["pass"],
                str(e["d"]),
                _measured_text(e),
                f"{theory:.0f}",
                ratio,
                str(len(e.get("points", ()))),
                e.get("stopped", ""),
                e.get("measured_at", "")[:10],
            ]
        )
    return rows


SUMMARY_HEADERS = (
    "dtype",
    "mask",
    "pass",
    "d",
    "N̂ measured",
    "N̂ theory",
    "ratio",
    "points",
    "stopped",
    "date",
)


def _sorted_entries(entries) -> list[dict]:
    return sorted(entries, key=lambda e: (e["dtype"], e["causal"], e["pass"], e["d"]))


def show(path: Path) -> int:
    data, why = read_file(path)
    if data is None:
        if why == "missing":
            print(f"No calibration at {path}; mode='auto' uses the operation counts.")
            return 0
        print(f"The calibration at {path} is unusable: {why}.", file=sys.stderr)
        return 1
    print(f"Calibration at {path}")
    for key, device in data["devices"].items():
        print()
        print(key)
        print(
            format_table(SUMMARY_HEADERS, summary_rows(_sorted_entries(device["entries"].values())))
        )
    return 0


def clear(path: Path) -> int:
    try:
        path.unlink()
    except FileNotFoundError:
        print(f"No calibration at {path}.")
        return 0
    except OSError as err:  # (a folder of that name, no permission)
        print(
            f"error: cannot remove the calibration {path}: {err.strerror or err}", file=sys.stderr
        )
        return 1
    calibration.reload_calibration()
    print(f"Removed {path}.")
    return 0


def _parse_device(text: str, parser: argparse.ArgumentParser) -> torch.device:
    device = parse_device(text, parser)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())  # the key names one GPU
    return device


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    path = calibration.calibration_path(args.cache_dir)
    if args.clear:
        return clear(path)
    if args.show:
        return show(path)
    device = _parse_device(args.device, parser)
    dtypes = args.dtype or list(DEFAULT_DTYPES[device.type])
    if device.type == "cpu" and "float16" in dtypes:
        print("note: float16 on the CPU is emulated and slow; its calibration is its own.")
    ds = args.d or list(QUICK_D if args.quick else DEFAULT_D[device.type])
    heads = args.heads or (2 if args.quick else 8)
    budget = args.budget_s or (60.0 if args.quick else 1200.0)
    target_s = 0.03 if args.quick else 0.25
    cases = [
        (dtype, causal, passes, d)
        for dtype in dtypes
        for causal in CAUSAL[args.causal]
        for passes in PASS_CHOICES[args.passes]
        for d in sorted(set(ds))
    ]
    key = calibration.device_key(device)
    print(f"Calibrating {key}: {len(cases)} cases, budget {budget:g} s, {heads} heads")
    start = time.perf_counter()
    entries = {}
    for i, (dtype, causal, passes, d) in enumerate(cases):
        now = time.perf_counter()
        share = (start + budget - now) / (len(cases) - i)
        grid = sorted(set(args.n)) if args.n else default_grid(d, causal, args.quick)
        print(f"{dtype} {'causal' if causal else 'full'} {passes} d={d}: N in {grid}")
        entry = measure_case(
            d=d,
            grid=grid,
            heads=heads,
            dtype_name=dtype,
            device=device,
            causal=causal,
            passes=passes,
            deadline=now + max(share, 0.0),
            target_s=target_s,
            extend=0 if args.n else EXTEND,
            log=print,
        )
        print(f"  crossover {_measured_text(entry)} (theory {entry['theory_n']:.0f})")
        entries[calibration.entry_key(dtype, causal, passes, d)] = entry
    data, why = read_file(path)
    if data is None:
        if why != "missing":
            print(f"note: replacing the unusable calibration at {path} ({why})")
        data = empty_calibration()
    info = machine.machine_info(device)
    data["taylorshift"] = info["taylorshift"]
    data["command"] = machine.command_line()
    merge_entries(data, key, {"device": device.type, "machine": info}, entries)
    files.write_json(path, data)
    calibration.reload_calibration()
    print()
    print(f"Stored in {path} ({time.perf_counter() - start:.0f} s)")
    print(format_table(SUMMARY_HEADERS, summary_rows(_sorted_entries(entries.values()))))
    return 0
