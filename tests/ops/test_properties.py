"""Properties of TaylorShift attention, checked by hypothesis on small float64 problems.

SPEC §8: the rows of weights sum to 1; permuting keys and values together changes nothing;
scaling q or k by c > 0 changes nothing when normalising; a padded batch equals the
unpadded sequences; causal row i ignores keys after i; and the efficient form equals the
direct one, outputs and gradients, under every combination of flags.

Each property runs for the plain reference ("naive") and for both public modes. Tensors
come from a hypothesis-drawn seed through ``torch.Generator``, so a failing example is
reproducible from what hypothesis prints.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from taylorshift import naive_taylor_shift_attention, taylor_shift_attention
from taylorshift.ops.taylor_shift.efficient import efficient_taylor_shift
from taylorshift.ops.taylor_shift.efficient_causal import causal_efficient_taylor_shift

F64 = torch.float64
FORMS = ["naive", "direct", "efficient"]
# The op tests' conftest poisons torch.empty through a function-scoped autouse fixture; it
# stays in place for all the examples of one test, which is what we want here.
PROPERTY = settings(
    deadline=None,
    max_examples=30,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
# Invariances that hold in exact arithmetic: a few ulps of the float64 result.
EXACT = dict(rtol=1e-12, atol=1e-12)
# Two forms that sum in different orders (efficient against direct).
FORMS_AGREE = dict(rtol=1e-9, atol=1e-11)

seeds = st.integers(0, 2**31 - 1)


def attend(form, q, k, v, mask=None, causal=False, **kwargs):
    """One call of the named form: the plain reference or a mode of the public op."""
    if form == "naive":
        return naive_taylor_shift_attention(q, k, v, mask, causal, **kwargs)
    return taylor_shift_attention(q, k, v, mask, causal, mode=form, **kwargs)


def randn(g, *shape):
    return torch.randn(*shape, generator=g, dtype=F64)


@dataclass
class Problem:
    """q (B, H, Nq, d), k (B, H, Nk, d), v (B, H, Nk, dv), a bool mask or None, flags."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    mask: torch.Tensor | None
    causal: bool
    kwargs: dict  # temperature / scale / normalize
    seed: int

    @property
    def gen(self) -> torch.Generator:
        """A generator for further draws (perturbations, permutations) of this example."""
        return torch.Generator().manual_seed(self.seed + 1)


@st.composite
def masks(draw, g, b, h, nq, nk, general):
    """None, a key-padding mask (B, 1, 1, Nk) or (B, H, 1, Nk), or, when ``general``, a
    mask that varies over queries (B, 1, Nq, Nk). Rows may be fully masked."""
    kinds = ["none", "keys", "keys-per-head"] + (["general"] if general else [])
    kind = draw(st.sampled_from(kinds))
    keep = draw(st.sampled_from([0.5, 0.8, 1.0]))
    shape = {
        "none": None,
        "keys": (b, 1, 1, nk),
        "keys-per-head": (b, h, 1, nk),
        "general": (b, 1, nq, nk),
    }[kind]
    if shape is None:
        return None
    return torch.rand(shape, generator=g, dtype=F64) < keep


@st.composite
def score_kwargs(draw, g, h, normalize):
    """temperature (float or per-head tensor) when normalising, else scale (None or float)."""
    if normalize:
        if draw(st.booleans()):
            t = 0.25 + 2.0 * torch.rand(1, h, 1, 1, generator=g, dtype=F64)
            return dict(normalize=True, temperature=t.requires_grad_())
        return dict(normalize=True, temperature=draw(st.floats(-3.0, 3.0)))
    scale = draw(st.one_of(st.none(), st.floats(0.05, 1.5)))
    return dict(normalize=False, scale=scale)


@st.composite
def problems(draw, general_mask=True, causal=None, min_n=1, min_dv=1, requires_grad=False):
    seed = draw(seeds)
    g = torch.Generator().manual_seed(seed)
    b, h = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    nq, nk = draw(st.integers(min_n, 7)), draw(st.integers(min_n, 7))
    d, dv = draw(st.integers(1, 5)), draw(st.integers(min_dv, 4))
    q, k, v = randn(g, b, h, nq, d), randn(g, b, h, nk, d), randn(g, b, h, nk, dv)
    mask = draw(masks(g, b, h, nq, nk, general_mask))
    causal = draw(st.booleans()) if causal is None else causal
    kwargs = draw(score_kwargs(g, h, draw(st.booleans())))
    q, k, v = (x.requires_grad_(requires_grad) for x in (q, k, v))
    return Problem(q, k, v, mask, causal, kwargs, seed)


