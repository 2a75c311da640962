"""How sharp is each head of a trained causal LM? Entropy and local mass of its weights.

    python benchmarks/parity/attention_stats.py RUN [RUN ...] [--windows 64] [--json OUT]

RUN is a run folder of ``taylorshift train`` on a byte task (``text-bytes``); its latest
checkpoint is loaded and fed ``--windows`` validation windows. For every layer and head
the attention weights are recomputed from the kernel's own inputs (``Attention.heads_in``:
projections, short convolution, q/k norms) by the plain definitions, for queries with at
least 64 keys:

- ``entropy``: mean entropy of a query's weights, in nats (uniform over n keys: ln n);
- ``max_weight``: mean of the largest weight of a query;
- ``local_mass``: mean weight on the 3 tokens just before the query.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from taylorshift.data import get_task
from taylorshift.models import load_model
from taylorshift.train.checkpoint import latest_checkpoint

FIRST_QUERY = 64  # queries with fewer keys are left out (their weights are flat anyway)


def weights(kernel, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Causal attention weights (B, H, N, N) of ``kernel`` from its inputs, by definition."""
    n, d = q.shape[-2], q.shape[-1]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    if kernel.name == "softmax":
        s = (q @ k.transpose(-2, -1) / math.sqrt(d)).masked_fill(~causal, float("-inf"))
        return s.softmax(-1)
    if kernel.name == "taylorshift":
        if kernel.normalize:
            q = kernel.tau * q / q.norm(dim=-1, keepdim=True)
            k = k / k.norm(dim=-1, keepdim=True)
            s = q @ k.transpose(-2, -1)
        else:
            s = q @ k.transpose(-2, -1) / math.sqrt(d)
        w = (1 + s + s * s / 2) * causal
    elif kernel.name == "linear":
        phi = torch.nn.functional.elu
        w = (phi(q) + 1) @ (phi(k) + 1).transpose(-2, -1) * causal
    else:
        raise ValueError(f"kernel {kernel.name!r} is not covered here")
    return w / w.sum(-1, keepdim=True)


@torch.no_grad()
def head_stats(run: Path, windows: int) -> dict:
    checkpoint = latest_checkpoint(run)
    if checkpoint is None:
        raise SystemExit(f"{run} holds no checkpoint")
    model = load_model(checkpoint / "model.safetensors").eval()
    config = json.loads((run / "config.json").read_text())
    options = dict(config["data"]["options"])
    data = get_task(config["data"]["task"]).build("val", **options)
    step = max(1, len(data) // windows)
    tokens = torch.stack([data[i][0] for i in range(0, step * windows, step)])
    inputs: list[torch.Tensor] = []
    hooks = [
        b.attn.register_forward_hook(lambda m, a, o: inputs.append(a[0])) for b in model.blocks
    ]
    model(tokens)
    for h in hooks:
        h.remove()
    layers = []
    for block, x in zip(model.blocks, inputs, strict=True):
        attn = block.attn
        q, k, _ = attn.heads_in(x, x, None, True)
        a = weights(attn.kernel, q, k)[..., FIRST_QUERY:, :]  # (B, H, N', N)
        rows = torch.arange(FIRST_QUERY, a.shape[-1])
        local = sum(a[..., torch.arange(len(rows)), rows - j] for j in (1, 2, 3))
        layers.append(
            {
                "entropy": (-(a.clamp_min(1e-30).log() * a).sum(-1)).mean((0, 2)).tolist(),
                "max_weight": a.max(-1).values.mean((0, 2)).tolist(),
                "local_mass": local.mean((0, 2)).tolist(),
            }
        )
    return {"run": str(run), "checkpoint": checkpoint.name, "layers": layers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--windows", type=int, default=64)
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = [head_stats(run, args.windows) for run in args.runs]
    for r in results:
        print(r["run"])
        for i, layer in enumerate(r["layers"]):
            fmt = {key: ", ".join(f"{v:.2f}" for v in values) for key, values in layer.items()}
            print(
                f"  layer {i}: entropy {fmt['entropy']} | max weight {fmt['max_weight']} | "
                f"mass on the 3 previous tokens {fmt['local_mass']}"
            )
    if args.json:
        from taylorshift.bench.files import write_json

        write_json(args.json, results)


if __name__ == "__main__":
    main()
