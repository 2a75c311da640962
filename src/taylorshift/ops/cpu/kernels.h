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

/* direct.c: the direct form's tiles; raw: the causal efficient form's intra-chunk block */
int direct_forward(int bh, int nq, int nk, int d, int nv, const float *q, const float *k,
                   const float *v, const uint8_t *mask, const float *factor, float scalar,
                   int causal, int normalize, float eps, int raw, float *y, float *den,
                   float *count, int threads);
int direct_backward(int bh, int nq, int nk, int d, int nv, const float *q, const float *k,
                    const float *v, const uint8_t *mask, const float *factor, float scalar,
                    int causal, int normalize, float eps, int raw, const float *g,
                    const float *y, const float *den, const float *count, float *gq, float *gk,
                    float *gv, float *gfactor, int threads);

/* The passes Python calls (ops/cpu/wrapper.py), one signature for the three forms: ts_X_forward
   and ts_X_backward with X = efficient (efficient.c), causal (efficient_causal.c), direct
   (direct.c). Heads flattened, float32, contiguous: q (BH, Nq, d), k (BH, Nk, d),
   v (BH, Nk, V); mask (BH, Nk) uint8 or NULL; factor (BH), the query's factor per head, or
   NULL for the float scalar; option, the form's one integer (causal: tokens per chunk, its
   forward's negated where the state after the block is not wanted;
   direct: causal 0 or 1; efficient: not read); group, the query heads per key/value head of
   grouped-query attention (causal form only, key, value and mask then with BH / group
   heads; the others take 1). The forward writes y (BH, Nq, V), den (BH, Nq), count ((BH)
   for the efficient form, else (BH, Nq)) and, efficient form only, the key state
   (BH, ts_state_rows(d), ts_state_cols(V + 1)); the causal form reads state, where it is
   not NULL, as the prefix before the block (per key/value head) and leaves the state after
   the block there; the direct form does not read it. The backward reads g = dL/dy and the
   forward's outputs and writes gq, gk, gv in the inputs' shapes and, where gfactor is not
   NULL, gfactor (BH); the efficient form reads the forward's state, the causal form, where
   state is not NULL, the prefix the forward started from, and overwrites it with the
   gradient w.r.t. it. Each returns 0, or 1 when scratch memory could not be allocated. */
#define TS_FORWARD(name)                                                                      \
    int name(int bh, int nq, int nk, int d, int nv, const float *q, const float *k,           \
             const float *v, const uint8_t *mask, const float *factor, float scalar,          \
             int normalize, float eps, int option, int group, float *y, float *den,           \
             float *count, float *state, int threads)
#define TS_BACKWARD(name)                                                                     \
    int name(int bh, int nq, int nk, int d, int nv, const float *q, const float *k,           \
             const float *v, const uint8_t *mask, const float *factor, float scalar,          \
             int normalize, float eps, int option, int group, const float *g, const float *y, \
             const float *den, const float *count, float *state, float *gq, float *gk,        \
             float *gv, float *gfactor, int threads)
TS_FORWARD(ts_efficient_forward);
TS_BACKWARD(ts_efficient_backward);
TS_FORWARD(ts_causal_forward);
TS_BACKWARD(ts_causal_backward);
TS_FORWARD(ts_direct_forward);
TS_BACKWARD(ts_direct_backward);
#endif