def allowed_pairs(p: Problem) -> torch.Tensor:
    """The bool (B, H, Nq, Nk) matrix of attended (query, key) pairs, written out plainly."""
    b, h, nq, _ = p.q.shape
    nk = p.k.shape[2]
    allowed = torch.ones(b, h, nq, nk, dtype=torch.bool)
    if p.causal:
        allowed &= torch.ones(nq, nk, dtype=torch.bool).tril()
    if p.mask is not None:
        allowed &= p.mask
    return allowed


def _general_ok(form):
    """Only the direct form (and the reference) take masks that vary over queries."""
    return form != "efficient"


def _grads(y, inputs, g_out):
    """Gradients of <y, g_out> w.r.t. [q, k, v, (temperature)], q and k in row-norm units.

    With normalize=True the gradient of a query or key row is ∝ 1/‖x_i‖, and so is its
    rounding: a row of norm 1e-6 turns 1e-16 noise into 1e-10. ‖x_i‖ ∂/∂x_i (the gradient
    with respect to a relative change of x_i) keeps every row on the scale of the output,
    so one absolute tolerance fits all rows. An input the output does not reach gets zeros.
    """
    grads = torch.autograd.grad(y, inputs, g_out, allow_unused=True)
    grads = [torch.zeros_like(x) if g is None else g for x, g in zip(inputs, grads, strict=True)]
    for i in (0, 1):  # query, key
        grads[i] = grads[i] * torch.linalg.vector_norm(inputs[i].detach(), dim=-1, keepdim=True)
    return grads


# ---- (a) rows of weights sum to one --------------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
@PROPERTY
@given(data=st.data())
def test_weights_of_a_row_sum_to_one(form, data):
    p = data.draw(problems(general_mask=_general_ok(form)))
    ones = torch.ones_like(p.v)
    y = attend(form, p.q, p.k, ones, p.mask, p.causal, **p.kwargs)

    n = allowed_pairs(p).sum(-1, keepdim=True).to(F64)  # (B, H, Nq, 1)
    # y_i = Σ_j w_ij · 1 / Σ_j w_ij = 1, times sqrt(n_i / d) when normalising; 0 if n_i = 0.
    row = torch.sqrt(n / p.q.shape[-1]) if p.kwargs["normalize"] else torch.ones_like(n)
    expected = torch.where(n > 0, row, 0.0).expand_as(y)
    assert_close(y, expected, rtol=1e-13, atol=1e-13)


# ---- (b) permuting keys and values together ------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
@PROPERTY
@given(data=st.data())
def test_permuting_keys_and_values_changes_nothing(form, data):
    p = data.draw(problems(general_mask=_general_ok(form), causal=False, requires_grad=True))
    perm = torch.randperm(p.k.shape[2], generator=p.gen)
    mask_perm = None if p.mask is None else p.mask[..., perm]

    y = attend(form, p.q, p.k, p.v, p.mask, **p.kwargs)
    y_perm = attend(form, p.q, p.k[:, :, perm], p.v[:, :, perm], mask_perm, **p.kwargs)
    assert_close(y_perm, y, **EXACT)

    # The gradient of each key follows it to its new position.
    g_out = randn(p.gen, *y.shape)
    inputs = [p.q, p.k, p.v]
    grads = _grads(y, inputs, g_out)
    grads_perm = _grads(y_perm, inputs, g_out)
    for x, g, g_ref in zip("qkv", grads_perm, grads, strict=True):
        assert_close(g, g_ref, **EXACT, msg=lambda m, x=x: f"grad {x}: {m}")


# ---- (c) scaling q or k when normalising ---------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
@PROPERTY
@given(
    data=st.data(),
    which=st.sampled_from(["query", "key", "both"]),
    c=st.floats(1e-2, 1e2),
)
def test_scaling_query_or_key_changes_nothing_when_normalizing(form, data, which, c):
    p = data.draw(problems(general_mask=_general_ok(form)))
    kwargs = dict(normalize=True, temperature=p.kwargs.get("temperature", 1.0))
    q = p.q * c if which in ("query", "both") else p.q
    k = p.k * c if which in ("key", "both") else p.k

    y = attend(form, p.q, p.k, p.v, p.mask, p.causal, **kwargs)
    y_scaled = attend(form, q, k, p.v, p.mask, p.causal, **kwargs)
    assert_close(y_scaled, y, **EXACT)


# ---- (d) a padded batch equals the unpadded sequences --------------------------------------


