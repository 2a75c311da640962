"""`auto` against the faster of its two forms, in one process, shuffled rounds.

    python benchmarks/op_cpu/layout/auto_check.py --rounds 5 \\
        --out benchmarks/op_cpu/layout/auto_check.md

Issue 18, part 6: `auto` as it runs without a calibration file (the refitted CPU prior;
run it where ``taylorshift bench calibrate --show`` lists nothing), B 1, H 4 (``--heads``),
float32, non-causal (``--causal``: causal); forward and forward + backward at d = 16, 32,
64 (``--d``) and N = 256 … 4,096 (``--n``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workspace"))
from ab import medians_ms, shuffled_rounds

from taylorshift import taylor_shift_attention
from taylorshift.atomic import write_atomic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--d", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--n", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lines = [
        "# `auto` against its faster form (refitted CPU prior, no calibration file)",
        "",
        f"    python {' '.join(sys.argv)}",
        "",
        f"{time.strftime('%Y-%m-%d')}, torch {torch.__version__}, {args.threads} threads, "
        f"B 1, H {args.heads}, float32, {'causal' if args.causal else 'non-causal'}, median of "
        f"{args.rounds} shuffled rounds (ms).",
        "",
        "| d | N | pass | direct | efficient | auto | auto / faster form |",
        "|---:|---:|---|---:|---:|---:|---:|",
    ]
    gen = torch.Generator().manual_seed(0)
    for d in args.d:
        for n in args.n:
            q, k, v = (
                torch.randn(1, args.heads, n, d, generator=gen, requires_grad=True)
                for _ in range(3)
            )
            for name, backward in (("forward", False), ("forward + backward", True)):

                def call(mode, backward=backward, q=q, k=k, v=v):
                    if backward:
                        y = taylor_shift_attention(q, k, v, is_causal=args.causal, mode=mode)
                        y.sum().backward()
                    else:
                        with torch.no_grad():
                            taylor_shift_attention(q, k, v, is_causal=args.causal, mode=mode)

                fns = {m: (lambda m=m: call(m)) for m in ("direct", "efficient", "auto")}
                for fn in fns.values():
                    fn()
                ms = medians_ms(shuffled_rounds(fns, args.rounds))
                best = min(ms["direct"], ms["efficient"])
                row = (f"| {d} | {n} | {name} | {ms['direct']:.2f} | {ms['efficient']:.2f} "
                       f"| {ms['auto']:.2f} | {ms['auto'] / best:.2f} |")  # fmt: skip
                print(row, flush=True)
                lines.append(row)
    write_atomic(args.out, ("\n".join(lines) + "\n").encode())


if __name__ == "__main__":
    main()
