"""Prompt prefill and segments before and after the CPU causal kernel took states in and
out, timed in one process.

Before: a causal call with a state (``taylor_shift_decode``'s prompt, ``initial_state`` /
``output_final_state`` of ``taylor_shift_attention``) ran the PyTorch chunked sweep. After:
one call of the CPU causal kernel (``ops/cpu/efficient_causal.state_forward``). The old
path is restored by making the router find no kernel for such calls
(``stateful_cpu_form`` -> None: exactly the code the calls ran before); rounds alternate
old and new on the same inputs, so drift of a shared machine hits both alike.

Three cases: the op (``taylor_shift_decode`` on a prompt of N tokens, B 1, H 8); a
segment of a sequence with gradients (``taylor_shift_attention`` from a state, forward
+ backward, as sequence parallelism and training on segments run it); and the 4-layer
``CausalLM`` of ../report.md (dim 256, 8 heads of 32) prefilling its state caches, with
SDPA filling a key/value cache beside it. Usage:
python benchmarks/decode_cpu/prefill/paired.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from functools import partial

import torch

from taylorshift import TaylorShiftState, taylor_shift_attention
from taylorshift.models import CausalLM, CausalLMConfig
from taylorshift.ops.taylor_shift import decode, interface
from taylorshift.ops.taylor_shift.decode import taylor_shift_decode

ROUTERS = {"new": decode.stateful_cpu_form}


def use(path: str) -> None:
    """Route state calls as ``path`` does: "old" never finds the kernel."""
    router = ROUTERS["new"] if path == "new" else (lambda *a, **k: None)
    decode.stateful_cpu_form = interface.stateful_cpu_form = router


def timed(call, repeats: int) -> float:
    """Median ms of ``repeats`` calls after one warm-up."""
    call()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def summary(name: str, old: list[float], new: list[float]) -> str:
    ratio = [o / n for o, n in zip(old, new, strict=True)]
    q1, _, q3 = statistics.quantiles(ratio, n=4)
    return (
        f"| {name} | {statistics.median(old):.3f} | {statistics.median(new):.3f} | "
        f"{statistics.median(ratio):.2f}x ({q1:.2f}-{q3:.2f}) |"
    )


def op_cases(rounds: int) -> None:
    print("\nThe op: taylor_shift_decode on a prompt, B 1, H 8, dv = d, float32 (ms)\n")
    print("| d, N | old (PyTorch sweep) | new (kernel) | old / new, paired by round (q1-q3) |")
    print("|---|---:|---:|---:|")
    for d, n in (
        (32, 4),
        (32, 16),
        (32, 64),
        (32, 512),
        (32, 2048),
        (32, 8192),
        (64, 2048),
        (16, 2048),
    ):
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 8, n, d, generator=g) for _ in range(3))
        times = {"old": [], "new": []}
        repeats = max(3, 1024 // n)  # (short prompts: more calls a round, for the timer)
        for _ in range(rounds):
            for path in ("old", "new"):
                use(path)
                times[path].append(timed(partial(taylor_shift_decode, q, k, v), repeats))
        use("new")
        print(summary(f"{d}, {n:,}", times["old"], times["new"]))


def segment_cases(rounds: int) -> None:
    print(
        "\nA segment with gradients: taylor_shift_attention(..., initial_state=) forward + "
        "backward, q, k, v and the state's sums requiring grad, B 1, H 8, dv = d (ms)\n"
    )
    print("| d, N | old (PyTorch form) | new (kernel) | old / new, paired by round (q1-q3) |")
    print("|---|---:|---:|---:|")
    for d, n in ((16, 2048), (32, 2048), (64, 2048)):
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 8, n, d, generator=g, requires_grad=True) for _ in range(3))
        with torch.no_grad():
            _, before = taylor_shift_attention(q, k, v, is_causal=True, output_final_state=True)
        sums = before.sums.clone().requires_grad_()
        state = TaylorShiftState(sums, before.count)

        def step(q=q, k=k, v=v, state=state):
            out = taylor_shift_attention(q, k, v, is_causal=True, initial_state=state)
            out.sum().backward()

        times = {"old": [], "new": []}
        for _ in range(rounds):
            for path in ("old", "new"):
                use(path)
                times[path].append(timed(step, 3))
        use("new")
        print(summary(f"{d}, {n:,}", times["old"], times["new"]))


def model_cases(rounds: int) -> None:
    print("\nThe model: CausalLM dim 256, depth 4, 8 heads of 32, prefill of N tokens (ms)\n")
    print("| N | old (PyTorch sweep) | new (kernel) | old / new (q1-q3) | SDPA, key/value cache |")
    print("|---|---:|---:|---:|---:|")
    torch.manual_seed(0)
    config = CausalLMConfig(vocab_size=258, dim=256, depth=4, num_heads=8)
    ours = CausalLM(config).eval()
    softmax = CausalLM(CausalLMConfig(**{**vars(config), "attn_kernel": "softmax"})).eval()
    for n in (512, 2048, 8192):
        tokens, positions = torch.randint(0, 258, (1, n)), torch.arange(n)[None]

        def prefill(model, cache, tokens=tokens, positions=positions):
            return lambda: model.decode(tokens, model.new_caches(cache), positions)

        times = {"old": [], "new": [], "sdpa": []}
        with torch.inference_mode():
            for _ in range(rounds):
                for path in ("old", "new"):
                    use(path)
                    times[path].append(timed(prefill(ours, "state"), 1))
                use("new")
                times["sdpa"].append(timed(prefill(softmax, "kv"), 1))
        line = summary(f"{n:,}", times["old"], times["new"])
        print(f"{line} {statistics.median(times['sdpa']):.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}; medians of {args.rounds} "
        "alternating rounds"
    )
    op_cases(args.rounds)
    segment_cases(args.rounds)
    model_cases(args.rounds)


if __name__ == "__main__":
    main()
