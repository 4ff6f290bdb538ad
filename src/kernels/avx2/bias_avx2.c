/*
 * bias_avx2.c — ALiBi's and the mask's terms of a tile's scores with AVX2 (ukernels.h, bias),
 * 8 scores a step, bitwise what the generic table gives. Compiled with -mavx2 for this file
 * only (no FMA: the product and the difference are rounded apart, as the contract says).
 *
 * As in bias_avx512.c: in the forward's transposed tiles 8 rows of 8 mask values are turned
 * in registers (24 shuffles for 64 values); ALiBi's distance is formed in double, exactly,
 * and rounded once to f32.
 */
#include "../ukernels.h"

#include <immintrin.h>
#include <math.h>

#define INLINE static inline __attribute__((always_inline))

enum { LANES = 8 };

/* Lanes [0, n) all ones, n <= 8: the mask of the masked loads and stores. */
INLINE __m256i first(int64_t n) {
    const int c = n >= LANES ? LANES : (int)n;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* (float)|a| for the 8 doubles lo (lanes 0..3) and hi (4..7), each rounded once. */
INLINE __m256 distance8(__m256d lo, __m256d hi) {
    const __m256d sign = _mm256_set1_pd(-0.0);
    const __m128 l = _mm256_cvtpd_ps(_mm256_andnot_pd(sign, lo));
    const __m128 h = _mm256_cvtpd_ps(_mm256_andnot_pd(sign, hi));
    return _mm256_insertf128_ps(_mm256_castps128_ps256(l), h, 1);
}

/* x - slope * dist; then the mask value mv's term: -inf where mv is -inf, else x + mv. */
INLINE __m256 alibi(__m256 x, __m256 slope, __m256 dist) {
    return _mm256_sub_ps(x, _mm256_mul_ps(slope, dist));
}
INLINE __m256 masked(__m256 x, __m256 mv) {
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
    return _mm256_blendv_ps(_mm256_add_ps(x, mv), neg_inf, _mm256_cmp_ps(mv, neg_inf, _CMP_EQ_OQ));
}

/* t[c] = column c of the 8 x 8 values t[r] (lane c of row r), in place. */
INLINE void transpose8(__m256 t[LANES]) {
    __m256 u[LANES];
    for (int k = 0; k < 4; k++) { /* per 128-bit lane L: (a0 b0 a1 b1), (a2 b2 a3 b3) */
        u[2 * k] = _mm256_unpacklo_ps(t[2 * k], t[2 * k + 1]);
        u[2 * k + 1] = _mm256_unpackhi_ps(t[2 * k], t[2 * k + 1]);
    }
    for (int k = 0; k < 2; k++) { /* t[4k + e], lane L: rows 4k..4k+3 at column 4L + e */
        t[4 * k] = _mm256_shuffle_ps(u[4 * k], u[4 * k + 2], _MM_SHUFFLE(1, 0, 1, 0));
        t[4 * k + 1] = _mm256_shuffle_ps(u[4 * k], u[4 * k + 2], _MM_SHUFFLE(3, 2, 3, 2));
        t[4 * k + 2] = _mm256_shuffle_ps(u[4 * k + 1], u[4 * k + 3], _MM_SHUFFLE(1, 0, 1, 0));
        t[4 * k + 3] = _mm256_shuffle_ps(u[4 * k + 1], u[4 * k + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int e = 0; e < 4; e++) { /* column 4L + e: lane L of t[e] and of t[4 + e] */
        u[e] = _mm256_permute2f128_ps(t[e], t[4 + e], 0x20);
        u[4 + e] = _mm256_permute2f128_ps(t[e], t[4 + e], 0x31);
    }
    for (int c = 0; c < LANES; c++)
        t[c] = u[c];
}

/* A row's keys along the lanes (js = 1). */
static void bias_rows(int64_t nr, int64_t nk, const float *slope, const double *pos, double step,
                      const float *const *m, float *s, int64_t rs) {
    const __m256d steps_lo = _mm256_mul_pd(_mm256_set1_pd(step), _mm256_setr_pd(0, 1, 2, 3));
    const __m256d steps_hi = _mm256_mul_pd(_mm256_set1_pd(step), _mm256_setr_pd(4, 5, 6, 7));
    for (int64_t r = 0; r < nr; r++) {
        float *s_r = s + r * rs;
        for (int64_t j = 0; j < nk; j += LANES) {
            const __m256i keys = first(nk - j);
            __m256 x = _mm256_maskload_ps(s_r + j, keys);
            if (slope != NULL) {
                const __m256d at = _mm256_set1_pd(pos[r] + step * (double)j);
                x = alibi(x, _mm256_set1_ps(slope[r]),
                          distance8(_mm256_add_pd(at, steps_lo), _mm256_add_pd(at, steps_hi)));
            }
            if (m != NULL)
                x = masked(x, _mm256_maskload_ps(m[r] + j, keys));
            _mm256_maskstore_ps(s_r + j, keys, x);
        }
    }
}

/* A key's rows along the lanes (rs = 1): 8 rows at a time, their mask values turned 8 keys at
 * a time. */
static void bias_cols(int64_t nr, int64_t nk, const float *slope, const double *pos, double step,
                      const float *const *m, float *s, int64_t js) {
    for (int64_t r = 0; r < nr; r += LANES) {
        const int64_t nb = nr - r < LANES ? nr - r : LANES;
        const __m256i rows = first(nb);
        __m256 sl = _mm256_setzero_ps();
        __m256d pos_lo = _mm256_setzero_pd(), pos_hi = _mm256_setzero_pd();
        if (slope != NULL) {
            sl = _mm256_maskload_ps(slope + r, rows);
            pos_lo =
                _mm256_maskload_pd(pos + r, _mm256_cvtepi32_epi64(_mm256_castsi256_si128(rows)));
            pos_hi = _mm256_maskload_pd(pos + r + 4,
                                        _mm256_cvtepi32_epi64(_mm256_extracti128_si256(rows, 1)));
        }
        for (int64_t j = 0; j < nk; j += LANES) {
            const int64_t nj = nk - j < LANES ? nk - j : LANES;
            __m256 mv[LANES];
            if (m != NULL) {
                for (int64_t rr = 0; rr < LANES; rr++)
                    mv[rr] = rr < nb ? _mm256_maskload_ps(m[r + rr] + j, first(nj))
                                     : _mm256_setzero_ps();
                transpose8(mv);
            }
            for (int64_t jj = 0; jj < nj; jj++) {
                float *s_j = s + (j + jj) * js + r;
                __m256 x = _mm256_maskload_ps(s_j, rows);
                if (slope != NULL) {
                    const __m256d at = _mm256_set1_pd(step * (double)(j + jj));
                    x = alibi(x, sl,
                              distance8(_mm256_add_pd(pos_lo, at), _mm256_add_pd(pos_hi, at)));
                }
                if (m != NULL)
                    x = masked(x, mv[jj]);
                _mm256_maskstore_ps(s_j, rows, x);
            }
        }
    }
}

/* bias (ukernels.h). */
void sdpa__bias_avx2(int64_t nr, int64_t nk, const float *slope, const double *pos, double step,
                     const float *const *m, float *s, int64_t rs, int64_t js) {
    if (js == 1)
        bias_rows(nr, nk, slope, pos, step, m, s, rs);
    else
        bias_cols(nr, nk, slope, pos, step, m, s, js);
}
