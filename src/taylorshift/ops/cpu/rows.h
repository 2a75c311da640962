/* The map x -> x' of one row in front of the feature products (s = q'.k') and its backward,
   shared by the C files: x' = f x / max(|x|, eps) (normalize) or f x. */
#ifndef TAYLORSHIFT_ROWS_H
#define TAYLORSHIFT_ROWS_H
#include <math.h>

/* The query factors per head: factor (BH) itself, or heads[h] = scalar where factor is NULL
   (heads: BH floats of the caller's scratch memory). */
static inline const float *head_factors(int bh, const float *factor, float scalar,
                                        float *heads) {
    if (factor) return factor;
    for (int h = 0; h < bh; h++) heads[h] = scalar;
    return heads;
}

/* out (d) = x', f the row's factor (the temperature per head, or 1). */
static inline void scale_row(int d, const float *x, float f, int normalize, float eps,
                             float *out) {
    if (normalize) {
        float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
        for (int a = 0; a < d; a++) sq += x[a] * x[a];
        const float norm = sqrtf(sq);
        f /= norm > eps ? norm : eps;
    }
    for (int a = 0; a < d; a++) out[a] = f * x[a];
}

/* gx (d) = dL/dx from gp = dL/dx'. With g = f gp and u = x / max(|x|, eps):
   gx = (g - u (u.g)) / |x| where |x| > eps, g / eps below (the norm is the constant eps
   there); without normalize gx = f gp. Returns the row's share of dL/df: gp.u (normalize)
   or gp.x. */
static inline double scale_row_grad(int d, const float *x, const float *gp, float f,
                                    int normalize, float eps, float *gx) {
    if (!normalize) {
        double sum = 0.0;
#pragma omp simd reduction(+ : sum)
        for (int a = 0; a < d; a++) { gx[a] = f * gp[a]; sum += gp[a] * x[a]; }
        return sum;
    }
    float sq = 0.0f, dot = 0.0f; /* |x|^2, x.gp */
#pragma omp simd reduction(+ : sq, dot)
    for (int a = 0; a < d; a++) { sq += x[a] * x[a]; dot += gp[a] * x[a]; }
    const float norm = sqrtf(sq), floor = norm > eps ? norm : eps;
    dot /= floor; /* u.gp */
    const float along = norm > eps ? f * dot : 0.0f; /* u.g */
    for (int a = 0; a < d; a++) gx[a] = (f * gp[a] - along * (x[a] / floor)) / floor;
    return dot;
}
#endif
