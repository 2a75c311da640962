/* Vectors of 8 floats for the C kernels (GCC/Clang vector extensions: AVX2 + FMA here,
   AVX-512, two SSE or NEON registers elsewhere), their loads and stores, and the 8 x 8
   transpose of the efficient form's tiles. Shared by efficient.c and direct.c. */
#ifndef TAYLORSHIFT_VECTORS_H
#define TAYLORSHIFT_VECTORS_H
#include <string.h>

typedef float vec __attribute__((vector_size(32)));
enum { LANES = 8 /* floats per vector */ };

static inline vec load(const float *p) { vec v; memcpy(&v, p, sizeof v); return v; }
static inline void store(float *p, vec v) { memcpy(p, &v, sizeof v); }
static inline vec splat(float s) { return (vec){s, s, s, s, s, s, s, s}; }
/* Keep v in a register: without it the compiler may fold v's load into both of the
   multiply-adds that read it, one load each, which leaves the loop bound by loads (an empty
   asm statement that takes and returns v in a vector register; where 8 floats fill no one
   register, without AVX, a no-op). */
#if defined(__AVX__)
#define in_register(v) __asm__("" : "+x"(v))
#else
#define in_register(v) ((void)0)
#endif

/* 8 x 8 transposes between token rows and the feature-major tiles of the readout and the
   pair gradient: r[j] becomes column j of the rows r[0..7], in three rounds of two-vector
   shuffles (unpack pairs, then quads, then 128-bit halves). 24 shuffles move 64 floats that
   one-float copies moved with 64 loads and 64 stores: at d = 16 those copies took about a
   quarter of the pair gradient's time (docs/cpu-kernel.md). */
#if defined(__clang__)
#define shuffle2(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
typedef int ivec __attribute__((vector_size(32)));
#define shuffle2(a, b, ...) __builtin_shuffle(a, b, (ivec){__VA_ARGS__})
#endif
static inline void transpose8(vec r[LANES]) {
    vec t[LANES], u[LANES];
    for (int i = 0; i < LANES; i += 2) {
        t[i] = shuffle2(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        t[i + 1] = shuffle2(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    }
    for (int i = 0; i < LANES; i += 4) {
        u[i] = shuffle2(t[i], t[i + 2], 0, 1, 8, 9, 4, 5, 12, 13);
        u[i + 1] = shuffle2(t[i], t[i + 2], 2, 3, 10, 11, 6, 7, 14, 15);
        u[i + 2] = shuffle2(t[i + 1], t[i + 3], 0, 1, 8, 9, 4, 5, 12, 13);
        u[i + 3] = shuffle2(t[i + 1], t[i + 3], 2, 3, 10, 11, 6, 7, 14, 15);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = shuffle2(u[i], u[i + 4], 0, 1, 2, 3, 8, 9, 10, 11);
        r[i + 4] = shuffle2(u[i], u[i + 4], 4, 5, 6, 7, 12, 13, 14, 15);
    }
}

#endif
