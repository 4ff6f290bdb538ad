/*
 * decode_avx512.c — the AVX-512 table's entries for a decode step's few query rows (ukernels.h:
 * qk_few, qk_few_half, softmax_few; pv_few is ukernels_avx512.c's): the rows' scores against keys
 * read in place from the cache, f32 or widened from f16 or bf16 in registers, a block of four keys
 * at a time, and their online softmax with four keys of (up to) four rows in each vector. Compiled
 * with the table's AVX-512 flags for this file only; the table itself is in ukernels_avx512.c.
 */
#include "simd_avx512.h"

/* How many keys ahead qk_few asks for K rows: a decode step does too little arithmetic per
 * byte for the out-of-order window alone to keep enough DRAM reads in flight (as in the AVX2
 * table). Rows FEW_PREFETCH_KEYS ahead are asked into L2 (T1), which holds more reads in
 * flight than L1's fill buffers; rows FEW_NEAR_KEYS ahead are then asked from L2 into L1 (T0).
 * Against T0 alone 16 keys ahead: Hq=32 Hkv=8 D=128 Lk=32768 from 74 to 93 % of the read
 * bandwidth with an f32 cache, from 70 to 77 % with f16 (an Intel Xeon). A prefetch past the
 * end of K never faults. */
enum { FEW_PREFETCH_KEYS = 16, FEW_NEAR_KEYS = 4 };

/* Sums of four vectors, one per 128-bit result lane: [sum a0, sum a1, sum a2, sum a3]. */
INLINE __m128 hsum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    /* pairs, then quads, within each 128-bit lane ... */
    const __m512 s01 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
    const __m512 s23 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
    const __m512 s = _mm512_add_ps(
        _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(s01), _mm512_castps_pd(s23))),
        _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(s01), _mm512_castps_pd(s23))));
    /* ... then across the four lanes */
    const __m512 t = _mm512_add_ps(s, _mm512_shuffle_f32x4(s, s, 0x4e));
    const __m512 u = _mm512_add_ps(t, _mm512_shuffle_f32x4(t, t, 0xb1));
    return _mm512_castps512_ps128(u);
}

/* The sums of the 16 lanes of each of acc[r][b] (r, b < 4), key b's in 128-bit lane b, row r
 * in its lane r: pairs, then quads within each 128-bit lane, as hsum4 does (for four keys of
 * a row), then across the lanes, the four vectors at once: 30 shuffles and 15 adds where four
 * hsum4 and a transpose take 40 and 20. Each sum's lanes are added in hsum4's order, so it is
 * bitwise hsum4's. */
INLINE __m512 hsum16(__m512 acc[4][4]) {
    __m512 v[4];
    for (int b = 0; b < 4; b++) {
        const __m512 s01 = _mm512_add_ps(_mm512_unpacklo_ps(acc[0][b], acc[1][b]),
                                         _mm512_unpackhi_ps(acc[0][b], acc[1][b]));
        const __m512 s23 = _mm512_add_ps(_mm512_unpacklo_ps(acc[2][b], acc[3][b]),
                                         _mm512_unpackhi_ps(acc[2][b], acc[3][b]));
        v[b] = _mm512_add_ps(
            _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(s01), _mm512_castps_pd(s23))),
            _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(s01), _mm512_castps_pd(s23))));
    }
    /* lanes (0 + 2) and (1 + 3) of keys 0, 1 and of keys 2, 3; then the two added */
    const __m512 w01 = _mm512_add_ps(_mm512_shuffle_f32x4(v[0], v[1], 0x44),
                                     _mm512_shuffle_f32x4(v[0], v[1], 0xee));
    const __m512 w23 = _mm512_add_ps(_mm512_shuffle_f32x4(v[2], v[3], 0x44),
                                     _mm512_shuffle_f32x4(v[2], v[3], 0xee));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w01, w23, 0x88),
                         _mm512_shuffle_f32x4(w01, w23, 0xdd));
}

/* One vector of features (from d; lanes dm when `masked`) of qk_few_block's products; far and
 * near: the rows FEW_PREFETCH_KEYS and FEW_NEAR_KEYS keys ahead of the block's first, the
 * others' following them (qk_few_rows). */
