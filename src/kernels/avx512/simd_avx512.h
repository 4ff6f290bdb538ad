/*
 * simd_avx512.h — what the AVX-512 table's files (ukernels_avx512.c, decode_avx512.c) share:
 * the exp and the scaling of the softmax's weights, the widening of f16 and bf16 elements in
 * registers, and the addresses of elements and of rows ahead. Static inline functions only, for
 * files compiled with the table's AVX-512 flags.
 *
 * exp: x is split as x = n ln2 + r with |r| <= ln2/2 (Cody-Waite, ln2 in two parts), e^r by
 * its degree-7 Taylor polynomial (truncation < 5e-9 relative) and 2^n applied with vscalefps,
 * which also produces subnormals; below -104 the result is +0, the f32 value. Measured against
 * double-precision exp on [-87, 0], the relative error is within 2 ulp, and on [-104, -87]
 * within 2 ulp of the softmax's weights (scaled by 2^WEIGHT_EXP2) and within one subnormal
 * step of exp_lse's (tests/test_entries.c checks the softmax's). Lanes whose result is known
 * beforehand (a hidden key's -inf score, x below -104) are not put through it: see exp512.
 */
#ifndef SDPA_KERNELS_SIMD_AVX512_H
#define SDPA_KERNELS_SIMD_AVX512_H

#include "../ukernels.h"

#include <immintrin.h>
#include <math.h>

#define INLINE static inline __attribute__((always_inline))

/* The softmax's weights, and so its sums l, come scaled by 2^WEIGHT_EXP2 (ukernels.h,
 * weight_exp2): a weight down to e^-104 (2^-150) is then a normal float, where unscaled it
 * was a subnormal, and on an Intel Xeon (model 207) each vscalefps that makes one, and each
 * P V product that reads one, takes a microcode assist: with ALiBi (slopes up to 2^-0.5, so
 * many keys 87..104 below their row's best) a forward at H=16 L=512 ran at half the speed of
 * one without. Scaling by a power of two changes no other bit where nothing was subnormal
 * (a weight, or a product with a V near 1e-36): every product and sum that involves the
 * weights is scaled exactly, and O = acc / l divides it out. Weights stay below 2^25, so that
 * acc overflows only where |V| passes about 1e31 (such rows the driver computes again, in
 * double and one at a time, as any overflowed row: a forward at L = 1024 with |V| near 1e33
 * then takes 0.4 s instead of 5 ms). */
enum { WEIGHT_EXP2 = 25 };

/* Below these, exp512 gives +0 without the polynomial: -104 (exp is then below 2^-150, and +0
 * is its f32 value) for the softmax, whose weights the scaling keeps normal above it; -87 for
 * exp_lse, the backward's weights, unscaled (the gradients' accumulators would overflow
 * where |dO| passes about 1e31 with them scaled), whose subnormals (exp_lse's weights of keys
 * scored 87..104 below the LSE, which ALiBi's slopes make common) made each P dO, dS and dS K
 * product that read one take a microcode assist: an ALiBi backward at H=16 L=512 ran 3.4
 * times as long as one without. A weight below e^-87 is at most 1.7e-38, and its product's
 * absolute error at most that times |dO| or |dP - Delta|, as the generic and AVX2 tables'
 * floor of e^-87 gives. */
#define EXP_LO (-104.0f)
#define EXP_LSE_LO (-87.0f)

/* exp(x) * 2^e2 in the lanes outside `hide`, v in those. Where x < -104 the result is +0, the f32
 * value of exp(x) (below 2^-150, half the least subnormal), without the polynomial: through
 * it, vscalefps would round a subnormal result, and on an Intel Xeon (model 207) every such
 * result costs a microcode assist. Hidden keys' scores (-inf) made the softmax of a causal
 * slice cost twice an unmasked one's, and a finite mask value of -1e9 (as some frameworks
 * use) made a whole forward 15 times slower. (A constant 2^-149 there instead, positive as
 * the reference's weight is, made the P V products subnormal: 30 times slower again. A +0
 * weight against an Inf in V gives NaN; the driver has such rows computed again.) With
 * e2 = WEIGHT_EXP2 no result in [-104, -87] is subnormal either. */
INLINE __m512 exp512(__m512 x, __mmask16 hide, __m512 v, int e2, float lo) {
    const __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(lo), _CMP_LT_OQ);
    x = _mm512_maskz_mov_ps((__mmask16)~under, x); /* NaN x stays NaN */
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    const __m512 n2 = e2 != 0 ? _mm512_add_ps(n, _mm512_set1_ps((float)e2)) : n;
    return _mm512_mask_blend_ps(hide, _mm512_maskz_scalef_ps((__mmask16)~under, p, n2), v);
}

/* 16 consecutive elements of type elem (a compile-time constant where this is inlined) at
 * element index i of base, lanes of m, widened to f32 exactly: the qk_few and P V loops
 * read a half-precision cache in place with it. */
INLINE __m512 load_elems(int elem, const void *base, int64_t i, __mmask16 m) {
    if (elem == SDPA__ELEM_F32)
        return _mm512_maskz_loadu_ps(m, (const float *)base + i);
    const __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)base + i);
    if (elem == SDPA__ELEM_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* load_elems with every lane: a plain load (or the conversion's own memory operand). */
INLINE __m512 load_full(int elem, const void *base, int64_t i) {
    if (elem == SDPA__ELEM_F32)
        return _mm512_loadu_ps((const float *)base + i);
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i));
    if (elem == SDPA__ELEM_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* 32 bf16 elements at element index i of base, widened exactly: the even ones (2t) in lane t
 * of *ev, the odd ones (2t + 1) in lane t of *od. Read as 16 dwords, each holds an odd
 * element in its upper half (already an f32's bits once the lower half is cleared) and an
 * even one in its lower (a shift): one operation per 16 elements, where load_full's
 * widening and shift take two. */
INLINE void load_bf16_pairs(const void *base, int64_t i, __m512 *ev, __m512 *od) {
    const __m512i x = _mm512_loadu_si512((const uint16_t *)base + i);
    *ev = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
    *od = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xffff0000u)));
}

/* Lanes of two vectors of 16 consecutive features (lo: 0..15, hi: 16..31, as one index
 * 0..31 of _mm512_permutex2var_ps) regrouped: the even features, then the odd ones
 * (load_bf16_pairs' layout); and back. */
INLINE __m512 even_of(__m512 lo, __m512 hi) {
    const __m512i i = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    return _mm512_permutex2var_ps(lo, i, hi);
}
INLINE __m512 odd_of(__m512 lo, __m512 hi) {
    const __m512i i = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    return _mm512_permutex2var_ps(lo, i, hi);
}
INLINE __m512 features_lo(__m512 ev, __m512 od) { /* features 0..15 of (ev, od) */
    const __m512i i = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutex2var_ps(ev, i, od);
}
INLINE __m512 features_hi(__m512 ev, __m512 od) { /* features 16..31 */
    const __m512i i =
        _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    return _mm512_permutex2var_ps(ev, i, od);
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

#endif /* SDPA_KERNELS_SIMD_AVX512_H */
