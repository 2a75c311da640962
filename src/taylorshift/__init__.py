"""taylorshift: linear-time Taylor-softmax attention for PyTorch."""

from .ops import naive_taylor_shift_attention, taylor_shift_attention

__version__ = "0.1.0"

__all__ = ["__version__", "naive_taylor_shift_attention", "taylor_shift_attention"]
