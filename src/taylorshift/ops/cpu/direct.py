"""Direct TaylorShift in CPU kernels (``direct.c``): forward and backward, key padding and
causal, for the short sequences where the direct form is the faster one.

Layout (B, H, N, d). ``ts_direct_forward`` computes, per head and tile of 64 query rows,
the scores q'k'ᵀ, the weights 1 + s + s²/2 on the attended pairs, their row sums and the
weighted values, finished by sqrt(n/d)/den; ``ts_direct_backward`` recomputes each tile's
scores and gives the gradients w.r.t. q, k, v and the temperature (docs/cpu-kernel.md).
The maps q -> q' = τ q/‖q‖, k -> k' and their backward run inside both (``rows.h``, shared
with ``efficient.c``). Sums in float32 (float16 and bfloat16 inputs
are converted); float64 stays on the PyTorch form.

Two wrappers share the passes: ``CpuDirectFunction`` (an autograd.Function, for eager calls)
and the ``torch.library`` custom ops ``taylorshift::cpu_direct_forward`` / ``_backward``,
which ``torch.compile`` keeps in its graph as opaque calls.
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


def forward_pass(
    query: Tensor, key: Tensor, value: Tensor, key_mask: Tensor | None, factors: Tensor,
    normalize: bool, is_causal: bool,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """(y (B, H, Nq, dv) in value's dtype, the denominators (B·H, Nq), the attended-key
    counts (B·H, Nq)), float32. ``key_mask`` (B, H, Nk) bool (broadcast views too) or None;
    ``factors`` (B·H,) float32, the query's factor per head."""
    b, h, nq, d = query.shape
    nk, dv = key.shape[2], value.shape[3]
    bh = b * h
    # (every tensor whose address goes to C is held by a name until the call returns)
    q, k, v = c_operand(query), c_operand(key), c_operand(value)
    mask = flat_mask(key_mask, b, h, nk)
    out, den, count = float32_empty(b, h, nq, dv), float32_empty(bh, nq), float32_empty(bh, nq)
    checked(library().ts_direct_forward(bh, nq, nk, d, dv, ptr(q), ptr(k), ptr(v), ptr(factors),
                                ptr(mask), int(is_causal), int(normalize), NORM_EPS, 0,
                                ptr(out), ptr(den), ptr(count), kernel_threads()))  # fmt: skip
    return (out if value.dtype == torch.float32 else out.to(value.dtype)), den, count


