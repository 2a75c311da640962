"""The efficient form's default chunk at 2^22, 2^23 and 2^24 feature elements, one process.

    python benchmarks/op_cpu/workspace/chunk_elements.py --out benchmarks/op_cpu/workspace/chunk.md

B 1, H 4, float32, non-causal, 2 threads; each round times every chunk size once
(forward, and forward + backward), median of 5 rounds, in ms. The chunk for each element
budget is what ``default_chunk_size`` gives with that budget (the wider of D and d·(dv + 1)
sets it), balanced over the sequence as the op does.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab import medians_ms, shuffled_rounds

from taylorshift.atomic import write_atomic
from taylorshift.ops.taylor_shift.efficient import (
    MAX_CHUNK,
    MIN_CHUNK,
    balanced_chunk,
    efficient_taylor_shift,
)
from taylorshift.ops.taylor_shift.features import feature_dim


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(2)
    lines = [
        "# Default chunk: 2^22, 2^23, 2^24 feature elements",
        "",
        f"    python {' '.join(sys.argv)}",
        "",
        f"{time.strftime('%Y-%m-%d')}, torch {torch.__version__}, 2 threads, B 1, H 4, "
        f"float32, median of {args.rounds} shuffled rounds (ms; C = tokens per chunk).",
        "",
        "| d | N | budget | C | forward | forward + backward |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for d, n in ((32, 1024), (32, 4096), (64, 1024), (64, 4096), (64, 8192)):
        q, k, v = (torch.randn(1, 4, n, d, requires_grad=True) for _ in range(3))
        width = max(feature_dim(d), d * (d + 1))
        chunks = {
            e: balanced_chunk(n, max(MIN_CHUNK, min(MAX_CHUNK, (1 << e) // (4 * width))))
            for e in (22, 23, 24)
        }
        fns = {}
        for e, c in chunks.items():
            fns[e, "f"] = lambda c=c, q=q, k=k, v=v: efficient_taylor_shift(
                q.detach(), k.detach(), v.detach(), None, 1.0, None, True, c
            )
            fns[e, "b"] = lambda c=c, q=q, k=k, v=v: (
                efficient_taylor_shift(q, k, v, None, 1.0, None, True, c).sum().backward()
            )
        for fn in fns.values():
            fn()
        ms = medians_ms(shuffled_rounds(fns, args.rounds))
        for e, c in chunks.items():
            row = f"| {d} | {n} | 2^{e} | {c} | {ms[e, 'f']:.1f} | {ms[e, 'b']:.1f} |"
            print(row, flush=True)
            lines.append(row)
    write_atomic(args.out, ("\n".join(lines) + "\n").encode())


if __name__ == "__main__":
    main()
