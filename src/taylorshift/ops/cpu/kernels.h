/* The kernels' entry points shared between the C files (efficient.c, direct.c,
   efficient_causal.c): each file includes it, so the compiler checks every definition
   against the declaration the others call. The contracts are at the definitions. */
#ifndef TAYLORSHIFT_KERNELS_H
#define TAYLORSHIFT_KERNELS_H
#include <stdint.h>

/* efficient.c */
int ts_state_rows(int d);
int ts_state_cols(int v);
int ts_state(int bh, int n, int d, const float *x, const float *values, int nv, int ones,
             const uint8_t *mask, float *state, int accumulate, int threads);
void ts_readout(int bh, int n, int d, const float *x, const float *state, int cols, float *y,
                int ny, const uint8_t *mask, const float *count, int normalize, float *den,
                int threads);
int ts_pair_grad(int bh, int n, int d, const float *x, const float *values, int nv, int ones,
                 const uint8_t *mask, const float *state, int cols, float *gx, int threads);
void ts_scale_rows(int bh, int n, int d, const float *x, const float *factor, int normalize,
                   float eps, float *xp, int threads);
int ts_scale_rows_grad(int bh, int n, int d, const float *x, const float *gp,
                       const float *factor, int normalize, float eps, float *gx,
                       float *gfactor, int threads);
void ts_output_grad(int bh, int n, int nv, int d, const float *g, const float *y,
                    const float *den, const float *count, int per_row, int normalize,
                    float *gy, int threads);

/* direct.c */
int ts_direct_forward(int bh, int nq, int nk, int d, int nv, const float *q, const float *k,
                      const float *v, const float *factor, const uint8_t *mask, int causal,
                      int normalize, float eps, int raw, float *y, float *den, float *count,
                      int threads);
int ts_direct_backward(int bh, int nq, int nk, int d, int nv, const float *q, const float *k,
                       const float *v, const float *factor, const uint8_t *mask, int causal,
                       int normalize, float eps, int raw, const float *g, const float *y,
                       const float *den, const float *count, float *gq, float *gk, float *gv,
                       float *gfactor, int threads);
#endif
