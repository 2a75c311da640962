/* The non-causal efficient form's feature products on the CPU, with the quadratic features
   formed inside the products (docs/cpu-kernel.md): no (N, D) feature block is ever stored.

   Built on first use by taylorshift/ops/cpu/build.py (the C compiler, -O3 -march=native,
   OpenMP) and called through ctypes by taylorshift/ops/cpu/wrapper.py, which holds the
   autograd wiring of the three kernel forms (the passes' arguments: kernels.h). Portable C:
   GCC/Clang vector extensions of 8 floats, which the compiler maps to AVX2 + FMA, AVX-512,
   NEON or SSE.

   Notation. x~ = [x, 1] has E = d + 1 entries; the pairs p = (a, b), a <= b < E, of x~ x~^T
   give every feature at once: f_p = x_a x_b (a, b < d), x_a (b = d), 1 (a = b = d). The
   state weights are w_p = 1/2 on the diagonal pairs a = b < d, 1 elsewhere, so that
   sum_p w_p f_p(q~) f_p(k~) = 1 + q.k + (q.k)^2 / 2.

   State layout ("packed pairs"): the pairs p = (a, b) row by row of the triangle, row a
   holding b = a .. E-1 and starting at off[a] = sum_{a' < a} (E - a') (row_offsets with
   m = 1), D = E(E+1)/2 pairs in all, followed by zero pairs up to ts_state_rows(d) = D rounded up to a multiple
   of 6; each pair a row of ts_state_cols(V) floats (the V value columns padded with zeros to
   a multiple of 6). Every state here is weighted (w_p S_p).

   All tensors are float32, contiguous, heads flattened: x (BH, N, d), values (BH, N, V). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "rows.h"
#include "vectors.h"

enum {
    COLS = 6,           /* value columns (or pairs) per register tile */
    UPDATE_TILE = 32, /* tokens per tile of the state update: their x~ and v rows stay in L1 */
    PACKED_MAX = 640, /* pairs (rounded up to 16) up to which the state update forms a whole
                         packed feature row per token (d <= 34); above, row by row */
    TOKEN_TILE = 128, /* tokens per tile of the state update with the tokens in the lanes */
    TOKENS_MAX_D = 20, /* head dims up to which the state update puts the tokens in the lanes */
    TOKENS_MIN_N = 192 /* ... and tokens from which it does: below, its D x cols x 8 partial
                          sums per head cost more than the packed rows' product
                          (benchmarks/op_cpu/short-state) */
};
#define READ_TILE 16 /* tokens per register tile of the readout and of the gradient (2 vectors) */

static inline int round_up(int n, int m) { return (n + m - 1) / m * m; }

/* The feature-major tile t[a * tw + i] = src[i * stride + a] of nt <= tw token rows of
   width floats, lanes nt .. tw - 1 zero: 8 x 8 blocks transposed where 8 rows and 8 columns
   are there, the rest one float at a time. Not inlined (nor tile_out): inlined into the
   kernels' OpenMP bodies they slowed the pair gradient's products at d = 64 to 0.90-0.94x
   (benchmarks/op_cpu/transposes); a call per tile costs nothing measurable. */
static __attribute__((noinline)) void tile_in(const float *src, long stride, int nt, int width,
                                              float *t, int tw) {
    const int wide = width - width % LANES;
    int i0 = 0;
    for (; i0 + LANES <= nt; i0 += LANES) {
        for (int a0 = 0; a0 < wide; a0 += LANES) {
            vec r[LANES];
            for (int i = 0; i < LANES; i++) r[i] = load(src + (size_t)(i0 + i) * stride + a0);
            transpose8(r);
            for (int a = 0; a < LANES; a++) store(t + (size_t)(a0 + a) * tw + i0, r[a]);
        }
        for (int a = wide; a < width; a++)
            for (int i = i0; i < i0 + LANES; i++)
                t[(size_t)a * tw + i] = src[(size_t)i * stride + a];
    }
    for (int a = 0; a < width; a++)
        for (int i = i0; i < tw; i++)
            t[(size_t)a * tw + i] = i < nt ? src[(size_t)i * stride + a] : 0.0f;
}

/* The way back: dst[i * stride + a] = t[a][i], times f[i] where f is not NULL, for the
   first nt tokens and width columns (8 x 8 blocks as in tile_in). */
