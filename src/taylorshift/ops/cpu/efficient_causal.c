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
   then dq, dk and the factor's gradient through the scaling. No prefix state is kept
   between the two calls.

   A prefix state in and out (prompt prefill, a sequence in segments, a rank of sequence
   parallelism): where the forward's state is not NULL it holds the keys before the block,
   in ts_state's layout and weights, per key/value head, and the sweep starts from it
   (every query attends them; their count, n_0, read from the state's last pair and ones
   column, the weighted sum of 1 * 1 over them); the forward then adds every key of the
   block, the last chunk's too, and leaves the state after the block in its place (where
   the state after is not wanted, a negative chunk, it stops where a sweep without a prefix
   stops: after the keys that later queries attend, so the buffer is then scratch). The
   backward's state, where not NULL, is the prefix the forward started from: its forward
   sweep starts there, and the reverse sweep goes on past the first chunk to the gradient
   w.r.t. the prefix, which it leaves in the prefix's place: G_>-1 = c (.) sum over every
   query of phi(q')^T gY', the weights c in it as in every G_>c (the state holds c (.) the
   sums, so this is the gradient w.r.t. the unweighted sums, pair by pair). The count n_0
   is not differentiated (a count of keys).

   The kernels read heads at a stride of their own token count, so each chunk's rows are
   copied into chunk-sized scratch (O(C d) a chunk, against O(C D V) of products) and the
   gradients added back. A masked key's row of k' is zeroed with its row of u, so NaN in a
   padded key never reaches a sum. Query i attends key j iff j <= i (and j < Nk).

   Grouped-query attention (group G > 1, docs/efficient-form.md §6): key, value and mask have
   BH / G heads, query head h reading key/value head h / G. The prefix state and its
   gradient are kept per key/value head: the scratch chunk of the G query heads of a group is
   one run of G C rows, so the feature products read it as one head of G C tokens (the
   state's readout and pair gradient for G query heads at once; G_>c summed over them), and
   the key side (the state update, the key gradients through G_>c) runs once per key/value
   head. Only the intra-chunk block, O(C^2 d) per query head, takes the chunk's keys repeated
   G times (a copy of C rows), its key gradients summed over the group.

   float32, contiguous, heads flattened: q (BH, Nq, d), k (BH / G, Nk, d), v (BH / G, Nk, V),
   mask (BH / G, Nk) uint8 or NULL, factor (BH) or NULL for the float scalar. Sums never
   change order with the thread count. */
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

/* The first ws columns of rows [i0, i1) of every head h of x (H, n, wx) += the sum over
   g < group of src's head h * group + g (src: (H * group, i1 - i0, ws)), added in the order
   of g. */
static void add_rows(int heads, int n, int wx, float *x, int i0, int i1, int ws,
                     const float *src, int group, int threads) {
    const int m = i1 - i0;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int h = 0; h < heads; h++)
        for (int g = 0; g < group; g++)
            for (int t = 0; t < m; t++) {
                float *row = x + ((size_t)h * n + i0 + t) * wx;
                const float *part = src + (((size_t)h * group + g) * m + t) * ws;
                for (int c = 0; c < ws; c++) row[c] += part[c];
            }
}

/* dst (H * group, len, w) = src (H, len, w) with each head repeated group times. */
static void repeat_heads(int heads, int group, int len, int w, const float *src, float *dst) {
    const size_t size = (size_t)len * w;
    for (int h = 0; h < heads * group; h++)
        memcpy(dst + h * size, src + (size_t)(h / group) * size, size * sizeof(float));
}

/* The keys [i0, i1) of the HK key/value heads: kc (HK, i1 - i0, d) from k', uc from u
   (w = nu columns), and in *kb, *ub those of each of the HK * group query heads, for the
   intra-chunk block: kc, uc themselves (group 1) or their heads repeated into kr, ur. */
static void chunk_keys(int hk, int group, int nk, int d, int nu, const float *kp,
                       const float *u, int i0, int i1, float *kc, float *uc, float *kr,
                       float *ur, const float **kb, const float **ub) {
    take_rows(hk, nk, d, kp, i0, i1, kc);
    take_rows(hk, nk, nu, u, i0, i1, uc);
    *kb = kc;
    *ub = uc;
    if (group > 1) {
        repeat_heads(hk, group, i1 - i0, d, kc, kr);
        repeat_heads(hk, group, i1 - i0, nu, uc, ur);
        *kb = kr;
        *ub = ur;
    }
}

/* n_i (BH, Nq): the real keys j <= i of query head h's key/value head h / group, after
   the n_0 keys of the prefix state (state NULL: none; else its head's count, the entry of
   its last pair, phi = 1, and ones column nv: rows x cols floats a head). */
static void causal_counts(int bh, int nq, int nk, const uint8_t *mask, int group,
                          const float *state, int d, int nv, float *count) {
    const size_t last = (size_t)((d + 1) * (d + 2) / 2 - 1) * ts_state_cols(nv + 1) + nv;
    const size_t head = (size_t)ts_state_rows(d) * ts_state_cols(nv + 1);
    for (int h = 0; h < bh; h++) {
        long seen = 0;
        const uint8_t *mh = mask ? mask + (size_t)(h / group) * nk : NULL;
        const float before = state ? state[(size_t)(h / group) * head + last] : 0.0f;
        for (int i = 0, j = 0; i < nq; i++) {
            for (; j <= i && j < nk; j++) seen += !mh || mh[j];
            count[(size_t)h * nq + i] = before + (float)seen;
        }
    }
}

/* q' (BH, Nq, d), k' (HK, Nk, d) with masked keys' rows zero, u = [v m, m] (HK, Nk, V + 1),
   HK = BH / group. */
static void operands(int bh, int group, int nq, int nk, int d, int nv, const float *q,
                     const float *k, const float *v, const uint8_t *mask, const float *factor,
                     int normalize, float eps, float *qp, float *kp, float *u, int threads) {
    ts_scale_rows(bh, nq, d, q, factor, normalize, eps, qp, threads);
    ts_scale_rows(bh / group, nk, d, k, NULL, normalize, eps, kp, threads);
    const long rows = (long)(bh / group) * nk;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long r = 0; r < rows; r++) {
        const int keep = !mask || mask[r];
        float *ur = u + (size_t)r * (nv + 1);
        for (int c = 0; c < nv; c++) ur[c] = keep ? v[(size_t)r * nv + c] : 0.0f;
        ur[nv] = keep ? 1.0f : 0.0f;
        if (!keep) memset(kp + (size_t)r * d, 0, (size_t)d * sizeof(float));
    }
}

