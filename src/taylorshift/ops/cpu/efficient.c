/* The non-causal efficient form's feature products on the CPU, with the quadratic features
   formed inside the products (docs/cpu-kernel.md): no (N, D) feature block is ever stored.

   Built on first use by taylorshift/ops/cpu/build.py (the C compiler, -O3 -march=native,
   OpenMP) and called through ctypes by taylorshift/ops/cpu/efficient.py, which holds the
   autograd wiring and the plain description of every argument. Portable C: GCC/Clang vector
   extensions of 8 floats, which the compiler maps to AVX2 + FMA, AVX-512, NEON or SSE.

   Notation. x~ = [x, 1] has E = d + 1 entries; the pairs p = (a, b), a <= b < E, of x~ x~^T
   give every feature at once: f_p = x_a x_b (a, b < d), x_a (b = d), 1 (a = b = d). The
   state weights are w_p = 1/2 on the diagonal pairs a = b < d, 1 elsewhere, so that
   sum_p w_p f_p(q~) f_p(k~) = 1 + q.k + (q.k)^2 / 2.

   State layout ("rows of six"): the pairs of row a of the triangle, b = a .. E-1, padded with
   zero pairs to a multiple of 6, rows one after the other: ts_state_rows(d) rows in all, each
   of ts_state_cols(V) floats (the V value columns padded with zeros to a multiple of 6). Every
   state here is weighted (w_p S_p).

   All tensors are float32, contiguous, heads flattened: x (BH, N, d), values (BH, N, V). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rows.h"

typedef float vec __attribute__((vector_size(32)));
enum {
    LANES = 8,       /* floats per vector */
    COLS = 6,        /* value columns per register tile */
    UPDATE_TILE = 32 /* tokens per tile of the state update: their x~ and v rows stay in L1 */
};
#define READ_TILE 16 /* tokens per register tile of the readout and of the gradient (2 vectors) */

static inline vec load(const float *p) { vec v; memcpy(&v, p, sizeof v); return v; }
static inline void store(float *p, vec v) { memcpy(p, &v, sizeof v); }
static inline vec splat(float s) { return (vec){s, s, s, s, s, s, s, s}; }
static inline int round_up(int n, int m) { return (n + m - 1) / m * m; }

/* Start of row a of the triangle when each row is padded to a multiple of m pairs; off[E]
   is the total. */
static void row_offsets(int e, int m, long *off) {
    off[0] = 0;
    for (int a = 0; a < e; a++) off[a + 1] = off[a] + round_up(e - a, m);
}

int ts_state_rows(int d) { long off[d + 2]; row_offsets(d + 1, COLS, off); return (int)off[d + 1]; }
int ts_state_cols(int v) { return round_up(v, COLS); }

/* One register tile of the state update: pairs (a, a + j ...) of one row, 8 x nvec of them,
   times value columns c0 .. c0 + 5, summed over the nt tokens of a tile and added to
   s[c * width + lane]. nvec is a constant at each call (1 for the last 8 pairs of a row). */
static inline __attribute__((always_inline)) void update_tile(
    const int nvec, int nt, int xs, const float *xt, int a, int j, int cols, const float *ut,
    int c0, float *s, long width) {
    vec s0[COLS], s1[COLS];
    for (int c = 0; c < COLS; c++) s0[c] = s1[c] = splat(0.0f);
    for (int i = 0; i < nt; i++) {
        const float *x = xt + (size_t)i * xs;
        const vec xa = splat(x[a]);
        const vec f0 = xa * load(x + a + j);
        const vec f1 = nvec == 2 ? xa * load(x + a + j + LANES) : f0;
        const float *u = ut + (size_t)i * cols + c0;
#pragma GCC unroll 6
        for (int c = 0; c < COLS; c++) {
            const vec uc = splat(u[c]);
            s0[c] += f0 * uc;
            if (nvec == 2) s1[c] += f1 * uc;
        }
    }
    for (int c = 0; c < COLS; c++) {
        float *out = s + (size_t)c * width;
        store(out, load(out) + s0[c]);
        if (nvec == 2) store(out + LANES, load(out + LANES) + s1[c]);
    }
}

