/*
 * decode_avx2.c — the AVX2 table's entries for a decode step's few query rows (ukernels.h:
 * qk_few, qk_few_half, softmax_few; pv_few is ukernels_avx2.c's): the rows' scores against keys
 * read in place from the cache, f32 or widened from f16 or bf16 in registers, a block of keys at a
 * time, and their online softmax with two keys of (up to) four rows in each vector. Compiled with
 * the table's AVX2, FMA and F16C flags for this file only; the table itself is in ukernels_avx2.c.
 */
#include "simd_avx2.h"

/* How many keys ahead qk_few asks for K rows. A decode step does four FMAs per element of K
 * and V: too few for the out-of-order window alone to keep enough DRAM reads in flight
 * (measured: 23 GB/s without, 28-33 with, Hq=32 Hkv=8 D=128 Lk=32768, 2 threads, Zen 5). Rows
 * FEW_PREFETCH_KEYS ahead are asked into L2 (T1), rows FEW_NEAR_KEYS ahead from there into L1
 * (T0), as in the AVX-512 table (Intel cores hold more reads in flight for L2 than L1's fill
 * buffers allow). A prefetch past the end of K never faults. */
enum { FEW_PREFETCH_KEYS = 16, FEW_NEAR_KEYS = 4 };

/* The even (2t) or, with odd, the odd (2t + 1) elements of 16 bf16 at element index i of
 * base, widened exactly, element 2t + odd in lane t. Read as 8 dwords, each holds an odd
 * element in its upper half (already an f32's bits once the lower half is cleared) and an
 * even one in its lower (a shift): one operation per 8 elements, where widen8 takes two. */
INLINE __m256 load_bf16_half(const void *base, int64_t i, int odd) {
    const __m256i x = _mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i));
    return _mm256_castsi256_ps(odd ? _mm256_and_si256(x, _mm256_set1_epi32((int)0xffff0000u))
                                   : _mm256_slli_epi32(x, 16));
}

/* Two vectors of 8 consecutive features (lo: 0..7, hi: 8..15) regrouped: the even features,
 * then the odd ones (load_bf16_half's layout). */
INLINE __m256 even_of(__m256 lo, __m256 hi) {
    return _mm256_castpd_ps(_mm256_permute4x64_pd(
        _mm256_castps_pd(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0))), 0xd8));
}
INLINE __m256 odd_of(__m256 lo, __m256 hi) {
    return _mm256_castpd_ps(_mm256_permute4x64_pd(
        _mm256_castps_pd(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1))), 0xd8));
}

/* Sums of four vectors: [sum a0, sum a1, sum a2, sum a3]. */
INLINE __m128 hsum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    /* pairs, then quads, within each 128-bit half ... */
    const __m256 s01 = _mm256_add_ps(_mm256_unpacklo_ps(a0, a1), _mm256_unpackhi_ps(a0, a1));
    const __m256 s23 = _mm256_add_ps(_mm256_unpacklo_ps(a2, a3), _mm256_unpackhi_ps(a2, a3));
    const __m256 t = _mm256_add_ps(
        _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(s01), _mm256_castps_pd(s23))),
        _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(s01), _mm256_castps_pd(s23))));
    /* ... then the two halves */
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

/* qk_few for nr rows and a block of nb keys: 8 features at a time along each key row, then
 * each key's vector of lanes [0, nr) from the row sums (nr * nb <= 12 accumulators). The
 * keys' elements are of type elem (the cache's: widened in registers). The block is keys
 * [j, j + nb) of a slice of nk at k0, whose rows continue at next (for the requests ahead). */
