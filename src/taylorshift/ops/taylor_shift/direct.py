"""Direct TaylorShift, O(N² d): materialise the (Nq, Nk) weights, as the paper's direct form.

Any even order, any bool mask, causal. Sums run in float32 (float64 for float64 input).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .features import (
    compute_dtype,
    output_factor,
    scaled_key,
    scaled_query,
    score_factor,
    taylor_weight,
)


def allowed_keys(
    mask: Tensor | None, is_causal: bool, nq: int, nk: int, device: torch.device
) -> Tensor | None:
    """The bool (…, Nq, Nk) matrix of attended pairs, or None when every pair is attended."""
    allowed = mask
    if is_causal:
        causal = torch.ones(nq, nk, dtype=torch.bool, device=device).tril()
        allowed = causal if allowed is None else allowed & causal
    return allowed


def direct_taylor_shift(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None,
    is_causal: bool,
    temperature: Tensor | float,
    scale: float | None,
    normalize: bool,
    order: int,
) -> Tensor:
    """Direct form on validated inputs; ``mask`` broadcasts to (B, H, Nq, Nk). -> (B, H, Nq, dv)."""
    d = query.shape[-1]
    nq, nk = query.shape[-2], key.shape[-2]
    cd = compute_dtype(query.dtype)
    factor = score_factor(temperature, scale, normalize, d)
    if isinstance(factor, Tensor):
        factor = factor.to(cd)
    q = scaled_query(query.to(cd), factor, normalize)
    k = scaled_key(key.to(cd), normalize)

    w = taylor_weight(q @ k.transpose(-2, -1), order)  # (B, H, Nq, Nk)
    allowed = allowed_keys(mask, is_causal, nq, nk, query.device)
    if allowed is None:
        count = torch.full((nq, 1), float(nk), dtype=cd, device=query.device)
    else:
        w = w.masked_fill(~allowed, 0.0)
        count = allowed.sum(dim=-1, keepdim=True).to(cd)

    denominator = w.sum(dim=-1, keepdim=True)
    # A query with no attended key has w = 0 on its row: divide by 1 to keep it (and its
    # gradient) at exactly zero instead of 0/0.
    y = (w @ value.to(cd)) / torch.where(count > 0, denominator, 1.0)
    f = output_factor(count, normalize, d)
    if f is not None:
        y = y * f
    return y.to(query.dtype)
