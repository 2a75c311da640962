"""``taylorshift bench decode``: decoding speed and cache memory against context length.

For each context length N and each (kernel, cache) case, a causal LM is prefilled with N
random tokens, then one more token is decoded and timed (the cache is put back after
every timed call, so all reps see the same N); the cases of a context are timed in
interleaved rounds (``--rounds``). Reported per point: tokens/s (batch · 1 / median step
time), the median of the per-round ratios of its step to the first case's, the prefill
time, and the bytes the decoding caches hold — exact, from the cache tensors: a
TaylorShift state holds B · H · (D · (dv + 1) + 1) floats per layer, D = d(d+1)/2 + d + 1,
whatever N; a key/value cache 2 · B · H · N · d floats (and a mask) per layer. On CUDA the
peak allocated memory of a decoding step is added.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from ..cliargs import format_table, positive_int
from ..models import CausalLM, CausalLMConfig
from . import machine
from .core import OK, dtype_option, dtypes, markdown_table, mib, parse_device
from .figures import figure, log_axes
from .files import add_output_options, fresh_folder, write_results
from .measure import cuda_peak_memory, time_call

HELP = (
    "decoding speed and memory vs context length: TaylorShift's constant-size state "
    "against a key/value cache (tokens/s, cache bytes)"
)

DEFAULT_CONTEXTS = (256, 1024, 4096, 16384)
QUICK_CONTEXTS = (128, 512, 2048)
# kernel:cache pairs; the same TaylorShift weights serve both of its caches
DEFAULT_CASES = ("taylorshift:state", "taylorshift:kv", "softmax:kv", "linear:state")
DTYPES = dtypes("float32", "bfloat16", "float16")


def parse_case(text: str) -> tuple[str, str]:
    kernel, sep, cache = text.partition(":")
    if not sep or cache not in ("state", "kv") or not kernel:
        raise argparse.ArgumentTypeError(
            f"expected KERNEL:CACHE with CACHE state or kv (e.g. taylorshift:state); got {text!r}"
        )
    return kernel, cache


def _snapshot(caches: list) -> list[dict]:
    return [dict(vars(c)) for c in caches]


def _restore(caches: list, snapshot: list[dict]) -> None:
    # A key/value cache writes a step past its length in its buffers: its old length (and
    # buffers, had they moved) back undoes the step. A TaylorShift state is updated in
    # place, which changes its sums but not the cost of the next step.
    for cache, saved in zip(caches, snapshot, strict=True):
        vars(cache).update(saved)


def prepare_point(
    model: CausalLM,
    cache_kind: str,
    context: int,
    batch: int,
    device: torch.device,
    generator: torch.Generator,
    target_s: float,
) -> tuple[dict, Callable[[], None] | None]:
    """Prefill ``context`` random tokens (timed) and return (the row so far, the decoding
    step to time), or (a failed row, None)."""
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (batch, context), generator=generator).to(device)
    caches = model.new_caches(cache_kind)
    positions = torch.arange(context, device=device).expand(batch, context)
    prefill = time_call(
        lambda: model.decode(prompt, model.new_caches(cache_kind), positions),
        device=device,
        target_s=target_s,
        min_reps=1,
        max_reps=5,
        min_warmup=1,
    )
    if prefill.status != OK:
        return {"status": prefill.status, "error": prefill.error}, None
    model.decode(prompt, caches, positions)
    token = torch.randint(0, vocab, (batch, 1), generator=generator).to(device)
    step_pos = torch.full((batch, 1), context, device=device)
    saved = _snapshot(caches)

    def step():
        model.decode(token, caches, step_pos)
        _restore(caches, saved)

    row = {"prefill_s": prefill.median_s, "cache_bytes": sum(c.nbytes for c in caches)}
    return row, step


def time_rounds(steps: list, device: torch.device, target_s: float, rounds: int) -> list:
    """Time the steps (None: a failed point, skipped) in ``rounds`` interleaved rounds, each
    timing every step once for ``target_s / rounds`` seconds: on a shared machine the
    cases of a round see the same load. Per step: the TimeResult of each round, or None."""
    results: list = [[] if step else None for step in steps]
    for r in range(rounds):
        for step, timed in zip(steps, results, strict=True):
            if step is None or (timed and timed[-1].status != OK):
                continue
            warm = dict(warmup_s=0.0, min_warmup=1) if r else {}
            timed.append(time_call(step, device=device, target_s=target_s / rounds, **warm))
    return results


def step_fields(timed: list, first: list | None) -> dict:
    """A row's step fields from its rounds: the median step over all timed calls, quartiles,
    and, against the first case's rounds (``first``), the median of the per-round ratios."""
    if timed[-1].status != OK:
        return {"status": timed[-1].status, "error": timed[-1].error}
    times = [t for result in timed for t in result.times_s]
    median = statistics.median(times)
    q1, _, q3 = statistics.quantiles(times, n=4) if len(times) > 1 else (times[0],) * 3
    row = {"status": OK, "step_s": median, "step_q1_s": q1, "step_q3_s": q3,
           "reps": len(times), "rounds": len(timed)}  # fmt: skip
    if first and first[-1].status == OK and first is not timed:
        pairs = zip(timed, first, strict=True)
        ratios = [mine.median_s / theirs.median_s for mine, theirs in pairs]
        row["step_vs_first"] = statistics.median(ratios)
        row["step_vs_first_range"] = (min(ratios), max(ratios))
    return row


