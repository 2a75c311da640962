"""The decoding step before and after the lean single-token path, timed in one process.

The step of commit 185ecd6 (`_decode_one` with two feature maps, state weights rebuilt per
call, `torch.broadcast_shapes` in the checks) is restored by patching those three pieces
back in; rounds alternate old and new on the same model and caches, so drift of a shared
machine hits both alike. Usage: python benchmarks/decode_cpu/lean-step/paired.py
"""

from __future__ import annotations

import copy
import statistics
import time

import torch

from taylorshift.models import CausalLM, CausalLMConfig
from taylorshift.ops.taylor_shift import checks, decode, features
from taylorshift.ops.taylor_shift.efficient import finish_outputs
from taylorshift.ops.taylor_shift.features import scaled_key, scaled_query


def old_decode_one(query, key, value, state, key_mask, tau, normalize, inplace):
    """`_decode_one` as of 185ecd6."""
    b, h, _, d = query.shape
    dv = value.shape[-1]
    sums, count = state.sums, state.count
    cd = sums.dtype
    k = scaled_key(key.to(cd), normalize)
    v = torch.cat([value.to(cd), torch.ones_like(value[..., :1], dtype=cd)], dim=-1)
    added = 1.0
    if key_mask is not None:
        real = key_mask.to(cd)
        v = v * real.unsqueeze(-1)
        added = real.squeeze(-1)
    if not inplace:
        sums, count = sums.clone(), count.clone()
    n = sums.shape[-2]
    sums.view(b * h, n, dv + 1).baddbmm_(
        features.features(k).view(b * h, n, 1), v.reshape(b * h, 1, dv + 1)
    )
    count.add_(added)
    q = scaled_query(query.to(cd), tau, normalize)
    weights = features._state_weights(d, cd, query.device)  # rebuilt per call
    y_prime = (features.features(q) * weights.squeeze(-1)) @ sums
    out, _ = finish_outputs(y_prime, count.unsqueeze(-1), normalize, d)
    return out.to(query.dtype), state if inplace else decode.TaylorShiftState(sums, count)


def old_broadcasts_to(shape, target):
    try:
        return len(shape) <= len(target) and torch.broadcast_shapes(shape, target) == target
    except RuntimeError:
        return False


NEW = (decode._decode_one, checks._broadcasts_to)
OLD = (old_decode_one, old_broadcasts_to)


def use(parts):
    decode._decode_one, checks._broadcasts_to = parts


def main(context=(512, 1024), rounds=15, steps=40):
    torch.manual_seed(0)
    config = CausalLMConfig(vocab_size=258, dim=256, depth=4, num_heads=8)
    models = {
        kernel: CausalLM(config.__class__(**{**vars(config), "attn_kernel": kernel})).eval()
        for kernel in ("taylorshift", "softmax", "linear")
    }
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("context | case | median step ms | (q1–q3)")
    for n in context:
        times = {}
        with torch.inference_mode():
            setups = {}
            for kernel, model in models.items():
                cache = "kv" if kernel == "softmax" else "state"
                caches = model.new_caches(cache)
                model.decode(torch.randint(0, 258, (1, n)), caches, torch.arange(n)[None])
                setups[kernel] = (model, caches)
            token, pos = torch.randint(0, 258, (1, 1)), torch.full((1, 1), n)
            cases = [
                ("taylorshift old", "taylorshift", OLD),
                ("taylorshift new", "taylorshift", NEW),
                ("softmax kv", "softmax", NEW),
                ("linear state", "linear", NEW),
            ]
            for _ in range(rounds):
                for name, kernel, parts in cases:
                    use(parts)
                    model, caches = setups[kernel]
                    snapshot = [copy.deepcopy(vars(c)) for c in caches]
                    model.decode(token, caches, pos)  # warm
                    t0 = time.perf_counter()
                    for _ in range(steps):
                        model.decode(token, caches, pos)
                    times.setdefault(name, []).append((time.perf_counter() - t0) / steps * 1e3)
                    for c, saved in zip(caches, snapshot, strict=True):  # the same N each round
                        vars(c).update(saved)
            use(NEW)
        for name, ts in times.items():
            q = statistics.quantiles(ts, n=4)
            print(f"{n} | {name} | {statistics.median(ts):.3f} | ({q[0]:.3f}–{q[2]:.3f})")
        old, new = times["taylorshift old"], times["taylorshift new"]
        ratio = [o / w for o, w in zip(old, new, strict=True)]
        q1, _, q3 = statistics.quantiles(ratio, n=4)
        print(
            f"{n} | old / new, paired by round | "
            f"{statistics.median(ratio):.2f}x ({q1:.2f}–{q3:.2f})"
        )


if __name__ == "__main__":
    main()
