/*
 * convert_avx2.c — the AVX2 table's widening and storing (ukernels.h, load_row and store_row):
 * f16 through F16C's vcvtph2ps / vcvtps2ph, bf16 by shifting its 16 bits into the top half of
 * a binary32 and back with an integer round to nearest, ties to even. Compiled with -mavx2
 * -mf16c for this file only; the table needs F16C (dispatch.c).
 *
 * Every result is bitwise the portable entries' (sdpa__load_row_generic and
 * sdpa__store_row_generic), NaN included: a NaN is stored as the quiet NaN of its sign
 * (0x7e00 / 0xfe00 in f16, 0x7fc0 / 0xffc0 in bf16), as the portable narrowing does. Strided
 * rows (a feature stride other than 1) go to the portable entries.
 */
#include "../ukernels.h"

#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))

/* x with every NaN lane replaced by the quiet NaN of its sign, 0x7fc00000 | sign: both
 * narrowings below turn that into the portable code's NaN. */
INLINE __m256 canonical_nan(__m256 x) {
    const __m256 nan = _mm256_or_ps(_mm256_and_ps(x, _mm256_set1_ps(-0.0f)),
                                    _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)));
    return _mm256_blendv_ps(x, nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* The top halves of 8 binary32 rounded to nearest, ties to even (NaN canonical already):
 * adding 0x7fff plus the lowest kept bit carries into the kept half exactly when the cut
 * half is above one half, or equal and the kept part odd; overflow carries into inf. */
INLINE __m128i bf16_round(__m256 x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
    /* 8 values below 2^16 in 32-bit lanes to 16-bit ones, in order */
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

void sdpa__load_row_avx2(int elem, int64_t n, const void *src, int64_t stride, float *dst) {
    if (elem == SDPA__ELEM_F32 || (stride != 1 && n > 1)) {
        sdpa__load_row_generic(elem, n, src, stride, dst);
        return;
    }
    const uint16_t *h = src;
    int64_t c = 0;
    if (elem == SDPA__ELEM_F16) {
        for (; c + 8 <= n; c += 8)
            _mm256_storeu_ps(dst + c, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + c))));
    } else {
        for (; c + 8 <= n; c += 8) {
            const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + c)));
            _mm256_storeu_ps(dst + c, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
        }
    }
    if (c < n)
        sdpa__load_row_generic(elem, n - c, h + c, 1, dst + c);
}

int sdpa__store_row_avx2(int elem, int64_t n, const float *src, float scale, void *dst,
                         int64_t stride) {
    if (stride != 1 && n > 1)
        return sdpa__store_row_generic(elem, n, src, scale, dst, stride);
    const __m256 sc = _mm256_set1_ps(scale),
                 inf_v = _mm256_castsi256_ps(_mm256_set1_epi32(0x7f800000));
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 inf = _mm256_setzero_ps(), nan = _mm256_setzero_ps(); /* lanes all ones if seen */
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
        const __m256 v = _mm256_loadu_ps(src + c), src_nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
        inf = _mm256_or_ps(inf, _mm256_cmp_ps(_mm256_and_ps(v, magnitude), inf_v, _CMP_EQ_OQ));
        nan = _mm256_or_ps(nan, src_nan);
        /* src's NaN, made quiet, whatever the scale (as the portable entry) */
        const __m256 x = _mm256_blendv_ps(
            _mm256_mul_ps(v, sc),
            _mm256_or_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x00400000))), src_nan);
        if (elem == SDPA__ELEM_F32) {
            _mm256_storeu_ps((float *)dst + c, x);
            continue;
        }
        const __m128i r =
            elem == SDPA__ELEM_F16
                ? _mm256_cvtps_ph(canonical_nan(x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                : bf16_round(canonical_nan(x));
        _mm_storeu_si128((__m128i *)((uint16_t *)dst + c), r);
    }
    int kinds = (_mm256_movemask_ps(inf) != 0 ? SDPA__STORED_INF : 0) |
                (_mm256_movemask_ps(nan) != 0 ? SDPA__STORED_NAN : 0);
    if (c < n)
        kinds |= sdpa__store_row_generic(
            elem, n - c, src + c, scale,
            elem == SDPA__ELEM_F32 ? (void *)((float *)dst + c) : (void *)((uint16_t *)dst + c), 1);
    return kinds;
}
