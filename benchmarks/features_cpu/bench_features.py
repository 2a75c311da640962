"""Time three ways to build the symmetric features φ(x) = [x_a x_b (a <= b), x, 1].

    python benchmarks/features_cpu/bench_features.py > benchmarks/features_cpu/results.txt

slices: the library's ``features`` (d strided multiplies into slices of the output);
gather: two ``index_select`` of the pairs and one multiply; outer: the full d × d outer
product, then the upper triangle gathered. Median of 30 calls after 5 warm-up calls,
float32, torch threads 2, one (1, 1, C, d) chunk.
"""

import statistics
import time

import torch

from taylorshift.ops.taylor_shift.features import feature_dim, features, pair_index

torch.set_num_threads(2)


def median_us(fn, reps=30):
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def _assemble(x, quad):
    d = x.shape[-1]
    out = torch.empty((*x.shape[:-1], feature_dim(d)), dtype=x.dtype)
    p = quad.shape[-1]
    out[..., :p] = quad
    out[..., p : p + d] = x
    out[..., -1] = 1.0
    return out


def gather(x):
    a, b = pair_index(x.shape[-1], x.device)
    return _assemble(x, x.index_select(-1, a) * x.index_select(-1, b))


def outer(x):
    d = x.shape[-1]
    a, b = pair_index(d, x.device)
    full = (x.unsqueeze(-1) * x.unsqueeze(-2)).flatten(-2)
    return _assemble(x, full.index_select(-1, a * d + b))


print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
print(f"{'d':>3} {'C':>5} {'slices us':>10} {'gather us':>10} {'outer us':>10}")
for d in (16, 32, 64):
    for c in (64, 256, 1024, 4096):
        x = torch.randn(1, 1, c, d)
        assert torch.equal(features(x), gather(x)) and torch.equal(features(x), outer(x))
        row = [median_us(lambda f=f, x=x: f(x)) for f in (features, gather, outer)]
        print(f"{d:>3} {c:>5} " + " ".join(f"{t:>10.0f}" for t in row))
