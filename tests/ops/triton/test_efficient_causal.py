"""Fused Triton causal efficient form against the plain reference and the torch causal form.

Outputs and gradients (query, key, value, tensor temperature) in float32 (tight relative
tolerance) and float16 (SPEC §8 rule), with a small chunk so that N = 1, 7, 35 cut chunks
unevenly; key padding with a fully masked row, Nq != Nk both ways, dv != d, d in {16, 17}.
On the CPU the kernels run under Triton's interpreter (see conftest.py), so shapes are small.
"""

from __future__ import annotations

import pytest
import torch

from taylorshift.ops.taylor_shift.efficient_causal import causal_efficient_taylor_shift
from tests.helpers import assert_rel_close
from tests.ops.kernel_cases import (
    Case,
    call_form,
    call_reference,
    check_float32,
    check_low_precision,
    make_problem,
)
from tests.ops.triton.conftest import TRITON_MISSING

pytest.importorskip("triton", reason=TRITON_MISSING)

from taylorshift.ops.triton.efficient_causal import triton_causal_efficient_taylor_shift

CHUNK = 8  # small, so that the test lengths are not multiples of it


CASES = [
    Case(1, 1, 1, 1, 16, 16, temperature="float"),
    Case(2, 2, 7, 7, 16, 8, mask="empty"),
    Case(1, 2, 35, 35, 16, 20, mask="padding"),
    Case(2, 1, 20, 11, 17, 16, normalize=False),
    Case(1, 2, 11, 20, 16, 17, mask="padding", temperature="float"),
    Case(1, 1, 19, 19, 17, 12, mask="padding"),
]
FP16_CASES = [
    Case(1, 2, 30, 30, 16, 16, mask="padding", temperature="float"),
    Case(2, 1, 21, 13, 16, 20, normalize=False),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_float32_matches_reference_and_torch_form(case):
    check_float32(
        triton_causal_efficient_taylor_shift, causal_efficient_taylor_shift, case,
        is_causal=True, chunk_size=CHUNK,
    )  # fmt: skip


@pytest.mark.parametrize("case", FP16_CASES, ids=lambda c: c.id)
def test_float16_error_within_reference_error(case):
    check_low_precision(
        triton_causal_efficient_taylor_shift, case, torch.float16, is_causal=True,
        chunk_size=CHUNK,
    )  # fmt: skip


def test_fully_masked_rows_give_zeros_and_finitegrads():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 9, 16, generator=g).requires_grad_() for _ in range(3))
    key_mask = torch.zeros(1, 2, 9, dtype=torch.bool)
    key_mask[0, 1, 3:] = True  # head 0 attends nothing; head 1 from key 3 on
    y = triton_causal_efficient_taylor_shift(q, k, v, key_mask, 1.2, None, True, chunk_size=4)
    assert (y[0, 0] == 0).all() and (y[0, 1, :3] == 0).all()
    grads = torch.autograd.grad(y.sum(), (q, k, v))
    assert all(torch.isfinite(x).all() for x in grads)
    assert (grads[0][0, 0] == 0).all() and (grads[2][0, 1, :3] == 0).all()


def test_float64_is_refused():
    q = torch.randn(1, 1, 3, 4, dtype=torch.float64)
    with pytest.raises(TypeError, match="query must be float16, bfloat16 or float32"):
        triton_causal_efficient_taylor_shift(q, q, q, None, 1.0, None, True)


def test_non_contiguous_inputs_and_default_chunk():
    # (B, N, H, d) storage seen as (B, H, N, d), the layout of a fused projection; N spans
    # two default chunks, so the prefix state is exercised with DEFAULT_CHUNK too.
    from taylorshift.ops.triton.efficient_causal import DEFAULT_CHUNK

    n = DEFAULT_CHUNK + 5
    g = torch.Generator().manual_seed(5)
    leaves = [torch.randn(1, n, 1, d, generator=g).requires_grad_() for d in (16, 16, 12)]
    views = [x.transpose(1, 2) for x in leaves]
    copies = [x.detach().transpose(1, 2).contiguous().requires_grad_() for x in leaves]
    y = triton_causal_efficient_taylor_shift(*views, None, 1.3, None, True)
    y_ref = causal_efficient_taylor_shift(*copies, None, 1.3, None, True, chunk_size=64)
    assert_rel_close(y, y_ref, 1e-5, "output", atol=1e-7)
    g_out = torch.randn(y.shape, generator=g)
    grads = torch.autograd.grad(y, leaves, g_out)
    grads_ref = torch.autograd.grad(y_ref, copies, g_out)
    for name, a, e in zip("qkv", grads, grads_ref, strict=True):
        assert_rel_close(a.transpose(1, 2), e, 2e-5, f"grad {name}", atol=1e-6)