INLINE void qk_few_step(int elem, int masked, __mmask16 dm, int nr, int nb, const void *k,
                        int64_t ldk, const char *far, const char *near, const float *const *q,
                        int64_t d, __m512 acc[4][4]) {
    __m512 kv[4];
    if (elem == SDPA__ELEM_F32 || d % 32 == 0) /* once per 64-byte line */
        for (int b = 0; b < nb; b++) {
            _mm_prefetch(elem_at(elem, far, b * ldk + d), _MM_HINT_T1);
            _mm_prefetch(elem_at(elem, near, b * ldk + d), _MM_HINT_T0);
        }
    for (int b = 0; b < nb; b++)
        kv[b] = masked ? load_elems(elem, k, b * ldk + d, dm) : load_full(elem, k, b * ldk + d);
    for (int r = 0; r < nr; r++) {
        const __m512 qv = masked ? _mm512_maskz_loadu_ps(dm, q[r] + d) : _mm512_loadu_ps(q[r] + d);
        for (int b = 0; b < nb; b++)
            acc[r][b] = _mm512_fmadd_ps(kv[b], qv, acc[r][b]);
    }
}

/* qk_few_step for 32 bf16 features from d, widened by load_bf16_pairs, against the query
 * rows qp regrouped to match (pair_rows): each lane sums a pair of adjacent features. */
INLINE void qk_pair_step(int nr, int nb, const void *k, int64_t ldk, const char *far,
                         const char *near, const float *const *qp, int64_t d, __m512 acc[4][4]) {
    __m512 ke[4], ko[4];
    for (int b = 0; b < nb; b++) { /* (32 elements: one 64-byte line) */
        _mm_prefetch(elem_at(SDPA__ELEM_BF16, far, b * ldk + d), _MM_HINT_T1);
        _mm_prefetch(elem_at(SDPA__ELEM_BF16, near, b * ldk + d), _MM_HINT_T0);
    }
    for (int b = 0; b < nb; b++)
        load_bf16_pairs(k, b * ldk + d, &ke[b], &ko[b]);
    for (int r = 0; r < nr; r++) {
        const __m512 qe = _mm512_loadu_ps(qp[r] + d), qo = _mm512_loadu_ps(qp[r] + d + 16);
        for (int b = 0; b < nb; b++)
            acc[r][b] = _mm512_fmadd_ps(ke[b], qe, acc[r][b]);
        for (int b = 0; b < nb; b++)
            acc[r][b] = _mm512_fmadd_ps(ko[b], qo, acc[r][b]);
    }
}

/* qk_few for nr rows and a block of nb <= 4 keys, keys [j, j + nb) of a slice of nk at k0
 * (followed by the rows at next): 16 features at a time along each key row, the keys'
 * elements of type elem (the cache's: widened in registers). For bf16 keys, unless qp is
 * NULL, the first dp features, a multiple of 32, go 32 at a time through qk_pair_step,
 * against the rows qp (q's first dp features regrouped by pair_rows). */
