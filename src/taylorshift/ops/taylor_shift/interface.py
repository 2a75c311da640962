"""The public op: ``taylor_shift_attention``, one entry point for every form."""

from __future__ import annotations

import math
import operator
import sys
from dataclasses import replace

import torch
from torch import Tensor

from ..._validate import check_bool
from .checks import Problem, check_inputs
from .direct import direct_taylor_shift
from .dispatch import choose_mode, switch_length
from .efficient import efficient_taylor_shift
from .efficient_causal import causal_efficient_taylor_shift
from .features import backward_follows, compute_dtype, drop_masked_content
from .fused import (
    CPU_EFFICIENT_CAUSAL,
    fused_form,
    kernel_name,
    probe_backward,
    run_guarded,
    shape_class,
    stateful_form,
)
from .grouped import grouped_attention, varies_over_heads
from .naive import naive_taylor_shift_attention
from .state import TaylorShiftState, check_state


def taylor_shift_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    *,
    temperature: Tensor | float = 1.0,
    scale: float | None = None,
    normalize: bool = True,
    order: int = 2,
    mode: str = "auto",
    initial_state: TaylorShiftState | None = None,
    output_final_state: bool = False,
    enable_gqa: bool = False,
) -> Tensor | tuple[Tensor, TaylorShiftState]:
    r"""Taylor-softmax attention (TaylorShift), in its direct or linear-time efficient form.

    Softmax's exponential is replaced by its Taylor polynomial of even ``order``,
    ``w(s) = Σ_{n=0..order} sⁿ/n!`` (``1 + s + s²/2`` by default, always > 0)::

        # normalize=True (the paper's scheme)
        q, k = query / max(‖query‖, eps), key / max(‖key‖, eps)
        s    = temperature * q @ k.mT                      # (B, H, Nq, Nk)
        w    = taylor(s) * allowed                         # allowed: mask ∧ causal
        n    = allowed.sum(-1, keepdim=True)               # attended keys per query
        out  = (w @ value) / w.sum(-1, keepdim=True) * sqrt(n / d)

        # normalize=False: s = scale * query @ key.mT (scale = 1/sqrt(d)), no sqrt(n/d)

    A query that attends no key returns zeros (and finite gradients).

    Args:
        query: (B, H, Nq, d).
        key: (B, H, Nk, d).
        value: (B, H, Nk, dv).
        attn_mask: optional bool tensor broadcastable to (B, H, Nq, Nk), True = attend (as
            SDPA). Float (additive) masks are refused: they have no meaning for a polynomial.
            Masked keys leave every key-side sum, the constant term included; the content
            of a key no query attends (and its value's) never matters, NaN or Inf included.
        is_causal: query i attends key j only if j <= i (upper-left aligned, as SDPA). Unlike
            SDPA it combines with ``attn_mask`` (logical and), as padded causal batches need.
        temperature: τ, a float or a tensor broadcastable to (B, H, 1, 1) (per-head, may
            require grad). Only with ``normalize=True``.
        scale: score scale for ``normalize=False``; default 1/sqrt(d).
        normalize: the paper's normalisation of q and k and its output factor sqrt(n_i/d).
        order: even Taylor order >= 2; the efficient form supports 2.
        mode: ``"direct"`` materialises the (Nq, Nk) weights, O(N² d), any order and mask;
            ``"efficient"`` is linear in N, O(N d² dv), for key-padding masks (not varying
            over queries), causal, cross-attention; ``"auto"`` picks the cheaper one.
        initial_state: causal only: a ``TaylorShiftState`` holding the keys before this
            block (every query attends them, and they count in n_i), as returned by a call
            with ``output_final_state=True`` or by ``taylor_shift_decode``: a sequence can
            be fed in segments. The output is differentiable w.r.t. ``initial_state.sums``.
        output_final_state: causal only: also return the state after this block's last key
            (real keys only under a key-padding mask), to continue with. Its sums are
            differentiable w.r.t. key, value and ``initial_state.sums``, so a sequence fed
            in segments gets the gradients of one call over the whole (detach the sums to
            cut the graph between segments, as truncated backpropagation does). Both run
            the efficient form (``mode`` "auto" or "efficient"): on the CPU its causal
            kernel, which starts from the state and leaves the next one in place (custom
            ops under torch.compile), on CUDA the Triton causal kernels, elsewhere its
            PyTorch code.
        enable_gqa: grouped-query attention, as SDPA's: key and value may have Hkv heads,
            Hkv dividing H; query head h attends through key/value head h // (H / Hkv).
            Non-causal calls do the key side once per key/value head (``grouped.py``), and
            so do causal calls of the efficient form on the CPU kernels (its prefix state
            per key/value head; elsewhere causal calls repeat key and value); with
            ``initial_state`` or ``output_final_state`` the state has Hkv heads, as
            ``taylor_shift_decode``'s.

    Returns:
        (B, H, Nq, dv) in the dtype of ``query``, and with ``output_final_state`` the state
        after the block: ``(out, state)``. float16/bfloat16 inputs are accumulated in
        float32.

    Raises:
        TypeError, ValueError: for bad input, naming the argument, the expected and the
        actual value; with ``normalize=False``, also when the scores are so large that the
        Taylor sums would overflow the compute dtype (``check_plain_score_range``).

    Higher derivatives: the forms' backward passes are hand-written and first-order (as
    FlashAttention's). Asked for a gradient as a graph (``create_graph=True``), they
    recompute it through ``naive_taylor_shift_attention``'s plain torch ops, which
    differentiate to any order (``second_order.py``; the Triton kernels recompute their
    cores' sums that way; a call continuing an ``initial_state`` refuses). Under ``torch.func``
    transforms (``grad``, ``vmap``, ``jacrev``, ``jvp``, ``hessian``) the op computes
    through those plain ops directly; ``initial_state`` and ``output_final_state`` are
    refused there. Both hold the (Nq, Nk) weights in memory (float16/bfloat16 in float32).
    """
    if enable_gqa is not False:
        check_bool("enable_gqa", enable_gqa)
    problem = check_inputs(
        query, key, value, attn_mask, is_causal, temperature, scale, normalize, order, mode,
        enable_gqa=enable_gqa,
    )  # fmt: skip
    if key.shape[1] != query.shape[1]:  # (grouped heads: enable_gqa, checked above)
        if initial_state is not None or output_final_state:
            return _grouped_state_call(
                query, key, value, problem, attn_mask, is_causal, temperature, scale,
                normalize, order, mode, initial_state, output_final_state,
            )  # fmt: skip
        if is_causal:
            out, mode = _grouped_causal_kernel(
                query, key, value, problem, attn_mask, temperature, scale, normalize, order,
                mode,
            )  # fmt: skip
            if out is not None:
                return out
        return grouped_attention(
            taylor_shift_attention, query, key, value, attn_mask, is_causal, temperature,
            scale=scale, normalize=normalize, order=order, mode=mode,
        )  # fmt: skip
    requested = mode
    if mode == "auto" and initial_state is None and not output_final_state:
        mode = _auto_mode(
            problem,
            causal=is_causal,
            order=order,
            mask_varies=problem.mask_varies_over_queries,
            device=query.device,
            dtype=query.dtype,
            backward=backward_follows(query, key, value, temperature),
        )
        if isinstance(mode, torch.SymBool):
            # torch.export with symbolic lengths: both forms go into the program, and the
            # lengths it runs on pick one there (a guard would fix the lengths to one side
            # of the switch, which export refuses for a dimension declared dynamic)
            return _exported_auto(
                mode, query, key, value, attn_mask, is_causal,
                temperature=temperature, scale=scale, normalize=normalize,
            )  # fmt: skip
    stateful = initial_state is not None or output_final_state
    if stateful:
        _check_state_call(
            query, value, problem, is_causal, order, requested, initial_state, output_final_state
        )
    # A masked key's content must not matter (a NaN in padding would poison the sums):
    # keys no query attends become zeros before any form sees them.
    if problem.key_mask is not None:
        key, value = drop_masked_content(key, value, problem.key_mask)
    elif problem.mask is not None:
        key, value = drop_masked_content(key, value, problem.mask.any(-2))
    if _torch_func_active():
        # torch.func cannot look inside the forms' autograd Functions: the reference's plain
        # torch ops instead, which every transform takes (no score-range check: it reads
        # values, which vmap does not allow; a state call was refused above)
        return _reference_form(
            query, key, value, problem, is_causal, temperature, scale, normalize, order
        )
    if not normalize:
        check_plain_score_range(query, key, value, scale, order)
    # The fused and the PyTorch form of a mode share one signature: pick, then call one way.
    if mode == "direct":
        # key padding as (B, H, 1, Nk), the only mask the fused direct form takes
        mask = problem.mask
        if problem.key_mask is not None:
            mask = problem.key_mask.unsqueeze(2)
        args = (query, key, value, mask, is_causal, temperature, scale, normalize, order)
        form = direct_taylor_shift
    else:
        args = (query, key, value, problem.key_mask, temperature, scale, normalize)
        form = causal_efficient_taylor_shift if is_causal else efficient_taylor_shift
    if stateful:  # the PyTorch causal form, or the CPU causal kernel
        return causal_state_call(form, args, problem, order, initial_state, output_final_state)
    backward = backward_follows(query, key, value, temperature)
    fused = fused_form(query, problem, mode, is_causal, order, backward=backward)
    if fused is not None:
        if torch.compiler.is_compiling():
            # Traced code calls the kernel's custom op as it is: the guard below (a try
            # around a launch, a probe of the backward) has no meaning inside a graph.
            return fused(*args)
        # A kernel that cannot compile or launch here falls back to the PyTorch form below
        # (warned once, remembered per shape class; ops/taylor_shift/fused.py).
        kernel = shape_class(kernel_name(mode, is_causal, query.device), query, problem, is_causal)
        if not backward or probe_backward(kernel, fused, mode, query):
            return run_guarded(kernel, lambda: fused(*args), lambda: form(*args))
    return form(*args)


