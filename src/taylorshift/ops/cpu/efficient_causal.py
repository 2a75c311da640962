"""Efficient TaylorShift, causal, with the CPU kernels (``efficient.c``) for its feature
products: forward and backward.

The algorithm of ``taylorshift.ops.taylor_shift.efficient_causal`` (SPEC §2.3), chunk by
chunk of C tokens:

    Y'  = φ(q') S_<i0                        keys before the chunk: ts_readout
        + w(q' k'ᵀ ⊙ tril) [v, 1]             keys inside it: the direct kernel's block
    S  += c ⊙ φ(k'_chunk)ᵀ [v, 1]_chunk       then the chunk joins the prefix: ts_state

Backward, as the PyTorch form's: a forward sweep rebuilds S_<i0 and gives ∂q' from it
(ts_pair_grad) and the intra-chunk gradients (``direct.block_sums_grad``); a reverse sweep
accumulates G_>c = c ⊙ Σ_{c' > c} φ(q'_c')ᵀ ∂Y'_c' (ts_state) and gives ∂v = φ(k') G
(ts_readout) and ∂k' (ts_pair_grad). q -> q' and k -> k' and their backward are C loops
(``ts_scale_rows``). No prefix state is stored. No initial or final state (those calls
run the PyTorch form). Two wrappers share the passes, as in ``efficient.py``:
``CpuCausalEfficientFunction`` (eager) and the custom ops
``taylorshift::cpu_causal_efficient_forward`` / ``_backward`` (``torch.compile``).
"""

from __future__ import annotations

from typing import Optional  # custom_op reads Optional[Tensor] from annotations

import torch
from torch import Tensor

from ..taylor_shift.efficient import finish_outputs, grad_outputs
from ..taylor_shift.efficient_causal import DEFAULT_CAUSAL_CHUNK, causal_count
from ..taylor_shift.features import NORM_EPS, split_factor
from .build import library
from .direct import block_sums, block_sums_grad
from .efficient import (
    check_kernel_inputs,
    checked,
    factor_grad,
    flat32,
    flat_mask,
    head_factors,
    input_grads,
    kernel_threads,
    ptr,
    scaled_rows,
    state_shape,
    traced_factors,
)