def run_sweep(args, device: torch.device, progress=None) -> list[dict]:
    """Every case at each context, the cases of a context timed in interleaved rounds."""
    dtype = DTYPES[args.dtype]
    models = []
    for kernel, cache_kind in args.cases:
        config = CausalLMConfig(
            vocab_size=args.vocab,
            dim=args.dim,
            depth=args.depth,
            num_heads=args.heads,
            num_kv_heads=args.kv_heads,
            attn_kernel=kernel,
        )
        torch.manual_seed(0)
        model = CausalLM(config, device=device, dtype=dtype).eval()
        if cache_kind == "state":
            model.new_caches("state")  # refuse a kernel without a state before timing
        models.append(model)
    rows = []
    for context in args.context:
        prepared = []
        for (kernel, cache_kind), model in zip(args.cases, models, strict=True):
            if progress:
                progress(kernel, cache_kind, context)
            g = torch.Generator().manual_seed(context)
            with torch.inference_mode():
                prepared.append(
                    prepare_point(model, cache_kind, context, args.batch, device, g, args.target)
                )
        with torch.inference_mode():
            timed = time_rounds([step for _, step in prepared], device, args.target, args.rounds)
        for (kernel, cache_kind), (row, step), rounds in zip(
            args.cases, prepared, timed, strict=True
        ):
            if step is not None:
                row = row | step_fields(rounds, timed[0])
                if row["status"] == OK:
                    row["tokens_per_s"] = args.batch / row["step_s"]
                    if device.type == "cuda":
                        row["step_peak_extra_bytes"] = cuda_peak_memory(
                            step, device
                        ).peak_extra_bytes
            rows.append({"kernel": kernel, "cache": cache_kind, "context": context, **row})
    return rows


def _mib(n: int | None) -> str:
    return mib(n, digits=3, missing="")


def report_markdown(result: dict) -> str:
    s = result["settings"]
    first = s.get("cases", ["the first case"])[0]
    rows = []
    for r in result["rows"]:
        if r["status"] != OK:
            rows.append([r["kernel"], r["cache"], r["context"], r["status"], "", "", "", ""])
            continue
        rows.append(
            [
                r["kernel"],
                r["cache"],
                r["context"],
                f"{r['tokens_per_s']:.1f}",
                f"{r['step_s'] * 1e3:.3f}",
                _vs_first(r),
                f"{r['prefill_s']:.3f}",
                _mib(r["cache_bytes"]),
            ]
        )
    headers = ["kernel", "cache", "context N", "tokens/s", "step ms", f"step / {first}",
               "prefill s", "cache MiB"]  # fmt: skip
    lines = [
        "# Decoding: constant-size state vs key/value cache",
        "",
        f"Model: CausalLM dim {s['dim']}, depth {s['depth']}, {s['heads']} heads "
        f"(head dim {s['dim'] // s['heads']}, {s.get('kv_heads') or s['heads']} key/value "
        f"heads), vocab {s['vocab']}, {s['dtype']}, batch "
        f"{s['batch']}, device {result['machine'].get('device', '')}.",
        "",
        f"Command: `{result['command']}`",
        "",
        f"Step: the median over {s.get('rounds', 1)} interleaved rounds, each timing every "
        f"case of a context in turn; step / {first}: the median of the per-round ratios "
        "(least-most in brackets).",
        "",
        markdown_table(headers, rows),
    ]
    return "\n".join(lines) + "\n"


def _vs_first(row: dict) -> str:
    if "step_vs_first" not in row:
        return ""
    low, high = row["step_vs_first_range"]
    return f"{row['step_vs_first']:.3f} ({low:.2f}-{high:.2f})"


def make_figure(result: dict):
    fig = figure(11, 4.2)
    ax_t, ax_m = fig.subplots(1, 2)
    cases = list(dict.fromkeys((r["kernel"], r["cache"]) for r in result["rows"]))
    for kernel, cache in cases:
        pts = [r for r in result["rows"]
               if (r["kernel"], r["cache"]) == (kernel, cache) and r["status"] == OK]  # fmt: skip
        if not pts:
            continue
        xs = [r["context"] for r in pts]
        label = f"{kernel} ({cache})"
        ax_t.plot(xs, [r["tokens_per_s"] for r in pts], marker="o", label=label)
        ax_m.plot(xs, [r["cache_bytes"] / 2**20 for r in pts], marker="o", label=label)
    for ax, ylabel in ((ax_t, "tokens / s (one decoding step)"), (ax_m, "cache MiB (all layers)")):
        log_axes(ax)
        ax.set_xlabel("context length N")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    ax_t.legend()
    fig.suptitle("Decoding: TaylorShift state vs key/value cache")
    return fig


