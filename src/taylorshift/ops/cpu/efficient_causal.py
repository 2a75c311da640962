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
a chunk cost more than the products at d <= 32. No prefix state is stored between the two
calls. The autograd.Function and the custom ops around the two calls are the ones the three
kernel forms share (``wrapper.py``).

A state in or out (``initial_state``, ``output_final_state``: prompt prefill, a sequence in
segments, sequence parallelism): the forward starts from the given prefix state and leaves
the state after the block's last key in its place; the backward starts from the prefix
too and leaves the gradient w.r.t. it there (``state_forward``, ``StateFunction``). The
state changes layout on the way (``kernel_state``, ``public_state``): the kernels keep the
pairs (a, b >= a) of [x, 1] row by row with the weights c folded in, padded to tiles of 6
(``wrapper.state_shape``); ``TaylorShiftState`` keeps x_a x_b, then x, then 1, unweighted.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Optional  # custom_op reads Optional[Tensor] from annotations

import torch
from torch import Tensor

from ..taylor_shift.features import feature_dim, split_factor
from ..taylor_shift.second_order import reference_grads, wants_graph
from ..taylor_shift.state import TaylorShiftState, final_state
from .wrapper import (
    backward_pass,
    check_kernel_inputs,
    flat_mask,
    forward_pass,
    head_factors,
    run,
    state_shape,
    temperature_grad,
    traced_factors,
)


def default_chunk(d: int) -> int:
    """Tokens per chunk when the caller names none: the intra-chunk blocks cost ∝ N·C, the
    state products do not depend on C, and with the loop in C a chunk costs a few kernel
    calls, so the best C grows with d: 128 up to d = 16 (1.12-1.18× faster than 256),
    256 up to 32 (level with 128), 512 above (1.02-1.33× at d = 64;
    benchmarks/op_cpu/efficient-passes/chunks.txt)."""
    return 128 if d <= 16 else 256 if d <= 32 else 512


