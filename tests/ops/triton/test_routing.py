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
    monkeypatch.setenv("TAYLORSHIFT_CPU_KERNELS", "off")  # references: the PyTorch forms
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


@pytest.mark.parametrize(
    "mode, causal", [("efficient", False), ("efficient", True), ("direct", True)]
)
def test_gradients_asked_as_a_graph_equal_the_pytorch_forms(routed, monkeypatch, mode, causal):
    # create_graph=True (a gradient penalty): the kernels' cores recompute their sums in
    # plain ops; the gradient and the penalty's gradient match the PyTorch forms'
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 1, 9, 16, generator=g, requires_grad=True) for _ in range(3))
    pad = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    pad[1, ..., 6:] = False
    tau = torch.tensor([[[[1.3]]]], requires_grad=True)

    def penalty_grads():
        out = taylor_shift_attention(q, k, v, pad, causal, temperature=tau, mode=mode)
        grads = torch.autograd.grad(out.square().sum(), (q, k, v, tau), create_graph=True)
        penalty = sum(x.square().sum() for x in grads)
        return grads, torch.autograd.grad(penalty, (q, k, v, tau))

    fused_grads, fused_second = penalty_grads()
    assert "fused: triton" in routed.text
    monkeypatch.setenv(fused.TRITON_ENV, "off")
    want_grads, want_second = penalty_grads()
    names = [f"{what} of {x}" for what in ("gradient", "penalty's gradient") for x in "qkvt"]
    got, want = (*fused_grads, *fused_second), (*want_grads, *want_second)
    for name, a, e in zip(names, got, want, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5, msg=name)


def test_general_masks_stay_on_pytorch(routed):
    (q, k, v), _ = inputs(requires_grad=False)
    general = torch.rand(2, 1, 37, 37) > 0.3
    taylor_shift_attention(q, k, v, general, mode="direct")
    assert "fused" not in routed.text


def test_router_knows_the_causal_kernels_chunk():
    from taylorshift.ops.triton import efficient_causal

    assert efficient_causal.DEFAULT_CHUNK == fused.CAUSAL_CHUNK


@pytest.mark.parametrize(
    "module, fused_name, torch_name",
    [
        ("direct", "triton_direct_taylor_shift", "direct_taylor_shift"),
        ("efficient", "triton_efficient_taylor_shift", "efficient_taylor_shift"),
        (
            "efficient_causal",
            "triton_causal_efficient_taylor_shift",
            "causal_efficient_taylor_shift",
        ),
    ],
)
def test_each_fused_form_has_its_pytorch_forms_signature(module, fused_name, torch_name):
    """The public op picks the fused or the PyTorch form and calls either the same way."""
    import importlib
    import inspect

    reference = getattr(
        importlib.import_module(f"taylorshift.ops.taylor_shift.{module}"), torch_name
    )
    fused_form = getattr(importlib.import_module(f"taylorshift.ops.triton.{module}"), fused_name)
    want = inspect.signature(reference).parameters
    got = inspect.signature(fused_form).parameters
    assert [(p.name, p.kind, p.default) for p in got.values()] == [
        (p.name, p.kind, p.default) for p in want.values()
    ]


def test_fused_forms_refuse_what_they_do_not_compute():
    from taylorshift.ops.triton.direct import triton_direct_taylor_shift

    q = torch.randn(1, 2, 5, 4)
    varying = torch.ones(1, 1, 5, 5, dtype=torch.bool).tril()
    with pytest.raises(ValueError, match=r"mask must be key padding.*got shape \(1, 1, 5, 5\)"):
        triton_direct_taylor_shift(q, q, q, varying, False, 1.0, None, True)
    with pytest.raises(ValueError, match="order 2 only; got order=4"):
        triton_direct_taylor_shift(q, q, q, None, False, 1.0, None, True, 4)


@pytest.mark.parametrize(
    "name, module",
    [
        ("triton_direct_taylor_shift", "direct"),
        ("triton_efficient_taylor_shift", "efficient"),
        ("triton_causal_efficient_taylor_shift", "efficient_causal"),
    ],
)
def test_the_unchecked_forms_moved_out_of_the_package_namespace(name, module):
    import importlib

    import taylorshift.ops.triton as package

    assert name not in package.__all__
    with pytest.warns(FutureWarning, match=rf"taylorshift.ops.triton.{module}\b"):
        form = getattr(package, name)
    assert form is getattr(importlib.import_module(f"taylorshift.ops.triton.{module}"), name)
