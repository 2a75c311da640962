"""Causal calls with a state in and out under torch.compile: the CPU kernel's custom ops
against the PyTorch causal form that traced calls ran before, and the eager kernel.

    python benchmarks/compile_cpu/state/paired.py > benchmarks/compile_cpu/state/paired.txt

B 1, H 4, dv = d, float32, 2 threads, a prefix state of 64 keys in, the state after the
block out (``initial_state=``, ``output_final_state=True``): a prompt's prefill under
``torch.inference_mode()`` (forward) and a segment of a longer sequence in training
(forward + backward, gradients of q, k, v and the state's sums). Each point: 20 rounds
in shuffled order (benchmarks/op_cpu/workspace/ab.py), medians and the ratios paired by
round. "compiled before" is what a traced call ran until this change: the PyTorch causal
form (``causal_efficient_taylor_shift``) compiled whole, by Inductor as the others.
"""

from __future__ import annotations

import platform
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "op_cpu" / "workspace"))
from ab import shuffled_rounds

from taylorshift import TaylorShiftState, taylor_shift_attention
from taylorshift.ops.taylor_shift.efficient_causal import causal_efficient_taylor_shift

POINTS = [(16, 512), (16, 4096), (32, 512), (32, 2048), (64, 512), (64, 2048)]
ROUNDS = 20


def kernel(q, k, v, sums):
    start = TaylorShiftState.from_sums(sums)
    return taylor_shift_attention(
        q, k, v, is_causal=True, initial_state=start, output_final_state=True
    )


def torch_form(q, k, v, sums):
    start = TaylorShiftState.from_sums(sums)
    return causal_efficient_taylor_shift(
        q, k, v, None, 1.0, None, True, initial_state=start, output_final_state=True
    )


def prefix(d: int) -> torch.Tensor:
    """The sums after 64 random keys (``TaylorShiftState.sums``), float32."""
    k0, v0 = torch.randn(1, 4, 64, d), torch.randn(1, 4, 64, d)
    _, state = taylor_shift_attention(
        torch.zeros_like(k0), k0, v0, is_causal=True, output_final_state=True
    )
    return state.sums


def timed_call(fn, backward: bool, leaves: list, g: torch.Tensor):
    """One call of ``fn`` on (q, k, v, sums): under inference mode, or with the gradients."""
    plain = [t.detach() for t in leaves]

    def forward():
        with torch.inference_mode():
            fn(*plain)

    def forward_backward():
        y, _ = fn(*leaves)
        torch.autograd.grad(y, leaves, g)

    return forward_backward if backward else forward


def main() -> None:
    torch.set_num_threads(2)
    torch.manual_seed(0)
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"2 threads, B 1, H 4, dv = d, float32, {ROUNDS} shuffled rounds")  # fmt: skip
    for d, n in POINTS:
        torch._dynamo.reset()  # each point compiles anew (no recompile limit reached)
        fns = {
            "eager kernel": kernel,
            "compiled (custom ops)": torch.compile(kernel, fullgraph=True, dynamic=False),
            "compiled before (PyTorch form)": torch.compile(
                torch_form, fullgraph=True, dynamic=False
            ),
        }
        q, k, v, g = (torch.randn(1, 4, n, d) for _ in range(4))
        sums = prefix(d)
        leaves = [t.requires_grad_() for t in (q, k, v, sums.clone())]
        for backward in (False, True):
            calls = {name: timed_call(fn, backward, leaves, g) for name, fn in fns.items()}
            for call in (*calls.values(), *calls.values()):  # compilation, warm-up
                call()
            times = shuffled_rounds(calls, ROUNDS)
            ms = {name: round(statistics.median(ts) * 1e3, 3) for name, ts in times.items()}
            new = times["compiled (custom ops)"]
            ratios = {
                name: statistics.median(a / b for a, b in zip(times[name], new, strict=True))
                for name in ("compiled before (PyTorch form)", "eager kernel")
            }
            pass_name = "forward + backward" if backward else "forward (prefill)"
            print(f"d = {d}, N = {n}, {pass_name}: {ms} ms; paired ratios to the compiled "
                  f"custom ops: before {ratios['compiled before (PyTorch form)']:.2f}x, "
                  f"eager {ratios['eager kernel']:.2f}x", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
