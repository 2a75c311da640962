/* The causal efficient form's chunk loop on the CPU, forward and backward, each in one call
   (called through ctypes by taylorshift/ops/cpu/wrapper.py, the autograd wiring of the three
   kernel forms; docs/cpu-kernel.md).

   Chunk by chunk of C tokens (SPEC 2.3), with q', k' the scaled rows and u = [v m, m]:
       Y'  = phi(q') S_<i0                     keys before the chunk: ts_readout
           + w(q' k'^T (.) tril) u             keys inside it: the direct kernel's raw block
       y   = Y'[:V] sqrt(n_i / d) / Y'[V]      n_i = the keys j <= i that are real
       S  += c (.) phi(k'_chunk)^T u_chunk     then the chunk joins the prefix: ts_state
   Backward, from gY' (ts_output_grad with one count per token): a forward sweep rebuilds
   S_<i0 and gives dq' through it (ts_pair_grad) and the blocks' gradients (the direct
   kernel's raw backward); a reverse sweep accumulates G_>c = c (.) sum_{c' > c}
   phi(q'_c')^T gY'_c' (ts_state) and gives du = phi(k') G (ts_readout) and dk' (ts_pair_grad);
   then dq, dk and the factor's gradient through the scaling. No prefix state is kept.

   The kernels read heads at a stride of their own token count, so each chunk's rows are
   copied into chunk-sized scratch (O(C d) a chunk, against O(C D V) of products) and the
   gradients added back. A masked key's row of k' is zeroed with its row of u, so NaN in a
   padded key never reaches a sum. Query i attends key j iff j <= i (and j < Nk).

   float32, contiguous, heads flattened: q (BH, Nq, d), k (BH, Nk, d), v (BH, Nk, V),
   mask (BH, Nk) uint8 or NULL, factor (BH) or NULL for the float scalar. Sums never change
   order with the thread count. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "rows.h"

/* dst (BH, i1 - i0, w) = rows [i0, i1) of every head of x (BH, n, w). */
static void take_rows(int bh, int n, int w, const float *x, int i0, int i1, float *dst) {
    const size_t len = (size_t)(i1 - i0) * w;
    for (int h = 0; h < bh; h++)
        memcpy(dst + h * len, x + ((size_t)h * n + i0) * w, len * sizeof(float));
}

/* The first ws columns of rows [i0, i1) of every head of x (BH, n, wx) += src
   (BH, i1 - i0, ws). */
static void add_rows(int bh, int n, int wx, float *x, int i0, int i1, int ws,
                     const float *src, int threads) {
    const int m = i1 - i0;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int h = 0; h < bh; h++)
        for (int t = 0; t < m; t++) {
            float *row = x + ((size_t)h * n + i0 + t) * wx;
            const float *part = src + ((size_t)h * m + t) * ws;
            for (int c = 0; c < ws; c++) row[c] += part[c];
        }
}

/* n_i (BH, Nq): the real keys j <= i. */
static void causal_counts(int bh, int nq, int nk, const uint8_t *mask, float *count) {
    for (int h = 0; h < bh; h++) {
        long seen = 0;
        for (int i = 0, j = 0; i < nq; i++) {
            for (; j <= i && j < nk; j++) seen += !mask || mask[(size_t)h * nk + j];
            count[(size_t)h * nq + i] = (float)seen;
        }
    }
}

/* q' (BH, Nq, d), k' (BH, Nk, d) with masked keys' rows zero, u = [v m, m] (BH, Nk, V + 1). */
static void operands(int bh, int nq, int nk, int d, int nv, const float *q, const float *k,
                     const float *v, const uint8_t *mask, const float *factor, int normalize,
                     float eps, float *qp, float *kp, float *u, int threads) {
    ts_scale_rows(bh, nq, d, q, factor, normalize, eps, qp, threads);
    ts_scale_rows(bh, nk, d, k, NULL, normalize, eps, kp, threads);
    const long rows = (long)bh * nk;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long r = 0; r < rows; r++) {
        const int keep = !mask || mask[r];
        float *ur = u + (size_t)r * (nv + 1);
        for (int c = 0; c < nv; c++) ur[c] = keep ? v[(size_t)r * nv + c] : 0.0f;
        ur[nv] = keep ? 1.0f : 0.0f;
        if (!keep) memset(kp + (size_t)r * d, 0, (size_t)d * sizeof(float));
    }
}

/* Forward, in the signature of kernels.h (option: tokens per chunk; state not read: the
   prefix state lives in scratch memory): y (BH, Nq, V), den (BH, Nq) = Y'[V], count
   (BH, Nq) = n_i. Returns 0, or 1 when scratch memory could not be allocated. */