def _exported_auto(efficient: torch.SymBool, *args: object, **options: object) -> Tensor:
    """``torch.cond`` on ``efficient`` between the efficient and the direct form of a call
    ``(query, key, value, attn_mask, is_causal)`` with ``options`` (temperature, scale,
    normalize; order 2, no state). Every tensor is an operand of the branches, which call
    the op anew with their mode: a branch that reuses the outer call's checked sizes
    (symbols of the outer graph) trips torch.export's naming of the branches' inputs
    (torch 2.13)."""
    query, key, value, attn_mask, is_causal = args
    given = {"attn_mask": attn_mask, **options}
    tensors = {name: t for name, t in given.items() if isinstance(t, Tensor)}
    names = tuple(tensors)

    def branch(mode: str):
        def call(query: Tensor, key: Tensor, value: Tensor, *extra: Tensor) -> Tensor:
            now = {**given, **dict(zip(names, extra, strict=True))}
            mask = now.pop("attn_mask")
            return taylor_shift_attention(query, key, value, mask, is_causal, mode=mode, **now)

        return call

    operands = (query, key, value, *tensors.values())
    return torch.cond(efficient, branch("efficient"), branch("direct"), operands)


def _grouped_state_call(
    query, key, value, problem, attn_mask, is_causal, temperature, scale, normalize, order,
    mode, initial_state, output_final_state,
):  # fmt: skip
    """A causal call with a state in or out and key/value heads fewer than the query's: the
    PyTorch causal form with its state per key/value head (as ``taylor_shift_decode``'s),
    each chunk's query heads of a group reading it together (``problem``: the call checked
    with ``enable_gqa``)."""
    kv_heads = key.shape[1]
    _check_state_call(
        query, value, problem, is_causal, order, mode, initial_state, output_final_state,
        heads=kv_heads,
    )  # fmt: skip
    if varies_over_heads(attn_mask):
        raise ValueError(
            "attn_mask: with grouped-query attention and a causal state the mask must be the "
            "same for every head (key padding, (B, 1, 1, Nk)); got attn_mask of shape "
            f"{tuple(attn_mask.shape)}"
        )
    key_mask = None if problem.key_mask is None else problem.key_mask[:, :kv_heads]
    if key_mask is not None:
        key, value = drop_masked_content(key, value, key_mask)
    if not normalize:
        check_plain_score_range(query, key, value, scale, order)
    args = (query, key, value, key_mask, temperature, scale, normalize)
    return causal_state_call(
        causal_efficient_taylor_shift, args, problem, order, initial_state, output_final_state
    )


