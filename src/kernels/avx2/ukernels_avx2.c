/*
 * ukernels_avx2.c — the flash micro-kernels for AVX2 with FMA; compiled with those flags for
 * this file only, and called only after the dispatcher has checked CPUID and XGETBV. See
 * ukernels.h for what each computes.
 *
 * Register blocking: `mr` broadcast scalars times `nv` vectors of 8 floats, at most 12
 * accumulators of the 16 ymm registers; the block functions are always inlined with constant
 * mr and nv so the accumulators stay in registers.
 *
 * exp: x is clamped to [-87, 88] (so 2^n stays a normal float built from its exponent bits),
 * split as x = n ln2 + r with |r| <= ln2/2 (Cody-Waite), e^r by its degree-7 Taylor
 * polynomial, times 2^n. Values below e^-87 (about 1.6e-38) are returned as e^-87: an absolute
 * error far below anything a softmax can see. NaN propagates. Relative error within 2 ulp
 * on [-87, 0] (tests/test_flash.c checks it).
 */
#include "../ukernels.h"

#include <immintrin.h>
#include <math.h>

#define INLINE static inline __attribute__((always_inline))

INLINE __m256 exp256(__m256 x) {
    /* min/max return their second operand when either is NaN: x stays NaN */
    x = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(_mm256_set1_ps(-87.0f), x));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

INLINE void qk_block(int mr, int nv, int64_t dk, const float *k, int64_t ldk, const float *qt,
                     int64_t ldq, float scale, float *s, int64_t lds) {
    __m256 acc[6][2];
    for (int a = 0; a < mr; a++)
        for (int v = 0; v < nv; v++)
            acc[a][v] = _mm256_setzero_ps();
    for (int64_t d = 0; d < dk; d++) {
        __m256 q[2];
        for (int v = 0; v < nv; v++)
            q[v] = _mm256_loadu_ps(qt + d * ldq + 8 * v);
        for (int a = 0; a < mr; a++) {
            const __m256 kb = _mm256_broadcast_ss(k + a * ldk + d);
            for (int v = 0; v < nv; v++)
                acc[a][v] = _mm256_fmadd_ps(kb, q[v], acc[a][v]);
        }
    }
    const __m256 sc = _mm256_set1_ps(scale);
    for (int a = 0; a < mr; a++)
        for (int v = 0; v < nv; v++)
            _mm256_storeu_ps(s + a * lds + 8 * v, _mm256_mul_ps(sc, acc[a][v]));
}

INLINE void qk_rows(int nv, int64_t nk, int64_t dk, const float *k, int64_t ldk, const float *qt,
                    int64_t ldq, float scale, float *s, int64_t lds) {
    int64_t j = 0;
    for (; j + 6 <= nk; j += 6)
        qk_block(6, nv, dk, k + j * ldk, ldk, qt, ldq, scale, s + j * lds, lds);
    for (; j < nk; j++)
        qk_block(1, nv, dk, k + j * ldk, ldk, qt, ldq, scale, s + j * lds, lds);
}

static void qk_avx2(int64_t nk, int64_t nr, int64_t dk, const float *k, int64_t ldk,
                    const float *qt, int64_t ldq, float scale, float *s, int64_t lds) {
    int64_t r = 0;
    for (; r + 16 <= nr; r += 16)
        qk_rows(2, nk, dk, k, ldk, qt + r, ldq, scale, s + r, lds);
    if (r < nr)
        qk_rows(1, nk, dk, k, ldk, qt + r, ldq, scale, s + r, lds);
}

