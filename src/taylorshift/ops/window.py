"""Sliding-window softmax attention: each query attends to the keys within ``window``
positions of its own, in O(N · window) time and memory.

The local heads that ``TaylorShiftKernel(local_heads=...)`` runs beside its Taylor heads
(docs/local-heads.md): a Taylor kernel weighs every key of a row within a factor of
2 + 2τ + τ² of every other (SPEC §6.1), so it cannot single out the last few tokens; a
softmax over a short window can, at a cost linear in N.

Positions: query i sits at position ``i + Nk - Nq`` (aligned at the end, so that one new
token after a cache of N - 1 keys is position N - 1). Query position p attends key j when

- ``is_causal``: ``p - window < j <= p`` (its ``window`` most recent keys, itself included);
- otherwise: ``|p - j| < window``;

and ``attn_mask`` (bool, True = attend, broadcastable to (B, H, Nq, Nk)) allows it. Scores
are ``q · k / sqrt(d)``. A query with no allowed key returns zeros, as every op here.

``sliding_window_attention`` tiles the sequence into blocks of ``window`` queries, each
against the keys of its own block and its neighbours (2 blocks causal, 3 otherwise), for
self-attention (Nq = Nk) with no mask or a key-padding mask; any other mask goes to the
plain form, ``naive_sliding_window_attention``, which builds the (Nq, Nk) mask.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .._validate import check_bool, check_int
from .masks import as_4d, key_padding_of
from .taylor_shift.features import drop_masked_content

__all__ = [
    "masked_softmax_attention",
    "naive_sliding_window_attention",
    "sliding_window_attention",
    "window_attention_of_cache",
    "window_mask",
]


def _check(q: Tensor, k: Tensor, v: Tensor, window: int, is_causal: bool) -> None:
    check_int("window", window, ge=1)
    check_bool("is_causal", is_causal)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            "q, k and v must be (B, H, N, d); got shapes "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k.shape[:2] != q.shape[:2] or v.shape[:3] != k.shape[:3] or k.shape[-1] != q.shape[-1]:
        raise ValueError(
            "k must be (B, H, Nk, d) and v (B, H, Nk, dv) for q (B, H, Nq, d); got q "
            f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )


def window_mask(nq: int, nk: int, window: int, is_causal: bool, device=None) -> Tensor:
    """The (Nq, Nk) bool mask of the window alone (positions as the module docstring)."""
    pos = torch.arange(nq, device=device)[:, None] + (nk - nq)
    j = torch.arange(nk, device=device)[None, :]
    if is_causal:
        return (j <= pos) & (j > pos - window)
    return (j - pos).abs() < window


def _allowed(
    q: Tensor, k: Tensor, window: int, attn_mask: Tensor | None, is_causal: bool
) -> Tensor:
    """The (…, Nq, Nk) bool mask of the window and ``attn_mask`` together."""
    mask = window_mask(q.shape[-2], k.shape[-2], window, is_causal, q.device)
    return mask if attn_mask is None else mask & attn_mask


def masked_softmax_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """SDPA under a bool mask (True = attend); a row with no allowed key gives zeros."""
    has_keys = mask.any(-1, keepdim=True)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask | ~has_keys)
    return y * has_keys


def window_attention_of_cache(
    q: Tensor, keys: Tensor, values: Tensor, mask: Tensor, window: int
) -> Tensor:
    """Causal sliding-window softmax of the T = q.shape[-2] last slots of a decoding cache:
    ``keys``, ``values`` (B, H, N, ·) and real-token ``mask`` (B, N). The window counts
    real tokens, as the forward pass over the real tokens alone does: slot j is position
    cumsum(mask)[j] - 1."""
    t, n = q.shape[-2], keys.shape[-2]
    position = mask.cumsum(-1) - 1  # (B, N)
    key_pos, query_pos = position[:, None, :], position[:, -t:, None]
    slot = torch.arange(n, device=q.device)
    near = (key_pos <= query_pos) & (key_pos > query_pos - window)
    allowed = near & mask[:, None, :] & (slot[None, :] <= slot[-t:, None])  # (B, T, N)
    return masked_softmax_attention(q, keys, values, allowed[:, None])


def naive_sliding_window_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int,
    attn_mask: Tensor | None = None,
    is_causal: bool = True,
) -> Tensor:
    """The plain reference: the whole (Nq, Nk) score matrix under the window's mask."""
    _check(q, k, v, window, is_causal)
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    mask = _allowed(q, k, window, attn_mask, is_causal)
    s = s.masked_fill(~mask, float("-inf"))
    has_keys = mask.any(-1, keepdim=True)
    a = torch.softmax(s.masked_fill(~has_keys, 0.0), dim=-1)
    return (a @ v) * has_keys


def sliding_window_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int,
    attn_mask: Tensor | None = None,
    is_causal: bool = True,
) -> Tensor:
    """Sliding-window softmax attention of q (B, H, Nq, d), k (B, H, Nk, d), v (B, H, Nk,
    dv) -> (B, H, Nq, dv), in O(N · window) (see the module docstring)."""
    _check(q, k, v, window, is_causal)
    n = q.shape[-2]
    if attn_mask is not None:  # keys no query attends: zeros, whatever they held (NaN, inf)
        k, v = drop_masked_content(k, v, as_4d(attn_mask).any(-2))
    padding = None if attn_mask is None else key_padding_of(attn_mask)
    if k.shape[-2] != n or (attn_mask is not None and padding is None) or n <= window:
        # one block (N <= window), cross-attention or a mask varying over queries: the
        # (Nq, Nk) mask
        return masked_softmax_attention(q, k, v, _allowed(q, k, window, attn_mask, is_causal))
    blocks = -(-n // window)
    size = blocks * window
    before, after = (1, 0) if is_causal else (1, 1)  # neighbour blocks each block sees

    def tiles(t: Tensor) -> Tensor:
        # (B, H, N, e) -> (B, H, blocks, (before + 1 + after) window, e): each block's keys
        t = F.pad(t, (0, 0, before * window, size - n + after * window))
        width = (before + 1 + after) * window
        return t.unfold(2, width, window).transpose(-2, -1)

    qb = F.pad(q, (0, 0, 0, size - n)).unflatten(2, (blocks, window))
    kb, vb = tiles(k), tiles(v)
    # Which key of a block's tile each query may see: the window, and a real position.
    row = torch.arange(window, device=q.device)[:, None]
    col = torch.arange(kb.shape[-2], device=q.device)[None, :]
    offset = col - before * window - row  # key position - query position
    allowed = (offset <= 0) & (offset > -window) if is_causal else offset.abs() < window
    start = torch.arange(blocks, device=q.device)[:, None, None] * window
    key_pos = start + col - before * window  # (blocks, 1, width)
    real = (key_pos >= 0) & (key_pos < n)
    mask = (allowed & real)[None, None]  # (1, 1, blocks, window, width)
    if padding is not None:
        real_keys = padding.expand(-1, -1, 1, n)[..., 0, :]  # (B|1, H|1, N)
        keys = F.pad(real_keys, (before * window, size - n + after * window))
        keys = keys.unfold(-1, kb.shape[-2], window)  # (B|1, H|1, blocks, width)
        mask = mask & keys[..., None, :]
    y = masked_softmax_attention(qb, kb, vb, mask)
    return y.flatten(2, 3)[:, :, :n]
