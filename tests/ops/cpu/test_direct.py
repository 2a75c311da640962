"""The direct form's CPU kernels (``direct.c``) against the plain reference and the torch
direct form.

Outputs and gradients (query, key, value, tensor temperature), causal and not, in float32
against float64 and the torch form, float16 and bfloat16 (SPEC §8), awkward shapes (N = 1,
prime N, several 64-row tiles, Nq != Nk both ways, d = 1 and 128, dv != d), key padding
with fully masked rows, thread counts (bitwise), non-contiguous inputs, refusals, the
routing of ``taylor_shift_attention`` and the custom ops (opcheck, torch.compile). The
uninitialised-memory poison of tests/ops/conftest.py applies.
"""

from __future__ import annotations

import functools

import pytest
import torch

from taylorshift import taylor_shift_attention
from taylorshift.ops.cpu import build
from taylorshift.ops.cpu.direct import cpu_direct_taylor_shift
from taylorshift.ops.taylor_shift import fused
from taylorshift.ops.taylor_shift.direct import direct_taylor_shift
from tests.ops.kernel_cases import (
    Case,
    check_broadcast_output_grad,
    check_compiles,
    check_default_dtype,
    check_float32,
    check_fully_masked,
    check_low_precision,
    check_non_contiguous,
    check_thread_counts,
    make_problem,
)


def key_mask_form(direct_form, is_causal: bool = False):
    """A direct form with the efficient forms' signature (key mask (B, H, Nk)), so that the
    shared checks of tests/ops/kernel_cases.py call it."""

    @functools.wraps(direct_form)
    def form(query, key, value, key_mask, temperature, scale, normalize):
        mask = None if key_mask is None else key_mask.unsqueeze(2)
        return direct_form(query, key, value, mask, is_causal, temperature, scale, normalize)

    return form


KERNEL, TORCH = key_mask_form(cpu_direct_taylor_shift), key_mask_form(direct_taylor_shift)
CAUSAL_KERNEL = key_mask_form(cpu_direct_taylor_shift, is_causal=True)
CAUSAL_TORCH = key_mask_form(direct_taylor_shift, is_causal=True)

CASES = [
    Case(2, 2, 7, 65, 16, 16, mask="empty"),
    Case(2, 2, 65, 7, 17, 20, normalize=False),
    Case(2, 2, 1, 1, 16, 8, temperature="float"),
    Case(2, 2, 33, 40, 17, 17, mask="padding"),
    Case(1, 3, 50, 37, 1, 1),
    Case(1, 2, 131, 140, 32, 70, mask="padding"),
    Case(1, 1, 20, 45, 128, 128, mask="padding", temperature="float"),
]
CAUSAL_CASES = [
    Case(2, 2, 1, 1, 16, 8),
    Case(2, 2, 70, 70, 16, 20, mask="padding"),
    Case(2, 1, 131, 131, 32, 33, mask="empty"),
    Case(2, 1, 20, 11, 17, 16, normalize=False),
    Case(1, 2, 11, 90, 16, 17, mask="padding", temperature="float"),
    Case(1, 1, 67, 67, 64, 3),
]
SIXTEEN_BIT_CASES = [
    Case(2, 2, 40, 65, 16, 16, mask="padding", temperature="float"),
    Case(2, 2, 33, 40, 17, 20, normalize=False),
]
RMS_BOUND = 1e-2  # bfloat16 rounds 8x coarser than float16


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_float32_matches_reference_and_torch_form(case):
    check_float32(KERNEL, TORCH, case)


@pytest.mark.parametrize("case", CAUSAL_CASES, ids=lambda c: c.id)
def test_causal_float32_matches_reference_and_torch_form(case):
    check_float32(CAUSAL_KERNEL, CAUSAL_TORCH, case, is_causal=True)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", SIXTEEN_BIT_CASES, ids=lambda c: c.id)
