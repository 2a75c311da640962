"""Direct TaylorShift (order 2) as fused Triton kernels, flash-style: forward and backward.

Layout (B, H, N, d) everywhere: query (B, H, Nq, d), key (B, H, Nk, d), value (B, H, Nk, dv).
The (Nq, Nk) weights never exist in memory: each program owns a block of queries (forward,
dq) or of keys (dk, dv) and walks the other side block by block, recomputing the scores.

Layers (STYLE principle 2)::

    _direct_fwd_kernel, _direct_bwd_dkv_kernel, _direct_bwd_dq_kernel     Triton
    taylorshift::triton_direct_forward / _backward                       torch.library ops
    triton_direct_taylor_shift                                           plain function

The q/k normalisation, the temperature or scale and the casts stay in torch around the core
op (O(N d) work), so autograd differentiates them and the temperature gets its gradient
through q' = τ q̂. The kernels see only q', k' with s_ij = q'_i · k'_j. Design notes:
docs/triton-direct.md.
"""

from typing import Optional  # custom_op reads Optional[Tensor] from annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..masks import as_4d
from ..taylor_shift.efficient import finish_outputs
from ..taylor_shift.features import (
    compute_dtype,
    scaled_key,
    scaled_query,
    score_factor,
    values_with_ones,
)
from ..taylor_shift.second_order import graph_grads, taylor_sums, wants_graph


@triton.jit
def _program_head(H):
    """(b, h, row) of this program (grid axes 2 and 1); row indexes the (B·H, Nq) statistics."""
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    return b, h, b * H + h


@triton.jit
def _block(start, N, BLOCK: tl.constexpr):
    """Offsets start, ..., start + BLOCK - 1 of a block of tokens, and which of them are < N."""
    offs = start + tl.arange(0, BLOCK)
    return offs, offs < N


