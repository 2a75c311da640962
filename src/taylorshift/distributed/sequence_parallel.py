"""Sequence-parallel efficient TaylorShift: each rank holds a contiguous slice of the sequence.

The key side of efficient TaylorShift is a sum over keys whose size does not depend on N,

    S = Σ_j φ(k'_j)ᵀ [v_j, 1]        (B, H, D, dv + 1),  D = d(d+1)/2 + d + 1,

so a sequence split over ranks needs one collective per call (docs/distributed.md):

- non-causal: every rank sums its own keys into S_r; one all-reduce gives S = Σ_r S_r;
  every rank's queries read S (the efficient form's query side).
- causal: the same S_r, all-gathered; rank r starts its causal sweep from the exclusive
  prefix Σ_{r' < r} S_r' (``initial_state`` of the causal form).

The attended-key count travels inside the state: φ ends with a constant 1 and [v, 1] with
the ones column (zeroed for masked keys), so ``S[..., -1, -1] = Σ_j mask_j``, exact in
floating point (a sum of ones), and no second buffer is needed: the causal form gets
``TaylorShiftState.from_sums(S)``.

Backward sends the state gradients the other way: non-causal, one all-reduce of ∂L/∂S
(each rank's queries contribute theirs); causal, an all-gather of the gradients w.r.t. each
rank's prefix and a suffix sum over the higher ranks. Each rank then differentiates its own
keys (``key_side_grads``). A tensor temperature enters the query side only, so each rank
gets the gradient of its own queries' part: summing parameter gradients over the group
(DDP does, or ``all_reduce``) gives the whole.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._validate import check_bool, check_int
from ..ops.taylor_shift.checks import check_inputs
from ..ops.taylor_shift.efficient import default_chunk_size, efficient_taylor_shift, key_side_grads
from ..ops.taylor_shift.efficient_causal import (
    DEFAULT_CAUSAL_CHUNK,
    causal_efficient_taylor_shift,
    causal_forward,
)
from ..ops.taylor_shift.features import drop_masked_content
from ..ops.taylor_shift.interface import causal_state_call
from ..ops.taylor_shift.state import TaylorShiftState
from .collectives import ExclusivePrefixOverRanks, SumOverRanks, group_place


def sequence_parallel_taylor_shift(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_padding_mask: Tensor | None = None,
    is_causal: bool = False,
    *,
    temperature: Tensor | float = 1.0,
    scale: float | None = None,
    normalize: bool = True,
    group=None,
    chunk_size: int | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    r"""Efficient TaylorShift over a sequence split across the ranks of ``group``.

    Rank r of ``group`` holds tokens [start_r, stop_r) of the sequence: rank order is
    sequence order, the slices are contiguous, and their lengths may differ (0 included;
    :func:`sequence_shard` gives a balanced split). Every tensor argument is this rank's
    slice; the result is this rank's slice of what ``taylor_shift_attention`` gives for the
    whole sequence, with the same arguments::

        # on every rank r, with x_r = x[:, :, start_r:stop_r]
        y_r = sequence_parallel_taylor_shift(q_r, k_r, v_r, mask_r, is_causal, group=g)
        # equals, to rounding,
        y = taylor_shift_attention(q, k, v, mask, is_causal, mode="efficient")
        y_r == y[:, :, start_r:stop_r]

    Every rank of the group must make the same calls in the same order (one collective per
    call forward, one backward), with the same B, H, d, dv, dtype and options, and must run
    backward through the result whenever one rank does (see docs/distributed.md).

    Args:
        query: (B, H, Nq_r, d), this rank's queries.
        key: (B, H, Nk_r, d), this rank's keys ((B, Hkv, Nk_r, d) with ``enable_gqa``). With
            ``is_causal`` the same positions as the queries (Nk_r = Nq_r); without, any
            split of the keys (cross-attention).
        value: (B, H, Nk_r, dv), or (B, Hkv, Nk_r, dv) with ``enable_gqa``.
        key_padding_mask: optional bool tensor broadcastable to (B, H, 1, Nk_r), True =
            attend, this rank's part of the key padding (a (B, N) padding mask ``m`` is
            ``m[:, None, None, start_r:stop_r]``). Masks varying over queries are refused,
            and with grouped heads masks varying over heads.
        is_causal: query i attends key j iff j <= i in the whole sequence.
        temperature: τ, a float or a tensor broadcastable to (B, H, 1, 1) (``normalize``
            only). Its gradient on each rank is that of the rank's own queries: sum it over
            the group (DDP does) for the whole.
        scale: score scale for ``normalize=False`` (default 1/sqrt(d)).
        normalize: the paper's normalisation of q and k and output factor sqrt(n_i/d), with
            n_i the attended keys over all ranks.
        group: a ``torch.distributed.ProcessGroup``; None is the default group, or one
            process when ``torch.distributed`` is not initialized (then, as for a group of
            one, this is the single-process efficient form).
        chunk_size: tokens per chunk of the local sweeps (default: the efficient forms').
        enable_gqa: grouped-query attention, as ``taylor_shift_attention``'s: key and value
            may have Hkv heads dividing H, query head h reading key/value head
            h // (H / Hkv). The states, and so the collectives, are then kept per key/value
            head: H / Hkv times fewer bytes.

    Returns:
        (B, H, Nq_r, dv) in the dtype of ``query``. States, and the collectives, are float32
        for float16/bfloat16/float32 input and float64 for float64.

    Raises:
        TypeError, ValueError: for bad input, naming the argument, the expected and the
        actual value.
    """
    check_bool("enable_gqa", enable_gqa)
    problem = check_inputs(
        query, key, value, None, is_causal, temperature, scale, normalize, 2, "efficient",
        enable_gqa,
    )  # fmt: skip
    b, h, d, dv = problem.batch, problem.heads, problem.head_dim, problem.value_dim
    kv_heads = key.shape[1]
    key_mask = _key_padding(key_padding_mask, b, h, problem.n_key, query, kv_heads)
    key, value = drop_masked_content(key, value, key_mask)
    if is_causal and problem.n_query != problem.n_key:
        raise ValueError(
            "is_causal=True needs the queries and keys of the same positions on each rank: "
            f"query and key must have the same length; got Nq = {problem.n_query} and "
            f"Nk = {problem.n_key}"
        )
    check_int("chunk_size", chunk_size, ge=1, allow_none=True)
    world, _ = group_place(group)
    if not chunk_size:
        chunk_size = (
            DEFAULT_CAUSAL_CHUNK if is_causal else default_chunk_size(b * h, d, dv, query.device)
        )

    if world == 1 and (is_causal or kv_heads == h):  # (the causal form takes grouped heads)
        form = causal_efficient_taylor_shift if is_causal else efficient_taylor_shift
        return form(query, key, value, key_mask, temperature, scale, normalize, chunk_size)

    local = KeyStateFunction.apply(key, value, key_mask, normalize, chunk_size)
    if is_causal:
        # Keys of lower ranks precede every local query: they enter as the initial state.
        # (the CPU causal kernel where it applies: causal_state_call)
        prefix = ExclusivePrefixOverRanks.apply(local, group)
        args = (query, key, value, key_mask, temperature, scale, normalize, chunk_size)
        return causal_state_call(
            causal_efficient_taylor_shift, args, problem, 2, TaylorShiftState.from_sums(prefix),
            False,
        )  # fmt: skip
    # Every key of every rank precedes every query in the sense of the causal sweep's
    # initial state: the query side is a causal sweep over no local keys started from S.
    # (grouped heads: the state per key/value head, each group's query heads read it)
    state = local if world == 1 else SumOverRanks.apply(local, group)
    no_key = key.new_zeros((b, kv_heads, 0, d))
    no_value = value.new_zeros((b, kv_heads, 0, dv))
    return causal_efficient_taylor_shift(
        query, no_key, no_value, None, temperature, scale, normalize, chunk_size,
        initial_state=TaylorShiftState.from_sums(state),
    )  # fmt: skip


class KeyStateFunction(torch.autograd.Function):
    """(key, value) -> S = Σ_j φ(k'_j)ᵀ [v_j, 1] over this rank's keys, (B, H, D, dv + 1).

    Forward is the causal sweep with no queries (it accumulates exactly this state); backward
    is the efficient form's ``key_side_grads`` from the gradient w.r.t. S.
    """

    @staticmethod
    def forward(ctx, key, value, key_mask, normalize, chunk):
        b, h, _, d = key.shape
        no_query = key.new_zeros((b, h, 0, d))
        _, _, _, state = causal_forward(no_query, key, value, 1.0, normalize, key_mask, chunk)
        ctx.save_for_backward(key, value, key_mask)
        ctx.normalize, ctx.chunk = normalize, chunk
        return state.sums

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_state):
        key, value, key_mask = ctx.saved_tensors
        need_k, need_v = ctx.needs_input_grad[:2]
        gk, gv = key_side_grads(
            key, value, key_mask, g_state, ctx.normalize, ctx.chunk, need_k, need_v
        )
        return gk, gv, None, None, None


def _key_padding(
    mask: object, b: int, h: int, nk: int, query: Tensor, kv_heads: int
) -> Tensor | None:
    """The key padding mask as (B, Hkv, Nk) bool, or None; refuses anything else by name."""
    if mask is None:
        return None
    expected = f"(B, H, 1, Nk) = ({b}, {h}, 1, {nk})"
    if not isinstance(mask, Tensor):
        raise TypeError(
            f"key_padding_mask must be a bool tensor broadcastable to {expected} or None; "
            f"got {type(mask).__name__}"
        )
    if mask.dtype != torch.bool:
        raise TypeError(f"key_padding_mask must be a bool tensor (True = attend); got {mask.dtype}")
    if mask.device != query.device:
        raise ValueError(
            f"key_padding_mask must be on the device of query ({query.device}); got {mask.device}"
        )
    target = (b, h, 1, nk)
    try:
        ok = mask.dim() <= 4 and torch.broadcast_shapes(mask.shape, target) == target
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"key_padding_mask must broadcast to {expected}: one row for every query (a (B, N) "
            f"padding mask m is m[:, None, None, :]); got shape {tuple(mask.shape)}"
        )
    if kv_heads != h and mask.dim() >= 3 and mask.shape[-3] > 1:
        raise ValueError(
            "key_padding_mask: with grouped key/value heads the mask must be the same for "
            f"every head ((B, 1, 1, Nk) = ({b}, 1, 1, {nk})); got shape {tuple(mask.shape)}"
        )
    return mask.expand(target)[:, :kv_heads, 0, :]


def sequence_shard(n: int, rank: int, world_size: int) -> slice:
    """The tokens of ``rank`` in a balanced contiguous split of ``n`` over ``world_size``.

    The first ``n % world_size`` ranks get one token more; ranks past ``n`` get none::

        sequence_shard(10, 0, 4), sequence_shard(10, 3, 4)  # slice(0, 3), slice(8, 10)

    ``slice.start`` is the rank's position offset (for position embeddings).
    """
    n = check_int("n", n, ge=0)
    world_size = check_int("world_size", world_size, ge=1)
    rank = check_int("rank", rank, ge=0)
    if rank >= world_size:
        raise ValueError(f"rank must be an int in [0, world_size = {world_size}); got {rank}")
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))