@pytest.mark.parametrize("form", FORMS)
@PROPERTY
@given(
    seed=seeds,
    lengths=st.lists(st.integers(1, 6), min_size=1, max_size=3),
    extra=st.integers(0, 2),
    heads=st.integers(1, 2),
    d=st.integers(1, 4),
    dv=st.integers(1, 3),
    causal=st.booleans(),
    normalize=st.booleans(),
)
def test_padded_batch_equals_sequences_one_by_one(
    form, seed, lengths, extra, heads, d, dv, causal, normalize
):
    # Self-attention on right-padded sequences: the key padding mask removes the padding
    # from every sum (constant term included), and with is_causal a valid row i only sees
    # keys j <= i < length, so the padded causal batch also equals the sequences.
    g = torch.Generator().manual_seed(seed)
    b, n = len(lengths), max(lengths) + extra
    # The padding holds large junk, so a leak into any sum shows.
    q, k = randn(g, b, heads, n, d), randn(g, b, heads, n, d)
    v = randn(g, b, heads, n, dv)
    valid = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]  # (B, N)
    junk = ~valid[:, None, :, None]
    q = torch.where(junk, 30.0 * randn(g, *q.shape), q)
    k = torch.where(junk, 30.0 * randn(g, *k.shape), k)
    v = torch.where(junk, 1e3 * randn(g, *v.shape), v)
    kwargs = dict(normalize=normalize)
    if normalize:
        kwargs["temperature"] = 0.5 + torch.rand(1, heads, 1, 1, generator=g, dtype=F64)

    y = attend(form, q, k, v, valid[:, None, None, :], causal, **kwargs)
    assert torch.isfinite(y).all()
    for i, length in enumerate(lengths):
        one = [x[i : i + 1, :, :length] for x in (q, k, v)]
        y_one = attend(form, *one, None, causal, **kwargs)
        assert_close(y[i : i + 1, :, :length], y_one, **EXACT)


@pytest.mark.parametrize("form", FORMS)
@PROPERTY
@given(data=st.data(), n_query=st.integers(1, 5))
def test_padded_keys_equal_unpadded_keys_in_cross_attention(form, data, n_query):
    # Queries of another sequence attend padded keys: every query row equals the run on the
    # unpadded keys of its batch entry.
    p = data.draw(problems(general_mask=False, causal=False))
    g = p.gen
    b, h, _, d = p.q.shape
    q = randn(g, b, h, n_query, d)
    nk = p.k.shape[2]
    lengths = torch.randint(1, nk + 1, (b,), generator=g)
    valid = torch.arange(nk)[None, :] < lengths[:, None]
    k = torch.where(valid[:, None, :, None], p.k, 30.0 * randn(g, *p.k.shape))
    v = torch.where(valid[:, None, :, None], p.v, 1e3 * randn(g, *p.v.shape))

    y = attend(form, q, k, v, valid[:, None, None, :], **p.kwargs)
    for i, length in enumerate(lengths.tolist()):
        # A temperature tensor is (1, H, 1, 1): it broadcasts to one batch entry as well.
        one = q[i : i + 1], k[i : i + 1, :, :length], v[i : i + 1, :, :length]
        y_one = attend(form, *one, **p.kwargs)
        assert_close(y[i : i + 1], y_one, **EXACT)


# ---- (e) causal row i ignores keys after i -------------------------------------------------

CAUSAL_FORMS = [*FORMS, "efficient-chunked"]


def attend_causal(form, q, k, v, mask, kwargs, chunk):
    """Causal attention; 'efficient-chunked' runs the causal efficient form with a small
    chunk, so the prefix states cross chunk boundaries inside these short sequences."""
    if form != "efficient-chunked":
        return attend(form, q, k, v, mask, True, **kwargs)
    key_mask = None if mask is None else mask.expand(*q.shape[:2], 1, k.shape[2])[:, :, 0]
    t = kwargs.get("temperature", 1.0)
    return causal_efficient_taylor_shift(
        q, k, v, key_mask, t, kwargs.get("scale"), kwargs["normalize"], chunk
    )


@pytest.mark.parametrize("form", CAUSAL_FORMS)
@PROPERTY
@given(data=st.data(), chunk=st.integers(1, 4))
def test_causal_row_ignores_later_keys(form, data, chunk):
    p = data.draw(problems(general_mask=form in ("naive", "direct"), causal=True))
    nq, nk = p.q.shape[2], p.k.shape[2]
    i = data.draw(st.integers(0, nq - 1), label="row")
    g = p.gen
    # New keys and values at every position after i (none when i >= Nk - 1).
    later = (torch.arange(nk) > i)[None, None, :, None]
    k2 = torch.where(later, 10.0 * randn(g, *p.k.shape), p.k)
    v2 = torch.where(later, 1e3 * randn(g, *p.v.shape), p.v)

    y = attend_causal(form, p.q, p.k, p.v, p.mask, p.kwargs, chunk)
    y2 = attend_causal(form, p.q, k2, v2, p.mask, p.kwargs, chunk)
    assert_close(y2[:, :, : i + 1], y[:, :, : i + 1], **EXACT)


