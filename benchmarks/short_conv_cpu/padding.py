"""Training-step time of a causal LM with a short convolution on padded batches: the model
as it is (each row's real tokens moved first where padding sits before or between them:
``CausalLM.forward``, and the layers for callers of their own) against the model that
never moves them (what it did before 2026-11-28, wrong for such padding).

    python benchmarks/short_conv_cpu/padding.py [--rounds 9] [--out padding.json]

Batches of 16 sequences, half of them shorter, padded on the right (the permutation is
skipped: the check alone is timed) or on the left (the permutation runs, forward and
backward). Both variants run in this one process, interleaved in a shuffled order per
round, with 2 torch threads; the median per-step time (forward + backward of the LM loss
at the real tokens) and the ratio now / before are reported. "Before" replaces the checks
(``causal_lm.padding_inside`` and ``nn.attention._padding_inside``) by ones that say no
padding sits inside.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import taylorshift.models.causal_lm as causal_lm
import taylorshift.nn.attention as attention
from taylorshift.bench.files import write_json
from taylorshift.bench.machine import command_line, machine_info
from taylorshift.models import create_model

HERE = Path(__file__).resolve().parent
NOW = (causal_lm.padding_inside, attention._padding_inside)
BEFORE = (lambda mask: False, lambda mask: False)


def use(checks) -> None:
    causal_lm.padding_inside, attention._padding_inside = checks


def step_ms(model, ids, mask, repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        logits = model(ids, mask)
        F.cross_entropy(logits[mask], ids[mask]).backward()
    return 1000 * (time.perf_counter() - start) / repeats


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernels", nargs="+", default=["taylorshift", "softmax"])
    p.add_argument("--seq-lens", nargs="+", type=int, default=[256, 1024])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--repeats", type=int, default=3, help="steps timed per round")
    p.add_argument("--out", type=Path, default=HERE / "padding.json")
    args = p.parse_args()
    torch.set_num_threads(2)
    variants = {"before": BEFORE, "now": NOW}
    rows = []
    for kernel in args.kernels:
        for n in args.seq_lens:
            torch.manual_seed(0)
            model = create_model(
                "lm-tiny", vocab_size=64, dim=64, depth=2, num_heads=4, qk_norm=True,
                short_conv=4, attn_kernel=kernel, pos_embedding="cosine",
            )  # fmt: skip
            ids = torch.randint(0, 64, (16, n))
            lengths = torch.tensor([n] * 8 + [n // 2 + 7 * i for i in range(8)])
            right = torch.arange(n)[None, :] < lengths[:, None]
            for side, mask in (("right", right), ("left", right.flip(-1))):
                times = {name: [] for name in variants}
                for fn in variants.values():  # warm-up
                    use(fn)
                    step_ms(model, ids, mask, 1)
                for _ in range(args.rounds):
                    order = list(variants)
                    random.shuffle(order)
                    for name in order:
                        use(variants[name])
                        times[name].append(step_ms(model, ids, mask, args.repeats))
                use(NOW)
                before, now = (statistics.median(times[k]) for k in ("before", "now"))
                rows.append(
                    {"kernel": kernel, "seq_len": n, "padding": side, "before_ms": before,
                     "now_ms": now, "now_over_before": now / before, "times": times}
                )  # fmt: skip
                print(
                    f"{kernel:12s} N={n:5d} {side:5s} padding: before {before:7.1f} ms, "
                    f"now {now:7.1f} ms, now / before {now / before:.3f}",
                    flush=True,
                )
    machine = machine_info("cpu")
    write_json(args.out, {"machine": machine, "command": f"python {command_line()}", "rows": rows})


if __name__ == "__main__":
    main()
