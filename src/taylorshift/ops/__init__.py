"""Functional attention operations (no nn.Module), layout (B, H, N, d)."""

from .taylor_shift import (
    TaylorShiftState,
    naive_taylor_shift_attention,
    taylor_shift_attention,
    taylor_shift_decode,
)

__all__ = [
    "TaylorShiftState",
    "naive_taylor_shift_attention",
    "taylor_shift_attention",
    "taylor_shift_decode",
]
