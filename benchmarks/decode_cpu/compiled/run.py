"""One decoding step of a causal LM, eager and under ``torch.compile(fullgraph=True)``:
TaylorShift's constant-size state, SDPA with a key/value cache and linear attention's state.

The 4-layer ``CausalLM`` of ../report.md (dim 256, 8 heads of 32, float32, batch 1) is
prefilled to each context length, then ``model.decode`` of one token is timed; every case
restores its caches after each batch of steps, so all cases decode at the same context.
Rounds alternate the cases in shuffled order in one process. The compiled key/value step
is compiled with ``dynamic=True`` (the cache grows by a token per step).

Usage: python benchmarks/decode_cpu/compiled/run.py [--context 512 1024 4096] [--rounds 9]
"""

from __future__ import annotations

import argparse
import copy
import platform
import random
import statistics
import time

import torch

from taylorshift.models import CausalLM, CausalLMConfig

KERNELS = {"taylorshift": "state", "softmax": "kv", "linear": "state"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--context", type=int, nargs="+", default=[512, 1024, 4096])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    random.seed(0)
    torch.manual_seed(0)
    config = CausalLMConfig(vocab_size=258, dim=256, depth=4, num_heads=8)
    models = {
        k: CausalLM(CausalLMConfig(**{**vars(config), "attn_kernel": k})).eval() for k in KERNELS
    }
    steps = {}
    for kernel, model in models.items():
        steps[(kernel, "eager")] = model.decode
        steps[(kernel, "compiled")] = torch.compile(
            model.decode, fullgraph=True, dynamic=KERNELS[kernel] == "kv"
        )
    print(f"{platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(
        "context | kernel (cache) | eager ms/step | compiled ms/step | eager / compiled | "
        "÷ SDPA+kv, eager | ÷ SDPA+kv, compiled"
    )
    for n in args.context:
        with torch.inference_mode():
            prompt = torch.randint(0, 256, (1, n))
            start = {}
            for kernel, model in models.items():
                caches = model.new_caches(KERNELS[kernel])
                model.decode(prompt, caches, torch.arange(n)[None])
                start[kernel] = caches
            token = torch.randint(0, 256, (1, 1))
            cases = list(steps)
            times = {c: [] for c in cases}
            for r in range(args.rounds + 1):  # round 0 compiles and warms up
                random.shuffle(cases)
                for kernel, how in cases:
                    caches = copy.deepcopy(start[kernel])
                    step = steps[(kernel, how)]
                    t0 = time.perf_counter()
                    for i in range(args.steps):
                        step(token, caches, torch.tensor([[n + i]]))
                    if r:
                        times[(kernel, how)].append((time.perf_counter() - t0) / args.steps)

        def paired(a, b, times=times):  # median over rounds of a / b in the same round
            return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))

        for kernel in models:
            e, c = times[(kernel, "eager")], times[(kernel, "compiled")]
            versus = " | ".join(
                f"{paired((kernel, how), ('softmax', how)):.2f}" for how in ("eager", "compiled")
            )
            print(
                f"{n} | {kernel} ({KERNELS[kernel]}) | {statistics.median(e) * 1e3:.2f} | "
                f"{statistics.median(c) * 1e3:.2f} | "
                f"{paired((kernel, 'eager'), (kernel, 'compiled')):.2f}x | {versus}",
                flush=True,
            )


if __name__ == "__main__":
    main()
