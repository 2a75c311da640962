"""Efficient TaylorShift, non-causal, as fused Triton kernels: forward and backward.

Layout (B, H, N, d). The same three kernels serve both passes (docs/triton-efficient.md):

    _state_kernel   S   = Σ_n φ(x_n)ᵀ [u_n, r_n]          a sum over tokens, (D, dv + 1)
    _apply_kernel   Y'  = φ(x_n) (c ⊙ S)                   per token, optionally finished
    _grad_kernel    g_x = ∂/∂x_n  [u_n, r_n] · φ(x_n)(c ⊙ S)   per token

with φ(x) = [x_a x_b (a <= b), x, 1] and c = ½ on the diagonal pairs, 1 elsewhere (see
docs/efficient-form.md). The quadratic features are never stored: the head dim is cut into
tiles of ``TILE`` and every tile pair A <= B is formed on chip, T² features per token.

Forward: S from (k', [v·m, m]), then y from φ(q') (c ⊙ S). Backward: the state gradient
R = Σ_i φ(q'_i)ᵀ gY'_i (state kernel on the query side), g_q' from S (grad kernel),
g_v = m · φ(k') (c ⊙ R) (apply kernel) and g_k' from R (grad kernel). The maps q -> q'
(normalisation, temperature) and k -> k' run in torch around the op and are differentiated
by autograd.
"""

import functools
import os
from typing import Optional  # custom_op reads Optional[Tensor] from annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..taylor_shift.efficient import finish_outputs, grad_outputs, key_count
from ..taylor_shift.features import scaled_key, scaled_query, score_factor, values_with_ones
from ..taylor_shift.second_order import graph_grads, taylor_sums, wants_graph
from .layout import TILE, Layout, layout

# How the kernels multiply (the DOT constexpr): float32 inputs keep exact float32 products
# ("ieee": "tf32" would round features to 10 mantissa bits, FMA units); float16 and
# bfloat16 inputs give the dots operands of their own dtype, with float32 accumulation
# (tensor cores). float32 inputs with torch.backends.cuda.matmul.allow_tf32 set take TF32
# dots, the trade torch makes for its own float32 matmuls (and the direct kernels).
# Sums that are not dots (the denominator rows) stay float32 in every case.
# docs/triton-efficient.md §6 has the error and speed of each.
DOT_FP32, DOT_FP16, DOT_BF16, DOT_TF32 = 0, 1, 2, 3
# Launch settings per DOT kind: tokens per step of the state kernel (block_n), per
# program of the grad kernel (block_m) and of the apply kernel (apply_block_m), warps and
# software-pipelining stages. The apply and grad kernels hold a (T², DVP) state block and a
# (BLOCK_M, T²) feature block as dot operands in shared memory: float32 at dv = 128 with
# BLOCK_M = 32 and one stage that is 166 KB (sm_80 allows 163 KiB per block, sm_90
# 227 KiB); half as much in 16 bits. In 16 bits the state kernel steps 32 tokens on 8
# warps (its (T², 64) accumulator spills on 4 warps or at 64 tokens a step), the grad
# kernel runs 64 tokens on 8 warps (it spills on 4), and the apply kernel 128 tokens on
# 8 warps with the state blocks double-buffered; past 64 value columns (WIDE_DVP) the
# apply kernel's accumulator and feature block no longer fit 8 warps' registers and it
# takes 64 tokens on 4 warps. Plain dicts, so that a tuning run can set them.
LAUNCH = {
    DOT_FP32: dict(block_n=64, block_m=32, state_warps=4, token_warps=4, state_stages=2,
                   token_stages=1, apply_block_m=32, apply_warps=4, apply_stages=1),
    DOT_FP16: dict(block_n=32, block_m=64, state_warps=8, token_warps=8, state_stages=2,
                   token_stages=1, apply_block_m=128, apply_warps=8, apply_stages=2),
    DOT_BF16: dict(block_n=32, block_m=64, state_warps=8, token_warps=8, state_stages=2,
                   token_stages=1, apply_block_m=128, apply_warps=8, apply_stages=2),
    # float32 operands in shared memory, as DOT_FP32 (not timed on a GPU yet)
    DOT_TF32: dict(block_n=64, block_m=32, state_warps=4, token_warps=4, state_stages=2,
                   token_stages=1, apply_block_m=32, apply_warps=4, apply_stages=1),
}  # fmt: skip
WIDE_DVP = 64