/* state (BH, ts_state_rows(d), ts_state_cols(V)) = w_p sum_t f_p(x~_t) u_t, the sum over the
   tokens t with mask[t] != 0 (all when mask is NULL), u_t = [values_t, 1] (ones != 0) or
   values_t, V = nv (+ 1); accumulate != 0 adds the sum to the state instead (the causal
   form's prefix state grows chunk by chunk). Work items: (head, block of triangle rows), the rows of a head split
   into blocks of about equal pair counts when there are fewer heads than threads (no item
   shares a state row, so no reduction). Register tile: 16 pairs of one row x 6 columns. */
void ts_state(int bh, int n, int d, const float *x, const float *values, int nv, int ones,
              const uint8_t *mask, float *state, int accumulate, int threads) {
    const int e = d + 1, xs = e + 16, nu = nv + (ones != 0), cols = round_up(nu, COLS);
    long off6[e + 1], off8[e + 1];
    row_offsets(e, COLS, off6);
    row_offsets(e, LANES, off8);
    int parts = bh >= threads ? 1 : (threads + bh - 1) / bh;
    if (parts > e) parts = e;
    int bound[parts + 1];
    bound[0] = 0;
    for (int r = 1, a = 0; r < parts; r++) {
        long pairs = 0, goal = (long)r * (e * (e + 1) / 2) / parts;
        for (a = 0; a < e && pairs < goal; a++) pairs += e - a;
        bound[r] = a > bound[r - 1] ? a : bound[r - 1];
    }
    bound[parts] = e;
    const long rows = off6[e];
    const long items = (long)bh * parts;

#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (long item = 0; item < items; item++) {
        const int h = (int)(item / parts), r = (int)(item % parts);
        const int a0 = bound[r], a1 = bound[r + 1];
        if (a0 == a1) continue;
        const float *xh = x + (size_t)h * n * d, *vh = values + (size_t)h * n * nv;
        const uint8_t *mh = mask ? mask + (size_t)h * n : NULL;
        const long width = off8[a1] - off8[a0];
        float *acc = calloc((size_t)cols * width, sizeof(float)); /* (cols, width) */
        float xt[UPDATE_TILE][xs], ut[UPDATE_TILE][cols];
        memset(xt, 0, sizeof xt);
        for (int t0 = 0; t0 < n; t0 += UPDATE_TILE) {
            const int nt = n - t0 < UPDATE_TILE ? n - t0 : UPDATE_TILE;
            for (int i = 0; i < nt; i++) {
                const int keep = !mh || mh[t0 + i];
                memcpy(xt[i], xh + (size_t)(t0 + i) * d, d * sizeof(float));
                xt[i][d] = 1.0f;
                memset(ut[i], 0, cols * sizeof(float));
                if (keep) {
                    memcpy(ut[i], vh + (size_t)(t0 + i) * nv, nv * sizeof(float));
                    if (ones) ut[i][nv] = 1.0f;
                }
            }
            for (int a = a0; a < a1; a++) {
                const int len = round_up(e - a, LANES);
                float *row = acc + (off8[a] - off8[a0]);
                for (int j = 0; j < len; j += 2 * LANES) {
                    for (int c0 = 0; c0 < cols; c0 += COLS) {
                        float *s = row + (size_t)c0 * width + j;
                        if (j + LANES < len)
                            update_tile(2, nt, xs, &xt[0][0], a, j, cols, &ut[0][0], c0, s, width);
                        else
                            update_tile(1, nt, xs, &xt[0][0], a, j, cols, &ut[0][0], c0, s, width);
                    }
                }
            }
        }
        /* weighted, into the rows-of-six layout (zero pairs and columns as padding) */
        float *sh = state + (size_t)h * rows * cols;
        for (int a = a0; a < a1; a++) {
            const float *row = acc + (off8[a] - off8[a0]);
            for (int j = 0; j < round_up(e - a, COLS); j++) {
                float *out = sh + (size_t)(off6[a] + j) * cols;
                const float w = (j == 0 && a < d) ? 0.5f : 1.0f;
                for (int c = 0; c < cols; c++) {
                    const float sum = a + j < e ? w * row[(size_t)c * width + j] : 0.0f;
                    out[c] = accumulate ? out[c] + sum : sum;
                }
            }
        }
        free(acc);
    }
}

