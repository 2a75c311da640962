"""torch.autograd.gradcheck in float64 on tiny shapes, every form (SPEC §8)."""

from __future__ import annotations

import pytest
import torch

from taylorshift import naive_taylor_shift_attention, taylor_shift_attention
from taylorshift.ops.taylor_shift.efficient import efficient_taylor_shift
from taylorshift.ops.taylor_shift.efficient_causal import causal_efficient_taylor_shift
from tests.helpers import assert_rel_close, key_padding, random_qkv


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


@pytest.mark.parametrize("normalize", [True, False], ids=["norm", "plain-scores"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["torch", "kernels"])
@pytest.mark.parametrize("mode", ["direct", "efficient"])
def test_gradients_asked_as_a_graph_differentiate_again(mode, dtype, causal, normalize):
    # create_graph=True (a gradient penalty): the forms' backward passes recompute through
    # the reference. The gradient itself must equal the forms' own first-order one, and the
    # penalty's gradient the reference's.
    q, k, v = random_qkv(2, 2, 9, 9, 4, 3, dtype=dtype, seed=7)
    mask = key_padding(2, 9, seed=2)
    tau = torch.tensor([[[[0.8]], [[1.2]]]], dtype=dtype, requires_grad=True)
    score = {"temperature": tau} if normalize else {"normalize": False, "scale": 0.6}
    leaves = (q, k, v, tau) if normalize else (q, k, v)

    def op(*xs):
        return taylor_shift_attention(*xs[:3], mask, causal, mode=mode, **score)

    def penalty_grads(fn):
        grads = torch.autograd.grad(fn(*leaves).square().sum(), leaves, create_graph=True)
        penalty = sum(g.square().sum() for g in grads)
        return grads, torch.autograd.grad(penalty, leaves)

    first_order = torch.autograd.grad(op(*leaves).square().sum(), leaves)
    grads, second = penalty_grads(op)

    def reference(*xs):
        return naive_taylor_shift_attention(*xs[:3], mask, causal, **score)

    _, want = penalty_grads(reference)
    rtol = 1e-10 if dtype == torch.float64 else 1e-5
    for name, a, e in zip("qkvt", grads, first_order, strict=False):
        assert_rel_close(a, e, rtol, f"gradient of {name} as a graph")
    for name, a, e in zip("qkvt", second, want, strict=False):
        assert_rel_close(a, e, rtol, f"penalty's gradient of {name}")


def test_a_continued_causal_state_refuses_gradients_asked_as_a_graph():
    q, k, v = random_qkv(1, 2, 6, 6, 4, 3, seed=9)
    _, state = taylor_shift_attention(q[:, :, :3], k[:, :, :3], v[:, :, :3], None, True,
                                      output_final_state=True)  # fmt: skip
    out = taylor_shift_attention(q[:, :, 3:], k[:, :, 3:], v[:, :, 3:], None, True,
                                 initial_state=state)  # fmt: skip
    with pytest.raises(RuntimeError, match="initial_state: a call that continues a causal"):
        torch.autograd.grad(out.sum(), q, create_graph=True)


# torch.func's transforms script helpers of their own with torch.jit, which warns of its
# deprecation (torch's matter, not ours)
JIT_WARNING = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")


def _func_problem(causal):
    q, k, v = random_qkv(2, 2, 7, 7, 4, 3, seed=8, requires_grad=False)
    mask = key_padding(2, 7, seed=3)
    temperature = torch.tensor([[[[0.7]], [[1.3]]]], dtype=torch.float64)  # (1, H, 1, 1)
    return q, k, v, mask, temperature


@JIT_WARNING
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("mode", ["direct", "efficient", "auto"])
def test_torch_func_grad_and_vmap_equal_autograd_and_a_loop(mode, causal):
    # Under torch.func the op runs the reference's plain ops; compared here with the forms
    # run eagerly (autograd for the gradient, one call per sample for vmap)
    q, k, v, mask, temperature = _func_problem(causal)

    def op(q, k, v, t, mask=mask):
        return taylor_shift_attention(q, k, v, mask, causal, temperature=t, mode=mode)

    def loss(q, k, v, t):
        return op(q, k, v, t).square().sum()

    got = torch.func.grad(loss, argnums=(0, 1, 2, 3))(q, k, v, temperature)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, temperature)]
    want = torch.autograd.grad(loss(*leaves), leaves)
    for name, a, e in zip("qkvt", got, want, strict=True):
        assert_rel_close(a, e, 1e-10, f"torch.func.grad of {name}")

    # each sample one (1, H, N, d) problem: vmap over a new leading dim
    samples = (x[:, None] for x in (q, k, v))
    batched = torch.vmap(op, in_dims=(0, 0, 0, None, 0))(*samples, temperature, mask[:, None])
    for i in range(2):
        looped = op(q[i : i + 1], k[i : i + 1], v[i : i + 1], temperature, mask[i : i + 1])
        assert_rel_close(batched[i], looped, 1e-10, f"vmap sample {i}")


@JIT_WARNING
@pytest.mark.parametrize("mode", ["direct", "efficient"])
def test_torch_func_hessian_equals_differences_of_the_forms_gradients(mode):
    # second derivatives through torch.func against central differences of the gradient
    # that the forms' own backward computes (eager autograd)
    q, k, v, mask, _ = _func_problem(True)
    q = q[:1, :1, :4, :]
    k, v, mask = k[:1, :1, :4], v[:1, :1, :4], mask[:1, ..., :4]

    def loss(x):
        out = taylor_shift_attention(x, k, v, mask, True, temperature=0.9, mode=mode)
        return out.square().sum()

    hessian = torch.func.hessian(loss)(q).reshape(q.numel(), q.numel())

    def eager_grad(x):
        x = x.clone().requires_grad_()
        return torch.autograd.grad(loss(x), x)[0].flatten()

    h = 1e-5
    for i in range(q.numel()):
        step = torch.zeros(q.numel(), dtype=q.dtype)
        step[i] = h
        column = (eager_grad(q + step.view_as(q)) - eager_grad(q - step.view_as(q))) / (2 * h)
        torch.testing.assert_close(hessian[:, i], column, rtol=1e-6, atol=1e-8)


@JIT_WARNING
def test_torch_func_refuses_the_state_arguments():
    q = _func_problem(True)[0][:, None]  # vmapped over a leading dim: (1, H, N, d) each

    def stateful(q):
        return taylor_shift_attention(q, q, q, None, True, output_final_state=True)

    with pytest.raises(ValueError, match="initial_state, output_final_state: not supported under"):
        torch.vmap(stateful)(q)
