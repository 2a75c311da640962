#!/usr/bin/env python3
"""Compile every fused efficient kernel variant for Hopper (sm_90) on a machine without a GPU.

    python benchmarks/gpu/compile_check.py OUT.json [--head-dim 128]

The launchers of ``taylorshift.ops.triton.efficient`` are run with their kernels replaced
by recorders, through the forward and backward custom ops (non-causal with and without a
key mask, causal), for float32 and bfloat16 inputs at d = dv = --head-dim (the largest the
router sends to the kernels: shared memory grows with d and dv). Each distinct variant is
then compiled with ``triton.compile`` for ``GPUTarget("cuda", 90, 32)`` (ptxas comes with
the triton wheel) and its shared memory compared with sm_90's 227 KiB per block (float32:
one variant per kernel and operand shape, their compiles take 20-30 s each). Variants come from the
launchers themselves, so the check follows them when they change.

Exit status 1 if a variant fails to compile or needs more shared memory than sm_90 has:
the first GPU run found a causal kernel (dv + 1 = 129 columns padded to 256) that needed
290 KB. ``benchmarks/gpu/run --dry-run`` runs this as a step (CI runs the dry run).
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

SM90_SHARED = 227 * 1024  # bytes per block
SM80_SHARED = 163 * 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="JSON file for the variants and their resources")
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args()
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # silence Triton 3.9's notice
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from taylorshift.ops.triton import efficient as te
    from taylorshift.ops.triton import efficient_causal as tc

    recorded: dict[tuple, tuple] = {}

    class Recorder:
        """Stands in for a jitted kernel: ``kernel[grid](*args, **kwargs)`` records."""

        def __init__(self, fn):
            self.fn = fn

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                key = (self.fn.__name__, *sorted((k, str(v)) for k, v in kwargs.items()),
                       *(str(a.dtype) for a in args if isinstance(a, torch.Tensor)))  # fmt: skip
                if kwargs.get("DOT") == te.DOT_FP32:
                    # float32 "ieee" dots take 20-30 s each to compile: one variant per
                    # kernel and operand shape (the flags that differ do not change them)
                    key = (self.fn.__name__, "float32", kwargs["D"], kwargs["DVP"])
                recorded.setdefault(key, (self.fn, args, kwargs))

            return launch

    names = ("_state_kernel", "_apply_kernel", "_grad_kernel")
    real = {name: getattr(te, name) for name in names}
    for name in names:
        setattr(te, name, Recorder(real[name]))
    d = args.head_dim
    try:
        for dtype in (torch.float32, torch.bfloat16):
            b, h, n = 1, 1, 64
            q, k, v = (torch.zeros(b, h, n, d) for _ in range(3))
            v = v.to(dtype)
            for mask in (None, torch.ones(b, h, n, dtype=torch.bool)):
                out, den, state = te.triton_efficient_forward(q, k, v, mask, True)
                te.triton_efficient_backward(out.float(), q, k, v, mask, out, den, state, True)
            u = torch.zeros(b * h, n, d + 1)
            dot = te.dot_kind(dtype)
            tc.triton_causal_forward(q[0], k[0], u, None, tc.DEFAULT_CHUNK, 1, dot, False)
            tc.triton_causal_backward(u.clone(), q[0], k[0], u, None, tc.DEFAULT_CHUNK, 1, dot)
    finally:
        for name in names:
            setattr(te, name, real[name])

    target = GPUTarget("cuda", 90, 32)
    results, failed = [], False
    for fn, call_args, kwargs in recorded.values():
        kwargs = dict(kwargs)
        options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
        signature, constexprs = {}, {}
        padded = list(call_args) + [None] * (len(fn.arg_names) - len(call_args))
        for name, value in zip(fn.arg_names, padded, strict=True):
            if name in kwargs:
                constexprs[name] = kwargs[name]
                signature[name] = "constexpr"
            elif isinstance(value, torch.Tensor):
                signature[name] = "*" + {torch.float32: "fp32", torch.bfloat16: "bf16",
                                         torch.float16: "fp16", torch.int32: "i32",
                                         torch.bool: "i1"}[value.dtype]  # fmt: skip
            else:
                signature[name] = "i64"
        entry = {"kernel": fn.__name__, "constexprs": {k: str(v) for k, v in constexprs.items()},
                 "options": options}  # fmt: skip
        start = time.monotonic()
        try:
            compiled = triton.compile(
                ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                target=target, options=options,
            )  # fmt: skip
            shared = compiled.metadata.shared
            entry.update(shared_bytes=shared, fits_sm90=shared <= SM90_SHARED,
                         fits_sm80=shared <= SM80_SHARED)  # fmt: skip
            failed |= shared > SM90_SHARED
        except Exception as err:  # a variant that does not compile is the finding
            entry["error"] = f"{type(err).__name__}: {err}"[-1500:]
            failed = True
        entry["seconds"] = round(time.monotonic() - start, 1)
        results.append(entry)
        print(json.dumps({k: entry[k] for k in entry if k != "constexprs"}
                         | {"DOT": constexprs.get("DOT"), "DV": constexprs.get("DV")}),
              flush=True)  # fmt: skip
    record = {"target": "cuda sm_90", "head_dim": d, "triton": triton.__version__,
              "variants": results, "ok": not failed}  # fmt: skip
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, args.out)
    print(f"{len(results)} variants; {'ok' if not failed else 'FAILED'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
