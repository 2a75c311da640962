"""Linear attention with the elu + 1 feature map, a baseline to compare TaylorShift against.

    y_i = φ(q_i) Σ_j φ(k_j)ᵀ v_j / φ(q_i) Σ_j φ(k_j)ᵀ,   φ(x) = elu(x) + 1 > 0

Non-causal in one pass over the keys; causal in chunks (prefix state plus a masked block),
so memory stays linear. Key padding removes keys from both sums; a mask that varies over
queries falls back to the quadratic form. Autograd does the backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..._validate import check_number
from ..masks import key_padding_of
from ..taylor_shift.checks import check_attention_inputs
from ..taylor_shift.features import drop_masked_content

CAUSAL_CHUNK = 128


def feature_map(x: Tensor) -> Tensor:
    """φ(x) = elu(x) + 1. Traced by torch.compile it is written as x + 1 (x > 0) or exp(x)
    (x <= 0; clamped, so that the branch not taken never overflows into the gradient),
    equal to one ulp: with ``F.elu`` AOTAutograd's backward graph expects ``elu_backward``
    to keep the strides of its non-contiguous input, the CPU kernel returns a contiguous
    tensor, and a compiled module's backward failed on a view ("view size is not
    compatible"). Eagerly ``F.elu``: two operations, not four, for the baseline's timings."""
    if torch.compiler.is_compiling():
        return torch.where(x > 0, x + 1.0, torch.exp(x.clamp(max=0.0)))
    return F.elu(x) + 1.0


def naive_linear_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    eps: float = 1e-6,
) -> Tensor:
    """The quadratic reference: weights φ(q)·φ(k), masked, row-normalised. (B, H, Nq, dv)."""
    w = feature_map(query) @ feature_map(key).transpose(-2, -1)
    nq, nk = w.shape[-2:]
    if is_causal:
        w = w * torch.ones(nq, nk, dtype=torch.bool, device=w.device).tril()
    if attn_mask is not None:
        w = w * attn_mask
    return (w @ value) / (w.sum(-1, keepdim=True) + eps)


def causal_sweep(q: Tensor, k: Tensor, v_ones: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
    """Causal linear attention in chunks after the prefix ``state`` = Σ φ(k)ᵀ [v, 1].

    q, k: features (…, Nq, d), (…, Nk, d) (masked keys zeroed); v_ones (…, Nk, dv + 1);
    state (…, d, dv + 1). Returns Y' = [numerator, denominator] (…, Nq, dv + 1) and the
    state after all keys.
    """
    nq, nk = q.shape[-2], k.shape[-2]
    parts = []
    for i0 in range(0, max(nq, nk), CAUSAL_CHUNK):
        i1 = min(i0 + CAUSAL_CHUNK, max(nq, nk))
        kc, vc = k[..., i0:i1, :], v_ones[..., i0:i1, :]
        if i0 < nq:
            qc = q[..., i0:i1, :]
            w = qc @ kc[..., : qc.shape[-2], :].transpose(-2, -1)
            tril = torch.ones(w.shape[-2:], dtype=torch.bool, device=w.device).tril()
            parts.append(qc @ state + (w * tril) @ vc[..., : qc.shape[-2], :])
        state = state + kc.transpose(-2, -1) @ vc
    if not parts:
        return q.new_zeros((*q.shape[:-1], v_ones.shape[-1])), state
    return torch.cat(parts, dim=-2), state


def linear_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    eps: float = 1e-6,
) -> Tensor:
    """Linear-time form; same result as ``naive_linear_attention``. (B, H, Nq, dv).

    Inputs are checked as ``taylor_shift_attention``'s (a bool mask broadcasting to
    (B, H, Nq, Nk)), with ``ValueError``/``TypeError`` naming the argument."""
    check_attention_inputs(query, key, value, attn_mask, is_causal)
    check_number("eps", eps, gt=0)
    key_mask = None
    if attn_mask is not None:
        padding = key_padding_of(attn_mask)
        if padding is None:  # varies over queries: only the quadratic form can
            return naive_linear_attention(query, key, value, attn_mask, is_causal, eps)
        key_mask = padding[..., 0, :]  # (·, ·, Nk)
    q, k = feature_map(query), feature_map(key)
    v_ones = torch.cat([value, value.new_ones((*value.shape[:-1], 1))], dim=-1)
    # (replaced, not multiplied: an inf or NaN in padding reaches no row)
    k, v_ones = drop_masked_content(k, v_ones, key_mask)
    if not is_causal:
        y = q @ (k.transpose(-2, -1) @ v_ones)
    else:
        state = q.new_zeros((*q.shape[:-2], q.shape[-1], v_ones.shape[-1]))
        y, _ = causal_sweep(q, k, v_ones, state)
    return y[..., :-1] / (y[..., -1:] + eps)
