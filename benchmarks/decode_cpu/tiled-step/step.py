"""Time one decoding step of one attention layer, three ways, in one process:

- ``kernel``: ``ts_decode_step`` called directly (the C kernel alone);
- ``decode_token``: the op's step on the layer caches' path (wrapper + kernel);
- ``layer state`` / ``layer kv N``: ``kernel.decode`` of the first layer of the
  ``bench decode`` model (CausalLM dim 256, 8 heads of 32), TaylorShift with its state
  and softmax (SDPA) with a key/value cache of N tokens, the cache put back after each call.

Every case is timed in turn in each of ``--rounds`` rounds; printed: per case the median
and least of its round medians (µs). Run it with the tree to measure on PYTHONPATH.
"""

import argparse
import json
import statistics
import time

import torch

from taylorshift.models import CausalLM, CausalLMConfig
from taylorshift.ops.cpu.build import library
from taylorshift.ops.taylor_shift.decode import decode_token, taylor_shift_decode

p = argparse.ArgumentParser()
p.add_argument("--contexts", type=int, nargs="+", default=[512, 1024, 4096])
p.add_argument("--rounds", type=int, default=15)
p.add_argument("--json")
args = p.parse_args()
torch.set_num_threads(2)
h, d = 8, 32
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, h, 1, d, generator=g) for _ in range(3))
_, state = taylor_shift_decode(*(torch.randn(1, h, 64, d, generator=g) for _ in range(3)))
lib = library()


def kernel():
    lib.ts_decode_step(h, 1, d, d, q.data_ptr(), k.data_ptr(), v.data_ptr(), None, 1.0, None,
                       1, 1e-6, state.sums.data_ptr(), state.count.data_ptr(),
                       out.data_ptr(), 2)  # fmt: skip


out = torch.empty(h, d)
cases = {"kernel": kernel, "decode_token": lambda: decode_token(q, k, v, state)}


def layer_step(kernel_name, cache_kind, context):
    torch.manual_seed(0)
    config = CausalLMConfig(vocab_size=258, dim=256, depth=1, num_heads=h,
                            attn_kernel=kernel_name)  # fmt: skip
    model = CausalLM(config).eval()
    caches = model.new_caches(cache_kind)
    with torch.inference_mode():
        prompt = torch.randint(0, 258, (1, context), generator=g)
        model.decode(prompt, caches, torch.arange(context).expand(1, context))
    attn = next(m for m in model.modules() if hasattr(m, "kernel") and hasattr(m, "decode"))
    cache, saved = caches[0], dict(vars(caches[0]))

    def step():
        attn.kernel.decode(q, k, v, None, cache)
        vars(cache).update(saved)

    return step


cases["layer state"] = layer_step("taylorshift", "state", 64)
for n in args.contexts:
    cases[f"layer kv {n}"] = layer_step("softmax", "kv", n)
medians = {c: [] for c in cases}
with torch.inference_mode():
    for _ in range(args.rounds):
        for name, fn in cases.items():
            for _ in range(20):
                fn()
            times = []
            for _ in range(7):
                t = time.perf_counter()
                for _ in range(30):
                    fn()
                times.append((time.perf_counter() - t) / 30 * 1e6)
            medians[name].append(statistics.median(times))
for name, m in medians.items():
    print(f"{name:14s} median {statistics.median(m):7.1f} us  least {min(m):7.1f} us")
if args.json:
    with open(args.json, "w") as f:
        json.dump(medians, f, indent=1)
