"""Decoding linear attention with its constant-size state Σ φ(k)ᵀ [v, 1] (B, H, d, dv + 1)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .linear import causal_sweep, feature_map


@dataclass
class LinearAttentionState:
    """The causal prefix of one linear-attention layer.

    Attributes:
        sums: (B, H, d, dv + 1), Σ_j φ(k_j)ᵀ [v_j, 1] over the real keys so far.
    """

    sums: Tensor

    @property
    def nbytes(self) -> int:
        return self.sums.nbytes

    def select(self, index: Tensor) -> LinearAttentionState:
        return LinearAttentionState(self.sums[index])


@torch.no_grad()
def linear_attention_decode(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    state: LinearAttentionState | None = None,
    key_padding_mask: Tensor | None = None,
    eps: float = 1e-6,
) -> tuple[Tensor, LinearAttentionState]:
    """Causal linear attention for T new tokens (B, H, T, ·) after the tokens in ``state``.

    Equals the rows of ``linear_attention(..., is_causal=True)`` over the whole sequence;
    ``key_padding_mask`` (B, T), True = real token, keeps padded tokens out of the state.
    Returns (out (B, H, T, dv), the state after the block). Inference only.
    """
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor (B, H, T, ·); got {t!r:.80}")
    b, h, n, d = query.shape
    if tuple(key.shape) != (b, h, n, d) or tuple(value.shape[:3]) != (b, h, n):
        raise ValueError(
            f"key must be (B, H, T, d) = {(b, h, n, d)} and value (B, H, T, dv) like query; "
            f"got key {tuple(key.shape)} and value {tuple(value.shape)}"
        )
    dv = value.shape[-1]
    q, k = feature_map(query), feature_map(key)
    if key_padding_mask is not None:
        if key_padding_mask.dtype != torch.bool or tuple(key_padding_mask.shape) != (b, n):
            raise ValueError(
                f"key_padding_mask must be a bool tensor (B, T) = ({b}, {n}); got "
                f"{key_padding_mask.dtype} {tuple(key_padding_mask.shape)}"
            )
        k = k * key_padding_mask[:, None, :, None].to(k.dtype)
    v_ones = torch.cat([value, value.new_ones((b, h, n, 1))], dim=-1)
    if state is None:
        sums = q.new_zeros((b, h, d, dv + 1))
    elif not isinstance(state, LinearAttentionState) or state.sums.shape != (b, h, d, dv + 1):
        got = tuple(state.sums.shape) if isinstance(state, LinearAttentionState) else state
        raise ValueError(f"state must be a LinearAttentionState of {(b, h, d, dv + 1)}; got {got}")
    else:
        sums = state.sums
    y, sums = causal_sweep(q, k, v_ones, sums)
    return y[..., :-1] / (y[..., -1:] + eps), LinearAttentionState(sums)
