"""The feature map and the hand-written normalisation backward shared by the forms."""

from __future__ import annotations

import itertools

import pytest
import torch

from taylorshift.ops.taylor_shift import features as F_
from taylorshift.ops.taylor_shift.features import (
    features,
    scaled_input_grad,
    scaled_key,
    scaled_query,
    state_weights,
)

F64 = torch.float64


def plain_features(x: torch.Tensor) -> torch.Tensor:
    """φ(x) = [x_a x_b for a <= b (row by row), x, 1], written out pair by pair."""
    d = x.shape[-1]
    pairs = [x[..., a] * x[..., b] for a, b in itertools.combinations_with_replacement(range(d), 2)]
    return torch.cat([torch.stack(pairs, -1), x, torch.ones_like(x[..., :1])], -1)


@pytest.mark.parametrize("tokens", [1, 5, 64, 512, 513, 3000], ids=lambda n: f"N{n}")
@pytest.mark.parametrize("d", [1, 3, 16])
def test_every_path_gives_the_plain_features_bitwise(tokens, d):
    # up to 8192 elements (B·H·N·d, here B·H = 1) the outer-product path, above the slices
    x = torch.randn(1, 1, tokens, d, generator=torch.Generator().manual_seed(d))
    assert torch.equal(features(x), plain_features(x))


def test_the_paths_agree_bitwise_across_the_switch(monkeypatch):
    x = torch.randn(2, 3, 7, 6)
    small = features(x)
    monkeypatch.setattr(F_, "GATHER_MAX_ELEMENTS", 0)
    assert torch.equal(features(x), small)


def test_weighted_features_give_the_taylor_weight():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(4, 5, dtype=F64, generator=g), torch.randn(6, 5, dtype=F64, generator=g)
    c = state_weights(5, F64, q.device).squeeze(-1)
    s = q @ k.T
    torch.testing.assert_close((features(q) * c) @ features(k).T, 1 + s + s * s / 2)


@pytest.mark.parametrize("normalize", [True, False], ids=["normalize", "plain"])
@pytest.mark.parametrize("tensor_factor", [True, False], ids=["tau-tensor", "float"])
def test_scaled_input_grad_matches_autograd(normalize, tensor_factor):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 7, 4, dtype=F64, generator=g)
    x[0, 1, 2] = 0.0  # a zero vector: its norm is floored at eps
    x[1, 2, 3] = 1e-14  # below the floor, not zero
    x.requires_grad_()
    if tensor_factor and normalize:
        factor = torch.rand(1, 3, 1, 1, dtype=F64, generator=g).add(0.5).requires_grad_()
    else:
        factor = 0.7
    grad = torch.randn(2, 3, 7, 4, dtype=F64, generator=g)
    out = scaled_query(x, factor, normalize)
    inputs = [x, factor] if isinstance(factor, torch.Tensor) else [x]
    want = torch.autograd.grad(out, inputs, grad)
    got_x, got_factor = scaled_input_grad(
        x.detach(), grad, factor if not inputs[1:] else factor.detach(), normalize
    )
    torch.testing.assert_close(got_x, want[0], rtol=1e-12, atol=1e-12)
    if len(inputs) == 2:
        torch.testing.assert_close(
            got_factor.sum_to_size(factor.shape), want[1], rtol=1e-12, atol=0
        )
    else:
        assert got_factor is None
    # keys: factor 1
    out = scaled_key(x, normalize)
    (want_k,) = torch.autograd.grad(out, x, grad)
    torch.testing.assert_close(scaled_input_grad(x.detach(), grad, 1.0, normalize)[0], want_k)


@pytest.mark.parametrize("d", [1, 2, 5, 16])
def test_symmetric_state_unpacks_the_triangle_pair_by_pair(d):
    pairs = list(itertools.combinations_with_replacement(range(d), 2))
    packed = torch.randn(2, 3, len(pairs), 4, dtype=F64)
    want = torch.zeros(2, 3, d, d, 4, dtype=F64)
    for row, (a, b) in enumerate(pairs):
        want[..., a, b, :] += packed[..., row, :]
        want[..., b, a, :] += packed[..., row, :]  # the diagonal gets it twice
    assert torch.equal(F_.symmetric_state(packed, d), want)


def test_cached_tables_work_in_and_out_of_inference_mode():
    F_._cached_state_weights.cache_clear()  # first built inside inference mode
    with torch.inference_mode():
        weights = state_weights(7, F64, torch.device("cpu"))
    assert not weights.is_inference()
    x = torch.randn(3, 7 * 8 // 2 + 7 + 1, 2, dtype=F64, requires_grad=True)
    (x * weights).sum().backward()  # a cached table inside autograd
    assert torch.equal(x.grad, weights.expand_as(x))


@pytest.mark.parametrize("shape", [(1, 1, 5, 6), (2, 3, 700, 16), (1, 4, 600, 32)])
def test_chunk_features_are_the_features_feature_major(shape):
    # small: the gather path, row-major; larger: feature-major (a transposed view), from
    # 2^20 elements in a scratch buffer; the same products either way, so equal bitwise
    x = torch.randn(shape, generator=torch.Generator().manual_seed(3))
    f = F_.chunk_features(x)
    assert f.shape == plain_features(x).shape
    assert torch.equal(f, plain_features(x))
    if x.numel() > F_.GATHER_MAX_ELEMENTS:
        assert f.transpose(-2, -1).is_contiguous()


def test_off_the_cpu_the_features_are_one_gather_whatever_the_length():
    # On a GPU d row products are d launches per chunk (the first H200 run: 17K calls for
    # one forward): off the CPU the features are one outer product and one index. The meta
    # device stands in for a GPU; the multiplies are counted at the aten level.
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountMul(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.muls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.muls += func.overloadpacket is torch.ops.aten.mul
            return func(*args, **(kwargs or {}))

    x = torch.randn(2, 3, 700, 16)  # above the gather size: the CPU takes 16 row products
    for device, muls in (("cpu", 16), ("meta", 1)):
        x_dev = x.to(device)
        F_.chunk_features(x_dev)  # builds the cached index tables of this device
        with CountMul() as counter:
            f = F_.chunk_features(x_dev)
        assert f.shape == (2, 3, 700, 16 * 17 // 2 + 17)
        assert counter.muls == muls, device


def test_chunks_are_larger_off_the_cpu():
    from taylorshift.ops.taylor_shift.efficient import default_chunk_size

    cpu = default_chunk_size(32, 64, 64)
    assert cpu == default_chunk_size(32, 64, 64, "cpu") == 64  # the CPU's chunk at B·H = 32
    assert default_chunk_size(32, 64, 64, torch.device("cuda")) >= 7 * cpu
