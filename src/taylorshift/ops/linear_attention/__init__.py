"""Kernelized linear attention (Katharopoulos et al.): φ(x) = elu(x) + 1, layout (B, H, N, d)."""

from .decode import LinearAttentionState, linear_attention_decode
from .linear import linear_attention, naive_linear_attention

__all__ = [
    "LinearAttentionState",
    "linear_attention",
    "linear_attention_decode",
    "naive_linear_attention",
]
