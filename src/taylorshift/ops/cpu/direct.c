/* The direct form on the CPU, O(N^2 d), forward and backward, for the short sequences where
   it beats the efficient form (docs/cpu-kernel.md, "The direct form").

   Built with efficient.c by taylorshift/ops/cpu/build.py and called through ctypes by
   taylorshift/ops/cpu/wrapper.py, which holds the autograd wiring. Per head and tile of up
   to TILE query rows, the scores, weights and their gradients live in two (TILE, keys)
   scratch blocks of the thread (the (Nq, Nk) matrix never exists); every product is one
   register-tiled loop (mm below) over zero-padded operands, so no edge case reaches it.

   The attention of the scaled rows q' = f_h q / max(|q|, eps) and k' = k / max(|k|, eps)
   (normalize; else q' = f_h q, k' = k), formed inside from the raw rows (rows.h), with
   f_h = factor[h] the temperature (or the scale) per head:
       s_ij = q'_i . k'_j,  w_ij = 1 + s + s^2/2 on the attended pairs (key j real and, causal,
       j <= i), 0 elsewhere;  den_i = sum_j w_ij,  n_i = #attended,
       y_i = sum_j w_ij v_j * (normalize ? sqrt(n_i / d) : 1) / den_i   (0 when n_i = 0).
   Backward, with g_i = dL/dy_i: gn_i = g_i f_i / den_i, gd_i = -(g_i . y_i) / den_i,
       gs_ij = (gn_i . v_j + gd_i)(1 + s_ij) on attended pairs,
       dq'_i = sum_j gs_ij k'_j,  dk'_j = sum_i gs_ij q'_i,  dv_j = sum_i w_ij gn_i,
   then dq, dk and df_h through the scaling (rows.h).

   float32, contiguous, heads flattened: q (BH, Nq, d), k (BH, Nk, d), v (BH, Nk, V);
   mask (BH, Nk) uint8 or NULL (a key-padding mask).

   raw != 0: the block of the causal efficient form's chunks (efficient_causal.py): q and k
   are q', k' already (factor NULL, normalize 0), v is [v m, m] with the ones column, and
   the forward returns y = sum_j w_ij v_j unfinished (den and count not written); the
   backward takes gn = g itself (gd = 0; y, den and count not read) and returns the
   gradients w.r.t. q', k' and v. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "rows.h"
#include "vectors.h"

enum {
    WIDE = 16,  /* columns per register tile: two vectors; every padded width is a multiple */
    ROWS = 6,   /* rows per register tile: 12 accumulators, 2 loads and a broadcast in 16 registers */
    TILE = 64   /* query rows per block of scores */
};

static inline int pad(int n) { return (n + WIDE - 1) / WIDE * WIDE; }
/* The row stride of a block n columns wide: padded, and off multiples of 64 floats, so that
   a walk down a column (a k loop of mm) does not map every row to the same cache sets. */
static inline int ldim(int n) { return pad(n) % 64 ? pad(n) : pad(n) + WIDE; }

/* C[r][0..16) (+)= sum_k A[r * ars + k * acs] B[k * ldb + 0..16) for r < rows (a constant at
   each call site): 2 x rows accumulators of 8 floats. */
static inline __attribute__((always_inline)) void mm_tile(
    const int rows, int kk, const float *a, long ars, long acs, const float *b, long ldb,
    float *c, long ldc, int add) {
    vec c0[ROWS], c1[ROWS];
    for (int r = 0; r < ROWS; r++) c0[r] = c1[r] = splat(0.0f);
    for (int k = 0; k < kk; k++) {
        const vec b0 = load(b + (size_t)k * ldb), b1 = load(b + (size_t)k * ldb + LANES);
        const float *ak = a + (size_t)k * acs;
#pragma GCC unroll 6
        for (int r = 0; r < rows; r++) {
            const vec ar = splat(ak[(size_t)r * ars]);
            c0[r] += ar * b0;
            c1[r] += ar * b1;
        }
    }
    for (int r = 0; r < rows; r++) {
        float *cr = c + (size_t)r * ldc;
        store(cr, add ? load(cr) + c0[r] : c0[r]);
        store(cr + LANES, add ? load(cr + LANES) + c1[r] : c1[r]);
    }
}

/* C (m, n) (+)= A (m, kk) B (kk, n): A read through strides (ars between rows, acs between
   columns: a transposed A is just other strides), B and C row-major, n a multiple of 16. */
