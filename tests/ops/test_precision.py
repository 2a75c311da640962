"""Low precision: float32/float16/bfloat16 against float64 (SPEC §8 tolerance rule).

The fast form's error against the float64 reference must stay within a small multiple of
the error of the plain reference run in the same low precision: 2× for outputs, 3× for
gradients, plus a relative-RMS bound. Long sequences (N = 65,536) stay finite and accurate.
"""

from __future__ import annotations

import pytest
import torch

from taylorshift import naive_taylor_shift_attention, taylor_shift_attention
from tests.helpers import key_padding, rel_error

LOW = [torch.float32, torch.float16, torch.bfloat16]
# Below this the comparison is at the level of float64 rounding of the check itself.
FLOOR = {torch.float32: 1e-6, torch.float16: 1e-4, torch.bfloat16: 1e-3}
RMS_BOUND = 5e-3


def _inputs(dtype, n=200, d=16, dv=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(2, 2, n, d), (2, 2, n, d), (2, 2, n, dv)]
    low = [torch.randn(s, generator=g).to(dtype).requires_grad_() for s in shapes]
    high = [x.detach().double().requires_grad_() for x in low]
    return low, high


@pytest.mark.parametrize("normalize", [True, False], ids=["norm", "plain-scores"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("mode", ["direct", "efficient"])
@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_low_precision_error_within_reference_error(dtype, mode, causal, normalize):
    low, high = _inputs(dtype)
    mask = key_padding(2, 200, empty_row=False)
    kwargs = dict(normalize=normalize)
    if normalize:
        kwargs["temperature"] = 1.5

    exact = naive_taylor_shift_attention(*high, mask, causal, **kwargs)
    ref_low = naive_taylor_shift_attention(*low, mask, causal, **kwargs)
    fast = taylor_shift_attention(*low, mask, causal, mode=mode, **kwargs)
    assert fast.dtype == dtype

    err_fast, err_ref = rel_error(fast, exact), rel_error(ref_low, exact)
    assert err_fast <= 2 * err_ref + FLOOR[dtype], (err_fast, err_ref)
    assert err_fast < RMS_BOUND

    g = torch.randn_like(exact)
    g_exact = torch.autograd.grad(exact, high, g)
    g_ref = torch.autograd.grad(ref_low, low, g.to(dtype))
    g_fast = torch.autograd.grad(fast, low, g.to(dtype))
    for name, a, r, e in zip("qkv", g_fast, g_ref, g_exact, strict=True):
        assert a.dtype == dtype
        err_fast, err_ref = rel_error(a, e), rel_error(r, e)
        assert err_fast <= 3 * err_ref + FLOOR[dtype], (name, err_fast, err_ref)
        assert err_fast < RMS_BOUND, (name, err_fast)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_long_sequence_low_precision(dtype, causal):
    n, d = 65_536, 16
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, n, d, generator=g) for _ in range(3))
    q32, k32, v32 = (x.to(dtype).float() for x in (q, k, v))
    low = [x.to(dtype).requires_grad_() for x in (q, k, v)]

    y = taylor_shift_attention(*low, is_causal=causal, mode="efficient")
    assert y.dtype == dtype and torch.isfinite(y).all()
    y32 = taylor_shift_attention(q32, k32, v32, is_causal=causal, mode="efficient")
    assert rel_error(y, y32) < RMS_BOUND

    # Exact rows for a sample of queries (the first, the last, and some between).
    rows = torch.tensor([0, 1, 2, 1000, 33_333, n - 2, n - 1])
    mask = None
    if causal:
        mask = torch.arange(n)[None, :] <= rows[:, None]  # (rows, Nk)
    exact = naive_taylor_shift_attention(q32[:, :, rows].double(), k32.double(), v32.double(), mask)
    assert rel_error(y[:, :, rows], exact) < RMS_BOUND

    (g_q, g_k, g_v) = torch.autograd.grad(y, low, torch.randn_like(y))
    for grad in (g_q, g_k, g_v):
        assert grad.dtype == dtype and torch.isfinite(grad).all()