/* y[t] = sum_p f_p(x~_t) state_p for every token t (a state from ts_state, cols wide).
   count == NULL: y (BH, N, ny) = the first ny columns, rows of masked tokens zero.
   count != NULL (the forward's finish): with Y the full product, den (BH, N) = Y[:, ny] and
   y (BH, N, ny) = Y[:, :ny] / den * (normalize ? sqrt(count[h] / d) : 1), zero where
   count[h] == 0. Work items: (head, tile of 16 tokens). Register tile: 16 tokens x 6
   columns. */
void ts_readout(int bh, int n, int d, const float *x, const float *state, int cols, float *y,
                int ny, const uint8_t *mask, const float *count, int normalize, float *den,
                int threads) {
    const int e = d + 1, need = round_up(ny + (count != NULL), COLS);
    long off6[e + 1];
    row_offsets(e, COLS, off6);
    const long rows = off6[e], tiles = (n + READ_TILE - 1) / READ_TILE;
    const long items = (long)bh * tiles;

#pragma omp parallel for num_threads(threads) schedule(static)
    for (long item = 0; item < items; item++) {
        const int h = (int)(item / tiles), t0 = (int)(item % tiles) * READ_TILE;
        const int nt = n - t0 < READ_TILE ? n - t0 : READ_TILE;
        const float *xh = x + (size_t)h * n * d, *sh = state + (size_t)h * rows * cols;
        float xf[e][READ_TILE], yt[need][READ_TILE]; /* feature-major tile of x~, of Y */
        memset(xf, 0, sizeof xf);
        for (int i = 0; i < nt; i++) {
            for (int a = 0; a < d; a++) xf[a][i] = xh[(size_t)(t0 + i) * d + a];
            xf[d][i] = 1.0f;
        }
        for (int c0 = 0; c0 < need; c0 += COLS) {
            vec s0[COLS], s1[COLS];
            for (int c = 0; c < COLS; c++) s0[c] = s1[c] = splat(0.0f);
            for (int a = 0; a < e; a++) {
                const vec xa0 = load(xf[a]), xa1 = load(xf[a] + LANES);
                const float *sw = sh + (size_t)off6[a] * cols + c0;
                for (int b = a; b < e; b++, sw += cols) {
                    const vec f0 = xa0 * load(xf[b]), f1 = xa1 * load(xf[b] + LANES);
#pragma GCC unroll 6
                    for (int c = 0; c < COLS; c++) {
                        const vec s = splat(sw[c]);
                        s0[c] += f0 * s;
                        s1[c] += f1 * s;
                    }
                }
            }
            for (int c = 0; c < COLS; c++) {
                store(yt[c0 + c], s0[c]);
                store(yt[c0 + c] + LANES, s1[c]);
            }
        }
        for (int i = 0; i < nt; i++) {
            const size_t t = (size_t)h * n + t0 + i;
            float *out = y + t * ny;
            if (count) {
                const float total = count[h], dt = yt[ny][i];
                den[t] = dt;
                const float f = total > 0.0f
                    ? (normalize ? sqrtf(total / (float)d) : 1.0f) / dt : 0.0f;
                for (int c = 0; c < ny; c++) out[c] = yt[c][i] * f;
            } else {
                const int keep = !mask || mask[t];
                for (int c = 0; c < ny; c++) out[c] = keep ? yt[c][i] : 0.0f;
            }
        }
    }
}

/* gx (BH, N, d) = d/dx_t of sum_c u_t[c] sum_p state[p, c] f_p(x~_t): the first d entries of
   the gradient w.r.t. x~, gx_a = sum_b (sum_c state[(a, b), c] u_c) x~_b over both orders of
   each pair (so a diagonal pair counts twice: d(x_a^2)/dx_a = 2 x_a). u_t = [values_t, 1]
   (ones != 0) or values_t, zero for masked tokens. Work items: (head, tile of 16 tokens).
   Register tile: 6 pairs x 16 tokens, the sum over c shared by the six. */
