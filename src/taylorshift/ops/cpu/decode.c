/* The decoding step of causal TaylorShift on the CPU (ops/cpu/decode.py): one new token per
   head, the state updated and read in one pass. Built with the other kernels
   (ops/cpu/build.py). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "rows.h"
#include "vectors.h"

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
   it is in registers. */

/* Rows of V + 1 >= LANES floats are swept in column tiles of at most TILE_VECS vectors,
   whose sums Y stay in registers for the whole sweep (docs/cpu-kernel.md): a tile of width
   tw has vectors at 0, 8, ..., and its last at tw - 8, which overlaps the one before when tw
   is not a multiple of 8. The overlapped columns are then computed twice from the same
   floats by the same operations: both copies are equal, and stored twice. Narrower rows
   take row_narrow. */
enum { TILE_VECS = 5 };

/* One state row of a tile, s at the tile's first column: s += fk u, then query g's sums
   acc[g] += fq[g] s, the row still in registers. */
static inline __attribute__((always_inline)) void tile_row(
    const int nvec, const int groups, const int *off, float fk, const float *fq,
    const vec *uv, float *s, vec (*acc)[TILE_VECS]) {
    vec sv[TILE_VECS];
    for (int j = 0; j < nvec; j++) sv[j] = load(s + off[j]);
    for (int j = 0; j < nvec; j++) sv[j] += splat(fk) * uv[j];
    for (int j = 0; j < nvec; j++) store(s + off[j], sv[j]);
    for (int g = 0; g < groups; g++)
        for (int j = 0; j < nvec; j++) acc[g][j] += splat(fq[g]) * sv[j];
}

/* The sweep of one tile, columns [c0, c0 + tw) of every row of the state s, for the group's
   queries qx (groups x d): Y of query g into y + g * width. */
static inline __attribute__((always_inline)) void tile_sweep(
    const int nvec, const int groups, int d, int width, int c0, int tw, const float *qx,
    const float *kx, const float *u, float *s, float *y) {
    int off[TILE_VECS];
    vec uv[TILE_VECS], acc[groups][TILE_VECS];
    float fq[groups];
    for (int j = 0; j < nvec; j++) {
        off[j] = j < nvec - 1 ? j * LANES : tw - LANES;
        uv[j] = load(u + c0 + off[j]);
        for (int g = 0; g < groups; g++) acc[g][j] = splat(0.0f);
    }
    s += c0;
    for (int a = 0; a < d; a++) {
        for (int g = 0; g < groups; g++) fq[g] = 0.5f * qx[g * d + a] * qx[g * d + a];
        tile_row(nvec, groups, off, kx[a] * kx[a], fq, uv, s, acc);
        s += width;
        for (int b = a + 1; b < d; b++, s += width) {
            for (int g = 0; g < groups; g++) fq[g] = qx[g * d + a] * qx[g * d + b];
            tile_row(nvec, groups, off, kx[a] * kx[b], fq, uv, s, acc);
        }
    }
    for (int a = 0; a < d; a++, s += width) {
        for (int g = 0; g < groups; g++) fq[g] = qx[g * d + a];
        tile_row(nvec, groups, off, kx[a], fq, uv, s, acc);
    }
    for (int g = 0; g < groups; g++) fq[g] = 1.0f;
    tile_row(nvec, groups, off, 1.0f, fq, uv, s, acc);
    for (int g = 0; g < groups; g++)
        for (int j = 0; j < nvec; j++) store(y + (size_t)g * width + c0 + off[j], acc[g][j]);
}

/* The sweeps of one state: tiles of balanced widths, each at least LANES floats. Inlined
   at each call: called with groups == 1, the compiler knows the group's size and keeps the
   sums in registers. */