INLINE void qk_few_block(int elem, int nr, int nb, int64_t dk, const void *k0, const void *next,
                         int64_t nk, int64_t j, int64_t ldk, const float *const *q,
                         const float *const *qp, int64_t dp, float scale, float *s, int64_t lds) {
    const void *k = elem_at(elem, k0, j * ldk);
    const char *far = row_ahead(elem, k0, next, nk, j + FEW_PREFETCH_KEYS, ldk);
    const char *near = row_ahead(elem, k0, next, nk, j + FEW_NEAR_KEYS, ldk);
    __m512 acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int b = 0; b < 4; b++)
            acc[r][b] = _mm512_setzero_ps();
    /* whole vectors of features with plain loads (a masked load costs one more operation on
     * the ports the FMAs use: a fifth of qk_few's time at D = 128), then the masked tail */
    int64_t d = 0;
    if (elem == SDPA__ELEM_BF16 && qp != NULL)
        for (; d < dp; d += 32)
            qk_pair_step(nr, nb, k, ldk, far, near, qp, d, acc);
    for (; d + 16 <= dk; d += 16)
        qk_few_step(elem, 0, 0xffff, nr, nb, k, ldk, far, near, q, d, acc);
    if (d < dk)
        qk_few_step(elem, 1, (__mmask16)((1u << (dk - d)) - 1u), nr, nb, k, ldk, far, near, q, d,
                    acc);
    if (nr >= 3) { /* (rows past nr sum their zeros) */
        const __m512 all = _mm512_mul_ps(_mm512_set1_ps(scale), hsum16(acc));
        _mm512_storeu_ps(s, _mm512_zextps128_ps512(_mm512_castps512_ps128(all)));
        if (nb > 1)
            _mm512_storeu_ps(s + lds, _mm512_zextps128_ps512(_mm512_extractf32x4_ps(all, 1)));
        if (nb > 2)
            _mm512_storeu_ps(s + 2 * lds, _mm512_zextps128_ps512(_mm512_extractf32x4_ps(all, 2)));
        if (nb > 3)
            _mm512_storeu_ps(s + 3 * lds, _mm512_zextps128_ps512(_mm512_extractf32x4_ps(all, 3)));
        return;
    }
    /* row r's sums for the nb keys, then one vector of lanes per key: lanes [0, nr) */
    __m128 row[4];
    for (int r = 0; r < 4; r++)
        row[r] = r < nr ? _mm_mul_ps(_mm_set1_ps(scale),
                                     hsum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]))
                        : _mm_setzero_ps();
    const __m128 t0 = _mm_unpacklo_ps(row[0], row[1]), t1 = _mm_unpackhi_ps(row[0], row[1]);
    const __m128 t2 = _mm_unpacklo_ps(row[2], row[3]), t3 = _mm_unpackhi_ps(row[2], row[3]);
    const __m128 key[4] = {_mm_movelh_ps(t0, t2), _mm_movehl_ps(t2, t0), _mm_movelh_ps(t1, t3),
                           _mm_movehl_ps(t3, t1)};
    for (int b = 0; b < nb; b++)
        _mm512_storeu_ps(s + b * lds, _mm512_zextps128_ps512(key[b]));
}

/* Keys [j, end) in blocks of 4, then the rest in one block. */
INLINE int64_t qk_few_run(int elem, int nr, int64_t j, int64_t end, int64_t nk, int64_t dk,
                          const void *k, int64_t ldk, const void *next, const float *const *q,
                          const float *const *qp, int64_t dp, float scale, float *s, int64_t lds) {
    for (; j + 4 <= end; j += 4)
        qk_few_block(elem, nr, 4, dk, k, next, nk, j, ldk, q, qp, dp, scale, s + j * lds, lds);
    switch (end - j) {
    case 3:
        qk_few_block(elem, nr, 3, dk, k, next, nk, j, ldk, q, qp, dp, scale, s + j * lds, lds);
        break;
    case 2:
        qk_few_block(elem, nr, 2, dk, k, next, nk, j, ldk, q, qp, dp, scale, s + j * lds, lds);
        break;
    case 1:
        qk_few_block(elem, nr, 1, dk, k, next, nk, j, ldk, q, qp, dp, scale, s + j * lds, lds);
        break;
    default:
        break;
    }
    return end > j ? end : j;
}

/* The keys in three runs, cut where the rows FEW_PREFETCH_KEYS and FEW_NEAR_KEYS ahead pass
 * the slice's end, so that no block's rows ahead straddle it: a block asks for consecutive
 * rows from one start, in the slice or at next (a page's end in a paged cache). At 64 keys
 * the runs are whole blocks. */
INLINE void qk_few_rows(int elem, int nr, int64_t nk, int64_t dk, const void *k, int64_t ldk,
                        const void *next, const float *const *q, const float *const *qp, int64_t dp,
                        float scale, float *s, int64_t lds) {
    int64_t j = qk_few_run(elem, nr, 0, nk - FEW_PREFETCH_KEYS, nk, dk, k, ldk, next, q, qp, dp,
                           scale, s, lds);
    j = qk_few_run(elem, nr, j, nk - FEW_NEAR_KEYS, nk, dk, k, ldk, next, q, qp, dp, scale, s, lds);
    qk_few_run(elem, nr, j, nk, nk, dk, k, ldk, next, q, qp, dp, scale, s, lds);
}

/* The most features of a query row that qk_few_half regroups for bf16 keys (on the stack);
 * past them it reads the row in place. */
enum { PAIR_Q_MAX = 512 };

/* qp[r][0, dp) = q[r][0, dp) regrouped as load_bf16_pairs lays out keys: in each 32
 * features, the even ones, then the odd ones. */
