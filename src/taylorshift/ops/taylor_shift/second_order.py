"""Gradients that can be differentiated again, for the forms' autograd Functions.

The forms' backward passes are hand-written and first-order (as FlashAttention's). When
autograd asks a backward for a graph (``torch.autograd.grad(..., create_graph=True)``, as a
gradient penalty or a Hessian-vector product does), it runs the backward with gradients
enabled; the forms then return ``reference_grads``: the same gradients recomputed through
``naive_taylor_shift_attention``'s plain torch ops, which autograd can differentiate to any
order. That costs the reference's time and its (Nq, Nk) weights in memory, in the
backward only; first-order training never takes this path. The fused kernels' cores (Triton)
take the same way through ``taylor_sums``, the sums they compute written in plain ops.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from .features import compute_dtype, taylor_weight
from .naive import naive_taylor_shift_attention


def wants_graph() -> bool:
    """Inside a backward: whether autograd asks for a differentiable result
    (``create_graph=True`` runs backward passes with gradients enabled)."""
    return torch.is_grad_enabled()


def graph_grads(
    fn: Callable[..., Tensor],
    grad_out: Tensor,
    inputs: Sequence[Tensor | None],
    needs: Sequence[bool],
) -> tuple[Tensor | None, ...]:
    """Gradients of ``fn(*inputs)`` against ``grad_out`` w.r.t. the inputs that ``needs``
    marks, as a graph over them and ``grad_out`` (None for the others; zeros for one the
    output does not depend on), in each input's dtype."""
    wanted = [x for x, need in zip(inputs, needs, strict=True) if need]
    with torch.enable_grad():
        out = fn(*inputs)
        grads = iter(
            torch.autograd.grad(
                out, wanted, grad_out.to(out.dtype), create_graph=True, allow_unused=True
            )
        )
    result: list[Tensor | None] = []
    for x, need in zip(inputs, needs, strict=True):
        if not need:
            result.append(None)
            continue
        g = next(grads)
        result.append(torch.zeros_like(x) if g is None else g.to(x.dtype))
    return tuple(result)


def taylor_sums(qp: Tensor, kp: Tensor, u: Tensor, is_causal: bool) -> Tensor:
    """Σ_j w(q'_i·k'_j) u_j, w(s) = 1 + s + s²/2, in float32 plain torch ops: what the fused
    kernels' cores compute from the scaled q', k' (the reference of their backward passes
    asked for a graph). Masked keys come as zero rows of ``u`` (``values_with_ones``);
    causal is upper-left aligned."""
    w = taylor_weight(qp.float() @ kp.float().transpose(-2, -1), 2)
    return (w.tril() if is_causal else w) @ u.float()


def reference_grads(
    grad_out: Tensor,
    inputs: Sequence[Tensor | None],
    needs: Sequence[bool],
    mask: Tensor | None,
    is_causal: bool,
    factor: float,
    normalize: bool,
    order: int = 2,
) -> tuple[Tensor | None, ...]:
    """Gradients w.r.t. ``inputs`` = (query, key, value, temperature or None) of the op's
    output against ``grad_out``, as a graph over the inputs and ``grad_out``.

    ``mask`` broadcasts to (B, H, Nq, Nk) (True = attend); the score factor is the tensor
    temperature when there is one, else ``factor`` (τ with ``normalize``, the scale
    without), as the forms take it (``features.split_factor``). float16/bfloat16 inputs are
    computed in float32, as the forms do. ``needs[i]`` False gives None.
    """
    cd = compute_dtype(inputs[0].dtype)

    def forward(query: Tensor, key: Tensor, value: Tensor, temperature: Tensor | None) -> Tensor:
        if not normalize:
            score = {"scale": factor}
        else:
            score = {"temperature": factor if temperature is None else temperature.to(cd)}
        return naive_taylor_shift_attention(
            query.to(cd), key.to(cd), value.to(cd), mask, is_causal,
            normalize=normalize, order=order, **score,
        )  # fmt: skip

    return graph_grads(forward, grad_out, inputs, needs)
