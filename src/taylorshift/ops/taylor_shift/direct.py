"""Direct TaylorShift, O(N² d): the (Nq, Nk) weights, block by block, never all at once.

Any even order, any bool mask, causal. Sums run in float32 (float64 for float64 input).

One autograd function does the attention itself (scores -> weights -> normalised output)
on the scaled query and key; the normalisation of q and k and the temperature stay in
autograd around it (O(N d)). The forward walks blocks of (batches, query rows) small enough
to stay in cache and keeps only the output and its row sums; the backward recomputes each
block's weights instead of storing the (B, H, Nq, Nk) matrix, as flash attention does,
except for small calls (``KEEP_ENTRIES``), whose blocks the forward keeps
(docs/direct-form.md has the algebra). Causal blocks stop at their last attended key.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..masks import as_4d
from .efficient import finish_outputs, grad_outputs
from .features import (
    attended_counts,
    backward_follows,
    compute_dtype,
    scaled_input_grad,
    scaled_key,
    scaled_query,
    split_factor,
)
from .second_order import reference_grads, wants_graph

# Entries of one block's (b, H, rows, keys) score matrix: 2^18 float32 values are 1 MiB,
# so a block's scores, weights and their gradient stay in a core's L2 cache.
BLOCK_ENTRIES = 1 << 18

# Up to this many (B, H, Nq, Nk) entries a call under autograd keeps each block's weights
# and their derivative from the forward (two float32 matrices, at most 32 MiB) instead of
# recomputing them in the backward: at short N the recomputation's score product and
# elementwise passes are a fixed cost of several operations per block
# (benchmarks/direct_cpu/keep-weights).
KEEP_ENTRIES = 1 << 22


def allowed_keys(
    mask: Tensor | None, is_causal: bool, nq: int, nk: int, device: torch.device
) -> Tensor | None:
    """The bool (…, Nq, Nk) matrix of attended pairs, or None when every pair is attended."""
    allowed = mask
    if is_causal:
        causal = torch.ones(nq, nk, dtype=torch.bool, device=device).tril()
        allowed = causal if allowed is None else allowed & causal
    return allowed


def _taylor_(s: Tensor, order: int) -> Tensor:
    """w(s) = Σ_{n<=order} sⁿ/n! into a new tensor (s is kept), in as few passes over the
    (rows, keys) block as the order allows: 1 + s (order 1, the derivative of order 2) and
    (1 + s) + s·s/2 (order 2) directly, higher orders by Horner's rule."""
    if order == 1:
        return s + 1.0
    if order == 2:
        return (s + 1.0).addcmul_(s, s, value=0.5)
    w = s / order + 1.0
    for n in range(order - 1, 0, -1):
        w.mul_(s).div_(n).add_(1.0)
    return w


