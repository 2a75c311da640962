"""Efficient TaylorShift, causal (SPEC §2.3): chunks of C tokens, O(N C d + N d² dv).

For the query chunk [i0, i1):
    Y'  = φ(q') (c ⊙ S_<i0)                  keys before the chunk, through the prefix state
        + w(q' k'ᵀ ⊙ tril) [v, 1]             keys inside the chunk, directly, causally masked
    S  += φ(k'_chunk)ᵀ [v, 1]_chunk           then the chunk joins the prefix
with n_i = number of attended keys j <= i in the output factor.

Query i attends key j iff j <= i (upper-left aligned, as SDPA), also when Nq != Nk.

Backward runs two sweeps so that no prefix state is ever stored or obtained by subtraction:
a forward sweep rebuilds S_<i0 and gives the query-side and intra-chunk gradients; a reverse
sweep accumulates G_>c = Σ_{c' > c} φ(q'_c')ᵀ ∂Y'_c' and gives the key-side gradients.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .efficient import (
    finish_outputs,
    grad_outputs,
    query_factor,
    scaled_query_leaf,
    state_input_grad,
)
from .features import (
    compute_dtype,
    feature_dim,
    features,
    scaled_key,
    scaled_query,
    score_factor,
    state_weights,
    taylor_weight,
    values_with_ones,
)

DEFAULT_CAUSAL_CHUNK = 256


def causal_count(key_mask: Tensor | None, nq: int, nk: int, dtype: torch.dtype, device) -> Tensor:
    """n_i = attended keys j <= i: (B, H, Nq) with a key mask, else (Nq,)."""
    rows = torch.arange(nq, device=device)
    if key_mask is None:
        return (rows + 1).clamp(max=nk).to(dtype)
    if nk == 0:
        return torch.zeros((*key_mask.shape[:2], nq), dtype=dtype, device=device)
    seen = key_mask.to(torch.int64).cumsum(-1)  # (B, H, Nk)
    return seen[..., rows.clamp(max=nk - 1)].to(dtype)


def _intra_chunk(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The causal block of one chunk, directly: (B, H, C, dv + 1).

    q (B, H, C, d); k, v (B, H, Ck, d / dv + 1), Ck <= C keys at the same positions.
    """
    w = taylor_weight(q @ k.transpose(-2, -1), 2)  # (B, H, C, Ck)
    causal = torch.ones(w.shape[-2:], dtype=torch.bool, device=w.device).tril()
    return w.masked_fill(~causal, 0.0) @ v


