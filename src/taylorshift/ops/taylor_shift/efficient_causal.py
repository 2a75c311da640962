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
Every gradient is written by hand (the intra-chunk block as in the direct form,
docs/direct-form.md; the normalisation by ``scaled_input_grad``), so backward records no
autograd graph and torch.compile traces it whole. A state nobody reads is never built: the
first chunk has no prefix and the last chunk's keys feed no later query.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .direct import weighted_sums, weighted_sums_grad
from .efficient import (
    finish_outputs,
    grad_outputs,
    query_factor,
    state_input_grad,
)
from .features import (
    add_feature_product,
    chunk_features,
    compute_dtype,
    feature_dim,
    feature_product,
    scaled_input_grad,
    scaled_key,
    scaled_query,
    split_factor,
    state_weights,
    values_with_ones,
)
from .second_order import reference_grads, wants_graph
from .state import TaylorShiftState, final_state, real_keys

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


def causal_forward(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    tau: Tensor | float,
    normalize: bool,
    key_mask: Tensor | None,
    chunk: int,
    initial_state: TaylorShiftState | None = None,
    final_state: bool = True,
) -> tuple[Tensor, Tensor, Tensor, TaylorShiftState | None]:
    """The chunked causal sweep, without autograd: (out, den, count, final state).

    ``final_state=False`` skips the keys that no query of the block reads through the
    state (the last chunk's, and any after the last query) and returns None for it: a
    training forward needs no final state, and a single chunk then costs the direct form.

    ``initial_state`` holds the keys that precede the whole block (every query attends
    them) and continues an earlier sweep: decoding, or a later shard of a sequence.
    ``tau`` is the query factor (``query_factor``). Returns out (B, H, Nq, dv) in the
    query's dtype, den (B, H, Nq) and the counts n_i in the compute dtype, and the state
    after the last key (the initial state's keys and this block's real ones).

    Grouped queries: key, value, key_mask and the state may have Hkv heads, Hkv dividing H
    (query head h reads key/value head h // (H / Hkv), ``grouped.py``). Each chunk's
    queries of a group are then stacked for the readout of their shared prefix state, the
    intra-chunk block repeats the chunk's keys for them, and the state is built once per
    key/value head (the counts n_i are the key/value head's).
    """
    b, h, nq, d = query.shape
    kv_heads, nk, dv = key.shape[1], key.shape[2], value.shape[3]
    groups = h // kv_heads if kv_heads else 1  # (no heads: an empty batch)
    cd = compute_dtype(query.dtype)
    weights = state_weights(d, cd, query.device)
    count = causal_count(key_mask, nq, nk, cd, query.device)
    if initial_state is not None:
        count = initial_state.count.to(cd).unsqueeze(-1) + count  # (B, H, Nq)
    # None: no key summed yet (the prefix part of a chunk is then zero and skipped)
    state = None if initial_state is None else initial_state.sums.detach().to(cd, copy=True)
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
            stacked = q.reshape(b, kv_heads, groups * (q1 - i0), d)  # (q itself: no groups)
            y_prime = None
            if state is not None:
                # φ(q) (c ⊙ S): weight the features or the state, whichever is smaller
                if stacked.shape[2] < dv + 1:
                    y_prime = (chunk_features(stacked) * weights.squeeze(-1)) @ state
                else:
                    y_prime = feature_product(chunk_features(stacked), state * weights)
            if k is not None:
                ck, cv = k[:, :, : q1 - i0], v[:, :, : q1 - i0]
                if groups > 1:
                    ck, cv = (t.repeat_interleave(groups, dim=1) for t in (ck, cv))
                intra = weighted_sums(q, ck, cv, None, True)
                intra = intra.reshape(b, kv_heads, groups * (q1 - i0), dv + 1)
                y_prime = intra if y_prime is None else y_prime + intra
            if y_prime is None:  # no key before or inside the chunk
                y_prime = q.new_zeros((b, kv_heads, groups * (q1 - i0), dv + 1))
            n_i = count[..., i0:q1]
            if groups > 1:  # each stacked query's n_i: its key/value head's
                n_i = n_i.repeat(*(1,) * (n_i.dim() - 1), groups)
            y, chunk_den = finish_outputs(y_prime, n_i, normalize, d)
            den[:, :, i0:q1] = chunk_den.reshape(b, h, q1 - i0)
            out[:, :, i0:q1] = y.reshape(b, h, q1 - i0, dv).to(out.dtype)
        if k is not None and (final_state or i1 < nq):
            state = add_feature_product(state, chunk_features(k), v)
    if not final_state:
        return out, den, count, None
    if state is None:
        state = query.new_zeros((b, kv_heads, feature_dim(d), dv + 1), dtype=cd)
    keys = real_keys(key_mask, b, kv_heads, nk, cd, query.device)
    if initial_state is not None:
        keys = initial_state.count + keys
    return out, den, count, TaylorShiftState(state, keys)