def causal_state_call(form, args, problem, order, initial_state, output_final_state):
    """A causal call with a state in or out, checked: ``form`` (the PyTorch causal form, or a
    function with its signature: decoding's sweep without autograd) on ``args`` (its
    positional arguments), or the fused causal kernel where it applies (``stateful_form``:
    the CPU kernel, or Triton's; a kernel failure falls back to ``form``)."""
    query, key, value, _, temperature = args[:5]
    sums = None if initial_state is None else initial_state.sums
    fused = stateful_form(
        query, problem, order, groups=query.shape[1] // key.shape[1],
        backward=backward_follows(query, key, value, temperature, sums),
    )  # fmt: skip
    states = {"initial_state": initial_state, "output_final_state": output_final_state}
    if fused is not None:
        if torch.compiler.is_compiling():  # the kernel's custom ops as they are (see below)
            return fused(*args, **states)
        kernel = shape_class(kernel_name("efficient", True, query.device), query, problem, True)
        return run_guarded(kernel, lambda: fused(*args, **states), lambda: form(*args, **states))
    return form(*args, **states)


def _torch_func_active() -> bool:
    """Inside a torch.func transform (grad, vmap, jacrev, jvp, hessian, ...), eagerly."""
    if torch.compiler.is_compiling():
        return False
    return torch._C._are_functorch_transforms_active()


