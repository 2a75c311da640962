"""The public op: ``taylor_shift_attention``, one entry point for every form."""

from __future__ import annotations

import torch
from torch import Tensor

from .checks import check_inputs
from .direct import direct_taylor_shift
from .dispatch import choose_mode
from .efficient import efficient_taylor_shift
from .efficient_causal import causal_efficient_taylor_shift
from .features import drop_masked_content
from .fused import fused_form, kernel_name, probe_backward, run_guarded, shape_class


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
) -> Tensor:
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

    Returns:
        (B, H, Nq, dv) in the dtype of ``query``. float16/bfloat16 inputs are accumulated in
        float32.

    Raises:
        TypeError, ValueError: for bad input, naming the argument, the expected and the
        actual value.
    """
    problem = check_inputs(
        query, key, value, attn_mask, is_causal, temperature, scale, normalize, order, mode
    )
    if mode == "auto":
        mode = _choose_mode(
            problem.n_query,
            problem.n_key,
            problem.head_dim,
            problem.value_dim,
            causal=is_causal,
            order=order,
            mask_varies=problem.mask_varies_over_queries,
            device=query.device,
            dtype=query.dtype,
            backward=_backward_follows(query, key, value, temperature),
            batch_heads=problem.batch * problem.heads,
        )
    # A masked key's content must not matter (a NaN in padding would poison the sums):
    # keys no query attends become zeros before any form sees them.
    if problem.key_mask is not None:
        key, value = drop_masked_content(key, value, problem.key_mask)
    elif problem.mask is not None:
        key, value = drop_masked_content(key, value, problem.mask.any(-2))
    fused = fused_form(query, problem, mode, is_causal, order)
    if fused is not None:
        args = (query, key, value, problem.key_mask)
        args += (is_causal,) if mode == "direct" else ()
        if torch.compiler.is_compiling():
            # Traced code calls the kernel's custom op as it is: the guard below (a try
            # around a launch, a probe of the backward) has no meaning inside a graph.
            return fused(*args, temperature, scale, normalize)
        # A kernel that cannot compile or launch here falls back to the PyTorch form below
        # (warned once, remembered per shape class; ops/taylor_shift/fused.py).
        kernel = shape_class(kernel_name(mode, is_causal), query, problem, is_causal)
        backward = _backward_follows(query, key, value, temperature)
        if not backward or probe_backward(kernel, fused, mode, query):
            out = run_guarded(kernel, lambda: fused(*args, temperature, scale, normalize))
            if out is not None:
                return out
    if mode == "direct":
        return direct_taylor_shift(
            query, key, value, problem.mask, is_causal, temperature, scale, normalize, order
        )
    form = causal_efficient_taylor_shift if is_causal else efficient_taylor_shift
    return form(query, key, value, problem.key_mask, temperature, scale, normalize)


# torch.compile runs the choice once while tracing and keeps its answer in the graph (it
# depends on shapes, dtype and device only, which the graph is specialised on anyway), so
# the calibration file is read outside the traced code.
_choose_mode = torch.compiler.assume_constant_result(choose_mode)


def _backward_follows(*inputs: object) -> bool:
    """Whether autograd records this call (then auto uses the forward + backward calibration)."""
    return torch.is_grad_enabled() and any(
        isinstance(t, Tensor) and t.requires_grad for t in inputs
    )
