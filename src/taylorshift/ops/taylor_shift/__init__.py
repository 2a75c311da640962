"""TaylorShift attention: the public op, its plain reference and its forms."""

from .decode import TaylorShiftState, taylor_shift_decode
from .direct import direct_taylor_shift
from .efficient import efficient_taylor_shift
from .efficient_causal import causal_efficient_taylor_shift
from .interface import taylor_shift_attention
from .naive import naive_taylor_shift_attention

__all__ = [
    "TaylorShiftState",
    "causal_efficient_taylor_shift",
    "direct_taylor_shift",
    "efficient_taylor_shift",
    "naive_taylor_shift_attention",
    "taylor_shift_attention",
    "taylor_shift_decode",
]
