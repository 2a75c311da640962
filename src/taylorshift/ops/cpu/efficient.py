"""Efficient TaylorShift, non-causal, in fused CPU kernels (``efficient.c``): forward and
backward.

Layout (B, H, N, d). Three C kernels serve both passes (docs/cpu-kernel.md), each forming
the features φ(x) = [x_a x_b (a <= b), x, 1] inside its products, so that no (N, D) feature
block exists:

    ts_state      S = c ⊙ Σ_t φ(x_t)ᵀ u_t                a sum over tokens, (D, dv + 1)
    ts_readout    Y = φ(x_t) S                           per token, optionally finished
    ts_pair_grad  g_x = ∂/∂x_t (u_t · φ(x_t) S)          per token

with c = ½ on the diagonal pairs, 1 elsewhere. Forward: S from (k', [v·m, m]), then
y = Y[:dv] / Y[dv] · sqrt(n/d) from φ(q') S. Backward: R = c ⊙ Σ_i φ(q'_i)ᵀ gY'_i (the
state kernel on the query side), g_q' from S, g_v = m · φ(k') R, g_k' from R. The maps
q -> q' = τ q/‖q‖ and k -> k' (or the plain scale), their backward and the gradient
w.r.t. Y' = [numerator, denominator] are small C loops too (``ts_scale_rows``,
``ts_scale_rows_grad``, ``ts_output_grad``): at short N a dozen torch operations per pass
cost more than the products. Each pass is one C call (``ts_efficient_forward``,
``ts_efficient_backward``) that runs these kernels on its own scratch memory, so that the
Python side allocates only what it returns or saves. Sums in float32 (float16 and bfloat16
inputs are converted); float64 stays on the PyTorch form.

Two wrappers share the passes: ``CpuEfficientFunction`` (an autograd.Function: the eager
path, 0.2-0.3 ms cheaper per forward + backward than a custom op's dispatch) and the
``torch.library`` custom ops ``taylorshift::cpu_efficient_forward`` / ``_backward``, which
``torch.compile`` keeps in its graph as opaque calls.
"""

from __future__ import annotations

from typing import Optional  # custom_op reads Optional[Tensor] from annotations

import torch
from torch import Tensor

from ..taylor_shift.features import NORM_EPS, split_factor
from .build import library

TILE = 6  # pairs and value columns per register tile of efficient.c (its COLS)