def _reference_form(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    problem: Problem,
    is_causal: bool,
    temperature: Tensor | float,
    scale: float | None,
    normalize: bool,
    order: int,
) -> Tensor:
    """The op through ``naive_taylor_shift_attention``: plain torch ops, (Nq, Nk) weights,
    float16/bfloat16 computed in float32 as the forms do (key and value already have the
    content of keys no query attends dropped)."""
    mask = problem.mask if problem.key_mask is None else problem.key_mask.unsqueeze(2)
    cd = compute_dtype(query.dtype)
    if isinstance(temperature, Tensor):
        temperature = temperature.to(cd)
    out = naive_taylor_shift_attention(
        query.to(cd), key.to(cd), value.to(cd), mask, is_causal,
        temperature=temperature, scale=scale, normalize=normalize, order=order,
    )  # fmt: skip
    return out.to(query.dtype)


def assume_constant_result(fn):
    """``torch.compiler.assume_constant_result`` without importing ``torch._dynamo`` when
    nothing has yet: that import took 2.4 s of the package's 4.7 s (``python -X importtime``),
    paid by every CLI call and process the tests start. torch's decorator only sets this
    attribute on ``fn`` (tests/ops/test_dispatch.py checks that it still does)."""
    if "torch._dynamo" in sys.modules:
        return torch.compiler.assume_constant_result(fn)
    return mark_constant(fn)


def mark_constant(fn):
    """What ``torch._dynamo.assume_constant_result`` does to ``fn``."""
    fn._dynamo_marked_constant = True
    return fn


# Traced by torch.compile, the choice is made once, at the trace, from constants (head
# sizes, dtype, device, the band of B·H) and kept in the graph with the guards of
# _symbolic_auto_mode: the calibration file is read outside the traced code.
_switch_length = assume_constant_result(switch_length)


def _auto_mode(problem: Problem, **options: object) -> str | torch.SymBool:
    """``mode="auto"``'s form for a checked call (``options``: choose_mode's keywords); while
    ``torch.export`` traces symbolic lengths, the condition for the efficient form."""
    nq, nk, d, dv = problem.n_query, problem.n_key, problem.head_dim, problem.value_dim
    batch_heads = problem.batch * problem.heads
    # (Dynamo shows a symbolic size as an int, so every traced call takes the symbolic way)
    if torch.compiler.is_compiling() or any(
        isinstance(n, torch.SymInt) for n in (nq, nk, d, dv, batch_heads)
    ):
        return _symbolic_auto_mode(nq, nk, d, dv, batch_heads, **options)
    return choose_mode(nq, nk, d, dv, batch_heads=batch_heads, **options)


def _symbolic_auto_mode(nq, nk, d, dv, batch_heads, **options) -> str | torch.SymBool:
    """The form for a call that torch.compile traces, whose sizes may be symbols (dynamic
    shapes).

    The choice cannot read a symbol's value, only compare it, and each comparison becomes
    a guard of the graph. So the head sizes are fixed (a model's are constants); B·H is
    placed between two powers of two and the choice made for the upper one (a graph serves
    batches down to half that size; a factor two in B·H moves the CPU priors' switch by at
    most 13 %); the lengths are compared with ``dispatch.switch_length``. A call on the
    other side of the switch, or in another band of B·H, compiles again. Both forms compute
    the same attention: these guards decide only which of them runs.

    ``torch.export`` refuses a guard that does not hold over a dynamic dimension's whole
    range, so there no size is guarded: B·H's band is the traced example's (its size hint)
    and, for symbolic lengths, the comparison itself is returned, a symbolic bool on which
    the program picks its form when it runs (``torch.cond``).
    """
    d, dv = operator.index(d), operator.index(dv)  # (Dynamo specialises here; not on int())
    # (torch.export's default, non-strict tracing; under strict=True Dynamo gives each
    # branch of a cond new symbols for the operands' sizes, and the mask check fails there)
    exporting = torch.compiler.is_exporting() and not torch.compiler.is_dynamo_compiling()
    if exporting:
        batch_heads = _unguarded_hint(batch_heads)
    heads_band = 1
    while heads_band < batch_heads:
        heads_band *= 2
    # Flags that come from comparisons of sizes are symbols too (transformers' is_causal is
    # `causal and Nq > 1`); a branch on one fixes it, with a guard (bool() would not).
    flags = {name: True if options[name] else False for name in ("causal", "mask_varies")}  # noqa: SIM210
    switch = _switch_length(d, dv, batch_heads=heads_band, **{**options, **flags})
    if switch is None:
        return "direct"
    efficient = 2 * nq * nk >= switch * (nq + nk)
    if exporting and isinstance(efficient, torch.SymBool):
        return efficient
    return "efficient" if efficient else "direct"


