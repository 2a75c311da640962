"""Functional attention operations (no nn.Module), layout (B, H, N, d)."""

from .taylor_shift import naive_taylor_shift_attention, taylor_shift_attention

__all__ = ["naive_taylor_shift_attention", "taylor_shift_attention"]
