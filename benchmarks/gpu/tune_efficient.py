#!/usr/bin/env python3
"""The fused efficient kernels' launch settings side by side, in one process on one GPU.

    python benchmarks/gpu/tune_efficient.py OUT_DIR [--deadline-s 140]   # device tool
    python benchmarks/gpu/tune_efficient.py OUT_DIR --dry-run            # CPU, interpreted

Configurations (``configs`` in main): ``fp32-dots`` is the kernels as they were before the
16-bit path (every dot in float32 "ieee", 32 tokens per program, 4 warps, no token
splits: the first GPU run's kernels); the others set the 16-bit path's ``LAUNCH`` entry
and the state kernel's token splits. For each: the error at one N against the float64
torch form (outputs) and against ``fp32-dots`` (outputs and gradients), beside the error
of the plain reference run in the same dtype (SPEC §8); then the time per call, forward
and forward + backward, with SDPA and the direct kernels on the same inputs. The steps run
in order of value and stop at ``--deadline-s`` (a lent GPU gives minutes); every result
is written to OUT_DIR/tune.json at once and OUT_DIR/tune.md at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

START = time.monotonic()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--deadline-s", type=float, default=140.0)
    args = parser.parse_args()
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    from taylorshift import naive_taylor_shift_attention, taylor_shift_attention
    from taylorshift.bench.measure import time_call
    from taylorshift.ops.triton import efficient as te

    args.out.mkdir(parents=True, exist_ok=True)
    dry = args.dry_run
    device = "cpu" if dry else "cuda"
    dtype = torch.float16 if dry else torch.bfloat16  # the interpreter has no bfloat16
    low_kind = te.dot_kind(dtype)
    b, h, d = (1, 2, 16) if dry else (4, 8, 64)
    n_err, n_mid, n_long = (64, 128, 256) if dry else (4096, 16384, 65536)
    results: dict = {"dry_run": dry, "shape": dict(b=b, h=h, d=d, dv=d), "dtype": str(dtype),
                     "records": []}  # fmt: skip
    if not dry:
        p = torch.cuda.get_device_properties(0)
        results["machine"] = dict(gpu=p.name, torch=torch.__version__, cuda=torch.version.cuda)
    import triton

    results.setdefault("machine", {})["triton"] = triton.__version__

    def save():
        tmp = args.out / "tune.json.tmp"
        tmp.write_text(json.dumps(results, indent=1) + "\n")
        os.replace(tmp, args.out / "tune.json")

    def left() -> float:
        return args.deadline_s - (time.monotonic() - START)

    base = dict(te.LAUNCH[low_kind])
    configs = {
        "fp32-dots": None,
        "16-bit": dict(base),
        "16-bit, no splits": dict(base),
        "16-bit, block_m 128, 8 warps": dict(base, block_m=128, token_warps=8),
        "16-bit, block_m 32": dict(base, block_m=32),
        "16-bit, state 8 warps": dict(base, state_warps=8),
        "16-bit, block_n 128": dict(base, block_n=128),
    }

    def use(name: str) -> None:
        """Set the module's launch settings (and dot kind) for configuration ``name``."""
        te.LAUNCH[low_kind] = dict(base) if configs[name] is None else configs[name]
        te.dot_kind = (lambda dt: te.DOT_FP32) if configs[name] is None else real_dot_kind
        te.SPLIT_MIN_TOKENS = 10**12 if name in ("fp32-dots", "16-bit, no splits") else split0

    real_dot_kind, split0 = te.dot_kind, te.SPLIT_MIN_TOKENS
    gen = torch.Generator(device=device).manual_seed(0)

    def inputs(n: int, grad: bool, heads: int = h):
        xs = [torch.randn(b, heads, n, d, device=device, generator=gen).to(dtype)
              for _ in range(3)]  # fmt: skip
        return [x.requires_grad_(grad) for x in xs]

    def efficient(q, k, v):
        return te.triton_efficient_taylor_shift(q, k, v, None, 1.0, None, True)

    impls = {
        "efficient (Triton)": efficient,
        "direct (Triton)": lambda q, k, v: taylor_shift_attention(q, k, v, mode="direct"),
        "SDPA": torch.nn.functional.scaled_dot_product_attention,
    }

    def record(**entry):
        entry["t_s"] = round(time.monotonic() - START, 1)
        results["records"].append(entry)
        print(json.dumps(entry), flush=True)
        save()

    def rel(a, e):
        a, e = a.detach().double(), e.detach().double()
        return float((a - e).norm() / e.norm().clamp_min(1e-300))

    # 1. Errors at n_err: the fp32 dots as they were, the 16-bit path, the plain reference
    # in the same dtype, each against the float64 torch form (outputs) and the 16-bit path
    # against the fp32 dots (outputs and gradients).
    q, k, v = inputs(n_err, True, heads=2)  # B·H = 8 (4 on the dry run): the float64 form is slow
    g_out = torch.randn(q.shape, device=device, generator=gen).to(dtype)
    exact = taylor_shift_attention(q.double(), k.double(), v.double(), mode="efficient")
    outs = {}
    for name in ("fp32-dots", "16-bit"):
        use(name)
        t0 = time.monotonic()
        try:
            y = efficient(q, k, v)
            gs = torch.autograd.grad(y, (q, k, v), g_out)
            if not dry:
                torch.cuda.synchronize()
        except Exception as err:  # a configuration that fails is a result
            record(step="error", config=name, n=n_err, failed=f"{type(err).__name__}: {err}"[:500])
            continue
        outs[name] = (y, gs)
        record(step="error", config=name, n=n_err, first_call_s=round(time.monotonic() - t0, 2),
               out_vs_fp64=rel(y, exact))  # fmt: skip
    ref_low = naive_taylor_shift_attention(q.detach(), k.detach(), v.detach())
    record(step="error", config="plain reference in " + str(dtype), n=n_err,
           out_vs_fp64=rel(ref_low, exact))  # fmt: skip
    del ref_low
    if len(outs) == 2:
        (y0, g0), (y1, g1) = outs["fp32-dots"], outs["16-bit"]
        record(
            step="error",
            config="16-bit vs fp32-dots",
            n=n_err,
            out=rel(y1, y0),
            grad_q=rel(g1[0], g0[0]),
            grad_k=rel(g1[1], g0[1]),
            grad_v=rel(g1[2], g0[2]),
        )
    del outs, exact

    # 2. Times: (config or impl, n, pass) in order of value, until the deadline.
    def timed(label: str, fn, n: int, backward: bool) -> None:
        if left() < 5:
            record(step="time", impl=label, n=n, backward=backward, status="deadline")
            return
        q, k, v = inputs(n, backward)
        g = torch.randn(b, h, n, d, device=device, generator=gen).to(dtype)

        def call():
            y = fn(q, k, v)
            if backward:
                torch.autograd.grad(y, (q, k, v), g)

        t0 = time.monotonic()
        try:
            call()  # compiles the kernels of this configuration
            if not dry:
                torch.cuda.synchronize()
        except Exception as err:  # out of resources, a compile error: a result
            record(step="time", impl=label, n=n, backward=backward,
                   status=f"failed: {type(err).__name__}: {err}"[:500])  # fmt: skip
            return
        first = time.monotonic() - t0
        res = time_call(call, device=device, target_s=0.05 if dry else 0.3, max_reps=10,
                        min_reps=2 if dry else 3)  # fmt: skip
        record(step="time", impl=label, n=n, backward=backward, status=res.status,
               median_ms=None if res.median_s is None else res.median_s * 1e3,
               first_call_s=round(first, 2))  # fmt: skip

    plan = []
    for n in (n_mid, n_long):
        for backward in (False, True):
            plan.append(("16-bit", n, backward))
            plan += [(impl, n, backward) for impl in ("SDPA", "direct (Triton)")]
    plan += [(name, n_mid, bw) for name in list(configs)[2:] for bw in (False, True)]
    plan += [("fp32-dots", n_err, False), ("fp32-dots", n_err, True)]
    plan += [(x, n_err, bw) for x in ("16-bit", "SDPA", "direct (Triton)") for bw in (False, True)]
    for label, n, backward in plan:
        if label in configs:
            use(label)
            timed(label, impls["efficient (Triton)"], n, backward)
        else:
            use("16-bit")
            timed(label, impls[label], n, backward)

    machine = json.dumps(results.get("machine"))
    lines = ["# Fused efficient kernels: launch settings side by side", "",
             f"Shape (B, H, d = dv) = ({b}, {h}, {d}), {dtype}; {machine}", "",
             "| step | config / impl | N | pass | result |", "|---|---|---:|---|---|"]  # fmt: skip
    for r in results["records"]:
        what = r.get("config") or r.get("impl")
        if r["step"] == "time":
            pas = "forward+backward" if r["backward"] else "forward"
            val = (f"{r['median_ms']:.3g} ms (first call {r['first_call_s']} s)"
                   if r.get("median_ms") else r["status"])  # fmt: skip
        else:
            pas = "forward+backward"
            val = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                            for k, v in r.items()
                            if k not in ("step", "config", "n", "t_s"))  # fmt: skip
        lines.append(f"| {r['step']} | {what} | {r['n']} | {pas} | {val} |".replace("\n", " "))
    tmp = args.out / "tune.md.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, args.out / "tune.md")
    print(f"wrote {args.out}/tune.md in {time.monotonic() - START:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
