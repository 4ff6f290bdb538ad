/*
 * convert_avx512.c — the AVX-512 table's widening and storing (ukernels.h, load_row and
 * store_row), 16 lanes at a time: f16 through vcvtph2ps / vcvtps2ph (AVX-512F), bf16 by
 * shifting its 16 bits into the top half of a binary32 and back with an integer round to
 * nearest, ties to even. The row's tail is one masked step, not a scalar loop. Compiled with
 * the table's AVX-512 flags for this file only.
 *
 * Every result is bitwise the portable entries' (sdpa__load_row_generic and
 * sdpa__store_row_generic), NaN included: a NaN is stored as the quiet NaN of its sign
 * (0x7e00 / 0xfe00 in f16, 0x7fc0 / 0xffc0 in bf16), as the portable narrowing does; f32 is
 * stored as the product is, but that a NaN of src is kept (made quiet) whatever the scale.
 * Strided rows (a feature stride other than 1) go to the portable entries.
 */
#include "../ukernels.h"

#include <float.h>
#include <immintrin.h>
#include <math.h>

#define INLINE static inline __attribute__((always_inline))

INLINE __mmask16 first(int64_t n) {
    return (__mmask16)(n >= 16 ? 0xffff : (1u << n) - 1u);
}

/* 16 halves from h (lanes of m) widened to f32. */
INLINE __m512 widen(int elem, const uint16_t *h, __mmask16 m) {
    const __m256i w = _mm256_maskz_loadu_epi16(m, h);
    if (elem == SDPA__ELEM_F16)
        return _mm512_cvtph_ps(w);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(w), 16));
}

/* x (NaN lanes made the quiet NaN of their sign, which both narrowings turn into the
 * portable code's NaN) rounded to 16 halves. bf16: adding 0x7fff plus the lowest kept bit
 * carries into the kept half exactly when the cut half is above one half, or equal and the
 * kept part odd; overflow carries into inf. */
INLINE __m256i narrow(int elem, __m512 x) {
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN));
    x = _mm512_mask_mov_ps(
        x, nan, _mm512_castsi512_ps(_mm512_or_si512(sign, _mm512_set1_epi32(0x7fc00000))));
    if (elem == SDPA__ELEM_F16)
        return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512i u = _mm512_castps_si512(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    return _mm512_cvtepi32_epi16(r);
}

void sdpa__load_row_avx512(int elem, int64_t n, const void *src, int64_t stride, float *dst) {
    if (elem == SDPA__ELEM_F32 || (stride != 1 && n > 1)) {
        sdpa__load_row_generic(elem, n, src, stride, dst);
        return;
    }
    const uint16_t *h = src;
    for (int64_t c = 0; c < n; c += 16) {
        const __mmask16 m = first(n - c);
        _mm512_mask_storeu_ps(dst + c, m, widen(elem, h + c, m));
    }
}

/* x, which holds no NaN, stored to dst[c..] (lanes of m) as elem: rounded as narrow rounds it,
 * the NaN handling left out. bf16: the rounded words' high halves picked by one permutation,
 * where narrow shifts them down and packs them (three operations). */
INLINE void store_plain(int elem, __mmask16 m, __m512 x, void *dst, int64_t c) {
    if (elem == SDPA__ELEM_F32) {
        _mm512_mask_storeu_ps((float *)dst + c, m, x);
        return;
    }
    if (elem == SDPA__ELEM_F16) {
        _mm256_mask_storeu_epi16((uint16_t *)dst + c, m,
                                 _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        return;
    }
    const __m512i u = _mm512_castps_si512(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
    /* word k (k < 16) of the result is word 2k + 1 of r, the high half of its lane k */
    const __m512i high =
        _mm512_set_epi16(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1, 31, 29, 27, 25,
                         23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    _mm256_mask_storeu_epi16((uint16_t *)dst + c, m,
                             _mm512_castsi512_si256(_mm512_permutexvar_epi16(high, r)));
}

/* One vector of store_row: src[c..] (lanes of m) times sc to dst[c..]. Where src's lanes hold
 * no NaN or Inf and the scale is finite (`plain`), the products are numbers or +-Inf, never a
 * NaN, and store_plain stores them; else src's NaN is kept, made quiet, and narrow gives every
 * NaN the portable code's form. *inf and *nan gain the lanes of src that hold one. */
INLINE void store_step(int elem, __mmask16 m, const float *src, int64_t c, __m512 sc, int plain,
                       void *dst, __mmask16 *inf, __mmask16 *nan) {
    const __m512 v = _mm512_maskz_loadu_ps(m, src + c);
    /* (vfpclassps: 0x08 +Inf, 0x10 -Inf; 0x01 quiet, 0x80 signalling NaN) */
    if (plain && _mm512_fpclass_ps_mask(v, 0x99) == 0) {
        store_plain(elem, m, _mm512_mul_ps(v, sc), dst, c);
        return;
    }
    const __mmask16 src_nan = _mm512_fpclass_ps_mask(v, 0x81);
    *inf |= _mm512_fpclass_ps_mask(v, 0x18);
    *nan |= src_nan;
    /* src's NaN, made quiet, whatever the scale (as the portable entry) */
    const __m512 x =
        _mm512_mask_mov_ps(_mm512_mul_ps(v, sc), src_nan,
                           _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v),
                                                               _mm512_set1_epi32(0x00400000))));
    if (elem == SDPA__ELEM_F32)
        _mm512_mask_storeu_ps((float *)dst + c, m, x);
    else
        _mm256_mask_storeu_epi16((uint16_t *)dst + c, m, narrow(elem, x));
}

/* Whole vectors, then the tail in one masked step. Almost every row is plain (an accumulator
 * of numbers, scaled by 1 / l): a vector then takes a load, a class test, a product and its
 * store besides the conversion, where the NaN handling took about 10 operations more for
 * bf16, and the end of a forward task (mostly this) took 4-10 % of the task at L = 512,
 * D = 128 (bench/task_costs.py, flash-amx on an Intel Xeon). */
int sdpa__store_row_avx512(int elem, int64_t n, const float *src, float scale, void *dst,
                           int64_t stride) {
    if (stride != 1 && n > 1)
        return sdpa__store_row_generic(elem, n, src, scale, dst, stride);
    const __m512 sc = _mm512_set1_ps(scale);
    const int plain = fabsf(scale) <= FLT_MAX; /* not NaN, not +-Inf */
    __mmask16 inf = 0, nan = 0;
    int64_t c = 0;
    for (; c + 16 <= n; c += 16)
        store_step(elem, 0xffff, src, c, sc, plain, dst, &inf, &nan);
    if (c < n)
        store_step(elem, first(n - c), src, c, sc, plain, dst, &inf, &nan);
    return (inf != 0 ? SDPA__STORED_INF : 0) | (nan != 0 ? SDPA__STORED_NAN : 0);
}