def state_shape(d: int, width: int) -> tuple[int, int]:
    """(rows, columns) of one head's state in the kernels' layout: the D = (d+1)(d+2)/2
    pairs (a, b >= a) of [x, 1] row a by row a, packed, then zero pairs up to a multiple of
    6, and ``width`` value columns padded to a multiple of 6 (``ts_state_rows``,
    ``ts_state_cols`` of efficient.c)."""
    pairs = (d + 1) * (d + 2) // 2
    return -(-pairs // TILE) * TILE, -(-width // TILE) * TILE


def ptr(t: Tensor | None) -> int | None:
    """The address C reads (None: a NULL pointer). The tensor must stay referenced by a name
    until the call returns: a temporary (``ptr(x.contiguous())``) can be freed first."""
    return None if t is None else t.data_ptr()


def c_operand(t: Tensor) -> Tensor:
    """What C reads of a (B, H, N, k) operand: float32 and contiguous, i.e. (B·H, N, k) rows
    at the address. A float32 contiguous tensor is returned as it is (not even viewed: at
    short N each torch call counts, a view ~3 us)."""
    if t.dtype != torch.float32 or not t.is_contiguous():
        return t.to(torch.float32).contiguous()
    return t


def float32_empty(*shape: int) -> Tensor:
    """An uninitialised float32 tensor for a kernel to fill: float32 whatever torch's default
    dtype is (the kernels write float32), the sizes passed as ints (``torch.empty`` parses
    them faster than a tuple: ~1.5 against ~3.5 us a call)."""
    return torch.empty(*shape, dtype=torch.float32)


def checked(status: int) -> None:
    """Raise where a kernel reports that its scratch memory could not be allocated (status 1;
    0 is success)."""
    if status:
        raise MemoryError("the CPU kernels could not allocate their scratch memory")


def flat_mask(key_mask: Tensor | None, b: int, h: int, n: int) -> Tensor | None:
    """The key mask (B, H, N) bool (broadcast views too) as contiguous uint8 (B·H, N)."""
    if key_mask is None:
        return None
    return key_mask.expand(b, h, n).reshape(b * h, n).to(torch.uint8).contiguous()


def kernel_threads() -> int:
    """The kernels' OpenMP threads: torch's intra-op thread count."""
    return max(1, torch.get_num_threads())


def head_factors(temperature: Tensor | None, factor: float, b: int, h: int) -> Tensor:
    """The query-side factor per head, float32 (B·H,): τ (a tensor broadcasting to
    (B, H, 1, 1)) or the float ``factor``."""
    if temperature is None:
        return torch.full((b * h,), float(factor), dtype=torch.float32)
    return temperature.detach().to(torch.float32).expand(b, h, 1, 1).reshape(b * h).contiguous()


def forward_pass(
    query: Tensor, key: Tensor, value: Tensor, key_mask: Tensor | None, factors: Tensor | None,
    normalize: bool, factor: float = 1.0,
) -> tuple[Tensor, ...]:  # fmt: skip
    """y (B, H, Nq, dv) in value's dtype and what the backward needs besides the inputs:
    (y, the key mask as uint8 (B·H, Nk) or None, the attended-key counts (B·H,), the
    denominators (B·H, Nq), the weighted key state (B·H, rows, cols)), float32. ``factors``
    (B·H,) float32, the query's factor per head, or None for the float ``factor``. One C call
    (``ts_efficient_forward``); q' and k' live in its scratch memory and are recomputed by
    the backward (O(N d), saves 2·N·d floats per head)."""
    b, h, nq, d = query.shape
    nk, dv = key.shape[2], value.shape[3]
    bh = b * h
    # (every tensor whose address goes to C is held by a name until the call returns)
    q, k, v = c_operand(query), c_operand(key), c_operand(value)
    mask = flat_mask(key_mask, b, h, nk)
    state, count = float32_empty(bh, *state_shape(d, dv + 1)), float32_empty(bh)
    out, den = float32_empty(b, h, nq, dv), float32_empty(bh, nq)
    checked(library().ts_efficient_forward(
        bh, nq, nk, d, dv, ptr(q), ptr(k), ptr(v), ptr(mask), ptr(factors), factor,
        int(normalize), NORM_EPS, ptr(state), ptr(count), ptr(out), ptr(den), kernel_threads(),
    ))  # fmt: skip
    y = out if value.dtype == torch.float32 else out.to(value.dtype)
    return y, mask, count, den, state


def backward_pass(
    grad_out: Tensor, query: Tensor, key: Tensor, value: Tensor, factors: Tensor | None,
    normalize: bool, saved: tuple[Tensor, ...], need_factor: bool, factor: float = 1.0,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:  # fmt: skip
    """Gradients of query, key, value (each in its dtype) and, with ``need_factor``, of the
    per-head factor (B·H,) float32, from the gradient of y; ``saved`` is ``forward_pass``'s
    output. One C call (``ts_efficient_backward``)."""
    y, mask, count, den, state = saved
    b, h, nq, d = query.shape
    nk, dv = key.shape[2], value.shape[3]
    bh = b * h
    q, k, v = c_operand(query), c_operand(key), c_operand(value)
    g, y32 = c_operand(grad_out), c_operand(y)
    gq, gk, gv, g_factor = grad_buffers(query, key, value, need_factor)
    checked(library().ts_efficient_backward(
        bh, nq, nk, d, dv, ptr(q), ptr(k), ptr(v), ptr(mask), ptr(factors), factor,
        int(normalize), NORM_EPS, ptr(g), ptr(y32), ptr(den), ptr(count), ptr(state), ptr(gq),
        ptr(gk), ptr(gv), ptr(g_factor), kernel_threads(),
    ))  # fmt: skip
    return (*input_grads((gq, gk, gv), (query, key, value)), g_factor)


def grad_buffers(
    query: Tensor, key: Tensor, value: Tensor, need_factor: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """The float32 buffers a backward kernel fills: gradients of query, key and value in
    their shapes, and of the per-head factor (B·H,) or None without ``need_factor``."""
    g_factor = float32_empty(query.shape[0] * query.shape[1]) if need_factor else None
    return (
        float32_empty(*query.shape),
        float32_empty(*key.shape),
        float32_empty(*value.shape),
        g_factor,
    )


def input_grads(grads: tuple[Tensor, ...], inputs: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """The kernels' float32 gradients, allocated contiguous in their inputs' shapes, in the
    inputs' dtypes (contiguous, as the custom ops' fakes declare them)."""
    pairs = zip(grads, inputs, strict=True)
    return tuple(g if x.dtype == torch.float32 else g.to(x.dtype) for g, x in pairs)


def factor_grad(g_factor: Tensor, temperature: Tensor, b: int, h: int) -> Tensor:
    """The per-head factor's gradient (B·H,) summed to the temperature's shape and dtype."""
    return g_factor.view(b, h, 1, 1).sum_to_size(temperature.shape).to(temperature.dtype)


class CpuEfficientFunction(torch.autograd.Function):
    """The eager wrapper: forward and backward passes of the kernels, the temperature's
    gradient included."""

    @staticmethod
    def forward(ctx, query, key, value, temperature, factor, normalize, key_mask):
        b, h = query.shape[:2]
        # a float factor goes to C as a scalar (one tensor fewer per call)
        factors = None if temperature is None else head_factors(temperature, factor, b, h)
        saved = forward_pass(query, key, value, key_mask, factors, normalize, factor)
        y, mask, count, den, state = saved
        ctx.save_for_backward(query, key, value, temperature, factors, y, count, den, state)
        ctx.mask, ctx.normalize, ctx.factor = mask, normalize, factor  # never differentiated
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        query, key, value, temperature, factors, y, count, den, state = ctx.saved_tensors
        need_t = ctx.needs_input_grad[3]
        saved = (y, ctx.mask, count, den, state)
        gq, gk, gv, g_factor = backward_pass(
            grad_out, query, key, value, factors, ctx.normalize, saved, need_t, ctx.factor
        )
        b, h = query.shape[:2]
        gt = factor_grad(g_factor, temperature, b, h) if need_t else None
        return gq, gk, gv, gt, None, None, None


# The same passes as torch.library custom ops, for torch.compile (one opaque call each way).


@torch.library.custom_op("taylorshift::cpu_efficient_forward", mutates_args=())
def cpu_efficient_forward(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_mask: Optional[Tensor],  # noqa: UP045
    factors: Tensor,
    normalize: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``forward_pass`` with the key mask (not returned) rebuilt by the backward:
    (y, counts, denominators, state)."""
    y, _, count, den, state = forward_pass(query, key, value, key_mask, factors, normalize)
    return y, count, den, state


@cpu_efficient_forward.register_fake
def _(query, key, value, key_mask, factors, normalize):
    b, h, nq, d = query.shape
    dv = value.shape[3]
    f32 = torch.float32
    return (
        query.new_empty((b, h, nq, dv), dtype=value.dtype),
        query.new_empty((b * h,), dtype=f32),
        query.new_empty((b * h, nq), dtype=f32),
        query.new_empty((b * h, *state_shape(d, dv + 1)), dtype=f32),
    )


@torch.library.custom_op("taylorshift::cpu_efficient_backward", mutates_args=())
def cpu_efficient_backward(
    grad_out: Tensor,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_mask: Optional[Tensor],  # noqa: UP045
    factors: Tensor,
    normalize: bool,
    y: Tensor,
    count: Tensor,
    den: Tensor,
    state: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``backward_pass``: gradients of query, key, value and the per-head factors."""
    b, h = query.shape[:2]
    mask = flat_mask(key_mask, b, h, key.shape[2])
    saved = (y, mask, count, den, state)
    gq, gk, gv, g_factor = backward_pass(grad_out, query, key, value, factors, normalize, saved,
                                         True)  # fmt: skip
    return gq, gk, gv, g_factor


@cpu_efficient_backward.register_fake
def _(grad_out, query, key, value, key_mask, factors, normalize, y, count, den, state):
    # contiguous, as the real op returns them (empty_like would keep a transposed layout)
    return tuple(x.new_empty(x.shape) for x in (query, key, value, factors))


def _setup_context(ctx, inputs, output):
    query, key, value, key_mask, factors, normalize = inputs
    y, count, den, state = output
    ctx.save_for_backward(query, key, value, key_mask, factors, y, count, den, state)
    ctx.normalize = normalize
    ctx.mark_non_differentiable(count, den, state)


def _backward(ctx, grad_out, *_unused):
    query, key, value, key_mask, factors, y, count, den, state = ctx.saved_tensors
    gq, gk, gv, g_factor = cpu_efficient_backward(
        grad_out.contiguous(), query, key, value, key_mask, factors, ctx.normalize, y, count,
        den, state,
    )  # fmt: skip
    return gq, gk, gv, None, g_factor, None


cpu_efficient_forward.register_autograd(_backward, setup_context=_setup_context)


def cpu_efficient_taylor_shift(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_mask: Tensor | None,
    temperature: Tensor | float,
    scale: float | None,
    normalize: bool,
    chunk_size: int | None = None,
) -> Tensor:
    """Non-causal efficient TaylorShift in fused CPU kernels, on validated inputs.

    Same contract and signature as
    ``taylorshift.ops.taylor_shift.efficient.efficient_taylor_shift``: query (B, H, Nq, d),
    key (B, H, Nk, d), value (B, H, Nk, dv), key_mask (B, H, Nk) bool (broadcast views are
    fine) or None; returns (B, H, Nq, dv) in value's dtype. CPU tensors of float32, float16
    or bfloat16 (sums in float32); float64 is refused (use the torch form). Differentiable
    in query, key, value and a tensor temperature. ``chunk_size`` is not read (the kernels
    tile the tokens themselves). Builds the kernels on the first call (``build.library``).
    Under ``torch.compile`` the custom ops run; eagerly, ``CpuEfficientFunction``.
    """
    check_kernel_inputs(query, value, "efficient form")
    temperature, factor = split_factor(temperature, scale, normalize, query.shape[-1])
    if not torch.compiler.is_compiling():
        return CpuEfficientFunction.apply(query, key, value, temperature, factor, normalize,
                                          key_mask)  # fmt: skip
    factors = traced_factors(query, temperature, factor)
    return cpu_efficient_forward(query, key, value, key_mask, factors, normalize)[0]


# per-thread tiles of (d + 17) x 32 floats live on the stack; the router (fused.py) sends
# only calls within its own MAX_HEAD_DIM, the same 128
MAX_HEAD_DIM = 128


def check_kernel_inputs(query: Tensor, value: Tensor, torch_form: str) -> None:
    """Refuse float64, tensors off the CPU and head dims over ``MAX_HEAD_DIM``;
    ``torch_form`` names the PyTorch form to use instead."""
    for name, size in (("query", query.shape[-1]), ("value", value.shape[-1])):
        if size > MAX_HEAD_DIM:
            raise ValueError(
                f"{name}'s last dimension must be at most {MAX_HEAD_DIM} for the CPU kernels; "
                f"got {size} (use the torch {torch_form})"
            )
    if query.dtype == torch.float64:
        raise TypeError(
            "query must be float16, bfloat16 or float32 for the CPU kernels (they accumulate "
            f"in float32); got torch.float64 (use the torch {torch_form})"
        )
    if query.device.type != "cpu":
        raise ValueError(f"query must be on the CPU for the CPU kernels; got device {query.device}")


def traced_factors(query: Tensor, temperature: Tensor | None, factor: float) -> Tensor:
    """The per-head factor (B·H,) float32 that the custom ops take, built in the traced
    graph: from a tensor temperature differentiably (the ops return its gradient), else the
    float ``factor``."""
    b, h = query.shape[:2]
    if temperature is None:
        return query.new_full((b * h,), factor, dtype=torch.float32)
    return temperature.to(torch.float32).expand(b, h, 1, 1).reshape(b * h)
