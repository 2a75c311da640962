"""nn.Modules: attention layers (kernel × projection variant) and Transformer blocks."""

from .attention import PROJECTIONS, Attention, TaylorShiftAttention
from .block import Block, DropPath, Mlp
from .cache import CACHE_KINDS, KVCache, StateCache
from .kernels import AttentionKernel, create_kernel, list_kernels, register_kernel

__all__ = [
    "CACHE_KINDS",
    "PROJECTIONS",
    "Attention",
    "AttentionKernel",
    "Block",
    "DropPath",
    "KVCache",
    "Mlp",
    "StateCache",
    "TaylorShiftAttention",
    "create_kernel",
    "list_kernels",
    "register_kernel",
]