def cpu_causal_efficient_taylor_shift(
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
    """Causal efficient TaylorShift with the CPU kernels, on validated inputs.

    Same contract and signature as
    ``taylorshift.ops.taylor_shift.efficient_causal.causal_efficient_taylor_shift``:
    query (B, H, Nq, d), key (B, Hkv, Nk, d), value (B, Hkv, Nk, dv), key_mask
    (B, Hkv, Nk) bool or None; query i attends key j iff j <= i. Hkv = H, or grouped-query
    attention: Hkv dividing H, query head h reading key/value head h // (H / Hkv), the
    prefix state kept per key/value head. Returns (B, H, Nq, dv) in value's dtype, and with
    ``output_final_state`` the state after the block's last key: ``(out, state)``. CPU
    tensors of float32, float16 or bfloat16 (sums in float32). ``chunk_size``: tokens per
    chunk (default: ``default_chunk(d)``). Differentiable in query, key, value, a tensor
    temperature and ``initial_state.sums``; so is the state returned, in key, value and
    ``initial_state.sums`` (``final_state``).
    """
    check_kernel_inputs(query, value, "causal efficient form")
    chunk = chunk_size or default_chunk(query.shape[-1])
    if initial_state is None and not output_final_state:
        return run("causal", chunk, query, key, value, key_mask, temperature, scale, normalize)
    out, state = state_forward(
        query, key, value, key_mask, temperature, scale, normalize, chunk, initial_state,
        output_final_state,
    )  # fmt: skip
    if not output_final_state:
        return out
    sums = None if initial_state is None else initial_state.sums
    return out, final_state(state.sums, state.count, key, value, key_mask, normalize, sums)


def state_forward(
    query: Tensor, key: Tensor, value: Tensor, key_mask: Tensor | None,
    temperature: Tensor | float, scale: float | None, normalize: bool, chunk: int,
    initial_state: TaylorShiftState | None, final_state: bool = True,
) -> tuple[Tensor, TaylorShiftState | None]:  # fmt: skip
    """The causal sweep from ``initial_state`` (None: no key before the block):
    (out (B, H, Nq, dv) in value's dtype, the state after the block's last key, float32,
    with key's Hkv heads, no gradient; None unless ``final_state``: the kernel leaves it in
    its own layout, and only the change to ``TaylorShiftState``'s is skipped). ``out`` is
    differentiable in query, key, value, a
    tensor temperature and ``initial_state.sums`` (``StateFunction``). The count of the keys
    before the block is read from the state's sums, ``sums[..., -1, -1]``
    (``TaylorShiftState.from_sums``; every state this library makes holds it there)."""
    b, _, _, d = query.shape
    kv_heads, dv = key.shape[1], value.shape[3]
    temperature, factor = split_factor(temperature, scale, normalize, d)
    sums = None if initial_state is None else initial_state.sums
    if torch.compiler.is_compiling():
        # in the traced graph: the custom ops
        factors = traced_factors(query, temperature, factor)
        out, _, _, after = cpu_causal_state_forward(
            query, key, value, key_mask, factors, normalize, chunk if final_state else -chunk,
            sums,
        )  # fmt: skip
        return out, state_of(after) if final_state else None
    # (a negative chunk: no state after the block wanted, so the kernel adds no key that
    # no later query attends; efficient_causal.c)
    option = chunk if final_state else -chunk
    out, after = StateFunction.apply(
        query, key, value, temperature, factor, normalize, key_mask, option, sums
    )
    return out, public_state(after, b, kv_heads, d, dv) if final_state else None


class StateFunction(torch.autograd.Function):
    """The causal kernel's two passes with a prefix state: the forward from the prefix
    (leaving the state after the block, not differentiable), the backward from it too,
    with the gradient w.r.t. the prefix's sums. Arguments: query, key, value, temperature
    (a tensor broadcasting to (B, H, 1, 1), or None for the float factor), factor,
    normalize, key_mask (B, Hkv, Nk) bool or None, chunk (negative: no state after the block
    wanted), sums (B, Hkv, D, dv + 1) or None. Returns (y, the state after the block in the
    kernels' layout; scratch for a negative chunk)."""

    @staticmethod
    def forward(ctx, query, key, value, temperature, factor, normalize, key_mask, chunk, sums):
        b, h, _, d = query.shape
        kv_heads, nk, dv = key.shape[1], key.shape[2], value.shape[3]
        factors = head_factors(temperature, b, h)
        mask = flat_mask(key_mask, b, kv_heads, nk)
        prefix = kernel_state(sums, b * kv_heads, d, dv)
        y, den, count, after = forward_pass(
            "causal", chunk, query, key, value, mask, factors, factor, normalize, prefix
        )
        ctx.save_for_backward(query, key, value, temperature, factors, sums, y, den, count)
        ctx.mask, ctx.key_mask = mask, key_mask
        ctx.factor, ctx.normalize, ctx.chunk = factor, normalize, abs(chunk)
        ctx.mark_non_differentiable(after)
        return y, after

    @staticmethod
    def backward(ctx, grad_out, _grad_after):
        query, key, value, temperature, factors, sums, y, den, count = ctx.saved_tensors
        b, h, _, d = query.shape
        kv_heads, dv = key.shape[1], value.shape[3]
        if wants_graph():  # create_graph=True: gradients that differentiate again
            if sums is not None or kv_heads != h:
                raise RuntimeError(
                    "initial_state, enable_gqa: a causal call that continues a state or "
                    "groups its heads has first-order gradients only; differentiating its "
                    "gradient again (create_graph=True) is not supported"
                )
            mask = None if ctx.key_mask is None else ctx.key_mask.unsqueeze(2)
            grads = reference_grads(
                grad_out, (query, key, value, temperature), ctx.needs_input_grad[:4], mask,
                True, ctx.factor, ctx.normalize,
            )  # fmt: skip
            return (*grads, None, None, None, None, None)
        # the prefix the forward started from: C starts the backward there too and leaves
        # the gradient w.r.t. it in its place
        prefix = None if sums is None else kernel_state(sums, b * kv_heads, d, dv)
        need_t = ctx.needs_input_grad[3]
        gq, gk, gv, g_factor = backward_pass(
            "causal", ctx.chunk, grad_out, query, key, value, ctx.mask, factors, ctx.factor,
            ctx.normalize, (y, den, count, prefix), need_t,
        )  # fmt: skip
        gt = temperature_grad(g_factor, temperature, query) if need_t else None
        g_sums = None
        if prefix is not None and ctx.needs_input_grad[8]:
            g_sums = public_sums(prefix, b, kv_heads, d, dv, weighted=False).to(sums.dtype)
        return gq, gk, gv, gt, None, None, None, None, g_sums


# The state path as torch.library custom ops, for torch.compile: the same passes as
# StateFunction, each one opaque call in the graph (eagerly StateFunction is cheaper).


@torch.library.custom_op("taylorshift::cpu_causal_state_forward", mutates_args=())
def cpu_causal_state_forward(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_mask: Optional[Tensor],  # noqa: UP045
    factors: Tensor,
    normalize: bool,
    chunk: int,
    sums: Optional[Tensor],  # noqa: UP045
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The causal forward from the prefix state ``sums`` (``TaylorShiftState.sums``, or None:
    no key before the block): (y, denominators, counts, the sums after the block, as
    ``TaylorShiftState.sums``; scratch for a negative ``chunk``, which says the state after
    is not wanted). ``factors`` (B·H,) float32: the query's factor per head."""
    b, _, _, d = query.shape
    kv_heads, nk, dv = key.shape[1], key.shape[2], value.shape[3]
    mask = flat_mask(key_mask, b, kv_heads, nk)
    prefix = kernel_state(sums, b * kv_heads, d, dv)  # continued in place: the state after
    y, den, count, after = forward_pass(
        "causal", chunk, query, key, value, mask, factors, 1.0, normalize, prefix
    )
    return y, den, count, public_sums(after, b, kv_heads, d, dv)


@cpu_causal_state_forward.register_fake
def _(query, key, value, key_mask, factors, normalize, chunk, sums):
    b, h, nq, d = query.shape
    dv, f32 = value.shape[3], torch.float32
    return (
        query.new_empty((b, h, nq, dv), dtype=value.dtype),
        query.new_empty((b * h, nq), dtype=f32),
        query.new_empty((b * h, nq), dtype=f32),
        query.new_empty((b, key.shape[1], feature_dim(d), dv + 1), dtype=f32),
    )


@torch.library.custom_op("taylorshift::cpu_causal_state_backward", mutates_args=())
def cpu_causal_state_backward(
    grad_out: Tensor,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_mask: Optional[Tensor],  # noqa: UP045
    factors: Tensor,
    normalize: bool,
    chunk: int,
    sums: Optional[Tensor],  # noqa: UP045
    y: Tensor,
    den: Tensor,
    count: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients of query, key, value, the per-head factors and ``sums`` (an empty tensor
    where ``sums`` is None) from the gradient of y."""
    b, _, _, d = query.shape
    kv_heads, nk, dv = key.shape[1], key.shape[2], value.shape[3]
    mask = flat_mask(key_mask, b, kv_heads, nk)
    prefix = None if sums is None else kernel_state(sums, b * kv_heads, d, dv)
    gq, gk, gv, g_factor = backward_pass(
        "causal", chunk, grad_out.contiguous(), query, key, value, mask, factors, 1.0,
        normalize, (y, den, count, prefix), True,
    )  # fmt: skip
    if prefix is None:
        return gq, gk, gv, g_factor, factors.new_empty(0)
    return gq, gk, gv, g_factor, public_sums(prefix, b, kv_heads, d, dv, False).to(sums.dtype)


@cpu_causal_state_backward.register_fake
def _(grad_out, query, key, value, key_mask, factors, normalize, chunk, sums, y, den, count):
    # contiguous, as the real op returns them (empty_like would keep a transposed layout)
    grads = tuple(x.new_empty(x.shape) for x in (query, key, value, factors))
    return (*grads, factors.new_empty(0) if sums is None else sums.new_empty(sums.shape))


def _state_setup_context(ctx, inputs, output):
    query, key, value, key_mask, factors, normalize, chunk, sums = inputs
    y, den, count, after = output
    ctx.save_for_backward(query, key, value, key_mask, factors, sums, y, den, count)
    ctx.normalize, ctx.chunk = normalize, abs(chunk)
    ctx.mark_non_differentiable(den, count, after)


def _state_backward(ctx, grad_out, *_unused):
    query, key, value, key_mask, factors, sums, y, den, count = ctx.saved_tensors
    gq, gk, gv, g_factor, g_sums = cpu_causal_state_backward(
        grad_out, query, key, value, key_mask, factors, ctx.normalize, ctx.chunk, sums, y,
        den, count,
    )  # fmt: skip
    return gq, gk, gv, None, g_factor, None, None, None if sums is None else g_sums


cpu_causal_state_forward.register_autograd(_state_backward, setup_context=_state_setup_context)


@lru_cache(maxsize=32)
def _pair_order(d: int) -> tuple[Tensor, Tensor]:
    """For the kernels' pairs p of [x, 1] (a <= b <= d, row a by row a): the index of their
    feature in ``TaylorShiftState``'s order (x_a x_b for a <= b < d row by row, then x_a,
    then 1) and their weight c_p (1/2 on x_a², 1 elsewhere), (D,) each."""
    index, weight = [], []
    quad = d * (d + 1) // 2
    for a in range(d + 1):
        for b in range(a, d + 1):
            if b < d:  # x_a x_b: row a of the upper triangle starts at a d - a (a - 1) / 2
                index.append(a * d - a * (a - 1) // 2 + b - a)
            else:  # x_a, or (a = d) the constant 1
                index.append(quad + a)
            weight.append(0.5 if a == b < d else 1.0)
    with torch.inference_mode(False):  # usable in and out of inference mode
        return torch.tensor(index), torch.tensor(weight).unsqueeze(-1)


def kernel_state(sums: Tensor | None, heads: int, d: int, dv: int) -> Tensor:
    """The kernels' prefix state (heads, *``state_shape(d, dv + 1)``) float32 contiguous
    from ``TaylorShiftState.sums`` (B, Hkv, D, dv + 1), heads = B·Hkv (None: zeros, no key
    yet): its rows reordered into the kernels' pairs and weighted, zero padding around."""
    state = torch.zeros(heads, *state_shape(d, dv + 1), dtype=torch.float32)
    if sums is not None:
        index, weight = _pair_order(d)
        rows = sums.detach().reshape(heads, feature_dim(d), dv + 1).index_select(1, index)
        state[:, : feature_dim(d), : dv + 1] = rows * weight
    return state


def public_state(state: Tensor, b: int, kv_heads: int, d: int, dv: int) -> TaylorShiftState:
    """``TaylorShiftState`` (sums (B, Hkv, D, dv + 1), count (B, Hkv), float32) from the
    kernels' state (``kernel_state``'s layout); the count is the sums' last entry."""
    return state_of(public_sums(state, b, kv_heads, d, dv))


def state_of(sums: Tensor) -> TaylorShiftState:
    """``TaylorShiftState`` of ``sums`` (B, Hkv, D, dv + 1), the count the sums' last entry,
    as its own contiguous tensor (as the PyTorch form's: the decoding step's kernel takes a
    contiguous one; ``TaylorShiftState.from_sums`` gives a view)."""
    return TaylorShiftState(sums, sums[..., -1, -1].clone())


def public_sums(
    state: Tensor, b: int, kv_heads: int, d: int, dv: int, weighted: bool = True
) -> Tensor:
    """(B, Hkv, D, dv + 1) in the features' order from a tensor in the kernels' state
    layout: a state (``weighted``: its weights divided out, by 1/2 exact), or the gradient
    w.r.t. one that the backward left (``weighted=False``: it is already the gradient
    w.r.t. the unweighted sums, pair by pair; efficient_causal.c), its rows reordered."""
    index, weight = _pair_order(d)
    rows = state[:, : feature_dim(d), : dv + 1]
    if weighted:
        rows = rows / weight
    sums = torch.empty_like(rows).index_copy_(1, index, rows)
    return sums.reshape(b, kv_heads, feature_dim(d), dv + 1)