static void pair_rows(int64_t nr, int64_t dp, const float *const *q, float (*qp)[PAIR_Q_MAX]) {
    for (int64_t r = 0; r < nr; r++)
        for (int64_t d = 0; d < dp; d += 32) {
            const __m512 lo = _mm512_loadu_ps(q[r] + d), hi = _mm512_loadu_ps(q[r] + d + 16);
            _mm512_storeu_ps(qp[r] + d, even_of(lo, hi));
            _mm512_storeu_ps(qp[r] + d + 16, odd_of(lo, hi));
        }
}

INLINE void qk_few_elem(int elem, int64_t nk, int64_t nr, int64_t dk, const void *k, int64_t ldk,
                        const void *next, const float *const *q_rows, float scale, float *s,
                        int64_t lds) {
    /* bf16 keys: the query rows regrouped once for the call */
    float qbuf[SDPA__FEW_ROWS][PAIR_Q_MAX];
    const float *qp[SDPA__FEW_ROWS] = {qbuf[0], qbuf[1], qbuf[2], qbuf[3]};
    const int64_t dp = elem == SDPA__ELEM_BF16 ? (dk < PAIR_Q_MAX ? dk : PAIR_Q_MAX) / 32 * 32 : 0;
    if (dp > 0)
        pair_rows(nr < SDPA__FEW_ROWS ? nr : SDPA__FEW_ROWS, dp, q_rows, qbuf);
    const float *const *qpp = dp > 0 ? qp : NULL;
    switch (nr) {
    case 1:
        qk_few_rows(elem, 1, nk, dk, k, ldk, next, q_rows, qpp, dp, scale, s, lds);
        break;
    case 2:
        qk_few_rows(elem, 2, nk, dk, k, ldk, next, q_rows, qpp, dp, scale, s, lds);
        break;
    case 3:
        qk_few_rows(elem, 3, nk, dk, k, ldk, next, q_rows, qpp, dp, scale, s, lds);
        break;
    default:
        qk_few_rows(elem, 4, nk, dk, k, ldk, next, q_rows, qpp, dp, scale, s, lds);
        break;
    }
}

void sdpa__qk_few_avx512(int64_t nk, int64_t nr, int64_t dk, const float *k, int64_t ldk,
                         const float *k_next, const float *const *q_rows, float scale, float *s,
                         int64_t lds) {
    qk_few_elem(SDPA__ELEM_F32, nk, nr, dk, k, ldk, k_next, q_rows, scale, s, lds);
}

void sdpa__qk_few_half_avx512(int elem, int64_t nk, int64_t nr, int64_t dk, const void *k,
                              int64_t ldk, const void *k_next, const float *const *q_rows,
                              float scale, float *s, int64_t lds) {
    if (elem == SDPA__ELEM_F16)
        qk_few_elem(SDPA__ELEM_F16, nk, nr, dk, k, ldk, k_next, q_rows, scale, s, lds);
    else
        qk_few_elem(SDPA__ELEM_BF16, nk, nr, dk, k, ldk, k_next, q_rows, scale, s, lds);
}

/* The first 4 lanes of four keys' rows of scores, key b in 128-bit lane b. */
INLINE __m512 four_keys(const float *s, int64_t lds) {
    __m512 v = _mm512_castps128_ps512(_mm_loadu_ps(s));
    v = _mm512_insertf32x4(v, _mm_loadu_ps(s + lds), 1);
    v = _mm512_insertf32x4(v, _mm_loadu_ps(s + 2 * lds), 2);
    return _mm512_insertf32x4(v, _mm_loadu_ps(s + 3 * lds), 3);
}

/* The lanes [0, 4) of four keys' rows back from four_keys' layout, those of `keep` only. */
INLINE void four_keys_store(float *s, int64_t lds, __mmask8 keep, __m512 v) {
    _mm_mask_storeu_ps(s, keep, _mm512_castps512_ps128(v));
    _mm_mask_storeu_ps(s + lds, keep, _mm512_extractf32x4_ps(v, 1));
    _mm_mask_storeu_ps(s + 2 * lds, keep, _mm512_extractf32x4_ps(v, 2));
    _mm_mask_storeu_ps(s + 3 * lds, keep, _mm512_extractf32x4_ps(v, 3));
}

