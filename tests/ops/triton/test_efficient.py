"""Fused Triton efficient form (non-causal) against the plain reference and the torch form.

Outputs and gradients (query, key, value, tensor temperature) in float32 (tight relative
tolerance) and float16 (SPEC §8: at most 2× / 3× the error of the reference run in float16,
plus a relative-RMS bound), awkward shapes, key padding with a fully masked row, and the
custom-op registration (fake tensors, autograd, torch.compile). On the CPU the kernels run
under Triton's interpreter (see conftest.py), so shapes are small.
"""

from __future__ import annotations

import pytest
import torch

from taylorshift.ops.taylor_shift.efficient import efficient_taylor_shift
from tests.helpers import assert_rel_close, tf32_matmuls
from tests.ops.kernel_cases import (
    Case,
    call_form,
    call_reference,
    check_compiles,
    check_float32,
    check_fully_masked,
    check_low_precision,
    check_non_contiguous,
    key_mask_of,
    make_problem,
)
from tests.ops.triton.conftest import TRITON_MISSING

pytest.importorskip("triton", reason=TRITON_MISSING)

from taylorshift.ops.triton import efficient as triton_efficient
from taylorshift.ops.triton.efficient import triton_efficient_taylor_shift

CASES = [
    Case(2, 2, 7, 65, 16, 16, mask="empty"),
    Case(2, 1, 65, 7, 17, 20, normalize=False),
    Case(2, 2, 1, 1, 16, 8, temperature="float"),
    Case(1, 2, 33, 40, 17, 17, mask="padding"),
    Case(1, 2, 9, 17, 64, 16, mask="padding", temperature="float"),
]
# d = 48, dv = 80: three tiles (a tile count that is not a power of two), 6 tile pairs and
# two column blocks of the state (d = 96 took 9 s of the suite interpreted, d = 128 20-30 s).
SLOW_CASES = [Case(1, 1, 9, 17, 48, 80, mask="padding")]
FP16_CASES = [
    Case(2, 2, 40, 65, 16, 16, mask="padding", temperature="float"),
    Case(1, 2, 33, 40, 17, 20, normalize=False),
]


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, id=c.id) for c in CASES]
    + [pytest.param(c, id=c.id, marks=pytest.mark.slow) for c in SLOW_CASES],
)
def test_float32_matches_reference_and_torch_form(case):
    check_float32(triton_efficient_taylor_shift, efficient_taylor_shift, case)


FP16_FLOOR = 1e-4
RMS_BOUND = 5e-3


@pytest.mark.parametrize("case", FP16_CASES, ids=lambda c: c.id)
def test_float16_error_within_reference_error(case):
    check_low_precision(triton_efficient_taylor_shift, case, torch.float16)