void ts_pair_grad(int bh, int n, int d, const float *x, const float *values, int nv, int ones,
                  const uint8_t *mask, const float *state, int cols, float *gx, int threads) {
    const int e = d + 1;
    long off6[e + 1];
    row_offsets(e, COLS, off6);
    const long rows = off6[e], tiles = (n + READ_TILE - 1) / READ_TILE;
    const long items = (long)bh * tiles;

#pragma omp parallel for num_threads(threads) schedule(static)
    for (long item = 0; item < items; item++) {
        const int h = (int)(item / tiles), t0 = (int)(item % tiles) * READ_TILE;
        const int nt = n - t0 < READ_TILE ? n - t0 : READ_TILE;
        const float *xh = x + (size_t)h * n * d, *vh = values + (size_t)h * n * nv;
        const float *sh = state + (size_t)h * rows * cols;
        /* feature-major tiles: x~ with zero rows up to e + 8 (pairs padded past E read them),
           u with zero columns up to cols; the gradient accumulates in g */
        float xf[e + 8][READ_TILE], uf[cols][READ_TILE], g[e + 8][READ_TILE];
        memset(xf, 0, sizeof xf);
        memset(uf, 0, sizeof uf);
        memset(g, 0, sizeof g);
        for (int i = 0; i < nt; i++) {
            const size_t t = (size_t)t0 + i;
            for (int a = 0; a < d; a++) xf[a][i] = xh[t * d + a];
            xf[d][i] = 1.0f;
            if (mask && !mask[(size_t)h * n + t]) continue;
            for (int c = 0; c < nv; c++) uf[c][i] = vh[t * nv + c];
            if (ones) uf[nv][i] = 1.0f;
        }
        const float *pp = sh;
        for (int a = 0; a < e; a++) {
            const vec xa0 = load(xf[a]), xa1 = load(xf[a] + LANES);
            vec ga0 = splat(0.0f), ga1 = splat(0.0f);
            const int len = round_up(e - a, COLS);
            for (int b0 = a; b0 < a + len; b0 += COLS, pp += COLS * cols) {
                vec w0[COLS], w1[COLS]; /* sum_c state[(a, b0 + i), c] u_c for 16 tokens */
                for (int i = 0; i < COLS; i++) w0[i] = w1[i] = splat(0.0f);
                for (int c = 0; c < cols; c++) {
                    const vec u0 = load(uf[c]), u1 = load(uf[c] + LANES);
#pragma GCC unroll 6
                    for (int i = 0; i < COLS; i++) {
                        const vec s = splat(pp[(size_t)i * cols + c]);
                        w0[i] += s * u0;
                        w1[i] += s * u1;
                    }
                }
#pragma GCC unroll 6
                for (int i = 0; i < COLS; i++) {
                    const int b = b0 + i;
                    ga0 += w0[i] * load(xf[b]);
                    ga1 += w1[i] * load(xf[b] + LANES);
                    store(g[b], load(g[b]) + w0[i] * xa0);
                    store(g[b] + LANES, load(g[b] + LANES) + w1[i] * xa1);
                }
            }
            store(g[a], load(g[a]) + ga0);
            store(g[a] + LANES, load(g[a] + LANES) + ga1);
        }
        for (int i = 0; i < nt; i++) {
            float *out = gx + ((size_t)h * n + t0 + i) * d;
            for (int a = 0; a < d; a++) out[a] = g[a][i];
        }
    }
}

/* xp (BH, N, d) = factor[h] x / max(|x|, eps) (normalize) or factor[h] x, with factor NULL
   read as 1: the map x -> x' in front of the feature products (s = q'.k'), rows.h. */
void ts_scale_rows(int bh, int n, int d, const float *x, const float *factor, int normalize,
                   float eps, float *xp, int threads) {
    const long rows = (long)bh * n;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long r = 0; r < rows; r++)
        scale_row(d, x + (size_t)r * d, factor ? factor[r / n] : 1.0f, normalize, eps,
                  xp + (size_t)r * d);
}

/* The backward of ts_scale_rows (rows.h): gx (BH, N, d) from gp = dL/dx'; gfactor (BH) (may
   be NULL) = sum over the head's tokens of gp.u (normalize) or gp.x. Items: (head, block of
   256 tokens), partial sums added per head. */
