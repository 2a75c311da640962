"""Direct TaylorShift in CPU kernels (``direct.c``): forward and backward, key padding and
causal, for the short sequences where the direct form is the faster one.

Layout (B, H, N, d). ``ts_direct_forward`` computes, per head and tile of 64 query rows,
the scores q'k'ᵀ, the weights 1 + s + s²/2 on the attended pairs, their row sums and the
weighted values, finished by sqrt(n/d)/den; ``ts_direct_backward`` recomputes each tile's
scores and gives the gradients w.r.t. q, k, v and the temperature (docs/cpu-kernel.md).
The maps q -> q' = τ q/‖q‖, k -> k' and their backward run inside both (``rows.h``, shared
with ``efficient.c``). Sums in float32 (float16 and bfloat16 inputs
are converted); float64 stays on the PyTorch form. The autograd.Function and the custom ops
around the two calls are the ones the three kernel forms share (``wrapper.py``).
"""

from __future__ import annotations

from torch import Tensor

from .wrapper import check_kernel_inputs, run


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
    ``KernelFunction`` (``wrapper.py``).
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
    return run("direct", int(is_causal), query, key, value, key_mask, temperature, scale,
               normalize)  # fmt: skip
