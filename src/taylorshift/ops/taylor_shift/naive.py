"""The plain reference: obvious code, no tricks, every step in the dtype it is given.

Tests compare every other form against this one (in float64), and use it run in low
precision as the yardstick for the low-precision error of the fast forms (SPEC §8).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def naive_taylor_shift_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    *,
    temperature: Tensor | float = 1.0,
    scale: float | None = None,
    normalize: bool = True,
    order: int = 2,
    eps: float = 1e-12,
) -> Tensor:
    """Taylor-softmax attention exactly as SPEC §2 writes it; (B, H, Nq, dv).

    No input checks and no upcasting: float16 in, float16 arithmetic throughout.
    """
    d = query.shape[-1]
    nq, nk = query.shape[-2], key.shape[-2]
    if normalize:
        q = query / query.norm(dim=-1, keepdim=True).clamp_min(eps)
        k = key / key.norm(dim=-1, keepdim=True).clamp_min(eps)
        s = temperature * (q @ k.transpose(-2, -1))
    else:
        if scale is None:
            scale = 1.0 / math.sqrt(d)
        s = scale * (query @ key.transpose(-2, -1))

    w = sum(s**n / math.factorial(n) for n in range(order + 1))  # (B, H, Nq, Nk)

    allowed = torch.ones(nq, nk, dtype=torch.bool, device=query.device)
    if is_causal:
        allowed = torch.ones(nq, nk, dtype=torch.bool, device=query.device).tril()
    if attn_mask is not None:
        allowed = allowed & attn_mask
    allowed = allowed.expand(w.shape)
    w = w * allowed

    n = allowed.sum(dim=-1, keepdim=True)  # attended keys per query
    denominator = w.sum(dim=-1, keepdim=True)
    y = (w @ value) / torch.where(n > 0, denominator, torch.ones_like(denominator))
    if normalize:
        y = y * torch.sqrt(n.to(y.dtype) / d)
    return y
