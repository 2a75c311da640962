"""Grouped-query attention: key and value with fewer heads than the query.

With ``enable_gqa=True`` (SDPA's name and convention) key and value may have Hkv heads,
Hkv dividing H: query head h attends through key/value head ``h // (H / Hkv)``, as if
key and value had been repeated with ``repeat_interleave(H // Hkv, dim=1)``.

Non-causal calls run as Hkv heads of G · Nq queries each (G = H / Hkv): the queries of a
group are stacked along the token axis, a reshape of the query. Every query row attends
the same keys with the same weights as before, so each form computes the same attention,
and the key-side work is done once per key/value head instead of G times: the efficient
form's state Σ φ(k')ᵀ [v, 1] and the key counts, the direct form's key normalisation; no
key or value is copied. ``mode="auto"`` then weighs the forms for the stacked call, whose
operation counts are the grouped call's. This needs the query heads of a group to differ
in nothing but their queries: a mask or a temperature that varies over heads, and causal
calls (stacked, a query would lose its position), repeat key and value to H heads first
(a copy, as SDPA's reference path does) — except causal calls of the efficient form that
the CPU kernel takes (``interface._grouped_causal_kernel``): it keeps its prefix state per
key/value head and reads each for the G query heads of its group (ops/cpu/efficient_causal.c).

Decoding (``decode.py``) and causal calls with ``initial_state`` or ``output_final_state``
(``interface._grouped_state_call``) keep the causal state per key/value head instead: the
chunked sweep (``efficient_causal``, forward and backward; the CPU causal kernel without
gradients) and the single-token step (the CPU kernel too) read each state for the G query
heads of its group. The Triton causal form, whose chunk states have no groups, takes such
calls with key, value and the state repeated (``repeated_heads``), as it takes causal calls
without a state. The checks are
``checks.check_inputs(..., enable_gqa=True)``.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from ..masks import as_4d
from .state import TaylorShiftState


def grouped_attention(
    attend: Callable[..., Tensor],
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None,
    is_causal: bool,
    temperature: Tensor | float,
    **options: object,
) -> Tensor:
    """``attend(query, key, value, attn_mask, is_causal, temperature=..., **options)``, the
    op without grouping, for key and value of Hkv < H heads (inputs already checked)."""
    b, heads, nq, d = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    if is_causal or varies_over_heads(attn_mask) or varies_over_heads(temperature):
        key, value = (t.repeat_interleave(groups, dim=1) for t in (key, value))
        return attend(query, key, value, attn_mask, is_causal, temperature=temperature, **options)
    stacked = query.reshape(b, kv_heads, groups * nq, d)
    if attn_mask is not None:
        attn_mask = _stacked_mask(attn_mask, groups, nq)
    out = attend(stacked, key, value, attn_mask, False, temperature=temperature, **options)
    return out.reshape(b, heads, nq, out.shape[-1])


def varies_over_heads(t: object) -> bool:
    """A mask or temperature tensor with a head axis of its own (dim -3 of (·, H, ·, ·))."""
    return isinstance(t, Tensor) and t.dim() >= 3 and t.shape[-3] > 1


def _stacked_mask(mask: Tensor, groups: int, nq: int) -> Tensor:
    """A mask of one head axis for the stacked queries: rows repeated for each group member
    (a key-padding mask, one row for all queries, stays as it is)."""
    mask = as_4d(mask)
    rows = mask.shape[2]
    if rows == 1:
        return mask
    mb, _, _, nk = mask.shape
    return mask.unsqueeze(2).expand(mb, 1, groups, rows, nk).reshape(mb, 1, groups * nq, nk)


def repeated_heads(form: Callable[..., Tensor], groups: int) -> Callable[..., Tensor]:
    """``form``, a causal form with the state arguments that takes one key/value head per
    query head, for key and value of H / ``groups`` heads: key, value, the key mask
    (B, Hkv, Nk) and the initial state repeated to the query's heads, the state after read
    back per key/value head (the heads of a group hold the same one: the same keys and
    values, a mask the same for every head). Gradients reach the initial state's sums
    through the repeat (summed over each group)."""

    def call(query, key, value, key_mask, *rest, initial_state=None, output_final_state=False):
        key, value = (t.repeat_interleave(groups, dim=1) for t in (key, value))
        if key_mask is not None:
            key_mask = key_mask.repeat_interleave(groups, dim=1)
        if initial_state is not None:
            initial_state = TaylorShiftState(
                *(t.repeat_interleave(groups, dim=1) for t in (initial_state.sums,
                                                               initial_state.count))
            )  # fmt: skip
        result = form(
            query, key, value, key_mask, *rest, initial_state=initial_state,
            output_final_state=output_final_state,
        )  # fmt: skip
        if not output_final_state:
            return result
        out, after = result
        return out, TaylorShiftState(
            after.sums[:, ::groups].contiguous(), after.count[:, ::groups].contiguous()
        )

    return call