INLINE void qk_few_block(int elem, int nr, int nb, int64_t dk, const void *k0, const void *next,
                         int64_t nk, int64_t j, int64_t ldk, const float *const *q,
                         const float *const *qp, int64_t dp, float scale, float *s, int64_t lds) {
    const void *k = elem_at(elem, k0, j * ldk);
    /* the rows ahead of the block's first key, the others' following them (qk_few_rows) */
    const char *far = row_ahead(elem, k0, next, nk, j + FEW_PREFETCH_KEYS, ldk);
    const char *near = row_ahead(elem, k0, next, nk, j + FEW_NEAR_KEYS, ldk);
    __m256 acc[4][8];
    for (int r = 0; r < 4; r++)
        for (int b = 0; b < nb; b++)
            acc[r][b] = _mm256_setzero_ps();
    int64_t d = 0;
    /* bf16 keys: unless qp is NULL, their first dp features (a multiple of 16) 16 at a time,
     * widened by load_bf16_half, against the rows qp (pair_rows): each lane sums a pair of
     * adjacent features. Each half is widened from the row again (an L1 read) rather than
     * kept: 4 rows by 3 keys fill the 16 registers with the accumulators, keys and a row. */
    if (elem == SDPA__ELEM_BF16 && qp != NULL)
        for (; d < dp; d += 16) {
            __m256 kh[8];
            if (d % 32 == 0) /* once per 64-byte line */
                for (int b = 0; b < nb; b++) {
                    _mm_prefetch(elem_at(elem, far, b * ldk + d), _MM_HINT_T1);
                    _mm_prefetch(elem_at(elem, near, b * ldk + d), _MM_HINT_T0);
                }
            for (int half = 0; half < 2; half++) {
                for (int b = 0; b < nb; b++)
                    kh[b] = load_bf16_half(k, b * ldk + d, half);
                for (int r = 0; r < nr; r++) {
                    const __m256 qv = _mm256_loadu_ps(qp[r] + d + 8 * half);
                    for (int b = 0; b < nb; b++)
                        acc[r][b] = _mm256_fmadd_ps(kh[b], qv, acc[r][b]);
                }
            }
        }
    for (; d + 8 <= dk; d += 8) {
        __m256 kv[8];
        if (d % (elem == SDPA__ELEM_F32 ? 16 : 32) == 0) /* once per 64-byte line */
            for (int b = 0; b < nb; b++) {
                _mm_prefetch(elem_at(elem, far, b * ldk + d), _MM_HINT_T1);
                _mm_prefetch(elem_at(elem, near, b * ldk + d), _MM_HINT_T0);
            }
        for (int b = 0; b < nb; b++)
            kv[b] = load8(elem, k, b * ldk + d);
        for (int r = 0; r < nr; r++) {
            const __m256 qv = _mm256_loadu_ps(q[r] + d);
            for (int b = 0; b < nb; b++)
                acc[r][b] = _mm256_fmadd_ps(kv[b], qv, acc[r][b]);
        }
    }
    if (d < dk) {
        const __m256i dm = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(dk - d)),
                                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 kv[8];
        for (int b = 0; b < nb; b++)
            kv[b] = load8_tail(elem, k, b * ldk + d, dm);
        for (int r = 0; r < nr; r++) {
            const __m256 qv = _mm256_maskload_ps(q[r] + d, dm);
            for (int b = 0; b < nb; b++)
                acc[r][b] = _mm256_fmadd_ps(kv[b], qv, acc[r][b]);
        }
    }
    float scale_mem = scale; /* fetched after the loop, as in qk_block */
    __asm__ volatile("" : "+m"(scale_mem));
    const __m128 sc = _mm_broadcast_ss(&scale_mem);
    for (int b = 0; b < nb; b++) {
        const __m128 key = _mm_mul_ps(sc, hsum4(acc[0][b], acc[1][b], acc[2][b], acc[3][b]));
        _mm256_storeu_ps(s + b * lds, _mm256_set_m128(_mm_setzero_ps(), key));
    }
}

/* Keys [j, end) nb at a time, then the rest one at a time. */
INLINE int64_t qk_few_run(int elem, int nr, int nb, int64_t j, int64_t end, int64_t nk, int64_t dk,
                          const void *k, int64_t ldk, const void *next, const float *const *q,
                          const float *const *qp, int64_t dp, float scale, float *s, int64_t lds) {
    for (; j + nb <= end; j += nb)
        qk_few_block(elem, nr, nb, dk, k, next, nk, j, ldk, q, qp, dp, scale, s + j * lds, lds);
    for (; j < end; j++)
        qk_few_block(elem, nr, 1, dk, k, next, nk, j, ldk, q, qp, dp, scale, s + j * lds, lds);
    return j;
}

/* All keys for nr rows, in three runs cut where the rows FEW_PREFETCH_KEYS and FEW_NEAR_KEYS
 * ahead pass the slice's end, so that no block's rows ahead straddle it: a block asks for
 * consecutive rows from one start, in the slice or at next (a page's end in a paged cache). */
