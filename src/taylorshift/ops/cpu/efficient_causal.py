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
a chunk cost more than the products at d <= 32. No prefix state is stored. No initial or
final state (those calls run the PyTorch form). The autograd.Function and the custom ops
around the two calls are the ones the three kernel forms share (``wrapper.py``).
"""

from __future__ import annotations

from torch import Tensor

from .wrapper import check_kernel_inputs, run


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
) -> Tensor:
    """Causal efficient TaylorShift with the CPU kernels, on validated inputs.

    Same contract and signature as
    ``taylorshift.ops.taylor_shift.efficient_causal.causal_efficient_taylor_shift`` without
    its initial and final states: query (B, H, Nq, d), key (B, Hkv, Nk, d), value
    (B, Hkv, Nk, dv), key_mask (B, Hkv, Nk) bool or None; query i attends key j iff j <= i.
    Hkv = H, or grouped-query attention: Hkv dividing H, query head h reading key/value head
    h // (H / Hkv), the prefix state kept per key/value head.
    Returns (B, H, Nq, dv) in value's dtype. CPU tensors of float32, float16 or bfloat16
    (sums in float32). ``chunk_size``: tokens per chunk (default: ``default_chunk(d)``).
    """
    check_kernel_inputs(query, value, "causal efficient form")
    chunk = chunk_size or default_chunk(query.shape[-1])
    return run("causal", chunk, query, key, value, key_mask, temperature, scale, normalize)
