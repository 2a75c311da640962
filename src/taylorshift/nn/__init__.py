"""nn.Modules: attention layers (kernel × projection variant) and Transformer blocks."""

from .attention import PROJECTIONS, Attention, TaylorShiftAttention
from .block import Block, DropPath, Mlp
from .kernels import AttentionKernel, create_kernel, list_kernels, register_kernel

__all__ = [
    "PROJECTIONS",
    "Attention",
    "AttentionKernel",
    "Block",
    "DropPath",
    "Mlp",
    "TaylorShiftAttention",
    "create_kernel",
    "list_kernels",
    "register_kernel",
]
