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

CAUSAL_CHUNK = 128


def feature_map(x: Tensor) -> Tensor:
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


def linear_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    eps: float = 1e-6,
) -> Tensor:
    """Linear-time form; same result as ``naive_linear_attention``. (B, H, Nq, dv)."""
    nq, nk = query.shape[-2], key.shape[-2]
    key_mask = None
    if attn_mask is not None:
        mask = attn_mask
        while mask.dim() < 4:
            mask = mask.unsqueeze(0)
        if mask.shape[-2] != 1 and not bool((mask == mask[..., :1, :]).all()):
            return naive_linear_attention(query, key, value, attn_mask, is_causal, eps)
        key_mask = mask[..., :1, :].transpose(-2, -1)  # (·, ·, Nk, 1)
    q, k = feature_map(query), feature_map(key)
    if key_mask is not None:
        k = k * key_mask
    v_ones = torch.cat([value, value.new_ones((*value.shape[:-1], 1))], dim=-1)
    if not is_causal:
        y = q @ (k.transpose(-2, -1) @ v_ones)
    else:
        parts = []
        state = q.new_zeros((*q.shape[:-2], q.shape[-1], v_ones.shape[-1]))
        for i0 in range(0, nq, CAUSAL_CHUNK):
            i1 = min(i0 + CAUSAL_CHUNK, nq)
            y = q[..., i0:i1, :] @ state
            if i0 < nk:
                j1 = min(i1, nk)
                kc, vc = k[..., i0:j1, :], v_ones[..., i0:j1, :]
                w = q[..., i0:i1, :] @ kc.transpose(-2, -1)
                tril = torch.ones(w.shape[-2:], dtype=torch.bool, device=w.device).tril()
                y = y + (w * tril) @ vc
                state = state + kc.transpose(-2, -1) @ vc
            parts.append(y)
        y = torch.cat(parts, dim=-2) if parts else q.new_zeros((*q.shape[:-1], v_ones.shape[-1]))
    return y[..., :-1] / (y[..., -1:] + eps)
