"""A small transformer's training step with the efficient form at two revisions, one process.

    python benchmarks/op_cpu/workspace/model_ab.py --before 2e9c023 --rounds 7 --n 1024 --causal

    python benchmarks/op_cpu/workspace/model_ab.py --before 2e9c023 --rounds 15

Four pre-norm blocks (TaylorShiftAttention with mode="efficient" + a 4x MLP), dim 128,
4 heads of 32, batch 8, N = 1,024, float32, 2 threads: the per-chunk feature blocks
(8 · 4 · C · 561 elements) are large enough for the scratch buffers, and the model's other
layers allocate and free between the attention calls as in training. Both revisions'
modules are built with the same weights; each round times one forward + backward + SGD
step of each in a shuffled order. Prints the medians and the ratio.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab import install_before, medians_ms, shuffled_rounds


def model(attention_cls, dim=128, heads=4, depth=4, causal=False):
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.attn = attention_cls(dim, heads, mode="efficient")
            self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

        def forward(self, x):
            x = x + self.attn(self.n1(x), is_causal=causal)
            return x + self.mlp(self.n2(x))

    return nn.Sequential(*[Block() for _ in range(depth)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--causal", action="store_true", help="causal attention (an LM's)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    install_before(args.before, "ts-model-ab-")
    from taylorshift_before.nn import TaylorShiftAttention as Before

    from taylorshift.nn import TaylorShiftAttention as After

    torch.manual_seed(0)
    models = {name: model(cls, causal=args.causal) for name, cls in (("before", Before),
                                                                     ("after", After))}  # fmt: skip
    models["after"].load_state_dict(models["before"].state_dict())
    opts = {k: torch.optim.SGD(m.parameters(), lr=1e-4) for k, m in models.items()}
    x = torch.randn(8, args.n, 128)

    def step(name):
        opts[name].zero_grad(set_to_none=True)
        models[name](x).square().mean().backward()
        opts[name].step()

    for name in models:
        step(name)
        step(name)
    times = shuffled_rounds({name: (lambda name=name: step(name)) for name in models}, args.rounds)
    ms = medians_ms(times)
    ratios = sorted(b / a for b, a in zip(times["before"], times["after"], strict=True))
    label = f"N={args.n}{' causal' if args.causal else ''}"
    print(f"{label}: step before {ms['before']:.1f} ms, after {ms['after']:.1f} ms, "
          f"before/after {ms['before'] / ms['after']:.2f} (rounds' ratios "
          f"{ratios[len(ratios) // 4]:.2f}-{ratios[3 * len(ratios) // 4]:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