#define SWEEP(nvec) tile_sweep(nvec, groups, d, width, c0, tw, qx, kx, u, s, y)
static inline __attribute__((always_inline)) void sweep_tiles(
    const int groups, int d, int width, const float *qx, const float *kx, const float *u,
    float *s, float *y) {
    const int tiles = (width + TILE_VECS * LANES - 1) / (TILE_VECS * LANES);
    for (int t = 0, c0 = 0; t < tiles; t++) {
        const int tw = (width - c0) / (tiles - t);
        switch ((tw + LANES - 1) / LANES) {
        case 1: SWEEP(1); break;
        case 2: SWEEP(2); break;
        case 3: SWEEP(3); break;
        case 4: SWEEP(4); break;
        default: SWEEP(5); break;
        }
        c0 += tw;
    }
}
#undef SWEEP

/* A row narrower than LANES floats (V < 7): updated once, then read by each query. */
static inline void row_narrow(int width, int groups, float fk, const float *fq,
                              const float *restrict u, float *restrict s, float *restrict y) {
    for (int c = 0; c < width; c++) s[c] += fk * u[c];
    for (int g = 0; g < groups; g++)
        for (int c = 0; c < width; c++) y[(size_t)g * width + c] += fq[g] * s[c];
}

static void sweep_narrow(int d, int width, int groups, const float *qx, const float *kx,
                         const float *u, float *s, float *y) {
    float fq[groups];
    for (int a = 0; a < d; a++) {
        for (int g = 0; g < groups; g++) fq[g] = 0.5f * qx[g * d + a] * qx[g * d + a];
        row_narrow(width, groups, kx[a] * kx[a], fq, u, s, y);
        s += width;
        for (int b = a + 1; b < d; b++, s += width) {
            for (int g = 0; g < groups; g++) fq[g] = qx[g * d + a] * qx[g * d + b];
            row_narrow(width, groups, kx[a] * kx[b], fq, u, s, y);
        }
    }
    for (int a = 0; a < d; a++, s += width) {
        for (int g = 0; g < groups; g++) fq[g] = qx[g * d + a];
        row_narrow(width, groups, kx[a], fq, u, s, y);
    }
    for (int g = 0; g < groups; g++) fq[g] = 1.0f;
    row_narrow(width, groups, 1.0f, fq, u, s, y);
}

void ts_decode_step(int bh, int groups, int d, int nv, const float *q, const float *k,
                    const float *v, const float *factor, float scalar, const uint8_t *real,
                    int normalize, float eps, float *state, float *count, float *out,
                    int threads) {
    const int width = nv + 1;
    const long rows = (long)d * (d + 1) / 2 + d + 1;
#pragma omp parallel for num_threads(bh > 1 ? threads : 1) schedule(static)
    for (int h = 0; h < bh; h++) {
        float qx[groups * d], kx[d], u[width], y[groups * width];
        for (int g = 0; g < groups; g++) {
            const size_t r = (size_t)h * groups + g;
            scale_row(d, q + r * d, factor ? factor[r] : scalar, normalize, eps, qx + g * d);
        }
        /* the new token: k' and [v, 1], both zero for a padded token (its key, NaN say,
           never reaches S), and the count one more for a real one */
        const int add = !real || real[h];
        if (add) scale_row(d, k + (size_t)h * d, 1.0f, normalize, eps, kx);
        else memset(kx, 0, sizeof kx);
        for (int c = 0; c < nv; c++) u[c] = add ? v[(size_t)h * nv + c] : 0.0f;
        u[nv] = add ? 1.0f : 0.0f;
        if (add) count[h] += 1.0f;
        float *s = state + (size_t)h * rows * width;
        if (width < LANES) {
            memset(y, 0, sizeof y);
            sweep_narrow(d, width, groups, qx, kx, u, s, y);
        } else if (groups == 1) {
            sweep_tiles(1, d, width, qx, kx, u, s, y);
        } else {
            sweep_tiles(groups, d, width, qx, kx, u, s, y);
        }
        const float total = count[h];
        for (int g = 0; g < groups; g++) {
            const float *yg = y + (size_t)g * width;
            const float f = total > 0.0f
                ? (normalize ? sqrtf(total / (float)d) : 1.0f) / yg[nv] : 0.0f;
            float *o = out + ((size_t)h * groups + g) * nv;
            for (int c = 0; c < nv; c++) o[c] = yg[c] * f;
        }
    }
}
