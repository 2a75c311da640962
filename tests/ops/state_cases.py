"""Shared cases of the fused causal forms with a prefix state in and out (the CPU kernel
and the Triton kernels): the problem, the prefix state from the float64 PyTorch form, and
the checks every such form passes (float32 against the float64 PyTorch form from the same
state; a sequence in segments against the plain reference over the whole; 16-bit within
SPEC §8's rule)."""

from __future__ import annotations

import pytest
import torch

from taylorshift import TaylorShiftState, naive_taylor_shift_attention
from taylorshift.ops.taylor_shift.efficient_causal import causal_efficient_taylor_shift
from taylorshift.ops.taylor_shift.features import feature_dim
from tests.helpers import assert_rel_close, key_padding, rel_error


def state_problem(b, h, hk, before, nq, nk, d, dv, padded, temperature, seed=0):
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


def prefix_state(k0, v0, h, normalize) -> TaylorShiftState | None:
    """The state after the keys k0, v0 (float64, by the PyTorch form), None for no key."""
    b, _, before, d = k0.shape
    if before == 0:
        return None
    q0 = torch.zeros(b, h, before, d, dtype=k0.dtype)
    _, state = causal_efficient_taylor_shift(
        q0, k0, v0, None, 1.0, None, normalize, output_final_state=True
    )
    return state


def float32_state(state: TaylorShiftState | None) -> TaylorShiftState | None:
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


def check_state_in_and_out(
    form, b, h, hk, before, nq, nk, d, dv, chunk, padded, temperature, normalize
) -> None:
    """``form`` (a fused causal form) with a prefix state in and the state out, float32,
    against the float64 PyTorch causal form from the same state: the output (1e-5), the
    state after the block (1e-6; its count exactly) and the gradients of query, key, value,
    a tensor temperature and the prefix's sums from a loss on both the output and the state
    after (2e-5, relative); and the output alone, without the state asked for, is the
    same. (The PyTorch form's own state gradient: gradcheck in tests/ops/test_causal_state.py.)"""
    q, k, v, k0, v0, mask, tau = state_problem(b, h, hk, before, nq, nk, d, dv, padded, temperature)
    if mask is not None:  # (the op drops masked keys' content before any form sees it)
        k, v = k * mask.unsqueeze(-1), v * mask.unsqueeze(-1)
    initial = prefix_state(k0, v0, h, normalize)
    # the inputs whose gradients are compared: q, k, v, a tensor temperature, the sums
    exact_in = [x.requires_grad_() for x in (q, k, v, *_tensors(tau, initial))]
    fast_in = [x.detach().float().requires_grad_() for x in exact_in]
    exact, exact_state = causal_efficient_taylor_shift(
        *exact_in[:3], mask, _tensor_or(tau, exact_in), None, normalize, chunk,
        initial_state=_with_sums(initial, exact_in), output_final_state=True,
    )  # fmt: skip
    out, state = form(
        *fast_in[:3], mask, _tensor_or(_tau32(tau), fast_in), None, normalize, chunk,
        initial_state=_with_sums(float32_state(initial), fast_in), output_final_state=True,
    )  # fmt: skip
    assert out.dtype == torch.float32 and state.sums.dtype == torch.float32
    assert state.sums.shape == (b, hk, feature_dim(d), dv + 1)
    assert_rel_close(out, exact, 1e-5, "output", atol=1e-7)
    assert_rel_close(state.sums, exact_state.sums.detach(), 1e-6, "state sums")
    assert torch.equal(state.count, exact_state.count.float())
    assert state.count.is_contiguous()  # (the decoding step's kernel takes it as it is)
    g = torch.randn(exact.shape, generator=torch.Generator().manual_seed(5), dtype=exact.dtype)
    names = ["query", "key", "value"]
    names += ["temperature"] * isinstance(tau, torch.Tensor) + ["sums"] * (initial is not None)
    # a loss on the state after the block too: it reaches key, value and the prefix's sums
    r = torch.randn(state.sums.shape, generator=torch.Generator().manual_seed(6))
    grads = torch.autograd.grad((out, state.sums), fast_in, (g.float(), r.float()))
    exact_grads = torch.autograd.grad((exact, exact_state.sums), exact_in, (g, r.double()))
    for name, a, e in zip(names, grads, exact_grads, strict=True):
        assert_rel_close(a, e, 2e-5, f"gradient of {name}", atol=1e-6)
    # only the output asked for: the same output
    with torch.no_grad():
        alone = form(
            *fast_in[:3], mask, _tensor_or(_tau32(tau), fast_in), None, normalize, chunk,
            initial_state=_with_sums(float32_state(initial), fast_in),
        )  # fmt: skip
    assert torch.equal(alone, out)


