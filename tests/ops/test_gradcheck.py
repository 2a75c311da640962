"""torch.autograd.gradcheck in float64 on tiny shapes, every form (SPEC §8)."""

from __future__ import annotations

import pytest
import torch

from taylorshift import naive_taylor_shift_attention, taylor_shift_attention
from taylorshift.ops.taylor_shift.efficient import efficient_taylor_shift
from taylorshift.ops.taylor_shift.efficient_causal import causal_efficient_taylor_shift
from tests.helpers import key_padding, random_qkv


@pytest.mark.parametrize("normalize", [True, False], ids=["norm", "plain-scores"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("form", ["direct", "efficient"])
@pytest.mark.parametrize("d", [1, 4, 6], ids=lambda d: f"D{d}")
@pytest.mark.parametrize("n", [1, 3, 17], ids=lambda n: f"N{n}")
def test_gradcheck(n, d, form, causal, normalize):
    q, k, v = random_qkv(2, 2, n, n, d, 3, seed=n * 10 + d)
    mask = key_padding(2, n, seed=d, empty_row=False)
    temperature = torch.tensor([[[[0.8]], [[1.7]]]], dtype=torch.float64, requires_grad=True)
    key_mask = mask.expand(2, 2, 1, n)[:, :, 0]

    def fn(q, k, v, t):
        if not normalize:
            t = 1.0
        if form == "direct":
            return taylor_shift_attention(
                q, k, v, mask, causal, temperature=t, normalize=normalize, mode="direct"
            )
        efficient = causal_efficient_taylor_shift if causal else efficient_taylor_shift
        return efficient(q, k, v, key_mask, t, None, normalize, 4)  # chunk 4 < N = 17

    # The full Jacobian at N = 17 takes a minute; fast mode checks a random projection of it.
    assert torch.autograd.gradcheck(
        fn, (q, k, v, temperature), eps=1e-6, atol=1e-6, fast_mode=n > 3
    )


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gradcheck_cross_attention(causal):
    q, k, v = random_qkv(1, 2, 5, 9, 4, 2, seed=5)
    fn = lambda q, k, v: taylor_shift_attention(q, k, v, is_causal=causal, mode="efficient")  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-6)
    q, k, v = random_qkv(1, 2, 9, 5, 4, 2, seed=6)
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["torch", "kernels"])
@pytest.mark.parametrize("mode", ["direct", "efficient"])
def test_second_derivatives_raise_and_the_reference_has_them(mode, dtype, causal):
    # The forms' backward passes are first-order (as FlashAttention's): differentiating a
    # gradient again raises instead of returning a wrong (zero) second derivative. The
    # plain reference is twice differentiable, the way to a gradient penalty.
    q, k, v = random_qkv(1, 2, 9, 9, 4, 3, dtype=dtype, seed=7)
    out = taylor_shift_attention(q, k, v, is_causal=causal, mode=mode)
    (dq,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        dq.square().sum().backward()
    out = naive_taylor_shift_attention(q, k, v, is_causal=causal)
    (dq,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    dq.square().sum().backward()
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in (q, k, v))


@pytest.mark.parametrize("mode", ["direct", "efficient"])
def test_torch_func_transforms_raise_and_the_reference_takes_them(mode):
    # what the README says: the forms refuse torch.func (autograd.Functions without
    # setup_context); the reference runs under grad and vmap
    q, k, v = random_qkv(2, 2, 7, 7, 4, 3, dtype=torch.float32, seed=8, requires_grad=False)

    def loss(fn, q):
        return fn(q, k, v).square().sum()

    op = lambda q, k, v: taylor_shift_attention(q, k, v, mode=mode)  # noqa: E731
    with pytest.raises(RuntimeError, match="setup_context"):
        torch.func.grad(lambda q: loss(op, q))(q)
    with pytest.raises(RuntimeError, match="setup_context"):
        torch.vmap(op)(q[None], k[None], v[None])
    got = torch.func.grad(lambda q: loss(naive_taylor_shift_attention, q))(q)
    q.requires_grad_()
    (want,) = torch.autograd.grad(loss(naive_taylor_shift_attention, q), q)
    torch.testing.assert_close(got, want)
    batched = torch.vmap(naive_taylor_shift_attention)(q[None], k[None], v[None])
    torch.testing.assert_close(batched[0], naive_taylor_shift_attention(q, k, v))
