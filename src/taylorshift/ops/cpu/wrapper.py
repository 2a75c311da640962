"""The wrapper the three CPU kernel forms share: the non-causal efficient form
(``efficient.py``), the causal efficient form (``efficient_causal.py``) and the direct form
(``direct.py``).

Each form is two C calls with one signature (``kernels.h``), ``ts_<form>_forward`` and
``ts_<form>_backward``; the forms differ only in what their one integer ``option`` means
(causal: tokens per chunk; direct: causal or not; efficient: not read) and in what the
forward keeps for the backward: the non-causal efficient form its weighted key state and
one count per head, the others one count per query. So one wrapper serves all three:

- ``forward_pass`` / ``backward_pass``: the operands to C (float32, contiguous), the outputs
  allocated, one C call each;
- ``KernelFunction``, an autograd.Function: the eager path (0.2-0.3 ms cheaper per forward
  + backward than a custom op's dispatch);
- the ``torch.library`` custom ops ``taylorshift::cpu_forward`` / ``cpu_backward``, which
  ``torch.compile`` keeps in its graph as opaque calls (``run`` picks the path).

Sums in float32 (float16 and bfloat16 inputs are converted; results in the inputs' dtypes);
float64 stays on the PyTorch forms (``check_kernel_inputs``).
"""

from __future__ import annotations

from typing import Optional  # custom_op reads Optional[Tensor] from annotations

import torch
from torch import Tensor

from ..taylor_shift.features import NORM_EPS, split_factor
from ..taylor_shift.second_order import reference_grads, wants_graph
from .build import library

FORMS = ("efficient", "causal", "direct")
# each form's C passes (kernels.h), by name: looked up per call on the loaded library
PASSES = {form: (f"ts_{form}_forward", f"ts_{form}_backward") for form in FORMS}
TILE = 6  # pairs and value columns per register tile of efficient.c (its COLS)
# per-thread tiles of (d + 17) x 32 floats live on the stack; the router (fused.py) sends
# only calls within its own MAX_HEAD_DIM, the same 128
MAX_HEAD_DIM = 128


