"""Token-major against feature-major chunk features, and the two products of a chunk.

    python benchmarks/op_cpu/layout/feature_layout.py > benchmarks/op_cpu/layout/feature_layout.txt

For one chunk (B·H = 4, C tokens): building φ into an existing (C, D) or (D, C) buffer
(d strided multiplies either way), the key side's φᵀ V' and the query side's φ S, medians
of 20 calls in ms, 2 threads, float32.
"""

from __future__ import annotations

import statistics
import time

import torch

from taylorshift.ops.taylor_shift.features import feature_dim


def median_ms(fn, calls: int = 20) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def build(x: torch.Tensor, out: torch.Tensor, feature_major: bool) -> torch.Tensor:
    d = x.shape[-1]
    src = x.transpose(-2, -1).contiguous() if feature_major else x
    start = 0
    for a in range(d):
        if feature_major:
            torch.mul(src[:, a : a + 1, :], src[:, a:, :], out=out[:, start : start + d - a, :])
        else:
            torch.mul(src[..., a : a + 1], src[..., a:], out=out[..., start : start + d - a])
        start += d - a
    return out


def main() -> None:
    torch.set_num_threads(2)
    print(f"torch {torch.__version__}, 2 threads, B·H 4, float32; ms per chunk")
    print("| d | C | layout | features | φᵀ V' | φ S |")
    print("|---:|---:|---|---:|---:|---:|")
    for d, c in ((16, 4096), (32, 1366), (64, 456), (64, 1024)):
        big_d = feature_dim(d)
        x, v = torch.randn(4, c, d), torch.randn(4, c, d + 1)
        s = torch.randn(4, big_d, d + 1)
        for layout, out in (("token-major", torch.empty(4, c, big_d)),
                            ("feature-major", torch.empty(4, big_d, c))):  # fmt: skip
            fm = layout == "feature-major"
            phi = build(x, out, fm)
            phi_tok = phi.transpose(1, 2) if fm else phi  # (4, C, D) either way
            t_feat = median_ms(lambda x=x, out=out, fm=fm: build(x, out, fm))
            t_key = median_ms(lambda p=phi_tok, v=v: torch.bmm(p.transpose(1, 2), v))
            t_query = median_ms(lambda p=phi_tok, s=s: torch.bmm(p, s))
            print(f"| {d} | {c} | {layout} | {t_feat:.2f} | {t_key:.2f} | {t_query:.2f} |")


if __name__ == "__main__":
    main()
