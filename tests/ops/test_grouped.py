"""Grouped-query attention (``enable_gqa=True``): key and value with fewer heads.

The reference repeats key and value to the query's heads (``repeat_interleave``, SDPA's
convention) and runs ``naive_taylor_shift_attention``; outputs and gradients of every form
must agree with it (float64, SPEC §8), and non-causal calls must reach the forms with the
key/value heads as they are (the key side done once per group).
"""

from __future__ import annotations

import pytest
import torch

from taylorshift import TaylorShiftState, naive_taylor_shift_attention, taylor_shift_attention
from taylorshift.ops.taylor_shift import interface
from tests.helpers import assert_rel_close, key_padding

B, H, NQ, NK, D, DV = 2, 4, 19, 23, 6, 5


def _inputs(kv_heads, dtype=torch.float64, nq=NQ, nk=NK, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, H, nq, D), (B, kv_heads, nk, D), (B, kv_heads, nk, DV)]
    return [torch.randn(s, generator=g, dtype=torch.float64).to(dtype) for s in shapes]


def _mask(kind, nq=NQ, nk=NK):
    if kind == "none":
        return None
    if kind == "key padding":
        return key_padding(B, nk, seed=3)
    g = torch.Generator().manual_seed(4)
    if kind == "per head":  # key padding that differs between the heads of a group
        return torch.rand(B, H, 1, nk, generator=g) > 0.3
    mask = torch.rand(B, 1, nq, nk, generator=g) > 0.3  # "per query": direct form only
    mask[..., 0] = True
    return mask


def _temperature(kind):
    if kind == "float":
        return 1.3
    shape = (B, 1, 1, 1) if kind == "per batch" else (1, H, 1, 1)
    return torch.linspace(0.7, 1.9, shape[0] * shape[1], dtype=torch.float64).reshape(shape)


def _reference(q, k, v, mask, causal, tau):
    groups = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(groups, dim=1) for t in (k, v))
    return naive_taylor_shift_attention(q, k, v, mask, causal, temperature=tau)


CASES = [  # (kv heads, mask, temperature): each path of grouped.py
    (1, "none", "float"),
    (2, "key padding", "per batch"),
    (2, "per head", "float"),
    (1, "key padding", "per head"),
]


@pytest.mark.parametrize("kv_heads, mask_kind, tau_kind", CASES)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("mode", ["direct", "efficient", "auto"])
def test_grouped_query_attention_matches_repeated_heads(
    mode, causal, kv_heads, mask_kind, tau_kind
):
    q, k, v = (t.requires_grad_() for t in _inputs(kv_heads))
    tau = _temperature(tau_kind)
    leaves = [q, k, v]
    if isinstance(tau, torch.Tensor):
        leaves.append(tau.requires_grad_())
    mask = _mask(mask_kind)
    got = taylor_shift_attention(q, k, v, mask, causal, temperature=tau, mode=mode, enable_gqa=True)
    want = _reference(q, k, v, mask, causal, tau)
    g = torch.randn_like(want)
    grads = torch.autograd.grad(got, leaves, g)
    wants = torch.autograd.grad(want, leaves, g)
    names = ["out", "dq", "dk", "dv", "dtau"][: len(leaves) + 1]
    for name, a, e in zip(names, (got, *grads), (want, *wants), strict=True):
        assert_rel_close(a, e, 1e-10, f"{mode} causal={causal} {mask_kind}: {name}")


def test_queries_that_vary_the_mask_stack_with_their_rows():
    # a mask that differs between queries (the direct form): each stacked query keeps its row
    q, k, v = _inputs(2)
    mask = _mask("per query")
    got = taylor_shift_attention(q, k, v, mask, mode="direct", enable_gqa=True)
    assert_rel_close(got, _reference(q, k, v, mask, False, 1.0), 1e-12, "per-query mask")


@pytest.mark.parametrize("mode", ["direct", "efficient"])
def test_grouped_float32_through_the_cpu_kernels(mode):
    # the stacked call is a cross-attention of G·Nq queries: the kernels' shapes
    q, k, v = _inputs(2, torch.float32, nq=40, nk=300)
    mask = key_padding(B, 300, seed=5)
    got = taylor_shift_attention(q, k, v, mask, mode=mode, enable_gqa=True)
    want = _reference(q.double(), k.double(), v.double(), mask, False, 1.0)
    assert got.dtype == torch.float32
    assert_rel_close(got, want, 1e-5, mode, atol=1e-7)


@pytest.mark.parametrize(
    "causal, mask_kind, tau_kind, key_heads, queries",
    [
        (False, "key padding", "per batch", 2, 2 * NQ),  # stacked: key side once per group
        (True, "key padding", "float", H, NQ),  # causal: key and value repeated
        (False, "per head", "float", H, NQ),  # a mask of each head's own: repeated
        (False, "none", "per head", H, NQ),  # a temperature of each head's own: repeated
    ],
)
def test_which_calls_share_the_key_side(
    monkeypatch, causal, mask_kind, tau_kind, key_heads, queries
):
    seen = []

    def spy(form):
        def call(query, key, *args, **kwargs):
            seen.append((key.shape[1], query.shape[2]))
            return form(query, key, *args, **kwargs)

        return call

    for name in ("efficient_taylor_shift", "causal_efficient_taylor_shift"):
        monkeypatch.setattr(interface, name, spy(getattr(interface, name)))
    q, k, v = _inputs(2)  # float64: the PyTorch forms
    taylor_shift_attention(
        q, k, v, _mask(mask_kind), causal, temperature=_temperature(tau_kind),
        mode="efficient", enable_gqa=True,
    )  # fmt: skip
    assert seen == [(key_heads, queries)]


