"""The decoding step of a causal LM at two revisions, beside SDPA with a key/value cache and
linear attention's state, in one process.

    python benchmarks/decode_cpu/unchecked-step/decode_ab.py --before 55f6603

The 4-layer ``CausalLM`` of ../report.md (dim 256, 8 heads of 32, float32, batch 1): the
TaylorShift model at ``--before`` and at the working tree with the same weights, and the
softmax and linear-attention models. Each context (512 and 1,024 tokens) is prefilled once
per model; each round then times ``--steps`` single-token steps of every case in a
shuffled order, on caches restored after every case (so N stays fixed). Prints the medians
and the ratios paired by round.
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "op_cpu" / "workspace"))
from ab import install_before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="a git revision of this repository")
    parser.add_argument("--context", type=int, nargs="+", default=[512, 1024])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    install_before(args.before, "ts-decode-ab-")
    from taylorshift_before.models import CausalLM as CausalLMBefore
    from taylorshift_before.models import CausalLMConfig as ConfigBefore

    from taylorshift.models import CausalLM, CausalLMConfig

    random.seed(0)
    torch.manual_seed(0)
    size = dict(vocab_size=258, dim=256, depth=4, num_heads=8)
    models = {
        "taylorshift before": CausalLMBefore(ConfigBefore(**size)).eval(),
        "taylorshift after": CausalLM(CausalLMConfig(**size)).eval(),
        "softmax kv": CausalLM(CausalLMConfig(**size, attn_kernel="softmax")).eval(),
        "linear state": CausalLM(CausalLMConfig(**size, attn_kernel="linear")).eval(),
    }
    models["taylorshift after"].load_state_dict(models["taylorshift before"].state_dict())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; before = {args.before}")
    for n in args.context:
        with torch.inference_mode():
            setups, logits = {}, {}
            prompt = torch.randint(0, 258, (1, n))
            token, pos = torch.randint(0, 258, (1, 1)), torch.full((1, 1), n)
            for name, model in models.items():
                caches = model.new_caches("kv" if name == "softmax kv" else "state")
                model.decode(prompt, caches, torch.arange(n)[None])
                setups[name] = (model, caches)
                if name.startswith("taylorshift"):
                    logits[name] = model.decode(token, copy.deepcopy(caches), pos)
            diff = (logits["taylorshift before"] - logits["taylorshift after"]).abs().max()
            times = {name: [] for name in models}
            for _ in range(args.rounds):
                order = list(setups.items())
                random.shuffle(order)
                for name, (model, caches) in order:
                    snapshot = [copy.deepcopy(vars(c)) for c in caches]
                    model.decode(token, caches, pos)  # warm
                    start = time.perf_counter()
                    for _ in range(args.steps):
                        model.decode(token, caches, pos)
                    times[name].append((time.perf_counter() - start) / args.steps * 1e3)
                    for c, saved in zip(caches, snapshot, strict=True):
                        vars(c).update(saved)
        print(f"N = {n}: before vs after logits, max |diff| {diff:.2e}")
        for name, ts in times.items():
            q1, _, q3 = statistics.quantiles(ts, n=4)
            print(f"  {name}: {statistics.median(ts):.3f} ms/step ({q1:.3f}-{q3:.3f})")
        pairs = (("taylorshift before", "taylorshift after"), ("taylorshift after", "softmax kv"),
                 ("taylorshift after", "linear state"))  # fmt: skip
        for num, den in pairs:
            ratios = [a / b for a, b in zip(times[num], times[den], strict=True)]
            q1, _, q3 = statistics.quantiles(ratios, n=4)
            print(f"  {num} / {den}: {statistics.median(ratios):.2f} ({q1:.2f}-{q3:.2f})")


if __name__ == "__main__":
    main()
