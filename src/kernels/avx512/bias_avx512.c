/*
 * bias_avx512.c — ALiBi's and the mask's terms of a tile's scores with AVX-512F (ukernels.h,
 * bias), 16 scores a step, bitwise what the generic table gives. Compiled with the table's
 * AVX-512 flags for this file only.
 *
 * In the forward's transposed tiles a vector holds one key's scores for 16 query rows, while a
 * row's mask values run along the keys: 16 rows of 16 mask values are loaded and turned in
 * registers (64 shuffles for 256 values), where writing them a score at a time down a column
 * cost about as much as the tile's Q K^T. ALiBi's distance |pos + step j| is formed in double,
 * exactly (the integers stay below 2^53), and rounded once to f32, as the generic table's
 * conversion does.
 */
#include "../ukernels.h"
#include "transpose_avx512.h"

#include <immintrin.h>
#include <math.h>

#define INLINE static inline __attribute__((always_inline))

enum { LANES = 16 };

/* The lanes [0, n) of a vector, n <= 16. */
INLINE __mmask16 first(int64_t n) {
    return (__mmask16)(n >= LANES ? 0xffffu : (1u << n) - 1u);
}

/* (float)|a| for the 16 doubles lo (lanes 0..7) and hi (8..15), each rounded once. */
INLINE __m512 distance16(__m512d lo, __m512d hi) {
    const __m256 l = _mm512_cvtpd_ps(_mm512_abs_pd(lo)), h = _mm512_cvtpd_ps(_mm512_abs_pd(hi));
    return _mm512_insertf32x8(_mm512_castps256_ps512(l), h, 1);
}

/* x - slope * dist, then the mask value mv's term: -inf where mv is -inf, else x + mv. */
INLINE __m512 alibi(__m512 x, __m512 slope, __m512 dist) {
    return _mm512_sub_ps(x, _mm512_mul_ps(slope, dist));
}
INLINE __m512 masked(__m512 x, __m512 mv) {
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
    const __mmask16 hide = _mm512_cmp_ps_mask(mv, neg_inf, _CMP_EQ_OQ);
    return _mm512_mask_blend_ps(hide, _mm512_add_ps(x, mv), neg_inf);
}

/* A row's keys along the lanes (js = 1). */
static void bias_rows(int64_t nr, int64_t nk, const float *slope, const double *pos, double step,
                      const float *const *m, float *s, int64_t rs) {
    const __m512d steps_lo =
        _mm512_mul_pd(_mm512_set1_pd(step), _mm512_set_pd(7, 6, 5, 4, 3, 2, 1, 0));
    const __m512d steps_hi =
        _mm512_mul_pd(_mm512_set1_pd(step), _mm512_set_pd(15, 14, 13, 12, 11, 10, 9, 8));
    for (int64_t r = 0; r < nr; r++) {
        float *s_r = s + r * rs;
        for (int64_t j = 0; j < nk; j += LANES) {
            const __mmask16 keys = first(nk - j);
            __m512 x = _mm512_maskz_loadu_ps(keys, s_r + j);
            if (slope != NULL) {
                const __m512d at = _mm512_set1_pd(pos[r] + step * (double)j);
                x = alibi(x, _mm512_set1_ps(slope[r]),
                          distance16(_mm512_add_pd(at, steps_lo), _mm512_add_pd(at, steps_hi)));
            }
            if (m != NULL)
                x = masked(x, _mm512_maskz_loadu_ps(keys, m[r] + j));
            _mm512_mask_storeu_ps(s_r + j, keys, x);
        }
    }
}

/* A key's rows along the lanes (rs = 1): 16 rows at a time, their mask values turned 16 keys
 * at a time. */
static void bias_cols(int64_t nr, int64_t nk, const float *slope, const double *pos, double step,
                      const float *const *m, float *s, int64_t js) {
    for (int64_t r = 0; r < nr; r += LANES) {
        const int64_t nb = nr - r < LANES ? nr - r : LANES;
        const __mmask16 rows = first(nb);
        __m512 sl = _mm512_setzero_ps();
        __m512d pos_lo = _mm512_setzero_pd(), pos_hi = _mm512_setzero_pd();
        if (slope != NULL) {
            sl = _mm512_maskz_loadu_ps(rows, slope + r);
            pos_lo = _mm512_maskz_loadu_pd((__mmask8)rows, pos + r);
            pos_hi = _mm512_maskz_loadu_pd((__mmask8)(rows >> 8), pos + r + 8);
        }
        for (int64_t j = 0; j < nk; j += LANES) {
            const int64_t nj = nk - j < LANES ? nk - j : LANES;
            __m512 mv[LANES];
            if (m != NULL) {
                for (int64_t rr = 0; rr < LANES; rr++)
                    mv[rr] = rr < nb ? _mm512_maskz_loadu_ps(first(nj), m[r + rr] + j)
                                     : _mm512_setzero_ps();
                sdpa__transpose16_avx512(mv);
            }
            for (int64_t jj = 0; jj < nj; jj++) {
                float *s_j = s + (j + jj) * js + r;
                __m512 x = _mm512_maskz_loadu_ps(rows, s_j);
                if (slope != NULL) {
                    const __m512d at = _mm512_set1_pd(step * (double)(j + jj));
                    x = alibi(x, sl,
                              distance16(_mm512_add_pd(pos_lo, at), _mm512_add_pd(pos_hi, at)));
                }
                if (m != NULL)
                    x = masked(x, mv[jj]);
                _mm512_mask_storeu_ps(s_j, rows, x);
            }
        }
    }
}

/* bias (ukernels.h). */
void sdpa__bias_avx512(int64_t nr, int64_t nk, const float *slope, const double *pos, double step,
                       const float *const *m, float *s, int64_t rs, int64_t js) {
    if (js == 1)
        bias_rows(nr, nk, slope, pos, step, m, s, rs);
    else
        bias_cols(nr, nk, slope, pos, step, m, s, js);
}
