"""What sequence-parallel TaylorShift sends per attention layer, on paper, against ring
attention: the state each collective carries, bytes per rank, and the sequence length below
which ring attention sends less."""

from __future__ import annotations

from ...ops.taylor_shift.features import feature_dim

__all__ = ["bytes_per_rank", "crossover_tokens", "state_elements"]


def state_elements(d: int, dv: int) -> int:
    """Elements of one (batch, head) state, D (dv + 1): the count is its corner entry."""
    return feature_dim(d) * (dv + 1)


def bytes_per_rank(
    n: int,
    d: int,
    dv: int,
    *,
    heads: int = 1,
    batch: int = 1,
    ranks: int,
    causal: bool,
    state_bytes: int = 4,
    kv_bytes: int = 2,
) -> dict[str, float]:
    """Bytes each rank sends for one attention layer, ours against ring attention.

    Ours: the state, B·H·D·(dv + 1) elements of ``state_bytes`` (float32 for 16-bit inputs);
    non-causal one all-reduce forward and one backward, each 2 (P − 1)/P of the buffer per
    rank (ring or reduce-scatter + all-gather algorithm); causal one all-gather each way,
    (P − 1) buffers per rank. Ring attention: each rank's K and V blocks, B·H·(N/P)·(d + dv)
    elements of ``kv_bytes``, travel P − 1 hops forward; backward K, V and their gradient
    accumulators dK, dV travel P − 1 hops (twice the forward; causal or not, as in
    zig-zag/striped ring attention, which keep every hop busy).
    """
    state = batch * heads * state_elements(d, dv) * state_bytes
    ours = (ranks - 1) * state if causal else 2 * (ranks - 1) / ranks * state
    ring = (ranks - 1) * batch * heads * (n / ranks) * (d + dv) * kv_bytes
    return {
        "ours_forward": ours,
        "ours_backward": ours,
        "ring_forward": ring,
        "ring_backward": 2 * ring,
    }


def crossover_tokens(
    d: int, dv: int, *, ranks: int, causal: bool, state_bytes: int = 4, kv_bytes: int = 2
) -> dict[str, float]:
    """Sequence length N (all ranks together) below which ring attention sends fewer bytes.

    Forward: non-causal N* = 2 D (dv + 1) s / ((d + dv) s_kv), whatever P (both sides grow
    as P − 1); causal N* = P D (dv + 1) s / ((d + dv) s_kv) (the all-gather sends P/2 times
    an all-reduce). Forward + backward: ring sends 3× its forward, ours 2×: N* · 2/3.
    """
    ours = bytes_per_rank(1, d, dv, ranks=ranks, causal=causal, state_bytes=state_bytes)
    ring_per_token = bytes_per_rank(1, d, dv, ranks=ranks, causal=causal, kv_bytes=kv_bytes)[
        "ring_forward"
    ]
    forward = ours["ours_forward"] / ring_per_token
    return {"forward": forward, "forward_backward": forward * 2 / 3}
