"""The decoding step before and after the one-gather features and the elementwise update.

Before (commit c3559f3): φ(x) of a few tokens is the (d, d) outer product, a gather of its
upper triangle and a concatenation with [x, 1]; the state update is a ``baddbmm_`` with an
inner dimension of 1; the readout a broadcast ``matmul``. After: the outer product of
[x, 1] with itself and one gather; ``addcmul_``; ``bmm``. The old step is restored by
patching ``decode._decode_one`` and ``features.features`` with the copies below; rounds
alternate old and new on the same model and caches, beside SDPA with a key/value cache and
linear attention's state. Usage: python benchmarks/decode_cpu/one-gather/paired.py
"""

from __future__ import annotations

import copy
import statistics
import time

import torch

from taylorshift.models import CausalLM, CausalLMConfig
from taylorshift.ops.taylor_shift import decode, features
from taylorshift.ops.taylor_shift.decode import TaylorShiftState, _query_key_factor
from taylorshift.ops.taylor_shift.features import NORM_EPS, pair_index, state_weights

NEW_FEATURES = features.features


def old_features(x):
    """``features`` of c3559f3 for a few tokens: gather, then a concatenation."""
    d = x.shape[-1]
    if x.numel() > features.GATHER_MAX_ELEMENTS:
        return NEW_FEATURES(x)
    a, b = pair_index(d, x.device)
    outer = (x.unsqueeze(-1) * x.unsqueeze(-2)).flatten(-2)
    quad = outer[..., a * d + b]
    return torch.cat([quad, x, torch.ones_like(x[..., :1])], dim=-1)


def old_decode_one(query, key, value, state, key_mask, tau, normalize, inplace):
    """``_decode_one`` of c3559f3."""
    b, h, _, d = query.shape
    dv = value.shape[-1]
    sums, count = state.sums, state.count
    cd = sums.dtype
    if not inplace:
        sums, count = sums.clone(), count.clone()
    x = torch.cat([query, key], dim=2).to(cd)
    if normalize:
        x = x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(NORM_EPS)
    phi = old_features(x * _query_key_factor(tau, x))
    v = torch.cat([value.to(cd), torch.ones_like(value[..., :1], dtype=cd)], dim=-1)
    if key_mask is not None:
        real = key_mask.to(cd)
        v = v * real.unsqueeze(-1)
        count.add_(real.squeeze(-1))
    else:
        count.add_(1.0)
    n = sums.shape[-2]
    sums.view(b * h, n, dv + 1).baddbmm_(
        phi[:, :, 1:].reshape(b * h, n, 1), v.reshape(b * h, 1, dv + 1)
    )
    weights = state_weights(d, cd, query.device).squeeze(-1)
    y_prime = (phi[:, :, :1] * weights) @ sums
    nom, den = y_prime[..., :dv], y_prime[..., dv:]
    n_i = count[:, :, None, None]
    scale = torch.sqrt(n_i / d) / den if normalize else 1.0 / den
    if key_mask is not None:
        scale = torch.where(n_i > 0, scale, 0.0)
    out = (nom * scale).to(query.dtype)
    return out, state if inplace else TaylorShiftState(sums, count)


NEW = (decode._decode_one, NEW_FEATURES)
OLD = (old_decode_one, old_features)


def use(parts):
    decode._decode_one, features.features = parts


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
                caches = model.new_caches("kv" if kernel == "softmax" else "state")
                model.decode(torch.randint(0, 258, (1, n)), caches, torch.arange(n)[None])
                setups[kernel] = (model, caches)
            token, pos = torch.randint(0, 258, (1, 1)), torch.full((1, 1), n)
            model, caches = setups["taylorshift"]
            use(OLD)
            out_old = model.decode(token, copy.deepcopy(caches), pos)
            use(NEW)
            out_new = model.decode(token, copy.deepcopy(caches), pos)
            print(f"{n} | old vs new logits, max |diff| | {(out_old - out_new).abs().max():.2e}")
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
        for num, den in (("taylorshift old", "taylorshift new"), ("taylorshift new", "softmax kv")):
            ratio = [a / b for a, b in zip(times[num], times[den], strict=True)]
            q1, _, q3 = statistics.quantiles(ratio, n=4)
            print(
                f"{n} | {num} / {den}, paired by round | "
                f"{statistics.median(ratio):.2f}x ({q1:.2f}–{q3:.2f})"
            )


if __name__ == "__main__":
    main()