void ts_scale_rows_grad(int bh, int n, int d, const float *x, const float *gp,
                        const float *factor, int normalize, float eps, float *gx,
                        float *gfactor, int threads) {
    const int block = 256;
    const long blocks = (n + block - 1) / block, items = (long)bh * blocks;
    double *part = gfactor ? calloc((size_t)(items > 0 ? items : 1), sizeof(double)) : NULL;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long item = 0; item < items; item++) {
        const int h = (int)(item / blocks), t0 = (int)(item % blocks) * block;
        const int t1 = t0 + block < n ? t0 + block : n;
        const float f = factor ? factor[h] : 1.0f;
        double sum = 0.0;
        for (int t = t0; t < t1; t++) {
            const size_t at = ((size_t)h * n + t) * d;
            sum += scale_row_grad(d, x + at, gp + at, f, normalize, eps, gx + at);
        }
        if (part) part[item] = sum;
    }
    if (part) {
        for (int h = 0; h < bh; h++) {
            double total = 0.0;
            for (long b = 0; b < blocks; b++) total += part[(long)h * blocks + b];
            gfactor[h] = (float)total;
        }
        free(part);
    }
}

/* gy (BH, N, nv + 1) = the gradient w.r.t. Y' = [numerator, denominator] from g = dL/dy,
   y = numerator f / den with f = sqrt(count[h] / d) (normalize) or 1: columns :nv are
   g f / den, column nv is -(g.y) / den; zero rows where count[h] == 0. */
void ts_output_grad(int bh, int n, int nv, int d, const float *g, const float *y,
                    const float *den, const float *count, int normalize, float *gy,
                    int threads) {
    const long rows = (long)bh * n;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long r = 0; r < rows; r++) {
        const float total = count[r / n];
        const float *gr = g + (size_t)r * nv, *yr = y + (size_t)r * nv;
        float *out = gy + (size_t)r * (nv + 1);
        const float inv = total > 0.0f ? 1.0f / den[r] : 0.0f;
        const float f = normalize ? inv * sqrtf(total / (float)d) : inv;
        float dot = 0.0f;
        for (int c = 0; c < nv; c++) { out[c] = gr[c] * f; dot += gr[c] * yr[c]; }
        out[nv] = -dot * inv;
    }
}

/* The decoding step (ops/cpu/decode.py): one new token per head on the state of
   ops/taylor_shift/decode.py, S (BH, D, V + 1), unweighted, rows x_a x_b (a <= b < d, row by
   row), then x_a, then 1; count (BH). With q' = f_h q / max(|q|, eps), k' = k / max(|k|, eps)
   (normalize; else q' = f_h q, k' = k), f_h = factor[h] (factor NULL: the float scalar):
   where real is NULL or real[h] != 0, S += phi(k')^T [v, 1] and count[h] += 1; then
   Y = sum_p w_p phi_p(q') S_p over the updated state (the token attends itself) and
   out (BH, V) = Y[:V] * (normalize ? sqrt(count[h] / d) : 1) / Y[V], zero where
   count[h] == 0. One pass over S: each row is updated and read while in registers, where
   the PyTorch step reads the state twice and writes it once. Work items: heads. */
static inline void decode_row(int width, float fk, float fq, const float *restrict u,
                              float *restrict s, float *restrict y) {
#pragma omp simd
    for (int c = 0; c < width; c++) {
        const float sc = s[c] + fk * u[c];
        s[c] = sc;
        y[c] += fq * sc;
    }
}

void ts_decode_step(int bh, int d, int nv, const float *q, const float *k, const float *v,
                    const float *factor, float scalar, const uint8_t *real, int normalize,
                    float eps, float *state, float *count, float *out, int threads) {
    const int width = nv + 1;
    const long rows = (long)d * (d + 1) / 2 + d + 1;
#pragma omp parallel for num_threads(bh > 1 ? threads : 1) schedule(static)
    for (int h = 0; h < bh; h++) {
        const float *qh = q + (size_t)h * d, *kh = k + (size_t)h * d;
        float qx[d], kx[d], u[width], y[width];
        scale_row(d, qh, factor ? factor[h] : scalar, normalize, eps, qx);
        const int add = !real || real[h]; /* a padded token's key (NaN, say) never reaches S */
        if (add) scale_row(d, kh, 1.0f, normalize, eps, kx);
        else memset(kx, 0, sizeof kx);
        for (int c = 0; c < nv; c++) u[c] = add ? v[(size_t)h * nv + c] : 0.0f;
        u[nv] = add ? 1.0f : 0.0f;
        if (add) count[h] += 1.0f;
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
