"""Masks shared by every attention op: is a bool mask just key padding? Which order puts
a row's real tokens first?"""

from __future__ import annotations

import torch
from torch import Tensor

from .._validate import values_readable

__all__ = ["as_4d", "key_padding_of", "padding_inside", "permute_tokens", "real_tokens_first"]


def as_4d(mask: Tensor) -> Tensor:
    """A mask broadcastable to (B, H, Nq, Nk) as a 4-D view: its missing leading axes as 1."""
    return mask[(None,) * (4 - mask.dim())]


def key_padding_of(mask: Tensor) -> Tensor | None:
    """The (…, 1, Nk) key-padding rows of a bool mask broadcastable to (B, H, Nq, Nk) whose
    query rows are all equal (whatever its shape says), else None (it varies over queries).

    Where the data cannot be looked at, under torch.compile's tracing and for meta tensors,
    a mask with more than one query row counts as varying (give key padding as
    (B, H, 1, Nk)).
    """
    mask = as_4d(mask)
    if mask.shape[-2] == 1:
        return mask
    if torch.compiler.is_compiling() or mask.device.type == "meta":
        return None
    if not bool((mask == mask[..., :1, :]).all()):
        return None
    return mask[..., :1, :]


def real_tokens_first(padding: Tensor) -> tuple[Tensor, Tensor]:
    """The permutation of the token axis (the last) of a key-padding mask ``padding``
    (…, N) bool, True = real token, that moves each row's real tokens to the front in their
    order, the padding after them; and its inverse. Both (…, N) long (``permute_tokens``).

    Layers whose result depends on where the real tokens sit (a short convolution, a
    sliding window) run on the permuted tokens, so that padding before or between real
    tokens counts as if it were not there; for right padding the order is the identity.
    """
    order = torch.argsort((~padding).to(torch.uint8), dim=-1, stable=True)
    return order, torch.argsort(order, dim=-1)


def permute_tokens(x: Tensor, order: Tensor) -> Tensor:
    """``x`` (…, N, k) with its token axis (-2) in the order ``order`` gives, (…, N) long
    broadcasting to x's leading axes (e.g. (B, N) for (B, N, k), (B, 1, N) for (B, H, N, k))."""
    index = order.unsqueeze(-1).expand(*x.shape[:-1], x.shape[-1])
    return x.gather(-2, index)


def padding_inside(padding: Tensor) -> bool:
    """Whether a key-padding mask (…, N) bool, True = real token, has a padded token before
    a real one in some row: only then does ``real_tokens_first`` change the order. It reads
    the mask on the CPU only: elsewhere (an accelerator, where reading it would stall the
    stream once per layer; meta tensors) and where values cannot be read (torch.compile's
    tracing, torch.func) it says True, and the caller permutes, which is the identity for
    right padding."""
    if padding.device.type != "cpu" or not values_readable():
        return True
    return bool((padding[..., 1:] & ~padding[..., :-1]).any())
