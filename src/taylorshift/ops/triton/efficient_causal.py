"""Efficient TaylorShift, causal (SPEC §2.3), on the fused kernels of ``efficient.py``.

The sequence is cut into chunks of C tokens (docs/triton-efficient.md, "Causal"). With
u = [v·m, m] (values times the key mask, and the mask as the denominator column) and
Y' = [numerator, denominator]:

    S_c   = Σ_{j in key chunk c} φ(k'_j)ᵀ u_j        state kernel, one grid over all chunks
    P_c   = Σ_{c' < c} S_c'                           exclusive prefix sum in torch (fp32)
    Y'_i  = φ(q'_i)(c ⊙ P_c)                          apply kernel, one grid over all chunks
          + Σ_{j in chunk c, j <= i} w(q'_i·k'_j) u_j  intra-chunk block in torch, (C × C) tiles

then y = nom/den · sqrt(n_i/d) in torch, n_i the attended keys j <= i. Backward: the query
side from P_c (grad kernel), the state gradient R_c = Σ_{c' > c} φ(q'_c')ᵀ gY'_c' (state
kernel per query chunk, reverse prefix sum), g_u = φ(k')(c ⊙ R) (apply kernel) and g_k'
from R (grad kernel); the intra-chunk block is differentiated by autograd on its tiles.
The maps q -> q', k -> k', v -> u and the finishing run in torch around the core and are
differentiated by autograd.

Query i attends key j iff j <= i (upper-left aligned, as SDPA), also when Nq != Nk: query
chunk c uses the prefix of key chunks < c and the intra block with key chunk c.
"""

from __future__ import annotations

import torch
import triton
from torch import Tensor

from ..taylor_shift.efficient import finish_outputs
from ..taylor_shift.efficient_causal import causal_count
from ..taylor_shift.features import taylor_weight
from ..taylor_shift.fused import CAUSAL_CHUNK
from ..taylor_shift.second_order import graph_grads, taylor_sums, wants_graph
from ..taylor_shift.state import TaylorShiftState
from .efficient import (
    _apply,
    _flat,
    _grad,
    _state,
    check_kernel_inputs,
    dot_kind,
    layout,
    scaled_inputs,
)

# Tokens per chunk (defined beside the router, which sizes the states without importing
# Triton): the intra-chunk block costs O(N C d) and the per-chunk states
# (N / C) · layout(d, dv).size float32 per (batch, head): a larger C trades direct work
# for state memory (docs/triton-efficient.md, "Causal").
DEFAULT_CHUNK = CAUSAL_CHUNK


def _chunks(x: Tensor, n_chunks: int, chunk: int) -> Tensor:
    """(BH, N, e) -> (BH·n_chunks, C, e) contiguous, zero-padded past N."""
    bh, n, e = x.shape
    pad = n_chunks * chunk - n
    if pad:
        x = torch.nn.functional.pad(x, (0, 0, 0, pad))
    return x.reshape(bh * n_chunks, chunk, e).contiguous()


def _split(x: Tensor) -> tuple[Tensor, Tensor]:
    """(BH', C, e) -> its first e - 1 columns and its last column, as views: the kernels'
    u and r (R_MODE 2). The last column (the key mask, or the denominator's gradient) then
    goes into the states' denominator rows, summed in float32 beside the dots, and the
    state is e - 1 columns wide (dv = 64 pads to 64 columns, not 128)."""
    return x[..., :-1], x[..., -1]


def _apply_split(x: Tensor, state: Tensor, lay, out: Tensor, dot: int) -> None:
    """out (BH', C, e) = [φ(x)(c ⊙ S) numerator, denominator], unfinished."""
    den = torch.empty(out.shape[:-1], dtype=torch.float32, device=out.device)
    _apply(x, state, lay, out[..., :-1], den=den, dot=dot, finish=False)
    out[..., -1] = den


def _intra(q: Tensor, k: Tensor, u: Tensor) -> Tensor:
    """Causal (C × C) blocks: q (BH, m, C, d), k (BH, m, C, d), u (BH, m, C, e)."""
    w = taylor_weight(q @ k.transpose(-2, -1), 2)
    c = q.shape[-2]
    causal = torch.ones((c, c), dtype=torch.bool, device=q.device).tril()
    return w.masked_fill(~causal, 0.0) @ u