def _blocks(b: int, h: int, nq: int, nk: int) -> list[tuple[int, int, int, int]]:
    """(b0, b1, i0, i1) blocks covering (B, Nq), each at most BLOCK_ENTRIES scores (or one
    query row of one batch entry). No heads (h = 0) or keys: blocks of the same count as
    with one, holding nothing."""
    per_row = max(h, 1) * max(nk, 1)
    rows = max(1, min(nq, BLOCK_ENTRIES // per_row))
    batches = max(1, min(b, BLOCK_ENTRIES // (per_row * nq))) if rows == nq else 1
    return [
        (b0, min(b0 + batches, b), i0, min(i0 + rows, nq))
        for b0 in range(0, b, batches)
        for i0 in range(0, nq, rows)
    ]


def _block_mask(mask: Tensor | None, b0: int, b1: int, i0: int, i1: int) -> Tensor | None:
    if mask is None:
        return None
    rows = slice(i0, i1) if mask.shape[2] > 1 else slice(None)
    return mask[b0:b1, :, rows]


def _block_weights(
    q: Tensor, k: Tensor, mask: Tensor | None, causal_from: int | None, order: int
) -> tuple[Tensor, Tensor]:
    """Scores and masked weights of one block: q (b, H, r, d), k (b, H, n, d) -> (b, H, r, n)."""
    s = q @ k.transpose(-2, -1)
    w = _taylor_(s, order)
    _mask_scores_(w, mask, causal_from)
    return s, w


def _mask_scores_(x: Tensor, mask: Tensor | None, causal_from: int | None) -> None:
    """Zero the pairs of a (b, H, rows, keys) block that are not attended, in place."""
    if causal_from is not None:
        x.tril_(causal_from)
    if mask is not None:
        x.mul_(mask)


def _block_inputs(q, k, v, mask, is_causal, b0, b1, i0, i1):
    """The slices of one block: keys stop at the block's last row when causal."""
    end = min(i1, k.shape[2]) if is_causal else k.shape[2]
    m = _block_mask(mask, b0, b1, i0, i1)
    return (
        q[b0:b1, :, i0:i1],
        k[b0:b1, :, :end],
        v[b0:b1, :, :end],
        None if m is None else m[..., :end],
        end,
    )


def weighted_sums(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    is_causal: bool,
    order: int = 2,
    kept: list | None = None,
) -> Tensor:
    """Σ_j w(q_i · k_j) v_j over the attended pairs, block by block: (B, H, Nq, c).

    q (B, H, Nq, d) and k (B, H, Nk, d) already scaled; v (B, H, Nk, c); ``mask`` None or
    bool (B, H, Nq or 1, Nk). No autograd: see ``weighted_sums_grad``. With a list as
    ``kept``, each block's masked weights and their masked derivative w'(s) are appended
    to it, for ``weighted_sums_grad(..., kept=)``.
    """
    b, h, nq, _ = q.shape
    out = q.new_empty((b, h, nq, v.shape[-1]))
    for b0, b1, i0, i1 in _blocks(b, h, nq, k.shape[2]):
        qb, kb, vb, mb, _ = _block_inputs(q, k, v, mask, is_causal, b0, b1, i0, i1)
        causal_from = i0 if is_causal else None
        s, w = _block_weights(qb, kb, mb, causal_from, order)
        out[b0:b1, :, i0:i1] = w @ vb
        if kept is not None:
            kept.append((w, _block_derivative(s, mb, causal_from, order)))
    return out


def _block_derivative(
    s: Tensor, mask: Tensor | None, causal_from: int | None, order: int
) -> Tensor:
    """w'(s) = w_{order-1}(s) on the attended pairs, 0 elsewhere (orders are even, >= 2)."""
    wd = _taylor_(s, order - 1)
    _mask_scores_(wd, mask, causal_from)
    return wd


def weighted_sums_grad(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    grad: Tensor,
    mask: Tensor | None,
    is_causal: bool,
    order: int = 2,
    need: tuple[bool, bool, bool] = (True, True, True),
    kept: list | None = None,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """Gradients (q, k, v) of Σ_i grad_i · ``weighted_sums(q, k, v, ...)``_i: ∂v_j =
    Σ_i w_ij g_i, ∂s_ij = (g_i · v_j) w'(s_ij) on attended pairs, ∂q_i = Σ_j ∂s_ij k_j,
    ∂k_j = Σ_i ∂s_ij q_i (docs/direct-form.md). Each block's weights are recomputed, or
    taken from ``kept`` as ``weighted_sums(..., kept=)`` filled it for the same inputs."""
    need_q, need_k, need_v = need
    b, h, nq, _ = q.shape
    dq = torch.zeros_like(q) if need_q else None
    dk = torch.zeros_like(k) if need_k else None
    dv = torch.zeros_like(v) if need_v else None
    for index, (b0, b1, i0, i1) in enumerate(_blocks(b, h, nq, k.shape[2])):
        qb, kb, vb, mb, end = _block_inputs(q, k, v, mask, is_causal, b0, b1, i0, i1)
        gb = grad[b0:b1, :, i0:i1]
        causal_from = i0 if is_causal else None
        if kept is not None:
            w, wd = kept[index]
        else:
            s, w = _block_weights(qb, kb, mb, causal_from, order)
            wd = _block_derivative(s, mb, causal_from, order) if need_q or need_k else None
        if need_v:
            dv[b0:b1, :, :end] += w.transpose(-2, -1) @ gb
        if need_q or need_k:
            ds = gb @ vb.transpose(-2, -1)
            ds.mul_(wd)
            if need_q:
                dq[b0:b1, :, i0:i1] = ds @ kb
            if need_k:
                dk[b0:b1, :, :end] += ds.transpose(-2, -1) @ qb
    return dq, dk, dv


class _DirectAttention(torch.autograd.Function):
    """y = (w(q' k'ᵀ) ⊙ allowed) v / rowsum · sqrt(n/d), with q' = τ q/‖q‖ and k' = k/‖k‖
    (or q' = scale · q, k' = k) formed inside: its backward differentiates the scaling by
    hand (``scaled_input_grad``, as the efficient form does), so a call is one autograd node
    instead of a dozen (a tenth of a short sequence's forward + backward)."""

    @staticmethod
    def forward(
        ctx, query, key, value, temperature, factor, normalize, mask, is_causal, order, count,
        keep,
    ):  # fmt: skip
        cd = compute_dtype(query.dtype)
        tau = factor if temperature is None else temperature.to(cd)
        q = scaled_query(query.to(cd), tau, normalize)
        k = scaled_key(key.to(cd), normalize)
        v = value.to(cd)
        # [v, 1]: the numerator and the row sums (denominators) in one pass
        # (v.new_ones, not ones_like(v[..., :1]): dv may be 0)
        ones = v.new_ones((*v.shape[:-1], 1))
        ctx.kept = [] if keep else None
        vp = torch.cat([v, ones], dim=-1)
        y_prime = weighted_sums(q, k, vp, mask, is_causal, order, ctx.kept)
        out, den = finish_outputs(y_prime, count, normalize, q.shape[-1])
        ctx.save_for_backward(query, key, value, temperature, q, k, mask, count, out, den)
        ctx.factor, ctx.is_causal, ctx.order, ctx.normalize = factor, is_causal, order, normalize
        return out.to(query.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, temperature, q, k, mask, count, out, den = ctx.saved_tensors
        if wants_graph():  # create_graph=True: gradients that differentiate again
            grads = reference_grads(
                grad_out, (query, key, value, temperature), ctx.needs_input_grad[:4], mask,
                ctx.is_causal, ctx.factor, ctx.normalize, ctx.order,
            )  # fmt: skip
            ctx.kept = None
            return (*grads, None, None, None, None, None, None, None)
        normalize = ctx.normalize
        cd = q.dtype
        g = grad_outputs(grad_out.to(cd), out, den, count, normalize, q.shape[-1])
        v = value.to(cd)
        vp = torch.cat([v, v.new_ones((*v.shape[:-1], 1))], dim=-1)
        need_q, need_k, need_v, need_t = ctx.needs_input_grad[:4]
        need = (need_q or need_t, need_k, need_v)
        dq, dk, dvp = weighted_sums_grad(
            q, k, vp, g, mask, ctx.is_causal, ctx.order, need, kept=ctx.kept
        )
        ctx.kept = None
        gq = gt = gk = None
        if need_q or need_t:
            tau = ctx.factor if temperature is None else temperature.to(cd)
            gq, gt = scaled_input_grad(query.to(cd), dq, tau, normalize)
        if need_k:
            gk, _ = scaled_input_grad(key.to(cd), dk, 1.0, normalize)
        return (
            gq.to(query.dtype) if need_q else None,
            gk.to(key.dtype) if need_k else None,
            dvp[..., :-1].to(value.dtype) if need_v else None,
            gt.sum_to_size(temperature.shape).to(temperature.dtype) if need_t else None,
            None, None, None, None, None, None, None,
        )  # fmt: skip


def direct_taylor_shift(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None,
    is_causal: bool,
    temperature: Tensor | float,
    scale: float | None,
    normalize: bool,
    order: int = 2,
) -> Tensor:
    """Direct form on validated inputs; ``mask`` broadcasts to (B, H, Nq, Nk). -> (B, H, Nq, dv).

    The fused ``triton_direct_taylor_shift`` has this signature (key padding, order 2 only).
    """
    b, h, nq, d = query.shape
    nk = key.shape[-2]
    cd = compute_dtype(query.dtype)
    if mask is not None:
        mask = as_4d(mask)
        mask = mask.expand(b, h, mask.shape[2], nk)
    count = attended_counts(mask, is_causal, b, h, nq, nk, query.device).to(cd)[..., 0]
    t, f = split_factor(temperature, scale, normalize, d)
    # keep the blocks' weights for the backward when one follows and they are small
    keep = b * h * nq * nk <= KEEP_ENTRIES and backward_follows(query, key, value, t)
    return _DirectAttention.apply(
        query, key, value, t, f, normalize, mask, is_causal, order, count, keep
    )
