"""Higher-order linear transformer attention (Mercat), layout (B, H, N, d)."""

from .holt import holt_attention, naive_holt_attention

__all__ = ["holt_attention", "naive_holt_attention"]
