#!/usr/bin/env python3
"""The fused efficient kernels' launch settings side by side, in one process on one GPU.

    python benchmarks/gpu/tune_efficient.py OUT_DIR [--deadline-s 140]   # device tool
    python benchmarks/gpu/tune_efficient.py OUT_DIR --dry-run            # CPU, interpreted

Steps, in order of value, until ``--deadline-s`` (a lent GPU gives minutes; every result is
written to OUT_DIR/tune.json at once, OUT_DIR/tune.md at the end):

1. the error of the 16-bit kernels (non-causal and causal) and of the plain reference run
   in the same dtype, outputs and gradients, against the float64 torch form (SPEC §8);
2. where the causal kernels' time goes: torch.profiler over one causal call at N = 16,384,
   forward and forward + backward (OUT_DIR/profile_causal.txt, the 25 costliest ops);
3. times per call, forward and forward + backward, beside SDPA and the direct kernels on
   the same inputs:
   - float32 first (what the H100 run left open): with TF32 allowed, the PyTorch efficient
     form, the direct kernel and the kernels' TF32 dots at 4,096 and 16,384; forward +
     backward at 512 and 1,024 (the PyTorch form against the direct kernel); causal at
     16,384 (the PyTorch form, the direct kernel, SDPA); the direct kernel's float32
     backward on other blocks (``DIRECT_FLOAT32_BACKWARD``);
   - a prompt's prefill with its state out at 16,384: the Triton causal form (which takes
     a state since 2026-11-28) against the PyTorch causal form (which ran such calls before);
   - the causal kernels at 16,384 in pieces within the state budget (since 2026-11-28) and
     with every chunk state at once (before);
   - causal at 16,384 with chunks of 128 … 1,024 tokens (the default is 256), and at
     65,536 (auto's causal GPU prior extrapolates from 16,384: direct ∝ N², efficient ∝ N);
   - float32 at 4,096 and 16,384 in exact dots: the kernels' ("ieee"), the PyTorch
     efficient form (cuBLAS), direct, SDPA;
   - at N = 4,096 and 8,192 (where direct and efficient cross: auto's GPU prior), d = 128
     at 16,384, 65,536, the launch settings (``configs`` in main: the 16-bit path's
     ``LAUNCH`` entry and the state kernel's token splits), and last ``fp32-dots``, the
     kernels before the 16-bit path (every dot in float32 "ieee" on bf16 inputs).

The first run (benchmarks/gpu_h200/tune) had an earlier plan: launch settings first; the
second (benchmarks/gpu_h200/2026-11-27/tune) had no causal chunks, profile or float32; the
third (benchmarks/gpu_h100/2026-11-28/tune) had no float32 points with TF32 beyond the
kernels' own, none at short N and none causal.
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
    from taylorshift.ops.triton import direct as td
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
        "16-bit, grad block_m 128, 8 warps": dict(base, block_m=128, token_warps=8),
        "16-bit, grad block_m 32": dict(base, block_m=32),
        "16-bit, apply block_m 64, 4 warps": dict(base, apply_block_m=64, apply_warps=4),
        "16-bit, apply 3 stages": dict(base, apply_stages=3),
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

    def inputs(n: int, grad: bool, heads: int = h, dim: int = d, dt=None):
        xs = [torch.randn(b, heads, n, dim, device=device, generator=gen).to(dt or dtype)
              for _ in range(3)]  # fmt: skip
        return [x.requires_grad_(grad) for x in xs]

    from taylorshift.ops.taylor_shift.efficient import efficient_taylor_shift
    from taylorshift.ops.taylor_shift.efficient_causal import causal_efficient_taylor_shift
    from taylorshift.ops.triton.efficient_causal import triton_causal_efficient_taylor_shift

    def efficient(q, k, v, causal=False, chunk=None):
        if causal:
            return triton_causal_efficient_taylor_shift(q, k, v, None, 1.0, None, True, chunk)
        return te.triton_efficient_taylor_shift(q, k, v, None, 1.0, None, True)

    def pytorch_efficient(q, k, v, causal=False):
        form = causal_efficient_taylor_shift if causal else efficient_taylor_shift
        return form(q, k, v, None, 1.0, None, True)

    def prefill(form):
        """A prompt's prefill: causal, the state after it asked for (the output timed)."""

        def call(q, k, v, causal=True):
            return form(q, k, v, None, 1.0, None, True, output_final_state=True)[0]

        return call

    def unpieced(q, k, v, causal=True):
        """The causal kernels with every chunk state at once (as before 2026-11-28: the
        budget lifted, where the form now sweeps pieces that fit it)."""
        from taylorshift.ops.taylor_shift import fused

        before, fused.CAUSAL_STATE_BUDGET = fused.CAUSAL_STATE_BUDGET, 1 << 62
        try:
            return efficient(q, k, v, causal=True)
        finally:
            fused.CAUSAL_STATE_BUDGET = before

    def direct(q, k, v, causal=False):
        return taylor_shift_attention(q, k, v, is_causal=causal, mode="direct")

    def tf32(fn):
        def call(*args, **kwargs):
            before = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = True
            try:
                return fn(*args, **kwargs)
            finally:
                torch.backends.cuda.matmul.allow_tf32 = before

        return call

    impls = {
        "efficient (Triton)": efficient,
        "efficient (PyTorch)": pytorch_efficient,
        "efficient (Triton, TF32)": tf32(efficient),
        "efficient (PyTorch, TF32)": tf32(pytorch_efficient),
        "direct (Triton)": direct,
        "direct (Triton, TF32)": tf32(direct),
        "16-bit, causal, unpieced": unpieced,
        "prefill, state out (Triton)": prefill(triton_causal_efficient_taylor_shift),
        "prefill, state out (PyTorch)": prefill(causal_efficient_taylor_shift),
        "SDPA": lambda q, k, v, causal=False: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=causal
        ),
    }

    def record(**entry):
        entry["t_s"] = round(time.monotonic() - START, 1)
        results["records"].append(entry)
        print(json.dumps(entry), flush=True)
        save()

    def rel(a, e):
        a, e = a.detach().double(), e.detach().double()
        return float((a - e).norm() / e.norm().clamp_min(1e-300))

    # 1. Errors at n_err (SPEC §8): the 16-bit kernels and the plain reference run in the same
    # dtype, outputs and gradients, each against the float64 torch form; non-causal and
    # causal. (The float32-dot kernels compile slowly: they come last, step 3.)
    q, k, v = inputs(n_err, True, heads=2)  # B·H = 8 (4 on the dry run): the float64 form is slow
    g_out = torch.randn(q.shape, device=device, generator=gen).to(dtype)
    use("16-bit")
    for causal in (False, True):
        if left() < 20:
            break
        leaves64 = [x.detach().double().requires_grad_() for x in (q, k, v)]
        exact = taylor_shift_attention(*leaves64, is_causal=causal, mode="efficient")
        g_exact = torch.autograd.grad(exact, leaves64, g_out.double())
        entry: dict = {"step": "error", "config": "16-bit" + (", causal" if causal else ""),
                       "n": n_err}  # fmt: skip
        for who, fn in (("kernel", lambda *x, c=causal: efficient(*x, causal=c)),
                        ("reference", lambda *x, c=causal: naive_taylor_shift_attention(
                            *x, None, c))):  # fmt: skip
            t0 = time.monotonic()
            try:
                y = fn(q, k, v)
                gs = torch.autograd.grad(y, (q, k, v), g_out)
            except Exception as err:  # a failure is a result
                entry[f"{who}_failed"] = f"{type(err).__name__}: {err}"[:300]
                continue
            entry[f"{who}_out"] = rel(y, exact)
            for name, a, e in zip("qkv", gs, g_exact, strict=True):
                entry[f"{who}_grad_{name}"] = rel(a, e)
            if who == "kernel":
                entry["first_call_s"] = round(time.monotonic() - t0, 2)
        record(**entry)
        del exact, g_exact, leaves64

    # 2. Where the causal kernels' time goes: the costliest ops of one call, each pass.
    profile_causal(args.out / "profile_causal.txt", efficient, inputs, n_mid, dry, left)

    # 3. Times: (config or impl, n, pass, d, causal, dtype) in order of value, until the
    # deadline.
    def timed(label: str, fn, n: int, backward: bool, dim: int = d, causal: bool = False,
              dt=None):  # fmt: skip
        where = dict(impl=label, n=n, backward=backward, d=dim, causal=causal,
                     dtype=str(dt or dtype).removeprefix("torch."))  # fmt: skip
        if left() < 5:
            record(step="time", **where, status="deadline")
            return
        q, k, v = inputs(n, backward, dim=dim, dt=dt)
        g = torch.randn((*q.shape[:-1], dim), device=device, generator=gen).to(q.dtype)

        def call():
            y = fn(q, k, v, causal=causal)
            if backward:
                torch.autograd.grad(y, (q, k, v), g)

        t0 = time.monotonic()
        try:
            call()  # compiles the kernels of this configuration
            if not dry:
                torch.cuda.synchronize()
        except Exception as err:  # out of resources, a compile error: a result
            record(step="time", **where, status=f"failed: {type(err).__name__}: {err}"[:500])
            return
        first = time.monotonic() - t0
        res = time_call(call, device=device, target_s=0.05 if dry else 0.3, max_reps=10,
                        min_reps=2 if dry else 3)  # fmt: skip
        record(step="time", **where, status=res.status,
               median_ms=None if res.median_s is None else res.median_s * 1e3,
               first_call_s=round(first, 2))  # fmt: skip

    for chunk in CAUSAL_CHUNKS:
        impls[f"16-bit, chunk {chunk}"] = lambda q, k, v, causal=True, c=chunk: efficient(
            q, k, v, causal=True, chunk=c
        )
    fp32 = torch.float32
    trio = ("16-bit", "SDPA", "direct (Triton)")
    plan = []  # (label, n, backward, d, causal, dtype or None)
    # float32 routing (the questions the H100 run left, benchmarks/gpu_h100/2026-11-28):
    # with TF32 allowed, the PyTorch efficient form and the direct kernel beside the
    # kernels' TF32 dots; forward + backward at short N, where auto's float32 switch was
    # extrapolated (GPU_FLOAT32_PRIOR); causal float32, which takes the PyTorch form
    tf32_impls = ("efficient (PyTorch, TF32)", "direct (Triton, TF32)", "efficient (Triton, TF32)")
    plan += [(x, n, bw, d, False, fp32) for n in (n_err, n_mid) for bw in (False, True)
             for x in tf32_impls]  # fmt: skip
    plan += [(x, n, True, d, False, fp32) for n in (n_err // 8, n_err // 4)
             for x in ("efficient (PyTorch)", "direct (Triton)")]  # fmt: skip
    plan += [(x, n_mid, bw, d, True, fp32) for bw in (False, True)
             for x in ("efficient (PyTorch)", "direct (Triton)", "SDPA")]  # fmt: skip
    # the direct kernel's float32 backward (40x its forward on the H100) on other blocks
    plan += [(x, n_err, True, d, False, fp32) for x in DIRECT_FLOAT32_BACKWARD]
    # a causal call with its state out (a prompt's prefill): the Triton causal form since
    # 2026-11-28, the PyTorch causal form before
    plan += [(f"prefill, state out ({x})", n_mid, bw, d, True, None) for bw in (False, True)
             for x in ("Triton", "PyTorch")]  # fmt: skip
    # the causal kernels: default chunk (256) beside SDPA and direct, other chunks, 4x N
    # (at B·H = 32 they sweep pieces of 4 chunks: beside them, all 64 chunks at once)
    plan += [(x, n_mid, bw, d, True, None) for bw in (False, True)
             for x in (*trio, "16-bit, causal, unpieced")]  # fmt: skip
    plan += [(f"16-bit, chunk {c}", n_mid, bw, d, True, None) for c in CAUSAL_CHUNKS
             for bw in (False, True)]  # fmt: skip
    plan += [(x, n_long, bw, d, True, None) for bw in (False, True) for x in trio]
    # float32 in exact dots: the kernels' ieee dots, the PyTorch form, direct, SDPA
    # (the kernels' TF32 dots are timed above, beside the other TF32 paths)
    fp32_impls = ("efficient (Triton)", "efficient (PyTorch)", "direct (Triton)", "SDPA")
    plan += [(x, n, bw, d, False, fp32) for n in (n_err, n_mid) for bw in (False, True)
             for x in fp32_impls]  # fmt: skip
    # where the direct and efficient forms cross (auto's GPU prior), d = 64
    plan += [(x, n, bw, d, False, None) for n in (n_err, 2 * n_err) for bw in (False, True)
             for x in trio]  # fmt: skip
    plan += [(x, n_mid, bw, 2 * d, False, None) for bw in (False, True) for x in trio]
    plan += [(x, n_long, bw, d, False, None) for bw in (False, True) for x in trio]
    # launch settings
    plan += [(name, n_mid, bw, d, False, None) for name in list(configs)[2:]
             for bw in (False, True)]  # fmt: skip
    plan += [("fp32-dots", n_err, bw, d, False, None) for bw in (False, True)]
    for label, n, backward, dim, causal, dt in plan:
        if label in configs:
            use(label)
            timed(label, impls["efficient (Triton)"], n, backward, dim, causal, dt)
        elif label in DIRECT_FLOAT32_BACKWARD:
            use("16-bit")
            td.FLOAT32_BACKWARD_BLOCKS = DIRECT_FLOAT32_BACKWARD[label]
            try:
                timed(label, impls["direct (Triton)"], n, backward, dim, causal, dt)
            finally:
                td.FLOAT32_BACKWARD_BLOCKS = None
        else:
            use("16-bit")
            timed(label, impls[label], n, backward, dim, causal, dt)

    machine = json.dumps(results.get("machine"))
    lines = ["# Fused efficient kernels: launch settings side by side", "",
             f"Shape (B, H, d = dv) = ({b}, {h}, {d}), {dtype} unless named; {machine}", "",
             "| step | config / impl | N | d | causal | dtype | pass | result |",
             "|---|---|---:|---:|---|---|---|---|"]  # fmt: skip
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
                            if k not in ("step", "config", "n", "t_s", "d", "causal"))  # fmt: skip
        row = (f"| {r['step']} | {what} | {r['n']} | {r.get('d', d)} | {r.get('causal', '')} "
               f"| {r.get('dtype', '')} ")  # fmt: skip
        lines.append(f"{row}| {pas} | {val} |".replace("\n", " "))
    tmp = args.out / "tune.md.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, args.out / "tune.md")
    print(f"wrote {args.out}/tune.md in {time.monotonic() - START:.0f} s", flush=True)
    return 0


