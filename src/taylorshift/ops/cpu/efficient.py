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
inputs are converted); float64 stays on the PyTorch form. The autograd.Function and the
custom ops around the two calls are the ones the three kernel forms share (``wrapper.py``).
"""

from __future__ import annotations

from torch import Tensor

from .wrapper import check_kernel_inputs, run


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
    Under ``torch.compile`` the custom ops run; eagerly, ``KernelFunction`` (``wrapper.py``).
    """
    check_kernel_inputs(query, value, "efficient form")
    return run("efficient", 0, query, key, value, key_mask, temperature, scale, normalize)
