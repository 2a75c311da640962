"""Efficient TaylorShift, non-causal, O(N d² dv): key-side states accumulated chunk by chunk.

    S  = Σ_j φ(k'_j)ᵀ [v_j, 1]          (D, dv + 1), D = d(d+1)/2 + d + 1, masked keys left out
    Y' = φ(q'_i) (c ⊙ S)                (Nq, dv + 1): numerator and denominator together
    y  = Y'[:dv] / Y'[dv] · sqrt(n/d)

No tensor of N × D features exists for the whole sequence: keys and queries are visited in
chunks. Backward (``EfficientTaylorShiftFunction``) saves the inputs, the (D, dv + 1) state,
the output and the O(N) denominators, and recomputes the features chunk by chunk; the
derivation is in docs/efficient-form.md.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .features import (
    add_feature_product,
    chunk_features,
    compute_dtype,
    feature_dim,
    feature_product,
    quadratic_grad,
    scaled_input_grad,
    scaled_key,
    scaled_query,
    split_factor,
    state_weights,
    symmetric_state,
    values_with_ones,
)
from .second_order import reference_grads, wants_graph

# Elements of one chunk of features, (B, H, C, D), that the default chunk size aims at
# (32 MiB in float32; benchmarks/op_cpu/workspace/chunk.md has 2^22 to 2^24 side by side).
CHUNK_ELEMENTS = 1 << 23
# On a GPU every chunk costs its launches (~20 operations, each a few µs of dispatch): at
# B·H = 32, d = 64 the CPU's chunk is 64 tokens, and the first H200 run timed this form
# at 42 ms for N = 1,024 (17,109 aten calls per forward, counted with torch.profiler),
# slower than its arithmetic by two orders. GPUs take 8x larger chunks (256 MiB in float32).
GPU_CHUNK_ELEMENTS = 1 << 26
MIN_CHUNK = 64
MAX_CHUNK = 4096
GPU_MAX_CHUNK = 1 << 16


def default_chunk_size(
    batch_heads: int, d: int, dv: int, device: torch.device | str | None = None
) -> int:
    """Tokens per chunk so that a (B·H, C, D) feature block holds about 8M elements (64M
    on a device other than the CPU).

    Backward also forms (B·H, C, d·(dv + 1)) products (``quadratic_grad``): the wider of the
    two sets the chunk.
    """
    on_cpu = device is None or torch.device(device).type == "cpu"
    elements, most = (CHUNK_ELEMENTS, MAX_CHUNK) if on_cpu else (GPU_CHUNK_ELEMENTS, GPU_MAX_CHUNK)
    width = max(feature_dim(d), d * (dv + 1))
    c = elements // max(1, batch_heads * width)
    return max(MIN_CHUNK, min(most, c))


def balanced_chunk(n: int, chunk: int) -> int:
    """At most ``chunk`` tokens per chunk, as few chunks as that allows, of equal size: 256
    tokens under a 252 limit run as 2 × 128, not 252 + a 4-token remainder whose fixed
    costs cost as much as the big chunk's."""
    if n <= chunk:
        return max(n, 1)
    pieces = -(-n // chunk)
    return -(-n // pieces)


def query_factor(temperature: Tensor | None, factor: float, dtype: torch.dtype, b: int, h: int):
    """The multiplier of q after normalisation: a (B, H, 1, 1) tensor or a float."""
    if temperature is None:
        return factor
    return temperature.to(dtype).expand(b, h, 1, 1)


def grad_outputs(
    grad_out: Tensor, out: Tensor, den: Tensor, count: Tensor, normalize: bool, d: int
) -> Tensor:
    """Gradient w.r.t. Y' = [numerator, denominator] from the gradient w.r.t. y.

    y = nom · f / den with f = sqrt(n/d) (or 1): ∂y/∂nom = f/den and ∂y/∂den = -y/den.
    Rows with no attended key (n = 0) get zero. Shapes: grad_out, out (B, H, N, dv);
    den (B, H, N); count broadcasts to (B, H, N). Returns (B, H, N, dv + 1).
    """
    valid = count > 0
    safe_den = torch.where(valid, den, 1.0)
    scale = torch.where(valid, 1.0 / safe_den, 0.0)
    g_den = -(grad_out * out).sum(-1) * scale
    if normalize:
        scale = scale * torch.sqrt(count / d)
    g_nom = grad_out * scale.unsqueeze(-1)
    return torch.cat([g_nom, g_den.unsqueeze(-1)], dim=-1)


def finish_outputs(
    y_prime: Tensor, count: Tensor, normalize: bool, d: int
) -> tuple[Tensor, Tensor]:
    """y = nom/den · sqrt(n/d) from Y' (…, N, dv + 1); count broadcasts to (…, N).

    Returns (y, den). A row with n = 0 has a zero state product, so 0/1 keeps it zero.
    """
    return scale_outputs(y_prime[..., :-1], y_prime[..., -1], count, normalize, d), y_prime[..., -1]


def scale_outputs(nom: Tensor, den: Tensor, count: Tensor, normalize: bool, d: int) -> Tensor:
    """y = nom/den · sqrt(n/d) from the numerator (…, N, dv) and the denominator (…, N)."""
    valid = count > 0
    scale = 1.0 / torch.where(valid, den, 1.0)
    if normalize:
        scale = scale * torch.sqrt(count / d)
    return nom * scale.unsqueeze(-1)


class EfficientTaylorShiftFunction(torch.autograd.Function):
    """Non-causal efficient TaylorShift with a chunked, recomputing backward.

    The numerator goes through the (D, dv) state; the denominator through the key moments
    Σ_j k'_j and Σ_j k'_j k'_jᵀ (``key_state(..., ones=False)``, ``denominators``), so every
    product with a feature block is dv wide, not dv + 1 (docs/efficient-form.md §1).
    """

    @staticmethod
    def forward(ctx, query, key, value, temperature, factor, normalize, key_mask, chunk):
        b, h, nq, d = query.shape
        nk, dv = key.shape[2], value.shape[3]
        cd = compute_dtype(query.dtype)
        weights = state_weights(d, cd, query.device)  # (D, 1)
        tau = query_factor(temperature, factor, cd, b, h)

        state, ksum, kk = key_state(key, value, key_mask, normalize, chunk, ones=False)

        count = key_count(key_mask, nk, cd, query.device)  # (B, H, 1) or scalar tensor
        weighted = state * weights
        out = torch.empty((b, h, nq, dv), dtype=query.dtype, device=query.device)
        den = torch.empty((b, h, nq), dtype=cd, device=query.device)
        for i0 in range(0, nq, chunk):
            i1 = min(i0 + chunk, nq)
            q = scaled_query(query[:, :, i0:i1].to(cd), tau, normalize)
            nom = feature_product(chunk_features(q), weighted)
            den[:, :, i0:i1] = denominators(q, ksum, kk, count)
            out[:, :, i0:i1] = scale_outputs(nom, den[:, :, i0:i1], count, normalize, d).to(
                out.dtype
            )

        ctx.save_for_backward(query, key, value, temperature, key_mask, state, ksum, kk, out, den)
        ctx.factor, ctx.normalize, ctx.chunk = factor, normalize, chunk
        return out

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, temperature, key_mask, state, ksum, kk, out, den = ctx.saved_tensors
        need_q, need_k, need_v, need_t = ctx.needs_input_grad[:4]
        if wants_graph():  # create_graph=True: gradients that differentiate again
            mask = None if key_mask is None else key_mask.unsqueeze(2)
            grads = reference_grads(
                grad_out, (query, key, value, temperature), ctx.needs_input_grad[:4], mask,
                False, ctx.factor, ctx.normalize,
            )  # fmt: skip
            return (*grads, None, None, None, None)
        normalize, chunk = ctx.normalize, ctx.chunk
        b, h, nq, d = query.shape
        nk, dv = key.shape[2], value.shape[3]
        cd = state.dtype
        weights = state_weights(d, cd, query.device)
        weighted = state * weights
        count = key_count(key_mask, nk, cd, query.device)
        g_y = grad_outputs(grad_out.to(cd), out.to(cd), den, count, normalize, d)
        g_nom, g_den = g_y[..., :dv], g_y[..., dv]

        tau = query_factor(temperature, ctx.factor, cd, b, h)
        gq = gt = None
        need_qt = need_q or need_t
        if need_qt:
            g_scaled = torch.empty((b, h, nq, d), dtype=cd, device=query.device)
            sym = symmetric_state(weighted[..., : d * (d + 1) // 2, :], d)
        g_state = torch.zeros_like(state)  # gradient w.r.t. the weighted state
        # gradients w.r.t. the key moments: Σ_i g_i q'_i and ½ Σ_i g_i q'_i q'_iᵀ
        g_ksum = torch.zeros_like(ksum)
        g_kk = torch.zeros_like(kk)
        for i0 in range(0, nq, chunk):
            i1 = min(i0 + chunk, nq)
            g_chunk, g_d = g_nom[:, :, i0:i1], g_den[:, :, i0:i1, None]
            q = scaled_query(query[:, :, i0:i1].to(cd), tau, normalize)
            if need_qt:
                # ∂den/∂q' = Σ k' + (Σ k' k'ᵀ) q'
                g_scaled[:, :, i0:i1] = state_input_grad(q, g_chunk, weighted, sym) + g_d * (
                    ksum.unsqueeze(-2) + q @ kk
                )
            g_state = add_feature_product(g_state, chunk_features(q), g_chunk)
            g_ksum += (g_d * q).sum(-2)
            g_kk += 0.5 * ((g_d * q).transpose(-2, -1) @ q)
        if need_qt:
            gq, gt = scaled_input_grad(query.to(cd), g_scaled, tau, normalize)

        g_state *= weights  # now the gradient w.r.t. the unweighted state
        gk, gv = key_side_grads(
            key, value, key_mask, g_state, normalize, chunk, need_k, need_v, (g_ksum, g_kk)
        )
        return (
            gq.to(query.dtype) if need_q else None,
            gk,
            gv,
            gt.sum_to_size(temperature.shape).to(temperature.dtype) if need_t else None,
            None,
            None,
            None,
            None,
        )


def denominators(q: Tensor, ksum: Tensor, kk: Tensor, count: Tensor) -> Tensor:
    """Σ_j w(q'·k'_j) over the attended keys = n + q'·Σ k' + ½ q'ᵀ (Σ k' k'ᵀ) q', (…, C),
    from the key moments of ``key_state(..., ones=False)``: O(C d²), no features."""
    linear = (q * ksum.unsqueeze(-2)).sum(-1)
    quadratic = ((q @ kk) * q).sum(-1)
    return count + linear + 0.5 * quadratic


def key_state(
    key: Tensor,
    value: Tensor,
    key_mask: Tensor | None,
    normalize: bool,
    chunk: int,
    ones: bool = True,
):
    """S = Σ_j φ(k'_j)ᵀ [v_j, 1] over the keys not masked, chunk by chunk, without autograd:
    (B, H, D, dv + 1) in the compute dtype.

    ``ones=False``: S = Σ_j φ(k'_j)ᵀ v_j, (B, H, D, dv), with the key moments that give the
    denominators instead of the ones column: returns (S, Σ_j k'_j (B, H, d),
    Σ_j k'_j k'_jᵀ (B, H, d, d)), masked keys left out of all three.
    """
    b, h, nk, d = key.shape
    dv = value.shape[-1]
    cd = compute_dtype(key.dtype)
    state = key.new_zeros((b, h, feature_dim(d), dv + 1 if ones else dv), dtype=cd)
    ksum = key.new_zeros((b, h, d), dtype=cd)
    kk = key.new_zeros((b, h, d, d), dtype=cd)
    with torch.no_grad():
        for j0 in range(0, nk, chunk):
            j1 = min(j0 + chunk, nk)
            k = scaled_key(key[:, :, j0:j1].to(cd), normalize)
            mask = None if key_mask is None else key_mask[:, :, j0:j1]
            if ones:
                v = values_with_ones(value[:, :, j0:j1].to(cd), mask)
            else:
                v = value[:, :, j0:j1].to(cd)
                if mask is not None:
                    real = mask.unsqueeze(-1).to(cd)
                    v, k_real = v * real, k * real
                else:
                    k_real = k
                ksum += k_real.sum(-2)
                kk += k_real.transpose(-2, -1) @ k
            state = add_feature_product(state, chunk_features(k), v)
    return state if ones else (state, ksum, kk)


def state_input_grad(x: Tensor, g: Tensor, state: Tensor, sym: Tensor | None = None) -> Tensor:
    """∂/∂x of Σ g · (φ(x) @ state) for each token: (…, C, d) from g (…, C, c).

    Only the quadratic and linear rows of the (D, c) state depend on x; the quadratic part
    goes through ``quadratic_grad`` so that no (C, D) feature gradient is formed. ``sym``:
    ``symmetric_state`` of the state's quadratic rows, when the caller has it already (a
    loop over chunks with one state unpacks it once).
    """
    d = x.shape[-1]
    p = d * (d + 1) // 2
    if sym is None:
        sym = symmetric_state(state[..., :p, :], d)
    linear = state[..., p : p + d, :]  # (…, d, c)
    return quadratic_grad(x, g, sym) + g @ linear.transpose(-2, -1)


def key_count(key_mask: Tensor | None, nk: int, dtype: torch.dtype, device) -> Tensor:
    """Attended keys per query for a key-padding mask: (B, H, 1), or a 0-d tensor."""
    if key_mask is None:
        return torch.tensor(float(nk), dtype=dtype, device=device)
    return key_mask.sum(-1, keepdim=True).to(dtype)


def key_side_grads(
    key: Tensor,
    value: Tensor,
    key_mask: Tensor | None,
    g_state: Tensor,
    normalize: bool,
    chunk: int,
    need_k: bool,
    need_v: bool,
    moments_grad: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor | None, Tensor | None]:
    """Gradients of key and value from the gradient of S = Σ_j φ(k'_j)ᵀ v'_j (B, H, D, dv+1).

    ∂/∂v'_j = φ(k'_j) g_state and ∂/∂k'_j = ``state_input_grad(k'_j, v'_j, g_state)``; the
    map k -> k' (normalisation) is differentiated by ``scaled_input_grad``.

    ``moments_grad`` = (a, B), the gradients w.r.t. the key moments Σ k' and Σ k' k'ᵀ of
    ``key_state(..., ones=False)``: then g_state is (B, H, D, dv) (no ones column) and each
    real key also gets a + (B + Bᵀ) k'_j.
    """
    if not (need_k or need_v):
        return None, None
    nk, dv = key.shape[2], value.shape[3]
    cd = g_state.dtype
    g_scaled = torch.empty_like(key, dtype=cd) if need_k else None
    gv = torch.empty_like(value, dtype=cd) if need_v else None
    d = key.shape[-1]
    sym = symmetric_state(g_state[..., : d * (d + 1) // 2, :], d) if need_k else None
    for j0 in range(0, nk, chunk):
        j1 = min(j0 + chunk, nk)
        mask = None if key_mask is None else key_mask[:, :, j0:j1]
        k = scaled_key(key[:, :, j0:j1].to(cd), normalize)
        if need_v:
            g = feature_product(chunk_features(k), g_state)[..., :dv]
            gv[:, :, j0:j1] = g if mask is None else g * mask.unsqueeze(-1)
        if need_k and moments_grad is None:
            v = values_with_ones(value[:, :, j0:j1].to(cd), mask)
            g_scaled[:, :, j0:j1] = state_input_grad(k, v, g_state, sym)
        elif need_k:
            g_ksum, g_kk = moments_grad
            v = value[:, :, j0:j1].to(cd)
            g = g_ksum.unsqueeze(-2) + k @ (g_kk + g_kk.transpose(-2, -1))
            if mask is not None:
                real = mask.unsqueeze(-1).to(cd)
                v, g = v * real, g * real
            g_scaled[:, :, j0:j1] = state_input_grad(k, v, g_state, sym) + g
    gk = None
    if need_k:
        gk, _ = scaled_input_grad(key.to(cd), g_scaled, 1.0, normalize)
    return (
        None if gk is None else gk.to(key.dtype),
        None if gv is None else gv.to(value.dtype),
    )


def efficient_taylor_shift(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_mask: Tensor | None,
    temperature: Tensor | float,
    scale: float | None,
    normalize: bool,
    chunk_size: int | None = None,
) -> Tensor:
    """Non-causal efficient form on validated inputs; key_mask is (B, H, Nk) bool or None."""
    b, h, _, d = query.shape
    nk = key.shape[2]
    chunk = chunk_size or balanced_chunk(
        max(nk, query.shape[2]), default_chunk_size(b * h, d, value.shape[-1], query.device)
    )
    t, f = split_factor(temperature, scale, normalize, d)
    return EfficientTaylorShiftFunction.apply(query, key, value, t, f, normalize, key_mask, chunk)
