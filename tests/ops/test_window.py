"""Sliding-window softmax attention (ops.window): the tiled form and the library's plain
form against a per-row implementation written here from the definition, outputs and
gradients in float64; gradcheck; the window against plain softmax where it covers every
key; bad input."""

from __future__ import annotations

import math

import pytest
import torch

from taylorshift.ops.window import naive_sliding_window_attention, sliding_window_attention
from tests.helpers import assert_rel_close, key_padding, random_qkv

RTOL = 1e-12
FORMS = {"tiled": sliding_window_attention, "plain": naive_sliding_window_attention}


def per_row(q, k, v, window, mask, causal):
    """Each query row on its own: the keys it may see, a softmax over them, zeros if none."""
    b, h, nq, _ = q.shape
    nk = k.shape[-2]
    if mask is not None:
        mask = mask.expand(b, h, nq, nk)
    out = torch.zeros(b, h, nq, v.shape[-1], dtype=v.dtype)
    for bi in range(b):
        for hi in range(h):
            for i in range(nq):
                pos = i + nk - nq
                keys = [
                    j
                    for j in range(nk)
                    if ((pos - window < j <= pos) if causal else abs(pos - j) < window)
                    and (mask is None or bool(mask[bi, hi, i, j]))
                ]
                if not keys:
                    continue
                s = torch.stack([q[bi, hi, i] @ k[bi, hi, j] for j in keys]) / math.sqrt(
                    q.shape[-1]
                )
                w = torch.softmax(s, dim=0)
                out[bi, hi, i] = (w[:, None] * v[bi, hi, keys]).sum(0)
    return out


def check_against_rows(form, q, k, v, window, mask, causal):
    expected = per_row(q, k, v, window, mask, causal)
    actual = form(q, k, v, window, mask, causal)
    assert_rel_close(actual, expected, RTOL, "output")
    g = torch.randn(expected.shape, generator=torch.Generator().manual_seed(7), dtype=q.dtype)
    want = torch.autograd.grad((expected * g).sum(), (q, k, v))
    got = torch.autograd.grad((actual * g).sum(), (q, k, v))
    for name, a, e in zip("qkv", got, want, strict=True):
        assert_rel_close(a, e, RTOL, f"grad of {name}")


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize(
    ("n", "window"), [(1, 1), (1, 4), (3, 1), (17, 4), (17, 5), (16, 4), (6, 17)]
)
def test_self_attention_matches_per_row(form, causal, n, window):
    q, k, v = random_qkv(2, 2, n, n, 3, 5, seed=n + window)
    check_against_rows(FORMS[form], q, k, v, window, None, causal)


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("kind", ["padding", "padding-per-head", "general"])
def test_masks_match_per_row(form, causal, kind):
    n, window = 13, 4
    q, k, v = random_qkv(3, 2, n, n, 4, 3, seed=1)
    if kind == "padding":
        mask = key_padding(3, n)  # batch 0 all padding: its rows give zeros
    elif kind == "padding-per-head":
        mask = torch.rand(3, 2, 1, n, generator=torch.Generator().manual_seed(2)) > 0.4
    else:
        mask = torch.rand(3, 2, n, n, generator=torch.Generator().manual_seed(3)) > 0.3
    check_against_rows(FORMS[form], q, k, v, window, mask, causal)


@pytest.mark.parametrize("form", list(FORMS))
def test_fewer_queries_than_keys_sit_at_the_end(form):
    # a block of new tokens after a cache: query i is position i + Nk - Nq
    q, k, v = random_qkv(1, 2, 3, 11, 4, 4, seed=4)
    check_against_rows(FORMS[form], q, k, v, 4, None, False)


def test_window_covering_every_key_is_plain_softmax():
    q, k, v = random_qkv(2, 3, 19, 19, 8, 8, seed=5, requires_grad=False)
    causal = sliding_window_attention(q, k, v, 19, None, True)
    full = sliding_window_attention(q, k, v, 19, None, False)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    assert_rel_close(causal, sdpa(q, k, v, is_causal=True), RTOL, "causal")
    assert_rel_close(full, sdpa(q, k, v), RTOL, "non-causal")


def test_window_of_one_causal_returns_the_values():
    q, k, v = random_qkv(1, 2, 9, 9, 4, 3, seed=6, requires_grad=False)
    assert_rel_close(sliding_window_attention(q, k, v, 1, None, True), v, RTOL, "window 1")


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_gradcheck(causal):
    q, k, v = random_qkv(1, 2, 7, 7, 3, 2, seed=8)
    mask = key_padding(1, 7, empty_row=False)
    assert torch.autograd.gradcheck(
        lambda q, k, v: sliding_window_attention(q, k, v, 3, mask, causal), (q, k, v)
    )


def test_float32_close_to_float64():
    q, k, v = random_qkv(2, 2, 100, 100, 16, 16, seed=9, requires_grad=False)
    exact = sliding_window_attention(q, k, v, 8, None, True)
    single = sliding_window_attention(q.float(), k.float(), v.float(), 8, None, True)
    assert_rel_close(single, exact, 1e-5, "float32")


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"window": 0}, ValueError, r"window must be a positive int; got 0"),
        ({"window": 2.0}, TypeError, r"window must be a positive int; got 2\.0"),
        ({"window": True}, TypeError, r"window must be a positive int; got True"),
        ({"is_causal": 1}, TypeError, r"is_causal must be a bool.*got 1"),
        ({"k": torch.zeros(2, 2, 5, 3)}, ValueError, r"k must be \(B, H, Nk, d\).*k \(2, 2, 5, 3"),
        ({"q": torch.zeros(2, 5, 4)}, ValueError, r"q, k and v must be \(B, H, N, d\)"),
    ],
)
def test_bad_input_is_refused_by_name(kwargs, error, pattern):
    args = dict(zip("qkv", random_qkv(2, 2, 5, 5, 4, 4, requires_grad=False), strict=True))
    args.update(window=3, is_causal=True)
    args.update(kwargs)
    for form in FORMS.values():
        with pytest.raises(error, match=pattern):
            form(**args)