int ts_causal_forward(int bh, int nq, int nk, int d, int nv, const float *q, const float *k,
                      const float *v, const uint8_t *mask, const float *factor, float scalar,
                      int normalize, float eps, int chunk, float *y, float *den, float *count,
                      float *state_out, int threads) {
    (void)state_out;
    const int nu = nv + 1, rows = ts_state_rows(d), cols = ts_state_cols(nu);
    const int span = nq > nk ? nq : nk, c = chunk < span ? chunk : (span > 0 ? span : 1);
    const size_t nqd = (size_t)bh * nq * d, nkd = (size_t)bh * nk * d;
    const size_t nku = (size_t)bh * nk * nu, ns = (size_t)bh * rows * cols;
    const size_t cd = (size_t)bh * c * d, cu = (size_t)bh * c * nu;
    float *qp = malloc(sizeof(float) * (nqd + nkd + nku + ns + 2 * cd + 3 * cu + bh + 1));
    if (!qp) return 1;
    float *kp = qp + nqd, *u = kp + nkd, *state = u + nku, *qc = state + ns, *kc = qc + cd;
    float *uc = kc + cd, *yc = uc + cu, *block = yc + cu, *heads = block + cu;
    const float *f = head_factors(bh, factor, scalar, heads);
    operands(bh, nq, nk, d, nv, q, k, v, mask, f, normalize, eps, qp, kp, u, threads);
    causal_counts(bh, nq, nk, mask, count);
    int failed = 0, have_state = 0;
    for (int i0 = 0; i0 < span && !failed; i0 += c) {
        const int i1 = i0 + c < span ? i0 + c : span;
        if (i0 < nq) {
            const int q1 = i1 < nq ? i1 : nq, m = q1 - i0;
            take_rows(bh, nq, d, qp, i0, q1, qc);
            memset(yc, 0, sizeof(float) * bh * m * nu);
            if (have_state)
                ts_readout(bh, m, d, qc, state, cols, yc, nu, NULL, NULL, 0, NULL, threads);
            if (i0 < nk) { /* the chunk's own keys, up to its last query */
                const int ck = (q1 < nk ? q1 : nk) - i0;
                take_rows(bh, nk, d, kp, i0, i0 + ck, kc);
                take_rows(bh, nk, nu, u, i0, i0 + ck, uc);
                failed |= direct_forward(bh, m, ck, d, nu, qc, kc, uc, NULL, NULL, 1.0f, 1, 0,
                                         eps, 1, block, NULL, NULL, threads);
                for (size_t e = 0; e < (size_t)bh * m * nu; e++) yc[e] += block[e];
            }
            for (int h = 0; h < bh; h++)
                for (int r = 0; r < m; r++) {
                    const size_t row = (size_t)h * nq + i0 + r;
                    const float *yr = yc + ((size_t)h * m + r) * nu, n = count[row];
                    const float f = n > 0.0f
                        ? (normalize ? sqrtf(n / (float)d) : 1.0f) / yr[nv] : 0.0f;
                    den[row] = yr[nv];
                    for (int cc = 0; cc < nv; cc++) y[row * nv + cc] = yr[cc] * f;
                }
        }
        if (i0 < nk && i1 < nq) { /* later queries attend this chunk through the state */
            /* kc, uc hold keys [i0, min(i1, nk)) already: the chunk's block read them */
            const int j1 = i1 < nk ? i1 : nk;
            failed |= ts_state(bh, j1 - i0, d, kc, uc, nu, 0, NULL, state, have_state, threads);
            have_state = 1;
        }
    }
    free(qp);
    return failed;
}

/* Backward, in the signature of kernels.h (option: tokens per chunk; state not read):
   gq (BH, Nq, d), gk (BH, Nk, d), gv (BH, Nk, V) and, where gfactor is not NULL, gfactor
   (BH), from g = dL/dy and the forward's y, den, count. Returns 0, or 1 when scratch memory
   could not be allocated. */