def _operands(
    query: Tensor, key: Tensor, value: Tensor, factors: Tensor, normalize: bool,
    mask: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """What both sweeps read, float32 (B·H, N, ·): q', k', v and [v·m, m] (the values with
    the ones column, masked keys zero, for the intra-chunk blocks)."""
    qp, kp = scaled_rows(query, factors, normalize), scaled_rows(key, None, normalize)
    v = flat32(value)
    with_ones = torch.cat([v, v.new_ones((*v.shape[:-1], 1))], dim=-1)
    vo = with_ones if mask is None else with_ones * mask.unsqueeze(-1)
    return qp, kp, v, vo


def _flat_count(count: Tensor, bh: int) -> Tensor:
    """n_i as (B·H, Nq) or (Nq,) (no mask: the same for every head)."""
    return count if count.dim() == 1 else count.reshape(bh, -1)


def _rows(t: Tensor, i0: int, i1: int) -> Tensor:
    """Tokens [i0, i1) of a (B·H, N, k) tensor, contiguous (the kernels' layout)."""
    return t[:, i0:i1].contiguous()


def _add_keys(
    state: Tensor, kp: Tensor, v: Tensor, mask: Tensor | None, j0: int, j1: int, accumulate: bool
) -> None:
    """state (B·H, rows, cols) (+)= c ⊙ Σ φ(k'_j)ᵀ [v_j·m_j, m_j] over keys [j0, j1)."""
    bh, _, d = kp.shape
    k_c, v_c = _rows(kp, j0, j1), _rows(v, j0, j1)
    m_c = None if mask is None else _rows(mask, j0, j1)
    checked(library().ts_state(bh, j1 - j0, d, ptr(k_c), ptr(v_c), v.shape[-1], 1, ptr(m_c),
                               ptr(state), int(accumulate), kernel_threads()))  # fmt: skip


def causal_forward_pass(
    query: Tensor, key: Tensor, value: Tensor, key_mask: Tensor | None, factors: Tensor,
    normalize: bool, chunk: int,
) -> tuple[Tensor, ...]:  # fmt: skip
    """y (B, H, Nq, dv) in value's dtype and what the backward needs besides the inputs:
    (y, the key mask as uint8 (B·H, Nk) or None, the denominators (B·H, Nq), the counts
    n_i ((B·H, Nq) or (Nq,))), float32."""
    lib, threads = library(), kernel_threads()
    b, h, nq, d = query.shape
    nk, dv = key.shape[2], value.shape[3]
    bh = b * h
    rows, cols = state_shape(d, dv + 1)
    mask = flat_mask(key_mask, b, h, nk)
    qp, kp, v, vo = _operands(query, key, value, factors, normalize, mask)
    count = _flat_count(causal_count(key_mask, nq, nk, torch.float32, query.device), bh)
    state = torch.empty((bh, rows, cols))
    have_state = False
    out = torch.empty((bh, nq, dv))
    den = torch.empty((bh, nq))
    for i0 in range(0, max(nq, nk), chunk):
        i1 = min(i0 + chunk, max(nq, nk))
        if i0 < nq:
            q1 = min(i1, nq)
            q = _rows(qp, i0, q1)
            y_prime = torch.zeros((bh, q1 - i0, dv + 1))
            if have_state:
                lib.ts_readout(bh, q1 - i0, d, ptr(q), ptr(state), cols, ptr(y_prime),
                               dv + 1, None, None, 0, None, threads)  # fmt: skip
            if i0 < nk:
                ck = min(q1, nk) - i0  # the chunk's keys its queries can attend
                keys, values = _rows(kp, i0, i0 + ck), _rows(vo, i0, i0 + ck)
                y_prime += block_sums(q, keys, values, True)
            y, den[:, i0:q1] = finish_outputs(y_prime, count[..., i0:q1], normalize, d)
            out[:, i0:q1] = y
        if i0 < nk and i1 < nq:  # later queries attend this chunk through the state
            _add_keys(state, kp, v, mask, i0, min(i1, nk), have_state)
            have_state = True
    return out.view(b, h, nq, dv).to(value.dtype), mask, den, count


def causal_backward_pass(
    grad_out: Tensor, query: Tensor, key: Tensor, value: Tensor, factors: Tensor,
    normalize: bool, chunk: int, saved: tuple[Tensor, ...], need_factor: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:  # fmt: skip
    """Gradients of query, key, value (each in its dtype) and, with ``need_factor``, of the
    per-head factor (B·H,) float32; ``saved`` is ``causal_forward_pass``'s output."""
    y, mask, den, count = saved
    lib, threads = library(), kernel_threads()
    b, h, nq, d = query.shape
    nk, dv = key.shape[2], value.shape[3]
    bh = b * h
    rows, cols = state_shape(d, dv + 1)
    qp, kp, v, vo = _operands(query, key, value, factors, normalize, mask)
    g_y = grad_outputs(flat32(grad_out), flat32(y), den, count, normalize, d).contiguous()
    g_qp = torch.zeros((bh, nq, d))
    g_kp = torch.zeros((bh, nk, d))
    g_vo = torch.zeros((bh, nk, dv + 1))
    span = max(nq, nk)

    # Forward sweep: the prefix state again; ∂q' through it and the intra-chunk block.
    state = torch.empty((bh, rows, cols))
    have_state = False
    for i0 in range(0, span, chunk):
        i1 = min(i0 + chunk, span)
        if i0 < nq:
            q1 = min(i1, nq)
            q, g = _rows(qp, i0, q1), _rows(g_y, i0, q1)
            if have_state:
                part = torch.empty((bh, q1 - i0, d))
                checked(lib.ts_pair_grad(bh, q1 - i0, d, ptr(q), ptr(g), dv + 1, 0, None,
                                         ptr(state), cols, ptr(part), threads))  # fmt: skip
                g_qp[:, i0:q1] += part
            if i0 < nk:
                ck = min(q1, nk) - i0
                keys, values = _rows(kp, i0, i0 + ck), _rows(vo, i0, i0 + ck)
                iq, ik, iv = block_sums_grad(q, keys, values, g, True)
                g_qp[:, i0:q1] += iq
                g_kp[:, i0 : i0 + ck] += ik
                g_vo[:, i0 : i0 + ck] += iv
        if i0 < nk and i1 < nq:
            _add_keys(state, kp, v, mask, i0, min(i1, nk), have_state)
            have_state = True

    # Reverse sweep: G_>c, the gradient of the state chunk c feeds, gives the key side.
    grad_state = torch.empty((bh, rows, cols))
    have_grad = False
    for i0 in reversed(range(0, span, chunk)):
        i1 = min(i0 + chunk, span)
        if i0 < nk and have_grad:
            j1 = min(i1, nk)
            k_c, v_c = _rows(kp, i0, j1), _rows(v, i0, j1)
            m_c = None if mask is None else _rows(mask, i0, j1)
            part_v = torch.empty((bh, j1 - i0, dv))
            lib.ts_readout(bh, j1 - i0, d, ptr(k_c), ptr(grad_state), cols, ptr(part_v),
                           dv, ptr(m_c), None, 0, None, threads)  # fmt: skip
            g_vo[:, i0:j1, :dv] += part_v
            part_k = torch.empty((bh, j1 - i0, d))
            checked(lib.ts_pair_grad(bh, j1 - i0, d, ptr(k_c), ptr(v_c), dv, 1, ptr(m_c),
                                     ptr(grad_state), cols, ptr(part_k), threads))  # fmt: skip
            g_kp[:, i0:j1] += part_k
        if i0 < nq and i0 > 0:  # (chunk 0's queries feed no earlier keys)
            q1 = min(i1, nq)
            q, g = _rows(qp, i0, q1), _rows(g_y, i0, q1)
            checked(lib.ts_state(bh, q1 - i0, d, ptr(q), ptr(g), dv + 1, 0, None,
                                 ptr(grad_state), int(have_grad), threads))  # fmt: skip
            have_grad = True

    q32, k32 = flat32(query), flat32(key)
    gq, gk = torch.empty_like(q32), torch.empty_like(k32)
    g_factor = torch.empty(bh) if need_factor else None
    checked(lib.ts_scale_rows_grad(bh, nq, d, ptr(q32), ptr(g_qp), ptr(factors),
                                   int(normalize), NORM_EPS, ptr(gq), ptr(g_factor),
                                   threads))  # fmt: skip
    lib.ts_scale_rows_grad(bh, nk, d, ptr(k32), ptr(g_kp), None, int(normalize), NORM_EPS,
                           ptr(gk), None, threads)  # fmt: skip
    gv = g_vo[..., :dv]
    if mask is not None:
        gv = gv * mask.unsqueeze(-1)
    return (*input_grads((gq, gk, gv), (query, key, value)), g_factor)


class CpuCausalEfficientFunction(torch.autograd.Function):
    """The eager wrapper of the two passes, the temperature's gradient included."""

    @staticmethod
    def forward(ctx, query, key, value, temperature, factor, normalize, key_mask, chunk):
        b, h = query.shape[:2]
        factors = head_factors(temperature, factor, b, h)
        y, mask, den, count = causal_forward_pass(
            query, key, value, key_mask, factors, normalize, chunk
        )
        ctx.save_for_backward(query, key, value, temperature, factors, y, den, count)
        ctx.mask, ctx.normalize, ctx.chunk = mask, normalize, chunk
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        query, key, value, temperature, factors, y, den, count = ctx.saved_tensors
        need_t = ctx.needs_input_grad[3]
        gq, gk, gv, g_factor = causal_backward_pass(
            grad_out, query, key, value, factors, ctx.normalize, ctx.chunk,
            (y, ctx.mask, den, count), need_t,
        )  # fmt: skip
        b, h = query.shape[:2]
        gt = factor_grad(g_factor, temperature, b, h) if need_t else None
        return gq, gk, gv, gt, None, None, None, None


# The same passes as torch.library custom ops, for torch.compile (one opaque call each way).


@torch.library.custom_op("taylorshift::cpu_causal_efficient_forward", mutates_args=())
def cpu_causal_efficient_forward(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_mask: Optional[Tensor],  # noqa: UP045
    factors: Tensor,
    normalize: bool,
    chunk: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """``causal_forward_pass`` with the key mask (not returned) rebuilt by the backward:
    (y, denominators, counts)."""
    y, _, den, count = causal_forward_pass(query, key, value, key_mask, factors, normalize, chunk)
    return y, den, count


@cpu_causal_efficient_forward.register_fake
def _(query, key, value, key_mask, factors, normalize, chunk):
    b, h, nq, _ = query.shape
    f32 = torch.float32
    count_shape = (nq,) if key_mask is None else (b * h, nq)
    return (
        query.new_empty((b, h, nq, value.shape[3]), dtype=value.dtype),
        query.new_empty((b * h, nq), dtype=f32),
        query.new_empty(count_shape, dtype=f32),
    )


@torch.library.custom_op("taylorshift::cpu_causal_efficient_backward", mutates_args=())
def cpu_causal_efficient_backward(
    grad_out: Tensor,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_mask: Optional[Tensor],  # noqa: UP045
    factors: Tensor,
    normalize: bool,
    chunk: int,
    y: Tensor,
    den: Tensor,
    count: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``causal_backward_pass``: gradients of query, key, value and the per-head factors."""
    b, h = query.shape[:2]
    mask = flat_mask(key_mask, b, h, key.shape[2])
    return causal_backward_pass(
        grad_out, query, key, value, factors, normalize, chunk, (y, mask, den, count), True
    )


@cpu_causal_efficient_backward.register_fake
def _(grad_out, query, key, value, key_mask, factors, normalize, chunk, y, den, count):
    # contiguous, as the real op returns them
    return tuple(x.new_empty(x.shape) for x in (query, key, value, factors))


def _setup_context(ctx, inputs, output):
    query, key, value, key_mask, factors, normalize, chunk = inputs
    y, den, count = output
    ctx.save_for_backward(query, key, value, key_mask, factors, y, den, count)
    ctx.normalize, ctx.chunk = normalize, chunk
    ctx.mark_non_differentiable(den, count)


def _backward(ctx, grad_out, *_unused):
    query, key, value, key_mask, factors, y, den, count = ctx.saved_tensors
    gq, gk, gv, g_factor = cpu_causal_efficient_backward(
        grad_out.contiguous(), query, key, value, key_mask, factors, ctx.normalize, ctx.chunk,
        y, den, count,
    )  # fmt: skip
    return gq, gk, gv, None, g_factor, None, None


cpu_causal_efficient_forward.register_autograd(_backward, setup_context=_setup_context)


def cpu_causal_efficient_taylor_shift(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_mask: Tensor | None,
    temperature: Tensor | float,
    scale: float | None,
    normalize: bool,
    chunk_size: int | None = None,
) -> Tensor:
    """Causal efficient TaylorShift with the CPU kernels, on validated inputs.

    Same contract and signature as
    ``taylorshift.ops.taylor_shift.efficient_causal.causal_efficient_taylor_shift`` without
    its initial and final states: query (B, H, Nq, d), key (B, H, Nk, d), value
    (B, H, Nk, dv), key_mask (B, H, Nk) bool or None; query i attends key j iff j <= i.
    Returns (B, H, Nq, dv) in value's dtype. CPU tensors of float32, float16 or bfloat16
    (sums in float32). ``chunk_size``: tokens per chunk (default 256, as the PyTorch form).
    """
    check_kernel_inputs(query, value, "causal efficient form")
    temperature, factor = split_factor(temperature, scale, normalize, query.shape[-1])
    chunk = chunk_size or DEFAULT_CAUSAL_CHUNK
    if not torch.compiler.is_compiling():
        return CpuCausalEfficientFunction.apply(
            query, key, value, temperature, factor, normalize, key_mask, chunk
        )
    factors = traced_factors(query, temperature, factor)
    return cpu_causal_efficient_forward(query, key, value, key_mask, factors, normalize, chunk)[0]
