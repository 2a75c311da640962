"""Linear attention (elu + 1): the linear-time form against the plain reference.

Outputs and gradients in float64 over shapes that cross the causal chunk (128), key padding
(a fully padded batch item gives zeros), Nq != Nk, the quadratic fallback for masks that
vary over queries, the formula written out independently, and gradcheck.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from taylorshift.ops.linear_attention import linear_attention, naive_linear_attention
from tests.helpers import assert_rel_close, key_padding, random_qkv

linear_module = importlib.import_module("taylorshift.ops.linear_attention.linear")

RTOL = 1e-10
EPS = 1e-6  # the documented default eps of both forms
# (B, H, Nq, Nk, d, dv); 127/128/129/130/257 sit around the causal chunk of 128 tokens.
SHAPES = [
    (1, 1, 1, 1, 3, 2),
    (2, 3, 7, 7, 5, 3),
    (2, 2, 9, 4, 6, 1),
    (2, 2, 4, 11, 3, 4),
    (1, 2, 127, 127, 4, 3),
    (1, 2, 128, 128, 4, 3),
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
    "general-mask": (False, "general"),
}


def shape_id(shape):
    b, h, nq, nk, d, dv = shape
    return f"B{b}-H{h}-Nq{nq}-Nk{nk}-D{d}-DV{dv}"


def make_mask(kind, b, h, nq, nk, seed=0):
    if kind is None:
        return None
    if kind == "keys":
        return key_padding(b, nk, seed)  # (B, 1, 1, Nk), batch 0 fully padded when B > 1
    g = torch.Generator().manual_seed(seed + 3)
    shape = (b, h, 1, nk) if kind == "keys-per-head" else (b, 1, nq, nk)
    return torch.rand(shape, generator=g) < 0.6


def grads(y, inputs, g_out):
    return torch.autograd.grad(y, inputs, g_out)


def plain_linear_attention(q, k, v, allowed):
    """y_i = Σ_j φ(q_i)·φ(k_j) v_j / (Σ_j φ(q_i)·φ(k_j) + eps), φ = elu + 1, written out."""
    fq = torch.where(q > 0, q + 1.0, torch.exp(q))
    fk = torch.where(k > 0, k + 1.0, torch.exp(k))
    w = torch.einsum("bhix,bhjx->bhij", fq, fk) * allowed
    return torch.einsum("bhij,bhjv->bhiv", w, v) / (w.sum(-1, keepdim=True) + EPS)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_linear_form_matches_reference(shape, variant):
    b, h, nq, nk, d, dv = shape
    causal, kind = VARIANTS[variant]
    q, k, v = random_qkv(b, h, nq, nk, d, dv, seed=nq + 7 * d)
    mask = make_mask(kind, b, h, nq, nk, seed=nk)
    ref = naive_linear_attention(q, k, v, mask, causal)
    y = linear_attention(q, k, v, mask, causal)
    assert y.dtype == torch.float64
    assert_rel_close(y, ref, RTOL, "output")
    g_out = torch.randn_like(ref)
    for name, g, g_ref in zip(
        "qkv", grads(y, (q, k, v), g_out), grads(ref, (q, k, v), g_out), strict=True
    ):
        assert_rel_close(g, g_ref, RTOL, f"grad of {name}")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(2, 2, 9, 9, 4, 3), (1, 3, 6, 10, 5, 2)], ids=shape_id)
def test_reference_matches_formula_written_out(shape, causal):
    b, h, nq, nk, d, dv = shape
    q, k, v = random_qkv(b, h, nq, nk, d, dv, seed=2, requires_grad=False)
    mask = key_padding(b, nk, seed=3, empty_row=False)
    allowed = mask.expand(b, h, nq, nk)
    if causal:
        allowed = allowed & torch.ones(nq, nk, dtype=torch.bool).tril()
    expected = plain_linear_attention(q, k, v, allowed)
    assert_rel_close(naive_linear_attention(q, k, v, mask, causal), expected, RTOL, "reference")
    assert_rel_close(linear_attention(q, k, v, mask, causal), expected, RTOL, "linear form")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_small_causal_chunk_matches_reference(monkeypatch, causal):
    # A chunk of 4 tokens puts many chunk boundaries into a short sequence.
    monkeypatch.setattr(linear_module, "CAUSAL_CHUNK", 4)
    for nq, nk in [(19, 17), (17, 19), (16, 16)]:
        q, k, v = random_qkv(2, 2, nq, nk, 5, 3, seed=nq)
        mask = key_padding(2, nk, seed=2, empty_row=False)
        ref = naive_linear_attention(q, k, v, mask, causal)
        y = linear_attention(q, k, v, mask, causal)
        assert_rel_close(y, ref, RTOL, f"output Nq={nq} Nk={nk}")
        g_out = torch.randn_like(ref)
        for name, g, g_ref in zip(
            "qkv", grads(y, (q, k, v), g_out), grads(ref, (q, k, v), g_out), strict=True
        ):
            assert_rel_close(g, g_ref, RTOL, f"grad of {name}, Nq={nq} Nk={nk}")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("form", ["linear", "naive"])
def test_fully_padded_item_gives_zeros_and_finite_grads(form, causal):
    q, k, v = random_qkv(3, 2, 6, 6, 4, 3, seed=5)
    mask = key_padding(3, 6, seed=1)  # batch item 0 attends no key
    assert not mask[0].any()
    fn = linear_attention if form == "linear" else naive_linear_attention
    y = fn(q, k, v, mask, causal)
    assert torch.isfinite(y).all()
    assert torch.equal(y[0], torch.zeros_like(y[0]))
    assert y[1:].abs().sum() > 0
    for name, g in zip("qkv", grads(y, (q, k, v), torch.randn_like(y)), strict=True):
        assert torch.isfinite(g).all(), f"grad of {name} is not finite"
        assert_rel_close(g[0], torch.zeros_like(g[0]), 0.0, f"grad of {name}, padded item")


def test_rows_without_keys_in_a_general_mask_give_zeros():
    q, k, v = random_qkv(1, 2, 5, 6, 4, 3, seed=8)
    mask = torch.ones(1, 1, 5, 6, dtype=torch.bool)
    mask[..., 2, :] = False  # query 2 attends nothing
    mask[..., 3, 4:] = False
    y = linear_attention(q, k, v, mask)
    assert torch.equal(y[..., 2, :], torch.zeros_like(y[..., 2, :]))
    assert_rel_close(y, naive_linear_attention(q, k, v, mask), RTOL, "output")
    for name, g in zip("qkv", grads(y, (q, k, v), torch.randn_like(y)), strict=True):
        assert torch.isfinite(g).all(), f"grad of {name} is not finite"


def test_mask_rank_below_four_broadcasts():
    q, k, v = random_qkv(2, 2, 5, 7, 4, 3, seed=4, requires_grad=False)
    per_key = key_padding(2, 7, seed=6, empty_row=False)[1, 0, 0]  # (Nk,)
    ref = naive_linear_attention(q, k, v, per_key)
    for mask in (per_key, per_key[None], per_key[None, None]):
        y = linear_attention(q, k, v, mask)
        assert_rel_close(y, ref, RTOL, f"mask of shape {tuple(mask.shape)}")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [1, 4, 6], ids=lambda d: f"D{d}")
@pytest.mark.parametrize("n", [1, 3, 17], ids=lambda n: f"N{n}")
def test_gradcheck(monkeypatch, n, d, causal):
    monkeypatch.setattr(linear_module, "CAUSAL_CHUNK", 4)  # N = 17 crosses chunks
    q, k, v = random_qkv(2, 1, n, n, d, 2, seed=n * 10 + d)
    mask = key_padding(2, n, seed=d, empty_row=False)

    def fn(q, k, v):
        return linear_attention(q, k, v, mask, causal)

    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-6, fast_mode=n > 3)
