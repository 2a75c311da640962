"""TaylorShift attention: the public op, its plain reference and its forms.

The package exports the checked entry points only. The forms themselves (``direct``,
``efficient``, ``efficient_causal``, and the fused ones in ``taylorshift.ops.triton``) skip
input checks and are imported from their modules.
"""

from .decode import TaylorShiftState, taylor_shift_decode
from .interface import taylor_shift_attention
from .naive import naive_taylor_shift_attention
from .workspace import clear_workspace

__all__ = [
    "TaylorShiftState",
    "clear_workspace",
    "naive_taylor_shift_attention",
    "taylor_shift_attention",
    "taylor_shift_decode",
]
