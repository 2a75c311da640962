/* Prototype of docs/cpu-kernel.md: the efficient form's feature products with the features
   formed inside them, and the backward's dx from a packed state (AVX2 + FMA, OpenMP over
   heads). Not part of the library.

   x~ = [x, 1] (E = d + 1 entries); the pairs p = (a, b), a <= b < E, of x~ x~^T give every
   feature at once (x_a x_b, x_a, 1). Build:
       gcc -O3 -march=native -fopenmp -shared -fPIC -o libkernels.so kernels.c */
#include <immintrin.h>
#include <stddef.h>

/* Padded pair layout of the state: row a (0..E-1) holds pairs (a, b), b = a..E-1, padded
   to a multiple of 8: offset[a] = sum_{a' < a} ceil8(E - a'). */
static int row_off(int E, int a) { int o = 0; for (int i = 0; i < a; i++) o += (E - i + 7) & ~7; return o; }
int padded_pairs(int E) { return row_off(E, E); }

/* ST (cols, P) += sum_t f_p(t) v[t, c] for one head, P = padded_pairs(E). xt: (N, XS)
   token-major rows [x, 1, 0, ...] with XS >= E + 16 (the zeros make padded lanes 0);
   v: (N, cols), cols a multiple of 6. Register tile: 16 pairs x 6 columns (12 ymm). */
void state_update(const float *xt, int N, int E, int XS, const float *v, int cols, float *ST, int P) {
    const int T = 32;  /* tokens per tile: their x~ and v rows stay in L1 (128: 0.7-0.9x) */
    for (int t0 = 0; t0 < N; t0 += T) {
        int t1 = t0 + T < N ? t0 + T : N;
        int off = 0;
        for (int a = 0; a < E; a++) {
            int L = (E - a + 7) & ~7;
            for (int j = 0; j < L; j += 16) {
                int two = (j + 8 < L);
                for (int c0 = 0; c0 < cols; c0 += 6) {
                    __m256 acc0[6], acc1[6];
                    for (int c = 0; c < 6; c++) { acc0[c] = _mm256_setzero_ps(); acc1[c] = _mm256_setzero_ps(); }
                    for (int t = t0; t < t1; t++) {
                        const float *x = xt + (size_t)t * XS;
                        __m256 xa = _mm256_broadcast_ss(x + a);
                        __m256 f0 = _mm256_mul_ps(xa, _mm256_loadu_ps(x + a + j));
                        __m256 f1 = _mm256_mul_ps(xa, _mm256_loadu_ps(x + a + j + 8));
                        const float *vt = v + (size_t)t * cols + c0;
                        #pragma GCC unroll 6
                        for (int c = 0; c < 6; c++) {
                            __m256 vb = _mm256_broadcast_ss(vt + c);
                            acc0[c] = _mm256_fmadd_ps(f0, vb, acc0[c]);
                            acc1[c] = _mm256_fmadd_ps(f1, vb, acc1[c]);
                        }
                    }
                    for (int c = 0; c < 6; c++) {
                        float *s = ST + (size_t)(c0 + c) * P + off + j;
                        _mm256_storeu_ps(s, _mm256_add_ps(_mm256_loadu_ps(s), acc0[c]));
                        if (two) _mm256_storeu_ps(s + 8, _mm256_add_ps(_mm256_loadu_ps(s + 8), acc1[c]));
                    }
                }
            }
            off += L;
        }
    }
}

/* YT (cols, N) = sum_p f_p(t) SW[p, c] for one head. xT: (E, N) feature-major, N a multiple
   of 16; SW: (E(E+1)/2, cols), pairs unpadded in the order (a, b >= a); cols a multiple of
   6. Register tile: 16 tokens x 6 columns (12 ymm). */
void readout(const float *xT, int N, int E, const float *SW, int cols, float *YT) {
    for (int t0 = 0; t0 < N; t0 += 16) {
        for (int c0 = 0; c0 < cols; c0 += 6) {
            __m256 acc0[6], acc1[6];
            for (int c = 0; c < 6; c++) { acc0[c] = _mm256_setzero_ps(); acc1[c] = _mm256_setzero_ps(); }
            const float *sw = SW;
            for (int a = 0; a < E; a++) {
                __m256 xa0 = _mm256_loadu_ps(xT + (size_t)a * N + t0);
                __m256 xa1 = _mm256_loadu_ps(xT + (size_t)a * N + t0 + 8);
                for (int b = a; b < E; b++) {
                    __m256 f0 = _mm256_mul_ps(xa0, _mm256_loadu_ps(xT + (size_t)b * N + t0));
                    __m256 f1 = _mm256_mul_ps(xa1, _mm256_loadu_ps(xT + (size_t)b * N + t0 + 8));
                    #pragma GCC unroll 6
                    for (int c = 0; c < 6; c++) {
                        __m256 s = _mm256_broadcast_ss(sw + c0 + c);
                        acc0[c] = _mm256_fmadd_ps(f0, s, acc0[c]);
                        acc1[c] = _mm256_fmadd_ps(f1, s, acc1[c]);
                    }
                    sw += cols;
                }
            }
            for (int c = 0; c < 6; c++) {
                _mm256_storeu_ps(YT + (size_t)(c0 + c) * N + t0, acc0[c]);
                _mm256_storeu_ps(YT + (size_t)(c0 + c) * N + t0 + 8, acc1[c]);
            }
        }
    }
}

