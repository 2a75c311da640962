"""``taylorshift bench models`` on the command line: the options, the plan of rows (models
× kernels × modes × projections, and the head-count sweep), and the run."""

from __future__ import annotations

import argparse
import difflib
import json
import math
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from ...cliargs import positive_float, positive_int
from .. import files, machine
from ..core import INSTALL_HINT, dtype_option, missing_modules, parse_device
from ..runner import Budget
from .cases import DTYPES, MODEL_KERNEL, MODES, Case, Settings
from .pareto import load_accuracy, pareto_table
from .report import summary, write_outputs
from .sweep import measure_case, measure_memory_points

__all__ = ["HELP", "add_arguments", "plan", "run"]

HELP = (
    "efficiency of whole models (parameters, FLOPs, throughput, training time and memory, "
    "inference memory) per kernel and projection, a head-count sweep, Pareto fronts"
)


FULL_DEFAULTS: dict[str, Any] = {
    "models": ["cifar-pixel", "imdb-byte", "listops"],
    "kernels": ["taylorshift", "softmax", "linear"],
    "mode": ["direct", "efficient"],
    "projections": ["standard"],
    "heads_model": "cifar-pixel",
    "max_batch": 1024,
    "train_batch": 16,
    "target_s": 0.5,
    "budget_s": 3600.0,
    "memory_jobs": 1,
    "set": {},
    "seq_len": None,
}
QUICK_DEFAULTS: dict[str, Any] = {
    "models": ["cifar-pixel-small", "listops-small"],
    "kernels": ["taylorshift", "softmax"],
    "mode": ["efficient"],
    "projections": ["standard"],
    "heads_model": "cifar-pixel-small",
    "heads_sweep": [2, 8],
    "max_batch": 8,
    "train_batch": 2,
    "target_s": 0.01,
    "budget_s": 50.0,
    "memory_jobs": 2,
    "set": {"dim": 32, "depth": 1},
    "seq_len": 64,
}
HEADS_GPU = [4, 8, 16, 32, 64]
HEADS_CPU = [4, 8, 16]


