"""taylorshift: linear-time Taylor-softmax attention for PyTorch."""

from .ops import (
    TaylorShiftState,
    naive_taylor_shift_attention,
    taylor_shift_attention,
    taylor_shift_decode,
)

__version__ = "0.1.0"

__all__ = [
    "TaylorShiftState",
    "__version__",
    "naive_taylor_shift_attention",
    "taylor_shift_attention",
    "taylor_shift_decode",
]
