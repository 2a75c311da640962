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
from taylorshift.ops.taylor_shift import fused
from taylorshift.ops.taylor_shift.decode import taylor_shift_decode
from taylorshift.ops.taylor_shift.efficient_causal import causal_efficient_taylor_shift
from taylorshift.ops.taylor_shift.features import feature_dim
from tests.helpers import assert_rel_close, key_padding, rel_error

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


def _problem(b, h, hk, before, nq, nk, d, dv, padded, temperature, seed=0):
    """float64 (query, key, value) of the block, the prefix's (key, value), the block's key
    mask (B, Hkv, Nk) or None and the temperature (float, or a tensor per query head)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, nq, d, generator=g, dtype=torch.float64)
    k, k0 = (torch.randn(b, hk, n, d, generator=g, dtype=torch.float64) for n in (nk, before))
    v, v0 = (torch.randn(b, hk, n, dv, generator=g, dtype=torch.float64) for n in (nk, before))
    mask = None
    if padded:
        mask = key_padding(b, nk, seed=seed, empty_row=False)[:, :, 0].expand(b, hk, nk)
    tau = 1.3
    if temperature == "tensor":
        tau = 0.5 + torch.rand(1, h, 1, 1, generator=g, dtype=torch.float64)
    return q, k, v, k0, v0, mask, tau


def _prefix_state(k0, v0, h, normalize) -> TaylorShiftState | None:
    """The state after the keys k0, v0 (float64, by the PyTorch form), None for no key."""
    b, _, before, d = k0.shape
    if before == 0:
        return None
    q0 = torch.zeros(b, h, before, d, dtype=k0.dtype)
    _, state = causal_efficient_taylor_shift(
        q0, k0, v0, None, 1.0, None, normalize, output_final_state=True
    )
    return state


def _float32(state: TaylorShiftState | None) -> TaylorShiftState | None:
    if state is None:
        return None
    return TaylorShiftState(state.sums.float(), state.count.float())


def _tau32(tau):
    return tau.float() if isinstance(tau, torch.Tensor) else tau


def _tensors(tau, state: TaylorShiftState | None) -> tuple:
    """The differentiable inputs besides q, k, v: a tensor temperature, the state's sums."""
    return tuple(x for x in (tau, None if state is None else state.sums) if torch.is_tensor(x))


def _tensor_or(tau, inputs: list):
    """The temperature among ``inputs`` (after q, k, v) if it is a tensor, else the float."""
    return inputs[3] if isinstance(tau, torch.Tensor) else tau


def _with_sums(state: TaylorShiftState | None, inputs: list) -> TaylorShiftState | None:
    """``state`` with the sums among ``inputs`` (the last one) in place of its own."""
    return None if state is None else TaylorShiftState(inputs[-1], state.count)


