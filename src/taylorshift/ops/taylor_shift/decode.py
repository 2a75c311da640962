"""Autoregressive decoding with a constant-size state (SPEC §2.3).

Causal TaylorShift only ever needs, for the keys before a token, the sums

    S = Σ_j φ(k'_j)ᵀ [v_j, 1]     (B, H, D, dv + 1), D = d(d+1)/2 + d + 1
    n = number of keys summed     (B, H)

so a decoder keeps (S, n) per layer in place of a key/value cache: O(H · d² · dv) memory
whatever the context length, O(d² · dv) work per generated token. ``taylor_shift_decode``
takes T new tokens, lets each attend every earlier token through the state and the new
ones causally (the chunked causal form of ``efficient_causal``), and returns the outputs
and the state after them: a prompt is prefilled with T = its length, then tokens come
one at a time (T = 1), and the outputs equal the parallel causal form.

Padding: ``key_padding_mask`` (B, T) marks real tokens; a padded token adds nothing to the
state or the count, so right-padded prompts of different lengths share one batch. Its
own output row is not meaningful (it attends the real tokens before it) and should be
ignored, as with a padded query of the parallel form.
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import Tensor

from ..._inference import inference_only
from ..._validate import check_bool, check_int
from .checks import check_inputs
from .efficient import query_factor
from .efficient_causal import DEFAULT_CAUSAL_CHUNK, causal_forward
from .features import (
    NORM_EPS,
    compute_dtype,
    drop_masked_content,
    features,
    scaled_key,
    scaled_query,
    score_factor,
    state_weights,
)
from .fused import cpu_kernels_ready
from .interface import causal_state_call
from .state import TaylorShiftState, check_state


@inference_only
def taylor_shift_decode(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    state: TaylorShiftState | None = None,
    key_padding_mask: Tensor | None = None,
    *,
    temperature: Tensor | float = 1.0,
    scale: float | None = None,
    normalize: bool = True,
    chunk_size: int | None = None,
    inplace: bool = False,
    enable_gqa: bool = False,
) -> tuple[Tensor, TaylorShiftState]:
    """Causal TaylorShift for T new tokens after the tokens summed in ``state``.

    Token t of the block attends every token in ``state`` and the new tokens 0..t, exactly
    as row ``n + t`` of ``taylor_shift_attention(..., is_causal=True)`` over the whole
    sequence. Inference only (no autograd).

    Args:
        query, key, value: the new tokens, (B, H, T, d), (B, H, T, d), (B, H, T, dv).
        state: the prefix (``TaylorShiftState``), or None before the first token.
        key_padding_mask: bool (B, T), True = real token; padded tokens join no sum.
        temperature: τ, a float or a tensor broadcastable to (B, H, 1, 1).
        scale, normalize: as ``taylor_shift_attention``.
        chunk_size: tokens per chunk of the causal sweep (prefill); default 256 (the CPU
            kernel's: ``taylorshift.ops.cpu.efficient_causal.default_chunk``).
        inplace: update ``state`` itself and return it (no new (B, H, D, dv + 1) tensor per
            step, as a decoding loop that never looks back wants; the layer caches do this).
            By default ``state`` is left as it was.
        enable_gqa: key and value may have Hkv heads, Hkv dividing H (grouped-query
            attention, as ``taylor_shift_attention``'s): the state then holds Hkv heads,
            H / Hkv times less memory, and each is read by its group of query heads.

    Returns:
        (out (B, H, T, dv) in the dtype of ``query``, the state after the block).

    One new token (T = 1, the decoding loop) takes a short path: the state is updated with
    the token first, ``S += φ(k')ᵀ [v, 1]`` (one batched rank-1 update), then read out,
    ``y' = (c ⊙ φ(q')) S``, which includes the token's attention to itself; a dozen tensor
    operations in all, or, for a float32 state on the CPU, one C kernel that does both in
    one pass over the state (``taylorshift.ops.cpu.decode``). Longer blocks (a prompt) run
    the chunked causal sweep: on the CPU in one call of the causal kernel where it applies
    (``taylorshift.ops.cpu.efficient_causal.state_forward``; float32, float16, bfloat16,
    d, dv <= 128), else in PyTorch.
    """
    mask = key_padding_mask
    if mask is not None:
        b, t = query.shape[0], query.shape[2]
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            what = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
            raise TypeError(f"key_padding_mask must be a bool tensor (B, T); got {what}")
        if tuple(mask.shape) != (b, t):
            raise ValueError(
                f"key_padding_mask must be (B, T) = ({b}, {t}); got {tuple(mask.shape)}"
            )
        mask = mask[:, None, None, :]
    if query.dim() == 4 and key.dim() == 4 and query.shape[2] != key.shape[2]:
        raise ValueError(
            f"query and key must hold the same new tokens; got T = {query.shape[2]} queries "
            f"and {key.shape[2]} keys"
        )
    if enable_gqa is not False:
        check_bool("enable_gqa", enable_gqa)
    if inplace is not False:
        check_bool("inplace", inplace)
    check_int("chunk_size", chunk_size, ge=1, allow_none=True)
    problem = check_inputs(
        query, key, value, mask, True, temperature, scale, normalize, 2, "efficient",
        enable_gqa=bool(enable_gqa),
    )  # fmt: skip
    b, h, _, d = query.shape
    kv_heads, dv = key.shape[1], value.shape[-1]
    if state is None:
        state = TaylorShiftState.zeros(b, kv_heads, d, dv, device=query.device, dtype=query.dtype)
    check_state(state, b, kv_heads, d, dv, query.dtype, query.device)
    cd = compute_dtype(query.dtype)
    factor = score_factor(temperature, scale, normalize, d)
    tau = query_factor(factor, 0.0, cd, b, h) if isinstance(factor, Tensor) else float(factor)
    key_mask = problem.key_mask  # (key padding only: every head's the same)
    if key_mask is not None and kv_heads != h:
        key_mask = key_mask[:, :kv_heads]
    key, value = drop_masked_content(key, value, key_mask)
    if query.shape[2] == 1:
        return _decode_one(query, key, value, state, key_mask, tau, normalize, inplace)
    # a prompt: the CPU causal kernel where it applies, else the PyTorch sweep (no autograd)

    def sweep(*_args, initial_state, output_final_state):
        out, _, _, after = causal_forward(
            query, key, value, tau, normalize, key_mask, chunk_size or DEFAULT_CAUSAL_CHUNK,
            initial_state,
        )  # fmt: skip
        return out, after

    args = (query, key, value, key_mask, temperature, scale, normalize, chunk_size)
    out, after = causal_state_call(sweep, args, problem, 2, state, True)
    if inplace:
        state.sums.copy_(after.sums)
        state.count.copy_(after.count)
        return out, state
    return out, after


@inference_only
def decode_token(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    state: TaylorShiftState,
    temperature: Tensor | float = 1.0,
    normalize: bool = True,
) -> Tensor:
    """One new token, no padding, ``state`` updated in place: the step of a decoding loop
    on inputs the caller vouches for, without the checks of ``taylor_shift_decode``.

    query, key (B, H, 1, d), value (B, H, 1, dv) and ``state`` (its sums in the compute
    dtype, (B, H, D, dv + 1)) must be what ``taylor_shift_decode`` would accept; τ a float or
    a (1 or B, H, 1, 1) tensor. The layer caches of ``taylorshift.nn`` call it from the
    second token on (their own projections and state: the checks would only cost time,
    32-47 µs a step at B 1, H 8, d = 32 on the project's 2-core CPU, a third of the checked
    step; benchmarks/decode_cpu/tiled-step/checks.txt). Returns out (B, H, 1, dv) in the
    dtype of ``query``, as
    ``taylor_shift_decode(..., inplace=True)[0]``.

    The CPU kernel's step is called with as few torch operations as it needs (the step is
    a few µs of arithmetic; docs/cpu-kernel.md). Only the state's shape, dtype and device
    are checked (a state from another model or batch would have the kernel read and write
    outside it).
    """
    check_step_state(state, query, key, value)
    b, h, _, d = query.shape
    factor = score_factor(temperature, None, normalize, d)
    kernel = _cpu_step(state.sums, state.count, query, value)
    if kernel is not None:
        return kernel.decode_step(
            query, key, value, state.sums, state.count, factor, None, normalize
        )
    cd = state.sums.dtype
    tau = query_factor(factor, 0.0, cd, b, h) if isinstance(factor, Tensor) else float(factor)
    return _decode_one(query, key, value, state, None, tau, normalize, True)[0]


def check_step_state(state: TaylorShiftState, query: Tensor, key: Tensor, value: Tensor) -> None:
    """Refuse a state that does not fit a step's query (B, H, 1, d), key (B, Hkv, 1, d) and
    value (B, Hkv, 1, dv): sums (B, Hkv, D, dv + 1) and count (B, Hkv) of the compute dtype,
    on the inputs' device: what the unchecked step needs before the CPU kernel writes into
    the state (a state made for another model or batch size would have it write outside).
    About 1.6 µs on the project's CPU, against 35-45 µs for the step at B 1, H 8, d = 32
    (benchmarks/decode_cpu/state-check)."""
    b, kv_heads, _, d = key.shape
    if type(state) is TaylorShiftState:
        sums, count = state.sums, state.count
        dtype = torch.float64 if query.dtype is torch.float64 else torch.float32
        if (
            sums.shape == (b, kv_heads, d * (d + 1) // 2 + d + 1, value.shape[-1] + 1)
            and count.shape == (b, kv_heads)
            and sums.dtype is dtype
            and count.dtype is dtype
            and sums.device == query.device
            and count.device == query.device
        ):
            return
    check_state(state, b, kv_heads, d, value.shape[-1], query.dtype, query.device)


def _decode_one(query, key, value, state, key_mask, tau, normalize, inplace):
    """One token per row: rank-1 state update, then the readout (see ``taylor_shift_decode``).

    The few operations a step can afford (docs/lm.md): the query and the key go through
    one normalisation and one feature map together, the state weights c are cached, and the
    state is read and written once each. Grouped queries (key, value and the state with
    Hkv < H heads): the G query heads of a key/value head read its state in one product.
    """
    b, h, _, d = query.shape
    kv_heads, dv = key.shape[1], value.shape[-1]
    groups = h // kv_heads if kv_heads else 1  # (no heads: an empty batch)
    sums, count = state.sums, state.count
    cd = sums.dtype
    if not inplace:
        sums, count = sums.clone(), count.clone()
    kernel = _cpu_step(sums, count, query, value)
    if kernel is not None:
        out = kernel.decode_step(query, key, value, sums, count, tau, key_mask, normalize)
        return out, state if inplace else TaylorShiftState(sums, count)
    if groups == 1:
        x = torch.cat([query, key], dim=2).to(cd)  # (B, H, 2, d): the query, then the key
        if normalize:
            x = x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(NORM_EPS)
        phi = features(x * _query_key_factor(tau, x))  # (B, H, 2, D)
        phi_q, phi_k = phi[:, :, :1], phi[:, :, 1:]
    else:  # (query and key with their own heads: normalised one by one)
        phi_q = features(scaled_query(query.to(cd), tau, normalize))
        phi_q = phi_q.reshape(b, kv_heads, groups, -1)  # (B, Hkv, G, D)
        phi_k = features(scaled_key(key.to(cd), normalize))  # (B, Hkv, 1, D)
    v = torch.nn.functional.pad(value.to(cd), (0, 1), value=1.0)  # [v, 1]
    if key_mask is not None:  # (B, H, 1): a padded token joins no sum
        real = key_mask.to(cd)
        v = v * real.unsqueeze(-1)
        count.add_(real.squeeze(-1))
    else:
        count.add_(1.0)
    n = sums.shape[-2]
    # S += φ(k')ᵀ [v, 1]: an elementwise rank-1 update, (B, H, D, 1) ⊙ (B, H, 1, dv + 1)
    # (2x faster than baddbmm_ with an inner dimension of 1)
    sums.addcmul_(phi_k.transpose(-1, -2), v)
    # y' = (c ⊙ φ(q')) S, the token's attention to itself included
    weights = state_weights(d, cd, query.device).squeeze(-1)
    y_prime = torch.bmm(
        (phi_q * weights).reshape(b * kv_heads, groups, n), sums.view(b * kv_heads, n, dv + 1)
    ).view(b, kv_heads, groups, dv + 1)
    nom, den = y_prime[..., :dv], y_prime[..., dv:]
    n_i = count[:, :, None, None]
    scale = torch.sqrt(n_i / d) / den if normalize else 1.0 / den
    if key_mask is not None:  # a padded first token has n = 0 and 0/0: its row is 0
        scale = torch.where(n_i > 0, scale, 0.0)
    out = (nom * scale).reshape(b, h, 1, dv).to(query.dtype)
    return out, state if inplace else TaylorShiftState(sums, count)


def _cpu_step(sums: Tensor, count: Tensor, query: Tensor, value: Tensor) -> ModuleType | None:
    """The CPU kernel's module (``ops/cpu/decode.py``) when the step runs there: a float32
    state on the CPU, head dims up to 128, the kernels built; else None. (Imported here, not
    with this module: the package imports without the CPU kernels' operators.)"""
    if sums.device.type != "cpu":
        return None
    from ..cpu import decode

    if decode.decode_step_supported(sums, count, query, value) and cpu_kernels_ready():
        return decode
    return None


def _query_key_factor(tau: Tensor | float, x: Tensor) -> Tensor | float:
    """The factor of the stacked (query, key) pair: τ on the query row, 1 on the key row."""
    if isinstance(tau, Tensor):  # (B, H, 1, 1)
        return torch.cat([tau, torch.ones_like(tau)], dim=2)
    if tau == 1.0:
        return 1.0
    return x.new_tensor([tau, 1.0]).view(1, 1, 2, 1)
