"""The public op reaches the fused kernels: with ``TAYLORSHIFT_TRITON=interpret`` CPU calls
are routed as CUDA calls are, launch the kernels (counted where they launch:
tests/ops/kernel_spy.py) with no fallback to PyTorch, and give the PyTorch forms' results."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from taylorshift import taylor_shift_attention
from taylorshift.ops.taylor_shift import fused

# The kernels each form launches forward and backward (names in ops/triton).
FORWARD = {"efficient": ("_state_kernel", "_apply_kernel"), "direct": ("_direct_fwd_kernel",)}
BACKWARD = {
    "efficient": ("_grad_kernel",),
    "direct": ("_direct_bwd_dkv_kernel", "_direct_bwd_dq_kernel"),
}


@pytest.fixture
def routed(monkeypatch, launches):
    """The Triton kernels' launches during the test, CPU calls routed to them."""
    from taylorshift.ops.triton.direct import interpreting

    if not interpreting():  # (TRITON_INTERPRET=1 is set by conftest.py only without CUDA)
        pytest.skip(
            "CPU tensors reach the Triton kernels under the interpreter only; with CUDA, "
            "tests/gpu routes CUDA calls"
        )
    monkeypatch.setenv(fused.TRITON_ENV, "interpret")
    monkeypatch.setenv("TAYLORSHIFT_CPU_KERNELS", "off")  # references: the PyTorch forms
    return launches


def inputs(requires_grad=True):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 37, 16, generator=g) for _ in range(3))
    pad = torch.ones(2, 1, 1, 37, dtype=torch.bool)
    pad[1, ..., 30:] = False
    return [t.requires_grad_(requires_grad) for t in (q, k, v)], pad


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("mode", ["efficient", "direct"])
def test_public_op_runs_the_kernel_and_matches_pytorch(routed, monkeypatch, mode, causal):
    (q, k, v), pad = inputs()
    out = taylor_shift_attention(q, k, v, pad, causal, mode=mode)
    routed.ran(*FORWARD[mode])
    assert not any(routed[name] for name in BACKWARD[mode])
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    routed.ran(*BACKWARD[mode])

    monkeypatch.setenv(fused.TRITON_ENV, "off")
    routed.clear()
    ref = taylor_shift_attention(q, k, v, pad, causal, mode=mode)
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    routed.none()
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
    routed.ran(*FORWARD[mode])  # (the gradients: plain ops, differentiable again)
    monkeypatch.setenv(fused.TRITON_ENV, "off")
    routed.clear()
    want_grads, want_second = penalty_grads()
    routed.none()
    names = [f"{what} of {x}" for what in ("gradient", "penalty's gradient") for x in "qkvt"]
    got, want = (*fused_grads, *fused_second), (*want_grads, *want_second)
    for name, a, e in zip(names, got, want, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5, msg=name)


def test_general_masks_stay_on_pytorch(routed):
    (q, k, v), _ = inputs(requires_grad=False)
    general = torch.rand(2, 1, 37, 37) > 0.3
    taylor_shift_attention(q, k, v, general, mode="direct")
    routed.none()


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