static void mm(int m, int n, int kk, const float *a, long ars, long acs, const float *b,
               long ldb, float *c, long ldc, int add) {
    for (int i = 0; i < m; i += ROWS) {
        const float *ai = a + (size_t)i * ars;
        float *ci = c + (size_t)i * ldc;
        for (int j = 0; j < n; j += WIDE) {
            switch (m - i < ROWS ? m - i : ROWS) {
            case 6: mm_tile(6, kk, ai, ars, acs, b + j, ldb, ci + j, ldc, add); break;
            case 5: mm_tile(5, kk, ai, ars, acs, b + j, ldb, ci + j, ldc, add); break;
            case 4: mm_tile(4, kk, ai, ars, acs, b + j, ldb, ci + j, ldc, add); break;
            case 3: mm_tile(3, kk, ai, ars, acs, b + j, ldb, ci + j, ldc, add); break;
            case 2: mm_tile(2, kk, ai, ars, acs, b + j, ldb, ci + j, ldc, add); break;
            default: mm_tile(1, kk, ai, ars, acs, b + j, ldb, ci + j, ldc, add); break;
            }
        }
    }
}

/* rows x cols of src (row stride ls) into dst (row stride ldd), all of dst's prows rows
   zeroed first; with transpose, dst[c][r] = src[r][c] (then prows counts dst's rows, the
   source's columns). */
static void copy_in(const float *src, int rows, int cols, long ls, float *dst, int prows,
                    long ldd, int transpose) {
    memset(dst, 0, sizeof(float) * (size_t)prows * ldd);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            const float x = src[(size_t)r * ls + c];
            if (transpose) dst[(size_t)c * ldd + r] = x;
            else dst[(size_t)r * ldd + c] = x;
        }
}

/* The keys row i of a causal call attends (j <= i): a block of rows i0 .. i1 - 1 needs the
   first min(nk, i1) keys. */
static inline int keys_of(int nk, int causal, int i1) { return causal && i1 < nk ? i1 : nk; }

/* km[j] = 1 for the real keys j < nk, 0 for padded and masked ones, up to the padded nkp. */
static void key_flags(const uint8_t *m, int nk, int nkp, float *km) {
    for (int j = 0; j < nkp; j++) km[j] = j < nk && (!m || m[j]) ? 1.0f : 0.0f;
}

/* Forward: y (BH, Nq, V), den (BH, Nq), count (BH, Nq) (raw: y unfinished, den and count
   may be NULL); f_h = factor[h], or the float scalar where factor is NULL. Work items:
   (head, tile of query rows). Returns 0, or 1 when a scratch block could not be
   allocated. */
int direct_forward(int bh, int nq, int nk, int d, int nv, const float *q, const float *k,
                   const float *v, const uint8_t *mask, const float *factor, float scalar,
                   int causal, int normalize, float eps, int raw, float *y, float *den,
                   float *count, int threads) {
    const int vp = pad(nv);
    const int tiles = (nq + TILE - 1) / TILE;
    const long items = (long)bh * tiles;
    int failed = 0;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long item = 0; item < items; item++) {
        const int h = (int)(item / tiles), i0 = (int)(item % tiles) * TILE;
        const int nr = nq - i0 < TILE ? nq - i0 : TILE, i1 = i0 + nr;
        const int kn = keys_of(nk, causal, i1), knp = pad(kn), ldk = ldim(kn);
        const float *qh = q + ((size_t)h * nq + i0) * d, *kh = k + (size_t)h * nk * d;
        const float *vh = v + (size_t)h * nk * nv;
        const uint8_t *mh = mask ? mask + (size_t)h * nk : NULL;
        const size_t kt_n = (size_t)d * ldk, vv_n = (size_t)knp * vp, s_n = (size_t)TILE * ldk;
        const size_t yt_n = (size_t)TILE * vp, kp_n = (size_t)(kn > TILE ? kn : TILE) * d;
        float *kt = malloc(sizeof(float) * (kt_n + vv_n + s_n + yt_n + knp + kp_n));
        if (!kt) {
#pragma omp atomic write
            failed = 1;
            continue;
        }
        float *vv = kt + kt_n, *s = vv + vv_n, *yt = s + s_n, *km = yt + yt_n, *xp = km + knp;
        for (int j = 0; j < kn; j++)
            scale_row(d, kh + (size_t)j * d, 1.0f, normalize, eps, xp + (size_t)j * d);
        copy_in(xp, kn, d, d, kt, d, ldk, 1);     /* k'^T (d, knp) */
        copy_in(vh, kn, nv, nv, vv, knp, vp, 0);  /* v (knp, vp) */
        const float f = factor ? factor[h] : scalar;
        for (int r = 0; r < nr; r++) /* q' of the tile, over k' (no longer needed) */
            scale_row(d, qh + (size_t)r * d, f, normalize, eps, xp + (size_t)r * d);
        mm(nr, knp, d, xp, d, 1, kt, ldk, s, ldk, 0);
        key_flags(mh, kn, knp, km);
        for (int r = 0; r < nr; r++) {
            float *sr = s + (size_t)r * ldk, total = 0.0f, n = 0.0f;
            const int lim = causal && i0 + r + 1 < kn ? i0 + r + 1 : kn;
            for (int j = 0; j < knp; j++) {
                const float on = j < lim ? km[j] : 0.0f, sv = sr[j];
                const float w = on != 0.0f ? 1.0f + sv + 0.5f * sv * sv : 0.0f;
                sr[j] = w;
                total += w;
                n += on;
            }
            if (!raw) {
                den[(size_t)h * nq + i0 + r] = total;
                count[(size_t)h * nq + i0 + r] = n;
            }
        }
        mm(nr, vp, kn, s, ldk, 1, vv, vp, yt, vp, 0);
        for (int r = 0; r < nr; r++) {
            const size_t row = (size_t)h * nq + i0 + r;
            float g = 1.0f;
            if (!raw) {
                const float n = count[row];
                g = n > 0.0f ? (normalize ? sqrtf(n / (float)d) : 1.0f) / den[row] : 0.0f;
            }
            for (int c = 0; c < nv; c++) y[row * nv + c] = yt[(size_t)r * vp + c] * g;
        }
        free(kt);
    }
    return failed;
}