def check_segments(form, b, h, n, d, dv, bounds, normalize, chunk) -> None:
    """Segments ``bounds`` ((start, end), covering 0..n) through ``form``, each from the last
    one's state, give the rows of the plain reference over the whole sequence, and the same
    gradients of query, key and value: a later segment's loss reaches the keys and values of
    the earlier ones through the states between them."""
    q, k, v, *_ = state_problem(b, h, h, 0, n, n, d, dv, False, "float")
    exact_in = [x.requires_grad_() for x in (q, k, v)]
    exact = naive_taylor_shift_attention(*exact_in, is_causal=True, normalize=normalize)
    fast_in = [x.detach().float().requires_grad_() for x in exact_in]
    state, parts = None, []
    for i0, i1 in bounds:
        part, state = form(
            *(x[:, :, i0:i1] for x in fast_in), None, 1.0, None, normalize, chunk,
            initial_state=state, output_final_state=True,
        )  # fmt: skip
        parts.append(part)
    out = torch.cat(parts, 2)
    assert_rel_close(out, exact, 1e-5, "segments", atol=1e-7)
    assert torch.equal(state.count, torch.full((b, h), float(n)))
    g = torch.randn(exact.shape, generator=torch.Generator().manual_seed(7), dtype=exact.dtype)
    grads = torch.autograd.grad(out, fast_in, g.float())
    exact_grads = torch.autograd.grad(exact, exact_in, g)
    for name, a, e in zip(("query", "key", "value"), grads, exact_grads, strict=True):
        assert_rel_close(a, e, 2e-5, f"gradient of {name} through the segments", atol=1e-6)


def check_sixteen_bit(form, dtype, chunk=None) -> None:
    """SPEC §8: ``form``'s relative RMS error against float64 at most 2x the PyTorch form's
    own in ``dtype`` (from the same state), plus 1e-4."""
    q, k, v, k0, v0, mask, tau = state_problem(1, 2, 2, 20, 30, 30, 16, 16, True, "float", 2)
    k, v = k * mask.unsqueeze(-1), v * mask.unsqueeze(-1)
    initial = prefix_state(k0, v0, 2, True)
    exact = causal_efficient_taylor_shift(q, k, v, mask, tau, None, True, initial_state=initial)
    low = [x.to(dtype) for x in (q, k, v)]
    start = float32_state(initial)
    ref_low = causal_efficient_taylor_shift(*low, mask, tau, None, True, initial_state=start)
    fast = form(*low, mask, tau, None, True, chunk, initial_state=start)
    assert fast.dtype == dtype
    err_fast, err_ref = rel_error(fast, exact), rel_error(ref_low, exact)
    assert err_fast <= 2 * err_ref + 1e-4, (err_fast, err_ref)


def check_graph_gradients(form, d, chunk=None) -> None:
    """create_graph=True: without a prefix the plain reference's gradients, differentiable
    again; a call continuing a state refuses, as the PyTorch form does."""
    q, k, v = (torch.randn(1, 2, 9, d, requires_grad=True) for _ in range(3))
    out, _ = form(q, k, v, None, 1.0, None, True, chunk, output_final_state=True)
    (gq,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    exact = naive_taylor_shift_attention(q, k, v, is_causal=True)
    (gq_exact,) = torch.autograd.grad(exact.square().sum(), q, create_graph=True)
    assert_rel_close(gq, gq_exact, 2e-5, "gradient", atol=1e-6)
    assert gq.requires_grad
    state = TaylorShiftState.zeros(1, 2, d, d)
    out = form(q, k, v, None, 1.0, None, True, chunk, initial_state=state)
    with pytest.raises(RuntimeError, match=r"initial_state.*first-order gradients only"):
        torch.autograd.grad(out.sum(), q, create_graph=True)