def write_outputs(results: dict, out: str | Path, *, plots: bool = True) -> list[Path]:
    """decode.json, decode.csv, decode.md and (``plots``) decode.png, written atomically."""
    names = ("decode.json", "decode.csv", "decode.md")
    figure = ("decode.png", make_figure) if plots else None
    return write_results(out, results, results["rows"], report_markdown, names, figure=figure)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--context",
        nargs="+",
        type=positive_int,
        metavar="N",
        help=f"context lengths (default: {' '.join(map(str, DEFAULT_CONTEXTS))}; --quick: "
        f"{' '.join(map(str, QUICK_CONTEXTS))})",
    )
    parser.add_argument(
        "--cases",
        nargs="+",
        type=parse_case,
        metavar="KERNEL:CACHE",
        help=f"(default: {' '.join(DEFAULT_CASES)})",
    )
    parser.add_argument("--dim", type=positive_int, default=256, help="model width (256)")
    parser.add_argument("--depth", type=positive_int, default=4, help="blocks (4)")
    parser.add_argument("--heads", type=positive_int, default=8, help="heads (8: head dim 32)")
    parser.add_argument(
        "--kv-heads",
        type=positive_int,
        help="key/value heads, a divisor of --heads (grouped-query attention; default: --heads)",
    )
    parser.add_argument("--vocab", type=positive_int, default=258, help="vocabulary (258)")
    parser.add_argument("--batch", type=positive_int, default=1, help="sequences decoded at once")
    parser.add_argument("--dtype", type=dtype_option, choices=sorted(DTYPES), default="float32")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N (default cpu)")
    parser.add_argument(
        "--target", type=float, default=0.5, help="seconds of timed calls per point (0.5)"
    )
    parser.add_argument(
        "--rounds",
        type=positive_int,
        default=5,
        help="interleaved rounds per context: each times every case for --target / rounds "
        "seconds, and each case's step is also given as the median of its per-round ratios "
        "to the first case's (5)",
    )
    parser.add_argument("--quick", action="store_true", help="shorter contexts, a small model")
    add_output_options(parser, "bench-decode")


SETTINGS = ("dim", "depth", "heads", "kv_heads", "vocab", "batch", "dtype", "context", "target",
            "rounds")  # fmt: skip


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.dim % args.heads:
        parser.error(f"--dim must be divisible by --heads; got {args.dim} and {args.heads}")
    if args.quick:
        args.dim, args.depth = min(args.dim, 128), min(args.depth, 2)
        args.heads = min(args.heads, 4)
    if args.kv_heads is not None and args.heads % args.kv_heads:
        parser.error(
            f"--kv-heads must divide --heads; got --kv-heads {args.kv_heads} and --heads "
            f"{args.heads}{' (--quick: at most 4)' if args.quick else ''}"
        )
    args.context = sorted(set(args.context or (QUICK_CONTEXTS if args.quick else DEFAULT_CONTEXTS)))
    args.cases = list(dict.fromkeys(args.cases or [parse_case(c) for c in DEFAULT_CASES]))
    device = parse_device(args.device, parser)
    out = fresh_folder(args.out, args.overwrite, parser)  # (before any measurement)

    def progress(kernel, cache, n):
        print(f"  {kernel} ({cache}) N={n}", file=sys.stderr, flush=True)

    try:
        rows = run_sweep(args, device, progress)
    except ValueError as err:  # a kernel without a state, an unknown kernel
        parser.error(str(err))
    result = {
        "machine": machine.machine_info(device),
        "command": machine.command_line(),
        "settings": {k: getattr(args, k) for k in SETTINGS}
        | {"cases": [f"{k}:{c}" for k, c in args.cases]},
        "rows": rows,
    }
    written = write_outputs(result, out, plots=not args.no_plots)
    table_rows = [
        (
            f"{r['kernel']}:{r['cache']}",
            r["context"],
            "" if r.get("tokens_per_s") is None else f"{r['tokens_per_s']:.1f}",
            _vs_first(r),
            _mib(r.get("cache_bytes")),
            r["status"],
        )
        for r in rows
    ]
    first = f"{args.cases[0][0]}:{args.cases[0][1]}"
    headers = ("case", "N", "tokens/s", f"step / {first}", "cache MiB", "status")
    print(format_table(headers, table_rows))
    print(f"Wrote {', '.join(str(p) for p in written)}")
    return 0