def test_torch_compile_traces_forward_and_backward():
    """The causal path (an autograd Function over the kernels' custom ops) compiles whole."""
    case = Case(1, 2, 19, 19, 16, 8, mask="padding")
    low, _, mask, _ = make_problem(case, torch.float32)
    key_mask = mask.reshape(mask.shape[0], -1, mask.shape[-1]).expand(1, 2, 19)

    def f(q, k, v, t):
        return triton_causal_efficient_taylor_shift(q, k, v, key_mask, t, None, True, CHUNK)

    eager = f(*low)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(*low)
    assert_rel_close(compiled, eager, 1e-6, "compiled output", atol=1e-7)
    g = torch.randn_like(eager)
    for name, a, e in zip(
        "qkvt",
        torch.autograd.grad(compiled, low, g),
        torch.autograd.grad(eager, low, g),
        strict=True,
    ):
        assert_rel_close(a, e, 1e-6, f"compiled grad {name}", atol=1e-7)


def test_custom_op_registration_passes_opcheck():
    g = torch.Generator().manual_seed(3)
    q, k = (torch.randn(2, 11, 16, generator=g, requires_grad=True) for _ in range(2))
    u = torch.randn(2, 11, 9, generator=g, requires_grad=True)
    # float32 dots (dot=0); the float16-operand dots (dot=1) share the registration and the
    # fake kernel, and their arithmetic is checked by the float16 cases above
    # (no initial state and none asked for: test_efficient_causal_state.py checks those)
    op = torch.ops.taylorshift.triton_causal_forward.default
    torch.library.opcheck(op, (q, k, u, None, CHUNK, 2, 0, False))  # pieces of 2 chunks


def test_states_are_dv_wide_with_the_mask_as_their_row_column(monkeypatch):
    # u = [v·m, m]: the mask goes in as the kernels' row column (denominator rows summed in
    # float32), so the chunk states have dv value columns, not dv + 1 (which pads dv = 64
    # to 128 columns and dv = 128 to 256, more shared memory than a GPU has).
    from taylorshift.ops.triton import efficient_causal

    widths = []
    real = efficient_causal._state

    def spy(x, u, r, r_mode, lay, dot=0):
        widths.append((u.shape[-1], r is not None, r_mode, lay.dv))
        return real(x, u, r, r_mode, lay, dot)

    monkeypatch.setattr(efficient_causal, "_state", spy)
    case = Case(1, 1, 20, 20, 16, 16, mask="padding")
    low, high, mask, opts = make_problem(case, torch.float32)
    fast = call_form(triton_causal_efficient_taylor_shift, low, mask, opts, case,
                     chunk_size=CHUNK)  # fmt: skip
    torch.autograd.grad(fast.sum(), low[:3])
    assert widths and all(w == (16, True, 2, 16) for w in widths), widths
    assert_rel_close(fast, call_reference(high, mask, opts, is_causal=True), 1e-5, "output",
                     atol=1e-7)  # fmt: skip


# (chunks of keys, chunks of queries): as many, more queries (their prefix is the whole
# keys'), more keys (the suffix of the first key chunks takes the later query chunks), none
SCAN_SHAPES = [(3, 3), (2, 5), (5, 2), (0, 3), (4, 0), (1, 1)]


@pytest.mark.parametrize(("n_keys", "n_queries"), SCAN_SHAPES)
@pytest.mark.parametrize("start", [False, True], ids=["from-zero", "from-a-state"])
def test_the_scan_kernel_gives_the_prefix_and_suffix_states(launches, n_keys, n_queries, start):
    # Against the torch forms beside it and float64 sums; 1,100 entries a state: two
    # programs of SCAN_BLOCK, the second one partly masked.
    from taylorshift.ops.triton import efficient_causal as ec

    g = torch.Generator().manual_seed(n_keys * 10 + n_queries)
    bh, size = 3, ec.SCAN_BLOCK + 76
    keys = torch.randn(bh, n_keys, size, generator=g)
    queries = torch.randn(bh, n_queries, size, generator=g)
    first = torch.randn(bh, size, generator=g) if start else None
    cases = [
        (ec._prefix(keys, n_queries, first), ec.prefix_reference, keys, n_queries),
        (ec._suffix(queries, n_keys, first), ec.suffix_reference, queries, n_keys),
    ]
    for got, reference, states, rows in cases:
        want = reference(states.double(), rows, None if first is None else first.double())
        assert got.shape == (bh * rows, size) and got.dtype == torch.float32
        assert_rel_close(got, want, 1e-6, reference.__name__, atol=1e-6)
        torch.testing.assert_close(got, reference(states, rows, first), rtol=1e-6, atol=1e-6)
    launches.ran("_scan_kernel")  # (every shape has chunks of keys or of queries)
