"""What local heads cost: a causal attention layer's forward + backward time with 0, 1 or 2
of its 4 heads a sliding-window softmax (window 32), beside softmax attention (SDPA); and
the window op alone, tiled against its plain (N, N)-mask form.

    python benchmarks/local_heads_cpu/run.py [--rounds 7] [--threads 1] [--out results.json]

Every configuration of one sequence length runs in this one process, interleaved in a
shuffled order per round; the median over rounds of the per-call time is reported, with
the ratio to the layer without local heads. Layer: ``Attention(64, 4)`` (head dim 16, the
``lm-tiny`` shape) with a 4-tap short convolution, batch 8, float32.
"""

from __future__ import annotations

import argparse
import random
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

from taylorshift.bench.files import write_json
from taylorshift.bench.machine import machine_info
from taylorshift.nn import Attention
from taylorshift.ops.window import naive_sliding_window_attention, sliding_window_attention

HERE = Path(__file__).resolve().parent
DIM, HEADS, BATCH, WINDOW = 64, 4, 8, 32


def layers() -> dict[str, Attention]:
    torch.manual_seed(0)
    made = {
        "taylorshift": Attention(DIM, HEADS, short_conv=4),
        "taylorshift, 1 local head": Attention(
            DIM, HEADS, short_conv=4, kernel_args={"local_heads": 1, "window": WINDOW}
        ),
        "taylorshift, 2 local heads": Attention(
            DIM, HEADS, short_conv=4, kernel_args={"local_heads": 2, "window": WINDOW}
        ),
        "softmax (SDPA)": Attention(DIM, HEADS, short_conv=4, attn_kernel="softmax"),
    }
    return made


def layer_ms(layer: Attention, x: torch.Tensor, repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        layer(x, is_causal=True).sum().backward()
    return 1000 * (time.perf_counter() - start) / repeats


def op_ms(form, q, k, v, repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        form(q, k, v, WINDOW, None, True).sum().backward()
    return 1000 * (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--out", type=Path, default=HERE / "results.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rng = random.Random(0)
    rows = []
    for n in args.lengths:
        repeats = max(1, 4096 // n)
        x = torch.randn(BATCH, n, DIM)
        q, k, v = (torch.randn(BATCH, 1, n, 16, requires_grad=True) for _ in range(3))
        runs = {f"layer: {name}": (layer_ms, layer, x) for name, layer in layers().items()}
        runs["window op: tiled"] = (op_ms, sliding_window_attention, q, k, v)
        runs["window op: plain (N x N mask)"] = (op_ms, naive_sliding_window_attention, q, k, v)
        for fn, *fn_args in runs.values():  # warm up
            fn(*fn_args, 1)
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.rounds):
            order = list(runs)
            rng.shuffle(order)
            for name in order:
                fn, *fn_args = runs[name]
                times[name].append(fn(*fn_args, repeats))
        base = statistics.median(times["layer: taylorshift"])
        tiled = statistics.median(times["window op: tiled"])
        for name, samples in times.items():
            ms = statistics.median(samples)
            ratio = ms / (base if name.startswith("layer") else tiled)
            rows.append({"n": n, "config": name, "ms": ms, "ratio": ratio})
            print(f"N={n:5d}  {name:36s} {ms:9.2f} ms  x{ratio:.2f}", flush=True)
    result = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "machine": machine_info(),
        "threads": args.threads,
        "rounds": args.rounds,
        "shape": {"dim": DIM, "heads": HEADS, "batch": BATCH, "window": WINDOW},
        "what": "forward + backward per call, median over rounds; ratio: layer to the "
        "layer without local heads, window op to the tiled op",
        "rows": rows,
    }
    write_json(args.out, result)


if __name__ == "__main__":
    main()
