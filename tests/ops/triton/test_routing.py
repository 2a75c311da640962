"""The public op reaches the fused kernels: with ``TAYLORSHIFT_TRITON=interpret`` CPU calls
are routed as CUDA calls are, and give the PyTorch forms' results."""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("triton")

from taylorshift import taylor_shift_attention
from taylorshift.ops.taylor_shift import fused


@pytest.fixture
def routed(monkeypatch, caplog):
    caplog.set_level(logging.DEBUG, logger="taylorshift.dispatch")
    monkeypatch.setenv(fused.TRITON_ENV, "interpret")
    return caplog


def inputs(requires_grad=True):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 37, 16, generator=g) for _ in range(3))
    pad = torch.ones(2, 1, 1, 37, dtype=torch.bool)
    pad[1, ..., 30:] = False
    return [t.requires_grad_(requires_grad) for t in (q, k, v)], pad


@pytest.mark.parametrize(
    "mode, causal, expected",
    [
        ("efficient", False, "triton efficient (non-causal)"),
        ("efficient", True, "triton efficient (causal)"),
        ("direct", False, "triton direct (non-causal)"),
        ("direct", True, "triton direct (causal)"),
    ],
)
def test_public_op_runs_the_kernel_and_matches_pytorch(routed, monkeypatch, mode, causal, expected):
    (q, k, v), pad = inputs()
    out = taylor_shift_attention(q, k, v, pad, causal, mode=mode)
    assert f"fused: {expected}" in routed.text
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))

    monkeypatch.setenv(fused.TRITON_ENV, "off")
    routed.clear()
    ref = taylor_shift_attention(q, k, v, pad, causal, mode=mode)
    assert "fused" not in routed.text
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)


def test_general_masks_stay_on_pytorch(routed):
    (q, k, v), _ = inputs(requires_grad=False)
    general = torch.rand(2, 1, 37, 37) > 0.3
    taylor_shift_attention(q, k, v, general, mode="direct")
    assert "fused" not in routed.text


def test_router_knows_the_causal_kernels_chunk():
    from taylorshift.ops.triton import efficient_causal

    assert efficient_causal.DEFAULT_CHUNK == fused.CAUSAL_CHUNK