/* The four 128-bit lanes of x folded, ((x0 + x2) + (x1 + x3)), or their max. */
INLINE __m128 fold4(int max, __m512 x) {
    const __m512 h = _mm512_shuffle_f32x4(x, x, 0x4e);
    const __m512 t = max ? _mm512_max_ps(x, h) : _mm512_add_ps(x, h);
    const __m512 q = _mm512_shuffle_f32x4(t, t, 0xb1);
    return _mm512_castps512_ps128(max ? _mm512_max_ps(t, q) : _mm512_add_ps(t, q));
}

/* softmax for a decode step's few rows (ukernels.h): four keys of (up to) four rows in each
 * vector, so that the exp runs on 16 useful lanes rather than 4. The sum over the keys is
 * formed in four partial sums (keys j = 0, 1, 2, 3 mod 4 of the whole groups of four), folded
 * ((0 + 2) + (1 + 3)), then the last nk mod 4 keys one at a time. */
int sdpa__softmax_few_avx512(int64_t nk, int64_t nr, float *s, int64_t lds, float *m, float *l,
                             float *alpha) {
    const __mmask8 keep = (__mmask8)((1u << nr) - 1u);
    const __mmask16 rows = (__mmask16)(0x1111u * keep); /* lanes [0, nr) of each key */
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY), neg_zero = _mm512_set1_ps(-0.0f);
    const __m128 m_old = _mm_maskz_loadu_ps(keep, m);
    __m512 mc = neg_inf;
    __m128 mt = m_old;
    int64_t j = 0;
    for (; j + 4 <= nk; j += 4)
        mc = _mm512_max_ps(mc, four_keys(s + j * lds, lds));
    for (; j < nk; j++)
        mt = _mm_max_ps(mt, _mm_loadu_ps(s + j * lds));
    const __m128 mx = _mm_max_ps(mt, fold4(1, mc)); /* a max is exact: softmax's m */
    /* a NaN score need not reach mx: its own weight is NaN, and so becomes l */
    const __m128 u = _mm_blendv_ps(mx, _mm_setzero_ps(), _mm_cmpeq_ps(mx, _mm_set1_ps(-INFINITY)));
    const __m512 u4 = _mm512_broadcast_f32x4(u);
    /* (alpha = 0 where the row has seen nothing yet; lanes from nr on, and the upper 12, are
     * not computed) */
    const __m512 d = _mm512_castps128_ps512(_mm_sub_ps(m_old, u));
    const __mmask16 none = _mm512_cmp_ps_mask(d, neg_inf, _CMP_EQ_OQ) | (__mmask16) ~(rows & 0xf);
    const __m128 a = _mm512_castps512_ps128(exp512(d, none, _mm512_setzero_ps(), 0, EXP_LO));
    __mmask16 hidden = 0;
    __m512 sum = _mm512_setzero_ps();
    for (j = 0; j + 4 <= nk; j += 4) {
        const __m512 x = four_keys(s + j * lds, lds);
        const __mmask16 inf = _mm512_cmp_ps_mask(x, neg_inf, _CMP_EQ_OQ) & rows;
        hidden |= inf;
        /* (the lanes from nr on are not computed: -0.0, and never stored) */
        const __m512 p =
            exp512(_mm512_sub_ps(x, u4), inf | (__mmask16)~rows, neg_zero, WEIGHT_EXP2, EXP_LO);
        four_keys_store(s + j * lds, lds, keep, p);
        sum = _mm512_add_ps(sum, p);
    }
    __m128 sum_t = fold4(0, sum);
    for (; j < nk; j++) {
        const __m512 x = _mm512_castps128_ps512(_mm_loadu_ps(s + j * lds));
        const __mmask16 inf = _mm512_cmp_ps_mask(x, neg_inf, _CMP_EQ_OQ) & rows & 0xf;
        hidden |= inf;
        const __m128 p = _mm512_castps512_ps128(exp512(
            _mm512_sub_ps(x, u4), inf | (__mmask16) ~(rows & 0xf), neg_zero, WEIGHT_EXP2, EXP_LO));
        _mm_mask_storeu_ps(s + j * lds, keep, p);
        sum_t = _mm_add_ps(sum_t, p);
    }
    _mm_mask_storeu_ps(alpha, keep, a);
    _mm_mask_storeu_ps(l, keep, _mm_fmadd_ps(_mm_maskz_loadu_ps(keep, l), a, sum_t));
    _mm_mask_storeu_ps(m, keep, mx);
    return hidden != 0;
}