@pytest.mark.parametrize(
    "b, h, hk, before, nq, nk, d, dv, chunk, padded, temperature, normalize", CASES, ids=IDS
)
def test_state_in_and_out_match_the_float64_torch_form(
    b, h, hk, before, nq, nk, d, dv, chunk, padded, temperature, normalize
):
    q, k, v, k0, v0, mask, tau = _problem(b, h, hk, before, nq, nk, d, dv, padded, temperature)
    if mask is not None:  # (the op drops masked keys' content before any form sees it)
        k, v = k * mask.unsqueeze(-1), v * mask.unsqueeze(-1)
    initial = _prefix_state(k0, v0, h, normalize)
    # the inputs whose gradients are compared: q, k, v, a tensor temperature, the sums
    exact_in = [x.requires_grad_() for x in (q, k, v, *_tensors(tau, initial))]
    fast_in = [x.detach().float().requires_grad_() for x in exact_in]
    exact, exact_state = causal_efficient_taylor_shift(
        *exact_in[:3], mask, _tensor_or(tau, exact_in), None, normalize, chunk,
        initial_state=_with_sums(initial, exact_in), output_final_state=True,
    )  # fmt: skip
    out, state = cpu_causal_efficient_taylor_shift(
        *fast_in[:3], mask, _tensor_or(_tau32(tau), fast_in), None, normalize, chunk,
        initial_state=_with_sums(_float32(initial), fast_in), output_final_state=True,
    )  # fmt: skip
    assert out.dtype == torch.float32 and state.sums.dtype == torch.float32
    assert state.sums.shape == (b, hk, feature_dim(d), dv + 1)
    assert not state.sums.requires_grad  # (the state returned carries no gradient)
    assert_rel_close(out, exact, 1e-5, "output", atol=1e-7)
    assert_rel_close(state.sums, exact_state.sums.detach(), 1e-6, "state sums")
    assert torch.equal(state.count, exact_state.count.float())
    assert state.count.is_contiguous()  # (the decoding step's kernel takes it as it is)
    g = torch.randn(exact.shape, generator=torch.Generator().manual_seed(5), dtype=exact.dtype)
    names = ["query", "key", "value"]
    names += ["temperature"] * isinstance(tau, torch.Tensor) + ["sums"] * (initial is not None)
    grads = torch.autograd.grad(out, fast_in, g.float())
    exact_grads = torch.autograd.grad(exact, exact_in, g)
    for name, a, e in zip(names, grads, exact_grads, strict=True):
        assert_rel_close(a, e, 2e-5, f"gradient of {name}", atol=1e-6)
    # only the output asked for: the same output
    with torch.no_grad():
        alone = cpu_causal_efficient_taylor_shift(
            *fast_in[:3], mask, _tensor_or(_tau32(tau), fast_in), None, normalize, chunk,
            initial_state=_with_sums(_float32(initial), fast_in),
        )  # fmt: skip
    assert torch.equal(alone, out)


