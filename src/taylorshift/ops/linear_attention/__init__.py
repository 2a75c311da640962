"""Kernelized linear attention (Katharopoulos et al.): φ(x) = elu(x) + 1, layout (B, H, N, d)."""

from .linear import linear_attention, naive_linear_attention

__all__ = ["linear_attention", "naive_linear_attention"]
