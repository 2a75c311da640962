"""The CPU causal kernel with a prefix state in and out (prompt prefill, a sequence in
segments, sequence parallelism), against the float64 PyTorch causal form from the same
state and the plain reference over the whole sequence.

Outputs, the state after the block and the gradients of query, key, value, a tensor
temperature and the prefix's sums: uneven chunks, Nq != Nk both ways (keys after the last
query join the state too), key padding, grouped-query attention (the state per key/value
head), tensor and float temperatures, plain scores; float16 / bfloat16 within SPEC §8's
rule; the layout change both ways; gradients asked as a graph; the routing of
``taylor_shift_attention`` and ``taylor_shift_decode`` (eager: the kernel; traced by
torch.compile: its custom ops, which pass opcheck).
"""

from __future__ import annotations

import pytest
import torch

from taylorshift import TaylorShiftState, naive_taylor_shift_attention, taylor_shift_attention
from taylorshift.ops.cpu import efficient_causal as cpu_causal
from taylorshift.ops.cpu.efficient_causal import cpu_causal_efficient_taylor_shift
from taylorshift.ops.cpu.wrapper import forward_pass
from taylorshift.ops.taylor_shift import fused
from taylorshift.ops.taylor_shift.decode import taylor_shift_decode
from taylorshift.ops.taylor_shift.efficient_causal import causal_efficient_taylor_shift
from taylorshift.ops.taylor_shift.features import feature_dim
from tests.helpers import assert_rel_close
from tests.ops.state_cases import (
    check_graph_gradients,
    check_segments,
    check_sixteen_bit,
    check_state_in_and_out,
    prefix_state,
    state_problem,
)

