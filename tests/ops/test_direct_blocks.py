"""The blocked direct form: every way of cutting (B, Nq) into blocks gives the reference's
outputs and gradients (float64), with causal blocks that stop at their last key, masks
sliced per block, query rows with no key, and orders above 2."""

from __future__ import annotations

import pytest
import torch

from taylorshift import naive_taylor_shift_attention, taylor_shift_attention
from taylorshift.ops.taylor_shift import direct

from ..helpers import assert_rel_close, key_padding, random_qkv

# (B, H, Nq, Nk, d, dv): Nq > Nk, Nq < Nk, a prime length, one query
SHAPES = [(3, 2, 17, 17, 5, 3), (2, 3, 23, 11, 4, 6), (2, 1, 7, 29, 3, 2), (2, 2, 1, 9, 4, 4)]


def _mask(kind, b, h, nq, nk):
    if kind == "none":
        return None
    if kind == "padding":
        return key_padding(b, nk)
    g = torch.Generator().manual_seed(3)
    mask = torch.rand(b, h, nq, nk, generator=g) > 0.4
    mask[0, 0, 0] = False  # a query that attends nothing
    return mask


# The backward takes each block's weights from the forward up to KEEP_ENTRIES, else
# recomputes them: both ways are checked against the reference.
WEIGHTS = {"kept": 1 << 40, "recomputed": 0}


@pytest.mark.parametrize("weights", WEIGHTS)
@pytest.mark.parametrize("entries", [1, 40, 300, 1 << 18], ids=lambda e: f"block{e}")
@pytest.mark.parametrize("mask_kind", ["none", "padding", "general"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}-H{}-Nq{}-Nk{}-d{}-dv{}".format(*s))
def test_blocks_match_reference(monkeypatch, weights, entries, mask_kind, causal, shape):
    monkeypatch.setattr(direct, "BLOCK_ENTRIES", entries)
    monkeypatch.setattr(direct, "KEEP_ENTRIES", WEIGHTS[weights])
    b, h, nq, nk, d, dv = shape
    q, k, v = random_qkv(b, h, nq, nk, d, dv, seed=sum(shape))
    tau = torch.linspace(0.5, 3.0, h, dtype=torch.float64).view(1, h, 1, 1).requires_grad_()
    mask = _mask(mask_kind, b, h, nq, nk)
    kwargs = {"attn_mask": mask, "is_causal": causal, "temperature": tau}
    got = taylor_shift_attention(q, k, v, mode="direct", **kwargs)
    want = naive_taylor_shift_attention(q, k, v, **kwargs)
    assert_rel_close(got, want, 1e-12, "output")
    grad = torch.randn_like(want)
    got_grads = torch.autograd.grad(got, (q, k, v, tau), grad)
    want_grads = torch.autograd.grad(want, (q, k, v, tau), grad)
    for name, a, e in zip(["q", "k", "v", "tau"], got_grads, want_grads, strict=True):
        assert_rel_close(a, e, 1e-11, f"d{name}")


@pytest.mark.parametrize("weights", WEIGHTS)
@pytest.mark.parametrize("order", [4, 6])
@pytest.mark.parametrize("normalize", [True, False], ids=["normalize", "plain"])
def test_higher_orders_in_blocks(monkeypatch, weights, order, normalize):
    monkeypatch.setattr(direct, "BLOCK_ENTRIES", 50)
    monkeypatch.setattr(direct, "KEEP_ENTRIES", WEIGHTS[weights])
    q, k, v = random_qkv(2, 2, 13, 13, 4, 3, seed=order)
    kwargs = {"is_causal": True, "normalize": normalize, "order": order}
    got = taylor_shift_attention(q, k, v, mode="direct", **kwargs)
    want = naive_taylor_shift_attention(q, k, v, **kwargs)
    assert_rel_close(got, want, 1e-12, "output")
    grad = torch.randn_like(want)
    for name, a, e in zip(
        "qkv",
        torch.autograd.grad(got, (q, k, v), grad),
        torch.autograd.grad(want, (q, k, v), grad),
        strict=True,
    ):
        assert_rel_close(a, e, 1e-11, f"d{name}")


@pytest.mark.parametrize("entries", [1, 33, 34, 231, 1000, 1 << 20])
def test_blocks_cover_every_row_once(monkeypatch, entries):
    # B = 5, H = 3, Nq = 7, Nk = 11: the blocks tile (B, Nq) exactly, each within budget
    # (or one row of one batch entry when a row alone is over it).
    monkeypatch.setattr(direct, "BLOCK_ENTRIES", entries)
    covered = torch.zeros(5, 7, dtype=torch.int64)
    for b0, b1, i0, i1 in direct._blocks(5, 3, 7, 11):
        covered[b0:b1, i0:i1] += 1
        assert (b1 - b0) * 3 * (i1 - i0) * 11 <= max(entries, 3 * 11)
    assert bool((covered == 1).all()), f"budget {entries}: {covered}"


@pytest.mark.parametrize("weights", WEIGHTS)
def test_kept_weights_spare_the_backward_its_score_products(monkeypatch, weights):
    monkeypatch.setattr(direct, "BLOCK_ENTRIES", 40)
    monkeypatch.setattr(direct, "KEEP_ENTRIES", WEIGHTS[weights])
    calls = []
    real = direct._block_weights
    monkeypatch.setattr(direct, "_block_weights", lambda *a: calls.append(1) or real(*a))
    q, k, v = random_qkv(2, 2, 9, 9, 4, 3, seed=5)
    out = taylor_shift_attention(q, k, v, mode="direct", attn_mask=key_padding(2, 9))
    forward_blocks = len(calls)
    assert forward_blocks == len(direct._blocks(2, 2, 9, 9)) > 1
    grads = torch.autograd.grad(out.sum(), (q, k, v), retain_graph=True)
    backward_blocks = len(calls) - forward_blocks
    assert backward_blocks == (0 if weights == "kept" else forward_blocks)
    # a second backward through the same graph recomputes (the kept blocks are released)
    again = torch.autograd.grad(out.sum(), (q, k, v))
    assert len(calls) - forward_blocks - backward_blocks == forward_blocks
    for a, b in zip(grads, again, strict=True):
        assert_rel_close(a, b, 1e-13, "second backward")


def test_no_weights_are_kept_without_autograd_or_above_the_limit(monkeypatch):
    q, k, v = random_qkv(2, 2, 9, 9, 4, 3, seed=6)
    kept = []
    real = direct.weighted_sums
    monkeypatch.setattr(
        direct, "weighted_sums", lambda *a: kept.append(a[-1] is not None) or real(*a)
    )
    with torch.no_grad():
        taylor_shift_attention(q, k, v, mode="direct")
    taylor_shift_attention(q, k, v, mode="direct")
    monkeypatch.setattr(direct, "KEEP_ENTRIES", 2 * 2 * 9 * 9 - 1)
    taylor_shift_attention(q, k, v, mode="direct")
    assert kept == [False, True, False]
