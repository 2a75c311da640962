"""Gradients that can be differentiated again, for the forms' autograd Functions.

The forms' backward passes are hand-written and first-order (as FlashAttention's). When
autograd asks a backward for a graph (``torch.autograd.grad(..., create_graph=True)``, as a
gradient penalty or a Hessian-vector product does), it runs the backward with gradients
enabled; the forms then return ``reference_grads``: the same gradients recomputed through
``naive_taylor_shift_attention``'s plain torch ops, which autograd can differentiate to any
order. That costs the reference's time and its (Nq, Nk) weights in memory, in the
backward only; first-order training never takes this path. The Triton kernels' backward
passes refuse such a request (``refuse_graph``) with an error that says what to do.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .features import compute_dtype
from .naive import naive_taylor_shift_attention


def wants_graph() -> bool:
    """Inside a backward: whether autograd asks for a differentiable result
    (``create_graph=True`` runs backward passes with gradients enabled)."""
    return torch.is_grad_enabled()


def refuse_graph(where: str) -> None:
    """In a backward that has no differentiable variant: a clear error when autograd asks
    for a graph, instead of autograd's own about a missing derivative."""
    if torch.is_grad_enabled():
        raise RuntimeError(
            f"create_graph=True: {where} compute first-order gradients only; run the PyTorch "
            "forms (TAYLORSHIFT_TRITON=off), whose gradients differentiate again, or take "
            "second derivatives with torch.func (grad, hessian)"
        )


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
    query, key, value, temperature = inputs
    cd = compute_dtype(query.dtype)
    if not normalize:
        score = {"scale": factor}
    elif temperature is None:
        score = {"temperature": factor}
    else:
        score = {"temperature": temperature.to(cd)}
    wanted = [x for x, need in zip(inputs, needs, strict=True) if need]
    with torch.enable_grad():
        out = naive_taylor_shift_attention(
            query.to(cd), key.to(cd), value.to(cd), mask, is_causal,
            normalize=normalize, order=order, **score,
        )  # fmt: skip
        grads = iter(
            torch.autograd.grad(out, wanted, grad_out.to(cd), create_graph=True, allow_unused=True)
        )
    result: list[Tensor | None] = []
    for x, need in zip(inputs, needs, strict=True):
        if not need:
            result.append(None)
            continue
        g = next(grads)
        result.append(torch.zeros_like(x) if g is None else g.to(x.dtype))
    return tuple(result)