def causal_forward(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    tau: Tensor | float,
    normalize: bool,
    key_mask: Tensor | None,
    chunk: int,
    initial_state: Tensor | None = None,
    initial_count: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The chunked causal sweep, without autograd: (out, den, count, final state).

    ``initial_state`` (B, H, D, dv + 1), unweighted sums Σ φ(k'_j)ᵀ [v_j, 1] over keys that
    precede the whole block (every query attends them), and ``initial_count`` (B, H), how
    many keys it holds, continue an earlier sweep: decoding, or a later shard of a sequence.
    ``tau`` is the query factor (``query_factor``). Returns out (B, H, Nq, dv) in the
    query's dtype, den (B, H, Nq) and the counts n_i in the compute dtype, and the state
    after the last key, (B, H, D, dv + 1).
    """
    b, h, nq, d = query.shape
    nk, dv = key.shape[2], value.shape[3]
    cd = compute_dtype(query.dtype)
    weights = state_weights(d, cd, query.device)
    count = causal_count(key_mask, nq, nk, cd, query.device)
    if initial_count is not None:
        count = initial_count.to(cd).unsqueeze(-1) + count  # (B, H, Nq)
    if initial_state is None:
        state = query.new_zeros((b, h, feature_dim(d), dv + 1), dtype=cd)
    else:
        state = initial_state.detach().to(cd)  # never written in place: sums make new ones
    out = torch.empty((b, h, nq, dv), dtype=query.dtype, device=query.device)
    den = torch.empty((b, h, nq), dtype=cd, device=query.device)
    for i0 in range(0, max(nq, nk), chunk):
        i1 = min(i0 + chunk, max(nq, nk))
        k = v = None
        if i0 < nk:
            j1 = min(i1, nk)
            k = scaled_key(key[:, :, i0:j1].to(cd), normalize)
            mask = None if key_mask is None else key_mask[:, :, i0:j1]
            v = values_with_ones(value[:, :, i0:j1].to(cd), mask)
        if i0 < nq:
            q1 = min(i1, nq)
            q = scaled_query(query[:, :, i0:q1].to(cd), tau, normalize)
            # φ(q) (c ⊙ S): weight the features or the state, whichever is smaller
            if q1 - i0 < dv + 1:
                y_prime = (features(q) * weights.squeeze(-1)) @ state
            else:
                y_prime = features(q) @ (state * weights)
            if k is not None:
                y_prime = y_prime + _intra_chunk(q, k[:, :, : q1 - i0], v[:, :, : q1 - i0])
            y, den[:, :, i0:q1] = finish_outputs(y_prime, count[..., i0:q1], normalize, d)
            out[:, :, i0:q1] = y.to(out.dtype)
        if k is not None:
            state = state + features(k).transpose(-2, -1) @ v
    return out, den, count, state


class CausalEfficientTaylorShiftFunction(torch.autograd.Function):
    """Causal efficient TaylorShift with a chunked, recomputing backward.

    Differentiable also w.r.t. ``initial_state`` (the prefix of earlier keys), so that a
    sequence split over processes can pass state gradients back (``taylorshift.distributed``).
    """

    @staticmethod
    def forward(
        ctx,
        query,
        key,
        value,
        temperature,
        factor,
        normalize,
        key_mask,
        chunk,
        initial_state=None,
        initial_count=None,
    ):
        b, h = query.shape[:2]
        cd = compute_dtype(query.dtype)
        tau = query_factor(temperature, factor, cd, b, h)
        out, den, count, _ = causal_forward(
            query, key, value, tau, normalize, key_mask, chunk, initial_state, initial_count
        )
        ctx.save_for_backward(
            query, key, value, temperature, key_mask, out, den, count, initial_state
        )
        ctx.factor, ctx.normalize, ctx.chunk = factor, normalize, chunk
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        query, key, value, temperature, key_mask, out, den, count, initial = ctx.saved_tensors
        need_q, need_k, need_v, need_t = ctx.needs_input_grad[:4]
        need_s = ctx.needs_input_grad[8]
        normalize, chunk = ctx.normalize, ctx.chunk
        b, h, nq, d = query.shape
        nk, dv = key.shape[2], value.shape[3]
        cd = den.dtype
        weights = state_weights(d, cd, query.device)
        g_y = grad_outputs(grad_out.to(cd), out.to(cd), den, count, normalize, d)

        gq = torch.zeros_like(query, dtype=cd) if need_q else None
        gk = torch.zeros_like(key, dtype=cd) if need_k else None
        gv = torch.zeros_like(value, dtype=cd) if need_v else None
        gt = torch.zeros((b, h, 1, 1), dtype=cd, device=query.device) if need_t else None

        # Forward sweep: rebuild the prefix state; gradients through the query side and
        # the intra-chunk block.
        if initial is None:
            state = query.new_zeros((b, h, feature_dim(d), dv + 1), dtype=cd)
        else:
            state = initial.to(cd).clone()
        for i0 in range(0, nq, chunk):
            i1 = min(i0 + chunk, nq)
            j1 = min(i1, nk)
            g_chunk = g_y[:, :, i0:i1]
            q_in, t_in, q = scaled_query_leaf(
                query[:, :, i0:i1], temperature, ctx.factor, normalize, cd, need_q, need_t
            )
            outputs, grad_outputs_ = [], []
            if q.requires_grad:  # the prefix part, differentiated by hand
                outputs.append(q)
                grad_outputs_.append(state_input_grad(q.detach(), g_chunk, state * weights))
            k_in = v_in = k = v = None
            if i0 < nk:
                mask = None if key_mask is None else key_mask[:, :, i0:j1]
                with torch.enable_grad():
                    k_in = key[:, :, i0:j1].to(cd).detach().requires_grad_(need_k)
                    v_in = value[:, :, i0:j1].to(cd).detach().requires_grad_(need_v)
                    k = scaled_key(k_in, normalize)
                    v = values_with_ones(v_in, mask)
                    intra = _intra_chunk(q, k, v)
                if intra.requires_grad:
                    outputs.append(intra)
                    grad_outputs_.append(g_chunk)
            wanted = [
                (x, name)
                for x, name, need in (
                    (q_in, "q", need_q),
                    (t_in, "t", need_t),
                    (k_in, "k", need_k),
                    (v_in, "v", need_v),
                )
                if need and x is not None
            ]
            if outputs and wanted:
                grads = torch.autograd.grad(
                    outputs, [x for x, _ in wanted], grad_outputs_, allow_unused=True
                )
                for (_, name), g in zip(wanted, grads, strict=True):
                    if g is None:
                        continue
                    if name == "q":
                        gq[:, :, i0:i1] += g
                    elif name == "t":
                        gt += g
                    elif name == "k":
                        gk[:, :, i0:j1] += g
                    else:
                        gv[:, :, i0:j1] += g
            if k is not None:
                state += features(k.detach()).transpose(-2, -1) @ v.detach()

        # Reverse sweep: the gradient of the state that chunk c feeds, from later queries;
        # after chunk 0 it is the gradient of the initial state.
        g_initial = None
        if need_k or need_v or need_s:
            g_state = torch.zeros_like(state)  # w.r.t. the weighted state
            tau = query_factor(temperature, ctx.factor, cd, b, h)
            for i0 in reversed(range(0, nq, chunk)):
                i1 = min(i0 + chunk, nq)
                if i0 < nk:
                    j1 = min(i1, nk)
                    mask = None if key_mask is None else key_mask[:, :, i0:j1]
                    g_s = g_state * weights
                    with torch.enable_grad():
                        k_in = key[:, :, i0:j1].to(cd).detach().requires_grad_(need_k)
                        k = scaled_key(k_in, normalize)
                    if need_v:
                        g = (features(k.detach()) @ g_s)[..., :dv]
                        gv[:, :, i0:j1] += g if mask is None else g * mask.unsqueeze(-1)
                    if need_k:
                        v = values_with_ones(value[:, :, i0:j1].to(cd), mask)
                        g_k = state_input_grad(k.detach(), v, g_s)
                        (g,) = torch.autograd.grad(k, k_in, g_k)
                        gk[:, :, i0:j1] += g
                q = scaled_query(query[:, :, i0:i1].to(cd), tau, normalize)
                g_state += features(q).transpose(-2, -1) @ g_y[:, :, i0:i1]
            if need_s:
                g_initial = (g_state * weights).to(initial.dtype)

        return (
            None if gq is None else gq.to(query.dtype),
            None if gk is None else gk.to(key.dtype),
            None if gv is None else gv.to(value.dtype),
            None if gt is None else gt.sum_to_size(temperature.shape).to(temperature.dtype),
            None,
            None,
            None,
            None,
            g_initial,
            None,
        )


def causal_efficient_taylor_shift(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_mask: Tensor | None,
    temperature: Tensor | float,
    scale: float | None,
    normalize: bool,
    chunk_size: int | None = None,
    initial_state: Tensor | None = None,
    initial_count: Tensor | None = None,
) -> Tensor:
    """Causal efficient form on validated inputs; key_mask is (B, H, Nk) bool or None.

    ``initial_state`` (B, H, D, dv + 1), the unweighted sums Σ φ(k'_j)ᵀ [v_j, 1] of keys
    before the block, and ``initial_count`` (B, H), their number, continue an earlier sweep
    (see ``causal_forward``); the result is differentiable w.r.t. ``initial_state``.
    """
    d = query.shape[-1]
    chunk = chunk_size or DEFAULT_CAUSAL_CHUNK
    factor = score_factor(temperature, scale, normalize, d)
    t = factor if isinstance(factor, Tensor) else None
    f = 0.0 if t is not None else float(factor)
    return CausalEfficientTaylorShiftFunction.apply(
        query, key, value, t, f, normalize, key_mask, chunk, initial_state, initial_count
    )