/* Backward: gq (BH, Nq, d), gk (BH, Nk, d), gv (BH, Nk, V) and gfactor (BH) (may be NULL),
   the gradients w.r.t. q, k, v and f_h (factor[h] or scalar), from g = dL/dy and the
   forward's y, den, count. Work items: heads (the key-side gradients sum over every query
   tile of the head, in a fixed order). Returns 0, or 1 when a scratch block could not be
   allocated. */
int direct_backward(int bh, int nq, int nk, int d, int nv, const float *q, const float *k,
                    const float *v, const uint8_t *mask, const float *factor, float scalar,
                    int causal, int normalize, float eps, int raw, const float *g,
                    const float *y, const float *den, const float *count, float *gq, float *gk,
                    float *gv, float *gfactor, int threads) {
    const int nkp = pad(nk), ldn = ldim(nk), dp = pad(d), vp = pad(nv);
    int failed = 0;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (int h = 0; h < bh; h++) {
        const float *kh = k + (size_t)h * nk * d, *vh = v + (size_t)h * nk * nv;
        const uint8_t *mh = mask ? mask + (size_t)h * nk : NULL;
        const size_t kt_n = (size_t)d * ldn, kk_n = (size_t)nkp * dp, vt_n = (size_t)nv * ldn;
        const size_t blk = (size_t)TILE * ldn, qt_n = (size_t)TILE * dp, gn_n = (size_t)TILE * vp;
        const size_t gk_n = (size_t)nkp * dp, gv_n = (size_t)nkp * vp;
        float *kt = calloc(kt_n + kk_n + vt_n + 2 * blk + 2 * qt_n + gn_n + gk_n + gv_n + nkp,
                           sizeof(float));
        if (!kt) {
#pragma omp atomic write
            failed = 1;
            continue;
        }
        float *kk = kt + kt_n, *vt = kk + kk_n, *w = vt + vt_n, *gs = w + blk;
        float *qt = gs + blk, *gqt = qt + qt_n, *gn = gqt + qt_n, *gkh = gn + gn_n;
        float *gvh = gkh + gk_n, *km = gvh + gv_n;
        float gd[TILE];
        const float f = factor ? factor[h] : scalar;
        double gf = 0.0;
        key_flags(mh, nk, nkp, km);
        for (int j = 0; j < nk; j++) /* k' (nkp, dp) */
            scale_row(d, kh + (size_t)j * d, 1.0f, normalize, eps, kk + (size_t)j * dp);
        copy_in(kk, nk, d, dp, kt, d, ldn, 1);   /* k'^T (d, nkp) */
        copy_in(vh, nk, nv, nv, vt, nv, ldn, 1); /* v^T (nv, nkp) */
        for (int i0 = 0; i0 < nq; i0 += TILE) {
            const int nr = nq - i0 < TILE ? nq - i0 : TILE, i1 = i0 + nr;
            const int kn = keys_of(nk, causal, i1), knp = pad(kn);
            const size_t row0 = (size_t)h * nq + i0;
            for (int r = 0; r < nr; r++) /* q' (nr, dp) */
                scale_row(d, q + (row0 + r) * d, f, normalize, eps, qt + (size_t)r * dp);
            memset(gn, 0, sizeof(float) * gn_n);
            for (int r = 0; r < nr && raw; r++) {
                memcpy(gn + (size_t)r * vp, g + (row0 + r) * nv, sizeof(float) * nv);
                gd[r] = 0.0f;
            }
            for (int r = 0; r < nr && !raw; r++) {
                const size_t row = row0 + r;
                const float n = count[row], inv = n > 0.0f ? 1.0f / den[row] : 0.0f;
                const float fo = normalize ? inv * sqrtf(n / (float)d) : inv;
                float dot = 0.0f;
                for (int c = 0; c < nv; c++) {
                    gn[(size_t)r * vp + c] = g[row * nv + c] * fo;
                    dot += g[row * nv + c] * y[row * nv + c];
                }
                gd[r] = -dot * inv;
            }
            mm(nr, knp, d, qt, dp, 1, kt, ldn, w, ldn, 0);   /* s */
            mm(nr, knp, nv, gn, vp, 1, vt, ldn, gs, ldn, 0); /* gn . v_j */
            for (int r = 0; r < nr; r++) {
                float *wr = w + (size_t)r * ldn, *gr = gs + (size_t)r * ldn;
                const int lim = causal && i0 + r + 1 < kn ? i0 + r + 1 : kn;
                const float gdr = gd[r];
                for (int j = 0; j < knp; j++) {
                    const float on = j < lim ? km[j] : 0.0f, sv = wr[j];
                    wr[j] = on != 0.0f ? 1.0f + sv + 0.5f * sv * sv : 0.0f;
                    gr[j] = on != 0.0f ? (gr[j] + gdr) * (1.0f + sv) : 0.0f;
                }
            }
            mm(nr, dp, kn, gs, ldn, 1, kk, dp, gqt, dp, 0);     /* dq' = gs k' */
            mm(kn, dp, nr, gs, 1, ldn, qt, dp, gkh, dp, 1);     /* dk' += gs^T q' */
            mm(kn, vp, nr, w, 1, ldn, gn, vp, gvh, vp, 1);      /* dv += w^T gn */
            for (int r = 0; r < nr; r++) /* dq through the scaling */
                gf += scale_row_grad(d, q + (row0 + r) * d, gqt + (size_t)r * dp, f, normalize,
                                     eps, gq + (row0 + r) * d);
        }
        for (int j = 0; j < nk; j++) {
            const size_t row = (size_t)h * nk + j;
            scale_row_grad(d, kh + (size_t)j * d, gkh + (size_t)j * dp, 1.0f, normalize, eps,
                           gk + row * d);
            memcpy(gv + row * nv, gvh + (size_t)j * vp, sizeof(float) * nv);
        }
        if (gfactor) gfactor[h] = (float)gf;
        free(kt);
    }
    return failed;
}

/* The passes in the signature of kernels.h: option is causal (0 or 1); state is not read. */
int ts_direct_forward(int bh, int nq, int nk, int d, int nv, const float *q, const float *k,
                      const float *v, const uint8_t *mask, const float *factor, float scalar,
                      int normalize, float eps, int option, int group, float *y, float *den,
                      float *count, float *state, int threads) {
    (void)group; /* always 1 here: grouped calls reach this form with key and value repeated */
    (void)state;
    return direct_forward(bh, nq, nk, d, nv, q, k, v, mask, factor, scalar, option, normalize,
                          eps, 0, y, den, count, threads);
}

int ts_direct_backward(int bh, int nq, int nk, int d, int nv, const float *q, const float *k,
                       const float *v, const uint8_t *mask, const float *factor, float scalar,
                       int normalize, float eps, int option, int group, const float *g,
                       const float *y, const float *den, const float *count,
                       float *state, float *gq, float *gk, float *gv, float *gfactor,
                       int threads) {
    (void)group; /* always 1 here, as in the forward */
    (void)state;
    return direct_backward(bh, nq, nk, d, nv, q, k, v, mask, factor, scalar, option, normalize,
                           eps, 0, g, y, den, count, gq, gk, gv, gfactor, threads);
}
