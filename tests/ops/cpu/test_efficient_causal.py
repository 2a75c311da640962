"""The causal efficient form with the CPU kernels against the plain reference and the torch
causal form.

Outputs and gradients (query, key, value, tensor temperature) in float32 and float16 /
bfloat16 (SPEC §8 rule), chunks that cut the lengths unevenly (N = 1, 7, 70 with chunks of
8 and the default 256), key padding with fully masked rows, Nq != Nk both ways, dv != d;
grouped-query attention (key and value with fewer heads, the state per key/value head);
the routing of ``taylor_shift_attention`` (eager and traced calls to the kernels, grouped
ones with their key/value heads, stateful ones too) and the custom ops. Calls with a
state: test_efficient_causal_state.py.
"""

from __future__ import annotations

import pytest
import torch

from taylorshift import naive_taylor_shift_attention, taylor_shift_attention
from taylorshift.ops.cpu import wrapper
from taylorshift.ops.cpu.efficient_causal import cpu_causal_efficient_taylor_shift
from taylorshift.ops.taylor_shift import dispatch, fused, interface
from taylorshift.ops.taylor_shift.checks import Problem
from taylorshift.ops.taylor_shift.efficient_causal import causal_efficient_taylor_shift
from tests.helpers import assert_rel_close, key_padding
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


def test_public_op_routes_eager_causal_calls_to_the_kernels(routed, c_calls, monkeypatch):
    calls = routed
    q, k, v = (torch.randn(1, 2, 9, 8, requires_grad=True) for _ in range(3))
    y = taylor_shift_attention(q, k, v, is_causal=True, mode="efficient")
    assert calls == [fused.CPU_EFFICIENT_CAUSAL]
    c_calls.ran("ts_causal_forward")  # it ran, and nothing fell back to the PyTorch form
    calls.clear()
    ref = causal_efficient_taylor_shift(q, k, v, None, 1.0, None, True)
    assert_rel_close(y, ref, 1e-5, "routed output", atol=1e-7)
    # a state in or out: the kernel too (test_efficient_causal_state.py)
    _, state = taylor_shift_attention(
        q, k, v, is_causal=True, mode="efficient", output_final_state=True
    )
    taylor_shift_attention(q, k, v, is_causal=True, mode="efficient", initial_state=state)
    assert calls == [fused.CPU_EFFICIENT_CAUSAL] * 2
    calls.clear()
    # traced: the kernels' custom ops, whole (fullgraph), forward and backward
    compiled = torch.compile(
        lambda *x: taylor_shift_attention(*x, is_causal=True, mode="efficient"),
        backend="aot_eager", fullgraph=True,
    )  # fmt: skip
    c_calls.clear()
    y_compiled = compiled(q, k, v)
    assert calls == [fused.CPU_EFFICIENT_CAUSAL]
    c_calls.ran("ts_causal_forward")
    assert_rel_close(y_compiled, ref, 1e-5, "compiled output", atol=1e-7)
    g = torch.randn_like(ref)
    for name, a, e in zip(
        "qkv", torch.autograd.grad(y_compiled, (q, k, v), g),
        torch.autograd.grad(ref, (q, k, v), g), strict=True,
    ):  # fmt: skip
        assert_rel_close(a, e, 2e-5, f"compiled grad {name}", atol=1e-6)
    c_calls.ran("ts_causal_backward")


GROUPED = [  # (B, H, Hkv, Nq, Nk, d, dv, chunk, key padding, temperature per head)
    (2, 6, 2, 37, 37, 8, 5, 8, False, False),
    (1, 4, 1, 50, 50, 16, 16, 16, True, True),
    (1, 4, 2, 30, 45, 8, 8, 7, True, False),
    (1, 4, 2, 45, 30, 17, 12, 7, False, True),
    (2, 8, 2, 300, 300, 16, 16, None, True, True),  # d <= 20, 4 x 256 tokens: token lanes
]


