"""A listops-cpu training step eager and under ``torch.compile(fullgraph=True)``, TaylorShift
(`auto`, on the CPU kernels) beside softmax, in one process.

    python benchmarks/compile_cpu/model-step/step.py --rounds 30

The model of the listops-cpu preset (``listops-small``: 2 blocks, dim 64, 4 heads of 16, a
CLS token) with TaylorShift's ``auto`` (the direct kernel at these lengths) and with softmax
(SDPA), eager and compiled with Inductor (``fullgraph=True``, so a graph break fails);
batches of 32 sequences of 10-50 tokens padded to 50 (one shape: the compiled step is
compiled once), the preset's ListOps lengths (the generator of
benchmarks/direct_cpu/keep-weights/listops_ab.py). One SGD step of the model and its copy
per case and round in shuffled order; one thread, as the preset. Prints the medians and
the ratios paired by round.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "op_cpu" / "workspace"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "direct_cpu" / "keep-weights"))
from ab import shuffled_rounds
from listops_ab import batches

from taylorshift.models import create_model

LENGTH = 50


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    eager = {
        "taylorshift": create_model("listops-small"),
        "softmax": create_model("listops-small", attn_kernel="softmax"),
    }
    models, steps = {}, {}
    for name, model in eager.items():
        twin = copy.deepcopy(model)
        models[f"{name} eager"] = model
        models[f"{name} compiled"] = twin
        steps[f"{name} eager"] = model
        steps[f"{name} compiled"] = torch.compile(twin, fullgraph=True)
    opts = {k: torch.optim.SGD(m.parameters(), lr=1e-4) for k, m in models.items()}
    current = {}

    def step(name):
        ids, mask = current["batch"]
        opts[name].zero_grad(set_to_none=True)
        steps[name](ids, mask).logsumexp(-1).mean().backward()
        opts[name].step()

    def padded(batch):
        ids, mask = batch
        pad = LENGTH - ids.shape[1]
        return (torch.nn.functional.pad(ids, (0, pad)), torch.nn.functional.pad(mask, (0, pad)))

    data = [padded(b) for b in batches(args.rounds + 2)]
    current["batch"] = data[0]
    for name in steps:  # compile (and warm up) outside the timed rounds
        start = time.perf_counter()
        step(name)
        print(f"{name}: first step {time.perf_counter() - start:.1f} s", flush=True)
    times = {name: [] for name in steps}
    for i, batch in enumerate(data):
        current["batch"] = batch
        round_times = shuffled_rounds({name: (lambda name=name: step(name)) for name in steps}, 1)
        if i >= 2:
            for name, ts in round_times.items():
                times[name].extend(ts)
    ms = {name: statistics.median(ts) * 1e3 for name, ts in times.items()}
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.rounds} rounds, "
          f"N = {LENGTH}")  # fmt: skip
    print(" | ".join(f"{name} {value:.2f} ms" for name, value in ms.items()))

    def paired(a, b):
        ratios = sorted(x / y for x, y in zip(times[a], times[b], strict=True))
        q = len(ratios) // 4
        return f"{statistics.median(ratios):.2f} (q1-q3 {ratios[q]:.2f}-{ratios[3 * q]:.2f})"

    for name in eager:
        print(f"{name}: eager / compiled {paired(f'{name} eager', f'{name} compiled')}")
    print(f"taylorshift / softmax, eager: {paired('taylorshift eager', 'softmax eager')}")
    print(f"taylorshift / softmax, compiled: {paired('taylorshift compiled', 'softmax compiled')}")


if __name__ == "__main__":
    main()