def apply_launch(dot: int, lay: Layout) -> tuple[int, int, int]:
    """(tokens per program, warps, stages) of the apply kernel for this call."""
    launch = LAUNCH[dot]
    block_m, warps = launch["apply_block_m"], launch["apply_warps"]
    if lay.dvp > WIDE_DVP and block_m > 64:
        block_m, warps = 64, max(4, warps // 2)
    return block_m, warps, launch["apply_stages"]


# Columns of the state per program of the state kernel (dv padded to a power of two >= 16).
MAX_BLOCK_DV = 64
# The state kernel splits the tokens among programs when B·H · pairs · column blocks alone
# would leave the GPU idle: enough splits for about STATE_PROGRAMS programs, each at least
# SPLIT_MIN_TOKENS tokens; the partial states are summed in torch (float32, fixed order).
STATE_PROGRAMS = 1024
SPLIT_MIN_TOKENS = 2048
# triton.jit reads TRITON_INTERPRET when it wraps the kernels below, at import: CPU tensors
# work only if it was "1" then.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


def dot_kind(dtype: torch.dtype) -> int:
    """The DOT constexpr for inputs of ``dtype``: 16-bit operands for 16-bit inputs, TF32
    for float32 where torch allows it for its matmuls, else exact float32."""
    if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32:
        return DOT_TF32
    return {torch.float16: DOT_FP16, torch.bfloat16: DOT_BF16}.get(dtype, DOT_FP32)


@triton.jit
def _mma(a, b, DOT: tl.constexpr):
    # a @ b accumulated in float32; the operands rounded to 16 bits first (DOT 1, 2) or to
    # TF32 by the tensor cores (DOT 3); DOT 0 exact.
    if DOT == 1:
        c = tl.dot(a.to(tl.float16), b.to(tl.float16))
    elif DOT == 2:
        c = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    elif DOT == 3:
        c = tl.dot(a, b, input_precision="tf32")
    else:
        c = tl.dot(a, b, input_precision="ieee")
    return c


@triton.jit
def _mma_acc(a, b, acc, DOT: tl.constexpr):
    # acc + a @ b, accumulated by the dot itself (one wgmma chain, no separate adds over
    # the accumulator); operands rounded as in _mma.
    if DOT == 1:
        c = tl.dot(a.to(tl.float16), b.to(tl.float16), acc)
    elif DOT == 2:
        c = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
    elif DOT == 3:
        c = tl.dot(a, b, acc, input_precision="tf32")
    else:
        c = tl.dot(a, b, acc, input_precision="ieee")
    return c


@triton.jit
def _moment_dot(a, b, DOT: tl.constexpr):
    # a @ b for the denominator's small moment products (T columns): float32 operands,
    # TF32 tensor cores unless the call is exact float32. The denominator never takes
    # 16-bit operands: it divides every output.
    return tl.dot(a, b, input_precision="ieee" if DOT == 0 else "tf32")


@triton.jit
def _pair_index(ta, tb, NT: tl.constexpr):
    # Row-major index of the tile pair (ta, tb), ta <= tb: row ta starts after
    # NT + (NT - 1) + ... + (NT - ta + 1) pairs.
    return ta * NT - (ta * (ta - 1)) // 2 + (tb - ta)


@triton.jit
def _load_tile(base, rows, live, stride_n, tile, T: tl.constexpr, D: tl.constexpr):
    # (len(rows), T) columns tile·T .. tile·T + T - 1 of x, zeros past d and past N.
    cols = tile * T + tl.arange(0, T)
    ptrs = base + rows[:, None] * stride_n + cols[None, :]
    return tl.load(ptrs, mask=live[:, None] & (cols[None, :] < D), other=0.0).to(tl.float32)


@triton.jit
def _load_rows(
    u_base, r_base, rows, live, su_n, sr_n, cols, DV: tl.constexpr, R_MODE: tl.constexpr
):
    # The per-token right-hand side [u, r]: u (len(rows), len(cols)) and r (len(rows),).
    # R_MODE 0: r = 1; 1: r is a row mask that also multiplies u; 2: r is its own column.
    u = tl.load(
        u_base + rows[:, None] * su_n + cols[None, :],
        mask=live[:, None] & (cols[None, :] < DV),
        other=0.0,
    ).to(tl.float32)
    if R_MODE == 0:
        r = live.to(tl.float32)
    else:
        r = tl.load(r_base + rows * sr_n, mask=live, other=0.0).to(tl.float32)
    if R_MODE == 1:
        u = u * r[:, None]
    return u, r


@triton.jit
def _token_block(N, BLOCK_M: tl.constexpr):
    # (bh, rows, live) of a program over tokens: grid axis 0 is b·h, axis 1 the block of
    # BLOCK_M tokens; live marks the rows < N.
    bh = tl.program_id(0).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    return bh, rows, rows < N


@triton.jit
def _pair_offsets(p, tt, cols, T: tl.constexpr, DVP: tl.constexpr, OFF_QD: tl.constexpr):
    # Where tile pair p's share of one (b, h)'s state lies: its (T², len(cols)) block of S
    # and its (T²,) denominator row. The state kernel writes there, the others read.
    return p * (T * T * DVP) + tt[:, None] * DVP + cols[None, :], OFF_QD + p * (T * T) + tt


@triton.jit
def _linear_offsets(
    ta, cols, T: tl.constexpr, DVP: tl.constexpr, OFF_L: tl.constexpr, OFF_LD: tl.constexpr
):
    # Tile ta's linear rows of the state: its feature indices ca (T,), where its
    # (T, len(cols)) block lies and where its (T,) denominator lies.
    ca = ta * T + tl.arange(0, T)
    return ca, OFF_L + ca[:, None] * DVP + cols[None, :], OFF_LD + ca


@triton.jit
def _state_kernel(
    x_ptr, u_ptr, r_ptr, pairs_ptr, s_ptr, N, SPAN,
    sx_b, sx_n, su_b, su_n, sr_b, sr_n, ss_b, ss_split,
    D: tl.constexpr, DV: tl.constexpr, DVP: tl.constexpr, T: tl.constexpr,
    OFF_QD: tl.constexpr, OFF_L: tl.constexpr, OFF_LD: tl.constexpr,
    OFF_C: tl.constexpr, OFF_CD: tl.constexpr,
    R_MODE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DV: tl.constexpr,
    SPLITS: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """S = Σ_n φ(x_n)ᵀ [u_n, r_n] for one (b·h, tile pair, column block, token split).

    Split s sums the tokens s·SPAN .. (s + 1)·SPAN - 1 into partial state s (at s·ss_split).
    Every program also sums the linear rows of its first tile and the constant row; only
    the diagonal pairs (linear) and pair 0 (constant) store them: a 1/T overhead that
    keeps the loop free of branches.
    """
    bh = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    dvb = tl.program_id(2) // SPLITS
    split = tl.program_id(2) % SPLITS
    n_lo = split * SPAN
    n_hi = tl.minimum(N, n_lo + SPAN)
    ta = tl.load(pairs_ptr + 2 * p)
    tb = tl.load(pairs_ptr + 2 * p + 1)
    x_base = x_ptr + bh * sx_b
    u_base = u_ptr + bh * su_b
    r_base = r_ptr + bh * sr_b
    cols = dvb * BLOCK_DV + tl.arange(0, BLOCK_DV)
    offs = tl.arange(0, BLOCK_N)

    quad = tl.zeros((T * T, BLOCK_DV), tl.float32)
    quad_den = tl.zeros((T, T), tl.float32)
    lin = tl.zeros((T, BLOCK_DV), tl.float32)
    lin_den = tl.zeros((T,), tl.float32)
    const = tl.zeros((BLOCK_DV,), tl.float32)
    const_den = tl.zeros((BLOCK_N,), tl.float32)
    for n0 in range(n_lo, n_hi, BLOCK_N):
        rows = n0 + offs
        live = rows < n_hi
        xa = _load_tile(x_base, rows, live, sx_n, ta, T, D)
        xb = _load_tile(x_base, rows, live, sx_n, tb, T, D)
        u, r = _load_rows(u_base, r_base, rows, live, su_n, sr_n, cols, DV, R_MODE)
        f = tl.reshape(xa[:, :, None] * xb[:, None, :], (BLOCK_N, T * T))
        quad = _mma_acc(tl.trans(f), u, quad, DOT)
        # the ones column of the quadratic rows is the moment x_Aᵀ diag(r) x_B (T × T)
        quad_den += _moment_dot(tl.trans(xa), xb * r[:, None], DOT)
        lin = _mma_acc(tl.trans(xa), u, lin, DOT)
        lin_den += tl.sum(xa * r[:, None], axis=0)
        const += tl.sum(u, axis=0)
        const_den += r

    s_base = s_ptr + split * ss_split + bh * ss_b
    tt = tl.arange(0, T * T)
    at_q, at_qd = _pair_offsets(p, tt, cols, T, DVP, OFF_QD)
    ca, at_l, at_ld = _linear_offsets(ta, cols, T, DVP, OFF_L, OFF_LD)
    # Store masks as vectors: program ids may be plain ints (interpreter).
    first = (tt * 0 + dvb) == 0  # (T²,)
    diag = (ca * 0 + ta) == tb  # (T,)
    pair0 = (cols * 0 + p) == 0  # (BLOCK_DV,)
    tl.store(s_base + at_q, quad)
    tl.store(s_base + at_qd, tl.reshape(quad_den, (T * T,)), mask=first)
    tl.store(s_base + at_l, lin, mask=diag[:, None])
    tl.store(s_base + at_ld, lin_den, mask=diag & ((ca * 0 + dvb) == 0))
    tl.store(s_base + OFF_C + cols, const, mask=pair0)
    total = tl.zeros((BLOCK_DV,), tl.float32) + tl.sum(const_den, axis=0)
    tl.store(s_base + OFF_CD + cols, total, mask=pair0 & (cols == 0))


@triton.jit
def _pair_tiles(p, NT: tl.constexpr):
    # Inverse of _pair_index: (ta, tb) of pair p. Row ta of the triangle starts at pair
    # s(ta) = ta·NT − ta(ta − 1)/2, the root of t² − (2NT + 1) t + 2 s = 0; at p = s(ta) the
    # discriminant is the square (2NT + 1 − 2ta)², exact in float32, so the floor is ta
    # for every p of the row. Computed from p, not read from a table: a load in the loop
    # head keeps Triton from pipelining the loop.
    b = 2 * NT + 1
    disc = (b * b - 8 * p).to(tl.float32)
    ta = ((b - tl.sqrt(disc)) * 0.5).to(tl.int32)
    tb = ta + p - (ta * NT - (ta * (ta - 1)) // 2)
    return ta, tb


@triton.jit
def _apply_kernel(
    x_ptr, s_ptr, sd_ptr, r_ptr, count_ptr, out_ptr, den_ptr, N,
    sx_b, sx_n, ss_b, ssd_b, sr_b, sr_n, so_b, so_n, sd_b,
    D: tl.constexpr, DV: tl.constexpr, DVP: tl.constexpr, T: tl.constexpr, NT: tl.constexpr,
    OFF_QD: tl.constexpr, OFF_L: tl.constexpr, OFF_LD: tl.constexpr,
    OFF_C: tl.constexpr, OFF_CD: tl.constexpr,
    FINISH: tl.constexpr, STORE_DEN: tl.constexpr, NORMALIZE: tl.constexpr,
    HAS_R: tl.constexpr, BLOCK_M: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """Y' = φ(x) (c ⊙ S) for BLOCK_M tokens; FINISH: y = nom/den · sqrt(n/d).

    ``s_ptr``: the state's numerator rows in the dots' operand dtype (a 16-bit copy made
    once a call, or the float32 state itself); ``sd_ptr``: the float32 state, read for
    the denominator rows and the constant. One flat loop over the tile pairs: per pair the
    numerator takes F @ S_AB on the tensor cores, accumulated in the dot, and the
    denominator the T × T moment block, x_A M_AB x_Bᵀ, a small dot in place of a
    reduction over the T² features. Without FINISH the numerator is stored, times the row
    mask r when HAS_R (g_v). The denominator (float32) is stored when STORE_DEN.
    """
    bh, rows, live = _token_block(N, BLOCK_M)
    x_base = x_ptr + bh * sx_b
    s_base = s_ptr + bh * ss_b
    sd_base = sd_ptr + bh * ssd_b
    cols = tl.arange(0, DVP)
    tt = tl.arange(0, T * T)
    ti = tl.arange(0, T)

    nom = tl.zeros((BLOCK_M, DVP), tl.float32)
    den = tl.zeros((BLOCK_M,), tl.float32)
    for p in range(0, NT * (NT + 1) // 2):
        ta, tb = _pair_tiles(p, NT)
        # c: a diagonal tile pair holds (a, b) and (b, a); ½ on x_A is ½ on its features
        xa = _load_tile(x_base, rows, live, sx_n, ta, T, D) * tl.where(ta == tb, 0.5, 1.0)
        xb = _load_tile(x_base, rows, live, sx_n, tb, T, D)
        f = tl.reshape(xa[:, :, None] * xb[:, None, :], (BLOCK_M, T * T))
        at_q, _ = _pair_offsets(p, tt, cols, T, DVP, OFF_QD)
        nom = _mma_acc(f, tl.load(s_base + at_q), nom, DOT)
        if STORE_DEN:
            m_ab = tl.load(sd_base + OFF_QD + p * (T * T) + ti[:, None] * T + ti[None, :])
            den += tl.sum(_moment_dot(xa, m_ab, DOT) * xb, axis=1)
    for ta in range(0, NT):
        xa = _load_tile(x_base, rows, live, sx_n, ta, T, D)
        _, at_l, at_ld = _linear_offsets(ta, cols, T, DVP, OFF_L, OFF_LD)
        nom = _mma_acc(xa, tl.load(s_base + at_l), nom, DOT)
        if STORE_DEN:
            den += tl.sum(xa * tl.load(sd_base + at_ld)[None, :], axis=1)
    nom += tl.load(sd_base + OFF_C + cols)[None, :]
    den += tl.load(sd_base + OFF_CD)

    if FINISH:
        count = tl.load(count_ptr + bh)
        valid = count > 0
        # A query with no attended key has nom = den = 0 exactly: output 0, never 0/0.
        scale = tl.where(valid, 1.0 / tl.where(valid, den, 1.0), 0.0)
        if NORMALIZE:
            scale = scale * tl.sqrt(count / D)
        y = nom * scale[:, None]
    else:
        y = nom
        if HAS_R:
            r = tl.load(r_ptr + bh * sr_b + rows * sr_n, mask=live, other=0.0).to(tl.float32)
            y = y * r[:, None]
    if STORE_DEN:
        tl.store(den_ptr + bh * sd_b + rows, den, mask=live)
    out_ptrs = out_ptr + bh * so_b + rows[:, None] * so_n + cols[None, :]
    tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=live[:, None] & (cols[None, :] < DV))


@triton.jit
def _grad_kernel(
    x_ptr, u_ptr, r_ptr, s_ptr, sd_ptr, gx_ptr, N,
    sx_b, sx_n, su_b, su_n, sr_b, sr_n, ss_b, ssd_b, sg_b, sg_n,
    D: tl.constexpr, DV: tl.constexpr, DVP: tl.constexpr, T: tl.constexpr,
    NT: tl.constexpr, NT_PAD: tl.constexpr,
    OFF_QD: tl.constexpr, OFF_L: tl.constexpr, OFF_LD: tl.constexpr,
    R_MODE: tl.constexpr, BLOCK_M: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """g_x = ∂/∂x Σ_c [u, r]_c (φ(x) (c ⊙ S))_c for BLOCK_M tokens.

    Per tile pair (A, B): z = [u, r] S_ABᵀ (BLOCK_M, T²), then Σ_ab x_a x_b z_ab gives
    z x_B to tile A and zᵀ x_A to tile B. The gradient lives in registers as
    (BLOCK_M, NT_PAD, T); a tile is added where the tile index matches. ``s_ptr``: the
    state's numerator rows in the dots' dtype (as for _apply_kernel); ``sd_ptr``: the
    float32 state, read for the denominator rows.
    """
    bh, rows, live = _token_block(N, BLOCK_M)
    x_base = x_ptr + bh * sx_b
    s_base = s_ptr + bh * ss_b
    sd_base = sd_ptr + bh * ssd_b
    cols = tl.arange(0, DVP)
    tt = tl.arange(0, T * T)
    g, r = _load_rows(
        u_ptr + bh * su_b, r_ptr + bh * sr_b, rows, live, su_n, sr_n, cols, DV, R_MODE
    )
    tile_of = tl.arange(0, NT_PAD)[None, :, None]

    gx = tl.zeros((BLOCK_M, NT_PAD, T), tl.float32)
    for ta in range(0, NT):
        xa = _load_tile(x_base, rows, live, sx_n, ta, T, D)
        ga = tl.zeros((BLOCK_M, T), tl.float32)
        for tb in range(ta, NT):
            xb = _load_tile(x_base, rows, live, sx_n, tb, T, D)
            p = _pair_index(ta, tb, NT)
            w = tl.where(ta == tb, 0.5, 1.0)
            at_q, at_qd = _pair_offsets(p, tt, cols, T, DVP, OFF_QD)
            sq, sqd = tl.load(s_base + at_q), tl.load(sd_base + at_qd)
            # the denominator's column starts the accumulator; c (w) goes on the T-wide
            # tiles of the contraction, not on the T²-wide z
            z = _mma_acc(g, tl.trans(sq), r[:, None] * sqd[None, :], DOT)
            z = tl.reshape(z, (BLOCK_M, T, T))
            ga += tl.sum(z * (w * xb)[:, None, :], axis=2)
            gb = tl.sum(z * (w * xa)[:, :, None], axis=1)
            gx += tl.where(tile_of == tb, gb[:, None, :], 0.0)
        _, at_l, at_ld = _linear_offsets(ta, cols, T, DVP, OFF_L, OFF_LD)
        sl, sld = tl.load(s_base + at_l), tl.load(sd_base + at_ld)
        ga += _mma(g, tl.trans(sl), DOT) + r[:, None] * sld[None, :]
        gx += tl.where(tile_of == ta, ga[:, None, :], 0.0)

    out = tl.reshape(gx, (BLOCK_M, NT_PAD * T))
    dcols = tl.arange(0, NT_PAD * T)
    ptrs = gx_ptr + bh * sg_b + rows[:, None] * sg_n + dcols[None, :]
    tl.store(ptrs, out, mask=live[:, None] & (dcols[None, :] < D))


# ----------------------------------------------------------------------------------------
# Launchers. x: (BH, N, d) float32 contiguous; u: (BH, N, >= dv) rows of stride su_n; r: a
# (BH, N) view (any strides) or None; states: (BH, layout.size) float32.


@functools.lru_cache(maxsize=64)
def _pair_table(nt: int, device: torch.device) -> Tensor:
    """(P, 2) int32: the tile pairs (A, B), A <= B, in the row-major order of the state."""
    pairs = [(a, b) for a in range(nt) for b in range(a, nt)]
    return torch.tensor(pairs, dtype=torch.int32, device=device)


def _r_args(r: Tensor | None, like: Tensor):
    if r is None:
        return like, 0, 0
    return r, r.stride(0), r.stride(1)


def _offsets(lay: Layout) -> dict:
    """The state offsets every kernel reads (the constant row is passed where used)."""
    return dict(
        OFF_QD=lay.off_quad_den,
        OFF_L=lay.off_lin,
        OFF_LD=lay.off_lin_den,
    )


def state_splits(bh: int, n: int, lay: Layout, block_n: int) -> tuple[int, int]:
    """(splits, tokens per split) of the state kernel: (1, n) unless B·H · pairs · column
    blocks is under STATE_PROGRAMS and n has room for splits of SPLIT_MIN_TOKENS; a split
    holds whole blocks of ``block_n`` tokens."""
    programs = bh * lay.pairs * (lay.dvp // min(lay.dvp, MAX_BLOCK_DV))
    splits = max(1, min(n // max(SPLIT_MIN_TOKENS, 1), triton.cdiv(STATE_PROGRAMS, programs)))
    if splits == 1:
        return 1, n
    span = triton.cdiv(triton.cdiv(n, splits), block_n) * block_n
    return triton.cdiv(n, span), span


def _state(
    x: Tensor, u: Tensor, r: Tensor | None, r_mode: int, lay: Layout, dot: int = DOT_FP32
) -> Tensor:
    bh, n, _ = x.shape
    launch = LAUNCH[dot]
    splits, span = state_splits(bh, n, lay, launch["block_n"])
    state = torch.zeros((splits, bh, lay.size), dtype=torch.float32, device=x.device)
    block_dv = min(lay.dvp, MAX_BLOCK_DV)
    r_t, sr_b, sr_n = _r_args(r, x)
    grid = (bh, lay.pairs, (lay.dvp // block_dv) * splits)
    _state_kernel[grid](
        x, u, r_t, _pair_table(lay.nt, x.device), state, n, span,
        x.stride(0), x.stride(1), u.stride(0), u.stride(1), sr_b, sr_n, state.stride(1),
        state.stride(0),
        D=lay.d, DV=lay.dv, DVP=lay.dvp, T=TILE, **_offsets(lay),
        OFF_C=lay.off_const, OFF_CD=lay.off_const_den,
        R_MODE=r_mode, BLOCK_N=launch["block_n"], BLOCK_DV=block_dv, SPLITS=splits,
        DOT=dot, num_warps=launch["state_warps"], num_stages=launch["state_stages"],
    )  # fmt: skip
    return state[0] if splits == 1 else state.sum(0)


def operands(state: Tensor, dot: int) -> Tensor:
    """The state as the apply kernel's dots take it: a 16-bit copy for 16-bit dots (made
    once a call, where every program would round the same float32 blocks again), else the
    float32 state itself. The rounding is the one the dots make anyway."""
    dtype = {DOT_FP16: torch.float16, DOT_BF16: torch.bfloat16}.get(dot)
    return state if dtype is None else state.to(dtype)


def _apply(
    x: Tensor,
    state: Tensor,
    lay: Layout,
    out: Tensor,
    *,
    den: Tensor | None = None,
    count: Tensor | None = None,
    normalize: bool = False,
    r: Tensor | None = None,
    dot: int = DOT_FP32,
    finish: bool = True,
    state_operands: Tensor | None = None,
) -> None:
    """Writes φ(x)(c ⊙ S) into out (BH, N, dv) (a view with unit column stride is fine) and,
    when ``den`` (BH, N) is given, the denominators into it; the outputs are finished
    (y = nom/den · …) when ``den`` is given and ``finish``. ``state_operands``: the state
    in the dots' dtype (``operands``), or None to let the kernel round the float32 state."""
    bh, n, _ = x.shape
    store_den = den is not None
    finish = finish and store_den
    r_t, sr_b, sr_n = _r_args(r, x)
    block_m, warps, stages = apply_launch(dot, lay)
    ops = state if state_operands is None else state_operands
    grid = (bh, triton.cdiv(n, block_m))
    _apply_kernel[grid](
        x, ops, state, r_t, count if finish else x, out, den if store_den else x, n,
        x.stride(0), x.stride(1), ops.stride(0), state.stride(0), sr_b, sr_n, out.stride(0),
        out.stride(1), den.stride(0) if store_den else 0,
        D=lay.d, DV=lay.dv, DVP=lay.dvp, T=TILE, NT=lay.nt, **_offsets(lay),
        OFF_C=lay.off_const, OFF_CD=lay.off_const_den,
        FINISH=finish, STORE_DEN=store_den, NORMALIZE=normalize, HAS_R=r is not None,
        BLOCK_M=block_m, DOT=dot, num_warps=warps, num_stages=stages,
    )  # fmt: skip


def _grad(
    x: Tensor,
    u: Tensor,
    r: Tensor | None,
    r_mode: int,
    state: Tensor,
    lay: Layout,
    dot: int = DOT_FP32,
    state_operands: Tensor | None = None,
) -> Tensor:
    bh, n, _ = x.shape
    gx = torch.empty_like(x)
    ops = state if state_operands is None else state_operands
    r_t, sr_b, sr_n = _r_args(r, x)
    launch = LAUNCH[dot]
    grid = (bh, triton.cdiv(n, launch["block_m"]))
    _grad_kernel[grid](
        x, u, r_t, ops, state, gx, n,
        x.stride(0), x.stride(1), u.stride(0), u.stride(1), sr_b, sr_n, ops.stride(0),
        state.stride(0), gx.stride(0), gx.stride(1),
        D=lay.d, DV=lay.dv, DVP=lay.dvp, T=TILE, NT=lay.nt, NT_PAD=lay.nt_pad, **_offsets(lay),
        R_MODE=r_mode, BLOCK_M=launch["block_m"], DOT=dot, num_warps=launch["token_warps"],
        num_stages=launch["token_stages"],
    )  # fmt: skip
    return gx


def _flat(t: Tensor) -> Tensor:
    """(B, H, N, ...) -> (B·H, N, ...) contiguous.

    Through a flat view, not ``reshape``: inside ``torch.cond`` (``mode="auto"`` under
    torch.export with a dynamic N), merging B and H by reshape made torch 2.11 emit a guard
    on N, ``Min(16·N, 32·N) == 16·N``, that export then reported as violated
    (benchmarks/gpu_h100/2026-11-28); a contiguous tensor's flat view needs no such guard.
    """
    return t.contiguous().view(-1).view(t.shape[0] * t.shape[1], *t.shape[2:])


# ----------------------------------------------------------------------------------------
# Custom ops: the kernels as opaque operators with fake (meta) implementations, so that
# torch.compile traces through them, and an autograd formula registered on the forward.


@torch.library.custom_op("taylorshift::triton_efficient_forward", mutates_args=())
def triton_efficient_forward(
    qp: Tensor,
    kp: Tensor,
    value: Tensor,
    key_mask: Optional[Tensor],  # noqa: UP045
    normalize: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """Core of the forward on q' (B, H, Nq, d) and k' (B, H, Nk, d) float32.

    Returns y (B, H, Nq, dv) in value's dtype, the denominators (B, H, Nq) float32 and the
    key-side state (B, H, ``layout(d, dv).size``) float32, both kept for backward.
    """
    b, h, nq, d = qp.shape
    nk, dv = kp.shape[2], value.shape[3]
    lay = layout(d, dv)
    q, k, v = _flat(qp), _flat(kp), _flat(value)
    mask = None if key_mask is None else _flat(key_mask.expand(b, h, nk)).to(torch.float32)
    dot = dot_kind(value.dtype)
    state = _state(k, v, mask, 0 if mask is None else 1, lay, dot)
    if mask is None:
        count = torch.full((b * h,), float(nk), dtype=torch.float32, device=qp.device)
    else:
        count = mask.sum(-1)
    out = torch.empty((b * h, nq, dv), dtype=value.dtype, device=qp.device)
    den = torch.empty((b * h, nq), dtype=torch.float32, device=qp.device)
    _apply(
        q, state, lay, out, den=den, count=count, normalize=normalize, dot=dot,
        state_operands=operands(state, dot),
    )  # fmt: skip
    return out.view(b, h, nq, dv), den.view(b, h, nq), state.view(b, h, lay.size)


@triton_efficient_forward.register_fake
def _(qp, kp, value, key_mask, normalize):
    b, h, nq, d = qp.shape
    dv = value.shape[3]
    return (
        qp.new_empty((b, h, nq, dv), dtype=value.dtype),
        qp.new_empty((b, h, nq), dtype=torch.float32),
        qp.new_empty((b, h, layout(d, dv).size), dtype=torch.float32),
    )


@torch.library.custom_op("taylorshift::triton_efficient_backward", mutates_args=())
def triton_efficient_backward(
    grad_out: Tensor,
    qp: Tensor,
    kp: Tensor,
    value: Tensor,
    key_mask: Optional[Tensor],  # noqa: UP045
    out: Tensor,
    den: Tensor,
    state: Tensor,
    normalize: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of q', k' (float32) and value (its dtype) from the gradient of y."""
    b, h, _, d = qp.shape
    nk, dv = kp.shape[2], value.shape[3]
    lay = layout(d, dv)
    count = key_count(key_mask, nk, torch.float32, qp.device)  # (B, H, 1) or 0-d
    # gY' = [g_nom, g_den] (B·H, Nq, dv + 1): columns :dv are u, column dv is r.
    g = _flat(grad_outputs(grad_out.float(), out.float(), den, count, normalize, d))
    g_den = g[:, :, dv]
    q, k, v = _flat(qp), _flat(kp), _flat(value)
    mask = None if key_mask is None else _flat(key_mask.expand(b, h, nk)).to(torch.float32)
    flat_state = state.view(b * h, lay.size)

    dot = dot_kind(value.dtype)
    grad_state = _state(q, g, g_den, 2, lay, dot)  # R = Σ_i φ(q'_i)ᵀ gY'_i
    grad_ops = operands(grad_state, dot)
    gq = _grad(q, g, g_den, 2, flat_state, lay, dot, state_operands=operands(flat_state, dot))
    gv = torch.empty_like(v)
    _apply(k, grad_state, lay, gv, r=mask, dot=dot, state_operands=grad_ops)  # m · φ(k')(c ⊙ R)
    gk = _grad(k, v, mask, 0 if mask is None else 1, grad_state, lay, dot, state_operands=grad_ops)
    return gq.view(qp.shape), gk.view(kp.shape), gv.view(value.shape)


@triton_efficient_backward.register_fake
def _(grad_out, qp, kp, value, key_mask, out, den, state, normalize):
    return torch.empty_like(qp), torch.empty_like(kp), torch.empty_like(value)


def _setup_context(ctx, inputs, output):
    qp, kp, value, key_mask, normalize = inputs
    out, den, state = output
    ctx.save_for_backward(qp, kp, value, key_mask, out, den, state)
    ctx.normalize = normalize
    ctx.mark_non_differentiable(den, state)


def _backward(ctx, grad_out, _grad_den, _grad_state):
    qp, kp, value, key_mask, out, den, state = ctx.saved_tensors
    if wants_graph():  # create_graph=True: the core's sums in plain ops, differentiable again
        grads = graph_grads(
            lambda q, k, v: _core_reference(q, k, v, key_mask, ctx.normalize),
            grad_out, (qp, kp, value), ctx.needs_input_grad[:3],
        )  # fmt: skip
        return (*grads, None, None)
    gq, gk, gv = triton_efficient_backward(
        grad_out.contiguous(), qp, kp, value, key_mask, out, den, state, ctx.normalize
    )
    return gq, gk, gv, None, None


triton_efficient_forward.register_autograd(_backward, setup_context=_setup_context)


def _core_reference(
    qp: Tensor, kp: Tensor, value: Tensor, key_mask: Tensor | None, normalize: bool
) -> Tensor:
    """``triton_efficient_forward``'s y in plain torch ops (float32 sums)."""
    sums = taylor_sums(qp, kp, values_with_ones(value.float(), key_mask), False)
    count = key_count(key_mask, kp.shape[-2], torch.float32, qp.device)
    return finish_outputs(sums, count, normalize, qp.shape[-1])[0].to(value.dtype)


def check_kernel_inputs(query: Tensor, torch_form: str) -> None:
    """Refuse float64 and, outside the interpreter, tensors that are not on a CUDA device;
    ``torch_form`` names the PyTorch form to use instead."""
    if query.dtype == torch.float64:
        raise TypeError(
            "query must be float16, bfloat16 or float32 for the Triton kernels (they accumulate "
            f"in float32); got torch.float64 (use the torch {torch_form})"
        )
    if not (query.is_cuda or INTERPRETED):
        raise ValueError(
            f"query must be on a CUDA device for the Triton kernels; got device {query.device} "
            "(to run them on the CPU, set TRITON_INTERPRET=1 before taylorshift.ops.triton "
            "kernels are imported)"
        )


def scaled_inputs(
    query: Tensor,
    key: Tensor,
    temperature: Tensor | float,
    scale: float | None,
    normalize: bool,
) -> tuple[Tensor, Tensor]:
    """q' (B, H, Nq, d) and k' (B, H, Nk, d) in float32, the kernels' inputs (s = q'·k').

    O(N d) work left to torch, so that autograd differentiates these cheap maps (and a
    tensor temperature gets its gradient through q').
    """
    factor = score_factor(temperature, scale, normalize, query.shape[-1])
    if isinstance(factor, Tensor):
        factor = factor.to(torch.float32)
    qp = scaled_query(query.to(torch.float32), factor, normalize)
    return qp, scaled_key(key.to(torch.float32), normalize)


def triton_efficient_taylor_shift(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_mask: Tensor | None,
    temperature: Tensor | float,
    scale: float | None,
    normalize: bool,
    chunk_size: int | None = None,
) -> Tensor:
    """Non-causal efficient TaylorShift in fused Triton kernels, on validated inputs.

    Same contract and signature as
    ``taylorshift.ops.taylor_shift.efficient.efficient_taylor_shift``: query (B, H, Nq, d),
    key (B, H, Nk, d), value (B, H, Nk, dv), key_mask (B, H, Nk) bool (broadcast views are
    fine) or None; returns (B, H, Nq, dv) in query's dtype. Sums run in float32 for
    float16/bfloat16/float32 inputs; float64 is refused (use the torch form).
    Differentiable in query, key, value and a tensor temperature. ``chunk_size`` is not
    read: the kernels tile the tokens by their own block sizes (it sets only the schedule
    of the torch form, never its result).
    """
    check_kernel_inputs(query, "efficient form")
    qp, kp = scaled_inputs(query, key, temperature, scale, normalize)
    out, _, _ = triton_efficient_forward(
        qp.contiguous(), kp.contiguous(), value.contiguous(), key_mask, normalize
    )
    return out


__all__ = ["layout", "triton_efficient_taylor_shift"]