static __attribute__((noinline)) void tile_out(float t[][READ_TILE], const float *f, int nt,
                                               int width, float *dst, long stride) {
    const int wide = width - width % LANES;
    int i0 = 0;
    for (; i0 + LANES <= nt; i0 += LANES) {
        const vec s = f ? load(f + i0) : splat(1.0f);
        for (int a0 = 0; a0 < wide; a0 += LANES) {
            vec r[LANES];
            for (int a = 0; a < LANES; a++) {
                const vec ta = load(t[a0 + a] + i0);
                r[a] = f ? ta * s : ta;
            }
            transpose8(r);
            for (int i = 0; i < LANES; i++) store(dst + (size_t)(i0 + i) * stride + a0, r[i]);
        }
        for (int i = i0; i < i0 + LANES; i++)
            for (int a = wide; a < width; a++)
                dst[(size_t)i * stride + a] = f ? t[a][i] * f[i] : t[a][i];
    }
    for (int i = i0; i < nt; i++)
        for (int a = 0; a < width; a++) dst[(size_t)i * stride + a] = f ? t[a][i] * f[i] : t[a][i];
}

/* Start of row a of the triangle when each row is padded to a multiple of m pairs (m = 1:
   packed); off[E] is the total. */
static void row_offsets(int e, int m, long *off) {
    off[0] = 0;
    for (int a = 0; a < e; a++) off[a + 1] = off[a] + round_up(e - a, m);
}

int ts_state_rows(int d) { return round_up((d + 1) * (d + 2) / 2, COLS); }
int ts_state_cols(int v) { return round_up(v, COLS); }

/* One register tile of the state update: 8 x nvec features of each of the nt tokens of a
   tile (row i at f + i * fs), times value columns c0 .. c0 + m - 1, summed over the tokens
   and added to s[c * width + lane]. nvec and m are constants at each call. */
static inline __attribute__((always_inline)) void update_tile(
    const int nvec, const int m, int nt, const float *f, int fs, const float *ut, int cols,
    int c0, float *s, long width) {
    vec s0[COLS], s1[COLS];
    for (int c = 0; c < m; c++) s0[c] = s1[c] = splat(0.0f);
    for (int i = 0; i < nt; i++) {
        const float *fi = f + (size_t)i * fs;
        const vec f0 = load(fi);
        const vec f1 = nvec == 2 ? load(fi + LANES) : f0;
        const float *u = ut + (size_t)i * cols + c0;
#pragma GCC unroll 6
        for (int c = 0; c < m; c++) {
            const vec uc = splat(u[c]);
            s0[c] += f0 * uc;
            if (nvec == 2) s1[c] += f1 * uc;
        }
    }
    for (int c = 0; c < m; c++) {
        float *out = s + (size_t)(c0 + c) * width;
        store(out, load(out) + s0[c]);
        if (nvec == 2) store(out + LANES, load(out + LANES) + s1[c]);
    }
}

/* update_tile over the nu true value columns: tiles of 6, then one of the rest. */
static inline __attribute__((always_inline)) void update_columns(
    const int nvec, int nu, int nt, const float *f, int fs, const float *ut, int cols, float *s,
    long width) {
    int c0 = 0;
    for (; c0 + COLS <= nu; c0 += COLS) update_tile(nvec, COLS, nt, f, fs, ut, cols, c0, s, width);
    switch (nu - c0) {
    case 1: update_tile(nvec, 1, nt, f, fs, ut, cols, c0, s, width); break;
    case 2: update_tile(nvec, 2, nt, f, fs, ut, cols, c0, s, width); break;
    case 3: update_tile(nvec, 3, nt, f, fs, ut, cols, c0, s, width); break;
    case 4: update_tile(nvec, 4, nt, f, fs, ut, cols, c0, s, width); break;
    case 5: update_tile(nvec, 5, nt, f, fs, ut, cols, c0, s, width); break;
    default: break;
    }
}

/* The features of row a of one token, f[j] = x~_a x~_{a+j}, j < E - a, written a vector at a
   time: the lanes past the row's end read x~'s zero padding, so they write zeros (which the
   next row, written after, overwrites where it starts). */
static inline void row_features(const float *x, int a, int e, float *f) {
    const vec xa = splat(x[a]);
    for (int j = 0; j < e - a; j += LANES) store(f + j, xa * load(x + a + j));
}

/* One register tile of state_tokens: pairs p (features x~_a x~_b, rows xa, xb of the tile)
   and p + 1 (ya, yb) times columns c0 .. c0 + m - 1 (m a constant at each call), summed
   over nvec vectors of 8 tokens and added lane by lane to acc (8 sums per pair and column,
   the pairs cols * 8 floats apart). */