INLINE void qk_few_rows(int elem, int nr, int nb, int64_t nk, int64_t dk, const void *k,
                        int64_t ldk, const void *next, const float *const *q,
                        const float *const *qp, int64_t dp, float scale, float *s, int64_t lds) {
    int64_t j = qk_few_run(elem, nr, nb, 0, nk - FEW_PREFETCH_KEYS, nk, dk, k, ldk, next, q, qp, dp,
                           scale, s, lds);
    j = qk_few_run(elem, nr, nb, j, nk - FEW_NEAR_KEYS, nk, dk, k, ldk, next, q, qp, dp, scale, s,
                   lds);
    qk_few_run(elem, nr, nb, j, nk, nk, dk, k, ldk, next, q, qp, dp, scale, s, lds);
}

/* The most features of a query row that qk_few_half regroups for bf16 keys (on the stack);
 * past them it reads the row in place. */
enum { PAIR_Q_MAX = 512 };

/* qp[r][0, dp) = q[r][0, dp) regrouped as load_bf16_half lays out keys: in each 16
 * features, the even ones, then the odd ones. */
static void pair_rows(int64_t nr, int64_t dp, const float *const *q, float (*qp)[PAIR_Q_MAX]) {
    for (int64_t r = 0; r < nr; r++)
        for (int64_t d = 0; d < dp; d += 16) {
            const __m256 lo = _mm256_loadu_ps(q[r] + d), hi = _mm256_loadu_ps(q[r] + d + 8);
            _mm256_storeu_ps(qp[r] + d, even_of(lo, hi));
            _mm256_storeu_ps(qp[r] + d + 8, odd_of(lo, hi));
        }
}

INLINE void qk_few_elem(int elem, int64_t nk, int64_t nr, int64_t dk, const void *k, int64_t ldk,
                        const void *next, const float *const *q_rows, float scale, float *s,
                        int64_t lds) {
    /* bf16 keys: the query rows regrouped once for the call */
    float qbuf[SDPA__FEW_ROWS][PAIR_Q_MAX];
    const float *qp[SDPA__FEW_ROWS] = {qbuf[0], qbuf[1], qbuf[2], qbuf[3]};
    const int64_t dp = elem == SDPA__ELEM_BF16 ? (dk < PAIR_Q_MAX ? dk : PAIR_Q_MAX) / 16 * 16 : 0;
    if (dp > 0)
        pair_rows(nr < SDPA__FEW_ROWS ? nr : SDPA__FEW_ROWS, dp, q_rows, qbuf);
    const float *const *qpp = dp > 0 ? qp : NULL;
    switch (nr) {
    case 1:
        qk_few_rows(elem, 1, 8, nk, dk, k, ldk, next, q_rows, qpp, dp, scale, s, lds);
        break;
    case 2:
        qk_few_rows(elem, 2, 6, nk, dk, k, ldk, next, q_rows, qpp, dp, scale, s, lds);
        break;
    case 3:
        qk_few_rows(elem, 3, 4, nk, dk, k, ldk, next, q_rows, qpp, dp, scale, s, lds);
        break;
    default:
        qk_few_rows(elem, 4, 3, nk, dk, k, ldk, next, q_rows, qpp, dp, scale, s, lds);
        break;
    }
}

void sdpa__qk_few_avx2(int64_t nk, int64_t nr, int64_t dk, const float *k, int64_t ldk,
                       const float *k_next, const float *const *q_rows, float scale, float *s,
                       int64_t lds) {
    qk_few_elem(SDPA__ELEM_F32, nk, nr, dk, k, ldk, k_next, q_rows, scale, s, lds);
}

void sdpa__qk_few_half_avx2(int elem, int64_t nk, int64_t nr, int64_t dk, const void *k,
                            int64_t ldk, const void *k_next, const float *const *q_rows,
                            float scale, float *s, int64_t lds) {
    if (elem == SDPA__ELEM_F16)
        qk_few_elem(SDPA__ELEM_F16, nk, nr, dk, k, ldk, k_next, q_rows, scale, s, lds);
    else
        qk_few_elem(SDPA__ELEM_BF16, nk, nr, dk, k, ldk, k_next, q_rows, scale, s, lds);
}