def state_shape(d: int, width: int) -> tuple[int, int]:
    """(rows, columns) of one head's state in the kernels' layout: the D = (d+1)(d+2)/2
    pairs (a, b >= a) of [x, 1] row a by row a, packed, then zero pairs up to a multiple of
    6, and ``width`` value columns padded to a multiple of 6 (``ts_state_rows``,
    ``ts_state_cols`` of efficient.c)."""
    pairs = (d + 1) * (d + 2) // 2
    return -(-pairs // TILE) * TILE, -(-width // TILE) * TILE


def saved_shapes(form: str, b: int, h: int, nq: int, d: int, dv: int) -> tuple[tuple, tuple]:
    """The shapes of the counts and the state a form's forward keeps: one count per head
    and the weighted key state for the non-causal efficient form; one count per query and
    no state for the others (the custom op returns an empty (0,) tensor)."""
    if form == "efficient":
        return (b * h,), (b * h, *state_shape(d, dv + 1))
    return (b * h, nq), (0,)


def c_passes(form: str) -> tuple[str, str]:
    """The names of ``form``'s forward and backward C passes."""
    passes = PASSES.get(form)
    if passes is None:
        forms = ", ".join(FORMS)
        raise ValueError(f"form must be one of {forms} for the CPU kernels; got {form!r}")
    return passes


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


def c_factors(factors: Tensor | None) -> Tensor | None:
    """What C reads of the per-head factors (B·H,): float32 at consecutive addresses. A
    traced graph can hand the custom ops a broadcast view (a temperature of one entry for
    every head: stride 0), whose address alone does not hold B·H floats."""
    return None if factors is None else factors.contiguous()


def flat_mask(key_mask: Tensor | None, b: int, h: int, n: int) -> Tensor | None:
    """The key mask (B, H, N) bool (broadcast views too) as contiguous uint8 (B·H, N), H the
    key's heads (the query's, or a grouped causal call's key/value heads)."""
    if key_mask is None:
        return None
    return key_mask.expand(b, h, n).reshape(b * h, n).to(torch.uint8).contiguous()


def head_factors(temperature: Tensor | None, b: int, h: int) -> Tensor | None:
    """The query's factor per head (B·H,) float32 contiguous from a tensor temperature
    (``split_factor``'s, broadcasting to (B, H, 1, 1)), or None where the factor is the float
    (it goes to C as a scalar: one tensor fewer per call)."""
    if temperature is None:
        return None
    return temperature.detach().to(torch.float32).expand(b, h, 1, 1).reshape(b * h).contiguous()


def kernel_threads() -> int:
    """The kernels' OpenMP threads: torch's intra-op thread count."""
    return max(1, torch.get_num_threads())


def forward_pass(
    form: str, option: int, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None,
    factors: Tensor | None, factor: float, normalize: bool, prefix: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:  # fmt: skip
    """One C call ``ts_<form>_forward``: (y (B, H, Nq, dv) in value's dtype, the denominators
    (B·H, Nq), the counts, the state or None) in the shapes of ``saved_shapes``, float32.
    ``prefix`` (causal form only): a prefix state (B·Hkv, *``state_shape(d, dv + 1)``)
    float32 contiguous, the keys before the block in the kernels' layout
    (``efficient_causal.kernel_state``), continued in place: it holds the state after the
    block's last key on return (and is returned as the state).
    ``mask`` (B·Hkv, Nk) uint8 (``flat_mask``) or None; ``factors`` (B·H,) float32, the
    query's factor per head, or None for the float ``factor``. Key and value have Hkv = H
    heads, or (the causal form only: grouped-query attention) Hkv dividing H, passed to C
    as the group G = H / Hkv. What the efficient forms form
    inside (q', k') lives in the call's scratch memory and is recomputed by the backward
    (O(N d))."""
    b, h, nq, d = query.shape
    nk, dv = key.shape[2], value.shape[3]
    bh, group = b * h, h // key.shape[1]
    if group != 1 and form != "causal":  # (the other forms' C passes read one head each)
        raise ValueError(
            f"key must have the query's {h} heads for the CPU {form} form; got {key.shape[1]}"
        )
    # (every tensor whose address goes to C is held by a name until the call returns; the
    # addresses of tensors that are never None taken directly: ``ptr`` costs a Python call)
    q, k, v = c_operand(query), c_operand(key), c_operand(value)
    factors = c_factors(factors)
    count_shape, state_shape_ = saved_shapes(form, b, h, nq, d, dv)
    out, den = float32_empty(b, h, nq, dv), float32_empty(bh, nq)
    count = float32_empty(*count_shape)
    state = float32_empty(*state_shape_) if form == "efficient" else prefix
    checked(getattr(library(), c_passes(form)[0])(
        bh, nq, nk, d, dv, q.data_ptr(), k.data_ptr(), v.data_ptr(), ptr(mask), ptr(factors),
        factor, int(normalize), NORM_EPS, option, group, out.data_ptr(), den.data_ptr(),
        count.data_ptr(), ptr(state), kernel_threads(),
    ))  # fmt: skip
    y = out if value.dtype == torch.float32 else out.to(value.dtype)
    return y, den, count, state


def backward_pass(
    form: str, option: int, grad_out: Tensor, query: Tensor, key: Tensor, value: Tensor,
    mask: Tensor | None, factors: Tensor | None, factor: float, normalize: bool,
    saved: tuple[Tensor, ...], need_factor: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:  # fmt: skip
    """One C call ``ts_<form>_backward``: the gradients of query, key, value (each in its
    dtype, contiguous) and, with ``need_factor``, of the per-head factor (B·H,) float32,
    from the gradient of y; ``saved`` is ``forward_pass``'s output, for the causal form with
    the prefix state it started from in the state's place (or None): C overwrites that
    tensor with the gradient w.r.t. the prefix, in the same layout."""
    y, den, count, state = saved
    b, h, nq, d = query.shape
    nk, dv, group = key.shape[2], value.shape[3], h // key.shape[1]
    q, k, v = c_operand(query), c_operand(key), c_operand(value)
    g, y32, factors = c_operand(grad_out), c_operand(y), c_factors(factors)
    gq, gk = float32_empty(*query.shape), float32_empty(*key.shape)
    gv = float32_empty(*value.shape)
    g_factor = float32_empty(b * h) if need_factor else None
    checked(getattr(library(), c_passes(form)[1])(
        b * h, nq, nk, d, dv, q.data_ptr(), k.data_ptr(), v.data_ptr(), ptr(mask),
        ptr(factors), factor, int(normalize), NORM_EPS, option, group, g.data_ptr(),
        y32.data_ptr(), den.data_ptr(), count.data_ptr(), ptr(state), gq.data_ptr(),
        gk.data_ptr(), gv.data_ptr(), ptr(g_factor), kernel_threads(),
    ))  # fmt: skip
    pairs = zip((gq, gk, gv), (query, key, value), strict=True)
    grads = tuple(g if x.dtype == torch.float32 else g.to(x.dtype) for g, x in pairs)
    return (*grads, g_factor)


class KernelFunction(torch.autograd.Function):
    """The eager wrapper of a form's two passes, the temperature's gradient included.
    Arguments: form, option, query, key, value, temperature (a tensor broadcasting to
    (B, H, 1, 1), or None for the float factor), factor, normalize, key_mask."""

    @staticmethod
    def forward(ctx, form, option, query, key, value, temperature, factor, normalize, key_mask):
        b, h = query.shape[:2]
        factors = head_factors(temperature, b, h)
        mask = flat_mask(key_mask, b, key.shape[1], key.shape[2])
        saved = forward_pass(form, option, query, key, value, mask, factors, factor, normalize)
        ctx.save_for_backward(query, key, value, temperature, factors, *saved)
        ctx.form, ctx.option, ctx.factor, ctx.normalize = form, option, factor, normalize
        ctx.mask = mask  # never differentiated
        ctx.key_mask = key_mask  # for gradients asked as a graph (create_graph=True)
        return saved[0]

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, temperature, factors, *saved = ctx.saved_tensors
        if wants_graph():  # create_graph=True: gradients that differentiate again
            mask = None if ctx.key_mask is None else ctx.key_mask.unsqueeze(2)
            causal = ctx.form == "causal" or (ctx.form == "direct" and ctx.option == 1)
            grads = reference_grads(
                grad_out, (query, key, value, temperature), ctx.needs_input_grad[2:6], mask,
                causal, ctx.factor, ctx.normalize,
            )  # fmt: skip
            return (None, None, *grads, None, None, None)
        need_t = ctx.needs_input_grad[5]
        gq, gk, gv, g_factor = backward_pass(
            ctx.form, ctx.option, grad_out, query, key, value, ctx.mask, factors, ctx.factor,
            ctx.normalize, saved, need_t,
        )  # fmt: skip
        gt = temperature_grad(g_factor, temperature, query) if need_t else None
        return None, None, gq, gk, gv, gt, None, None, None


def temperature_grad(g_factor: Tensor, temperature: Tensor, query: Tensor) -> Tensor:
    """The gradient of a tensor temperature from the per-head factor's (B·H,): summed to the
    temperature's shape, in its dtype."""
    b, h = query.shape[:2]
    return g_factor.view(b, h, 1, 1).sum_to_size(temperature.shape).to(temperature.dtype)


# The same passes as torch.library custom ops, for torch.compile (one opaque call each way).


@torch.library.custom_op("taylorshift::cpu_forward", mutates_args=())
def cpu_forward(
    form: str,
    option: int,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_mask: Optional[Tensor],  # noqa: UP045
    factors: Tensor,
    normalize: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``forward_pass`` with the key mask (B, Hkv, Nk) bool (Hkv: the key's heads),
    flattened here and again by the backward: (y, denominators, counts, state)."""
    mask = flat_mask(key_mask, query.shape[0], key.shape[1], key.shape[2])
    y, den, count, state = forward_pass(form, option, query, key, value, mask, factors, 1.0,
                                        normalize)  # fmt: skip
    return y, den, count, (y.new_empty(0, dtype=torch.float32) if state is None else state)


@cpu_forward.register_fake
def _(form, option, query, key, value, key_mask, factors, normalize):
    b, h, nq, d = query.shape
    dv = value.shape[3]
    count_shape, state_shape_ = saved_shapes(form, b, h, nq, d, dv)
    f32 = torch.float32
    return (
        query.new_empty((b, h, nq, dv), dtype=value.dtype),
        query.new_empty((b * h, nq), dtype=f32),
        query.new_empty(count_shape, dtype=f32),
        query.new_empty(state_shape_, dtype=f32),
    )


@torch.library.custom_op("taylorshift::cpu_backward", mutates_args=())
def cpu_backward(
    form: str,
    option: int,
    grad_out: Tensor,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_mask: Optional[Tensor],  # noqa: UP045
    factors: Tensor,
    normalize: bool,
    y: Tensor,
    den: Tensor,
    count: Tensor,
    state: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``backward_pass``: gradients of query, key, value and the per-head factors."""
    mask = flat_mask(key_mask, query.shape[0], key.shape[1], key.shape[2])
    saved = (y, den, count, state)
    gq, gk, gv, g_factor = backward_pass(form, option, grad_out, query, key, value, mask,
                                         factors, 1.0, normalize, saved, True)  # fmt: skip
    return gq, gk, gv, g_factor


@cpu_backward.register_fake
def _(form, option, grad_out, query, key, value, key_mask, factors, normalize, *saved):
    # contiguous, as the real op returns them (empty_like would keep a transposed layout)
    return tuple(x.new_empty(x.shape) for x in (query, key, value, factors))


def _setup_context(ctx, inputs, output):
    form, option, query, key, value, key_mask, factors, normalize = inputs
    y, den, count, state = output
    ctx.save_for_backward(query, key, value, key_mask, factors, y, den, count, state)
    ctx.form, ctx.option, ctx.normalize = form, option, normalize
    ctx.mark_non_differentiable(den, count, state)


def _backward(ctx, grad_out, *_unused):
    query, key, value, key_mask, factors, *saved = ctx.saved_tensors
    gq, gk, gv, g_factor = cpu_backward(
        ctx.form, ctx.option, grad_out.contiguous(), query, key, value, key_mask, factors,
        ctx.normalize, *saved,
    )  # fmt: skip
    return None, None, gq, gk, gv, None, g_factor, None


cpu_forward.register_autograd(_backward, setup_context=_setup_context)


def run(
    form: str, option: int, query: Tensor, key: Tensor, value: Tensor, key_mask: Tensor | None,
    temperature: Tensor | float, scale: float | None, normalize: bool,
) -> Tensor:  # fmt: skip
    """y (B, H, Nq, dv) of the kernel form ``form`` (one of ``FORMS``) with its ``option``,
    differentiable in query, key, value and a tensor temperature: ``KernelFunction`` eagerly,
    the custom ops under ``torch.compile``. ``key_mask`` (B, H, Nk) bool (broadcast views
    are fine) or None; the inputs are checked by the caller (``check_kernel_inputs``)."""
    temperature, factor = split_factor(temperature, scale, normalize, query.shape[-1])
    if not torch.compiler.is_compiling():
        return KernelFunction.apply(form, option, query, key, value, temperature, factor,
                                    normalize, key_mask)  # fmt: skip
    factors = traced_factors(query, temperature, factor)
    return cpu_forward(form, option, query, key, value, key_mask, factors, normalize)[0]


def traced_factors(query: Tensor, temperature: Tensor | None, factor: float) -> Tensor:
    """The query's factor per head (B·H,) float32 for the custom ops in a traced graph: from
    a tensor temperature differentiably (the ops return its gradient), else the float
    ``factor`` (``split_factor``'s pair)."""
    b, h = query.shape[:2]
    if temperature is None:
        return query.new_full((b * h,), factor, dtype=torch.float32)
    # (from a temperature of fewer entries a stride-0 view: c_factors lays it out for C)
    return temperature.to(torch.float32).expand(b, h, 1, 1).reshape(b * h)


def check_kernel_inputs(query: Tensor, value: Tensor, torch_form: str) -> None:
    """Refuse float64, tensors off the CPU and head dims over ``MAX_HEAD_DIM``;
    ``torch_form`` names the PyTorch form to use instead."""
    # (per call: each check here costs a fraction of a microsecond, a tuple loop several)
    if query.shape[-1] > MAX_HEAD_DIM or value.shape[-1] > MAX_HEAD_DIM:
        name, size = ("query", query.shape[-1])
        if size <= MAX_HEAD_DIM:
            name, size = ("value", value.shape[-1])
        raise ValueError(
            f"{name}'s last dimension must be at most {MAX_HEAD_DIM} for the CPU kernels; "
            f"got {size} (use the torch {torch_form})"
        )
    if query.dtype == torch.float64:
        raise TypeError(
            "query must be float16, bfloat16 or float32 for the CPU kernels (they accumulate "
            f"in float32); got torch.float64 (use the torch {torch_form})"
        )
    if not query.is_cpu:
        raise ValueError(f"query must be on the CPU for the CPU kernels; got device {query.device}")
