"""Masks shared by every attention op: is a bool mask just key padding?"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["key_padding_of"]


def key_padding_of(mask: Tensor) -> Tensor | None:
    """The (…, 1, Nk) key-padding rows of a bool mask broadcastable to (B, H, Nq, Nk) whose
    query rows are all equal (whatever its shape says), else None (it varies over queries).

    Where the data cannot be looked at, under torch.compile's tracing and for meta tensors,
    a mask with more than one query row counts as varying (give key padding as
    (B, H, 1, Nk)).
    """
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    if mask.shape[-2] == 1:
        return mask
    if torch.compiler.is_compiling() or mask.device.type == "meta":
        return None
    if not bool((mask == mask[..., :1, :]).all()):
        return None
    return mask[..., :1, :]