def test_sixteen_bit_inputs_multiply_in_their_own_dtype(monkeypatch):
    # The DOT kind follows the inputs: 16-bit operands (tensor cores) for float16 and
    # bfloat16, exact float32 for float32; every kernel of both passes gets it.
    assert triton_efficient.dot_kind(torch.float16) == triton_efficient.DOT_FP16
    assert triton_efficient.dot_kind(torch.bfloat16) == triton_efficient.DOT_BF16
    assert triton_efficient.dot_kind(torch.float32) == triton_efficient.DOT_FP32
    seen = []
    for name in ("_state", "_apply", "_grad"):
        real = getattr(triton_efficient, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            seen.append((_name, kwargs.get("dot", args[-1] if _name != "_apply" else None)))
            return _real(*args, **kwargs)

        monkeypatch.setattr(triton_efficient, name, spy)
    for dtype, kind in ((torch.float16, 1), (torch.float32, 0)):
        seen.clear()
        low, _, mask, opts = make_problem(Case(1, 1, 5, 9, 16, 16), dtype)
        y = call_form(triton_efficient_taylor_shift, low, mask, opts, Case(1, 1, 5, 9, 16, 16))
        torch.autograd.grad(y.float().sum(), low[:3])
        assert {n for n, _ in seen} == {"_state", "_apply", "_grad"}
        assert all(k == kind for _, k in seen), (dtype, seen)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_token_splits_and_launch_settings_keep_the_result(monkeypatch, dtype):
    # The state kernel's token splits (partial states summed in torch) and other block
    # sizes and warps change only the order of float32 sums.
    case = Case(1, 2, 20, 200, 16, 16, temperature="float")  # no mask: every split has keys
    low, _, mask, opts = make_problem(case, dtype, seed=4)
    g = torch.randn(1, 2, 20, 16, generator=torch.Generator().manual_seed(8), dtype=dtype)

    def run():
        y = call_form(triton_efficient_taylor_shift, low, mask, opts, case)
        return [y, *torch.autograd.grad(y, low[:3], g)]

    default = run()
    lay = triton_efficient.layout(16, 16)
    assert triton_efficient.state_splits(2, 200, lay, 64)[0] == 1  # the default: one split
    monkeypatch.setattr(triton_efficient, "SPLIT_MIN_TOKENS", 64)
    splits, span = triton_efficient.state_splits(2, 200, lay, 32)
    assert splits > 1 and span % 32 == 0 and (splits - 1) * span < 200 <= splits * span
    kind = triton_efficient.dot_kind(dtype)
    monkeypatch.setitem(
        triton_efficient.LAUNCH, kind, dict(block_n=32, block_m=16, state_warps=2,
                                            token_warps=2, state_stages=1, token_stages=1,
                                            apply_block_m=16, apply_warps=2, apply_stages=1)
    )  # fmt: skip
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    for name, a, e in zip(["output", "q", "k", "v"], run(), default, strict=True):
        assert_rel_close(a, e, tol, name, atol=tol / 10)


def test_fully_masked_rows_give_zeros_and_finite_grads():
    check_fully_masked(triton_efficient_taylor_shift)


def test_non_contiguous_inputs_match_contiguous():
    check_non_contiguous(triton_efficient_taylor_shift)


def test_availability_reports_why_not(monkeypatch):
    from taylorshift.ops import triton as triton_ops

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert triton_ops.is_available() and triton_ops.unavailable_reason() is None
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not triton_ops.is_available()
    assert "TRITON_INTERPRET=1" in triton_ops.unavailable_reason()


def test_refuses_float64_naming_the_dtype():
    q = torch.randn(1, 1, 3, 16, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"query must be float16, bfloat16 or float32.*float64"):
        triton_efficient_taylor_shift(q, q, q, None, 1.0, None, True)


def test_refuses_cpu_tensors_without_the_interpreter(monkeypatch):
    monkeypatch.setattr(triton_efficient, "INTERPRETED", False)
    q = torch.randn(1, 1, 3, 16)
    with pytest.raises(ValueError, match=r"query must be on a CUDA device.*got device cpu"):
        triton_efficient_taylor_shift(q, q, q, None, 1.0, None, True)


def _core_args(case: Case):
    low, _, mask, _ = make_problem(case, torch.float32)
    qp = low[0].detach().requires_grad_()
    kp = low[1].detach().requires_grad_()
    return qp, kp, low[2].detach().requires_grad_(), key_mask_of(mask, case)


def test_custom_op_registration_passes_opcheck():
    qp, kp, v, key_mask = _core_args(Case(1, 2, 5, 7, 16, 16, mask="padding"))
    op = torch.ops.taylorshift.triton_efficient_forward.default
    torch.library.opcheck(op, (qp, kp, v, key_mask.contiguous(), True))


def test_fake_tensor_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    lay = triton_efficient.layout(33, 20)
    with FakeTensorMode():
        qp, kp = torch.empty(2, 3, 5, 33), torch.empty(2, 3, 7, 33)
        v = torch.empty(2, 3, 7, 20, dtype=torch.float16)
        out, den, state = torch.ops.taylorshift.triton_efficient_forward(qp, kp, v, None, True)
    assert out.shape == (2, 3, 5, 20) and out.dtype == torch.float16
    assert den.shape == (2, 3, 5) and den.dtype == torch.float32
    assert state.shape == (2, 3, lay.size) and state.dtype == torch.float32


def test_torch_compile_traces_forward_and_backward():
    check_compiles(triton_efficient_taylor_shift)


def test_float32_takes_tf32_dots_where_torch_allows_them():
    # The trade torch makes for its float32 matmuls (allow_tf32), as the direct kernels do;
    # off by default, so float32 stays exact.
    with tf32_matmuls(False):
        assert triton_efficient.dot_kind(torch.float32) == triton_efficient.DOT_FP32
    with tf32_matmuls(True):
        assert triton_efficient.dot_kind(torch.float32) == triton_efficient.DOT_TF32
        assert triton_efficient.dot_kind(torch.bfloat16) == triton_efficient.DOT_BF16
        case = Case(1, 2, 9, 17, 16, 16, mask="padding")
        low, high, mask, opts = make_problem(case, torch.float32, seed=2)
        fast = call_form(triton_efficient_taylor_shift, low, mask, opts, case)
        # TF32 keeps 10 mantissa bits (the interpreter may compute in full float32)
        assert_rel_close(fast, call_reference(high, mask, opts), 5e-3, "output", atol=1e-5)
        grads = torch.autograd.grad(fast.sum(), low[:3])
        assert all(torch.isfinite(g).all() for g in grads)
