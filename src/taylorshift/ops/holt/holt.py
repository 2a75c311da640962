"""Higher-order linear transformer (HOLT) attention, Mercat's second-order linear attention.

    q̃, k̃ = LayerNorm(q), LayerNorm(k)        (no affine parameters)
    s     = q̃·k̃ / (α sqrt(d))                  (α = 3 by default)
    w     = 1 + s + s²/2                       (subtract_one: s + s²/2, which can be < 0)
    y_i   = Σ_j w_ij v_j / Σ_j w_ij

The second-order term is expanded as Σ_{a,b} q̃_a q̃_b Σ_j k̃_ja k̃_jb v_j: the pair sum runs
over the feature indices a, b of the same key j (the public fork contracts the wrong index
there). Without subtract_one this is TaylorShift's plain form on layer-normed q and k, so
the linear-time path is ``taylor_shift_attention(..., normalize=False)``. With subtract_one
the denominator can vanish or change sign: it is kept at least ``eps`` away from zero with
its sign.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..._validate import check_bool, check_number
from ..masks import key_padding_of
from ..taylor_shift import taylor_shift_attention
from ..taylor_shift.checks import check_attention_inputs

CAUSAL_CHUNK = 128


def _normed(x: Tensor) -> Tensor:
    return F.layer_norm(x, x.shape[-1:])


def _guard(den: Tensor, eps: float) -> Tensor:
    sign = torch.where(den < 0, -1.0, 1.0).to(den.dtype)
    return sign * den.abs().clamp_min(eps)


def naive_holt_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    *,
    alpha: float = 3.0,
    subtract_one: bool = False,
    eps: float = 1e-6,
) -> Tensor:
    """The quadratic reference. A query with no attended key returns zeros. (B, H, Nq, dv)."""
    s = _normed(query) @ _normed(key).transpose(-2, -1) / (alpha * math.sqrt(query.shape[-1]))
    w = s + s * s / 2 + (0.0 if subtract_one else 1.0)
    nq, nk = w.shape[-2:]
    allowed = torch.ones(nq, nk, dtype=torch.bool, device=w.device)
    if is_causal:
        allowed = allowed.tril()
    if attn_mask is not None:
        allowed = allowed & attn_mask
    w = w * allowed
    den = w.sum(-1, keepdim=True)
    y = (w @ value) / _guard(den, eps)
    return y * allowed.any(-1, keepdim=True)


def holt_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    *,
    alpha: float = 3.0,
    subtract_one: bool = False,
    eps: float = 1e-6,
) -> Tensor:
    """Linear-time HOLT; equals ``naive_holt_attention``. A mask that varies over queries
    runs the quadratic form (as ``linear_attention`` does): only key padding and
    ``is_causal`` fit the linear-time sums.

    Inputs are checked as ``taylor_shift_attention``'s (a bool mask broadcasting to
    (B, H, Nq, Nk)), ``alpha`` > 0, ``subtract_one`` a bool, with ``ValueError``/
    ``TypeError`` naming the argument."""
    check_attention_inputs(query, key, value, attn_mask, is_causal)
    check_number("alpha", alpha, gt=0)
    check_bool("subtract_one", subtract_one)
    check_number("eps", eps, gt=0)
    if attn_mask is not None and key_padding_of(attn_mask) is None:
        # (it raised a message about taylor_shift_attention's mode, which HOLT has not)
        options = {"alpha": alpha, "subtract_one": subtract_one, "eps": eps}
        return naive_holt_attention(query, key, value, attn_mask, is_causal, **options)
    d = query.shape[-1]
    scale = 1.0 / (alpha * math.sqrt(d))
    q, k = _normed(query), _normed(key)
    if not subtract_one:
        return taylor_shift_attention(
            q, k, value, attn_mask, is_causal, normalize=False, scale=scale, mode="efficient"
        )
    return _linear_without_constant(q * scale, k, value, attn_mask, is_causal, eps)


def _pair_features(x: Tensor) -> Tensor:
    """[x ⊗ x / sqrt(2), x]: (…, N, d) -> (…, N, d² + d), so φ(q)·φ(k) = s²/2 + s."""
    quad = (x.unsqueeze(-1) * x.unsqueeze(-2)).flatten(-2) / math.sqrt(2.0)
    return torch.cat([quad, x], dim=-1)


def _linear_without_constant(q, k, v, attn_mask, is_causal, eps):
    nq, nk = q.shape[-2], k.shape[-2]
    key_mask = None
    if attn_mask is not None:  # (key padding: holt_attention took other masks elsewhere)
        key_mask = key_padding_of(attn_mask)[..., 0, :]  # (·, ·, Nk)
    v_ones = torch.cat([v, v.new_ones((*v.shape[:-1], 1))], dim=-1)
    if key_mask is not None:
        v_ones = v_ones * key_mask.unsqueeze(-1)
    fq, fk = _pair_features(q), _pair_features(k)
    if not is_causal:
        y = fq @ (fk.transpose(-2, -1) @ v_ones)
        n = v_ones[..., -1].sum(-1, keepdim=True).unsqueeze(-1).expand(*y.shape[:-1], 1)
    else:
        parts, counts = [], []
        state = q.new_zeros((*q.shape[:-2], fq.shape[-1], v_ones.shape[-1]))
        seen = q.new_zeros((*v_ones.shape[:-2], 1))
        for i0 in range(0, nq, CAUSAL_CHUNK):
            i1 = min(i0 + CAUSAL_CHUNK, nq)
            y = fq[..., i0:i1, :] @ state
            n = seen.unsqueeze(-1).expand(*y.shape[:-1], 1)
            if i0 < nk:
                j1 = min(i1, nk)
                s = q[..., i0:i1, :] @ k[..., i0:j1, :].transpose(-2, -1)
                tril = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
                block = v_ones[..., i0:j1, :]
                y = y + ((s + s * s / 2) * tril) @ block
                n = n + (tril.to(block.dtype) @ block[..., -1:])
                state = state + fk[..., i0:j1, :].transpose(-2, -1) @ block
                seen = seen + block[..., -1].sum(-1, keepdim=True)
            parts.append(y)
            counts.append(n)
        if not parts:
            return v.new_zeros((*q.shape[:-1], v.shape[-1]))
        y, n = torch.cat(parts, dim=-2), torch.cat(counts, dim=-2)
    return y[..., :-1] / _guard(y[..., -1:], eps) * (n > 0)