int ts_causal_backward(int bh, int nq, int nk, int d, int nv, const float *q, const float *k,
                       const float *v, const uint8_t *mask, const float *factor, float scalar,
                       int normalize, float eps, int chunk, const float *g, const float *y,
                       const float *den, const float *count, const float *state_in, float *gq,
                       float *gk, float *gv, float *gfactor, int threads) {
    (void)state_in;
    const int nu = nv + 1, rows = ts_state_rows(d), cols = ts_state_cols(nu);
    const int span = nq > nk ? nq : nk, c = chunk < span ? chunk : (span > 0 ? span : 1);
    const size_t nqd = (size_t)bh * nq * d, nkd = (size_t)bh * nk * d;
    const size_t nqu = (size_t)bh * nq * nu, nku = (size_t)bh * nk * nu;
    const size_t ns = (size_t)bh * rows * cols;
    const size_t cd = (size_t)bh * c * d, cu = (size_t)bh * c * nu;
    float *qp = malloc(sizeof(float) *
                       (2 * nqd + 2 * nkd + 2 * nku + nqu + 2 * ns + 4 * cd + 3 * cu + bh + 1));
    if (!qp) return 1;
    float *kp = qp + nqd, *u = kp + nkd, *gy = u + nku, *g_qp = gy + nqu, *g_kp = g_qp + nqd;
    float *g_u = g_kp + nkd, *state = g_u + nku, *grad_state = state + ns;
    float *qc = grad_state + ns, *kc = qc + cd, *part_q = kc + cd, *part_k = part_q + cd;
    float *gc = part_k + cd, *uc = gc + cu, *part_u = uc + cu, *heads = part_u + cu;
    const float *f = head_factors(bh, factor, scalar, heads);
    operands(bh, nq, nk, d, nv, q, k, v, mask, f, normalize, eps, qp, kp, u, threads);
    ts_output_grad(bh, nq, nv, d, g, y, den, count, 1, normalize, gy, threads);
    memset(g_qp, 0, sizeof(float) * (nqd + nkd + nku)); /* g_qp, g_kp, g_u */
    int failed = 0;

    /* forward sweep: S_<i0 again; dq' through it and the blocks' gradients */
    int have_state = 0;
    for (int i0 = 0; i0 < span && !failed; i0 += c) {
        const int i1 = i0 + c < span ? i0 + c : span;
        if (i0 < nq) {
            const int q1 = i1 < nq ? i1 : nq, m = q1 - i0;
            take_rows(bh, nq, d, qp, i0, q1, qc);
            take_rows(bh, nq, nu, gy, i0, q1, gc);
            if (have_state) {
                failed |= ts_pair_grad(bh, m, d, qc, gc, nu, 0, NULL, state, cols, part_q,
                                       threads);
                add_rows(bh, nq, d, g_qp, i0, q1, d, part_q, threads);
            }
            if (i0 < nk) {
                const int ck = (q1 < nk ? q1 : nk) - i0;
                take_rows(bh, nk, d, kp, i0, i0 + ck, kc);
                take_rows(bh, nk, nu, u, i0, i0 + ck, uc);
                failed |= direct_backward(bh, m, ck, d, nu, qc, kc, uc, NULL, NULL, 1.0f, 1, 0,
                                          eps, 1, gc, NULL, NULL, NULL, part_q, part_k,
                                          part_u, NULL, threads);
                add_rows(bh, nq, d, g_qp, i0, q1, d, part_q, threads);
                add_rows(bh, nk, d, g_kp, i0, i0 + ck, d, part_k, threads);
                add_rows(bh, nk, nu, g_u, i0, i0 + ck, nu, part_u, threads);
            }
        }
        if (i0 < nk && i1 < nq) { /* kc, uc hold keys [i0, min(i1, nk)) from the block */
            const int j1 = i1 < nk ? i1 : nk;
            failed |= ts_state(bh, j1 - i0, d, kc, uc, nu, 0, NULL, state, have_state, threads);
            have_state = 1;
        }
    }

    /* reverse sweep: G_>c, the gradient of the state chunk c feeds, gives the key side */
    int have_grad = 0;
    for (int i0 = (span - 1) / c * c; i0 >= 0 && span > 0 && !failed; i0 -= c) {
        const int i1 = i0 + c < span ? i0 + c : span;
        if (i0 < nk && have_grad) {
            const int j1 = i1 < nk ? i1 : nk, len = j1 - i0;
            take_rows(bh, nk, d, kp, i0, j1, kc);
            take_rows(bh, nk, nu, u, i0, j1, uc);
            ts_readout(bh, len, d, kc, grad_state, cols, part_u, nv, NULL, NULL, 0, NULL,
                       threads);
            add_rows(bh, nk, nu, g_u, i0, j1, nv, part_u, threads);
            failed |= ts_pair_grad(bh, len, d, kc, uc, nu, 0, NULL, grad_state, cols, part_k,
                                   threads);
            add_rows(bh, nk, d, g_kp, i0, j1, d, part_k, threads);
        }
        if (i0 < nq && i0 > 0) { /* (chunk 0's queries feed no earlier keys) */
            const int q1 = i1 < nq ? i1 : nq;
            take_rows(bh, nq, d, qp, i0, q1, qc);
            take_rows(bh, nq, nu, gy, i0, q1, gc);
            failed |= ts_state(bh, q1 - i0, d, qc, gc, nu, 0, NULL, grad_state, have_grad,
                               threads);
            have_grad = 1;
        }
    }

    if (!failed) {
        const long keys = (long)bh * nk;
        for (long r = 0; r < keys; r++) { /* dv: the first V columns of du, masked keys zero */
            const int keep = !mask || mask[r];
            for (int cc = 0; cc < nv; cc++)
                gv[(size_t)r * nv + cc] = keep ? g_u[(size_t)r * nu + cc] : 0.0f;
        }
        failed |= ts_scale_rows_grad(bh, nq, d, q, g_qp, f, normalize, eps, gq, gfactor,
                                     threads);
        failed |= ts_scale_rows_grad(bh, nk, d, k, g_kp, NULL, normalize, eps, gk, NULL,
                                     threads);
    }
    free(qp);
    return failed;
}