def backward_pass(
    grad_out: Tensor, query: Tensor, key: Tensor, value: Tensor, key_mask: Tensor | None,
    factors: Tensor, normalize: bool, is_causal: bool, y: Tensor, den: Tensor, count: Tensor,
    need_factor: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:  # fmt: skip
    """Gradients of query, key, value (each in its dtype) and, with ``need_factor``, of the
    per-head factor (B·H,) float32, from the gradient of y and ``forward_pass``'s output."""
    b, h, nq, d = query.shape
    nk, dv = key.shape[2], value.shape[3]
    bh = b * h
    q, k, v = c_operand(query), c_operand(key), c_operand(value)
    g_out, y32 = c_operand(grad_out), c_operand(y)
    mask = flat_mask(key_mask, b, h, nk)
    gq, gk, gv, g_factor = grad_buffers(query, key, value, need_factor)
    checked(library().ts_direct_backward(bh, nq, nk, d, dv, ptr(q), ptr(k), ptr(v), ptr(factors),
                                 ptr(mask), int(is_causal), int(normalize), NORM_EPS, 0,
                                 ptr(g_out), ptr(y32), ptr(den), ptr(count), ptr(gq), ptr(gk),
                                 ptr(gv), ptr(g_factor), kernel_threads()))  # fmt: skip
    return (*input_grads((gq, gk, gv), (query, key, value)), g_factor)


class CpuDirectFunction(torch.autograd.Function):
    """The eager wrapper: forward and backward passes of the kernels, the temperature's
    gradient included."""

    @staticmethod
    def forward(ctx, query, key, value, temperature, factor, normalize, key_mask, is_causal):
        b, h = query.shape[:2]
        factors = head_factors(temperature, factor, b, h)
        y, den, count = forward_pass(query, key, value, key_mask, factors, normalize, is_causal)
        ctx.save_for_backward(query, key, value, temperature, factors, y, den, count)
        ctx.key_mask, ctx.normalize, ctx.is_causal = key_mask, normalize, is_causal
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        query, key, value, temperature, factors, y, den, count = ctx.saved_tensors
        need_t = ctx.needs_input_grad[3]
        gq, gk, gv, g_factor = backward_pass(
            grad_out, query, key, value, ctx.key_mask, factors, ctx.normalize, ctx.is_causal,
            y, den, count, need_t,
        )  # fmt: skip
        b, h = query.shape[:2]
        gt = factor_grad(g_factor, temperature, b, h) if need_t else None
        return gq, gk, gv, gt, None, None, None, None


# The same passes as torch.library custom ops, for torch.compile (one opaque call each way).


@torch.library.custom_op("taylorshift::cpu_direct_forward", mutates_args=())
def cpu_direct_forward(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_mask: Optional[Tensor],  # noqa: UP045
    factors: Tensor,
    normalize: bool,
    is_causal: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """``forward_pass``: (y, denominators, counts)."""
    return forward_pass(query, key, value, key_mask, factors, normalize, is_causal)


@cpu_direct_forward.register_fake
def _(query, key, value, key_mask, factors, normalize, is_causal):
    b, h, nq, _ = query.shape
    f32 = torch.float32
    return (
        query.new_empty((b, h, nq, value.shape[3]), dtype=value.dtype),
        query.new_empty((b * h, nq), dtype=f32),
        query.new_empty((b * h, nq), dtype=f32),
    )


@torch.library.custom_op("taylorshift::cpu_direct_backward", mutates_args=())
def cpu_direct_backward(
    grad_out: Tensor,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_mask: Optional[Tensor],  # noqa: UP045
    factors: Tensor,
    normalize: bool,
    is_causal: bool,
    y: Tensor,
    den: Tensor,
    count: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``backward_pass``: gradients of query, key, value and the per-head factors."""
    return backward_pass(grad_out, query, key, value, key_mask, factors, normalize, is_causal,
                         y, den, count, True)  # fmt: skip


@cpu_direct_backward.register_fake
def _(grad_out, query, key, value, key_mask, factors, normalize, is_causal, y, den, count):
    return tuple(x.new_empty(x.shape) for x in (query, key, value, factors))


def _setup_context(ctx, inputs, output):
    query, key, value, key_mask, factors, normalize, is_causal = inputs
    y, den, count = output
    ctx.save_for_backward(query, key, value, key_mask, factors, y, den, count)
    ctx.normalize, ctx.is_causal = normalize, is_causal
    ctx.mark_non_differentiable(den, count)


def _backward(ctx, grad_out, *_unused):
    query, key, value, key_mask, factors, y, den, count = ctx.saved_tensors
    gq, gk, gv, g_factor = cpu_direct_backward(
        grad_out.contiguous(), query, key, value, key_mask, factors, ctx.normalize,
        ctx.is_causal, y, den, count,
    )  # fmt: skip
    return gq, gk, gv, None, g_factor, None, None


cpu_direct_forward.register_autograd(_backward, setup_context=_setup_context)


def cpu_direct_taylor_shift(
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
    """Direct TaylorShift in CPU kernels, on validated inputs.

    Same contract and signature as
    ``taylorshift.ops.taylor_shift.direct.direct_taylor_shift`` for what the kernels take:
    query (B, H, Nq, d), key (B, H, Nk, d), value (B, H, Nk, dv); ``mask`` None or a
    key-padding mask (B or 1, H or 1, 1, Nk) bool; causal or not; order 2. Returns
    (B, H, Nq, dv) in value's dtype. CPU tensors of float32, float16 or bfloat16 (sums in
    float32); float64 is refused (use the torch form). Differentiable in query, key, value
    and a tensor temperature. Under ``torch.compile`` the custom ops run; eagerly,
    ``CpuDirectFunction``.
    """
    check_kernel_inputs(query, value, "direct form")
    if order != 2:
        raise ValueError(f"order must be 2 for the CPU direct kernel; got {order} (use the "
                         "torch direct form)")  # fmt: skip
    if mask is not None and (mask.dim() != 4 or mask.shape[2] != 1):
        raise ValueError(
            "mask must be a key-padding mask (B, H, 1, Nk) for the CPU direct kernel; got "
            f"shape {tuple(mask.shape)} (masks that vary over queries: the torch direct form)"
        )
    key_mask = None if mask is None else mask[:, :, 0, :]
    temperature, factor = split_factor(temperature, scale, normalize, query.shape[-1])
    if not torch.compiler.is_compiling():
        return CpuDirectFunction.apply(query, key, value, temperature, factor, normalize,
                                       key_mask, is_causal)  # fmt: skip
    b, h = query.shape[:2]
    factors = traced_factors(query, temperature, factor)
    mask3 = None if key_mask is None else key_mask.expand(b, h, key.shape[2])
    return cpu_direct_forward(query, key, value, mask3, factors, normalize, is_causal)[0]