# Blocks (BLOCK_M, BLOCK_N, warps) of the direct kernel's float32 backward to time
# (ops/triton/direct.py, FLOAT32_BACKWARD_BLOCKS; the default is its forward's, 64, 64, 4).
DIRECT_FLOAT32_BACKWARD = {
    "direct (Triton), fp32 backward 32x32, 4 warps": (32, 32, 4),
    "direct (Triton), fp32 backward 64x32, 4 warps": (64, 32, 4),
    "direct (Triton), fp32 backward 32x64, 4 warps": (32, 64, 4),
    "direct (Triton), fp32 backward 64x64, 8 warps": (64, 64, 8),
}

# Tokens per chunk of the causal kernels to time beside the default (CAUSAL_CHUNK = 256).
CAUSAL_CHUNKS = (128, 512, 1024)


def profile_causal(path: Path, efficient, inputs, n: int, dry: bool, left) -> None:
    """torch.profiler's table of the costliest ops of one causal call of the fused kernels
    (after a warm-up call), forward and forward + backward, written to ``path``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([] if dry else [ProfilerActivity.CUDA])
    sort = "self_cpu_time_total" if dry else "self_device_time_total"
    parts = []
    for backward in (False, True):
        if left() < 20:
            parts.append(f"(backward={backward}: skipped, deadline)")
            break
        q, k, v = inputs(n, backward)

        def call(q=q, k=k, v=v, backward=backward):
            y = efficient(q, k, v, causal=True)
            if backward:
                torch.autograd.grad(y, (q, k, v), torch.ones_like(y))
            if not dry:
                torch.cuda.synchronize()

        try:
            call()
            with profile(activities=activities) as prof:
                call()
            table = prof.key_averages().table(sort_by=sort, row_limit=25)
        except Exception as err:  # a failure is a result
            table = f"failed: {type(err).__name__}: {err}"[:2000]
        pas = "forward + backward" if backward else "forward"
        parts.append(f"## causal, N = {n}, {pas}\n\n{table}")
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n\n".join(parts) + "\n")
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