def _intra_grad(q: Tensor, k: Tensor, u: Tensor, g: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of ``_intra``'s q, k, u from g (BH, m, C, e): with s = q kᵀ,
    W = tril(1 + s + s²/2), Y = W u: gu = Wᵀ g, gs = tril(g uᵀ) ⊙ (1 + s), gq = gs k,
    gk = gsᵀ q."""
    s = q @ k.transpose(-2, -1)
    c = q.shape[-2]
    causal = torch.ones((c, c), dtype=torch.bool, device=q.device).tril()
    w = taylor_weight(s, 2).masked_fill(~causal, 0.0)
    gs = (g @ u.transpose(-2, -1)).masked_fill(~causal, 0.0) * (1.0 + s)
    return gs @ k, gs.transpose(-2, -1) @ q, w.transpose(-2, -1) @ g


# The core as custom ops with fake (meta) implementations and a registered autograd
# formula, so that torch.compile traces through it (the kernel launches stay opaque).


@torch.library.custom_op("taylorshift::triton_causal_forward", mutates_args=())
def triton_causal_forward(q: Tensor, k: Tensor, u: Tensor, chunk: int, dot: int) -> Tensor:
    """Y' (BH, Nq, e) from q' (BH, Nq, d), k' (BH, Nk, d), u (BH, Nk, e), all float32;
    ``dot``: how the kernels multiply (``efficient.dot_kind`` of the inputs' dtype)."""
    bh, nq, d = q.shape
    nk, e = u.shape[1], u.shape[2]
    lay = layout(d, e - 1)  # u = [v·m, m]: its last column is the kernels' own r column
    ncq, nck = triton.cdiv(nq, chunk), triton.cdiv(nk, chunk)
    qc, kc, uc = _chunks(q, ncq, chunk), _chunks(k, nck, chunk), _chunks(u, nck, chunk)

    states = _state(kc, *_split(uc), 2, lay, dot).view(bh, nck, lay.size)
    prefix = _prefix(states, ncq)  # (BH·ncq, size)
    y = torch.empty((bh * ncq, chunk, e), dtype=torch.float32, device=q.device)
    _apply_split(qc, prefix, lay, y, dot)
    y = y.view(bh, ncq, chunk, e)
    m = min(ncq, nck)
    shape = (bh, -1, chunk)
    y[:, :m] += _intra(
        qc.view(*shape, d)[:, :m], kc.view(*shape, d)[:, :m], uc.view(*shape, e)[:, :m]
    )
    return y.reshape(bh, ncq * chunk, e)[:, :nq].contiguous()


@triton_causal_forward.register_fake
def _(q, k, u, chunk, dot):
    return q.new_empty((q.shape[0], q.shape[1], u.shape[2]), dtype=torch.float32)


@torch.library.custom_op("taylorshift::triton_causal_backward", mutates_args=())
def triton_causal_backward(
    grad: Tensor, q: Tensor, k: Tensor, u: Tensor, chunk: int, dot: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of q', k' and u from the gradient of Y' (all float32)."""
    bh, nq, d = q.shape
    nk, e = u.shape[1], u.shape[2]
    lay = layout(d, e - 1)
    ncq, nck = triton.cdiv(nq, chunk), triton.cdiv(nk, chunk)
    qc, kc, uc = _chunks(q, ncq, chunk), _chunks(k, nck, chunk), _chunks(u, nck, chunk)
    gc = _chunks(grad.float(), ncq, chunk)

    # Inter-chunk part, query side: ∂/∂q' of gY'·φ(q')(c ⊙ P_c).
    states = _state(kc, *_split(uc), 2, lay, dot).view(bh, nck, lay.size)
    prefix = _prefix(states, ncq)
    del states
    gq = _grad(qc, *_split(gc), 2, prefix, lay, dot)
    del prefix
    # Key side: R_c = Σ_{c' > c} φ(q'_c')ᵀ gY'_c'.
    q_states = _state(qc, *_split(gc), 2, lay, dot).view(bh, ncq, lay.size)
    suffix = _suffix(q_states, nck)
    del q_states
    gu = torch.empty_like(uc)
    _apply_split(kc, suffix, lay, gu, dot)
    gk = _grad(kc, *_split(uc), 2, suffix, lay, dot)
    del suffix

    # Intra-chunk part: the (C × C) blocks differentiated by hand (autograd does not record
    # inside a custom op).
    m = min(ncq, nck)
    shape = (bh, -1, chunk)
    gq, gk, gu = gq.view(*shape, d), gk.view(*shape, d), gu.view(*shape, e)
    blocks = [x.view(*shape, x.shape[-1])[:, :m] for x in (qc, kc, uc)]
    g_intra = _intra_grad(*blocks, gc.view(*shape, e)[:, :m])
    gq[:, :m] += g_intra[0]
    gk[:, :m] += g_intra[1]
    gu[:, :m] += g_intra[2]
    return (
        gq.reshape(bh, -1, d)[:, :nq].contiguous(),
        gk.reshape(bh, -1, d)[:, :nk].contiguous(),
        gu.reshape(bh, -1, e)[:, :nk].contiguous(),
    )


@triton_causal_backward.register_fake
def _(grad, q, k, u, chunk, dot):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(u)


def _setup_causal(ctx, inputs, output):
    q, k, u, chunk, dot = inputs
    ctx.save_for_backward(q, k, u)
    ctx.chunk, ctx.dot = chunk, dot


def _backward_causal(ctx, grad):
    q, k, u = ctx.saved_tensors
    if wants_graph():  # create_graph=True: the core's sums in plain ops, differentiable again
        grads = graph_grads(
            lambda q, k, u: taylor_sums(q, k, u, True).to(u.dtype),
            grad, (q, k, u), ctx.needs_input_grad[:3],
        )  # fmt: skip
        return (*grads, None, None)
    gq, gk, gu = triton_causal_backward(grad.contiguous(), q, k, u, ctx.chunk, ctx.dot)
    return gq, gk, gu, None, None


triton_causal_forward.register_autograd(_backward_causal, setup_context=_setup_causal)


def _prefix(states: Tensor, ncq: int) -> Tensor:
    """P_c = Σ_{c' < c} S_c' for the query chunks c < ncq: (BH·ncq, size) float32."""
    bh, nck, size = states.shape
    cum = torch.cat([states.new_zeros((bh, 1, size)), states.cumsum(1)], dim=1)
    index = torch.arange(ncq, device=states.device).clamp(max=nck)
    return cum[:, index].reshape(bh * ncq, size).contiguous()


def _suffix(q_states: Tensor, nck: int) -> Tensor:
    """R_c = Σ_{c' > c} Q_c' for the key chunks c < nck: (BH·nck, size) float32."""
    bh, ncq, size = q_states.shape
    rev = q_states.flip(1).cumsum(1).flip(1)  # Σ_{c' >= c}
    rev = torch.cat([rev, rev.new_zeros((bh, 1, size))], dim=1)
    index = (torch.arange(nck, device=q_states.device) + 1).clamp(max=ncq)
    return rev[:, index].reshape(bh * nck, size).contiguous()


def triton_causal_efficient_taylor_shift(
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
) -> Tensor:
    """Causal efficient TaylorShift on the fused Triton kernels, on validated inputs.

    Same contract and signature as
    ``taylorshift.ops.taylor_shift.efficient_causal.causal_efficient_taylor_shift``:
    query (B, H, Nq, d), key (B, H, Nk, d), value (B, H, Nk, dv), key_mask (B, H, Nk) bool
    (broadcast views are fine) or None; query i attends key j iff j <= i. Returns
    (B, H, Nq, dv) in query's dtype; sums in float32, float64 refused. Differentiable in
    query, key, value and a tensor temperature. ``chunk_size`` defaults to DEFAULT_CHUNK.
    A state to continue from or to return (``initial_state``, ``output_final_state``) is
    not supported yet: the torch form computes those calls (the public op routes them
    there).
    """
    if initial_state is not None or output_final_state:
        raise NotImplementedError(
            "the Triton causal form neither continues nor returns a TaylorShiftState; use "
            "causal_efficient_taylor_shift (taylor_shift_attention routes such calls there)"
        )
    check_kernel_inputs(query, "causal efficient form")
    b, h, nq, d = query.shape
    nk = key.shape[2]
    chunk = chunk_size or DEFAULT_CHUNK
    qp, kp = scaled_inputs(query, key, temperature, scale, normalize)
    v = value.to(torch.float32)
    if key_mask is None:
        ones = v.new_ones((*v.shape[:-1], 1))
        u = torch.cat([v, ones], dim=-1)
    else:
        m = key_mask.expand(b, h, nk).to(torch.float32).unsqueeze(-1)
        u = torch.cat([v * m, m], dim=-1)
    y_prime = triton_causal_forward(
        _flat(qp),
        _flat(kp),
        _flat(u),
        chunk,
        dot_kind(query.dtype),
    ).reshape(b, h, nq, -1)
    count = causal_count(key_mask, nq, nk, torch.float32, query.device)
    y, _ = finish_outputs(y_prime, count, normalize, d)
    return y.to(query.dtype)


__all__ = ["DEFAULT_CHUNK", "triton_causal_efficient_taylor_shift"]
