/* The decoding step of causal TaylorShift on the CPU (ops/cpu/decode.py): one new token per
   head, the state updated and read in one pass. Built with the other kernels
   (ops/cpu/build.py). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "rows.h"

/* The decoding step (ops/cpu/decode.py): one new token per head on the state of
   ops/taylor_shift/decode.py, S (BH, D, V + 1), unweighted, rows x_a x_b (a <= b < d, row by
   row), then x_a, then 1; count (BH). With q' = f_h q / max(|q|, eps), k' = k / max(|k|, eps)
   (normalize; else q' = f_h q, k' = k), f_h = factor[h] (factor NULL: the float scalar):
   where real is NULL or real[h] != 0, S += phi(k')^T [v, 1] and count[h] += 1; then
   Y = sum_p w_p phi_p(q') S_p over the updated state (the token attends itself) and
   out (BH, V) = Y[:V] * (normalize ? sqrt(count[h] / d) : 1) / Y[V], zero where
   count[h] == 0. One pass over S: each row is updated and read while in registers, where
   the PyTorch step reads the state twice and writes it once. Work items: heads.
   Grouped queries (groups > 1): bh counts the states (key/value heads); q, factor and out
   hold groups rows per state (query head h * groups + g reads state h), k, v, real and
   count one. Each state row is then updated once and read by the group's queries while
   it is in L1. */
static inline void decode_row(int width, float fk, float fq, const float *restrict u,
                              float *restrict s, float *restrict y) {
#pragma omp simd
    for (int c = 0; c < width; c++) {
        const float sc = s[c] + fk * u[c];
        s[c] = sc;
        y[c] += fq * sc;
    }
}

/* One state row for the queries of a group: updated once, then read by query g into
   y + g * width (fq[g] its feature), the row still in L1. */
static inline void group_row(int width, int groups, float fk, const float *fq,
                             const float *restrict u, float *restrict s, float *restrict y) {
#pragma omp simd
    for (int c = 0; c < width; c++) s[c] += fk * u[c];
    for (int g = 0; g < groups; g++) {
        float *restrict yg = y + (size_t)g * width;
        const float f = fq[g];
#pragma omp simd
        for (int c = 0; c < width; c++) yg[c] += f * s[c];
    }
}

/* The pass over one state for a group of queries qx (groups x d), in the rows' order. */
static void decode_group(int d, int width, int groups, const float *qx, const float *kx,
                         const float *u, float *s, float *y) {
    float fq[groups];
    for (int a = 0; a < d; a++) {
        for (int g = 0; g < groups; g++) fq[g] = 0.5f * qx[g * d + a] * qx[g * d + a];
        group_row(width, groups, kx[a] * kx[a], fq, u, s, y);
        s += width;
        for (int b = a + 1; b < d; b++, s += width) {
            for (int g = 0; g < groups; g++) fq[g] = qx[g * d + a] * qx[g * d + b];
            group_row(width, groups, kx[a] * kx[b], fq, u, s, y);
        }
    }
    for (int a = 0; a < d; a++, s += width) {
        for (int g = 0; g < groups; g++) fq[g] = qx[g * d + a];
        group_row(width, groups, kx[a], fq, u, s, y);
    }
    for (int g = 0; g < groups; g++) fq[g] = 1.0f;
    group_row(width, groups, 1.0f, fq, u, s, y);
}

/* The new token of state h: kx = k' and u = [v, 1], both zero for a padded token (its key,
   NaN say, never reaches S), and the state's count one more for a real one. */
static inline void new_token(int d, int nv, const float *kh, const float *vh, int add,
                             int normalize, float eps, float *kx, float *u, float *count) {
    if (add) scale_row(d, kh, 1.0f, normalize, eps, kx);
    else memset(kx, 0, (size_t)d * sizeof(float));
    for (int c = 0; c < nv; c++) u[c] = add ? vh[c] : 0.0f;
    u[nv] = add ? 1.0f : 0.0f;
    if (add) *count += 1.0f;
}

/* ts_decode_step with one query per state: each row updated and read in one pass. */
static void decode_heads(int bh, int d, int nv, const float *q, const float *k, const float *v,
                         const float *factor, float scalar, const uint8_t *real, int normalize,
                         float eps, float *state, float *count, float *out, int threads) {
    const int width = nv + 1;
    const long rows = (long)d * (d + 1) / 2 + d + 1;
#pragma omp parallel for num_threads(bh > 1 ? threads : 1) schedule(static)
    for (int h = 0; h < bh; h++) {
        const float *qh = q + (size_t)h * d, *kh = k + (size_t)h * d;
        float qx[d], kx[d], u[width], y[width];
        scale_row(d, qh, factor ? factor[h] : scalar, normalize, eps, qx);
        new_token(d, nv, kh, v + (size_t)h * nv, !real || real[h], normalize, eps, kx, u,
                  count + h);
        memset(y, 0, sizeof y);
        float *s = state + (size_t)h * rows * width;
        for (int a = 0; a < d; a++) {
            decode_row(width, kx[a] * kx[a], 0.5f * qx[a] * qx[a], u, s, y);
            s += width;
            for (int b = a + 1; b < d; b++, s += width)
                decode_row(width, kx[a] * kx[b], qx[a] * qx[b], u, s, y);
        }
        for (int a = 0; a < d; a++, s += width) decode_row(width, kx[a], qx[a], u, s, y);
        decode_row(width, 1.0f, 1.0f, u, s, y);
        const float total = count[h];
        const float f = total > 0.0f
            ? (normalize ? sqrtf(total / (float)d) : 1.0f) / y[nv] : 0.0f;
        for (int c = 0; c < nv; c++) out[(size_t)h * nv + c] = y[c] * f;
    }
}

void ts_decode_step(int bh, int groups, int d, int nv, const float *q, const float *k,
                    const float *v, const float *factor, float scalar, const uint8_t *real,
                    int normalize, float eps, float *state, float *count, float *out,
                    int threads) {
    if (groups == 1) {
        decode_heads(bh, d, nv, q, k, v, factor, scalar, real, normalize, eps, state, count,
                     out, threads);
        return;
    }
    const int width = nv + 1;
    const long rows = (long)d * (d + 1) / 2 + d + 1;
#pragma omp parallel for num_threads(bh > 1 ? threads : 1) schedule(static)
    for (int h = 0; h < bh; h++) {
        const float *kh = k + (size_t)h * d;
        float qx[groups][d], kx[d], u[width], y[groups][width];
        for (int g = 0; g < groups; g++) {
            const size_t r = (size_t)h * groups + g;
            scale_row(d, q + r * d, factor ? factor[r] : scalar, normalize, eps, qx[g]);
        }
        new_token(d, nv, kh, v + (size_t)h * nv, !real || real[h], normalize, eps, kx, u,
                  count + h);
        memset(y, 0, sizeof y);
        decode_group(d, width, groups, &qx[0][0], kx, u, state + (size_t)h * rows * width,
                     &y[0][0]);
        const float total = count[h];
        for (int g = 0; g < groups; g++) {
            const float f = total > 0.0f
                ? (normalize ? sqrtf(total / (float)d) : 1.0f) / y[g][nv] : 0.0f;
            float *o = out + ((size_t)h * groups + g) * nv;
            for (int c = 0; c < nv; c++) o[c] = y[g][c] * f;
        }
    }
}