# (B, H, Hkv, N before, Nq, Nk, d, dv, chunk, key padding, temperature, normalize)
CASES = [
    (1, 2, 2, 0, 9, 9, 8, 5, 4, False, "float", True),
    (2, 2, 2, 13, 37, 37, 16, 16, 8, True, "tensor", True),
    (1, 2, 2, 7, 20, 33, 16, 7, 8, True, "float", True),  # keys after the last query
    (1, 2, 2, 7, 33, 20, 17, 12, 8, False, "tensor", True),  # queries after the last key
    (2, 4, 2, 11, 30, 30, 8, 8, 7, True, "tensor", True),  # grouped queries
    (1, 6, 2, 5, 26, 40, 16, 9, None, False, "float", False),  # grouped, plain scores
    (1, 4, 4, 300, 300, 300, 16, 16, None, True, "float", True),  # d <= 20, token lanes
    (1, 1, 1, 20, 70, 70, 64, 3, 16, False, "float", True),
]
IDS = [f"B{c[0]}-H{c[1]}-kv{c[2]}-before{c[3]}-Nq{c[4]}-Nk{c[5]}-d{c[6]}" for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_state_in_and_out_match_the_float64_torch_form(case):
    check_state_in_and_out(cpu_causal_efficient_taylor_shift, *case)


@pytest.mark.parametrize("normalize", [True, False], ids=["norm", "plain-scores"])
def test_segments_equal_one_sweep_over_the_whole(normalize):
    """Three segments through the kernel, each from the last one's state, give the rows of
    the plain reference over the whole sequence."""
    bounds = ((0, 31), (31, 32), (32, 90))
    check_segments(cpu_causal_efficient_taylor_shift, 2, 2, 90, 16, 12, bounds, normalize, 8)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_sixteen_bit_error_within_reference_error(dtype):
    check_sixteen_bit(cpu_causal_efficient_taylor_shift, dtype)


def test_a_state_not_wanted_after_the_block_takes_no_key_no_later_query_reads():
    # chunk < 0 (efficient_causal.c): a prefix in and no state out, so the sweep stops adding
    # keys where later queries stop reading them; 20 tokens in chunks of 8 leave the last
    # chunk's 4 out of the kernel's buffer, and the output is bitwise the same
    b, h, n, d, dv = 1, 2, 20, 8, 5
    q, k, v, k0, v0, _, _ = state_problem(b, h, h, 6, n, n, d, dv, False, "float")
    start = prefix_state(k0, v0, h, True)

    def sweep(option):
        prefix = cpu_causal.kernel_state(start.sums.float(), b * h, d, dv)
        y, *_, after = forward_pass(
            "causal", option, *(x.float() for x in (q, k, v)), None, None, 1.0, True, prefix
        )
        return y, cpu_causal.public_state(after, b, h, d, dv).sums

    (y_kept, kept), (y, scratch) = sweep(8), sweep(-8)
    assert torch.equal(y, y_kept)
    for keys, got in ((20, kept), (16, scratch)):
        _, want = causal_efficient_taylor_shift(
            q[:, :, :keys], k[:, :, :keys], v[:, :, :keys], None, 1.0, None, True,
            initial_state=start, output_final_state=True,
        )  # fmt: skip
        assert_rel_close(got, want.sums, 1e-5, f"state after {keys} keys", atol=1e-6)


def test_layout_change_is_exact_both_ways():
    """``kernel_state`` and ``public_state`` undo each other bitwise, and the kernel's layout
    holds each feature's sum at its pair (a, b) of [x, 1], weighted by 1/2 on x_a²."""
    d, dv = 5, 3
    sums = torch.randn(2, 3, feature_dim(d), dv + 1)
    state = cpu_causal.kernel_state(sums, 6, d, dv)
    back = cpu_causal.public_state(state, 2, 3, d, dv)
    assert torch.equal(back.sums, sums)
    assert torch.equal(back.count, sums[..., -1, -1])
    # the features' order: x_a x_b (a <= b < d) row by row, then x, then 1; the kernels':
    # the pairs of [x, 1] row by row, so x_0 (pair (0, d)) comes right after row 0's products
    flat = state.reshape(2, 3, -1, state.shape[-1])[..., : dv + 1]
    quad = d * (d + 1) // 2
    assert torch.equal(flat[:, :, 0], sums[:, :, 0] * 0.5)  # x_0²
    assert torch.equal(flat[:, :, 1], sums[:, :, 1])  # x_0 x_1
    assert torch.equal(flat[:, :, d], sums[:, :, quad])  # x_0
    assert torch.equal(flat[:, :, d + 1], sums[:, :, d] * 0.5)  # x_1²
    assert torch.equal(flat[:, :, feature_dim(d) - 1], sums[:, :, -1])  # the constant 1
    assert (state[:, feature_dim(d) :] == 0).all() and (state[..., dv + 1 :] == 0).all()


def test_gradients_asked_as_a_graph():
    check_graph_gradients(cpu_causal_efficient_taylor_shift, 8)


def test_public_op_routes_state_calls_to_the_kernel(routed, c_calls):
    calls = routed
    b, h, hk, n, d = 1, 4, 2, 40, 16
    q, k, v, *_ = state_problem(b, h, hk, 0, n, n, d, d, False, "float")
    q, k, v = q.float(), k.float(), v.float()
    out, state = taylor_shift_attention(
        q[:, :, :25], k[:, :, :25], v[:, :, :25], is_causal=True, output_final_state=True,
        enable_gqa=True,
    )  # fmt: skip
    rest = taylor_shift_attention(
        q[:, :, 25:], k[:, :, 25:], v[:, :, 25:], is_causal=True, initial_state=state,
        enable_gqa=True,
    )  # fmt: skip
    assert calls == [fused.CPU_EFFICIENT_CAUSAL] * 2
    c_calls.ran("ts_causal_forward")  # it ran, and nothing fell back to the PyTorch form
    assert c_calls["ts_causal_forward"] == 2
    whole = taylor_shift_attention(q, k, v, is_causal=True, enable_gqa=True, mode="efficient")
    assert_rel_close(torch.cat([out, rest], 2), whole, 1e-5, "segments", atol=1e-7)
    calls.clear()
    # autograd records the call: the kernel too
    sums = state.sums.clone().requires_grad_()
    start = TaylorShiftState(sums, state.count)
    y = taylor_shift_attention(q, k, v, is_causal=True, initial_state=start, enable_gqa=True)
    assert calls == [fused.CPU_EFFICIENT_CAUSAL]
    assert y.requires_grad  # (its gradients: the float64 tests above)


@pytest.mark.parametrize("temperature", ["float", "tensor"])
def test_traced_state_calls_run_the_kernels_custom_ops(temperature):
    # torch.compile keeps the kernel (two custom ops, forward and backward) where it had
    # fallen back to the PyTorch causal form: a prefill with its state out, a segment from
    # a state in, grouped heads, key padding; outputs, the state and every gradient (of a
    # loss on both) as the eager kernel gives them.
    b, h, hk, n, d = 2, 4, 2, 37, 16
    q, k, v, k0, v0, mask, tau = state_problem(b, h, hk, 11, n, n, d, 9, True, temperature)
    start = prefix_state(k0, v0, hk, True)
    q, k, v = (x.float().requires_grad_() for x in (q, k, v))
    if isinstance(tau, torch.Tensor):
        tau = tau.float().requires_grad_()
    sums = start.sums.float().requires_grad_()
    pad = mask[:, :1, None, :]  # (B, 1, 1, Nk)

    def call(q, k, v, tau, sums):
        first = TaylorShiftState.from_sums(sums)
        return taylor_shift_attention(
            q, k, v, pad, True, temperature=tau, initial_state=first, output_final_state=True,
            enable_gqa=True,
        )  # fmt: skip

    seen = []

    def recording(gm, example_inputs):  # Dynamo's graph: which operators it calls
        seen.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return gm.forward

    torch.compile(call, backend=recording, fullgraph=True)(q, k, v, tau, sums)
    assert any("cpu_causal_state_forward" in target for target in seen), seen
    named = {"q": q, "k": k, "v": v, "tau": tau, "sums": sums}
    names = [name for name, x in named.items() if isinstance(x, torch.Tensor)]
    inputs = [named[name] for name in names]
    (y, after), (y_c, after_c) = (
        call(q, k, v, tau, sums),
        torch.compile(call, backend="aot_eager", fullgraph=True)(q, k, v, tau, sums),
    )
    assert_rel_close(y_c, y, 1e-6, "output", atol=1e-7)
    assert_rel_close(after_c.sums, after.sums, 1e-6, "state", atol=1e-7)
    assert torch.equal(after_c.count, after.count)
    g, r = torch.randn_like(y), torch.randn_like(after.sums)  # (the state is differentiable)
    got = torch.autograd.grad((y_c, after_c.sums), inputs, (g, r))
    want = torch.autograd.grad((y, after.sums), inputs, (g, r))
    for name, a, e in zip(names, got, want, strict=True):
        assert_rel_close(a, e, 1e-5, f"gradient of {name}", atol=1e-6)


def test_state_custom_ops_pass_opcheck():
    b, h, hk, n, d, dv = 1, 4, 2, 9, 8, 5
    q, k, v, k0, v0, mask, _ = state_problem(b, h, hk, 6, n, n, d, dv, True, "float")
    sums = prefix_state(k0, v0, hk, True).sums.float().requires_grad_()
    q, k, v = (x.float().requires_grad_() for x in (q, k, v))
    factors = torch.rand(b * h, requires_grad=True)
    op = torch.ops.taylorshift.cpu_causal_state_forward.default
    torch.library.opcheck(op, (q, k, v, mask.contiguous(), factors, True, 4, sums))
    torch.library.opcheck(op, (q, k, v, None, factors, False, 3, None))


def test_decode_prefills_with_the_kernel_and_continues_token_by_token(routed, c_calls):
    calls = routed
    b, h, n, d = 2, 2, 50, 8
    q, k, v, _, _, _, tau = state_problem(b, h, h, 0, n, n, d, d, False, "tensor")
    exact = naive_taylor_shift_attention(q, k, v, is_causal=True, temperature=tau)
    q, k, v, tau = q.float(), k.float(), v.float(), tau.float()
    mask = torch.ones(b, 40, dtype=torch.bool)
    mask[1, 30:] = False  # the second prompt is 30 tokens long: right padding
    prompt = (x[:, :, :40] for x in (q, k, v))
    out, state = taylor_shift_decode(*prompt, None, mask, temperature=tau)
    assert calls == [fused.CPU_EFFICIENT_CAUSAL]
    c_calls.ran("ts_causal_forward")  # the prefill ran in the kernel, nothing fell back
    assert torch.equal(state.count, torch.tensor([[40.0, 40.0], [30.0, 30.0]]))
    assert_rel_close(out[0], exact[0, :, :40], 1e-5, "prefill", atol=1e-7)
    assert_rel_close(out[1, :, :30], exact[1, :, :30], 1e-5, "padded prefill", atol=1e-7)
    # the first prompt goes on token by token from the kernel's state, in place
    one = TaylorShiftState(state.sums[:1].clone(), state.count[:1].clone())
    for t in range(40, n):
        x = (z[:1, :, t : t + 1] for z in (q, k, v))
        y, one = taylor_shift_decode(*x, one, temperature=tau, inplace=True)
        assert_rel_close(y, exact[:1, :, t : t + 1], 1e-5, f"token {t}", atol=1e-7)