static int softmax_avx2(int64_t nk, int64_t nr, float *s, int64_t lds, float *m, float *l,
                        float *alpha) {
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY), neg_zero = _mm256_set1_ps(-0.0f);
    __m256 hidden = _mm256_setzero_ps();
    for (int64_t r = 0; r < nr; r += 8) {
        const __m256 m_old = _mm256_loadu_ps(m + r);
        __m256 mx = m_old;
        for (int64_t j = 0; j < nk; j++)
            mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + j * lds + r));
        const __m256 u =
            _mm256_blendv_ps(mx, _mm256_setzero_ps(), _mm256_cmp_ps(mx, neg_inf, _CMP_EQ_OQ));
        const __m256 a = exp256(_mm256_sub_ps(m_old, u));
        __m256 sum = _mm256_setzero_ps();
        for (int64_t j = 0; j < nk; j++) {
            const __m256 x = _mm256_loadu_ps(s + j * lds + r);
            const __m256 inf = _mm256_cmp_ps(x, neg_inf, _CMP_EQ_OQ);
            hidden = _mm256_or_ps(hidden, inf);
            const __m256 p = _mm256_blendv_ps(exp256(_mm256_sub_ps(x, u)), neg_zero, inf);
            _mm256_storeu_ps(s + j * lds + r, p);
            sum = _mm256_add_ps(sum, p);
        }
        /* exp(-inf) is e^-87 here, not 0: a row that has seen nothing keeps l = 0 anyway */
        _mm256_storeu_ps(alpha + r, a);
        _mm256_storeu_ps(l + r, _mm256_fmadd_ps(_mm256_loadu_ps(l + r), a, sum));
        _mm256_storeu_ps(m + r, mx);
    }
    return _mm256_movemask_ps(hidden) != 0;
}

INLINE void pv_block(int mr, int nv, __m256i last, int64_t nk, const float *p, int64_t ldp,
                     const float *alpha, const float *v, int64_t ldv, float *o, int64_t ldo) {
    const __m256i all = _mm256_set1_epi32(-1);
    __m256 acc[6][2];
    for (int a = 0; a < mr; a++) {
        const __m256 al = _mm256_broadcast_ss(alpha + a);
        for (int c = 0; c < nv; c++)
            acc[a][c] = _mm256_mul_ps(
                al, _mm256_maskload_ps(o + a * ldo + 8 * c, c == nv - 1 ? last : all));
    }
    for (int64_t j = 0; j < nk; j++) {
        __m256 vv[2];
        for (int c = 0; c < nv; c++)
            vv[c] = _mm256_maskload_ps(v + j * ldv + 8 * c, c == nv - 1 ? last : all);
        for (int a = 0; a < mr; a++) {
            const __m256 pb = _mm256_broadcast_ss(p + j * ldp + a);
            for (int c = 0; c < nv; c++)
                acc[a][c] = _mm256_fmadd_ps(pb, vv[c], acc[a][c]);
        }
    }
    for (int a = 0; a < mr; a++)
        for (int c = 0; c < nv; c++)
            _mm256_maskstore_ps(o + a * ldo + 8 * c, c == nv - 1 ? last : all, acc[a][c]);
}

INLINE void pv_cols(int nv, __m256i last, int64_t nk, int64_t nr, const float *p, int64_t ldp,
                    const float *alpha, const float *v, int64_t ldv, float *o, int64_t ldo) {
    int64_t r = 0;
    for (; r + 6 <= nr; r += 6)
        pv_block(6, nv, last, nk, p + r, ldp, alpha + r, v, ldv, o + r * ldo, ldo);
    for (; r < nr; r++)
        pv_block(1, nv, last, nk, p + r, ldp, alpha + r, v, ldv, o + r * ldo, ldo);
}

static void pv_avx2(int64_t nk, int64_t nr, int64_t dv, const float *p, int64_t ldp,
                    const float *alpha, const float *v, int64_t ldv, float *o, int64_t ldo) {
    const __m256i all = _mm256_set1_epi32(-1);
    int64_t c = 0;
    for (; c + 16 <= dv; c += 16)
        pv_cols(2, all, nk, nr, p, ldp, alpha, v + c, ldv, o + c, ldo);
    const int64_t rest = dv - c;
    if (rest == 0)
        return;
    /* lanes below rest % 8 (or all 8) of the last vector */
    const int keep = rest % 8 == 0 ? 8 : (int)(rest % 8);
    const __m256i last =
        _mm256_cmpgt_epi32(_mm256_set1_epi32(keep), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    if (rest > 8)
        pv_cols(2, last, nk, nr, p, ldp, alpha, v + c, ldv, o + c, ldo);
    else
        pv_cols(1, last, nk, nr, p, ldp, alpha, v + c, ldv, o + c, ldo);
}

const sdpa__ukernels sdpa__uk_avx2 = {
    .name = "avx2",
    .lanes = 8,
    .pack_q = sdpa__pack_q_generic,
    .qk = qk_avx2,
    .qk_few = NULL,
    .softmax = softmax_avx2,
    .pv = pv_avx2,
    .load_row = sdpa__load_row_generic,
    .store_row = sdpa__store_row_generic,
};