/* batched over heads with OpenMP */
void state_update_b(int H, const float *xt, int N, int E, int XS, const float *v, int cols, float *ST, int P) {
    #pragma omp parallel for schedule(static)
    for (int h = 0; h < H; h++)
        state_update(xt + (size_t)h * N * XS, N, E, XS, v + (size_t)h * N * cols, cols, ST + (size_t)h * cols * P, P);
}
void readout_b(int H, const float *xT, int N, int E, const float *SW, int Pu, int cols, float *YT) {
    #pragma omp parallel for schedule(static)
    for (int h = 0; h < H; h++)
        readout(xT + (size_t)h * E * N, N, E, SW + (size_t)h * Pu * cols, cols, YT + (size_t)h * cols * N);
}

/* GX (E + 8, N) += d/dx~ of sum_c g[c] sum_p P[p, c] f_p(x~) for one head, i.e.
   gx_a = sum_b (sum_c P[(a, b), c] g_c) x_b, both orders of each pair (the diagonal pair
   thus counts twice, as d(x_a^2)/dx_a = 2 x_a). XC: (E + 8, N) feature-major x~ with zero
   rows past E; GC: (cols, N) feature-major gradient; P6: the packed state with each row a
   of the triangle padded with zero pairs to a multiple of 6, (sum_a ceil6(E - a), cols).
   N a multiple of 16. Register tile: 6 pairs x 16 tokens (12 ymm). */
void pair_grad(const float *XC, int N, int E, const float *GC, int cols, const float *P6,
               float *GX) {
    float buf[(E + 8) * 16];
    for (int t0 = 0; t0 < N; t0 += 16) {
        for (int i = 0; i < (E + 8) * 16; i++) buf[i] = 0.0f;
        const float *pp = P6;
        for (int a = 0; a < E; a++) {
            __m256 xa0 = _mm256_loadu_ps(XC + (size_t)a * N + t0);
            __m256 xa1 = _mm256_loadu_ps(XC + (size_t)a * N + t0 + 8);
            __m256 ga0 = _mm256_setzero_ps(), ga1 = _mm256_setzero_ps();
            int L = (E - a + 5) / 6 * 6;
            for (int b0 = a; b0 < a + L; b0 += 6) {
                __m256 u0[6], u1[6];
                for (int i = 0; i < 6; i++) { u0[i] = _mm256_setzero_ps(); u1[i] = _mm256_setzero_ps(); }
                for (int c = 0; c < cols; c++) {
                    __m256 g0 = _mm256_loadu_ps(GC + (size_t)c * N + t0);
                    __m256 g1 = _mm256_loadu_ps(GC + (size_t)c * N + t0 + 8);
                    #pragma GCC unroll 6
                    for (int i = 0; i < 6; i++) {
                        __m256 s = _mm256_broadcast_ss(pp + (size_t)i * cols + c);
                        u0[i] = _mm256_fmadd_ps(s, g0, u0[i]);
                        u1[i] = _mm256_fmadd_ps(s, g1, u1[i]);
                    }
                }
                #pragma GCC unroll 6
                for (int i = 0; i < 6; i++) {
                    int b = b0 + i;
                    ga0 = _mm256_fmadd_ps(u0[i], _mm256_loadu_ps(XC + (size_t)b * N + t0), ga0);
                    ga1 = _mm256_fmadd_ps(u1[i], _mm256_loadu_ps(XC + (size_t)b * N + t0 + 8), ga1);
                    float *row = buf + b * 16;
                    _mm256_storeu_ps(row, _mm256_fmadd_ps(u0[i], xa0, _mm256_loadu_ps(row)));
                    _mm256_storeu_ps(row + 8, _mm256_fmadd_ps(u1[i], xa1, _mm256_loadu_ps(row + 8)));
                }
                pp += 6 * cols;
            }
            float *row = buf + a * 16;
            _mm256_storeu_ps(row, _mm256_add_ps(ga0, _mm256_loadu_ps(row)));
            _mm256_storeu_ps(row + 8, _mm256_add_ps(ga1, _mm256_loadu_ps(row + 8)));
        }
        for (int a = 0; a < E; a++)
            for (int i = 0; i < 16; i++) GX[(size_t)a * N + t0 + i] += buf[a * 16 + i];
    }
}

void pair_grad_b(int H, const float *XC, int N, int E, const float *GC, int cols,
                 const float *P6, int P6rows, float *GX) {
    #pragma omp parallel for schedule(static)
    for (int h = 0; h < H; h++)
        pair_grad(XC + (size_t)h * (E + 8) * N, N, E, GC + (size_t)h * cols * N, cols,
                  P6 + (size_t)h * P6rows * cols, GX + (size_t)h * (E + 8) * N);
}