/* Forward, in the signature of kernels.h (option: tokens per chunk, negative where the state
   after the block is not wanted; group: query heads per key/value head): y (BH, Nq, V),
   den (BH, Nq) = Y'[V], count (BH, Nq) = n_i. The prefix state lives in scratch memory,
   or, where state_io is not NULL (BH / G, ts_state_rows(d), ts_state_cols(V + 1)), starts
   as state_io and is left there after the block's last key (chunk > 0).
   Returns 0, or 1 when scratch memory could not be allocated. */
int ts_causal_forward(int bh, int nq, int nk, int d, int nv, const float *q, const float *k,
                      const float *v, const uint8_t *mask, const float *factor, float scalar,
                      int normalize, float eps, int chunk, int group, float *y, float *den,
                      float *count, float *state_io, int threads) {
    /* chunk < 0: the state after the block is not wanted (a prefix in, nothing out: a
       segment's or a rank's sweep), so keys join the state only while later queries
       need them, as without a prefix */
    const int keep = chunk > 0;
    chunk = chunk < 0 ? -chunk : chunk;
    const int nu = nv + 1, rows = ts_state_rows(d), cols = ts_state_cols(nu), hk = bh / group;
    const int span = nq > nk ? nq : nk, c = chunk < span ? chunk : (span > 0 ? span : 1);
    const size_t nqd = (size_t)bh * nq * d, nkd = (size_t)hk * nk * d;
    const size_t nku = (size_t)hk * nk * nu, ns = (size_t)hk * rows * cols;
    const size_t cd = (size_t)bh * c * d, cu = (size_t)bh * c * nu;
    float *qp = malloc(sizeof(float) * (nqd + nkd + nku + ns + 3 * cd + 4 * cu + bh + 1));
    if (!qp) return 1;
    float *kp = qp + nqd, *u = kp + nkd, *state = u + nku, *qc = state + ns, *kc = qc + cd;
    float *uc = kc + cd, *yc = uc + cu, *block = yc + cu, *kr = block + cu, *ur = kr + cd;
    float *heads = ur + cu;
    const float *f = head_factors(bh, factor, scalar, heads);
    operands(bh, group, nq, nk, d, nv, q, k, v, mask, f, normalize, eps, qp, kp, u, threads);
    causal_counts(bh, nq, nk, mask, group, state_io, d, nv, count);
    if (state_io) state = state_io; /* the given prefix, continued in place */
    int failed = 0, have_state = state_io != NULL;
    for (int i0 = 0; i0 < span && !failed; i0 += c) {
        const int i1 = i0 + c < span ? i0 + c : span;
        int taken = i0; /* kc, uc hold keys [i0, taken) */
        if (i0 < nq) {
            const int q1 = i1 < nq ? i1 : nq, m = q1 - i0;
            take_rows(bh, nq, d, qp, i0, q1, qc);
            memset(yc, 0, sizeof(float) * bh * m * nu);
            if (have_state) /* a group's G chunks: one head of G m tokens (the state's) */
                ts_readout(hk, group * m, d, qc, state, cols, yc, nu, NULL, NULL, 0, NULL,
                           threads);
            if (i0 < nk) { /* the chunk's own keys, up to its last query */
                const int ck = (q1 < nk ? q1 : nk) - i0;
                const float *kb, *ub; /* the keys of each query head's block */
                chunk_keys(hk, group, nk, d, nu, kp, u, i0, i0 + ck, kc, uc, kr, ur, &kb, &ub);
                taken = i0 + ck;
                failed |= direct_forward(bh, m, ck, d, nu, qc, kb, ub, NULL, NULL, 1.0f, 1, 0,
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
        /* later queries attend this chunk through the state; a state out takes every key */
        if (i0 < nk && (i1 < nq || (state_io && keep))) {
            const int j1 = i1 < nk ? i1 : nk;
            if (taken < j1) { /* keys after the last query, which no block read */
                take_rows(hk, nk, d, kp, i0, j1, kc);
                take_rows(hk, nk, nu, u, i0, j1, uc);
            }
            failed |= ts_state(hk, j1 - i0, d, kc, uc, nu, 0, NULL, state, have_state, threads);
            have_state = 1;
        }
    }
    free(qp);
    return failed;
}

/* Backward, in the signature of kernels.h (option: tokens per chunk; group: query heads per
   key/value head): gq (BH, Nq, d), gk (BH / G, Nk, d), gv (BH / G, Nk, V) and, where
   gfactor is not NULL, gfactor (BH), from g = dL/dy and the forward's y, den, count; where
   state_io is not NULL, it holds the prefix the forward started from (the forward's layout)
   and is overwritten by the gradient w.r.t. it. Returns 0, or 1 when scratch memory could
   not be allocated. */
int ts_causal_backward(int bh, int nq, int nk, int d, int nv, const float *q, const float *k,
                       const float *v, const uint8_t *mask, const float *factor, float scalar,
                       int normalize, float eps, int chunk, int group, const float *g,
                       const float *y, const float *den, const float *count,
                       float *state_io, float *gq, float *gk, float *gv, float *gfactor,
                       int threads) {
    const int nu = nv + 1, rows = ts_state_rows(d), cols = ts_state_cols(nu), hk = bh / group;
    const int span = nq > nk ? nq : nk, c = chunk < span ? chunk : (span > 0 ? span : 1);
    const size_t nqd = (size_t)bh * nq * d, nkd = (size_t)hk * nk * d;
    const size_t nqu = (size_t)bh * nq * nu, nku = (size_t)hk * nk * nu;
    const size_t ns = (size_t)hk * rows * cols;
    const size_t cd = (size_t)bh * c * d, cu = (size_t)bh * c * nu;
    float *qp = malloc(sizeof(float) *
                       (2 * nqd + 2 * nkd + 2 * nku + nqu + 2 * ns + 5 * cd + 4 * cu + bh + 1));
    if (!qp) return 1;
    float *kp = qp + nqd, *u = kp + nkd, *gy = u + nku, *g_qp = gy + nqu, *g_kp = g_qp + nqd;
    float *g_u = g_kp + nkd, *state = g_u + nku, *grad_state = state + ns;
    float *qc = grad_state + ns, *kc = qc + cd, *part_q = kc + cd, *part_k = part_q + cd;
    float *gc = part_k + cd, *uc = gc + cu, *part_u = uc + cu, *kr = part_u + cu;
    float *ur = kr + cd, *heads = ur + cu;
    const float *f = head_factors(bh, factor, scalar, heads);
    operands(bh, group, nq, nk, d, nv, q, k, v, mask, f, normalize, eps, qp, kp, u, threads);
    ts_output_grad(bh, nq, nv, d, g, y, den, count, 1, normalize, gy, threads);
    memset(g_qp, 0, sizeof(float) * (nqd + nkd + nku)); /* g_qp, g_kp, g_u */
    int failed = 0;

    /* forward sweep: S_<i0 again (from the prefix, if any); dq' through it and the blocks'
       gradients */
    int have_state = state_io != NULL;
    if (state_io) memcpy(state, state_io, sizeof(float) * ns);
    for (int i0 = 0; i0 < span && !failed; i0 += c) {
        const int i1 = i0 + c < span ? i0 + c : span;
        if (i0 < nq) {
            const int q1 = i1 < nq ? i1 : nq, m = q1 - i0;
            take_rows(bh, nq, d, qp, i0, q1, qc);
            take_rows(bh, nq, nu, gy, i0, q1, gc);
            if (have_state) { /* a group's G chunks: one head of G m tokens (the state's) */
                failed |= ts_pair_grad(hk, group * m, d, qc, gc, nu, 0, NULL, state, cols,
                                       part_q, threads);
                add_rows(bh, nq, d, g_qp, i0, q1, d, part_q, 1, threads);
            }
            if (i0 < nk) {
                const int ck = (q1 < nk ? q1 : nk) - i0;
                const float *kb, *ub; /* the keys of each query head's block */
                chunk_keys(hk, group, nk, d, nu, kp, u, i0, i0 + ck, kc, uc, kr, ur, &kb, &ub);
                failed |= direct_backward(bh, m, ck, d, nu, qc, kb, ub, NULL, NULL, 1.0f, 1, 0,
                                          eps, 1, gc, NULL, NULL, NULL, part_q, part_k,
                                          part_u, NULL, threads);
                add_rows(bh, nq, d, g_qp, i0, q1, d, part_q, 1, threads);
                add_rows(hk, nk, d, g_kp, i0, i0 + ck, d, part_k, group, threads);
                add_rows(hk, nk, nu, g_u, i0, i0 + ck, nu, part_u, group, threads);
            }
        }
        if (i0 < nk && i1 < nq) { /* kc, uc hold keys [i0, min(i1, nk)) from the block */
            const int j1 = i1 < nk ? i1 : nk;
            failed |= ts_state(hk, j1 - i0, d, kc, uc, nu, 0, NULL, state, have_state, threads);
            have_state = 1;
        }
    }

    /* reverse sweep: G_>c, the gradient of the state chunk c feeds, gives the key side */
    int have_grad = 0;
    for (int i0 = (span - 1) / c * c; i0 >= 0 && span > 0 && !failed; i0 -= c) {
        const int i1 = i0 + c < span ? i0 + c : span;
        if (i0 < nk && have_grad) {
            const int j1 = i1 < nk ? i1 : nk, len = j1 - i0;
            take_rows(hk, nk, d, kp, i0, j1, kc);
            take_rows(hk, nk, nu, u, i0, j1, uc);
            ts_readout(hk, len, d, kc, grad_state, cols, part_u, nv, NULL, NULL, 0, NULL,
                       threads);
            add_rows(hk, nk, nu, g_u, i0, j1, nv, part_u, 1, threads);
            failed |= ts_pair_grad(hk, len, d, kc, uc, nu, 0, NULL, grad_state, cols, part_k,
                                   threads);
            add_rows(hk, nk, d, g_kp, i0, j1, d, part_k, 1, threads);
        }
        if (i0 < nq && (i0 > 0 || state_io)) { /* (chunk 0's feed only a prefix) */
            const int q1 = i1 < nq ? i1 : nq;
            take_rows(bh, nq, d, qp, i0, q1, qc);
            take_rows(bh, nq, nu, gy, i0, q1, gc);
            /* G_>c summed over a group's query heads: one head of G (q1 - i0) tokens */
            failed |= ts_state(hk, group * (q1 - i0), d, qc, gc, nu, 0, NULL, grad_state,
                               have_grad, threads);
            have_grad = 1;
        }
    }

    if (!failed) {
        const long keys = (long)hk * nk;
        for (long r = 0; r < keys; r++) { /* dv: the first V columns of du, masked keys zero */
            const int keep = !mask || mask[r];
            for (int cc = 0; cc < nv; cc++)
                gv[(size_t)r * nv + cc] = keep ? g_u[(size_t)r * nu + cc] : 0.0f;
        }
        failed |= ts_scale_rows_grad(bh, nq, d, q, g_qp, f, normalize, eps, gq, gfactor,
                                     threads);
        failed |= ts_scale_rows_grad(hk, nk, d, k, g_kp, NULL, normalize, eps, gk, NULL,
                                     threads);
        if (state_io) { /* the prefix's gradient: G over every query (none: zero) */
            if (have_grad) memcpy(state_io, grad_state, sizeof(float) * ns);
            else memset(state_io, 0, sizeof(float) * ns);
        }
    }
    free(qp);
    return failed;
}