static inline __attribute__((always_inline)) void token_tile(
    const int m, int nvec, const float *xa, const float *xb, const float *ya, const float *yb,
    const float uf[][TOKEN_TILE], int c0, int cols, float *acc) {
    vec s0[COLS], s1[COLS];
    for (int c = 0; c < m; c++) s0[c] = s1[c] = splat(0.0f);
    for (int v = 0; v < nvec * LANES; v += LANES) {
        const vec f0 = load(xa + v) * load(xb + v);
        const vec f1 = load(ya + v) * load(yb + v);
#pragma GCC unroll 6
        for (int c = 0; c < m; c++) {
            vec uc = load(uf[c0 + c] + v);
            in_register(uc);
            s0[c] += f0 * uc;
            s1[c] += f1 * uc;
        }
    }
    float *out0 = acc + (size_t)c0 * LANES, *out1 = out0 + (size_t)cols * LANES;
    for (int c = 0; c < m; c++) {
        store(out0 + c * LANES, load(out0 + c * LANES) + s0[c]);
        store(out1 + c * LANES, load(out1 + c * LANES) + s1[c]);
    }
}

/* ts_state for short feature rows (d <= TOKENS_MAX_D), with the tokens in the lanes: per tile
   of 128 tokens, x~ and u transposed to feature-major rows (xf, uf), then for two pairs p, q
   and six columns at a time the features f_p = x~_a x~_b formed in registers, 8 tokens per
   vector, and f_p u_c summed into twelve accumulators; each (pair, column) keeps 8 partial
   sums (one per lane) across tiles, added up at the end. No feature row is ever stored,
   which at d = 16 costs more than the products (docs/cpu-kernel.md). Same contract as
   ts_state; pa, pb (total + 1 entries, the last a zero pair (E, E)) list the pairs. */
static int state_tokens(int bh, int n, int d, const float *x, const float *values, int nv,
                        int ones, const uint8_t *mask, float *state, int accumulate,
                        int threads, const short *pa, const short *pb) {
    const int e = d + 1, nu = nv + (ones != 0), cols = round_up(nu, COLS);
    const long total = (long)e * (e + 1) / 2, rows = ts_state_rows(d);
    const int couples = (int)((total + 1) / 2); /* work units: two pairs each */
    int parts = bh >= threads ? 1 : (threads + bh - 1) / bh;
    if (parts > couples) parts = couples;
    const long items = (long)bh * parts;
    int failed = 0;

#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (long item = 0; item < items; item++) {
        const int h = (int)(item / parts), r = (int)(item % parts);
        const long p0 = 2 * ((long)couples * r / parts), p1 = 2 * ((long)couples * (r + 1) / parts);
        if (p0 == p1) continue;
        const float *xh = x + (size_t)h * n * d, *vh = values + (size_t)h * n * nv;
        const uint8_t *mh = mask ? mask + (size_t)h * n : NULL;
        /* acc[p - p0][c]: 8 partial sums (calloc aligns to 16 bytes only: load/store) */
        float *acc = calloc((size_t)(p1 - p0) * cols * LANES, sizeof(float));
        if (!acc) {
#pragma omp atomic write
            failed = 1;
            continue;
        }
        float xf[e + 1][TOKEN_TILE], uf[cols][TOKEN_TILE];
        for (int t0 = 0; t0 < n; t0 += TOKEN_TILE) {
            const int nt = n - t0 < TOKEN_TILE ? n - t0 : TOKEN_TILE;
            const int nvec = (nt + LANES - 1) / LANES;
            tile_in(xh + (size_t)t0 * d, d, nt, d, &xf[0][0], TOKEN_TILE);
            tile_in(vh + (size_t)t0 * nv, nv, nt, nv, &uf[0][0], TOKEN_TILE);
            memset(xf[d], 0, 2 * sizeof xf[0]); /* the ones row, the zero pair's row */
            memset(uf[nv], 0, (size_t)(cols - nv) * sizeof uf[0]);
            for (int i = 0; i < nt; i++) {
                xf[d][i] = 1.0f;
                if (ones) uf[nv][i] = 1.0f;
            }
            for (int i = 0; mh && i < nt; i++) /* masked tokens: zero features and values */
                if (!mh[t0 + i]) {
                    for (int a = 0; a < e; a++) xf[a][i] = 0.0f;
                    for (int c = 0; c < nu; c++) uf[c][i] = 0.0f;
                }
            for (long p = p0; p < p1; p += 2) {
                const float *xa = xf[pa[p]], *xb = xf[pb[p]];
                const float *ya = xf[pa[p + 1]], *yb = xf[pb[p + 1]];
                float *out = acc + (p - p0) * cols * LANES;
                int c0 = 0;
                for (; c0 + COLS <= nu; c0 += COLS)
                    token_tile(COLS, nvec, xa, xb, ya, yb, uf, c0, cols, out);
                switch (nu - c0) {
                case 1: token_tile(1, nvec, xa, xb, ya, yb, uf, c0, cols, out); break;
                case 2: token_tile(2, nvec, xa, xb, ya, yb, uf, c0, cols, out); break;
                case 3: token_tile(3, nvec, xa, xb, ya, yb, uf, c0, cols, out); break;
                case 4: token_tile(4, nvec, xa, xb, ya, yb, uf, c0, cols, out); break;
                case 5: token_tile(5, nvec, xa, xb, ya, yb, uf, c0, cols, out); break;
                default: break;
                }
            }
        }
        /* weighted lane sums into the packed layout */
        float *sh = state + (size_t)h * rows * cols;
        for (long p = p0; p < p1 && p < total; p++) {
            const float w = (pa[p] == pb[p] && pa[p] < d) ? 0.5f : 1.0f;
            float *out = sh + (size_t)p * cols;
            for (int c = 0; c < cols; c++) {
                const float *a = acc + ((p - p0) * cols + c) * LANES;
                /* a tree: three dependent adds where a loop would chain eight */
                const float sum = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
                out[c] = accumulate ? out[c] + w * sum : w * sum;
            }
        }
        if (p1 >= total) /* the item holding the last pair writes the zero pairs after D */
            memset(sh + (size_t)total * cols, 0, (size_t)(rows - total) * cols * sizeof(float));
        free(acc);
    }
    return failed;
}

