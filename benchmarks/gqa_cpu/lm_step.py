"""One training step of a causal LM with grouped key/value heads on the CPU: forward,
cross-entropy and backward, timed in this process for whichever taylorshift is imported.

    python benchmarks/gqa_cpu/lm_step.py [--n 2048] [--steps 5] [--kv-heads 2] [--mode auto]

``CausalLM`` of width 256, 2 blocks, 8 query heads of 32 (key/value heads ``--kv-heads``),
TaylorShift attention with ``--mode``, batch 1, float32, 2 threads. Prints the median step
(ms) of ``--steps`` timed steps after one warm-up. Two package trees are compared by running
this script in alternating processes, e.g. ``PYTHONPATH=/tmp/old/src python ...`` for an
older checkout (README.md of this folder).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import taylorshift
from taylorshift.models.causal_lm import CausalLM, CausalLMConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2048, help="tokens per sequence")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--mode", default="auto", choices=("auto", "efficient", "direct"))
    args = parser.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    config = CausalLMConfig(
        dim=256, depth=2, num_heads=8, num_kv_heads=args.kv_heads,
        kernel_args={"mode": args.mode}, max_len=args.n,
    )  # fmt: skip
    model = CausalLM(config)
    tokens = torch.randint(0, config.vocab_size, (1, args.n + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step() -> None:
        model.zero_grad(set_to_none=True)
        logits = model(inputs)
        F.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()

    step()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    print(f"{taylorshift.__file__}: N {args.n}, kv heads {args.kv_heads}, mode {args.mode}: "
          f"{statistics.median(times) * 1e3:.1f} ms a step")  # fmt: skip


if __name__ == "__main__":
    main()
