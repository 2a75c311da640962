"""The causal efficient form continued from a prefix state equals one sweep over the whole.

A sequence split at m: the second part, started from the state of the first part (the
unweighted sums and the key count), gives the rows m.. of the whole causal result; its
gradient w.r.t. that state is checked numerically (gradcheck, float64).
"""

from __future__ import annotations

import pytest
import torch

from taylorshift import naive_taylor_shift_attention
from taylorshift.ops.taylor_shift.efficient_causal import (
    causal_efficient_taylor_shift,
    causal_forward,
)
from taylorshift.ops.taylor_shift.features import feature_dim
from tests.helpers import assert_rel_close, key_padding, random_qkv


def _prefix(k, v, mask, normalize, chunk):
    """State and count after keys k, v (B, H, m, ·) via the sweep itself (no queries)."""
    b, h, m, d = k.shape
    q = k.new_zeros((b, h, 0, d))
    _, _, _, state = causal_forward(q, k, v, 1.0, normalize, mask, chunk)
    count = torch.full((b, h), float(m), dtype=k.dtype) if mask is None else mask.sum(-1)
    return state, count.to(k.dtype)


@pytest.mark.parametrize("padding", [False, True], ids=["dense", "padded"])
@pytest.mark.parametrize("normalize", [True, False], ids=["norm", "plain-scores"])
@pytest.mark.parametrize(("n", "m", "chunk"), [(9, 4, 3), (40, 17, 8), (33, 32, 64), (5, 0, 2)])
def test_split_sequence_equals_whole(n, m, chunk, normalize, padding):
    b, h, d, dv = 2, 3, 5, 4
    q, k, v = random_qkv(b, h, n, n, d, dv, requires_grad=False)
    mask = key_padding(b, n, seed=3).reshape(b, 1, n).expand(b, h, n) if padding else None
    tau = 0.8 if normalize else None
    kwargs = dict(temperature=tau or 1.0, scale=None, normalize=normalize)
    whole = naive_taylor_shift_attention(
        q, k, v, None if mask is None else mask[:, :, None, :], True, **kwargs
    )
    state, count = _prefix(k[:, :, :m], v[:, :, :m], None if mask is None else mask[:, :, :m],
                           normalize, chunk)  # fmt: skip
    rest = causal_efficient_taylor_shift(
        q[:, :, m:], k[:, :, m:], v[:, :, m:], None if mask is None else mask[:, :, m:],
        chunk_size=chunk, initial_state=state, initial_count=count, **kwargs,
    )  # fmt: skip
    assert_rel_close(rest, whole[:, :, m:], 1e-10, "continued rows")


@pytest.mark.parametrize("normalize", [True, False], ids=["norm", "plain-scores"])
def test_gradient_wrt_initial_state(normalize):
    b, h, n, d, dv = 1, 2, 6, 3, 2
    q, k, v = random_qkv(b, h, n, n, d, dv)
    g = torch.Generator().manual_seed(5)
    state = torch.rand(b, h, feature_dim(d), dv + 1, generator=g, dtype=torch.float64)
    state.requires_grad_()
    count = torch.full((b, h), 4.0, dtype=torch.float64)
    temperature = torch.tensor([[[[1.3]], [[0.7]]]], dtype=torch.float64, requires_grad=True)

    def f(q, k, v, s, t):
        return causal_efficient_taylor_shift(
            q, k, v, None, t if normalize else 1.0, None, normalize, chunk_size=4,
            initial_state=s, initial_count=count,
        )  # fmt: skip

    assert torch.autograd.gradcheck(f, (q, k, v, state, temperature))