class CausalEfficientTaylorShiftFunction(torch.autograd.Function):
    """Causal efficient TaylorShift with a chunked, recomputing backward.

    Differentiable also w.r.t. ``state_sums`` (the prefix of earlier keys), so that a
    sequence split over processes can pass state gradients back (``taylorshift.distributed``).
    Grouped queries (key, value, key_mask and the state with Hkv heads dividing the query's
    H, ``causal_forward``): both sweeps stack each chunk's query heads of a group for the
    shared state, and the intra-chunk block's key gradients are summed over the group.
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
        state_sums=None,
        state_count=None,
        output_state=False,
    ):
        # The state comes as its two tensors: autograd sees tensor arguments only, and the
        # output is differentiable w.r.t. the sums. With ``output_state`` the sweep's state
        # after the last key comes out too, (sums, count), without a gradient here (the
        # caller attaches it: ``state.final_state``).
        b, h = query.shape[:2]
        cd = compute_dtype(query.dtype)
        tau = query_factor(temperature, factor, cd, b, h)
        initial = None
        if state_sums is not None:
            initial = TaylorShiftState(state_sums, state_count)
        out, den, count, final = causal_forward(
            query, key, value, tau, normalize, key_mask, chunk, initial, final_state=output_state
        )
        ctx.save_for_backward(query, key, value, temperature, key_mask, out, den, count, state_sums)
        ctx.factor, ctx.normalize, ctx.chunk = factor, normalize, chunk
        if not output_state:
            return out
        ctx.mark_non_differentiable(final.sums, final.count)
        return out, final.sums, final.count

    @staticmethod
    def backward(ctx, grad_out, *_):  # (the final state's sums and count: no gradient here)
        query, key, value, temperature, key_mask, out, den, count, initial = ctx.saved_tensors
        need_q, need_k, need_v, need_t = ctx.needs_input_grad[:4]
        if wants_graph():  # create_graph=True: gradients that differentiate again
            if key.shape[1] != query.shape[1]:
                raise RuntimeError(
                    "grouped-query attention with a causal state has first-order gradients "
                    "only; differentiating its gradient again (create_graph=True) is not "
                    "supported"
                )
            if initial is not None:
                raise RuntimeError(
                    "initial_state: a call that continues a causal state has first-order "
                    "gradients only; differentiating its gradient again (create_graph=True) "
                    "is not supported"
                )
            mask = None if key_mask is None else key_mask.unsqueeze(2)
            grads = reference_grads(
                grad_out, (query, key, value, temperature), ctx.needs_input_grad[:4], mask,
                True, ctx.factor, ctx.normalize,
            )  # fmt: skip
            return (*grads, None, None, None, None, None, None, None)
        need_s = ctx.needs_input_grad[8]
        normalize, chunk = ctx.normalize, ctx.chunk
        b, h, nq, d = query.shape
        kv_heads, nk, dv = key.shape[1], key.shape[2], value.shape[3]
        groups = h // kv_heads if kv_heads else 1
        cd = den.dtype
        weights = state_weights(d, cd, query.device)
        tau = query_factor(temperature, ctx.factor, cd, b, h)
        if groups > 1 and count.dim() == 3:  # n_i of each query head: its key/value head's
            count = count.repeat_interleave(groups, dim=1)
        g_y = grad_outputs(grad_out.to(cd), out.to(cd), den, count, normalize, d)

        def stacked(x: Tensor) -> Tensor:  # (B, H, C, ·) -> (B, Hkv, G·C, ·)
            return x.reshape(b, kv_heads, groups * x.shape[2], x.shape[3])

        def group_sum(x: Tensor) -> Tensor:  # (B, H, C, ·) -> (B, Hkv, C, ·)
            if groups == 1:
                return x
            return x.reshape(b, kv_heads, groups, *x.shape[2:]).sum(2)

        need_qt = need_q or need_t
        # Gradients w.r.t. the scaled q' and k' and w.r.t. v' = [v, 1] (masked rows zero),
        # mapped back through the normalisation at the end.
        gq = torch.zeros((b, h, nq, d), dtype=cd, device=query.device) if need_qt else None
        gk = torch.zeros((b, kv_heads, nk, d), dtype=cd, device=query.device) if need_k else None
        gv = (
            torch.zeros((b, kv_heads, nk, dv + 1), dtype=cd, device=query.device)
            if need_v
            else None
        )
        span = max(nq, nk)

        def chunk_keys(i0: int, i1: int) -> tuple[Tensor, Tensor, int]:
            j1 = min(i1, nk)
            mask = None if key_mask is None else key_mask[:, :, i0:j1]
            k = scaled_key(key[:, :, i0:j1].to(cd), normalize)
            return k, values_with_ones(value[:, :, i0:j1].to(cd), mask), j1

        # Forward sweep: rebuild the prefix state; gradients through the query side of the
        # prefix part and through the intra-chunk block (the direct form, by hand).
        state = None if initial is None else initial.to(cd, copy=True)
        for i0 in range(0, span, chunk):
            i1 = min(i0 + chunk, span)
            k = v = None
            if i0 < nk:
                k, v, _ = chunk_keys(i0, i1)
            if i0 < nq and (need_qt or need_k or need_v):
                q1 = min(i1, nq)
                q = scaled_query(query[:, :, i0:q1].to(cd), tau, normalize)
                g_chunk = g_y[:, :, i0:q1]
                if need_qt and state is not None:
                    from_state = state_input_grad(stacked(q), stacked(g_chunk), state * weights)
                    gq[:, :, i0:q1] += from_state.reshape(q.shape)
                if k is not None:
                    # the intra-chunk block is the direct form's weighted sum (masked keys
                    # have v' = 0, so they get no weight and give no gradient)
                    ck = min(q1 - i0, k.shape[2])
                    need = (need_qt, need_k, need_v)
                    ik, iv = k[:, :, :ck], v[:, :, :ck]
                    if groups > 1:
                        ik, iv = (t.repeat_interleave(groups, dim=1) for t in (ik, iv))
                    iq, ik, iv = weighted_sums_grad(q, ik, iv, g_chunk, None, True, 2, need)
                    if need_qt:
                        gq[:, :, i0:q1] += iq
                    if need_k:
                        gk[:, :, i0 : i0 + ck] += group_sum(ik)
                    if need_v:
                        gv[:, :, i0 : i0 + ck] += group_sum(iv)
            if k is not None and i1 < nq:  # later queries attend this chunk via the state
                state = add_feature_product(state, chunk_features(k), v)

        # Reverse sweep: G_>c, the gradient of the state that chunk c feeds from later
        # queries, gives the key-side gradients; after chunk 0 it is the initial state's.
        g_initial = None
        if need_k or need_v or need_s:
            g_state = None  # w.r.t. the weighted state
            for i0 in reversed(range(0, span, chunk)):
                i1 = min(i0 + chunk, span)
                if i0 < nk and g_state is not None and (need_k or need_v):
                    k, v, j1 = chunk_keys(i0, i1)
                    g_s = g_state * weights
                    if need_v:
                        gv[:, :, i0:j1] += feature_product(chunk_features(k), g_s)
                    if need_k:
                        gk[:, :, i0:j1] += state_input_grad(k, v, g_s)
                if i0 < nq:
                    q1 = min(i1, nq)
                    q = scaled_query(query[:, :, i0:q1].to(cd), tau, normalize)
                    g_state = add_feature_product(
                        g_state, chunk_features(stacked(q)), stacked(g_y[:, :, i0:q1])
                    )
            if need_s:
                if g_state is None:
                    g_initial = torch.zeros_like(initial)
                else:
                    g_initial = (g_state * weights).to(initial.dtype)

        g_query = g_tau = g_key = g_value = None
        if need_qt:
            g_query, g_tau = scaled_input_grad(query.to(cd), gq, tau, normalize)
        if need_k:
            g_key, _ = scaled_input_grad(key.to(cd), gk, 1.0, normalize)
        if need_v:
            g_value = gv[..., :dv]
            if key_mask is not None:
                g_value = g_value * key_mask.unsqueeze(-1)
        return (
            g_query.to(query.dtype) if need_q else None,
            g_key.to(key.dtype) if need_k else None,
            g_value.to(value.dtype) if need_v else None,
            g_tau.sum_to_size(temperature.shape).to(temperature.dtype) if need_t else None,
            None,
            None,
            None,
            None,
            g_initial,
            None,
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
    *,
    initial_state: TaylorShiftState | None = None,
    output_final_state: bool = False,
) -> Tensor | tuple[Tensor, TaylorShiftState]:
    """Causal efficient form on validated inputs; key_mask is (B, H, Nk) bool or None.

    ``initial_state`` (checked by the caller) holds the keys before the block and continues
    an earlier sweep; the result is differentiable w.r.t. ``initial_state.sums``. With
    ``output_final_state`` the state after the block's last key (its real keys added;
    differentiable w.r.t. key, value and ``initial_state.sums``, ``state.final_state``) is
    returned too: ``(out, state)``.
    """
    d = query.shape[-1]
    chunk = chunk_size or DEFAULT_CAUSAL_CHUNK
    t, f = split_factor(temperature, scale, normalize, d)
    sums = count = None
    if initial_state is not None:
        sums, count = initial_state.sums, initial_state.count
    if not output_final_state:
        return CausalEfficientTaylorShiftFunction.apply(
            query, key, value, t, f, normalize, key_mask, chunk, sums, count
        )
    # the sweep's own state after the last key (the initial state's keys and the block's
    # real ones), its gradient attached by final_state
    out, after, real = CausalEfficientTaylorShiftFunction.apply(
        query, key, value, t, f, normalize, key_mask, chunk, sums, count, True
    )
    return out, final_state(after, real, key, value, key_mask, normalize, sums, chunk)
