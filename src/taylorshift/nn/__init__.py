"""nn.Modules: attention layers (kernel × projection variant) and Transformer blocks."""

from .attention import (
    PROJECTION_RENAMES,
    PROJECTIONS,
    Attention,
    TaylorShiftAttention,
    canonical_projection,
)
from .block import Block, DropPath, Mlp
from .cache import CACHE_KINDS, KVCache, StateCache
from .kernels import AttentionKernel, create_kernel, list_kernels, register_kernel

__all__ = [
    "CACHE_KINDS",
    "PROJECTIONS",
    "PROJECTION_RENAMES",
    "Attention",
    "AttentionKernel",
    "Block",
    "DropPath",
    "KVCache",
    "Mlp",
    "StateCache",
    "TaylorShiftAttention",
    "canonical_projection",
    "create_kernel",
    "list_kernels",
    "register_kernel",
]