@pytest.mark.parametrize("b, h, hk, nq, nk, d, dv, chunk, padded, per_head", GROUPED)
def test_grouped_heads_match_repeated_keys(b, h, hk, nq, nk, d, dv, chunk, padded, per_head):
    # key and value with Hkv heads, query head i reading head i // G: outputs and gradients
    # (q, k, v, τ) against the float64 reference on key and value repeated to H heads
    # (SPEC §8), and against the kernel on the repeated heads, which the grouped sweep
    # must match to float32 rounding (the state is the same per key/value head)
    gen = torch.Generator().manual_seed(nq + nk)
    q = torch.randn(b, h, nq, d, generator=gen)
    k, v = torch.randn(b, hk, nk, d, generator=gen), torch.randn(b, hk, nk, dv, generator=gen)
    tau = torch.linspace(0.6, 1.8, h).view(1, h, 1, 1) if per_head else torch.tensor(1.3)
    mask = key_padding(b, nk, seed=nq) if padded else None
    key_mask = None if mask is None else mask[:, :, 0, :]
    groups = h // hk
    grad = torch.randn(b, h, nq, dv, generator=gen)
    results = []
    for dtype, grouped in ((torch.float32, True), (torch.float32, False), (torch.float64, False)):
        leaves = [x.to(dtype).requires_grad_() for x in (q, k, v, tau)]
        ql, kl, vl, tl = leaves
        if not grouped:
            kl, vl = kl.repeat_interleave(groups, 1), vl.repeat_interleave(groups, 1)
        if dtype == torch.float64:
            out = naive_taylor_shift_attention(ql, kl, vl, mask, True, temperature=tl)
        else:
            out = cpu_causal_efficient_taylor_shift(ql, kl, vl, key_mask, tl, None, True, chunk)
        results.append((out, *torch.autograd.grad(out, leaves, grad.to(dtype))))
    names = ["out", "dq", "dk", "dv", "dtau"]
    for name, got, repeated, want in zip(names, *results, strict=True):
        assert got.dtype == torch.float32 and got.shape == want.shape, name
        assert_rel_close(got, want, 2e-5, f"grouped {name} vs float64", atol=1e-6)
        assert_rel_close(got, repeated, 1e-6, f"grouped {name} vs repeated", atol=1e-7)


@pytest.fixture
def key_heads_seen(monkeypatch) -> list:
    """(form, key heads) of every CPU kernel forward pass during the test."""
    seen = []
    real = wrapper.forward_pass

    def spy(form, option, query, key, *args):
        seen.append((form, key.shape[1]))
        return real(form, option, query, key, *args)

    monkeypatch.setattr(wrapper, "forward_pass", spy)
    return seen


def test_public_op_gives_grouped_causal_calls_their_key_value_heads(routed, key_heads_seen):
    calls, seen = routed, key_heads_seen
    # enable_gqa, causal, efficient: the kernel takes key and value with their 2 heads (the
    # state per key/value head); the direct form and a mask that differs between the heads
    # of a group take them repeated to the query's 4
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(1, 4, 40, 8, generator=gen, requires_grad=True)
    k, v = (torch.randn(1, 2, 40, 8, generator=gen, requires_grad=True) for _ in "kv")
    pad = key_padding(1, 40, seed=2)
    want = naive_taylor_shift_attention(
        *(x.double() for x in (q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))), pad,
        True,
    )  # fmt: skip
    y = taylor_shift_attention(q, k, v, pad, True, mode="efficient", enable_gqa=True)
    assert calls == [fused.CPU_EFFICIENT_CAUSAL] and seen == [("causal", 2)]
    assert_rel_close(y, want, 1e-5, "grouped output", atol=1e-7)
    seen.clear()
    taylor_shift_attention(q, k, v, pad, True, mode="direct", enable_gqa=True)
    per_head = torch.rand(1, 4, 1, 40, generator=gen) > 0.3
    taylor_shift_attention(q, k, v, per_head, True, mode="efficient", enable_gqa=True)
    assert seen == [("direct", 4), ("causal", 4)]
    # traced whole: the custom ops with the key/value heads, forward and backward
    seen.clear()
    compiled = torch.compile(
        lambda *x: taylor_shift_attention(*x, pad, True, mode="efficient", enable_gqa=True),
        backend="aot_eager", fullgraph=True,
    )  # fmt: skip
    y_compiled = compiled(q, k, v)
    assert seen == [("causal", 2)]
    assert_rel_close(y_compiled, want, 1e-5, "compiled grouped output", atol=1e-7)
    g = torch.randn(y.shape, generator=gen)
    for name, a, e in zip(
        "qkv", torch.autograd.grad(y_compiled, (q, k, v), g),
        torch.autograd.grad(y, (q, k, v), g), strict=True,
    ):  # fmt: skip
        assert_rel_close(a, e, 1e-6, f"compiled grouped grad {name}", atol=1e-7)


