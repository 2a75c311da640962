"""The causal prefix state of TaylorShift: what a causal sweep carries past its last key.

One type serves every causal path: ``taylor_shift_attention(..., is_causal=True,
initial_state=..., output_final_state=True)`` (a sequence in segments, fla's convention),
``taylor_shift_decode`` (prefill, then a token at a time), the layer caches of
``taylorshift.nn`` and sequence parallelism (which sends only the sums through its
collectives and reads the count back from them, ``TaylorShiftState.from_sums``). The causal
forms take it as ``initial_state=`` and return it with ``output_final_state=True``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .efficient import key_side_grads
from .features import compute_dtype, feature_dim


@dataclass
class TaylorShiftState:
    """The causal prefix of one attention layer: what a causal sweep, a decoding step or a
    later segment of the sequence needs of the keys before it.

    Attributes:
        sums: (B, H, D, dv + 1), Σ_j φ(k'_j)ᵀ [v_j, 1] over the real keys so far, in the
            compute dtype (float32, or float64 for float64 inputs).
        count: (B, H), how many real keys ``sums`` holds (the n_i of the output factor).
    """

    sums: Tensor
    count: Tensor

    @classmethod
    def zeros(
        cls, batch: int, heads: int, head_dim: int, value_dim: int, *, device=None, dtype=None
    ) -> TaylorShiftState:
        """The state before any token; ``dtype`` is the inputs' dtype (float32 by default)."""
        cd = compute_dtype(dtype or torch.float32)
        sums = torch.zeros(
            (batch, heads, feature_dim(head_dim), value_dim + 1), dtype=cd, device=device
        )
        return cls(sums, torch.zeros((batch, heads), dtype=cd, device=device))

    @classmethod
    def from_sums(cls, sums: Tensor) -> TaylorShiftState:
        """The state whose sums are ``sums`` (B, H, D, dv + 1), its count read from them.

        φ ends with the constant feature 1 and [v, 1] with the ones column (zero for masked
        keys), so ``sums[..., -1, -1]`` is the number of real keys, exact in floating point
        (a sum of ones). The count is detached: gradients flow through ``sums`` only.
        """
        return cls(sums, sums[..., -1, -1].detach())

    @property
    def nbytes(self) -> int:
        """Bytes held: constant in the number of tokens decoded."""
        return self.sums.nbytes + self.count.nbytes

    def select(self, index: Tensor) -> TaylorShiftState:
        """The states of batch items ``index`` (e.g. to drop finished sequences)."""
        return TaylorShiftState(self.sums[index], self.count[index])


def check_state(
    state: TaylorShiftState, b: int, h: int, d: int, dv: int, dtype, device, name: str = "state"
) -> None:
    """Refuse a state that does not fit inputs (B, H, ·, d) / (B, H, ·, dv) of ``dtype`` on
    ``device``; ``name`` is the argument named in the message."""
    if not isinstance(state, TaylorShiftState):
        raise TypeError(f"{name} must be a TaylorShiftState or None; got {type(state).__name__}")
    want = (b, h, feature_dim(d), dv + 1)
    if tuple(state.sums.shape) != want or tuple(state.count.shape) != (b, h):
        raise ValueError(
            f"{name} must hold sums of shape {want} and count of shape {(b, h)} for these "
            f"inputs; got {tuple(state.sums.shape)} and {tuple(state.count.shape)}"
        )
    if state.sums.dtype != compute_dtype(dtype) or state.sums.device != device:
        raise ValueError(
            f"{name} must be {compute_dtype(dtype)} on {device} for {dtype} inputs; got "
            f"{state.sums.dtype} on {state.sums.device}"
        )
    if state.count.dtype != state.sums.dtype or state.count.device != state.sums.device:
        raise ValueError(
            f"{name}'s count must be {state.sums.dtype} on {state.sums.device} like its sums; "
            f"got {state.count.dtype} on {state.count.device}"
        )


def real_keys(
    key_mask: Tensor | None, b: int, h: int, nk: int, dtype: torch.dtype, device
) -> Tensor:
    """How many of a block's Nk keys are real, (B, H) in ``dtype``: all of them, or those
    ``key_mask`` (B, H, Nk) bool (broadcast views fine) keeps. What the block adds to a
    state's count."""
    if key_mask is None:
        return torch.full((b, h), float(nk), dtype=dtype, device=device)
    return key_mask.sum(-1).to(dtype).expand(b, h).contiguous()


def final_state(
    sums: Tensor,
    count: Tensor,
    key: Tensor,
    value: Tensor,
    key_mask: Tensor | None,
    normalize: bool,
    initial_sums: Tensor | None,
    chunk: int = 256,
) -> TaylorShiftState:
    """The state after a causal block, whose ``sums`` a form has computed (no autograd
    history), made differentiable as what it is: S = S_0 + Σ_j φ(k'_j)ᵀ [v_j, 1] over the
    block's real keys, S_0 = ``initial_sums`` (None: no key before the block). A loss on a
    later segment's output then reaches this block's key and value and the sums before it,
    as it would through one call over the whole sequence. Only where autograd will ask:
    otherwise the state is returned as it is. ``chunk``: tokens per step of the backward."""
    inputs = (key, value) if initial_sums is None else (key, value, initial_sums)
    if torch.is_grad_enabled() and any(x.requires_grad for x in inputs):
        sums = FinalSumsFunction.apply(sums, key, value, initial_sums, key_mask, normalize, chunk)
    return TaylorShiftState(sums, count)


class FinalSumsFunction(torch.autograd.Function):
    """``final_state``'s sums: forward returns the value computed (a copy: an output must
    not be one of the inputs), backward gives ∂S/∂S_0 = identity and the key and value
    gradients of Σ_j φ(k'_j)ᵀ [v_j, 1] (``efficient.key_side_grads``, chunk by chunk, no
    (N, D) feature gradient formed). First-order only, as the forms' own backward passes."""

    @staticmethod
    def forward(ctx, sums, key, value, initial_sums, key_mask, normalize, chunk):
        ctx.save_for_backward(key, value, key_mask)
        ctx.normalize, ctx.chunk = normalize, chunk
        return sums.clone()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        key, value, key_mask = ctx.saved_tensors
        need_k, need_v, need_s = ctx.needs_input_grad[1:4]
        g_key, g_value = key_side_grads(
            key, value, key_mask, grad.to(compute_dtype(key.dtype)), ctx.normalize, ctx.chunk,
            need_k, need_v,
        )  # fmt: skip
        return None, g_key, g_value, grad if need_s else None, None, None, None