# ---- (f) efficient equals direct -----------------------------------------------------------


def _inputs(p: Problem):
    t = p.kwargs.get("temperature")
    extra = [t] if isinstance(t, torch.Tensor) else []
    return [p.q, p.k, p.v, *extra]


@settings(PROPERTY, max_examples=60)  # many flag combinations: draw more
@given(data=st.data(), chunk=st.integers(1, 4))
def test_efficient_equals_direct(data, chunk):
    # Empty sequences (N = 0), dv = 0 and fully masked rows are all in the draw.
    p = data.draw(problems(general_mask=False, min_n=0, min_dv=0, requires_grad=True))
    inputs = _inputs(p)

    y_direct = attend("direct", p.q, p.k, p.v, p.mask, p.causal, **p.kwargs)
    y_naive = attend("naive", p.q, p.k, p.v, p.mask, p.causal, **p.kwargs)
    y_eff = attend("efficient", p.q, p.k, p.v, p.mask, p.causal, **p.kwargs)
    # The internal forms with a chunk of 1..4 tokens: chunk boundaries inside N <= 7.
    b, h = p.q.shape[:2]
    key_mask = None
    if p.mask is not None:
        key_mask = p.mask.expand(b, h, 1, p.k.shape[2])[:, :, 0]
    form = causal_efficient_taylor_shift if p.causal else efficient_taylor_shift
    t = p.kwargs.get("temperature", 1.0)
    y_chunked = form(
        p.q, p.k, p.v, key_mask, t, p.kwargs.get("scale"), p.kwargs["normalize"], chunk
    )

    g_out = randn(p.gen, *y_direct.shape)
    g_direct = _grads(y_direct, inputs, g_out)
    # The reference too: a fault shared by both public forms would show against it.
    for name, y in (("naive", y_naive), ("efficient", y_eff), ("efficient-chunked", y_chunked)):
        assert y.shape == y_direct.shape
        assert_close(y, y_direct, **FORMS_AGREE, msg=lambda m, n=name: f"{n} output: {m}")
        for x, g, g_ref in zip("qkvt", _grads(y, inputs, g_out), g_direct, strict=False):
            assert_close(g, g_ref, **FORMS_AGREE, msg=lambda m, n=name, x=x: f"{n} grad {x}: {m}")


# ---- (g) the content of a masked key never matters -----------------------------------------


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), -float("inf"), 1e30])
@pytest.mark.parametrize("form", ["direct", "efficient"])
@PROPERTY
@given(data=st.data())
def test_masked_key_content_never_matters(form, poison, data):
    # A padded key or value holding NaN, Inf or a huge number: outputs and gradients equal
    # those of ordinary content there, and the masked positions' gradients are zero.
    p = data.draw(problems(general_mask=form == "direct", requires_grad=True))
    if p.mask is None:
        p.mask = torch.rand(p.k.shape[0], 1, 1, p.k.shape[2], generator=p.gen, dtype=F64) < 0.6
    b, h, nk = p.k.shape[0], p.k.shape[1], p.k.shape[2]
    # keys that no query attends: the only positions whose content may be anything
    unused = ~p.mask.expand(b, h, p.q.shape[2], nk).any(-2)[..., None]  # (B, H, Nk, 1)
    k_bad = torch.where(unused, poison, p.k.detach()).requires_grad_()
    v_bad = torch.where(unused, poison, p.v.detach()).requires_grad_()
    extra = [t for t in [p.kwargs.get("temperature")] if isinstance(t, torch.Tensor)]

    y = attend(form, p.q, p.k, p.v, p.mask, p.causal, **p.kwargs)
    y_bad = attend(form, p.q, k_bad, v_bad, p.mask, p.causal, **p.kwargs)
    assert_close(y_bad, y, **EXACT)
    g_out = randn(p.gen, *y.shape)
    grads = torch.autograd.grad(y, [p.q, p.k, p.v, *extra], g_out, allow_unused=True)
    grads_bad = torch.autograd.grad(y_bad, [p.q, k_bad, v_bad, *extra], g_out, allow_unused=True)
    for name, g, g_bad in zip("qkvt"[: len(grads)], grads, grads_bad, strict=True):
        g = torch.zeros(()) if g is None else g
        g_bad = torch.zeros(()) if g_bad is None else g_bad
        if name in "kv":
            assert not g_bad.masked_select(unused).any(), f"grad {name} at a masked key"
            g = torch.where(unused, 0.0, g)  # (the reference's masked gradient, zero too)
        assert_close(g_bad, g, **EXACT, msg=lambda m, n=name: f"grad {n}: {m}")
