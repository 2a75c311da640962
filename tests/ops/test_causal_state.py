"""The causal efficient form continued from a prefix state equals one sweep over the whole.

A sequence split at m: the second part, started from the state of the first part (a
``TaylorShiftState``: the unweighted sums and the key count), gives the rows m.. of the
whole causal result; its gradient w.r.t. that state is checked numerically (gradcheck,
float64), and so is the gradient of the state returned after a block (key, value, the state
before it): a sequence fed in segments has the gradients of one call over the whole.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from taylorshift import TaylorShiftState, naive_taylor_shift_attention
from taylorshift.ops.taylor_shift.efficient_causal import (
    causal_efficient_taylor_shift,
    causal_forward,
)
from taylorshift.ops.taylor_shift.features import feature_dim
from tests.helpers import assert_rel_close, key_padding, random_qkv


def _prefix(k, v, mask, normalize, chunk):
    """The state after keys k, v (B, H, m, ·) via the sweep itself (no queries)."""
    b, h, m, d = k.shape
    q = k.new_zeros((b, h, 0, d))
    _, _, _, state = causal_forward(q, k, v, 1.0, normalize, mask, chunk)
    count = torch.full((b, h), float(m), dtype=k.dtype) if mask is None else mask.sum(-1)
    assert torch.equal(state.count, count.to(k.dtype))
    # the count is also φ's constant feature times the ones column (sequence parallelism)
    assert torch.equal(TaylorShiftState.from_sums(state.sums).count, state.count)
    return state


@pytest.mark.parametrize("padding", [False, True], ids=["dense", "padded"])
@pytest.mark.parametrize("normalize", [True, False], ids=["norm", "plain-scores"])
@pytest.mark.parametrize(("n", "m", "chunk"), [(9, 4, 3), (40, 17, 8), (33, 32, 64), (5, 0, 2)])
def test_split_sequence_equals_whole(n, m, chunk, normalize, padding):
    b, h, d, dv = 2, 3, 5, 4
    q, k, v = random_qkv(b, h, n, n, d, dv, requires_grad=False)
    mask = key_padding(b, n, seed=3).reshape(b, 1, n).expand(b, h, n) if padding else None
    tau = 0.8 if normalize else None
    kwargs = dict(temperature=tau or 1.0, scale=None, normalize=normalize)
    whole = naive_taylor_shift_attention(
        q, k, v, None if mask is None else mask[:, :, None, :], True, **kwargs
    )
    state = _prefix(k[:, :, :m], v[:, :, :m], None if mask is None else mask[:, :, :m],
                    normalize, chunk)  # fmt: skip
    rest = causal_efficient_taylor_shift(
        q[:, :, m:], k[:, :, m:], v[:, :, m:], None if mask is None else mask[:, :, m:],
        chunk_size=chunk, initial_state=state, **kwargs,
    )  # fmt: skip
    assert_rel_close(rest, whole[:, :, m:], 1e-10, "continued rows")


@pytest.mark.parametrize("normalize", [True, False], ids=["norm", "plain-scores"])
def test_gradient_wrt_initial_state(normalize):
    b, h, n, d, dv = 1, 2, 6, 3, 2
    q, k, v = random_qkv(b, h, n, n, d, dv)
    g = torch.Generator().manual_seed(5)
    state = torch.rand(b, h, feature_dim(d), dv + 1, generator=g, dtype=torch.float64)
    state.requires_grad_()
    count = torch.full((b, h), 4.0, dtype=torch.float64)
    temperature = torch.tensor([[[[1.3]], [[0.7]]]], dtype=torch.float64, requires_grad=True)

    def f(q, k, v, s, t):
        return causal_efficient_taylor_shift(
            q, k, v, None, t if normalize else 1.0, None, normalize, chunk_size=4,
            initial_state=TaylorShiftState(s, count),
        )  # fmt: skip

    assert torch.autograd.gradcheck(f, (q, k, v, state, temperature))


@pytest.mark.parametrize("grouped", [False, True], ids=["mha", "gqa"])
@pytest.mark.parametrize("padding", [False, True], ids=["dense", "padded"])
def test_gradient_of_the_final_state(padding, grouped):
    """The state returned is differentiable in key, value and the initial state's sums
    (gradcheck of output and state together), and its sums are the plain sums
    S_0 + Σ_j φ(k'_j)ᵀ [v_j, 1] over the real keys, φ = [x_a x_b (a <= b), x, 1]."""
    b, h, hk, n, d, dv = 1, 2, 1 if grouped else 2, 5, 3, 2
    q = torch.randn(b, h, n, d, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(b, hk, n, x, dtype=torch.float64, requires_grad=True) for x in (d, dv))
    mask = key_padding(b, n, seed=1, empty_row=False)[:, :, 0].expand(b, hk, n) if padding else None
    s0 = torch.rand(b, hk, feature_dim(d), dv + 1, dtype=torch.float64, requires_grad=True)
    count = torch.full((b, hk), 3.0, dtype=torch.float64)

    def f(q, k, v, s0):
        out, state = causal_efficient_taylor_shift(
            q, k, v, mask, 1.2, None, True, chunk_size=2,
            initial_state=TaylorShiftState(s0, count), output_final_state=True,
        )  # fmt: skip
        return out, state.sums

    assert torch.autograd.gradcheck(f, (q, k, v, s0))
    x = k / k.norm(dim=-1, keepdim=True)
    a, c = torch.triu_indices(d, d)
    phi = torch.cat([x[..., a] * x[..., c], x, torch.ones_like(x[..., :1])], -1)
    real = torch.ones(b, hk, n, 1, dtype=torch.float64) if mask is None else mask[..., None]
    plain = s0 + phi.mT @ (torch.cat([v, torch.ones_like(v[..., :1])], -1) * real)
    assert_rel_close(f(q, k, v, s0)[1], plain, 1e-12, "final state")


# The public op: initial_state= / output_final_state= (one TaylorShiftState everywhere).


@pytest.mark.parametrize("padding", [False, True], ids=["dense", "padded"])
@pytest.mark.parametrize("normalize", [True, False], ids=["norm", "plain"])
def test_op_in_segments_equals_one_call_and_decoding(normalize, padding):
    from taylorshift import taylor_shift_attention, taylor_shift_decode

    q, k, v = random_qkv(2, 3, 50, 50, 6, 5, requires_grad=False)
    mask = key_padding(2, 50, empty_row=False) if padding else None
    whole = taylor_shift_attention(q, k, v, mask, True, normalize=normalize, mode="direct")
    cuts, outs, state = (0, 7, 8, 31, 50), [], None
    for i0, i1 in itertools.pairwise(cuts):
        m = None if mask is None else mask[..., i0:i1]
        out, state = taylor_shift_attention(
            q[:, :, i0:i1], k[:, :, i0:i1], v[:, :, i0:i1], m, True,
            normalize=normalize, initial_state=state, output_final_state=True,
        )  # fmt: skip
        outs.append(out)
    real = torch.ones(2, 50, dtype=torch.bool) if mask is None else mask[:, 0, 0]
    for i in range(2):  # padded query rows are not meaningful: compare the real ones
        assert_rel_close(torch.cat(outs, 2)[i][:, real[i]], whole[i][:, real[i]], 1e-10)
    padding_mask = None if mask is None else mask[:, 0, 0]
    _, decoded = taylor_shift_decode(q, k, v, None, padding_mask, normalize=normalize)
    assert_rel_close(state.sums, decoded.sums, 1e-10)
    assert torch.equal(state.count, decoded.count)
    assert torch.equal(state.count[:, 0], real.sum(-1).to(state.count.dtype))


def test_op_gradients_of_a_later_segment_match_the_whole():
    from taylorshift import taylor_shift_attention

    q, k, v = random_qkv(1, 2, 40, 40, 4, 4)
    grad = torch.randn(1, 2, 25, 4, dtype=torch.float64)
    whole = taylor_shift_attention(q, k, v, is_causal=True, mode="efficient")
    want = torch.autograd.grad(whole[:, :, 15:], (q, k, v), grad)
    with torch.no_grad():
        _, state = taylor_shift_attention(
            q[:, :, :15], k[:, :, :15], v[:, :, :15], is_causal=True, output_final_state=True
        )
    q2, k2, v2 = (t[:, :, 15:].detach().requires_grad_() for t in (q, k, v))
    state.sums.requires_grad_()
    out = taylor_shift_attention(q2, k2, v2, is_causal=True, initial_state=state)
    got = torch.autograd.grad(out, (q2, k2, v2, state.sums), grad)
    for g, w in zip(got[:3], want, strict=True):
        assert_rel_close(g, w[:, :, 15:], 1e-10)
    assert got[3].abs().sum() > 0  # the later segment reaches back into the state


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["kernel", "torch"])
@pytest.mark.parametrize("grouped", [False, True], ids=["mha", "gqa"])
def test_op_gradients_through_segments_match_one_call(grouped, dtype):
    """A loss on every segment of a sequence fed in segments (each from the state the one
    before returned) gives the gradients of one causal call over the whole, for the earlier
    segments' keys and values too (float32: the CPU kernel; float64: the PyTorch form)."""
    from taylorshift import taylor_shift_attention

    b, h, hk, n, d, dv = 2, 4, 2 if grouped else 4, 70, 8, 6
    g = torch.Generator().manual_seed(3)
    q = torch.randn(b, h, n, d, generator=g, dtype=torch.float64)
    k, v = (torch.randn(b, hk, n, x, generator=g, dtype=torch.float64) for x in (d, dv))
    mask = key_padding(b, n, seed=4, empty_row=False)
    tau = (0.5 + torch.rand(1, h, 1, 1, generator=g, dtype=torch.float64)).requires_grad_()
    exact_in = [x.requires_grad_() for x in (q, k, v)]
    kr, vr = (x.repeat_interleave(h // hk, 1) for x in exact_in[1:])
    exact = naive_taylor_shift_attention(exact_in[0], kr, vr, mask, True, temperature=tau)
    fast_in = [x.detach().to(dtype).requires_grad_() for x in (q, k, v, tau)]
    state, outs = None, []
    for i0, i1 in itertools.pairwise((0, 9, 9, 40, n)):
        out, state = taylor_shift_attention(
            *(x[:, :, i0:i1] for x in fast_in[:3]), mask[..., i0:i1], True,
            temperature=fast_in[3], initial_state=state, output_final_state=True,
            enable_gqa=grouped,
        )  # fmt: skip
        outs.append(out)
    out = torch.cat(outs, 2)
    grad = torch.randn(exact.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad(out, fast_in, grad.to(dtype))
    want = torch.autograd.grad(exact, [*exact_in, tau], grad)
    rtol, atol = (2e-5, 1e-6) if dtype == torch.float32 else (1e-10, 1e-13)
    assert_rel_close(out, exact, rtol, "output", atol=atol)
    for name, a, e in zip(("query", "key", "value", "temperature"), got, want, strict=True):
        assert_rel_close(a, e, rtol, f"gradient of {name}", atol=atol)


@pytest.mark.parametrize(
    ("kwargs", "exc", "pattern"),
    [
        (dict(output_final_state=True), ValueError, r"needs is_causal=True; got is_causal=False"),
        (dict(is_causal=True, output_final_state=True, mode="direct"), ValueError,
         r"needs the efficient form .* got mode='direct'"),
        (dict(is_causal=True, output_final_state=True, order=4), ValueError, r"got order=4"),
        (dict(is_causal=True, output_final_state=1), TypeError,
         r"output_final_state must be a bool"),
        (dict(is_causal=True, initial_state="S"), TypeError,
         r"initial_state must be a TaylorShiftState or None; got str"),
    ],
)  # fmt: skip
def test_op_state_arguments_refused_clearly(kwargs, exc, pattern):
    from taylorshift import TaylorShiftState, taylor_shift_attention

    q, k, v = random_qkv(1, 2, 5, 5, 4, 4, requires_grad=False)
    with pytest.raises(exc, match=pattern):
        taylor_shift_attention(q, k, v, **kwargs)
    wrong = TaylorShiftState.zeros(1, 2, 3, 4, dtype=torch.float64)  # d = 3, not 4
    with pytest.raises(ValueError, match=r"initial_state must hold sums of shape \(1, 2, 15, 5\)"):
        taylor_shift_attention(q, k, v, is_causal=True, initial_state=wrong)