@pytest.mark.parametrize("normalize", [True, False], ids=["norm", "plain-scores"])
def test_segments_equal_one_sweep_over_the_whole(normalize):
    """Three segments through the kernel, each from the last one's state, give the rows of
    the plain reference over the whole sequence."""
    b, h, n, d, dv = 2, 2, 90, 16, 12
    q, k, v, *_ = _problem(b, h, h, 0, n, n, d, dv, False, "float")
    exact = naive_taylor_shift_attention(q, k, v, is_causal=True, normalize=normalize)
    state, parts = None, []
    for i0, i1 in ((0, 31), (31, 32), (32, 90)):
        part, state = cpu_causal_efficient_taylor_shift(
            *(x[:, :, i0:i1].float() for x in (q, k, v)), None, 1.0, None, normalize, 8,
            initial_state=state, output_final_state=True,
        )  # fmt: skip
        parts.append(part)
    assert_rel_close(torch.cat(parts, 2), exact, 1e-5, "segments", atol=1e-7)
    assert torch.equal(state.count, torch.full((b, h), float(n)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_sixteen_bit_error_within_reference_error(dtype):
    """SPEC §8: the kernel's relative RMS error against float64 at most 2x the PyTorch
    form's own in ``dtype`` (from the same state), plus 1e-4."""
    q, k, v, k0, v0, mask, tau = _problem(1, 2, 2, 20, 30, 30, 16, 16, True, "float", seed=2)
    k, v = k * mask.unsqueeze(-1), v * mask.unsqueeze(-1)
    initial = _prefix_state(k0, v0, 2, True)
    exact = causal_efficient_taylor_shift(q, k, v, mask, tau, None, True, initial_state=initial)
    low = [x.to(dtype) for x in (q, k, v)]
    start = _float32(initial)
    ref_low = causal_efficient_taylor_shift(*low, mask, tau, None, True, initial_state=start)
    fast = cpu_causal_efficient_taylor_shift(*low, mask, tau, None, True, initial_state=start)
    assert fast.dtype == dtype
    err_fast, err_ref = rel_error(fast, exact), rel_error(ref_low, exact)
    assert err_fast <= 2 * err_ref + 1e-4, (err_fast, err_ref)


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
    """create_graph=True: without a prefix the plain reference's gradients, differentiable
    again; a call continuing a state refuses, as the PyTorch form does."""
    q, k, v = (torch.randn(1, 2, 9, 8, requires_grad=True) for _ in range(3))
    out, _ = cpu_causal_efficient_taylor_shift(
        q, k, v, None, 1.0, None, True, output_final_state=True
    )
    (gq,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    exact = naive_taylor_shift_attention(q, k, v, is_causal=True)
    (gq_exact,) = torch.autograd.grad(exact.square().sum(), q, create_graph=True)
    assert_rel_close(gq, gq_exact, 2e-5, "gradient", atol=1e-6)
    assert gq.requires_grad
    state = TaylorShiftState.zeros(1, 2, 8, 8)
    out = cpu_causal_efficient_taylor_shift(q, k, v, None, 1.0, None, True, initial_state=state)
    with pytest.raises(RuntimeError, match=r"initial_state.*first-order gradients only"):
        torch.autograd.grad(out.sum(), q, create_graph=True)


def test_public_op_routes_state_calls_to_the_kernel(routed):
    calls = routed
    b, h, hk, n, d = 1, 4, 2, 40, 16
    q, k, v, *_ = _problem(b, h, hk, 0, n, n, d, d, False, "float")
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
    # a state in, grouped heads, key padding; outputs, the state and every gradient as
    # the eager kernel gives them.
    b, h, hk, n, d = 2, 4, 2, 37, 16
    q, k, v, k0, v0, mask, tau = _problem(b, h, hk, 11, n, n, d, 9, True, temperature)
    start = _prefix_state(k0, v0, hk, True)
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
    g = torch.randn_like(y)
    got, want = torch.autograd.grad(y_c, inputs, g), torch.autograd.grad(y, inputs, g)
    for name, a, e in zip(names, got, want, strict=True):
        assert_rel_close(a, e, 1e-5, f"gradient of {name}", atol=1e-6)


def test_state_custom_ops_pass_opcheck():
    b, h, hk, n, d, dv = 1, 4, 2, 9, 8, 5
    q, k, v, k0, v0, mask, _ = _problem(b, h, hk, 6, n, n, d, dv, True, "float")
    sums = _prefix_state(k0, v0, hk, True).sums.float().requires_grad_()
    q, k, v = (x.float().requires_grad_() for x in (q, k, v))
    factors = torch.rand(b * h, requires_grad=True)
    op = torch.ops.taylorshift.cpu_causal_state_forward.default
    torch.library.opcheck(op, (q, k, v, mask.contiguous(), factors, True, 4, sums))
    torch.library.opcheck(op, (q, k, v, None, factors, False, 3, None))


def test_decode_prefills_with_the_kernel_and_continues_token_by_token(routed):
    calls = routed
    b, h, n, d = 2, 2, 50, 8
    q, k, v, _, _, _, tau = _problem(b, h, h, 0, n, n, d, d, False, "tensor")
    exact = naive_taylor_shift_attention(q, k, v, is_causal=True, temperature=tau)
    q, k, v, tau = q.float(), k.float(), v.float(), tau.float()
    mask = torch.ones(b, 40, dtype=torch.bool)
    mask[1, 30:] = False  # the second prompt is 30 tokens long: right padding
    prompt = (x[:, :, :40] for x in (q, k, v))
    out, state = taylor_shift_decode(*prompt, None, mask, temperature=tau)
    assert calls == [fused.CPU_EFFICIENT_CAUSAL]
    assert torch.equal(state.count, torch.tensor([[40.0, 40.0], [30.0, 30.0]]))
    assert_rel_close(out[0], exact[0, :, :40], 1e-5, "prefill", atol=1e-7)
    assert_rel_close(out[1, :, :30], exact[1, :, :30], 1e-5, "padded prefill", atol=1e-7)
    # the first prompt goes on token by token from the kernel's state, in place
    one = TaylorShiftState(state.sums[:1].clone(), state.count[:1].clone())
    for t in range(40, n):
        x = (z[:1, :, t : t + 1] for z in (q, k, v))
        y, one = taylor_shift_decode(*x, one, temperature=tau, inplace=True)
        assert_rel_close(y, exact[:1, :, t : t + 1], 1e-5, f"token {t}", atol=1e-7)