def _unguarded_hint(size: int | torch.SymInt) -> int | torch.SymInt:
    """A symbolic size's value in the traced example, read without a guard (where torch
    has ``optimization_hint``; else the size itself, which a comparison then guards)."""
    if not isinstance(size, torch.SymInt):
        return size
    from torch.fx.experimental import symbolic_shapes

    hint = getattr(symbolic_shapes, "optimization_hint", None)
    return size if hint is None else hint(size)


def check_plain_score_range(
    query: Tensor, key: Tensor, value: Tensor, scale: float | None, order: int
) -> None:
    """Refuse ``normalize=False`` inputs whose Taylor sums could overflow the compute dtype.

    Unnormalised scores are unbounded: with |s| <= s_max = |scale| · max‖q‖ · max‖k‖, the
    sums Σ_j w(s_ij) [v_j, 1] can reach Nk · s_max^order / order! · max(1, max|v|), and the
    efficient form's state Σ_j k_a k_b v_j can reach Nk · max‖k‖² · max(1, max|v|) (by
    Cauchy–Schwarz no feature product exceeds these). When either worst case passes half
    the dtype's largest value the call raises, naming the bound, instead of returning rows
    of zeros or NaN. The bound is a worst case: inputs whose actual scores stay far below
    s_max may be refused although they would have fitted. Costs three reductions (and, on a
    GPU, one synchronisation); skipped in float64, for empty inputs and while torch.compile
    traces.
    """
    cd = compute_dtype(query.dtype)
    if (
        cd == torch.float64
        or torch.compiler.is_compiling()
        or query.device.type == "meta"
        or query.numel() == 0
        or key.numel() == 0
    ):
        return
    d, nk = query.shape[-1], key.shape[-2]
    factor = abs(scale) if scale is not None else 1.0 / math.sqrt(d)
    with torch.no_grad():
        # norms in float64: a float32 sum of squares would itself overflow
        q_max = float(torch.linalg.vector_norm(query, dim=-1, dtype=torch.float64).max())
        k_max = float(torch.linalg.vector_norm(key, dim=-1, dtype=torch.float64).max())
        v_top = max(1.0, float(value.abs().max())) if value.numel() else 1.0
    if not all(map(math.isfinite, (q_max, k_max, v_top))):
        return  # NaN or Inf in the inputs: they propagate, as in every other form
    s_max = factor * q_max * k_max
    log_limit = math.log(torch.finfo(cd).max / 2)

    def log_of(x: float) -> float:
        return math.log(x) if x > 0 else -math.inf

    weights = order * log_of(max(s_max, 1.0)) - math.lgamma(order + 1)
    state = 2 * log_of(k_max)
    reach = math.log(nk * v_top) + max(weights, state)
    if reach > log_limit:
        raise ValueError(
            f"query and key with normalize=False give scores up to {s_max:.3g} (scale · "
            f"max‖query‖ · max‖key‖, key norms up to {k_max:.3g}): the Taylor sums over {nk} "
            f"keys could overflow {cd} (largest value {torch.finfo(cd).max:.3g}); use "
            f"normalize=True, smaller query/key (or scale), or float64 inputs"
        )


