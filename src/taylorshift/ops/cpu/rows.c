/* The O(N d) row passes around the efficient form's feature products (ops/cpu/efficient.c,
   efficient_causal.c): q' and k' from q and k, their backward with the temperature's
   gradient per head, and the gradient of the output's [numerator, denominator]. The
   per-row maps are rows.h's. */
#include <math.h>
#include <stdlib.h>

#include "kernels.h"
#include "rows.h"

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
   256 tokens), partial sums added per head. Returns 0, or 1 when the partial sums could not
   be allocated. */
int ts_scale_rows_grad(int bh, int n, int d, const float *x, const float *gp,
                        const float *factor, int normalize, float eps, float *gx,
                        float *gfactor, int threads) {
    const int block = 256;
    const long blocks = (n + block - 1) / block, items = (long)bh * blocks;
    double *part = gfactor ? calloc((size_t)(items > 0 ? items : 1), sizeof(double)) : NULL;
    if (gfactor && !part) return 1;
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
    return 0;
}

/* gy (BH, N, nv + 1) = the gradient w.r.t. Y' = [numerator, denominator] from g = dL/dy,
   y = numerator f / den with f = sqrt(count / d) (normalize) or 1: columns :nv are
   g f / den, column nv is -(g.y) / den; zero rows where count == 0. count holds one value
   per head, count[h] (per_row 0: the non-causal form), or one per token, count[h * N + t]
   (per_row 1: the causal form's n_i). */
void ts_output_grad(int bh, int n, int nv, int d, const float *g, const float *y,
                    const float *den, const float *count, int per_row, int normalize,
                    float *gy, int threads) {
    const long rows = (long)bh * n;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long r = 0; r < rows; r++) {
        const float total = count[per_row ? r : r / n];
        const float *gr = g + (size_t)r * nv, *yr = y + (size_t)r * nv;
        float *out = gy + (size_t)r * (nv + 1);
        const float inv = total > 0.0f ? 1.0f / den[r] : 0.0f;
        const float f = normalize ? inv * sqrtf(total / (float)d) : inv;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int c = 0; c < nv; c++) { out[c] = gr[c] * f; dot += gr[c] * yr[c]; }
        out[nv] = -dot * inv;
    }
}
