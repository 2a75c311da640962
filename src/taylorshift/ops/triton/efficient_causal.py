"""Efficient TaylorShift, causal (SPEC §2.3), on the fused kernels of ``efficient.py``.

The sequence is cut into chunks of C tokens (docs/triton-efficient.md, "Causal"). With
u = [v·m, m] (values times the key mask, and the mask as the denominator column) and
Y' = [numerator, denominator]:

    S_c   = Σ_{j in key chunk c} φ(k'_j)ᵀ u_j        state kernel, one grid over all chunks
    P_c   = Σ_{c' < c} S_c'                           scan kernel, serial over chunks (fp32)
    Y'_i  = φ(q'_i)(c ⊙ P_c)                          apply kernel, one grid over all chunks
          + Σ_{j in chunk c, j <= i} w(q'_i·k'_j) u_j  intra-chunk block in torch, (C × C) tiles

then y = nom/den · sqrt(n_i/d) in torch, n_i the attended keys j <= i. Backward: the query
side from P_c (grad kernel), the state gradient R_c = Σ_{c' > c} φ(q'_c')ᵀ gY'_c' (state
kernel per query chunk, then the scan kernel from the last chunk down), g_u = φ(k')(c ⊙ R)
(apply kernel) and g_k' from R (grad kernel); the intra-chunk block is differentiated by
hand on its tiles.
The maps q -> q', k -> k', v -> u and the finishing run in torch around the core and are
differentiated by autograd.

Query i attends key j iff j <= i (upper-left aligned, as SDPA), also when Nq != Nk: query
chunk c uses the prefix of key chunks < c and the intra block with key chunk c.

A state in and out (``initial_state``, ``output_final_state``; docs/triton-efficient.md,
"A state in and out"): the prefix S_0 of the keys before the block, in the kernels' layout
(``kernel_state``), joins every prefix, P_c = S_0 + Σ_{c' < c} S_c', and the state after
the block is S_0 + Σ_c S_c (``public_sums`` turns it back). The gradient of S_0 is
c ⊙ Σ_c φ(q'_c)ᵀ gY'_c, the query chunks' states that the backward forms anyway.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Optional  # custom_op reads Optional[Tensor] from annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..taylor_shift.efficient import finish_outputs
from ..taylor_shift.efficient_causal import causal_count
from ..taylor_shift.features import feature_dim, taylor_weight
from ..taylor_shift.fused import CAUSAL_CHUNK, causal_piece_chunks
from ..taylor_shift.second_order import graph_grads, taylor_sums, wants_graph
from ..taylor_shift.state import TaylorShiftState, final_state, real_keys
from .efficient import (
    _apply,
    _flat,
    _grad,
    _state,
    check_kernel_inputs,
    dot_kind,
    layout,
    scaled_inputs,
)
from .layout import TILE, Layout

# Tokens per chunk (defined beside the router, which sizes the states without importing
# Triton): the intra-chunk block costs O(N C d) and the per-chunk states
# (N / C) · layout(d, dv).size float32 per (batch, head): a larger C trades direct work
# for state memory (docs/triton-efficient.md, "Causal").
DEFAULT_CHUNK = CAUSAL_CHUNK


def _chunks(x: Tensor, n_chunks: int, chunk: int) -> Tensor:
    """(BH, N, e) -> (BH·n_chunks, C, e) contiguous, zero-padded past N."""
    bh, n, e = x.shape
    pad = n_chunks * chunk - n
    if pad:
        x = torch.nn.functional.pad(x, (0, 0, 0, pad))
    return x.reshape(bh * n_chunks, chunk, e).contiguous()


def _split(x: Tensor) -> tuple[Tensor, Tensor]:
    """(BH', C, e) -> its first e - 1 columns and its last column, as views: the kernels'
    u and r (R_MODE 2). The last column (the key mask, or the denominator's gradient) then
    goes into the states' denominator rows, summed in float32 beside the dots, and the
    state is e - 1 columns wide (dv = 64 pads to 64 columns, not 128)."""
    return x[..., :-1], x[..., -1]


def _apply_split(x: Tensor, state: Tensor, lay, out: Tensor, dot: int) -> None:
    """out (BH', C, e) = [φ(x)(c ⊙ S) numerator, denominator], unfinished."""
    den = torch.empty(out.shape[:-1], dtype=torch.float32, device=out.device)
    _apply(x, state, lay, out[..., :-1], den=den, dot=dot, finish=False)
    out[..., -1] = den


def _intra(q: Tensor, k: Tensor, u: Tensor) -> Tensor:
    """Causal (C × C) blocks: q (BH, m, C, d), k (BH, m, C, d), u (BH, m, C, e)."""
    w = taylor_weight(q @ k.transpose(-2, -1), 2)
    c = q.shape[-2]
    causal = torch.ones((c, c), dtype=torch.bool, device=q.device).tril()
    return w.masked_fill(~causal, 0.0) @ u


def _intra_grad(q: Tensor, k: Tensor, u: Tensor, g: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of ``_intra``'s q, k, u from g (BH, m, C, e): with s = q kᵀ,
    W = tril(1 + s + s²/2), Y = W u: gu = Wᵀ g, gs = tril(g uᵀ) ⊙ (1 + s), gq = gs k,
    gk = gsᵀ q."""
    s = q @ k.transpose(-2, -1)
    c = q.shape[-2]
    causal = torch.ones((c, c), dtype=torch.bool, device=q.device).tril()
    w = taylor_weight(s, 2).masked_fill(~causal, 0.0)
    gs = (g @ u.transpose(-2, -1)).masked_fill(~causal, 0.0) * (1.0 + s)
    return gs @ k, gs.transpose(-2, -1) @ q, w.transpose(-2, -1) @ g


# The core as custom ops with fake (meta) implementations and a registered autograd
# formula, so that torch.compile traces through it (the kernel launches stay opaque).
# Both sweep the tokens in pieces of ``piece`` chunks, each continuing the state after the
# last (fused.causal_piece_chunks: one piece where all chunk states fit the budget).


@torch.library.custom_op("taylorshift::triton_causal_forward", mutates_args=())
def triton_causal_forward(
    q: Tensor,
    k: Tensor,
    u: Tensor,
    initial: Optional[Tensor],  # noqa: UP045
    chunk: int,
    piece: int,
    dot: int,
    final: bool,
) -> tuple[Tensor, Tensor]:
    """Y' (BH, Nq, e) from q' (BH, Nq, d), k' (BH, Nk, d), u (BH, Nk, e), all float32;
    ``initial``: the state before the first key (BH, layout size) in the kernels' layout
    (``kernel_state``), or None; ``piece``: chunks swept at once (of the longer of Nq, Nk:
    a piece holds the queries and the keys of the same positions, either may be none);
    ``dot``: how the kernels multiply (``efficient.dot_kind`` of the inputs' dtype).
    Second output: with ``final`` the state after the last key (BH, layout size), else an
    empty tensor."""
    lay = layout(q.shape[2], u.shape[2] - 1)  # u = [v·m, m]: its last column is the r column
    span = piece * chunk
    starts = range(0, max(q.shape[1], k.shape[1]), span)
    carry, ys = initial, []
    for a in starts:
        last = a + span >= max(q.shape[1], k.shape[1])
        y, added = _forward_piece(
            *(x[:, a : a + span] for x in (q, k, u)), carry, lay, chunk, dot, final or not last
        )
        ys.append(y)
        if added is not None:
            carry = added if carry is None else carry + added
    y = ys[0] if len(ys) == 1 else torch.cat(ys, 1)
    return y, carry if final else q.new_empty(0)


def _forward_piece(
    q: Tensor, k: Tensor, u: Tensor, carry: Tensor | None, lay: Layout, chunk: int, dot: int,
    total: bool,
) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    """Y' of one piece from the state before it (``carry``, or None: zero), and with
    ``total`` the sum of the piece's chunk states (else None). A piece may hold no query
    (keys after the last one: for the state after) or no key (queries after the last)."""
    bh, nq, d = q.shape
    nk, e = u.shape[1], u.shape[2]
    ncq, nck = triton.cdiv(nq, chunk), triton.cdiv(nk, chunk)
    qc, kc, uc = _chunks(q, ncq, chunk), _chunks(k, nck, chunk), _chunks(u, nck, chunk)

    states = _chunk_states(kc, uc, bh, lay, dot)
    prefix = _prefix(states, ncq, carry)  # (BH·ncq, size)
    added = states.sum(1) if total else None
    del states
    y = torch.empty((bh * ncq, chunk, e), dtype=torch.float32, device=q.device)
    if ncq:
        _apply_split(qc, prefix, lay, y, dot)
    y = y.view(bh, ncq, chunk, e)
    m = min(ncq, nck)
    if m:
        y[:, :m] += _intra(
            qc.view(bh, ncq, chunk, d)[:, :m], kc.view(bh, nck, chunk, d)[:, :m],
            uc.view(bh, nck, chunk, e)[:, :m],
        )  # fmt: skip
    return y.view(bh, ncq * chunk, e)[:, :nq].contiguous(), added


def _chunk_states(xc: Tensor, wc: Tensor, bh: int, lay: Layout, dot: int) -> Tensor:
    """Σ φ(x)ᵀ [w] per chunk of x (BH·chunks, C, d) and w (BH·chunks, C, e): (BH, chunks,
    size), the last column of w as the kernels' own r column; no launch for no chunk."""
    chunks = xc.shape[0] // bh
    if chunks == 0:
        return xc.new_zeros((bh, 0, lay.size))
    return _state(xc, *_split(wc), 2, lay, dot).view(bh, chunks, lay.size)


@triton_causal_forward.register_fake
def _(q, k, u, initial, chunk, piece, dot, final):
    y = q.new_empty((q.shape[0], q.shape[1], u.shape[2]), dtype=torch.float32)
    size = layout(q.shape[2], u.shape[2] - 1).size
    return y, q.new_empty((q.shape[0], size) if final else (0,), dtype=torch.float32)


@torch.library.custom_op("taylorshift::triton_causal_backward", mutates_args=())
def triton_causal_backward(
    grad: Tensor,
    q: Tensor,
    k: Tensor,
    u: Tensor,
    initial: Optional[Tensor],  # noqa: UP045
    chunk: int,
    piece: int,
    dot: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradients of q', k', u and the initial state (an empty tensor without one) from the
    gradient of Y' (all float32). Pieces as the forward's: first the state before each
    (its key states summed again), then the pieces from the last, each key chunk's
    R_c taking the query states of the pieces after it too."""
    lay = layout(q.shape[2], u.shape[2] - 1)
    span = piece * chunk
    starts = list(range(0, max(q.shape[1], k.shape[1]), span))
    carries = [initial]
    for a in starts[:-1]:
        nck = triton.cdiv(k[:, a : a + span].shape[1], chunk)
        kc, uc = (_chunks(x[:, a : a + span], nck, chunk) for x in (k, u))
        added = _chunk_states(kc, uc, k.shape[0], lay, dot).sum(1)
        carries.append(added if carries[-1] is None else carries[-1] + added)
    after, parts = None, []
    for a, carry in reversed(list(zip(starts, carries, strict=True))):
        pieces = (x[:, a : a + span] for x in (grad, q, k, u))
        *grads, q_sum = _backward_piece(*pieces, carry, after, lay, chunk, dot)
        parts.append(grads)
        after = q_sum if after is None else after + q_sum
    gq, gk, gu = (
        torch.cat(x[::-1], 1) if len(parts) > 1 else x[0] for x in zip(*parts, strict=True)
    )
    g_initial = q.new_empty(0) if initial is None else after * _weights(lay, q.device)
    return gq, gk, gu, g_initial


def _backward_piece(
    grad: Tensor, q: Tensor, k: Tensor, u: Tensor, carry: Tensor | None,
    after: Tensor | None, lay: Layout, chunk: int, dot: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """Gradients of one piece's q', k', u from the state before it (``carry``) and the
    query states of the pieces after it (``after``, Σ φ(q')ᵀ gY' there), and the sum of its
    own query states."""
    bh, nq, d = q.shape
    nk, e = u.shape[1], u.shape[2]
    ncq, nck = triton.cdiv(nq, chunk), triton.cdiv(nk, chunk)
    qc, kc, uc = _chunks(q, ncq, chunk), _chunks(k, nck, chunk), _chunks(u, nck, chunk)
    gc = _chunks(grad.float(), ncq, chunk)

    # Inter-chunk part, query side: ∂/∂q' of gY'·φ(q')(c ⊙ P_c).
    gq = torch.zeros_like(qc)
    if ncq:
        prefix = _prefix(_chunk_states(kc, uc, bh, lay, dot), ncq, carry)
        gq = _grad(qc, *_split(gc), 2, prefix, lay, dot)
        del prefix
    # Key side: R_c = Σ_{c' > c} φ(q'_c')ᵀ gY'_c' (the later pieces' included).
    q_states = _chunk_states(qc, gc, bh, lay, dot)
    q_sum = q_states.sum(1)
    suffix = _suffix(q_states, nck, after)
    del q_states
    gu, gk = torch.empty_like(uc), torch.zeros_like(kc)
    if nck:
        _apply_split(kc, suffix, lay, gu, dot)
        gk = _grad(kc, *_split(uc), 2, suffix, lay, dot)
    del suffix

    # Intra-chunk part: the (C × C) blocks differentiated by hand (autograd does not record
    # inside a custom op).
    m = min(ncq, nck)
    gq, gk, gu = gq.view(bh, ncq, chunk, d), gk.view(bh, nck, chunk, d), gu.view(bh, nck, chunk, e)
    if m:
        blocks = [x.view(bh, -1, chunk, x.shape[-1])[:, :m] for x in (qc, kc, uc)]
        g_intra = _intra_grad(*blocks, gc.view(bh, ncq, chunk, e)[:, :m])
        gq[:, :m] += g_intra[0]
        gk[:, :m] += g_intra[1]
        gu[:, :m] += g_intra[2]
    return (
        gq.view(bh, ncq * chunk, d)[:, :nq].contiguous(),
        gk.view(bh, nck * chunk, d)[:, :nk].contiguous(),
        gu.view(bh, nck * chunk, e)[:, :nk].contiguous(),
        q_sum,
    )


@triton_causal_backward.register_fake
def _(grad, q, k, u, initial, chunk, piece, dot):
    g_initial = q.new_empty(0) if initial is None else torch.empty_like(initial)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(u), g_initial


def _setup_causal(ctx, inputs, output):
    q, k, u, initial, chunk, piece, dot, _ = inputs
    ctx.save_for_backward(q, k, u, initial)
    ctx.chunk, ctx.piece, ctx.dot = chunk, piece, dot
    ctx.mark_non_differentiable(output[1])  # the state after the block, as the torch form's


def _backward_causal(ctx, grad, _grad_final):
    q, k, u, initial = ctx.saved_tensors
    if wants_graph():  # create_graph=True: the core's sums in plain ops, differentiable again
        if initial is not None:
            raise RuntimeError(
                "initial_state: a call that continues a causal state has first-order "
                "gradients only; differentiating its gradient again (create_graph=True) is "
                "not supported"
            )
        grads = graph_grads(
            lambda q, k, u: taylor_sums(q, k, u, True).to(u.dtype),
            grad, (q, k, u), ctx.needs_input_grad[:3],
        )  # fmt: skip
        return (*grads, None, None, None, None, None)
    gq, gk, gu, g_initial = triton_causal_backward(
        grad.contiguous(), q, k, u, initial, ctx.chunk, ctx.piece, ctx.dot
    )
    return gq, gk, gu, None if initial is None else g_initial, None, None, None, None


triton_causal_forward.register_autograd(_backward_causal, setup_context=_setup_causal)


# Entries of the state per program of the scan kernel: its grid is (B·H, size / SCAN_BLOCK),
# each program serial over the chunks with a float32 running sum in registers.
SCAN_BLOCK = 1024


@triton.jit
def _scan_kernel(
    x_ptr, start_ptr, out_ptr, N_IN, N_OUT, SIZE, sx_b, sx_c, ss_b, so_b, so_c,
    HAS_START: tl.constexpr, REVERSE: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Exclusive running sums of the chunk states x (BH, N_IN, SIZE) into out (BH, N_OUT,
    SIZE), from start (BH, SIZE) or zero. Forward: out[c] = start + Σ_{c' < min(c, N_IN)}
    x[c'] (the prefix P_c). REVERSE: out[c] = start + Σ_{c < c' < N_IN} x[c'] (the suffix
    R_c), summed from the last chunk down."""
    bh = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = cols < SIZE
    x_base = x_ptr + bh * sx_b + cols
    out_base = out_ptr + bh * so_b + cols
    acc = tl.zeros((BLOCK,), tl.float32)
    if HAS_START:
        acc += tl.load(start_ptr + bh * ss_b + cols, mask=live, other=0.0)
    if REVERSE:
        # the states of chunks past the last output row are in every output
        for c in range(N_OUT, N_IN):
            acc += tl.load(x_base + c * sx_c, mask=live, other=0.0)
        for i in range(0, N_OUT):
            c = N_OUT - 1 - i
            tl.store(out_base + c * so_c, acc, mask=live)
            if c < N_IN:
                acc += tl.load(x_base + c * sx_c, mask=live, other=0.0)
    else:
        for c in range(0, N_OUT):
            tl.store(out_base + c * so_c, acc, mask=live)
            if c < N_IN:
                acc += tl.load(x_base + c * sx_c, mask=live, other=0.0)


def _scan(x: Tensor, n_out: int, start: Tensor | None, reverse: bool) -> Tensor:
    """``_scan_kernel`` on x (BH, chunks, size) float32: (BH·n_out, size)."""
    bh, n_in, size = x.shape
    out = x.new_empty((bh, n_out, size))
    if n_out and bh:
        # (a tensor with no element is never read: the kernel gets one with an address)
        x = x.contiguous() if n_in else out
        s = x if start is None else start.contiguous()
        grid = (bh, triton.cdiv(size, SCAN_BLOCK))
        _scan_kernel[grid](
            x, s, out, n_in, n_out, size, x.stride(0), x.stride(1), s.stride(0),
            out.stride(0), out.stride(1),
            HAS_START=start is not None, REVERSE=reverse, BLOCK=SCAN_BLOCK,
        )  # fmt: skip
    return out.view(bh * n_out, size)


def _prefix(states: Tensor, ncq: int, initial: Tensor | None = None) -> Tensor:
    """P_c = S_0 + Σ_{c' < c} S_c' for the query chunks c < ncq: (BH·ncq, size) float32;
    S_0 the initial state (BH, size), or zero. One scan kernel (``prefix_reference`` is
    the same in torch)."""
    return _scan(states, ncq, initial, reverse=False)


def _suffix(q_states: Tensor, nck: int, after: Tensor | None = None) -> Tensor:
    """R_c = Σ_{c' > c} Q_c' (+ ``after``, (BH, size): the query states of the pieces after
    this one) for the key chunks c < nck: (BH·nck, size) float32. One scan kernel
    (``suffix_reference`` is the same in torch)."""
    return _scan(q_states, nck, after, reverse=True)


def prefix_reference(states: Tensor, ncq: int, initial: Tensor | None = None) -> Tensor:
    """``_prefix`` in torch: cumulative sums, then the rows of the query chunks."""
    bh, nck, size = states.shape
    cum = torch.cat([states.new_zeros((bh, 1, size)), states.cumsum(1)], dim=1)
    if initial is not None:
        cum = cum + initial.unsqueeze(1)
    index = torch.arange(ncq, device=states.device).clamp(max=nck)
    return cum[:, index].reshape(bh * ncq, size).contiguous()


def suffix_reference(q_states: Tensor, nck: int, after: Tensor | None = None) -> Tensor:
    """``_suffix`` in torch: reversed cumulative sums, then the rows of the key chunks."""
    bh, ncq, size = q_states.shape
    rev = q_states.flip(1).cumsum(1).flip(1)  # Σ_{c' >= c}
    rev = torch.cat([rev, rev.new_zeros((bh, 1, size))], dim=1)
    if after is not None:
        rev = rev + after.unsqueeze(1)
    index = (torch.arange(nck, device=q_states.device) + 1).clamp(max=ncq)
    return rev[:, index].reshape(bh * nck, size).contiguous()


@lru_cache(maxsize=32)
def _weights(lay: Layout, device: torch.device) -> Tensor:
    """c in the kernels' layout (size,): 1/2 on the rows of diagonal tile pairs (a tile
    (A, A) holds x_a x_b and x_b x_a alike, the apply kernel's w), 1 elsewhere."""
    t2 = TILE * TILE
    with torch.inference_mode(False):  # usable in and out of inference mode
        c = torch.ones(lay.size)
        for ta in range(lay.nt):
            p = ta * lay.nt - ta * (ta - 1) // 2  # the pair (A, A) (efficient._pair_index)
            c[p * t2 * lay.dvp : (p + 1) * t2 * lay.dvp] = 0.5
            c[lay.off_quad_den + p * t2 : lay.off_quad_den + (p + 1) * t2] = 0.5
        return c.to(device)


@lru_cache(maxsize=32)
def _places(d: int, dv: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """Where ``TaylorShiftState.sums`` (D, dv + 1) of one head lie in the kernels' flat
    layout (docs/triton-efficient.md, "A state in and out"): ``places`` (D·(dv + 1),) the
    offset of each entry in the sums' own order (value columns in the value block of its
    feature row, the ones column in the row's denominator), and ``to``, ``source``: every
    offset the sums fill, with the entry it copies. Those add the mirror x_b x_a of each
    pair a < b of a diagonal tile pair, which holds the same sum."""
    with torch.inference_mode(False):  # usable in and out of inference mode
        return _build_places(d, dv, device)


def _build_places(d: int, dv: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    lay = layout(d, dv)
    t = TILE
    a, b = torch.triu_indices(d, d)
    ta, tb = a // t, b // t
    first = ta * lay.nt - ta * (ta - 1) // 2 + (tb - ta)  # the tile pair's index
    row = first * t * t + (a - ta * t) * t + (b - tb * t)
    cols = torch.arange(dv)
    lin = torch.arange(d)
    values = torch.cat([
        row[:, None] * lay.dvp + cols,
        lay.off_lin + lin[:, None] * lay.dvp + cols,
        lay.off_const + cols[None, :],
    ])  # fmt: skip
    dens = torch.cat(
        [lay.off_quad_den + row, lay.off_lin_den + lin, torch.tensor([lay.off_const_den])]
    )
    places = torch.cat([values, dens[:, None]], 1).flatten()
    mirror = (ta == tb) & (a != b)
    rows = first[mirror] * t * t + (b[mirror] - tb[mirror] * t) * t + (a[mirror] - ta[mirror] * t)
    mirrored = torch.cat([rows[:, None] * lay.dvp + cols, lay.off_quad_den + rows[:, None]], 1)
    entries = torch.arange(feature_dim(d) * (dv + 1)).view(feature_dim(d), dv + 1)
    to = torch.cat([places, mirrored.flatten()])
    source = torch.cat([entries.flatten(), entries[: len(a)][mirror].flatten()])
    return places.to(device), to.to(device), source.to(device)


def kernel_state(sums: Tensor, d: int) -> Tensor:
    """The kernels' state (B·H, layout size) float32 from ``TaylorShiftState.sums``
    (B, H, D, dv + 1) of head dim ``d``: differentiable (its gradient flows back to
    ``sums``), zeros where the layout pads."""
    b, h, rows, e = sums.shape
    _, to, source = _state_places(d, e - 1, sums.device)
    flat = sums.reshape(b * h, rows * e).to(torch.float32)
    state = flat.new_zeros((b * h, layout(d, e - 1).size))
    return state.index_copy(1, to, flat.index_select(1, source))


def public_sums(state: Tensor, b: int, h: int, d: int, dv: int) -> Tensor:
    """``TaylorShiftState.sums`` (B, H, D, dv + 1) from a state in the kernels' layout."""
    places, _, _ = _state_places(d, dv, state.device)
    return state.index_select(1, places).view(b, h, feature_dim(d), dv + 1)


def _state_places(d: int, dv: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """``_places``, kept per (d, dv, device); traced by torch.compile, built in the graph."""
    if torch.compiler.is_compiling():
        return _build_places(d, dv, device)
    return _places(d, dv, device)


def triton_causal_efficient_taylor_shift(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_mask: Tensor | None,
    temperature: Tensor | float,
    scale: float | None,
    normalize: bool,
    chunk_size: int | None = None,
    *,
    initial_state: TaylorShiftState | None = None,
    output_final_state: bool = False,
) -> Tensor | tuple[Tensor, TaylorShiftState]:
    """Causal efficient TaylorShift on the fused Triton kernels, on validated inputs.

    Same contract and signature as
    ``taylorshift.ops.taylor_shift.efficient_causal.causal_efficient_taylor_shift``:
    query (B, H, Nq, d), key (B, H, Nk, d), value (B, H, Nk, dv), key_mask (B, H, Nk) bool
    (broadcast views are fine) or None; query i attends key j iff j <= i. Returns
    (B, H, Nq, dv) in query's dtype; sums in float32, float64 refused. Differentiable in
    query, key, value and a tensor temperature. ``chunk_size`` defaults to DEFAULT_CHUNK.
    ``initial_state`` (checked by the caller; key and value with the query's heads) holds
    the keys before the block, and the output is differentiable w.r.t. its sums; with
    ``output_final_state`` the state after the block's last key (its real keys added;
    differentiable w.r.t. key, value and ``initial_state.sums``, ``state.final_state``) is
    returned too: ``(out, state)``.
    """
    check_kernel_inputs(query, "causal efficient form")
    b, h, nq, d = query.shape
    nk, dv = key.shape[2], value.shape[3]
    chunk = chunk_size or DEFAULT_CHUNK
    qp, kp = scaled_inputs(query, key, temperature, scale, normalize)
    v = value.to(torch.float32)
    if key_mask is None:
        ones = v.new_ones((*v.shape[:-1], 1))
        u = torch.cat([v, ones], dim=-1)
    else:
        m = key_mask.expand(b, h, nk).to(torch.float32).unsqueeze(-1)
        u = torch.cat([v * m, m], dim=-1)
    initial = None if initial_state is None else kernel_state(initial_state.sums, d)
    piece = causal_piece_chunks(b * h, nq, nk, d, dv, chunk)
    if piece is None:  # (the router sends such calls to the PyTorch form)
        raise ValueError(
            f"not one causal chunk's states fit CAUSAL_STATE_BUDGET (B·H {b * h}, d {d}, dv "
            f"{dv}): use causal_efficient_taylor_shift"
        )
    y_prime, after = triton_causal_forward(
        _flat(qp), _flat(kp), _flat(u), initial, chunk, piece, dot_kind(query.dtype),
        output_final_state,
    )  # fmt: skip
    count = causal_count(key_mask, nq, nk, torch.float32, query.device)
    if initial_state is not None:
        count = initial_state.count.to(torch.float32).unsqueeze(-1) + count  # (B, H, Nq)
    y, _ = finish_outputs(y_prime.reshape(b, h, nq, -1), count, normalize, d)
    y = y.to(query.dtype)
    if not output_final_state:
        return y
    keys = real_keys(key_mask, b, h, nk, torch.float32, query.device)
    if initial_state is not None:
        keys = initial_state.count.detach().to(torch.float32) + keys
    sums = None if initial_state is None else initial_state.sums
    return y, final_state(
        public_sums(after, b, h, d, dv), keys, key, value, key_mask, normalize, sums
    )


__all__ = ["DEFAULT_CHUNK", "triton_causal_efficient_taylor_shift"]