@triton.jit
def _head_dims(D, DV, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Offsets over the padded head dims of q/k and of v, and which of them are real."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    return offs_d, offs_dv, offs_d < D, offs_dv < DV


@triton.jit
def _load_tile(base, rows, cols, stride_row, stride_col, row_ok, col_ok):
    """The (len(rows), len(cols)) tile at base + rows·stride_row + cols·stride_col, 0 outside."""
    return tl.load(
        base + rows[:, None] * stride_row + cols[None, :] * stride_col,
        mask=row_ok[:, None] & col_ok[None, :],
        other=0.0,
    )


@triton.jit
def _store_tile(base, tile, rows, cols, stride_row, stride_col, row_ok, col_ok):
    """Store tile where both its row and its column are real (see _load_tile)."""
    tl.store(
        base + rows[:, None] * stride_row + cols[None, :] * stride_col,
        tile,
        mask=row_ok[:, None] & col_ok[None, :],
    )


@triton.jit
def _load_rows(base, offs_m, row_ok, ACC: tl.constexpr):
    """One per-query statistic (BLOCK_M,) in ACC, 0 past Nq."""
    return tl.load(base + offs_m, mask=row_ok, other=0.0).to(ACC)


@triton.jit
def _taylor_weight(s):
    """w(s) = 1 + s + s²/2, elementwise."""
    return 1.0 + s * (1.0 + 0.5 * s)


@triton.jit
def _key_ok(m_base, offs_n, smn, col_ok, HAS_MASK: tl.constexpr):
    """(BLOCK_N,): key j exists and, with a key mask, is not masked out."""
    ok = col_ok
    if HAS_MASK:
        km = tl.load(m_base + offs_n * smn, mask=col_ok, other=0)
        ok = ok & (km != 0)
    return ok


@triton.jit
def _attended(key_ok, offs_m, offs_n, IS_CAUSAL: tl.constexpr):
    """(BLOCK_M, BLOCK_N): query i attends key j (key_ok[j], and j <= i when causal)."""
    ok = key_ok[None, :]
    if IS_CAUSAL:
        ok = ok & (offs_n[None, :] <= offs_m[:, None])
    return ok


@triton.jit
def _key_end(pid_m, NK, BLOCK_M: tl.constexpr, IS_CAUSAL: tl.constexpr):
    """End of the keys a query block walks: key blocks past it are all zero when causal."""
    hi = NK
    if IS_CAUSAL:
        hi = tl.minimum(NK, (pid_m + 1) * BLOCK_M)
    return hi


@triton.jit
def _backward_rows(F, RInv, Delta, row, offs_m, row_ok, do, NQ, ACC: tl.constexpr):
    """Backward's per-query inputs in ACC: 1/D_i and δ_i (BLOCK_M,), and g_i = f_i ∂L/∂out_i
    (BLOCK_M, BLOCK_DV), ∂L/∂y_i before the output factor."""
    f = _load_rows(F + row * NQ, offs_m, row_ok, ACC)
    ri = _load_rows(RInv + row * NQ, offs_m, row_ok, ACC)
    delta = _load_rows(Delta + row * NQ, offs_m, row_ok, ACC)
    return ri, delta, do.to(ACC) * f[:, None]


@triton.jit
def _score_grad(g, v, s, ok, ri, delta, ACC: tl.constexpr, PRECISION: tl.constexpr):
    """ds_ij = ∂L/∂s_ij on one (BLOCK_M, BLOCK_N) tile, 0 where query i does not attend key j."""
    dp = tl.dot(g, tl.trans(v), input_precision=PRECISION, out_dtype=ACC)  # g_i · v_j
    # ∂y_i/∂w_ij = (v_j − y_i)/D_i and w'(s) = 1 + s.
    return tl.where(ok, (dp - delta[:, None]) * (1.0 + s) * ri[:, None], 0.0)


@triton.jit
def _direct_fwd_kernel(
    Q, K, V, F, KM, KMAX, Out, RInv,
    sqb, sqh, sqn, sqd,
    skb, skh, skn, skd,
    svb, svh, svn, svd,
    smb, smh, smn,
    sob, soh, son, sod,
    H, NQ, NK, D, DV,
    HAS_MASK: tl.constexpr, IS_CAUSAL: tl.constexpr, ACC: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    """One block of BLOCK_M queries of one (b, h): out = f · Σ_j w v_j / Σ_j w, RInv = 1/Σ_j w."""
    pid_m = tl.program_id(0)
    b, h, pid_bh = _program_head(H)
    offs_m, row_ok = _block(pid_m * BLOCK_M, NQ, BLOCK_M)
    offs_d, offs_dv, d_ok, dv_ok = _head_dims(D, DV, BLOCK_D, BLOCK_DV)

    # q (BLOCK_M, BLOCK_D) of this query block
    q = _load_tile(Q + b * sqb + h * sqh, offs_m, offs_d, sqn, sqd, row_ok, d_ok)
    # A static bound, not a running max: |s_ij| <= ‖q'_i‖ max_j ‖k'_j‖ = r_i, and
    # 1/2 <= w(s) <= w(r_i), so c_i w lies in (0, 1] and can be rounded to float16/bfloat16
    # for the second matmul without overflow. c_i cancels between numerator and denominator.
    qf = q.to(ACC)
    r = tl.sqrt(tl.sum(qf * qf, 1)) * tl.load(KMAX + pid_bh).to(ACC)
    c = 1.0 / _taylor_weight(r)  # (BLOCK_M,)

    k_base = K + b * skb + h * skh
    v_base = V + b * svb + h * svh
    m_base = KM + b * smb + h * smh
    acc = tl.zeros((BLOCK_M, BLOCK_DV), dtype=ACC)
    den = tl.zeros((BLOCK_M,), dtype=ACC)
    for start_n in range(0, _key_end(pid_m, NK, BLOCK_M, IS_CAUSAL), BLOCK_N):
        offs_n, col_ok = _block(start_n, NK, BLOCK_N)
        k = _load_tile(k_base, offs_n, offs_d, skn, skd, col_ok, d_ok)  # (BLOCK_N, BLOCK_D)
        v = _load_tile(v_base, offs_n, offs_dv, svn, svd, col_ok, dv_ok)  # (BLOCK_N, BLOCK_DV)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION, out_dtype=ACC)  # (BLOCK_M, BLOCK_N)
        key_ok = _key_ok(m_base, offs_n, smn, col_ok, HAS_MASK)
        ok = _attended(key_ok, offs_m, offs_n, IS_CAUSAL)
        # Masked keys leave every sum, the constant term of w included.
        w = tl.where(ok, _taylor_weight(s) * c[:, None], 0.0)
        den += tl.sum(w, 1)
        acc += tl.dot(w.to(v.dtype), v, input_precision=PRECISION, out_dtype=ACC)

    f = _load_rows(F + pid_bh * NQ, offs_m, row_ok, ACC)
    # den >= c_i n_i / 2 > 0 when query i attends any key; an empty row has acc = den = 0 and
    # divides by 1 to stay at exactly zero.
    has = den > 0
    safe = tl.where(has, den, 1.0)
    out = acc / safe[:, None] * f[:, None]
    out_base = Out + b * sob + h * soh
    _store_tile(out_base, out.to(Out.dtype.element_ty), offs_m, offs_dv, son, sod, row_ok, dv_ok)
    # 1 / Σ_j w(s_ij) without the c_i factor, 0 for an empty row: backward's only statistic.
    tl.store(RInv + pid_bh * NQ + offs_m, tl.where(has, c / safe, 0.0), mask=row_ok)


@triton.jit
def _direct_bwd_dkv_kernel(
    Q, K, V, F, KM, DO, RInv, Delta, DK, DVal,
    sqb, sqh, sqn, sqd,
    skb, skh, skn, skd,
    svb, svh, svn, svd,
    smb, smh, smn,
    sdb, sdh, sdn, sdd,
    sxb, sxh, sxn, sxd,
    syb, syh, syn, syd,
    H, NQ, NK, D, DV,
    HAS_MASK: tl.constexpr, IS_CAUSAL: tl.constexpr, ACC: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    """One block of BLOCK_N keys: dk' = Σ_i ds_ij q'_i and dv_j = Σ_i p_ij g_i over query blocks.

    DK has the strides sx*, DVal the strides sy*.
    """
    pid_n = tl.program_id(0)
    b, h, pid_bh = _program_head(H)
    offs_n, col_ok = _block(pid_n * BLOCK_N, NK, BLOCK_N)
    offs_d, offs_dv, d_ok, dv_ok = _head_dims(D, DV, BLOCK_D, BLOCK_DV)

    # k (BLOCK_N, BLOCK_D) and v (BLOCK_N, BLOCK_DV) of this key block
    k = _load_tile(K + b * skb + h * skh, offs_n, offs_d, skn, skd, col_ok, d_ok)
    v = _load_tile(V + b * svb + h * svh, offs_n, offs_dv, svn, svd, col_ok, dv_ok)
    key_ok = _key_ok(KM + b * smb + h * smh, offs_n, smn, col_ok, HAS_MASK)

    q_base = Q + b * sqb + h * sqh
    do_base = DO + b * sdb + h * sdh
    dk = tl.zeros((BLOCK_N, BLOCK_D), dtype=ACC)
    dv = tl.zeros((BLOCK_N, BLOCK_DV), dtype=ACC)
    lo = 0
    if IS_CAUSAL:
        # Queries i < j do not attend key j: skip the query blocks wholly above this key block.
        lo = ((pid_n * BLOCK_N) // BLOCK_M) * BLOCK_M
    for start_m in range(lo, NQ, BLOCK_M):
        offs_m, row_ok = _block(start_m, NQ, BLOCK_M)
        q = _load_tile(q_base, offs_m, offs_d, sqn, sqd, row_ok, d_ok)  # (BLOCK_M, BLOCK_D)
        do = _load_tile(do_base, offs_m, offs_dv, sdn, sdd, row_ok, dv_ok)  # (BLOCK_M, BLOCK_DV)
        ri, delta, g = _backward_rows(F, RInv, Delta, pid_bh, offs_m, row_ok, do, NQ, ACC)
        g = g.to(v.dtype)

        s = tl.dot(q, tl.trans(k), input_precision=PRECISION, out_dtype=ACC)  # (BLOCK_M, BLOCK_N)
        ok = _attended(key_ok, offs_m, offs_n, IS_CAUSAL)
        p = tl.where(ok, _taylor_weight(s) * ri[:, None], 0.0)  # w_ij / D_i <= 1
        dv += tl.dot(tl.trans(p.to(v.dtype)), g, input_precision=PRECISION, out_dtype=ACC)
        ds = _score_grad(g, v, s, ok, ri, delta, ACC, PRECISION)
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION, out_dtype=ACC)

    dk_base = DK + b * sxb + h * sxh
    dv_base = DVal + b * syb + h * syh
    _store_tile(dk_base, dk.to(DK.dtype.element_ty), offs_n, offs_d, sxn, sxd, col_ok, d_ok)
    _store_tile(dv_base, dv.to(DVal.dtype.element_ty), offs_n, offs_dv, syn, syd, col_ok, dv_ok)


@triton.jit
def _direct_bwd_dq_kernel(
    Q, K, V, F, KM, DO, RInv, Delta, DQ,
    sqb, sqh, sqn, sqd,
    skb, skh, skn, skd,
    svb, svh, svn, svd,
    smb, smh, smn,
    sdb, sdh, sdn, sdd,
    sxb, sxh, sxn, sxd,
    H, NQ, NK, D, DV,
    HAS_MASK: tl.constexpr, IS_CAUSAL: tl.constexpr, ACC: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    """One block of BLOCK_M queries: dq'_i = Σ_j ds_ij k'_j over key blocks (strides sx*)."""
    pid_m = tl.program_id(0)
    b, h, pid_bh = _program_head(H)
    offs_m, row_ok = _block(pid_m * BLOCK_M, NQ, BLOCK_M)
    offs_d, offs_dv, d_ok, dv_ok = _head_dims(D, DV, BLOCK_D, BLOCK_DV)

    # q (BLOCK_M, BLOCK_D) and ∂L/∂out (BLOCK_M, BLOCK_DV) of this query block
    q = _load_tile(Q + b * sqb + h * sqh, offs_m, offs_d, sqn, sqd, row_ok, d_ok)
    do = _load_tile(DO + b * sdb + h * sdh, offs_m, offs_dv, sdn, sdd, row_ok, dv_ok)
    ri, delta, g = _backward_rows(F, RInv, Delta, pid_bh, offs_m, row_ok, do, NQ, ACC)
    g = g.to(V.dtype.element_ty)

    k_base = K + b * skb + h * skh
    v_base = V + b * svb + h * svh
    m_base = KM + b * smb + h * smh
    dq = tl.zeros((BLOCK_M, BLOCK_D), dtype=ACC)
    for start_n in range(0, _key_end(pid_m, NK, BLOCK_M, IS_CAUSAL), BLOCK_N):
        offs_n, col_ok = _block(start_n, NK, BLOCK_N)
        k = _load_tile(k_base, offs_n, offs_d, skn, skd, col_ok, d_ok)  # (BLOCK_N, BLOCK_D)
        v = _load_tile(v_base, offs_n, offs_dv, svn, svd, col_ok, dv_ok)  # (BLOCK_N, BLOCK_DV)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION, out_dtype=ACC)
        key_ok = _key_ok(m_base, offs_n, smn, col_ok, HAS_MASK)
        ok = _attended(key_ok, offs_m, offs_n, IS_CAUSAL)
        ds = _score_grad(g, v, s, ok, ri, delta, ACC, PRECISION)
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION, out_dtype=ACC)

    dq_base = DQ + b * sxb + h * sxh
    _store_tile(dq_base, dq.to(DQ.dtype.element_ty), offs_m, offs_d, sxn, sxd, row_ok, d_ok)


# Block sizes (BLOCK_M queries, BLOCK_N keys, warps). Untuned on a GPU so far; the interpreter
# uses small unequal blocks so that even short test sequences cross several block borders.
_INTERPRET_BLOCKS = (32, 16, 1)
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


# Whether the kernels run in Triton's CPU interpreter (``TRITON_INTERPRET=1`` when triton.jit
# wrapped them). Read here, once: an isinstance on a Triton kernel inside the wrapper breaks
# Dynamo in torch 2.11 ("cannot determine type of argument TritonKernelVariable"), which
# traces the wrapper when it is a branch of torch.cond (mode="auto" under torch.export;
# benchmarks/gpu_h200/2026-11-27).
INTERPRETED = not isinstance(_direct_fwd_kernel, triton.runtime.JITFunction)


def interpreting() -> bool:
    """Whether the kernels run in Triton's CPU interpreter (``TRITON_INTERPRET=1`` at import)."""
    return INTERPRETED


# The backward kernels' blocks for float32 inputs, where set (None: the forward's, from
# ``_blocks``; set, it wins under the interpreter too). A plain module value so that a
# tuning run (benchmarks/gpu/tune_efficient.py) can time others: on an H100
# (benchmarks/gpu_h100/2026-11-28, d = 64) the float32 backward took 40x the float32
# forward (337 of 345 ms at N = 4,096), where bf16 takes 3-5x; its float32 tiles at
# 64 x 64 with 4 warps are the suspect (registers).
FLOAT32_BACKWARD_BLOCKS: tuple[int, int, int] | None = None


def _blocks(d_pad: int, dv_pad: int) -> tuple[int, int, int]:
    if interpreting():
        return _INTERPRET_BLOCKS
    width = max(d_pad, dv_pad)
    if width <= 64:
        return 64, 64, 4
    if width <= 128:
        return 64, 32, 8
    return 32, 32, 8


def _launch_constants(query: Tensor, key_mask: Tensor | None, is_causal: bool) -> dict:
    """Compile-time switches: mask, causal, accumulator dtype, matmul precision."""
    if query.dtype == torch.float64:
        acc, precision = tl.float64, "ieee"
    elif query.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32:
        # The same trade as torch's own float32 matmuls (q @ kᵀ in the direct form).
        acc, precision = tl.float32, "tf32"
    else:
        acc, precision = tl.float32, "ieee"
    return dict(HAS_MASK=key_mask is not None, IS_CAUSAL=is_causal, ACC=acc, PRECISION=precision)


def _mask_args(key_mask: Tensor | None, dummy: Tensor) -> tuple:
    """The key mask as a uint8 view (any strides, broadcast views included) and its strides."""
    if key_mask is None:
        return dummy, 0, 0, 0
    return (key_mask.view(torch.uint8), *key_mask.stride())


def _forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    row_factor: Tensor,
    key_mask: Tensor | None,
    key_norm_max: Tensor,
    is_causal: bool,
) -> tuple[Tensor, Tensor]:
    b, h, nq, d = q.shape
    nk, dv = v.shape[-2], v.shape[-1]
    out = torch.empty((b, h, nq, dv), dtype=q.dtype, device=q.device)
    rinv = torch.empty((b, h, nq), dtype=compute_dtype(q.dtype), device=q.device)
    if rinv.numel() == 0:
        return out, rinv
    bd, bdv = _pad(d), _pad(dv)
    bm, bn, warps = _blocks(bd, bdv)
    mask, *mask_strides = _mask_args(key_mask, q)
    # Grid (query blocks, H, B): B and H each stay below CUDA's 65,535 limit on axes 1 and 2.
    grid = (triton.cdiv(nq, bm), h, b)
    _direct_fwd_kernel[grid](
        q, k, v, row_factor, mask, key_norm_max, out, rinv,
        *q.stride(), *k.stride(), *v.stride(), *mask_strides, *out.stride(),
        h, nq, nk, d, dv,
        **_launch_constants(q, key_mask, is_causal),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd, BLOCK_DV=bdv, num_warps=warps,
    )  # fmt: skip
    return out, rinv


def _backward(
    grad_out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    row_factor: Tensor,
    key_mask: Tensor | None,
    out: Tensor,
    rinv: Tensor,
    is_causal: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    b, h, nq, d = q.shape
    nk, dv = v.shape[-2], v.shape[-1]
    cd = compute_dtype(q.dtype)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dval = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    # δ_i = g_i · y_i with g = f · ∂L/∂out and y = out / f: the same as ∂L/∂out_i · out_i.
    delta = (grad_out.to(cd) * out.to(cd)).sum(-1).contiguous()  # (B, H, Nq)
    bd, bdv = _pad(d), _pad(dv)
    bm, bn, warps = _blocks(bd, bdv)
    if q.dtype == torch.float32 and FLOAT32_BACKWARD_BLOCKS is not None:
        bm, bn, warps = FLOAT32_BACKWARD_BLOCKS
    mask, *mask_strides = _mask_args(key_mask, q)
    common = (
        *q.stride(), *k.stride(), *v.stride(), *mask_strides, *grad_out.stride(),
    )  # fmt: skip
    constants = dict(
        **_launch_constants(q, key_mask, is_causal),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd, BLOCK_DV=bdv, num_warps=warps,
    )  # fmt: skip
    if nk > 0 and b * h > 0:
        _direct_bwd_dkv_kernel[(triton.cdiv(nk, bn), h, b)](
            q, k, v, row_factor, mask, grad_out, rinv, delta, dk, dval,
            *common, *dk.stride(), *dval.stride(),
            h, nq, nk, d, dv, **constants,
        )  # fmt: skip
    if nq > 0 and b * h > 0:
        _direct_bwd_dq_kernel[(triton.cdiv(nq, bm), h, b)](
            q, k, v, row_factor, mask, grad_out, rinv, delta, dq,
            *common, *dq.stride(),
            h, nq, nk, d, dv, **constants,
        )  # fmt: skip
    return dq, dk, dval


def _pad(n: int) -> int:
    """Head dims are padded (masked loads) to a power of two >= 16, as tl.dot needs."""
    return max(16, triton.next_power_of_2(n))


@torch.library.custom_op("taylorshift::triton_direct_forward", mutates_args=())
def _forward_op(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    row_factor: Tensor,
    key_mask: Optional[Tensor],  # noqa: UP045
    key_norm_max: Tensor,
    is_causal: bool,
) -> tuple[Tensor, Tensor]:
    """Core forward on q', k' (s = q'·k'): (out (B, H, Nq, dv), 1/Σ_j w (B, H, Nq)).

    row_factor (B, H, Nq) multiplies each output row; key_mask (B, H, Nk) bool or None;
    key_norm_max (B, H) bounds ‖k'_j‖ (any upper bound; it only keeps rounded weights <= 1).
    """
    return _forward(query, key, value, row_factor, key_mask, key_norm_max, is_causal)


@_forward_op.register_fake
def _(query, key, value, row_factor, key_mask, key_norm_max, is_causal):
    b, h, nq, _ = query.shape
    out = query.new_empty((b, h, nq, value.shape[-1]))
    return out, query.new_empty((b, h, nq), dtype=compute_dtype(query.dtype))


@torch.library.custom_op("taylorshift::triton_direct_backward", mutates_args=())
def _backward_op(
    grad_out: Tensor,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    row_factor: Tensor,
    key_mask: Optional[Tensor],  # noqa: UP045
    out: Tensor,
    rinv: Tensor,
    is_causal: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """Core backward: (dq', dk', dv), recomputing the weights tile by tile."""
    return _backward(grad_out, query, key, value, row_factor, key_mask, out, rinv, is_causal)


@_backward_op.register_fake
def _(grad_out, query, key, value, row_factor, key_mask, out, rinv, is_causal):
    # Contiguous, as the real kernels allocate them.
    return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape)


def _setup_context(ctx, inputs, output):
    query, key, value, row_factor, key_mask, _, is_causal = inputs
    out, rinv = output
    # Inputs, output and one statistic per query row: nothing of size Nq × Nk.
    ctx.save_for_backward(query, key, value, row_factor, key_mask, out, rinv)
    ctx.is_causal = is_causal


def _backward_autograd(ctx, grad_out, grad_rinv):
    # rinv is an internal statistic (never returned to users): its gradient is ignored.
    query, key, value, row_factor, key_mask, out, rinv = ctx.saved_tensors
    if wants_graph():  # create_graph=True: the core's sums in plain ops, differentiable again

        def core(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            sums = taylor_sums(q, k, values_with_ones(v.float(), key_mask), ctx.is_causal)
            # the denominator as the count: > 0 exactly where a key is attended (w >= 1/2);
            # row_factor holds the output factor
            y, _ = finish_outputs(sums, sums[..., -1], False, q.shape[-1])
            return (y * row_factor.unsqueeze(-1)).to(q.dtype)

        grads = graph_grads(core, grad_out, (query, key, value), ctx.needs_input_grad[:3])
        return (*grads, None, None, None, None)
    dq, dk, dv = _backward_op(
        grad_out, query, key, value, row_factor, key_mask, out, rinv, ctx.is_causal
    )
    return dq, dk, dv, None, None, None, None


_forward_op.register_autograd(_backward_autograd, setup_context=_setup_context)


def _row_factor(
    key_mask: Tensor | None,
    is_causal: bool,
    normalize: bool,
    b: int,
    h: int,
    nq: int,
    nk: int,
    d: int,
    dtype: torch.dtype,
    device: torch.device,
) -> Tensor:
    """sqrt(n_i/d) per query (ones without normalize): (B, H, Nq), contiguous.

    n_i, the attended-key count, comes from the key mask (B, H, Nk) and the causal rule
    j <= i without any (Nq, Nk) tensor: a cumulative count of attended keys read at i.
    """
    if not normalize:
        return torch.ones((b, h, nq), dtype=dtype, device=device)
    i = torch.arange(nq, device=device)
    if key_mask is None:
        count = (i + 1).clamp(max=nk) if is_causal else torch.full_like(i, nk)
        count = count.expand(b, h, nq)
    elif nk == 0:
        count = torch.zeros((b, h, nq), dtype=torch.long, device=device)
    elif is_causal:
        count = key_mask.cumsum(-1)[..., i.clamp(max=nk - 1)]  # keys j <= min(i, Nk - 1)
    else:
        count = key_mask.sum(-1, keepdim=True).expand(b, h, nq)
    return torch.sqrt(count.to(dtype) / d).contiguous()


def triton_direct_taylor_shift(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None,
    is_causal: bool,
    temperature,
    scale: float | None,
    normalize: bool,
    order: int = 2,
) -> Tensor:
    r"""Direct TaylorShift of order 2 in fused Triton kernels; (B, H, Nq, dv).

    The semantics and the signature of
    ``taylorshift.ops.taylor_shift.direct.direct_taylor_shift`` (SPEC §2) with the mask
    restricted to key padding and the order to 2::

        q, k = query / max(‖query‖, eps), key / max(‖key‖, eps)   # normalize=True
        s    = temperature * q @ k.mT                             # else scale * query @ key.mT
        w    = (1 + s + s²/2) * allowed      # allowed_ij = key_mask[j] and (j <= i if causal)
        n    = allowed.sum(-1, keepdim=True)
        out  = (w @ value) / w.sum(-1, keepdim=True) * sqrt(n / d)  # no sqrt(n/d) unless normalize

    without ever forming the (Nq, Nk) matrices; a query that attends no key gives zeros and
    finite gradients. Inputs are assumed validated (``checks.check_inputs``).

    Args:
        query: (B, H, Nq, d), float16, bfloat16, float32 or float64, on a CUDA device (or
            on the CPU under ``TRITON_INTERPRET=1``).
        key: (B, H, Nk, d), dtype and device of query.
        value: (B, H, Nk, dv), dtype and device of query.
        mask: bool key padding, broadcastable to (B, H, 1, Nk) (broadcast views are fine),
            True = attend; or None. Masks that vary over queries are refused.
        is_causal: query i attends key j only if j <= i (upper-left aligned).
        temperature: τ, a float or a tensor broadcastable to (B, H, 1, 1), may require grad.
        scale: score scale for normalize=False (default 1/sqrt(d)).
        normalize: the paper's normalisation of q, k and output factor sqrt(n_i/d).
        order: the Taylor order; 2 only.

    Returns:
        (B, H, Nq, dv) in query's dtype; sums accumulate in float32 (float64 for float64).
    """
    if order != 2:
        raise ValueError(f"the Triton direct form computes order 2 only; got order={order}")
    if mask is not None:
        mask = as_4d(mask)
        if mask.shape[2] != 1:
            raise ValueError(
                "mask must be key padding, broadcastable to (B, H, 1, Nk), for the Triton "
                "direct form (masks that vary over queries: the torch direct form); got "
                f"shape {tuple(mask.shape)}"
            )
    if query.dtype not in _DTYPES:
        raise TypeError(
            f"query must be float16, bfloat16, float32 or float64 for the Triton kernels; "
            f"got {query.dtype}"
        )
    if not interpreting() and query.device.type != "cuda":
        raise ValueError(
            f"query must be on a CUDA device for the Triton kernels (or set TRITON_INTERPRET=1 "
            f"before importing triton to run them on the CPU); got {query.device}"
        )
    b, h, nq, d = query.shape
    nk = key.shape[-2]
    cd = compute_dtype(query.dtype)
    factor = score_factor(temperature, scale, normalize, d)
    if isinstance(factor, Tensor):
        factor = factor.to(cd)
    # q' and k' in the input dtype: the kernels' matmuls take them as they would take q, k.
    qp = scaled_query(query.to(cd), factor, normalize).to(query.dtype)
    kp = scaled_key(key.to(cd), normalize).to(query.dtype)
    key_mask = None if mask is None else mask.expand(b, h, 1, nk)[:, :, 0]  # (B, H, Nk)
    with torch.no_grad():
        if nk > 0:
            kmax = torch.linalg.vector_norm(kp, dim=-1, dtype=cd).amax(-1).contiguous()
        else:
            kmax = torch.zeros((b, h), dtype=cd, device=query.device)
        f = _row_factor(key_mask, is_causal, normalize, b, h, nq, nk, d, cd, query.device)
    out, _ = _forward_op(qp, kp, value, f, key_mask, kmax, is_causal)
    return out
