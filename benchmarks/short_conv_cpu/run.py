"""Training-step time of a causal LM with a short convolution: the convolution's output
handed on as a strided view (before) or copied back to (B, N, dim) layout (after).

    python benchmarks/short_conv_cpu/run.py [--rounds 7] [--out results.json]

Both layouts run in this one process, interleaved in a shuffled order per round, with one
torch thread; the median over rounds of the per-step time (forward + backward of the LM loss
on a batch of 16 sequences) is reported with the ratio before / after. "Before" is the
library's ``Attention._local_mix`` with the final ``.contiguous()`` taken out, which is what
it was before this measurement.
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from taylorshift.atomic import write_atomic
from taylorshift.bench.machine import machine_info
from taylorshift.models import create_model
from taylorshift.nn.attention import Attention

HERE = Path(__file__).resolve().parent
AFTER = Attention._local_mix


def strided_local_mix(self, q, k, v, mask, causal, self_attention):
    """``Attention._local_mix`` as it was: the output stays a transposed view."""
    real = None
    if mask is not None and mask.shape[-2] == 1 and mask.shape[-3] == 1:
        real = mask[:, 0, 0, :, None].to(k.dtype)
    weight, bias, taps, dim = self.conv.weight, self.conv.bias, self.short_conv, self.dim
    left = taps - 1 if causal else (taps - 1) // 2

    def mix(t, part, zero):
        if zero is not None:
            t = t * zero
        t = F.pad(t.transpose(1, 2), (left, taps - 1 - left))
        sl = slice(part * dim, (part + 1) * dim)
        return F.conv1d(t, weight[sl], bias[sl], groups=dim).transpose(1, 2)

    return mix(q, 0, real if self_attention else None), mix(k, 1, real), mix(v, 2, real)


def step_ms(model, ids, repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        logits = model(ids)
        F.cross_entropy(logits.flatten(0, 1), ids.flatten()).backward()
    return 1000 * (time.perf_counter() - start) / repeats


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernels", nargs="+", default=["softmax", "taylorshift", "linear"])
    p.add_argument("--seq-lens", nargs="+", type=int, default=[64, 256, 1024])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--repeats", type=int, default=3, help="steps timed per round")
    p.add_argument("--out", type=Path, default=HERE / "results.json")
    args = p.parse_args()
    torch.set_num_threads(1)
    rows = []
    for kernel in args.kernels:
        for n in args.seq_lens:
            torch.manual_seed(0)
            model = create_model(
                "lm-tiny", vocab_size=64, dim=64, depth=2, num_heads=4, qk_norm=True,
                short_conv=4, attn_kernel=kernel,
            )  # fmt: skip
            ids = torch.randint(0, 64, (16, n))
            times = {"before": [], "after": []}
            layouts = {"before": strided_local_mix, "after": AFTER}
            for fn in layouts.values():  # warm-up
                Attention._local_mix = fn
                step_ms(model, ids, 1)
            for _ in range(args.rounds):
                order = list(layouts)
                random.shuffle(order)
                for name in order:
                    Attention._local_mix = layouts[name]
                    times[name].append(step_ms(model, ids, args.repeats))
            Attention._local_mix = AFTER
            before, after = (statistics.median(times[k]) for k in ("before", "after"))
            rows.append(
                {"kernel": kernel, "seq_len": n, "before_ms": before, "after_ms": after,
                 "speedup": before / after, "times": times}
            )  # fmt: skip
            print(f"{kernel:12s} N={n:5d}: before {before:7.1f} ms, after {after:7.1f} ms, "
                  f"{before / after:.2f}x", flush=True)  # fmt: skip
    results = {
        "machine": machine_info("cpu"),
        "torch": torch.__version__,
        "command": " ".join(shlex.quote(a) for a in ["python", *sys.argv]),
        "rows": rows,
    }
    write_atomic(args.out, (json.dumps(results, indent=1) + "\n").encode())


if __name__ == "__main__":
    main()
