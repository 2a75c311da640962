"""The decoding step of causal TaylorShift in one CPU kernel (``ts_decode_step`` of
``decode.c``).

One new token per head against the constant-size state of
``taylorshift.ops.taylor_shift.decode``: normalise the query and the key, form their
features, add the key's to the state, ``S += φ(k')ᵀ [v, 1]``, and read the updated state
out, ``y = (c ⊙ φ(q')) S`` finished by ``sqrt(n/d) / den``, in one pass over S per head
(the PyTorch step runs about fifteen tensor operations and reads the state twice). The
state is the PyTorch step's, in place, so a decoding loop can switch between the two at any
token (docs/lm.md). Eagerly the kernel is called directly (a decoding step is a few µs of
arithmetic: dispatch would dominate); under ``torch.compile`` through the operator
``taylorshift::cpu_decode_step``, which mutates the state.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..taylor_shift.features import NORM_EPS
from .build import library
from .wrapper import MAX_HEAD_DIM, kernel_threads, ptr


def decode_step_supported(sums: Tensor, count: Tensor, query: Tensor, value: Tensor) -> bool:
    """Whether ``decode_step`` takes this step: a contiguous float32 state (sums and count)
    on the CPU and head dims the kernels hold (the caller also checks that the kernels are
    built)."""
    return (
        sums.device.type == "cpu"
        and sums.dtype == torch.float32
        and sums.is_contiguous()
        and count.is_contiguous()
        and query.shape[-1] <= MAX_HEAD_DIM
        and value.shape[-1] <= MAX_HEAD_DIM
    )


def decode_step(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    sums: Tensor,
    count: Tensor,
    tau: Tensor | float,
    key_mask: Tensor | None,
    normalize: bool,
) -> Tensor:
    """One token per row, ``sums`` (B, Hkv, D, dv + 1) and ``count`` (B, Hkv) updated in
    place; returns out (B, H, 1, dv) in query's dtype. query (B, H, 1, d), key (B, Hkv, 1, d),
    value (B, Hkv, 1, dv), Hkv = H or dividing H (grouped queries: query head h reads state
    h // (H / Hkv)); τ a float or a tensor broadcasting to (B, H, 1, 1) (the query's factor,
    the scale folded in); key_mask (B, 1 or Hkv, 1) bool or None (a padded token joins no
    sum). The state must pass ``decode_step_supported`` and ``count`` be a contiguous
    float32 (B, Hkv)."""
    b, h = query.shape[:2]
    kv_heads = key.shape[1]
    if torch.compiler.is_compiling():
        factors = _factors(tau, b, h)
        real = None if key_mask is None else key_mask.expand(b, kv_heads, 1).reshape(-1)
        return cpu_decode_step(query, key, value, sums, count, factors, real, normalize)
    factors = _factors(tau, b, h) if isinstance(tau, Tensor) else None
    scalar = 1.0 if factors is not None else float(tau)
    real = None if key_mask is None else _real(key_mask, b, kv_heads)
    return _step(query, key, value, sums, count, factors, scalar, real, normalize)


def _step(query, key, value, sums, count, factors, scalar, real, normalize) -> Tensor:
    """One ``ts_decode_step`` call: factors (B·H,) float32 or None for the float ``scalar``,
    real (B·Hkv,) uint8 or None; out (B, H, 1, dv) in query's dtype."""
    b, h, _, d = query.shape
    kv_heads, dv = key.shape[1], value.shape[-1]
    q, k, v = _rows(query), _rows(key), _rows(value)
    out = torch.empty(b, h, 1, dv, dtype=torch.float32)
    groups = h // kv_heads if kv_heads else 1
    library().ts_decode_step(b * kv_heads, groups, d, dv, ptr(q), ptr(k), ptr(v), ptr(factors),
                             scalar, ptr(real), int(normalize), NORM_EPS, ptr(sums), ptr(count),
                             ptr(out), kernel_threads())  # fmt: skip
    return out if query.dtype == torch.float32 else out.to(query.dtype)


def _rows(x: Tensor) -> Tensor:
    """What C reads of (B, H, 1, k): contiguous float32, i.e. (B·H, k) rows at its address;
    returned as it is when it already is (a step is a few µs of arithmetic: each torch call
    counts)."""
    if x.dtype == torch.float32 and x.is_contiguous():
        return x
    return x.to(torch.float32).contiguous()


def _factors(tau: Tensor | float, b: int, h: int) -> Tensor:
    """The query factors per head, (B·H,) float32 at the address (a (B, H, 1, 1) or, with
    B = 1, a (1, H, 1, 1) float32 tensor as it is)."""
    if not isinstance(tau, Tensor):
        return torch.full((b * h,), float(tau), dtype=torch.float32)
    if tau.dtype == torch.float32 and tau.numel() == b * h and tau.is_contiguous():
        return tau
    return tau.to(torch.float32).expand(b, h, 1, 1).reshape(b * h).contiguous()


def _real(key_mask: Tensor, b: int, h: int) -> Tensor:
    return key_mask.expand(b, h, 1).reshape(b * h).to(torch.uint8).contiguous()


# The step as an operator for torch.compile, declared with torch.library.Library rather than
# torch.library.custom_op: compiled code calls it through the dispatcher, where a mutating
# custom_op's layer re-reads its schema argument by argument on every call (~80 µs a step
# here, three times the kernel; this way ~25 µs: benchmarks/decode_cpu/tiled-step).
_LIBRARY = torch.library.Library("taylorshift", "FRAGMENT")
_LIBRARY.define(
    "cpu_decode_step(Tensor query, Tensor key, Tensor value, Tensor(a!) sums, Tensor(b!) count, "
    "Tensor factors, Tensor? real, bool normalize) -> Tensor"
)


def _cpu_decode_step(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    sums: Tensor,
    count: Tensor,
    factors: Tensor,
    real: Tensor | None,
    normalize: bool,
) -> Tensor:
    """``decode_step`` for ``torch.compile``: per-query-head factors (B·H,) float32 and the
    key mask as bool (B·Hkv,) or None; updates ``sums`` and ``count``."""
    factors = factors.to(torch.float32).contiguous()
    mask = None if real is None else real.to(torch.uint8).contiguous()
    return _step(query, key, value, sums, count, factors, 1.0, mask, normalize)


_LIBRARY.impl("cpu_decode_step", _cpu_decode_step, "CPU")


@torch.library.register_fake("taylorshift::cpu_decode_step", lib=_LIBRARY)
def _(query, key, value, sums, count, factors, real, normalize):
    b, h = query.shape[:2]
    return query.new_empty((b, h, 1, value.shape[-1]))


cpu_decode_step = torch.ops.taylorshift.cpu_decode_step
