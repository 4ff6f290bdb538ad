/*
 * transpose_avx512.h — the 16 x 16 transpose of 32-bit values held in 16 zmm registers, for
 * the tables compiled with AVX-512F (the AVX-512 bias entry turns a tile of scores around; the
 * AMX table turns the weights into the unit's A tiles). Data movement only: the bits of every
 * value are kept.
 */
#ifndef SDPA_KERNELS_TRANSPOSE_AVX512_H
#define SDPA_KERNELS_TRANSPOSE_AVX512_H

#include <immintrin.h>

/* t[c] = column c of the 16 x 16 values t[r] (lane c of row r), in place: 56 shuffles. */
static inline __attribute__((always_inline)) void sdpa__transpose16_avx512(__m512 t[16]) {
    __m512 u[16];
    for (int k = 0; k < 8; k++) { /* per 128-bit lane L: (a0 b0 a1 b1), (a2 b2 a3 b3) */
        u[2 * k] = _mm512_unpacklo_ps(t[2 * k], t[2 * k + 1]);
        u[2 * k + 1] = _mm512_unpackhi_ps(t[2 * k], t[2 * k + 1]);
    }
    for (int k = 0; k < 4; k++) { /* t[4k + e], lane L: rows 4k..4k+3 at column 4L + e */
        t[4 * k] = _mm512_shuffle_ps(u[4 * k], u[4 * k + 2], _MM_SHUFFLE(1, 0, 1, 0));
        t[4 * k + 1] = _mm512_shuffle_ps(u[4 * k], u[4 * k + 2], _MM_SHUFFLE(3, 2, 3, 2));
        t[4 * k + 2] = _mm512_shuffle_ps(u[4 * k + 1], u[4 * k + 3], _MM_SHUFFLE(1, 0, 1, 0));
        t[4 * k + 3] = _mm512_shuffle_ps(u[4 * k + 1], u[4 * k + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int e = 0; e < 4; e++) { /* column 4L + e: lane L of t[e], t[4+e], t[8+e], t[12+e] */
        const __m512 a0 = _mm512_shuffle_f32x4(t[e], t[4 + e], 0x88); /* lanes 0, 2 */
        const __m512 a1 = _mm512_shuffle_f32x4(t[e], t[4 + e], 0xdd); /* lanes 1, 3 */
        const __m512 b0 = _mm512_shuffle_f32x4(t[8 + e], t[12 + e], 0x88);
        const __m512 b1 = _mm512_shuffle_f32x4(t[8 + e], t[12 + e], 0xdd);
        u[e] = _mm512_shuffle_f32x4(a0, b0, 0x88);
        u[4 + e] = _mm512_shuffle_f32x4(a1, b1, 0x88);
        u[8 + e] = _mm512_shuffle_f32x4(a0, b0, 0xdd);
        u[12 + e] = _mm512_shuffle_f32x4(a1, b1, 0xdd);
    }
    for (int c = 0; c < 16; c++)
        t[c] = u[c];
}

#endif
