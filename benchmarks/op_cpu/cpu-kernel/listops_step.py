"""A listops-cpu training step with each TaylorShift form beside softmax, in one process.

    python benchmarks/op_cpu/cpu-kernel/listops_step.py --rounds 40

The model of the listops-cpu preset (``listops-small``: 2 blocks, dim 64, 4 heads of 16, a
CLS token) with TaylorShift's direct form, its efficient form (on the CPU kernels), ``auto``
and softmax (SDPA), all with the same weights; batches of 32 sequences of 10-50 tokens
padded to the longest (``padding_mask``), as the preset's ListOps data (the generator of
benchmarks/direct_cpu/keep-weights/listops_ab.py). Each round takes one
SGD step of each model in a shuffled order on the same batch; one thread, as the preset's
runs. Prints the medians and the ratios to softmax, paired by round (the method of
benchmarks/direct_cpu/keep-weights/listops_ab.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workspace"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "direct_cpu" / "keep-weights"))
from ab import shuffled_rounds
from listops_ab import batches  # the preset's batch shapes, as that A/B script draws them

from taylorshift.models import create_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    models = {
        mode: create_model("listops-small", kernel_args={"mode": mode})
        for mode in ("direct", "efficient", "auto")
    }
    models["softmax"] = create_model("listops-small", attn_kernel="softmax")
    state = models["direct"].state_dict()
    for name, model in models.items():
        model.load_state_dict(state, strict=name != "softmax")  # softmax has no temperatures
    opts = {k: torch.optim.SGD(m.parameters(), lr=1e-4) for k, m in models.items()}
    current = {}

    def step(name):
        ids, mask = current["batch"]
        opts[name].zero_grad(set_to_none=True)
        models[name](ids, mask).logsumexp(-1).mean().backward()
        opts[name].step()

    times = {name: [] for name in models}
    for i, batch in enumerate(batches(args.rounds + 2)):
        current["batch"] = batch
        round_times = shuffled_rounds({name: (lambda name=name: step(name)) for name in models}, 1)
        if i >= 2:  # the first two rounds warm up
            for name, ts in round_times.items():
                times[name].extend(ts)
    ms = {name: statistics.median(ts) * 1e3 for name, ts in times.items()}
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.rounds} rounds")
    print(" | ".join(f"{name} {value:.2f} ms" for name, value in ms.items()))
    for name in ("direct", "efficient", "auto"):
        ratios = sorted(a / b for a, b in zip(times[name], times["softmax"], strict=True))
        quarter = len(ratios) // 4
        print(f"{name} / softmax: {statistics.median(ratios):.2f} "
              f"(rounds' q1-q3 {ratios[quarter]:.2f}-{ratios[3 * quarter]:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
