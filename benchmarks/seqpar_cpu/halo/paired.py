"""What the neighbouring ranks' rows cost a sequence-parallel layer: a converted
``Attention`` with a short convolution (4 taps) or a local head (window 32) on 2 gloo
processes, its taps and window reading the neighbours' real rows (``distributed/halo.py``:
one all-gather of the rows next to each slice) against the same layer reading zeros there
(the exchange switched off: what the layer cost before, wrong at the slices' ends).

    python benchmarks/seqpar_cpu/halo/paired.py > benchmarks/seqpar_cpu/halo/paired.txt

dim 64, 4 heads (head dim 16), B 1, float32, TaylorShift efficient form, causal, forward +
backward of a loss on the output; N tokens split in 2 slices, one thread per process.
Each point: 15 rounds, the two variants in an order drawn per round (the same on both
ranks: every call is collective), the slower rank's time of each call; medians and the
ratio paired by round.
"""

from __future__ import annotations

import datetime
import functools
import os
import platform
import random
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from taylorshift.distributed import convert_sequence_parallel, sequence_shard
from taylorshift.nn import Attention
from taylorshift.nn.kernels import TaylorShiftKernel

LENGTHS = [4096, 16384]
ROUNDS = 15
WORLD = 2
VARIANTS = {
    "short conv (4 taps)": {"short_conv": 4},
    "local head (window 32)": {"kernel_args": {"mode": "efficient", "local_heads": 1,
                                              "window": 32}},
}  # fmt: skip


def _layer(settings: dict) -> Attention:
    torch.manual_seed(0)
    settings = {"kernel_args": {"mode": "efficient"}, **settings}
    return convert_sequence_parallel(Attention(64, 4, **settings))


def _switched_off(layer: Attention) -> Attention:
    """The same layer with zeros where the neighbours' rows would be."""
    if layer.neighbours is not None:  # (no padding here: the slice with zeros around it)
        layer.neighbours = lambda x, real, before, after: F.pad(x, (0, 0, before, after))
    if layer.kernel.local_heads:  # the window within the slice (the one-process attend)
        layer.kernel.attend = functools.partial(TaylorShiftKernel.attend, layer.kernel)
    return layer


def _timed(layer: Attention, x: torch.Tensor) -> float:
    """Forward + backward, the slower rank's seconds."""
    dist.barrier()
    start = time.perf_counter()
    layer(x, is_causal=True).square().mean().backward()
    took = torch.tensor([time.perf_counter() - start])
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    return took.item()


def _rank(rank: int, store: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, WORLD), rank=rank,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=300))  # fmt: skip
    lines = []
    for name, settings in VARIANTS.items():
        for n in LENGTHS:
            s = sequence_shard(n, rank, WORLD)
            x = torch.randn(1, n, 64, generator=torch.Generator().manual_seed(1))[:, s]
            layers = {"exchange": _layer(settings), "zeros": _switched_off(_layer(settings))}
            for layer in layers.values():  # warm up
                _timed(layer, x)
            rng = random.Random(n)  # the same order on both ranks
            times = {k: [] for k in layers}
            for _ in range(ROUNDS):
                order = list(layers)
                rng.shuffle(order)
                for k in order:
                    times[k].append(_timed(layers[k], x))
            ratios = [a / b for a, b in zip(times["exchange"], times["zeros"], strict=True)]
            ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
            lines.append(
                f"{name:24s} N={n:6d}  exchange {ms['exchange']:7.2f} ms"
                f"  zeros {ms['zeros']:7.2f} ms"
                f"  ratio (paired median) {statistics.median(ratios):.3f}"
                f"  [{min(ratios):.3f}, {max(ratios):.3f}]"
            )
    if rank == 0:
        with open(out, "w") as f:
            f.write("\n".join(lines) + "\n")
    dist.destroy_process_group()


def main() -> int:
    print(f"# {' '.join(sys.argv)}")
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch "
          f"{torch.__version__}, Python {platform.python_version()}, {WORLD} gloo processes "
          f"of 1 thread, {ROUNDS} rounds")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.txt")
        mp.spawn(_rank, args=(os.path.join(tmp, "store"), out), nprocs=WORLD)
        with open(out) as f:
            print(f.read(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