/* The first 4 lanes of two keys' rows of scores, key b in 128-bit lane b, and back (the lanes
 * of `keep` only). */
INLINE __m256 two_keys(const float *s, int64_t lds) {
    return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(s)), _mm_loadu_ps(s + lds), 1);
}

INLINE void two_keys_store(float *s, int64_t lds, __m128i keep, __m256 v) {
    _mm_maskstore_ps(s, keep, _mm256_castps256_ps128(v));
    _mm_maskstore_ps(s + lds, keep, _mm256_extractf128_ps(v, 1));
}

/* softmax for a decode step's few rows (ukernels.h): two keys of (up to) four rows in each
 * vector, so that the exp runs on 8 useful lanes rather than 4. The sum over the keys is
 * formed in two partial sums (even and odd keys of the whole pairs), added, then the last key
 * of an odd nk. */
int sdpa__softmax_few_avx2(int64_t nk, int64_t nr, float *s, int64_t lds, float *m, float *l,
                           float *alpha) {
    const __m128i keep = _mm_cmpgt_epi32(_mm_set1_epi32((int)nr), _mm_setr_epi32(0, 1, 2, 3));
    const __m256 rows = _mm256_castsi256_ps(_mm256_set_m128i(keep, keep));
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY), neg_zero = _mm256_set1_ps(-0.0f);
    const __m128 m_old = _mm_maskload_ps(m, keep);
    __m256 mc = neg_inf;
    __m128 mt = m_old;
    int64_t j = 0;
    for (; j + 2 <= nk; j += 2)
        mc = _mm256_max_ps(mc, two_keys(s + j * lds, lds));
    for (; j < nk; j++)
        mt = _mm_max_ps(mt, _mm_loadu_ps(s + j * lds));
    /* a max is exact: softmax's m */
    const __m128 mx =
        _mm_max_ps(mt, _mm_max_ps(_mm256_castps256_ps128(mc), _mm256_extractf128_ps(mc, 1)));
    /* a NaN score need not reach mx: its own weight is NaN, and so becomes l */
    const __m128 u = _mm_blendv_ps(mx, _mm_setzero_ps(), _mm_cmpeq_ps(mx, _mm_set1_ps(-INFINITY)));
    const __m256 u2 = _mm256_set_m128(u, u);
    __m256 a = _mm256_set_m128(_mm_setzero_ps(), _mm_sub_ps(m_old, u));
    exp256_n(1, &a);
    __m256 hidden = _mm256_setzero_ps(), sum = _mm256_setzero_ps();
    for (j = 0; j + 2 <= nk; j += 2) {
        const __m256 x = two_keys(s + j * lds, lds);
        const __m256 inf = _mm256_and_ps(_mm256_cmp_ps(x, neg_inf, _CMP_EQ_OQ), rows);
        hidden = _mm256_or_ps(hidden, inf);
        __m256 e = _mm256_sub_ps(x, u2);
        exp256_n(1, &e);
        const __m256 p = _mm256_blendv_ps(e, neg_zero, inf);
        two_keys_store(s + j * lds, lds, keep, p);
        sum = _mm256_add_ps(sum, p);
    }
    __m128 sum_t = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
    for (; j < nk; j++) {
        const __m128 x = _mm_loadu_ps(s + j * lds);
        const __m128 inf =
            _mm_and_ps(_mm_cmpeq_ps(x, _mm_set1_ps(-INFINITY)), _mm_castsi128_ps(keep));
        hidden = _mm256_or_ps(hidden, _mm256_set_m128(_mm_setzero_ps(), inf));
        __m256 e = _mm256_set_m128(_mm_setzero_ps(), _mm_sub_ps(x, u));
        exp256_n(1, &e);
        const __m128 p = _mm_blendv_ps(_mm256_castps256_ps128(e), _mm_set1_ps(-0.0f), inf);
        _mm_maskstore_ps(s + j * lds, keep, p);
        sum_t = _mm_add_ps(sum_t, p);
    }
    const __m128 a4 = _mm256_castps256_ps128(a);
    _mm_maskstore_ps(alpha, keep, a4);
    _mm_maskstore_ps(l, keep, _mm_fmadd_ps(_mm_maskload_ps(l, keep), a4, sum_t));
    _mm_maskstore_ps(m, keep, mx);
    return _mm256_movemask_ps(hidden) != 0;
}
