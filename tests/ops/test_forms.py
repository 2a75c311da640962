"""Direct, efficient and the plain reference agree in float64, outputs and gradients.

The grid crosses chunk boundaries (chunk 64 against N = 63, 64, 65, 257; N = 257 up to
d = 33) for every combination of normalisation and masking the efficient form supports
(SPEC §8).
"""

from __future__ import annotations

import pytest
import torch

from taylorshift import naive_taylor_shift_attention, taylor_shift_attention
from taylorshift.ops.taylor_shift.efficient import efficient_taylor_shift
from taylorshift.ops.taylor_shift.efficient_causal import causal_efficient_taylor_shift
from tests.helpers import assert_rel_close, key_padding, random_qkv

DIMS = [1, 2, 3, 5, 8, 16, 33, 64]
LENGTHS = [1, 2, 7, 63, 64, 65, 257]
# every pair but d = 64 at N = 257 (a fifth of the grid's time): d = 64 crosses the chunk
# boundary at N = 63 … 65, and N = 257 crosses four of them at d <= 33
SIZES = [(d, n) for d in DIMS for n in LENGTHS if (d, n) != (64, 257)]
# (name, causal, key padding, query-varying mask, Nk - Nq, dv - d)
VARIANTS = {
    "plain": (False, False, False, 0, 0),
    "padding": (False, True, False, 0, 0),
    "causal": (True, False, False, 0, 0),
    "causal-padding": (True, True, False, 0, 0),
    "cross-dv": (False, True, False, 5, 3),
    "causal-cross": (True, False, False, -1, 2),
    "general-mask": (False, False, True, 0, 0),
}
RTOL = 1e-10


def _problem(variant, n, d, normalize, seed=0):
    causal, padding, general, dn, ddv = VARIANTS[variant]
    nq, nk, dv = n, max(n + dn, 0), max(d + ddv, 1)
    b, h = 2, 3
    q, k, v = random_qkv(b, h, nq, nk, d, dv, seed=seed)
    mask = key_padding(b, nk, seed) if padding else None
    if general:
        g = torch.Generator().manual_seed(seed + 7)
        mask = torch.rand(b, 1, nq, nk, generator=g) > 0.4
    temperature = 1.0
    if normalize:
        temperature = (0.5 + torch.rand(1, h, 1, 1, dtype=torch.float64)).requires_grad_()
    return q, k, v, mask, causal, temperature


def _grads(y, inputs, g):
    used = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
    return torch.autograd.grad(y, used, g)


@pytest.mark.parametrize("normalize", [True, False], ids=["norm", "plain-scores"])
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize(("d", "n"), [pytest.param(d, n, id=f"D{d}-N{n}") for d, n in SIZES])
def test_forms_agree_with_reference_fp64(d, n, variant, normalize):
    q, k, v, mask, causal, temperature = _problem(variant, n, d, normalize)
    kwargs = dict(temperature=temperature, normalize=normalize)
    inputs = [q, k, v, temperature]
    ref = naive_taylor_shift_attention(q, k, v, mask, causal, **kwargs)
    g_out = torch.randn_like(ref)
    ref_grads = _grads(ref, inputs, g_out)

    # (mode="auto" runs one of these two: tests/ops/test_dispatch.py checks which)
    outputs = {"direct": taylor_shift_attention(q, k, v, mask, causal, mode="direct", **kwargs)}
    if not VARIANTS[variant][2]:
        key_mask = None if mask is None else mask.expand(2, 3, 1, -1)[:, :, 0]
        form = causal_efficient_taylor_shift if causal else efficient_taylor_shift
        outputs["efficient-chunk64"] = form(q, k, v, key_mask, temperature, None, normalize, 64)
        outputs["efficient"] = taylor_shift_attention(
            q, k, v, mask, causal, mode="efficient", **kwargs
        )

    for name, y in outputs.items():
        assert y.dtype == torch.float64
        assert_rel_close(y, ref, RTOL, f"{name} output")
        for i, (g, g_ref) in enumerate(zip(_grads(y, inputs, g_out), ref_grads, strict=True)):
            assert_rel_close(g, g_ref, RTOL, f"{name} grad of {'qkvt'[i]}")


@pytest.mark.parametrize("order", [4, 6])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_direct_higher_orders_match_reference(order, causal):
    q, k, v = random_qkv(2, 2, 19, 19, 6, 5)
    mask = key_padding(2, 19)
    ref = naive_taylor_shift_attention(q, k, v, mask, causal, order=order)
    y = taylor_shift_attention(q, k, v, mask, causal, order=order, mode="direct")
    assert_rel_close(y, ref, RTOL, "output")
    auto = taylor_shift_attention(q, k, v, mask, causal, order=order)
    assert_rel_close(auto, ref, RTOL, "auto output")


@pytest.mark.parametrize("mode", ["direct", "efficient"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_non_contiguous_inputs(mode, causal):
    # (B, N, H, d) storage seen as (B, H, N, d), as a fused qkv projection produces.
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(2, 70, 3, 4, 9, generator=g, dtype=torch.float64)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    assert not q.is_contiguous()
    y = taylor_shift_attention(q, k, v, is_causal=causal, mode=mode)
    ref = naive_taylor_shift_attention(q.contiguous(), k.contiguous(), v.contiguous(), None, causal)
    assert_rel_close(y, ref, RTOL, "output")


@pytest.mark.parametrize("mode", ["direct", "efficient"])
def test_broadcast_masks_of_fewer_dims(mode):
    q, k, v = random_qkv(2, 3, 11, 11, 4, 4, requires_grad=False)
    pad = key_padding(2, 11)  # (B, 1, 1, Nk)
    per_key = pad[1, 0, 0]  # (Nk,): the same padding for the whole batch
    for mask in (per_key, per_key[None], per_key[None, None]):
        y = taylor_shift_attention(q, k, v, mask, mode=mode)
        ref = naive_taylor_shift_attention(q, k, v, mask)
        assert_rel_close(y, ref, RTOL, f"mask of shape {tuple(mask.shape)}")


@pytest.mark.parametrize("mode", ["direct", "efficient"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_float_temperature_and_scale(mode, causal):
    q, k, v = random_qkv(1, 2, 30, 30, 8, 8)
    for kwargs in (dict(temperature=2.5), dict(normalize=False, scale=0.7)):
        y = taylor_shift_attention(q, k, v, None, causal, mode=mode, **kwargs)
        ref = naive_taylor_shift_attention(q, k, v, None, causal, **kwargs)
        assert_rel_close(y, ref, RTOL, str(kwargs))