def _setting(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected FIELD=VALUE (e.g. dim=64), got {text!r}")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw  # a bare string, e.g. pooling=mean
    return key.strip(), value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ...nn import PROJECTIONS, list_kernels

    kernels = [*list_kernels(), MODEL_KERNEL]
    add = parser.add_argument
    add(
        "--models",
        nargs="+",
        metavar="NAME",
        help="registry models (taylorshift.models.list_models()); default: "
        f"{' '.join(FULL_DEFAULTS['models'])} (--quick: {' '.join(QUICK_DEFAULTS['models'])})",
    )
    add(
        "--kernels",
        nargs="+",
        choices=kernels,
        metavar="KERNEL",
        help=f"attention kernels to put in every model, of {kernels} ('model': the model's own); "
        f"default: {' '.join(FULL_DEFAULTS['kernels'])}",
    )
    add(
        "--mode",
        nargs="+",
        choices=MODES,
        metavar="MODE",
        help="TaylorShift form(s) of the taylorshift kernel: direct, efficient, auto; "
        "default: direct efficient (--quick: efficient)",
    )
    add(
        "--projections",
        nargs="+",
        choices=PROJECTIONS,
        metavar="PROJ",
        help=f"projection variants, of {list(PROJECTIONS)} (super's context length is set "
        "to the sequence length); default: standard",
    )
    add(
        "--seq-len",
        type=positive_int,
        metavar="N",
        help="input length: tokens of sequence models (default: the preset's max_len); "
        "patches of ViTs (a square k², the image becomes k·patch pixels)",
    )
    add(
        "--set",
        type=_setting,
        action="append",
        metavar="FIELD=VALUE",
        dest="set",
        help="config override for every model, JSON value (repeatable), e.g. --set dim=128",
    )
    add(
        "--heads-sweep",
        type=positive_int,
        nargs="*",
        metavar="H",
        help="head counts at fixed width for --heads-model (the paper's Table 5), each dividing "
        "its dim; the taylorshift kernel in each --mode. Default 4 8 16 32 64 on CUDA, "
        "4 8 16 on the CPU, 2 8 with --quick; the flag with no value skips the sweep",
    )
    add(
        "--heads-model",
        metavar="NAME",
        help="model of the heads sweep (default: cifar-pixel; --quick: cifar-pixel-small)",
    )
    add("--device", help="torch device (default: cuda if available, else cpu)")
    add(
        "--dtype",
        type=dtype_option,
        choices=list(DTYPES),
        default="float32",
        help="parameter and compute dtype (default: %(default)s; fp32, bf16, fp16 accepted)",
    )
    add(
        "--max-batch",
        type=positive_int,
        metavar="B",
        help="largest batch of the throughput sweep (default: 1024; --quick: 8)",
    )
    add(
        "--max-memory-gib",
        type=positive_float,
        metavar="GIB",
        help="stop a throughput sweep before a batch predicted (from the last batch's peak) "
        "to need more extra memory (default: half the RAM on the CPU, 90%% of the GPU)",
    )
    add(
        "--train-batch",
        type=positive_int,
        metavar="B",
        help="batch of the training step time and memory (default: 16; --quick: 2)",
    )
    add(
        "--target-s",
        type=positive_float,
        metavar="S",
        help="time per measured point: repetitions x call time (default: 0.5; --quick: 0.01)",
    )
    add(
        "--budget-s",
        type=positive_float,
        metavar="S",
        help="wall-clock budget of the run; what is left unmeasured gets the status "
        "'over budget' (default: 3600; --quick: 50)",
    )
    add(
        "--no-memory",
        action="store_true",
        help="skip the peak-memory points (on the CPU each runs in a process of its own)",
    )
    add(
        "--threads",
        type=positive_int,
        metavar="T",
        help="CPU threads of torch for the timed calls and memory workers (default: torch's, "
        f"{torch.get_num_threads()} here)",
    )
    add(
        "--memory-jobs",
        type=positive_int,
        metavar="J",
        help="CPU memory points measured side by side, each in its own process, after all "
        "timing (default: 1; --quick: 2)",
    )
    add(
        "--accuracy",
        metavar="FILE",
        help="accuracy in %% by row name (JSON object or CSV with name,accuracy): adds "
        "Pareto fronts and plots",
    )
    add(
        "--quick",
        action="store_true",
        help="tiny sizes and few models: a smoke run of well under a minute on a CPU",
    )
    files.add_output_options(parser, "bench-models")


def _resolve(args: argparse.Namespace, key: str) -> Any:
    value = getattr(args, key)
    if value is not None:
        return value
    return (QUICK_DEFAULTS if args.quick else FULL_DEFAULTS)[key]


def _base_config(name: str, overrides: dict, flag: str, parser: argparse.ArgumentParser):
    from ...models import create_model

    try:
        return create_model(name, device="meta", **overrides).config
    except (TypeError, ValueError) as err:
        parser.error(f"{flag}: model {name!r} does not accept these settings: {err}")


def _cases_for(
    model: str,
    kernels: Sequence[str],
    modes: Sequence[str],
    projections: Sequence[str],
    seq_len: int | None,
    settings: dict,
    parser: argparse.ArgumentParser,
    *,
    heads: int | None = None,
    group: str = "models",
) -> list[Case]:
    """The rows of one model: kernels × modes (taylorshift only) × projections."""
    base_overrides = dict(settings)
    if heads is not None:
        base_overrides["num_heads"] = heads
    cfg = _base_config(model, base_overrides, "--set", parser)
    if hasattr(cfg, "img_size"):  # ViT
        if seq_len is not None:
            side = math.isqrt(seq_len)
            if side * side != seq_len:
                parser.error(
                    f"--seq-len for the ViT {model!r} counts patches: expected a square "
                    f"number k² (the image becomes k·{cfg.patch_size} pixels); got {seq_len}"
                )
            base_overrides["img_size"] = side * cfg.patch_size
            length = seq_len
        else:
            length = cfg.num_patches
    else:
        length = seq_len if seq_len is not None else cfg.max_len
        if length is None:
            parser.error(f"--seq-len: model {model!r} has no max_len; expected a length")
        if cfg.pos_embedding == "learned" and (cfg.max_len or 0) < length:
            base_overrides["max_len"] = length
    tokens = length + (1 if cfg.pooling == "cls" else 0)
    cases = []
    for kernel_choice in kernels:
        kernel = cfg.attn_kernel if kernel_choice == MODEL_KERNEL else kernel_choice
        kernel_modes: Sequence[str | None] = modes if kernel == "taylorshift" else [None]
        for mode in kernel_modes:
            for projection in projections:
                overrides = dict(base_overrides)
                overrides["attn_kernel"] = kernel
                kernel_args = dict(cfg.kernel_args) if kernel == cfg.attn_kernel else {}
                if mode is not None:
                    kernel_args["mode"] = mode
                overrides["kernel_args"] = kernel_args
                overrides["projection"] = projection
                overrides["context_len"] = tokens if projection == "super" else None
                label = kernel if mode is None else f"{kernel}-{mode}"
                name = f"{model}/{label}/{projection}"
                if heads is not None:
                    name += f"/h{heads}"
                _base_config(model, overrides, "--set", parser)  # validate early
                cases.append(
                    Case(
                        name=name,
                        model=model,
                        kernel=kernel,
                        mode=mode,
                        projection=projection,
                        seq_len=length,
                        tokens=tokens,
                        overrides=overrides,
                        group=group,
                    )
                )
    return cases


def _check_model(name: str, flag: str, parser: argparse.ArgumentParser) -> None:
    from ...models import list_models

    known = list_models()
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        parser.error(
            f"{flag}: expected a registry model (taylorshift.models.list_models(): "
            f"{', '.join(known)}); got {name!r}{hint}"
        )


def plan(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[list[Case], dict]:
    """The cases to measure and the resolved configuration; bad values -> parser.error."""
    device = parse_device(args.device, parser)
    models = _resolve(args, "models")
    for name in models:
        _check_model(name, "--models", parser)
    kernels = _resolve(args, "kernels")
    modes = _resolve(args, "mode")
    projections = _resolve(args, "projections")
    seq_len = _resolve(args, "seq_len")
    settings = dict(QUICK_DEFAULTS["set"]) if args.quick else {}
    settings.update(dict(args.set or []))
    for key in ("attn_kernel", "kernel_args", "projection", "context_len"):
        if key in settings:
            parser.error(
                f"--set {key}: expected a size or model setting; choose kernels, modes and "
                "projections with --kernels, --mode and --projections"
            )
    cases: list[Case] = []
    for name in models:
        cases += _cases_for(name, kernels, modes, projections, seq_len, settings, parser)
    if args.heads_sweep is not None:
        heads = args.heads_sweep
    elif args.quick:
        heads = QUICK_DEFAULTS["heads_sweep"]
    else:
        heads = HEADS_GPU if device.type == "cuda" else HEADS_CPU
    heads_model = _resolve(args, "heads_model")
    if heads:
        _check_model(heads_model, "--heads-model", parser)
        dim = _base_config(heads_model, settings, "--set", parser).dim
        bad = [h for h in heads if dim % h]
        if bad:
            parser.error(
                f"--heads-sweep: expected head counts dividing {heads_model}'s dim {dim}; got "
                f"{', '.join(map(str, bad))}"
            )
        for h in heads:
            cases += _cases_for(
                heads_model,
                ["taylorshift"],
                modes,
                ["standard"],
                seq_len,
                settings,
                parser,
                heads=h,
                group="heads",
            )
    unique: dict[str, Case] = {}
    for case in cases:  # e.g. --kernels taylorshift model on a taylorshift preset
        unique.setdefault(case.name, case)
    cases = list(unique.values())
    accuracy = None
    if args.accuracy is not None:
        try:
            accuracy = load_accuracy(args.accuracy)
        except ValueError as err:
            parser.error(f"--accuracy: expected a JSON object or CSV of accuracies; {err}")
    config = {
        "device": str(device),
        "dtype": args.dtype,
        "quick": args.quick,
        "models": models,
        "kernels": kernels,
        "modes": modes,
        "projections": projections,
        "seq_len": seq_len,
        "set": settings,
        "heads_sweep": list(heads),
        "heads_model": heads_model if heads else None,
        "max_batch": _resolve(args, "max_batch"),
        "max_memory_gib": args.max_memory_gib,
        "train_batch": _resolve(args, "train_batch"),
        "target_s": _resolve(args, "target_s"),
        "budget_s": _resolve(args, "budget_s"),
        "memory": not args.no_memory,
        "memory_jobs": _resolve(args, "memory_jobs"),
        "accuracy_file": args.accuracy,
        "out": str(args.out),
        "_accuracy": accuracy,
    }
    return cases, config


def _require(plots: bool) -> None:
    """tqdm (and matplotlib for plots) or an ImportError saying how to install them."""
    missing = missing_modules("tqdm", *(["matplotlib.figure"] if plots else []))
    if missing:
        raise ImportError(f"taylorshift bench models needs {' and '.join(missing)}: {INSTALL_HINT}")


def settings_from(config: dict) -> Settings:
    quick = config["quick"]
    return Settings(
        device=config["device"],
        dtype=config["dtype"],
        max_batch=config["max_batch"],
        train_batch=config["train_batch"],
        target_s=config["target_s"],
        warmup_s=min(0.1, config["target_s"]),
        min_reps=2 if quick else 3,
        max_reps=10 if quick else 50,
        memory=config["memory"],
        threads=torch.get_num_threads(),
        max_memory_bytes=None
        if config.get("max_memory_gib") is None
        else int(config["max_memory_gib"] * 2**30),
    )


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``taylorshift bench models``: measure, then write the files into ``--out``."""
    cases, config = plan(args, parser)
    accuracy = config.pop("_accuracy")
    try:
        _require(plots=not args.no_plots)
    except ImportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    threads = torch.get_num_threads()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    out = files.fresh_folder(args.out, args.overwrite, parser)  # (before any measurement)
    try:
        return _run(args, config, cases, accuracy, out)
    finally:
        torch.set_num_threads(threads)


def _run(args: argparse.Namespace, config: dict, cases: list[Case], accuracy, out: Path) -> int:
    from tqdm import tqdm

    settings = settings_from(config)
    budget = Budget(config["budget_s"])
    results: dict[str, Any] = {
        "tool": "taylorshift bench models",
        "command": machine.command_line(),
        "config": config,
        "settings": asdict(settings),
        "machine": machine.machine_info(settings.device),
        "elapsed_s": 0.0,
        "rows": [],
    }
    # Phase 1: everything timed, one row after the other. Phase 2: the memory points,
    # after all timing (fresh processes on the CPU may run side by side: --memory-jobs).
    timing = replace(settings, memory=False)
    with tqdm(total=len(cases), unit="row", desc="bench models", dynamic_ncols=True) as bar:
        for case in cases:
            bar.set_description(case.name)
            row = measure_case(case, timing, budget, progress=bar.set_postfix_str)
            results["rows"].append(row)
            results["elapsed_s"] = budget.elapsed()
            files.write_json(out / "results.json", results)  # partial results survive a crash
            bar.update()
    if settings.memory:
        jobs = config["memory_jobs"] if settings.device == "cpu" else 1
        pairs = list(zip(cases, results["rows"], strict=True))
        with (
            tqdm(total=len(pairs), unit="row", desc="peak memory", dynamic_ncols=True) as bar,
            ThreadPoolExecutor(max_workers=jobs) as pool,
        ):
            futures = [
                pool.submit(measure_memory_points, row, case, settings, budget)
                for case, row in pairs
            ]
            for future in as_completed(futures):
                future.result()
                bar.update()
    if accuracy is not None:
        names = {r["name"] for r in results["rows"]}
        for row in results["rows"]:
            row["accuracy"] = accuracy.get(row["name"])
        results["accuracy"] = {
            "file": config["accuracy_file"],
            "values": accuracy,
            "unmatched": sorted(set(accuracy) - names),
        }
        results["pareto"] = pareto_table(results["rows"])
    results["elapsed_s"] = budget.elapsed()
    written = write_outputs(results, out, plots=not args.no_plots)
    print(summary(results))
    print(f"wrote {', '.join(p.name for p in written)} to {out}")
    return 0