def test_sixteen_bit_error_within_reference_error(case, dtype, causal):
    form = CAUSAL_KERNEL if causal else KERNEL
    check_low_precision(form, case, dtype, is_causal=causal, rms_bound=RMS_BOUND)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_thread_counts_give_the_same_sums(causal):
    # Threads take (head, tile of query rows) in the forward and whole heads in the backward:
    # no sum changes order. 140 queries: three tiles.
    form = CAUSAL_KERNEL if causal else KERNEL
    check_thread_counts(form, Case(1, 3, 140, 140, 24, 10, mask="padding"))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_float64_default_dtype_changes_nothing(causal):
    check_default_dtype(CAUSAL_KERNEL if causal else KERNEL)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fully_masked_rows_give_zeros_and_finite_grads(causal):
    check_fully_masked(CAUSAL_KERNEL if causal else KERNEL)


def test_non_contiguous_inputs_match_contiguous():
    check_non_contiguous(KERNEL, rtol=0)  # the kernels copy: bitwise


def test_broadcast_output_gradient_matches_a_dense_one():
    check_broadcast_output_grad(KERNEL)


def test_refuses_what_the_kernels_do_not_take_naming_it():
    q = torch.randn(1, 1, 3, 16)
    with pytest.raises(TypeError, match=r"query must be float16, bfloat16 or float32.*float64"):
        cpu_direct_taylor_shift(q.double(), q.double(), q.double(), None, False, 1.0, None, True)
    with pytest.raises(ValueError, match=r"order must be 2 for the CPU direct kernel; got 4"):
        cpu_direct_taylor_shift(q, q, q, None, False, 1.0, None, True, order=4)
    rows = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"a key-padding mask.*got shape \(1, 1, 3, 3\)"):
        cpu_direct_taylor_shift(q, q, q, rows, False, 1.0, None, True)
    with pytest.raises(ValueError, match=r"query's last dimension must be at most 128.*got 130"):
        wide = torch.randn(1, 1, 3, 130)
        cpu_direct_taylor_shift(wide, wide, q, None, False, 1.0, None, True)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_public_op_routes_the_cpu_direct_form_to_the_kernels(routed, c_calls, monkeypatch, causal):
    q, k, v = (torch.randn(1, 2, 9, 8, requires_grad=True) for _ in range(3))
    mask = torch.ones(1, 1, 1, 9, dtype=torch.bool)
    mask[..., 7:] = False
    y = taylor_shift_attention(q, k, v, attn_mask=mask, is_causal=causal, mode="direct")
    c_calls.ran("ts_direct_forward")
    assert c_calls["ts_direct_backward"] == 0
    grads = torch.autograd.grad(y.square().sum(), (q, k, v))
    c_calls.ran("ts_direct_backward")
    assert routed == [fused.CPU_DIRECT]
    routed.clear()

    monkeypatch.setenv(build.ENV, "off")  # the reference: the PyTorch direct form
    c_calls.clear()
    ref = taylor_shift_attention(q, k, v, attn_mask=mask, is_causal=causal, mode="direct")
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    c_calls.none()
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-5)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)


def test_public_op_keeps_what_the_cpu_direct_kernels_do_not_take_on_pytorch(
    routed, c_calls, monkeypatch
):
    q, k, v = (torch.randn(1, 2, 9, 8) for _ in range(3))
    taylor_shift_attention(q.double(), k.double(), v.double(), mode="direct")  # float64
    rows = torch.rand(1, 1, 9, 9) > 0.5
    rows[..., 0] = True
    taylor_shift_attention(q, k, v, attn_mask=rows, mode="direct")  # varies over queries
    taylor_shift_attention(q, k, v, mode="direct", order=4)
    monkeypatch.setenv(build.ENV, "off")
    taylor_shift_attention(q, k, v, mode="direct")
    assert routed == []
    c_calls.none()


def test_custom_op_registration_passes_opcheck():
    case = Case(1, 2, 5, 7, 16, 12, mask="padding")
    low, _, mask, _ = make_problem(case, torch.float32)
    q, k, v = (x.detach().requires_grad_() for x in low[:3])
    factors = torch.rand(2, requires_grad=True)
    key_mask = mask[:, :, 0, :].expand(1, 2, 7).contiguous()
    op = torch.ops.taylorshift.cpu_forward.default
    torch.library.opcheck(op, ("direct", 0, q, k, v, key_mask, factors, True))
    torch.library.opcheck(op, ("direct", 1, q, k, v, None, factors, False))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_torch_compile_traces_forward_and_backward(causal):
    check_compiles(CAUSAL_KERNEL if causal else KERNEL)
