/*
 * simd_avx2.h — what the AVX2 table's files (ukernels_avx2.c, decode_avx2.c) share: the exp,
 * the widening of f16 and bf16 elements in registers, and the addresses of elements and of
 * rows ahead. Static inline functions only, for files compiled with the table's AVX2, FMA and
 * F16C flags.
 *
 * exp (the softmax's, the most frequent operation after the products): x is clamped to
 * [-87, 88], k = round(8x / ln2) is read off the low mantissa bits of one FMA with 1.5 * 2^23,
 * r = x - k ln2/8 (Cody-Waite, ln2/8 in two parts, so |r| <= ln2/16) and
 * e^x = 2^(k div 8) * 2^((k mod 8)/8) * e^r, with e^r - 1 by a degree-4 Taylor polynomial
 * (truncation < 2e-9 relative), 2^((k mod 8)/8) from an 8-entry table in a register (vpermps)
 * and 2^(k div 8) added to the exponent field as an integer. That is 8 FMA-unit operations
 * per vector instead of the 12 of a degree-7 polynomial over |r| <= ln2/2 scaled by a built
 * 2^k: the FMA units are the products' bottleneck. Values below e^-87 (about 1.6e-38) are
 * returned as e^-87, an absolute error far below anything a softmax can see; every result is
 * a normal float. NaN propagates, whatever its payload. Relative error within 2 ulp on
 * [-87, 0] (tests/test_flash.c checks it; measured 0.88).
 */
#ifndef SDPA_KERNELS_SIMD_AVX2_H
#define SDPA_KERNELS_SIMD_AVX2_H

#include "../ukernels.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

/* e^x for n vectors at once, step by step across them, so that the polynomial's dependent
 * FMAs of one vector are separated by those of the others (one vector alone is a chain of
 * latencies that the out-of-order window cannot cover). See the file's head for the method. */
INLINE void exp256_n(int n, __m256 *x) {
    const __m256 magic = _mm256_set1_ps(12582912.0f); /* 1.5 * 2^23 */
    __m256i t[4];
    __m256 r[4], q[4];
    for (int i = 0; i < n; i++) {
        /* min/max return their second operand when either is NaN: x stays NaN (see below) */
        x[i] = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(_mm256_set1_ps(-87.0f), x[i]));
        /* k = round(8 x / ln2) sits in the low mantissa bits of x 8/ln2 + 1.5 * 2^23 */
        const __m256 kf = _mm256_fmadd_ps(x[i], _mm256_set1_ps(11.5415603271117073f), magic);
        t[i] = _mm256_castps_si256(kf);
        const __m256 k = _mm256_sub_ps(kf, magic);
        r[i] = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.086669921875f), x[i]); /* ln2/8, 12 bits */
        r[i] = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.65243080e-5f), r[i]); /* ... the rest */
    }
    for (int i = 0; i < n; i++)
        q[i] = _mm256_fmadd_ps(_mm256_set1_ps(1.0f / 24.0f), r[i], _mm256_set1_ps(1.0f / 6.0f));
    for (int i = 0; i < n; i++)
        q[i] = _mm256_fmadd_ps(q[i], r[i], _mm256_set1_ps(0.5f));
    for (int i = 0; i < n; i++)
        q[i] = _mm256_fmadd_ps(q[i], r[i], _mm256_set1_ps(1.0f));
    for (int i = 0; i < n; i++)
        q[i] = _mm256_mul_ps(q[i], r[i]); /* e^r - 1 */
    const __m256 two_k8 =
        _mm256_setr_ps(1.0f, 1.09050773266525766f, 1.18920711500272107f, 1.29683955465100967f,
                       1.41421356237309505f, 1.54221082540794082f, 1.68179283050742909f,
                       1.83400808640934246f); /* 2^(i/8) */
    for (int i = 0; i < n; i++) {
        /* 2^(k mod 8 / 8) by the low 3 bits of k, 2^(k div 8) added to the exponent field */
        const __m256 f = _mm256_permutevar8x32_ps(two_k8, t[i]);
        const __m256 y = _mm256_fmadd_ps(f, q[i], f);
        const __m256i e =
            _mm256_and_si256(_mm256_slli_epi32(t[i], 20), _mm256_set1_epi32((int)0xff800000u));
        /* a NaN's payload bits would have reached e: it is made NaN again here */
        const __m256 nan = _mm256_cmp_ps(x[i], x[i], _CMP_UNORD_Q);
        x[i] = _mm256_or_ps(nan, _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(y), e)));
    }
}

/* Eight halves of type elem (f16 or bf16) widened to f32 exactly. */
INLINE __m256 widen8(int elem, __m128i h) {
    if (elem == SDPA__ELEM_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* 8 consecutive elements of type elem (a compile-time constant where this is inlined) at
 * element index i of base, widened to f32: the qk_few and P V loops read a half-precision
 * cache in place with it. */
INLINE __m256 load8(int elem, const void *base, int64_t i) {
    if (elem == SDPA__ELEM_F32)
        return _mm256_loadu_ps((const float *)base + i);
    return widen8(elem, _mm_loadu_si128((const __m128i *)((const uint16_t *)base + i)));
}

/* The lanes of dm of load8 (the others 0), reading nothing beyond them. */
INLINE __m256 load8_tail(int elem, const void *base, int64_t i, __m256i dm) {
    if (elem == SDPA__ELEM_F32)
        return _mm256_maskload_ps((const float *)base + i, dm);
    const int n = __builtin_popcount((unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(dm)));
    uint16_t t[8] = {0};
    memcpy(t, (const uint16_t *)base + i, (size_t)n * sizeof *t);
    return widen8(elem, _mm_loadu_si128((const __m128i *)t));
}

/* The address of element i of base, of type elem. */
INLINE const char *elem_at(int elem, const void *base, int64_t i) {
    return (const char *)base + i * (elem == SDPA__ELEM_F32 ? 4 : 2);
}

/* Where row i of a slice of nk rows (stride ld elements) starts, for a request ahead: the rows
 * past the slice's continue at `next` (ukernels.h). */
INLINE const char *row_ahead(int elem, const void *base, const void *next, int64_t nk, int64_t i,
                             int64_t ld) {
    return i < nk ? elem_at(elem, base, i * ld) : elem_at(elem, next, (i - nk) * ld);
}

#endif /* SDPA_KERNELS_SIMD_AVX2_H */
