"""The causal efficient form with the CPU kernels against the plain reference and the torch
causal form.

Outputs and gradients (query, key, value, tensor temperature) in float32 and float16 /
bfloat16 (SPEC §8 rule), chunks that cut the lengths unevenly (N = 1, 7, 70 with chunks of
8 and the default 256), key padding with fully masked rows, Nq != Nk both ways, dv != d;
the routing of ``taylor_shift_attention`` (eager and traced calls to the kernels, stateful
ones to the PyTorch form) and the custom ops.
"""

from __future__ import annotations

import pytest
import torch

from taylorshift import taylor_shift_attention
from taylorshift.ops.cpu.efficient_causal import cpu_causal_efficient_taylor_shift
from taylorshift.ops.taylor_shift import fused
from taylorshift.ops.taylor_shift.efficient_causal import causal_efficient_taylor_shift
from tests.helpers import assert_rel_close
from tests.ops.kernel_cases import (
    Case,
    check_default_dtype,
    check_float32,
    check_fully_masked,
    check_low_precision,
    check_nan_in_padded_keys,
    check_thread_counts,
    make_problem,
)

CASES = [
    (Case(1, 1, 1, 1, 16, 16, temperature="float"), 8),
    (Case(2, 2, 7, 7, 16, 8, mask="empty"), 8),
    (Case(1, 2, 70, 70, 16, 20, mask="padding"), 8),
    (Case(2, 1, 20, 11, 17, 16, normalize=False), 8),
    (Case(1, 2, 11, 20, 16, 17, mask="padding", temperature="float"), 8),
    (Case(1, 1, 19, 19, 17, 12, mask="padding"), 8),
    (Case(1, 2, 300, 300, 32, 32, mask="padding"), None),
    (Case(1, 1, 40, 40, 64, 3), 16),
]
SIXTEEN_BIT_CASES = [
    Case(1, 2, 30, 30, 16, 16, mask="padding", temperature="float"),
    Case(2, 1, 21, 13, 16, 20, normalize=False),
]
RMS_BOUND = 1e-2  # bfloat16 rounds 8x coarser than float16


@pytest.mark.parametrize(("case", "chunk"), CASES, ids=lambda x: getattr(x, "id", f"C{x}"))
def test_float32_matches_reference_and_torch_form(case, chunk):
    check_float32(
        cpu_causal_efficient_taylor_shift, causal_efficient_taylor_shift, case, is_causal=True,
        chunk_size=chunk,
    )  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", SIXTEEN_BIT_CASES, ids=lambda c: c.id)
def test_sixteen_bit_error_within_reference_error(case, dtype):
    check_low_precision(
        cpu_causal_efficient_taylor_shift, case, dtype, is_causal=True, rms_bound=RMS_BOUND,
        chunk_size=8,
    )  # fmt: skip


def test_fully_masked_heads_give_zeros_and_finite_grads():
    check_fully_masked(cpu_causal_efficient_taylor_shift, nq=9, chunk_size=4)


@pytest.mark.parametrize("d", [16, 32], ids=lambda d: f"d{d}")
def test_thread_counts_give_the_same_sums(d):
    # two chunks of 256: the chunk loop in C, its kernels split heads, pairs and tokens
    check_thread_counts(
        cpu_causal_efficient_taylor_shift, Case(1, 3, 300, 300, d, 10, mask="padding")
    )


def test_nan_in_padded_keys_stays_out():
    check_nan_in_padded_keys(cpu_causal_efficient_taylor_shift, chunk_size=16)


def test_float64_default_dtype_changes_nothing():
    check_default_dtype(cpu_causal_efficient_taylor_shift, chunk_size=16)


def test_refuses_float64_naming_the_dtype():
    q = torch.randn(1, 1, 3, 16, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"query must be float16, bfloat16 or float32.*float64"):
        cpu_causal_efficient_taylor_shift(q, q, q, None, 1.0, None, True)


def test_public_op_routes_eager_causal_calls_to_the_kernels(routed, monkeypatch):
    calls = routed
    q, k, v = (torch.randn(1, 2, 9, 8, requires_grad=True) for _ in range(3))
    y = taylor_shift_attention(q, k, v, is_causal=True, mode="efficient")
    assert calls == [fused.CPU_EFFICIENT_CAUSAL]
    calls.clear()
    ref = causal_efficient_taylor_shift(q, k, v, None, 1.0, None, True)
    assert_rel_close(y, ref, 1e-5, "routed output", atol=1e-7)
    # a state in or out: the PyTorch form (the kernels keep no state)
    _, state = taylor_shift_attention(
        q, k, v, is_causal=True, mode="efficient", output_final_state=True
    )
    taylor_shift_attention(q, k, v, is_causal=True, mode="efficient", initial_state=state)
    assert calls == []
    # traced: the kernels' custom ops, whole (fullgraph), forward and backward
    compiled = torch.compile(
        lambda *x: taylor_shift_attention(*x, is_causal=True, mode="efficient"),
        backend="aot_eager", fullgraph=True,
    )  # fmt: skip
    y_compiled = compiled(q, k, v)
    assert calls == [fused.CPU_EFFICIENT_CAUSAL]
    assert_rel_close(y_compiled, ref, 1e-5, "compiled output", atol=1e-7)
    g = torch.randn_like(ref)
    for name, a, e in zip(
        "qkv", torch.autograd.grad(y_compiled, (q, k, v), g),
        torch.autograd.grad(ref, (q, k, v), g), strict=True,
    ):  # fmt: skip
        assert_rel_close(a, e, 2e-5, f"compiled grad {name}", atol=1e-6)


def test_custom_op_registration_passes_opcheck():
    case = Case(1, 2, 21, 21, 16, 12, mask="padding")
    low, _, mask, _ = make_problem(case, torch.float32)
    q, k, v = (x.detach().requires_grad_() for x in low[:3])
    factors = torch.rand(2, requires_grad=True)
    key_mask = mask[:, :, 0, :].expand(1, 2, 21).contiguous()
    op = torch.ops.taylorshift.cpu_forward.default
    torch.library.opcheck(op, ("causal", 8, q, k, v, key_mask, factors, True))
    torch.library.opcheck(op, ("causal", 8, q, k, v, None, factors, False))