def test_grouped_problem_scales_the_lengths_by_the_shared_key_side():
    # G query heads per key/value head: cost ~ (1 + 1/G) / 2 of an ungrouped call, so the
    # lengths auto weighs grow by 2G / (G + 1); one group per head weighs as it is
    problem = Problem(1, 8, 100, 60, 16, 16, None, None, False)
    assert (interface.grouped_problem(problem, 1).n_query, problem.n_query) == (100, 100)
    scaled = interface.grouped_problem(problem, 4)
    assert (scaled.n_query, scaled.n_key, scaled.heads) == (160, 96, problem.heads)


def test_auto_runs_grouped_causal_calls_efficient_earlier(isolated_cache_dir, key_heads_seen):
    # a length between the grouped switch (the ungrouped one x 5/8 for G = 4) and the
    # ungrouped switch: the grouped call runs the efficient kernel, the same call with key
    # and value repeated (no grouping) the direct form
    seen = key_heads_seen
    d, heads = 16, 8
    switch = dispatch.switch_length(
        d, d, causal=True, order=2, mask_varies=False, device=torch.device("cpu"),
        dtype=torch.float32, backward=False, batch_heads=heads,
    )  # fmt: skip
    n = switch * 4 // 5  # in (5/8, 1) of the switch
    gen = torch.Generator().manual_seed(9)
    q = torch.randn(1, heads, n, d, generator=gen)
    k, v = (torch.randn(1, 2, n, d, generator=gen) for _ in "kv")
    grouped = taylor_shift_attention(q, k, v, is_causal=True, enable_gqa=True)
    plain = taylor_shift_attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1),
                                   is_causal=True)  # fmt: skip
    assert seen == [("causal", 2), ("direct", heads)]
    assert_rel_close(grouped, plain, 1e-5, "grouped auto vs plain auto", atol=1e-7)


def test_grouped_causal_call_that_auto_runs_direct_is_weighed_once(key_heads_seen, monkeypatch):
    # a short grouped causal call: auto picks the direct form for the grouped call, and the
    # call with key and value repeated takes that choice instead of weighing again
    decisions = []
    real = dispatch.decide_mode

    def spy(*args, **kwargs):
        decision = real(*args, **kwargs)
        decisions.append(decision.mode)
        return decision

    monkeypatch.setattr(dispatch, "decide_mode", spy)
    q = torch.randn(1, 4, 16, 8)
    k, v = torch.randn(1, 2, 16, 8), torch.randn(1, 2, 16, 8)
    taylor_shift_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert decisions == ["direct"] and key_heads_seen == [("direct", 4)]


def test_non_causal_kernel_forms_refuse_fewer_key_heads():
    # only the causal form's C passes read a group; the others would read one head each
    q, k = torch.randn(1, 4, 8, 8), torch.randn(1, 2, 8, 8)
    with pytest.raises(ValueError, match=r"key must have the query's 4 heads for the CPU "
                                         r"efficient form; got 2"):  # fmt: skip
        wrapper.forward_pass("efficient", 0, q, k, k, None, None, 1.0, True)


def test_custom_op_registration_passes_opcheck():
    case = Case(1, 2, 21, 21, 16, 12, mask="padding")
    low, _, mask, _ = make_problem(case, torch.float32)
    q, k, v = (x.detach().requires_grad_() for x in low[:3])
    factors = torch.rand(2, requires_grad=True)
    key_mask = mask[:, :, 0, :].expand(1, 2, 21).contiguous()
    op = torch.ops.taylorshift.cpu_forward.default
    torch.library.opcheck(op, ("causal", 8, q, k, v, key_mask, factors, True))
    torch.library.opcheck(op, ("causal", 8, q, k, v, None, factors, False))
    # grouped: key, value and key mask with 1 head for the query's 2
    k1, v1 = (x[:, :1].detach().requires_grad_() for x in (k, v))
    torch.library.opcheck(op, ("causal", 8, q, k1, v1, key_mask[:, :1], factors, True))