/* state (BH, ts_state_rows(d), ts_state_cols(V)) = w_p sum_t f_p(x~_t) u_t, the sum over the
   tokens t with mask[t] != 0 (all when mask is NULL), u_t = [values_t, 1] (ones != 0) or
   values_t, V = nv (+ 1); accumulate != 0 adds the sum to the state instead (the causal
   form's prefix state grows chunk by chunk). Work items: (head, block of pairs), the pairs
   of a head split into blocks when there are fewer heads than threads (no item shares a
   state row, so no reduction). Three ways, by d (docs/cpu-kernel.md, measured there):
   d <= 20 and n >= 192, the tokens in the lanes (state_tokens); d <= 34, per tile of 32
   tokens each token's packed feature row (D floats) formed once, then products of 16 pairs
   x 6 columns over the tile, as in a matrix product with no padding but D's to 16; above,
   row a of the triangle at a time, its features formed per tile (a few hundred pairs per
   row: the padding of each row to 8 costs little). Returns 0, or 1 when its scratch memory
   could not be allocated. No heads (bh = 0, an empty batch): nothing to do (the split
   below divides by bh). */
int ts_state(int bh, int n, int d, const float *x, const float *values, int nv, int ones,
              const uint8_t *mask, float *state, int accumulate, int threads) {
    if (bh <= 0) return 0;
    const int e = d + 1, xs = e + 16, nu = nv + (ones != 0), cols = round_up(nu, COLS);
    const long total = (long)e * (e + 1) / 2, rows = ts_state_rows(d);
    if (d <= TOKENS_MAX_D && n >= TOKENS_MIN_N) {
        short pa[total + 1], pb[total + 1];
        for (int a = 0, p = 0; a < e; a++)
            for (int b = a; b < e; b++, p++) { pa[p] = (short)a; pb[p] = (short)b; }
        pa[total] = pb[total] = (short)e;
        return state_tokens(bh, n, d, x, values, nv, ones, mask, state, accumulate, threads,
                            pa, pb);
    }
    const int packed = round_up((int)total, 2 * LANES) <= PACKED_MAX;
    long off[e + 1], off8[e + 1];
    row_offsets(e, 1, off);
    row_offsets(e, LANES, off8);
    /* the work split: blocks of 16 pairs (packed) or whole rows of the triangle */
    const int units = packed ? round_up((int)total, 2 * LANES) / (2 * LANES) : e;
    int parts = bh >= threads ? 1 : (threads + bh - 1) / bh;
    if (parts > units) parts = units;
    int bound[parts + 1];
    bound[0] = 0;
    for (int r = 1, a = 0; r < parts; r++) {
        if (packed) { bound[r] = (int)((long)units * r / parts); continue; }
        long pairs = 0, goal = (long)r * total / parts; /* rows of about equal pair counts */
        for (a = 0; a < e && pairs < goal; a++) pairs += e - a;
        bound[r] = a > bound[r - 1] ? a : bound[r - 1];
    }
    bound[parts] = units;
    const long items = (long)bh * parts;
    const int fs = (packed ? round_up((int)total, 2 * LANES) : 0) + LANES; /* feature rows */
    int failed = 0;

#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (long item = 0; item < items; item++) {
        const int h = (int)(item / parts), r = (int)(item % parts);
        const int u0 = bound[r], u1 = bound[r + 1];
        if (u0 == u1) continue;
        const float *xh = x + (size_t)h * n * d, *vh = values + (size_t)h * n * nv;
        const uint8_t *mh = mask ? mask + (size_t)h * n : NULL;
        /* the item's pairs [p0, p1) (packed: blocks u0 .. u1 of 16), the rows [a0, a1) that
           hold them; acc (cols, width) has them at p - p0 (packed) or off8[a] - off8[a0] */
        const long p0 = packed ? (long)u0 * 2 * LANES : off[u0];
        const long p1 = packed ? (long)u1 * 2 * LANES : off[u1];
        int a0 = 0, a1 = e;
        if (packed) {
            while (off[a0 + 1] <= p0) a0++;
            a1 = a0;
            while (a1 < e && off[a1] < p1) a1++;
        } else {
            a0 = u0;
            a1 = u1;
        }
        const long width = packed ? p1 - p0 : off8[a1] - off8[a0];
        float *acc = calloc((size_t)cols * width, sizeof(float));
        float *feat = packed ? calloc((size_t)UPDATE_TILE * fs, sizeof(float)) : NULL;
        if (!acc || (packed && !feat)) {
            free(acc);
            free(feat);
#pragma omp atomic write
            failed = 1;
            continue;
        }
        float xt[UPDATE_TILE][xs], ut[UPDATE_TILE][cols];
        memset(xt, 0, sizeof xt);
        for (int t0 = 0; t0 < n; t0 += UPDATE_TILE) {
            const int nt = n - t0 < UPDATE_TILE ? n - t0 : UPDATE_TILE;
            for (int i = 0; i < nt; i++) {
                const int keep = !mh || mh[t0 + i];
                memset(ut[i], 0, cols * sizeof(float));
                if (!keep) { /* zero features and values: a NaN key never reaches the sum */
                    memset(xt[i], 0, sizeof xt[i]);
                    continue;
                }
                memcpy(xt[i], xh + (size_t)(t0 + i) * d, d * sizeof(float));
                xt[i][d] = 1.0f;
                memcpy(ut[i], vh + (size_t)(t0 + i) * nv, nv * sizeof(float));
                if (ones) ut[i][nv] = 1.0f;
            }
            if (packed) {
                for (int i = 0; i < nt; i++)
                    for (int a = a0; a < a1; a++)
                        row_features(xt[i], a, e, feat + (size_t)i * fs + off[a] - off[a0]);
                for (long j = 0; j < width; j += 2 * LANES)
                    update_columns(2, nu, nt, feat + (p0 - off[a0]) + j, fs, &ut[0][0], cols,
                                   acc + j, width);
                continue;
            }
            for (int a = a0; a < a1; a++) {
                const int len = round_up(e - a, LANES);
                float *row = acc + (off8[a] - off8[a0]);
                float ft[UPDATE_TILE][len + LANES];
                for (int i = 0; i < nt; i++) row_features(xt[i], a, e, ft[i]);
                for (int j = 0; j < len; j += 2 * LANES) {
                    if (j + LANES < len)
                        update_columns(2, nu, nt, &ft[0][j], len + LANES, &ut[0][0], cols,
                                       row + j, width);
                    else
                        update_columns(1, nu, nt, &ft[0][j], len + LANES, &ut[0][0], cols,
                                       row + j, width);
                }
            }
        }
        /* weighted, into the packed layout (zero pairs past D and zero columns as padding) */
        float *sh = state + (size_t)h * rows * cols;
        for (int a = a0; a < a1; a++) {
            for (int j = 0; j < e - a; j++) {
                const long p = off[a] + j;
                if (p < p0 || p >= p1) continue;
                const float *col = acc + (packed ? p - p0 : off8[a] - off8[a0] + j);
                float *out = sh + (size_t)p * cols;
                const float w = (j == 0 && a < d) ? 0.5f : 1.0f;
                for (int c = 0; c < cols; c++) {
                    const float sum = w * col[(size_t)c * width];
                    out[c] = accumulate ? out[c] + sum : sum;
                }
            }
        }
        if (p1 >= total) /* the item holding the last pair writes the zero pairs after D */
            memset(sh + (size_t)total * cols, 0, (size_t)(rows - total) * cols * sizeof(float));
        free(feat);
        free(acc);
    }
    return failed;
}
/* One register tile of the readout: Y[t, c0 + c] = sum_p f_p(x~_t) state[p, c0 + c] for the
   16 tokens of a feature-major tile xf and m columns (a constant at each call: 6, or the
   last few), stored feature-major into yt. */