def _grouped_causal_kernel(
    query, key, value, problem, attn_mask, temperature, scale, normalize, order, mode,
):  # fmt: skip
    """A causal call with key/value heads fewer than the query's through the CPU causal
    kernel, which keeps its prefix state per key/value head (``ops/cpu/efficient_causal.c``):
    (its output, mode), or (None, the mode for the call with key and value repeated,
    ``grouped_attention``) where that kernel does not take the call (no CPU kernel for the
    efficient form here, ``auto`` picking the direct form, a mask that varies over heads or
    queries, the kernels unavailable). ``auto`` resolved to the direct form is
    handed on as "direct" (it is the direct form for the ungrouped call too, whose switch is
    longer): not weighed twice. Inputs checked with ``enable_gqa``."""
    # (the CPU kernel's name: CPU tensors, and not the Triton interpreter, where the
    # efficient form is the Triton kernel's, which takes one key/value head per query head)
    if order != 2 or _torch_func_active():
        return None, mode
    if kernel_name("efficient", True, query.device) != CPU_EFFICIENT_CAUSAL:
        return None, mode
    if varies_over_heads(attn_mask) or problem.mask_varies_over_queries:
        return None, mode
    chosen = mode
    if mode == "auto":
        chosen = _auto_mode(
            grouped_problem(problem, query.shape[1] // key.shape[1]), causal=True,
            order=order, mask_varies=False, device=query.device, dtype=query.dtype,
            backward=backward_follows(query, key, value, temperature),
        )  # fmt: skip
    if chosen != "efficient":  # (direct, or a symbolic choice under torch.export)
        return None, "direct" if chosen == "direct" else mode
    fused = fused_form(query, problem, chosen, True, order)
    if fused is None:
        return None, mode
    key_mask = None if problem.key_mask is None else problem.key_mask[:, : key.shape[1]]
    if key_mask is not None:
        key, value = drop_masked_content(key, value, key_mask)
    if not normalize:
        check_plain_score_range(query, key, value, scale, order)
    args = (query, key, value, key_mask, temperature, scale, normalize)
    if torch.compiler.is_compiling():
        return fused(*args), mode
    # (a CPU kernel needs no probe of its backward: fused_form refused failed shape classes)
    kernel = shape_class(CPU_EFFICIENT_CAUSAL, query, problem, True)
    # (a kernel that fails: the PyTorch causal form of the same call, which takes the
    # key/value heads as they are too)
    return run_guarded(
        kernel, lambda: fused(*args), lambda: causal_efficient_taylor_shift(*args)
    ), mode


def grouped_problem(problem: Problem, groups: int) -> Problem:
    """The call ``mode="auto"`` weighs for a grouped causal call of the CPU kernel: its
    lengths N times 2G / (G + 1). The kernel runs the key side of its feature products (half
    of them, forward and backward) once per key/value head, so its cost is about
    (1 + 1/G) / 2 of an ungrouped call's, while the direct form's is unchanged; every
    decision of ``dispatch`` compares 2·Nq·Nk / (Nq + Nk) with a switch length, which
    lengths scaled by 2G / (G + 1) compare with the switch scaled by (1 + 1/G) / 2
    (benchmarks/gqa_cpu/causal-auto.txt, G = 4: auto's time within 1.16x of the faster
    form's, 1.61x when it weighed the ungrouped call)."""
    scale = lambda n: n * 2 * groups // (groups + 1)  # noqa: E731
    return replace(problem, n_query=scale(problem.n_query), n_key=scale(problem.n_key))


def _check_state_call(
    query, value, problem, is_causal, order, mode, initial_state, output_final_state,
    heads=None,
):  # fmt: skip
    """Refuse ``initial_state`` / ``output_final_state`` where the causal efficient form
    cannot honour them (see ``taylor_shift_attention``); inputs already checked. ``heads``:
    the state's (the key/value heads of a grouped call), by default the query's."""
    what = "initial_state" if initial_state is not None else "output_final_state"
    if _torch_func_active():
        raise ValueError(
            "initial_state, output_final_state: not supported under torch.func transforms "
            f"(grad, vmap, ...); expected None and False, got "
            f"{type(initial_state).__name__} and {output_final_state}"
        )
    if not is_causal:
        raise ValueError(
            f"{what} continues a causal sweep: it needs is_causal=True; got is_causal=False"
        )
    check_bool("output_final_state", output_final_state)
    if mode == "direct" or order != 2 or problem.mask_varies_over_queries:
        why = (
            "mode='direct'" if mode == "direct"
            else f"order={order}" if order != 2
            else "a mask that varies over queries"
        )  # fmt: skip
        raise ValueError(
            f"{what} needs the efficient form (mode 'auto' or 'efficient', order 2, at most a "
            f"key-padding mask); got {why}"
        )
    if initial_state is not None:
        b, h, _, d = query.shape
        dv = value.shape[-1]
        h = h if heads is None else heads
        check_state(initial_state, b, h, d, dv, query.dtype, query.device, "initial_state")