def test_one_group_per_head_is_the_plain_call():
    q, k, v = _inputs(H)
    want = taylor_shift_attention(q, k, v, is_causal=True)
    assert torch.equal(taylor_shift_attention(q, k, v, is_causal=True, enable_gqa=True), want)


def test_grouped_attention_compiles_whole():
    q, k, v = _inputs(2, torch.float32)
    mask = key_padding(B, NK, seed=2)

    def op(q, k, v):
        return taylor_shift_attention(q, k, v, mask, mode="efficient", enable_gqa=True)

    torch._dynamo.reset()
    compiled = torch.compile(op, backend="aot_eager", fullgraph=True)
    assert_rel_close(compiled(q, k, v), op(q, k, v), 1e-6, atol=1e-7)
    torch._dynamo.reset()


@pytest.mark.parametrize(
    "key_heads, value_heads, kwargs, error, match",
    [
        (3, 3, {}, ValueError, r"key and value heads must divide the query heads \(H = 4\)"),
        (2, 1, {}, ValueError, r"value must have the heads of key \(Hkv = 2\)"),
        (2, 2, {"value": torch.randn(1, 2, NK, DV)}, ValueError,
         r"value must have the batch size of query \(B = 2\); got value of shape \(1, 2"),
        (2, 2, {"enable_gqa": 1}, TypeError, "enable_gqa must be a bool"),
        (2, 2, {"enable_gqa": False}, ValueError, "fewer key/value heads: pass enable_gqa=True"),
        (2, 2, {"output_final_state": True}, ValueError,
         "output_final_state continues a causal sweep: it needs is_causal=True"),
        (2, 2, {"is_causal": True, "output_final_state": True,
                "attn_mask": torch.ones(1, 4, 1, NK, dtype=torch.bool)}, ValueError,
         r"attn_mask: with grouped-query attention and a causal state .*\(1, 4, 1, 23\)"),
        (2, 2, {"is_causal": True, "initial_state": TaylorShiftState.zeros(B, H, D, DV)},
         ValueError, r"initial_state must hold sums of shape \(2, 2, 28, 6\)"),
        (2, 2, {"temperature": torch.ones(1, 3, 1, 1)}, ValueError,
         r"temperature must broadcast to \(B, H, 1, 1\) = \(2, 4, 1, 1\)"),
    ],
)  # fmt: skip
def test_bad_grouped_calls_name_the_argument(key_heads, value_heads, kwargs, error, match):
    q = torch.randn(B, H, NQ, D)
    k, v = torch.randn(B, key_heads, NK, D), torch.randn(B, value_heads, NK, DV)
    with pytest.raises(error, match=match):
        kwargs = {"enable_gqa": True, **kwargs}
        v = kwargs.pop("value", v)
        taylor_shift_attention(q, k, v, **kwargs)


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "padding"])
def test_grouped_causal_state_continues_in_segments(masked):
    # a sequence in two segments, the state per key/value head: outputs and gradients of q,
    # k, v, τ and of the first state's sums against the op with key, value and state
    # repeated to the query heads (repeat_interleave sums the group's gradients)
    g = torch.Generator().manual_seed(11)
    n, cut, kv_heads = 30, 13, 2
    groups = H // kv_heads
    q = torch.randn(B, H, n, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, kv_heads, n, x, generator=g, dtype=torch.float64) for x in (D, DV))
    tau = torch.linspace(0.7, 1.9, H, dtype=torch.float64).view(1, H, 1, 1)
    pad = key_padding(B, n, seed=4, empty_row=False) if masked else None
    prior = TaylorShiftState.zeros(B, kv_heads, D, DV, dtype=torch.float64)
    prior.sums.normal_(generator=g)
    prior.count.fill_(5.0)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, tau, prior.sums)]

    def segments(q, k, v, tau, sums, count, gqa):
        state = TaylorShiftState(sums, count)
        outs = []
        for s0, s1 in ((0, cut), (cut, n)):
            m = None if pad is None else pad[..., s0:s1]
            part = (x[:, :, s0:s1] for x in (q, k, v))
            out, state = taylor_shift_attention(
                *part, m, True, temperature=tau, initial_state=state, output_final_state=True,
                enable_gqa=gqa,
            )  # fmt: skip
            outs.append(out)
        return torch.cat(outs, dim=2), state

    got, state = segments(*leaves, prior.count, True)
    assert state.sums.shape == (B, kv_heads, *prior.sums.shape[2:])
    want_leaves = [t.clone().requires_grad_() for t in (q, k, v, tau, prior.sums)]
    qw, kw, vw, tw, sw = want_leaves
    repeat = lambda t: t.repeat_interleave(groups, dim=1)  # noqa: E731
    want, want_state = segments(
        qw, repeat(kw), repeat(vw), tw, repeat(sw), repeat(prior.count), False
    )
    assert_rel_close(got, want, 1e-10, "outputs")
    assert_rel_close(repeat(state.sums), want_state.sums, 1e-10, "final state")
    grad = torch.randn(got.shape, generator=g, dtype=torch.float64)
    names = ["dq", "dk", "dv", "dtau", "dstate"]
    grads = torch.autograd.grad(got, leaves, grad)
    wants = torch.autograd.grad(want, want_leaves, grad)
    for name, a, e in zip(names, grads, wants, strict=True):
        assert_rel_close(a, e, 1e-10, name)