static inline __attribute__((always_inline)) void readout_tile(
    const int m, int e, const float xf[][READ_TILE], const float *sh, const long *off,
    int cols, int c0, float yt[][READ_TILE]) {
    vec s0[COLS], s1[COLS];
    for (int c = 0; c < m; c++) s0[c] = s1[c] = splat(0.0f);
    for (int a = 0; a < e; a++) {
        const vec xa0 = load(xf[a]), xa1 = load(xf[a] + LANES);
        const float *sw = sh + (size_t)off[a] * cols + c0;
        for (int b = a; b < e; b++, sw += cols) {
            const vec f0 = xa0 * load(xf[b]), f1 = xa1 * load(xf[b] + LANES);
#pragma GCC unroll 6
            for (int c = 0; c < m; c++) {
                const vec s = splat(sw[c]);
                s0[c] += f0 * s;
                s1[c] += f1 * s;
            }
        }
    }
    for (int c = 0; c < m; c++) {
        store(yt[c0 + c], s0[c]);
        store(yt[c0 + c] + LANES, s1[c]);
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
    const int e = d + 1, need = ny + (count != NULL); /* columns of Y */
    long off[e + 1];
    row_offsets(e, 1, off);
    const long rows = ts_state_rows(d), tiles = (n + READ_TILE - 1) / READ_TILE;
    const long items = (long)bh * tiles;

#pragma omp parallel for num_threads(threads) schedule(static)
    for (long item = 0; item < items; item++) {
        const int h = (int)(item / tiles), t0 = (int)(item % tiles) * READ_TILE;
        const int nt = n - t0 < READ_TILE ? n - t0 : READ_TILE;
        const float *xh = x + (size_t)h * n * d, *sh = state + (size_t)h * rows * cols;
        float xf[e][READ_TILE], yt[need][READ_TILE]; /* feature-major tile of x~, of Y */
        tile_in(xh + (size_t)t0 * d, d, nt, d, &xf[0][0], READ_TILE);
        for (int i = 0; i < READ_TILE; i++) xf[d][i] = i < nt ? 1.0f : 0.0f;
        int c0 = 0;
        for (; c0 + COLS <= need; c0 += COLS)
            readout_tile(COLS, e, xf, sh, off, cols, c0, yt);
        switch (need - c0) { /* the last columns: as many as there are */
        case 1: readout_tile(1, e, xf, sh, off, cols, c0, yt); break;
        case 2: readout_tile(2, e, xf, sh, off, cols, c0, yt); break;
        case 3: readout_tile(3, e, xf, sh, off, cols, c0, yt); break;
        case 4: readout_tile(4, e, xf, sh, off, cols, c0, yt); break;
        case 5: readout_tile(5, e, xf, sh, off, cols, c0, yt); break;
        default: break;
        }
        const size_t t = (size_t)h * n + t0;
        if (count) {
            const float total = count[h], scale = normalize ? sqrtf(total / (float)d) : 1.0f;
            float f[READ_TILE];
            for (int i = 0; i < nt; i++) {
                den[t + i] = yt[ny][i];
                f[i] = total > 0.0f ? scale / yt[ny][i] : 0.0f;
            }
            tile_out(yt, f, nt, ny, y + t * ny, ny);
        } else {
            tile_out(yt, NULL, nt, ny, y + t * ny, ny);
            for (int i = 0; mask && i < nt; i++)
                if (!mask[t + i]) memset(y + (t + i) * ny, 0, (size_t)ny * sizeof(float));
        }
    }
}

/* gx (BH, N, d) = d/dx_t of sum_c u_t[c] sum_p state[p, c] f_p(x~_t): the first d entries of
   the gradient w.r.t. x~, gx_b = sum_a w_(a,b) x~_a + sum_b' w_(b,b') x~_b' (the pairs
   holding b, in either place), w_p = sum_c state[p, c] u_c (so a diagonal pair counts
   twice: d(x_b^2)/dx_b = 2 x_b). u_t = [values_t, 1] (ones != 0) or values_t, zero for
   masked tokens. Work items: (head, tile of 16 tokens). Per tile: w for every pair in
   register tiles of 6 pairs x 16 tokens over the nu true columns, kept in a per-thread
   (rows, 16) buffer; then each gx_b summed in registers, one store per entry. Returns 0, or
   1 when that buffer could not be allocated. */
int ts_pair_grad(int bh, int n, int d, const float *x, const float *values, int nv, int ones,
                  const uint8_t *mask, const float *state, int cols, float *gx, int threads) {
    const int e = d + 1, nu = nv + (ones != 0);
    const long rows = ts_state_rows(d);
    const long tiles = (n + READ_TILE - 1) / READ_TILE, items = (long)bh * tiles;
    long off[e + 1];
    row_offsets(e, 1, off);
    int failed = 0;

#pragma omp parallel num_threads(threads)
    {
        float *w = malloc((size_t)rows * READ_TILE * sizeof(float)); /* w[p][token] */
#pragma omp for schedule(static)
        for (long item = 0; item < items; item++) {
            if (!w) {
#pragma omp atomic write
                failed = 1;
                continue;
            }
            const int h = (int)(item / tiles), t0 = (int)(item % tiles) * READ_TILE;
            const int nt = n - t0 < READ_TILE ? n - t0 : READ_TILE;
            const float *xh = x + (size_t)h * n * d, *vh = values + (size_t)h * n * nv;
            const float *sh = state + (size_t)h * rows * cols;
            float xf[e][READ_TILE], uf[nu][READ_TILE], g[d][READ_TILE]; /* feature-major */
            tile_in(xh + (size_t)t0 * d, d, nt, d, &xf[0][0], READ_TILE);
            tile_in(vh + (size_t)t0 * nv, nv, nt, nv, &uf[0][0], READ_TILE);
            for (int i = 0; i < READ_TILE; i++) {
                xf[d][i] = i < nt ? 1.0f : 0.0f;
                if (ones) uf[nv][i] = i < nt ? 1.0f : 0.0f;
            }
            for (int i = 0; mask && i < nt; i++) /* masked tokens: u = 0 (NaN values too) */
                if (!mask[(size_t)h * n + t0 + i])
                    for (int c = 0; c < nu; c++) uf[c][i] = 0.0f;
            for (long p0 = 0; p0 < rows; p0 += COLS) {
                const float *pp = sh + (size_t)p0 * cols;
                vec w0[COLS], w1[COLS];
                for (int i = 0; i < COLS; i++) w0[i] = w1[i] = splat(0.0f);
                for (int c = 0; c < nu; c++) {
                    const vec u0 = load(uf[c]), u1 = load(uf[c] + LANES);
#pragma GCC unroll 6
                    for (int i = 0; i < COLS; i++) {
                        const vec s = splat(pp[(size_t)i * cols + c]);
                        w0[i] += s * u0;
                        w1[i] += s * u1;
                    }
                }
                for (int i = 0; i < COLS; i++) {
                    store(w + (p0 + i) * READ_TILE, w0[i]);
                    store(w + (p0 + i) * READ_TILE + LANES, w1[i]);
                }
            }
            for (int b = 0; b < d; b++) { /* four sums per vector: short dependency chains */
                vec g0 = splat(0.0f), g1 = g0, h0 = g0, h1 = g0;
                for (int a = 0; a <= b; a++) { /* pairs (a, b) */
                    const float *wp = w + (off[a] + b - a) * READ_TILE;
                    g0 += load(wp) * load(xf[a]);
                    g1 += load(wp + LANES) * load(xf[a] + LANES);
                }
                const float *wp = w + off[b] * READ_TILE; /* pairs (b, b'), b' >= b */
                for (int c = b; c < e; c++, wp += READ_TILE) {
                    h0 += load(wp) * load(xf[c]);
                    h1 += load(wp + LANES) * load(xf[c] + LANES);
                }
                store(g[b], g0 + h0);
                store(g[b] + LANES, g1 + h1);
            }
            tile_out(g, NULL, nt, d, gx + ((size_t)h * n + t0) * d, d);
        }
        free(w);
    }
    return failed;
}

/* The non-causal forward in one call, in the signature of kernels.h (option not read):
   q' = f_h q / max(|q|, eps) and k' = k / max(|k|, eps) (normalize; else f_h q and k) with
   f_h = factor[h] (factor NULL: the float scalar), the weighted key state, the attended-key
   counts and the finished readout. q (BH, Nq, d), k (BH, Nk, d), v (BH, Nk, V), mask
   (BH, Nk) or NULL. Out: y (BH, Nq, V), den (BH, Nq), count (BH), state
   (BH, ts_state_rows(d), ts_state_cols(V + 1)). q' and k' live in scratch memory for the
   call. Returns 0, or 1 when scratch memory could not be allocated. */
int ts_efficient_forward(int bh, int nq, int nk, int d, int nv, const float *q, const float *k,
                         const float *v, const uint8_t *mask, const float *factor,
                         float scalar, int normalize, float eps, int option, int group,
                         float *y, float *den, float *count, float *state, int threads) {
    (void)option;
    (void)group; /* always 1: grouped non-causal calls stack a group's queries (grouped.py) */
    const size_t nqd = (size_t)bh * nq * d, nkd = (size_t)bh * nk * d;
    float *qp = malloc(sizeof(float) * (nqd + nkd + (bh > 0 ? bh : 1)));
    if (!qp) return 1;
    float *kp = qp + nqd;
    factor = head_factors(bh, factor, scalar, kp + nkd);
    ts_scale_rows(bh, nq, d, q, factor, normalize, eps, qp, threads);
    ts_scale_rows(bh, nk, d, k, NULL, normalize, eps, kp, threads);
    int failed = ts_state(bh, nk, d, kp, v, nv, 1, mask, state, 0, threads);
    for (int h = 0; h < bh; h++) {
        long kept = nk;
        if (mask) {
            kept = 0;
            for (int t = 0; t < nk; t++) kept += mask[(size_t)h * nk + t] != 0;
        }
        count[h] = (float)kept;
    }
    if (!failed)
        ts_readout(bh, nq, d, qp, state, ts_state_cols(nv + 1), y, nv, NULL, count, normalize,
                   den, threads);
    free(qp);
    return failed;
}

/* The non-causal backward in one call, in the signature of kernels.h (option not read):
   from g = dL/dy and the forward's y, den, count and state, the gradients gq (BH, Nq, d),
   gk (BH, Nk, d), gv (BH, Nk, V) and, where gfactor is not NULL, the per-head factor's
   gfactor (BH). The passes of ops/cpu/efficient.py's
   docstring, their operands (q', k', gY', the query state R, dL/dq', dL/dk') in scratch
   memory. Returns 0, or 1 when scratch memory could not be allocated. */
int ts_efficient_backward(int bh, int nq, int nk, int d, int nv, const float *q,
                          const float *k, const float *v, const uint8_t *mask,
                          const float *factor, float scalar, int normalize, float eps,
                          int option, int group, const float *g, const float *y,
                          const float *den, const float *count, float *state, float *gq,
                          float *gk, float *gv, float *gfactor, int threads) {
    (void)option;
    (void)group; /* always 1, as in the forward */
    const int rows = ts_state_rows(d), cols = ts_state_cols(nv + 1);
    const size_t nqd = (size_t)bh * nq * d, nkd = (size_t)bh * nk * d;
    const size_t ngy = (size_t)bh * nq * (nv + 1), nr = (size_t)bh * rows * cols;
    float *qp = malloc(sizeof(float) * (2 * nqd + 2 * nkd + ngy + nr + (bh > 0 ? bh : 1)));
    if (!qp) return 1;
    float *kp = qp + nqd, *gy = kp + nkd, *grad_state = gy + ngy, *g_qp = grad_state + nr;
    float *g_kp = g_qp + nqd;
    factor = head_factors(bh, factor, scalar, g_kp + nkd);
    ts_scale_rows(bh, nq, d, q, factor, normalize, eps, qp, threads);
    ts_scale_rows(bh, nk, d, k, NULL, normalize, eps, kp, threads);
    ts_output_grad(bh, nq, nv, d, g, y, den, count, 0, normalize, gy, threads);
    /* R = c (.) sum_i phi(q'_i)^T gY'_i; dL/dq' through the key state */
    int failed = ts_state(bh, nq, d, qp, gy, nv + 1, 0, NULL, grad_state, 0, threads);
    failed |= ts_pair_grad(bh, nq, d, qp, gy, nv + 1, 0, NULL, state, cols, g_qp, threads);
    if (!failed) { /* g_v = m phi(k') R, dL/dk' through R */
        ts_readout(bh, nk, d, kp, grad_state, cols, gv, nv, mask, NULL, 0, NULL, threads);
        failed |= ts_pair_grad(bh, nk, d, kp, v, nv, 1, mask, grad_state, cols, g_kp,
                               threads);
    }
    if (!failed) {
        failed |= ts_scale_rows_grad(bh, nq, d, q, g_qp, factor, normalize, eps, gq, gfactor,
                                     threads);
        failed |= ts_scale_rows_grad(bh, nk, d, k, g_kp, NULL, normalize, eps, gk, NULL,
                                     threads);
    }
    free(qp);
    return failed;
}
