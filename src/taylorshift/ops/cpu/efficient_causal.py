"""Efficient TaylorShift, causal, with the CPU kernels: forward and backward, each one C
call (``efficient_causal.c``).

The algorithm of ``taylorshift.ops.taylor_shift.efficient_causal`` (SPEC §2.3), chunk by
chunk of C tokens:

    Y'  = φ(q') S_<i0                        keys before the chunk: ts_readout
        + w(q' k'ᵀ ⊙ tril) [v, 1]             keys inside it: the direct kernel's raw block
    S  += c ⊙ φ(k'_chunk)ᵀ [v, 1]_chunk       then the chunk joins the prefix: ts_state

Backward, as the PyTorch form's: a forward sweep rebuilds S_<i0 and gives ∂q' from it
(ts_pair_grad) and the intra-chunk gradients (the direct kernel's raw backward); a reverse
sweep accumulates G_>c = c ⊙ Σ_{c' > c} φ(q'_c')ᵀ ∂Y'_c' (ts_state) and gives ∂v = φ(k') G
(ts_readout) and ∂k' (ts_pair_grad). The chunk loop itself runs in C
(``ts_causal_forward``, ``ts_causal_backward``): in Python its few dozen tensor operations
a chunk cost more than the products at d <= 32. No prefix state is stored. No initial or
final state (those calls run the PyTorch form). Two wrappers share the passes, as in
``efficient.py``: ``CpuCausalEfficientFunction`` (eager) and the custom ops
``taylorshift::cpu_causal_efficient_forward`` / ``_backward`` (``torch.compile``).
"""

from __future__ import annotations

from typing import Optional  # custom_op reads Optional[Tensor] from annotations

import torch
from torch import Tensor

from ..taylor_shift.features import NORM_EPS, split_factor
from .build import library
from .efficient import (
    c_operand,
    check_kernel_inputs,
    checked,
    factor_grad,
    flat_mask,
    float32_empty,
    grad_buffers,
    head_factors,
    input_grads,
    kernel_threads,
    ptr,
    traced_factors,
)


def default_chunk(d: int) -> int:
    """Tokens per chunk when the caller names none: the intra-chunk blocks cost ∝ N·C, the
    state products do not depend on C, and with the loop in C a chunk costs a few kernel
    calls, so the best C grows with d: 128 up to d = 16 (1.12-1.18× faster than 256),
    256 up to 32 (level with 128), 512 above (1.02-1.33× at d = 64;
    benchmarks/op_cpu/efficient-passes/chunks.txt)."""
    return 128 if d <= 16 else 256 if d <= 32 else 512


def causal_forward_pass(
    query: Tensor, key: Tensor, value: Tensor, key_mask: Tensor | None, factors: Tensor | None,
    normalize: bool, chunk: int, factor: float = 1.0,
) -> tuple[Tensor, ...]:  # fmt: skip
    """y (B, H, Nq, dv) in value's dtype and what the backward needs besides the inputs:
    (y, the key mask as uint8 (B·H, Nk) or None, the denominators (B·H, Nq), the counts n_i
    (B·H, Nq)), float32. ``factors`` (B·H,) float32 or None for the float ``factor``."""
    b, h, nq, d = query.shape
    nk, dv = key.shape[2], value.shape[3]
    bh = b * h
    # (every tensor whose address goes to C is held by a name until the call returns)
    q, k, v = c_operand(query), c_operand(key), c_operand(value)
    mask = flat_mask(key_mask, b, h, nk)
    out, den, count = float32_empty(b, h, nq, dv), float32_empty(bh, nq), float32_empty(bh, nq)
    checked(library().ts_causal_forward(
        bh, nq, nk, d, dv, ptr(q), ptr(k), ptr(v), ptr(mask), ptr(factors), factor,
        int(normalize), NORM_EPS, chunk, ptr(out), ptr(den), ptr(count), kernel_threads(),
    ))  # fmt: skip
    y = out if value.dtype == torch.float32 else out.to(value.dtype)
    return y, mask, den, count


def causal_backward_pass(
    grad_out: Tensor, query: Tensor, key: Tensor, value: Tensor, factors: Tensor | None,
    normalize: bool, chunk: int, saved: tuple[Tensor, ...], need_factor: bool,
    factor: float = 1.0,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:  # fmt: skip
    """Gradients of query, key, value (each in its dtype) and, with ``need_factor``, of the
    per-head factor (B·H,) float32; ``saved`` is ``causal_forward_pass``'s output."""
    y, mask, den, count = saved
    b, h, nq, d = query.shape
    nk, dv = key.shape[2], value.shape[3]
    bh = b * h
    q, k, v = c_operand(query), c_operand(key), c_operand(value)
    g, y32 = c_operand(grad_out), c_operand(y)
    gq, gk, gv, g_factor = grad_buffers(query, key, value, need_factor)
    checked(library().ts_causal_backward(
        bh, nq, nk, d, dv, ptr(q), ptr(k), ptr(v), ptr(mask), ptr(factors), factor,
        int(normalize), NORM_EPS, chunk, ptr(g), ptr(y32), ptr(den), ptr(count), ptr(gq),
        ptr(gk), ptr(gv), ptr(g_factor), kernel_threads(),
    ))  # fmt: skip
    return (*input_grads((gq, gk, gv), (query, key, value)), g_factor)


class CpuCausalEfficientFunction(torch.autograd.Function):
    """The eager wrapper of the two passes, the temperature's gradient included."""

    @staticmethod
    def forward(ctx, query, key, value, temperature, factor, normalize, key_mask, chunk):
        b, h = query.shape[:2]
        # a float factor goes to C as a scalar (one tensor fewer per call)
        factors = None if temperature is None else head_factors(temperature, factor, b, h)
        y, mask, den, count = causal_forward_pass(
            query, key, value, key_mask, factors, normalize, chunk, factor
        )
        ctx.save_for_backward(query, key, value, temperature, factors, y, den, count)
        ctx.mask, ctx.normalize, ctx.chunk, ctx.factor = mask, normalize, chunk, factor
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        query, key, value, temperature, factors, y, den, count = ctx.saved_tensors
        need_t = ctx.needs_input_grad[3]
        gq, gk, gv, g_factor = causal_backward_pass(
            grad_out, query, key, value, factors, ctx.normalize, ctx.chunk,
            (y, ctx.mask, den, count), need_t, ctx.factor,
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
    return (
        query.new_empty((b, h, nq, value.shape[3]), dtype=value.dtype),
        query.new_empty((b * h, nq), dtype=f32),
        query.new_empty((b * h, nq), dtype=f32),
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
    (sums in float32). ``chunk_size``: tokens per chunk (default: ``default_chunk(d)``).
    """
    check_kernel_inputs(query, value, "causal efficient form")
    temperature, factor = split_factor(temperature, scale, normalize, query.shape[-1])
    chunk = chunk_size or default_chunk(query.shape[-1])
    if not torch.compiler.is_compiling():
        return CpuCausalEfficientFunction.apply(
            query, key, value, temperature, factor, normalize, key_mask, chunk
        )
    factors = traced_factors(query, temperature, factor)
    return cpu_causal_efficient_forward(query, key, value, key_mask, factors, normalize, chunk)[0]
