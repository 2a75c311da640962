"""A listops-cpu training step with the direct form at two revisions, beside softmax, in one
process.

    python benchmarks/direct_cpu/keep-weights/listops_ab.py --before 8e78e7f --rounds 40

The model of the listops-cpu preset (``listops-small``: 2 blocks, dim 64, 4 heads of 16, a
CLS token) with TaylorShift's direct form at ``--before`` and at the working tree, and with
softmax (SDPA), all three with the same weights; batches of 32 sequences of 10-50 tokens
padded to the longest (``padding_mask``), as the preset's ListOps data. Each round takes one
LAMB-free SGD step of each model, in a shuffled order, on the same batch; one thread, as
``--set run.threads=1``. Prints the medians and the ratios, paired by round.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "op_cpu" / "workspace"))
from ab import install_before, shuffled_rounds


def batches(count: int, batch: int = 32, vocab: int = 20, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(count):
        lengths = torch.randint(10, 51, (batch,), generator=g)
        n = int(lengths.max())
        mask = torch.arange(n)[None, :] < lengths[:, None]
        ids = torch.randint(2, vocab, (batch, n), generator=g).masked_fill(~mask, 0)
        yield ids, mask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="a git revision of this repository")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    install_before(args.before, "ts-listops-ab-")
    from taylorshift_before.models import create_model as create_before

    from taylorshift.models import create_model

    torch.manual_seed(0)
    direct = {"mode": "direct"}
    models = {
        "before": create_before("listops-small", kernel_args=direct),
        "after": create_model("listops-small", kernel_args=direct),
        "softmax": create_model("listops-small", attn_kernel="softmax"),
    }
    state = models["after"].state_dict()
    for name in ("before", "softmax"):
        models[name].load_state_dict(state, strict=False)  # softmax has no temperatures
    opts = {k: torch.optim.SGD(m.parameters(), lr=1e-4) for k, m in models.items()}
    data = list(batches(args.rounds + 2))
    current = {}

    def step(name):
        ids, mask = current["batch"]
        opts[name].zero_grad(set_to_none=True)
        models[name](ids, mask).logsumexp(-1).mean().backward()
        opts[name].step()

    times = {name: [] for name in models}
    for i, batch in enumerate(data):
        current["batch"] = batch
        round_times = shuffled_rounds({name: (lambda name=name: step(name)) for name in models}, 1)
        if i >= 2:  # the first two rounds warm up
            for name, ts in round_times.items():
                times[name].extend(ts)
    ms = {name: statistics.median(ts) * 1e3 for name, ts in times.items()}
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.rounds} rounds; "
          f"before = {args.before}")  # fmt: skip
    print(" | ".join(f"{name} {value:.2f} ms" for name, value in ms.items()))
    for num, den in (("before", "after"), ("before", "softmax"), ("after", "softmax")):
        ratios = sorted(a / b for a, b in zip(times[num], times[den], strict=True))
        quarter = len(ratios) // 4
        print(f"{num} / {den}: {statistics.median(ratios):.2f} "
              f"(rounds' q1-q3 {ratios[quarter]:.2f}-{ratios[3 * quarter]:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
