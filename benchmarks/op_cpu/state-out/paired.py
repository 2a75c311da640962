"""A causal call that returns its final state (``output_final_state=True``) in the PyTorch
causal form: the state the chunked sweep builds anyway, continued over the last chunk
(now), against a second pass over every key of the block (``key_state``) after a sweep
that stopped short, which such calls ran before.

    python benchmarks/op_cpu/state-out/paired.py > benchmarks/op_cpu/state-out/paired.txt

The PyTorch form runs these calls where no fused kernel takes them: grouped key/value
heads with a state, float64, ``TAYLORSHIFT_CPU_KERNELS=off``, a GPU without Triton. B 1,
H 4 (grouped: 4 query heads on 1 key/value head), dv = d, float32, 2 threads, a prefix
state of 64 keys in. "Before" is the earlier composition rebuilt here from the same
library's pieces (``efficient.key_state`` and ``state.final_state``). Forward under
``torch.inference_mode()``, and forward + backward of a loss on the output and on the
final state's sums (gradients of q, k, v and the prefix's sums). Each point: 15 rounds in
shuffled order (benchmarks/op_cpu/workspace/ab.py), medians and the ratio paired by round.
"""

from __future__ import annotations

import platform
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workspace"))
from ab import shuffled_rounds

from taylorshift import TaylorShiftState, taylor_shift_attention
from taylorshift.ops.taylor_shift.efficient import key_state
from taylorshift.ops.taylor_shift.efficient_causal import (
    DEFAULT_CAUSAL_CHUNK,
    CausalEfficientTaylorShiftFunction,
    causal_efficient_taylor_shift,
)
from taylorshift.ops.taylor_shift.features import split_factor
from taylorshift.ops.taylor_shift.state import final_state, real_keys

# (d, N, key/value heads)
POINTS = [(16, 512, 4), (16, 2048, 4), (32, 512, 4), (32, 2048, 4), (64, 512, 4),
          (64, 2048, 4), (32, 2048, 1)]  # fmt: skip
ROUNDS = 15


def before(q, k, v, sums, count):
    """The composition before this change: the sweep without a state out, then key_state."""
    chunk = DEFAULT_CAUSAL_CHUNK
    t, f = split_factor(1.0, None, True, q.shape[-1])
    out = CausalEfficientTaylorShiftFunction.apply(q, k, v, t, f, True, None, chunk, sums, count)
    added = key_state(k, v, None, True, chunk)
    real = real_keys(None, k.shape[0], k.shape[1], k.shape[2], added.dtype, added.device)
    added, real = sums.detach() + added, count.detach() + real
    return out, final_state(added, real, k, v, None, True, sums, chunk)


def now(q, k, v, sums, count):
    state = TaylorShiftState(sums, count)
    return causal_efficient_taylor_shift(
        q, k, v, None, 1.0, None, True, initial_state=state, output_final_state=True
    )


def timed(fn, backward: bool, leaves: list, count, g, g_sums):
    plain = [t.detach() for t in leaves]

    def forward():
        with torch.inference_mode():
            fn(*plain, count)

    def forward_backward():
        y, state = fn(*leaves, count)
        loss = (y * g).sum() + (state.sums * g_sums).sum()
        torch.autograd.grad(loss, leaves)

    return forward_backward if backward else forward


def main() -> None:
    torch.set_num_threads(2)
    torch.manual_seed(0)
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"2 threads, B 1, H 4, dv = d, float32, {ROUNDS} shuffled rounds")  # fmt: skip
    for d, n, kv_heads in POINTS:
        k0, v0 = torch.randn(1, kv_heads, 64, d), torch.randn(1, kv_heads, 64, d)
        _, start = taylor_shift_attention(
            torch.zeros(1, kv_heads, 64, d), k0, v0, is_causal=True, output_final_state=True
        )
        q, g = torch.randn(1, 4, n, d), torch.randn(1, 4, n, d)
        k, v = torch.randn(1, kv_heads, n, d), torch.randn(1, kv_heads, n, d)
        leaves = [t.requires_grad_() for t in (q, k, v, start.sums.clone())]
        g_sums = torch.randn_like(start.sums)
        got, want = now(*leaves, start.count), before(*leaves, start.count)
        assert torch.allclose(got[1].sums, want[1].sums, rtol=1e-4, atol=1e-3)
        fns = {"before": before, "now": now}
        for backward in (False, True):
            calls = {
                name: timed(fn, backward, leaves, start.count, g, g_sums)
                for name, fn in fns.items()
            }
            for call in (*calls.values(), *calls.values()):  # warm-up
                call()
            times = shuffled_rounds(calls, ROUNDS)
            ms = {name: round(statistics.median(ts) * 1e3, 3) for name, ts in times.items()}
            ratio = statistics.median(
                a / b for a, b in zip(times["before"], times["now"], strict=True)
            )
            pass_name = "forward + backward" if backward else "forward"
            heads = "" if kv_heads == 4 else f", {kv_heads} key/value head"
            print(f"d = {d}, N = {n}{heads}, {pass_name}: {ms} ms; before / now "
                  f"{ratio:.2f}x", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
