"""HOLT (higher-order linear transformer): the linear-time form against the plain reference.

Outputs and gradients in float64 over shapes that cross the causal chunk (128), with and
without the constant Taylor term (``subtract_one``); the second-order term against an
explicit einsum over the right indices (SPEC §4: the public fork contracts the wrong one);
fully padded batch items; the masks the linear-time form cannot express; gradcheck.
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch
import torch.nn.functional as F

from taylorshift.ops.holt import holt_attention, naive_holt_attention
from tests.helpers import assert_rel_close, key_padding, random_qkv, rel_error

holt_module = importlib.import_module("taylorshift.ops.holt.holt")

RTOL = 1e-10
# (B, H, Nq, Nk, d, dv); 127/128/129/130/257 sit around the causal chunk of 128 tokens.
SHAPES = [
    (1, 1, 1, 1, 3, 2),
    (2, 3, 7, 7, 5, 3),
    (2, 2, 9, 4, 6, 1),
    (2, 2, 4, 11, 3, 4),
    (1, 2, 127, 127, 4, 3),
    (1, 2, 129, 129, 4, 3),
    (1, 1, 257, 257, 3, 2),
    (1, 2, 130, 129, 4, 2),
    (2, 1, 129, 140, 4, 2),
]
# name -> (causal, mask kind)
VARIANTS = {
    "plain": (False, None),
    "padding": (False, "keys"),
    "padding-per-head": (False, "keys-per-head"),
    "causal": (True, None),
    "causal-padding": (True, "keys"),
}


def shape_id(shape):
    b, h, nq, nk, d, dv = shape
    return f"B{b}-H{h}-Nq{nq}-Nk{nk}-D{d}-DV{dv}"


def make_mask(kind, b, h, nk, seed=0):
    if kind is None:
        return None
    if kind == "keys":
        return key_padding(b, nk, seed)  # (B, 1, 1, Nk), batch 0 fully padded when B > 1
    g = torch.Generator().manual_seed(seed + 3)
    mask = torch.rand(b, h, 1, nk, generator=g) < 0.7
    mask[..., 0] = True
    return mask


def grads(y, inputs, g_out):
    return torch.autograd.grad(y, inputs, g_out)


@pytest.mark.parametrize("subtract_one", [False, True], ids=["with-one", "subtract-one"])
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_linear_form_matches_reference(shape, variant, subtract_one):
    b, h, nq, nk, d, dv = shape
    causal, kind = VARIANTS[variant]
    q, k, v = random_qkv(b, h, nq, nk, d, dv, seed=nq + 7 * d)
    mask = make_mask(kind, b, h, nk, seed=nk)
    kwargs = dict(subtract_one=subtract_one)
    ref = naive_holt_attention(q, k, v, mask, causal, **kwargs)
    y = holt_attention(q, k, v, mask, causal, **kwargs)
    assert y.dtype == torch.float64
    assert_rel_close(y, ref, RTOL, "output")
    g_out = torch.randn_like(ref)
    for name, g, g_ref in zip(
        "qkv", grads(y, (q, k, v), g_out), grads(ref, (q, k, v), g_out), strict=True
    ):
        assert_rel_close(g, g_ref, RTOL, f"grad of {name}")


@pytest.mark.parametrize("subtract_one", [False, True], ids=["with-one", "subtract-one"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_small_causal_chunk_matches_reference(monkeypatch, causal, subtract_one):
    # A chunk of 4 tokens puts many chunk boundaries into a short sequence.
    monkeypatch.setattr(holt_module, "CAUSAL_CHUNK", 4)
    q, k, v = random_qkv(2, 2, 19, 17, 5, 3, seed=11)
    mask = key_padding(2, 17, seed=2, empty_row=False)
    ref = naive_holt_attention(q, k, v, mask, causal, subtract_one=subtract_one)
    y = holt_attention(q, k, v, mask, causal, subtract_one=subtract_one)
    assert_rel_close(y, ref, RTOL, "output")
    g_out = torch.randn_like(ref)
    for name, g, g_ref in zip(
        "qkv", grads(y, (q, k, v), g_out), grads(ref, (q, k, v), g_out), strict=True
    ):
        assert_rel_close(g, g_ref, RTOL, f"grad of {name}")


@pytest.mark.parametrize("subtract_one", [False, True], ids=["with-one", "subtract-one"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("form", ["linear", "naive"])
def test_fully_padded_item_gives_zeros_and_finite_grads(form, causal, subtract_one):
    q, k, v = random_qkv(3, 2, 6, 6, 4, 3, seed=5)
    mask = key_padding(3, 6, seed=1)  # batch item 0 attends no key
    assert not mask[0].any()
    fn = holt_attention if form == "linear" else naive_holt_attention
    y = fn(q, k, v, mask, causal, subtract_one=subtract_one)
    assert torch.isfinite(y).all()
    assert torch.equal(y[0], torch.zeros_like(y[0]))
    assert y[1:].abs().sum() > 0
    for name, g in zip("qkv", grads(y, (q, k, v), torch.randn_like(y)), strict=True):
        assert torch.isfinite(g).all(), f"grad of {name} is not finite"
        assert_rel_close(g[0], torch.zeros_like(g[0]), 0.0, f"grad of {name}, padded item")


# ---------------------------------------------------------------------------------------
# The formula written out, independently of the library.


def layer_norm(x, eps=1e-5):
    """LayerNorm over the last dim without affine parameters, written out."""
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps)


def holt_by_einsum(query, key, value, key_mask=None, causal=False, alpha=3.0, subtract_one=False):
    """HOLT through its key-side states, every contraction an explicit einsum.

    With c = 1/(α sqrt(d)) and v' = [v, 1] (the last column gives the denominator):

        Σ_j w_ij v'_j = [Σ_j v'_j] + c Σ_x q_ix Σ_j k_jx v'_j
                        + c²/2 Σ_{x,y} q_ix q_iy Σ_j k_jx k_jy v'_j

    The pair (x, y) belongs to the same key j. Causal: the sums over j run to j <= i
    (cumulative sums over keys; needs Nq == Nk).
    """
    c = 1.0 / (alpha * math.sqrt(query.shape[-1]))
    q, k = layer_norm(query), layer_norm(key)
    v1 = torch.cat([value, torch.ones_like(value[..., :1])], dim=-1)
    if key_mask is not None:
        v1 = v1 * key_mask[..., None]  # (B, H, Nk, 1): padded keys leave every sum
    per_key0 = v1  # (B, H, Nk, dv+1)
    per_key1 = torch.einsum("bhjx,bhjv->bhjxv", k, v1)
    per_key2 = torch.einsum("bhjx,bhjy,bhjv->bhjxyv", k, k, v1)
    if causal:
        s0, s1, s2 = (t.cumsum(2) for t in (per_key0, per_key1, per_key2))
        zeroth = s0
        first = torch.einsum("bhix,bhixv->bhiv", q, s1)
        second = torch.einsum("bhix,bhiy,bhixyv->bhiv", q, q, s2)
    else:
        s0, s1, s2 = (t.sum(2) for t in (per_key0, per_key1, per_key2))
        zeroth = s0[:, :, None].expand(*q.shape[:3], -1)
        first = torch.einsum("bhix,bhxv->bhiv", q, s1)
        second = torch.einsum("bhix,bhiy,bhxyv->bhiv", q, q, s2)
    total = c * first + c * c / 2 * second + (0.0 if subtract_one else zeroth)
    return total[..., :-1] / total[..., -1:]


def holt_wrong_index(query, key, value, alpha=3.0):
    """The pitfall: the pair (x, y) taken from different keys, (Σ_j k_jx)(Σ_l k_ly v_l)."""
    c = 1.0 / (alpha * math.sqrt(query.shape[-1]))
    q, k = layer_norm(query), layer_norm(key)
    v1 = torch.cat([value, torch.ones_like(value[..., :1])], dim=-1)
    first = torch.einsum("bhix,bhjx,bhjv->bhiv", q, k, v1)
    second = torch.einsum("bhix,bhiy,bhjx,bhly,bhlv->bhiv", q, q, k, k, v1)
    total = v1.sum(2, keepdim=True) + c * first + c * c / 2 * second
    return total[..., :-1] / total[..., -1:]


def test_second_order_term_by_einsum_equals_pairwise_scores():
    # The einsum identity itself: Σ_{x,y} q_x q_y Σ_j k_jx k_jy v_j = Σ_j (q·k_j)² v_j.
    q, k, v = random_qkv(2, 3, 5, 8, 4, 3, requires_grad=False)
    by_states = torch.einsum(
        "bhix,bhiy,bhxyv->bhiv", q, q, torch.einsum("bhjx,bhjy,bhjv->bhxyv", k, k, v)
    )
    by_scores = ((q @ k.transpose(-2, -1)) ** 2) @ v
    assert_rel_close(by_states, by_scores, 1e-12, "second-order term")


@pytest.mark.parametrize("subtract_one", [False, True], ids=["with-one", "subtract-one"])
@pytest.mark.parametrize("variant", ["plain", "padding", "causal"])
def test_matches_explicit_einsum(variant, subtract_one):
    causal = variant == "causal"
    nq = nk = 9
    if variant == "plain":
        nk = 13
    q, k, v = random_qkv(2, 2, nq, nk, 4, 3, seed=3, requires_grad=False)
    mask = key_padding(2, nk, seed=4, empty_row=False) if variant == "padding" else None
    key_mask = None if mask is None else mask[:, :, 0, :].double()
    expected = holt_by_einsum(q, k, v, key_mask, causal, subtract_one=subtract_one)
    y = holt_attention(q, k, v, mask, causal, subtract_one=subtract_one)
    assert_rel_close(y, expected, RTOL, "linear form")
    ref = naive_holt_attention(q, k, v, mask, causal, subtract_one=subtract_one)
    assert_rel_close(ref, expected, RTOL, "reference")


def test_wrong_index_contraction_is_detected():
    # The einsum check above is sensitive to the pitfall: the wrong contraction differs.
    q, k, v = random_qkv(1, 2, 9, 13, 4, 3, seed=3, requires_grad=False)
    y = holt_attention(q, k, v)
    assert_rel_close(y, holt_by_einsum(q, k, v), RTOL, "right index")
    assert rel_error(holt_wrong_index(q, k, v), y) > 1e-2


@pytest.mark.parametrize("alpha", [1.0, 3.0, 7.5])
def test_alpha_divides_the_scores(alpha):
    q, k, v = random_qkv(1, 2, 6, 6, 5, 2, seed=9, requires_grad=False)
    y = holt_attention(q, k, v, alpha=alpha)
    expected = holt_by_einsum(q, k, v, alpha=alpha)
    assert_rel_close(y, expected, RTOL, f"alpha={alpha}")


def test_layer_norm_without_affine_matches_torch():
    # The test's own LayerNorm is the one HOLT documents (F.layer_norm, no weight or bias).
    x = torch.randn(3, 4, 7, dtype=torch.float64)
    assert_rel_close(layer_norm(x), F.layer_norm(x, (7,)), 1e-12, "layer norm")


# ---------------------------------------------------------------------------------------
# Masks and the denominator guard.


@pytest.mark.parametrize("subtract_one", [False, True], ids=["with-one", "subtract-one"])
def test_query_varying_mask_runs_the_quadratic_form(subtract_one):
    # As linear attention does; it raised a message about taylor_shift_attention's mode
    # (with subtract_one, one that named the softmax kernel).
    q, k, v = random_qkv(2, 2, 5, 5, 4, 3, requires_grad=False)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()  # row i attends keys 0..i: causal
    want = holt_by_einsum(q, k, v, causal=True, subtract_one=subtract_one)
    got = holt_attention(q, k, v, mask, subtract_one=subtract_one)
    assert_rel_close(got, want, 1e-12, "output")


@pytest.mark.parametrize("subtract_one", [False, True], ids=["with-one", "subtract-one"])
def test_key_padding_repeated_over_queries_is_accepted(subtract_one):
    q, k, v = random_qkv(2, 2, 5, 7, 4, 3, requires_grad=False)
    mask = key_padding(2, 7, seed=6).expand(2, 2, 5, 7)  # rows all equal: key padding
    y = holt_attention(q, k, v, mask, subtract_one=subtract_one)
    ref = naive_holt_attention(q, k, v, mask, subtract_one=subtract_one)
    assert_rel_close(y, ref, RTOL, "output")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_subtract_one_zero_denominator_is_guarded(causal):
    # LayerNorm keeps (1, -1, 0, 0) and (0, 0, 1, -1) orthogonal: score 0, weight s + s²/2 = 0,
    # so a query that attends only that key has a zero denominator.
    q = torch.tensor([1.0, -1.0, 0.0, 0.0], dtype=torch.float64).view(1, 1, 1, 4)
    k = torch.tensor([0.0, 0.0, 1.0, -1.0], dtype=torch.float64).view(1, 1, 1, 4)
    v = torch.tensor([[2.0, -3.0]], dtype=torch.float64).view(1, 1, 1, 2)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    y = holt_attention(q, k, v, is_causal=causal, subtract_one=True)
    ref = naive_holt_attention(q, k, v, is_causal=causal, subtract_one=True)
    assert torch.isfinite(y).all()
    assert_rel_close(y, ref, RTOL, "output")
    for name, g in zip("qkv", grads(y, (q, k, v), torch.ones_like(y)), strict=True):
        assert torch.isfinite(g).all(), f"grad of {name} is not finite"


# ---------------------------------------------------------------------------------------
# gradcheck on tiny shapes (SPEC §8).


@pytest.mark.parametrize("subtract_one", [False, True], ids=["with-one", "subtract-one"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [1, 4, 6], ids=lambda d: f"D{d}")
@pytest.mark.parametrize("n", [1, 3, 17], ids=lambda n: f"N{n}")
def test_gradcheck(monkeypatch, n, d, causal, subtract_one):
    monkeypatch.setattr(holt_module, "CAUSAL_CHUNK", 4)  # N = 17 crosses chunks
    q, k, v = random_qkv(2, 1, n, n, d, 2, seed=n * 10 + d)
    mask = key_padding(2, n, seed=d, empty_row=False)

    def fn(q, k, v):
        return holt_attention(q, k, v, mask, causal, subtract_one=subtract_one)

    # The full Jacobian is slow through the efficient TaylorShift path: fast mode checks a
    # random projection of it, except at N = 1.
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-6, fast_mode=n > 1)
