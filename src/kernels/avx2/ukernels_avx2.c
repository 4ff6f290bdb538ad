/*
 * ukernels_avx2.c — the flash micro-kernels for AVX2 with FMA; compiled with those flags for
 * this file only, and called only after the dispatcher has checked CPUID and XGETBV. See
 * ukernels.h for what each computes. Compiled with -mf16c too: the decode entries read an f16
 * cache with vcvtph2ps.
 *
 * Register blocking: `mr` broadcast scalars times `nv` vectors of 8 floats, at most 12
 * accumulators of the 16 ymm registers, and nothing else held through the inner loop (a
 * 17th live vector made the compiler spill one of Q to the stack and cost a third of qk's
 * speed); the block functions are always inlined with constant mr and nv so the accumulators
 * stay in registers, and the remainders run as one block of the remaining size (a key at a
 * time would leave the FMA units waiting on latency).
 *
 * A decode step's scores and softmax for its few rows (qk_few, qk_few_half, softmax_few) are
 * in decode_avx2.c (its P V, pv_few, is this file's pv_all); the exp and the widening both files
 * use, in simd_avx2.h.
 */
#include "simd_avx2.h"

/* pack_q: 8 rows x 8 features at a time, transposed in registers (rows past nr read as 0,
 * features past dk are neither read nor stored). After unpacking pairs of floats and of
 * doubles, 128-bit half h of u[4g + m] holds feature 4h + m of rows 4g..4g+3; joining the
 * halves of u[m] and u[4 + m] gives feature m (low halves) and 4 + m (high halves) of rows
 * 0..7. */
static void pack_q_avx2(int64_t nr, int64_t dk, const float *const *rows, float *qt, int64_t ldq) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t r0 = 0; r0 < nr; r0 += 8) {
        const int64_t nrows = nr - r0 < 8 ? nr - r0 : 8;
        for (int64_t d0 = 0; d0 < dk; d0 += 8) {
            const int64_t nd = dk - d0 < 8 ? dk - d0 : 8;
            const __m256i dm = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)nd), lane);
            __m256 x[8], t[8], u[8];
            for (int a = 0; a < 8; a++)
                x[a] = a < nrows ? _mm256_maskload_ps(rows[r0 + a] + d0, dm) : _mm256_setzero_ps();
            for (int a = 0; a < 8; a += 2) {
                t[a] = _mm256_unpacklo_ps(x[a], x[a + 1]);
                t[a + 1] = _mm256_unpackhi_ps(x[a], x[a + 1]);
            }
            for (int g = 0; g < 2; g++) {
                const __m256d t0 = _mm256_castps_pd(t[4 * g]), t1 = _mm256_castps_pd(t[4 * g + 1]);
                const __m256d t2 = _mm256_castps_pd(t[4 * g + 2]);
                const __m256d t3 = _mm256_castps_pd(t[4 * g + 3]);
                u[4 * g] = _mm256_castpd_ps(_mm256_unpacklo_pd(t0, t2));
                u[4 * g + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(t0, t2));
                u[4 * g + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(t1, t3));
                u[4 * g + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(t1, t3));
            }
            for (int m = 0; m < 4; m++) {
                if (m < nd)
                    _mm256_storeu_ps(qt + (d0 + m) * ldq + r0,
                                     _mm256_permute2f128_ps(u[m], u[4 + m], 0x20));
                if (4 + m < nd)
                    _mm256_storeu_ps(qt + (d0 + 4 + m) * ldq + r0,
                                     _mm256_permute2f128_ps(u[m], u[4 + m], 0x31));
            }
        }
    }
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
    /* The scale is fetched after the loop: held in a register through it, it would push a
     * vector of Q out of the 16 (the compiler hoists a broadcast made here otherwise). */
    float scale_mem = scale;
    __asm__ volatile("" : "+m"(scale_mem));
    const __m256 sc = _mm256_broadcast_ss(&scale_mem);
    for (int a = 0; a < mr; a++)
        for (int v = 0; v < nv; v++)
            _mm256_storeu_ps(s + a * lds + 8 * v, _mm256_mul_ps(sc, acc[a][v]));
}

/* n < 6 keys in one block: a key at a time would leave the FMA units waiting on latency. */
INLINE void qk_tail(int64_t n, int nv, int64_t dk, const float *k, int64_t ldk, const float *qt,
                    int64_t ldq, float scale, float *s, int64_t lds) {
    switch (n) {
    case 1:
        qk_block(1, nv, dk, k, ldk, qt, ldq, scale, s, lds);
        break;
    case 2:
        qk_block(2, nv, dk, k, ldk, qt, ldq, scale, s, lds);
        break;
    case 3:
        qk_block(3, nv, dk, k, ldk, qt, ldq, scale, s, lds);
        break;
    case 4:
        qk_block(4, nv, dk, k, ldk, qt, ldq, scale, s, lds);
        break;
    case 5:
        qk_block(5, nv, dk, k, ldk, qt, ldq, scale, s, lds);
        break;
    default:
        break;
    }
}

INLINE void qk_rows(int nv, int64_t nk, int64_t dk, const float *k, int64_t ldk, const float *qt,
                    int64_t ldq, float scale, float *s, int64_t lds) {
    int64_t j = 0;
    for (; j + 6 <= nk; j += 6)
        qk_block(6, nv, dk, k + j * ldk, ldk, qt, ldq, scale, s + j * lds, lds);
    qk_tail(nk - j, nv, dk, k + j * ldk, ldk, qt, ldq, scale, s + j * lds, lds);
}

static void qk_avx2(int64_t nk, int64_t nr, int64_t dk, const float *k, int64_t ldk,
                    const float *qt, int64_t ldq, float scale, float *s, int64_t lds) {
    int64_t r = 0;
    for (; r + 16 <= nr; r += 16)
        qk_rows(2, nk, dk, k, ldk, qt + r, ldq, scale, s + r, lds);
    if (r < nr)
        qk_rows(1, nk, dk, k, ldk, qt + r, ldq, scale, s + r, lds);
}

/* The second pass of the softmax over n keys of one vector of rows: weights, hidden marks
 * and their sum. */
INLINE void softmax_keys(int n, float *s, int64_t lds, __m256 u, __m256 *hidden, __m256 *sum) {
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY), neg_zero = _mm256_set1_ps(-0.0f);
    __m256 x[4], inf[4];
    for (int i = 0; i < n; i++) {
        x[i] = _mm256_loadu_ps(s + i * lds);
        inf[i] = _mm256_cmp_ps(x[i], neg_inf, _CMP_EQ_OQ);
        *hidden = _mm256_or_ps(*hidden, inf[i]);
        x[i] = _mm256_sub_ps(x[i], u);
    }
    exp256_n(n, x);
    for (int i = 0; i < n; i++) {
        const __m256 p = _mm256_blendv_ps(x[i], neg_zero, inf[i]);
        _mm256_storeu_ps(s + i * lds, p);
        sum[i % 2] = _mm256_add_ps(sum[i % 2], p);
    }
}

static int softmax_avx2(int64_t nk, int64_t nr, float *s, int64_t lds, float *m, float *l,
                        float *alpha) {
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
    __m256 hidden = _mm256_setzero_ps();
    for (int64_t r = 0; r < nr; r += 8) {
        /* the max in four independent chains, keys j = 0, 1, 2, 3 mod 4 (a max is exact, so
         * any order gives the same for scores without NaN: 4x shorter latency) */
        const __m256 m_old = _mm256_loadu_ps(m + r);
        __m256 mc[4] = {m_old, neg_inf, neg_inf, neg_inf};
        int64_t j = 0;
        for (; j + 4 <= nk; j += 4)
            for (int c = 0; c < 4; c++)
                mc[c] = _mm256_max_ps(mc[c], _mm256_loadu_ps(s + (j + c) * lds + r));
        for (; j < nk; j++)
            mc[0] = _mm256_max_ps(mc[0], _mm256_loadu_ps(s + j * lds + r));
        const __m256 mx = _mm256_max_ps(_mm256_max_ps(mc[0], mc[1]), _mm256_max_ps(mc[2], mc[3]));
        /* a NaN score need not reach mx: its own weight is NaN, and so becomes l */
        const __m256 u =
            _mm256_blendv_ps(mx, _mm256_setzero_ps(), _mm256_cmp_ps(mx, neg_inf, _CMP_EQ_OQ));
        __m256 a = _mm256_sub_ps(m_old, u);
        exp256_n(1, &a);
        /* two partial sums, added in a fixed order: the result depends on nk only */
        __m256 sum[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
        for (j = 0; j + 4 <= nk; j += 4)
            softmax_keys(4, s + j * lds + r, lds, u, &hidden, sum);
        for (; j < nk; j++)
            softmax_keys(1, s + j * lds + r, lds, u, &hidden, sum);
        /* exp(-inf) is e^-87 here, not 0: a row that has seen nothing keeps l = 0 anyway */
        _mm256_storeu_ps(alpha + r, a);
        _mm256_storeu_ps(l + r,
                         _mm256_fmadd_ps(_mm256_loadu_ps(l + r), a, _mm256_add_ps(sum[0], sum[1])));
        _mm256_storeu_ps(m + r, mx);
    }
    return _mm256_movemask_ps(hidden) != 0;
}

/* exp(s - u) for n vectors of one key's rows (see exp_lse_avx2), u one per lane, or with
 * `one` the single *u for all (exp_lse_rows). */
INLINE void exp_lse_vectors(int n, int one, float *s, const float *u, __m256 *hidden) {
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY), neg_zero = _mm256_set1_ps(-0.0f);
    __m256 x[4], inf[4];
    for (int i = 0; i < n; i++) {
        x[i] = _mm256_loadu_ps(s + 8 * i);
        inf[i] = _mm256_cmp_ps(x[i], neg_inf, _CMP_EQ_OQ);
        *hidden = _mm256_or_ps(*hidden, inf[i]);
        x[i] = _mm256_sub_ps(x[i], one ? _mm256_set1_ps(*u) : _mm256_loadu_ps(u + 8 * i));
    }
    exp256_n(n, x);
    for (int i = 0; i < n; i++)
        _mm256_storeu_ps(s + 8 * i, _mm256_blendv_ps(x[i], neg_zero, inf[i]));
}

/* The backward's weights (ukernels.h): along the rows of one key, four vectors at a time so
 * that their exps interleave (the backward calls it with one key and a tile of keys in the
 * lanes as well as with many keys). */
static int exp_lse_avx2(int64_t nk, int64_t nr, float *s, int64_t lds, const float *u) {
    __m256 hidden = _mm256_setzero_ps();
    for (int64_t j = 0; j < nk; j++) {
        float *s_j = s + j * lds;
        int64_t r = 0;
        for (; r + 32 <= nr; r += 32)
            exp_lse_vectors(4, 0, s_j + r, u + r, &hidden);
        for (; r < nr; r += 8)
            exp_lse_vectors(1, 0, s_j + r, u + r, &hidden);
    }
    return _mm256_movemask_ps(hidden) != 0;
}

/* exp_lse for a row-major tile (ukernels.h): along each row, four vectors at a time. */
static int exp_lse_rows_avx2(int64_t nr, int64_t nk, float *s, int64_t lds, const float *u,
                             int64_t ldu) {
    __m256 hidden = _mm256_setzero_ps();
    for (int64_t r = 0; r < nr; r++) {
        float *s_r = s + r * lds;
        int64_t j = 0;
        for (; j + 32 <= nk; j += 32)
            exp_lse_vectors(4, 1, s_r + j, u + r * ldu, &hidden);
        for (; j < nk; j += 8)
            exp_lse_vectors(1, 1, s_r + j, u + r * ldu, &hidden);
    }
    return _mm256_movemask_ps(hidden) != 0;
}

/* tanh(y), as the AVX-512 table's tanh512 (the same polynomial, switch and clamp): this
 * table's exp is within 1 ulp there. */
INLINE __m256 tanh256(__m256 y) {
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    const __m256 a = _mm256_andnot_ps(sign, y), z = _mm256_mul_ps(a, a);
    __m256 q = _mm256_set1_ps(-0.006269227713346481f);
    q = _mm256_fmadd_ps(q, z, _mm256_set1_ps(0.021066883578896523f));
    q = _mm256_fmadd_ps(q, z, _mm256_set1_ps(-0.05385059863328934f));
    q = _mm256_fmadd_ps(q, z, _mm256_set1_ps(0.13332557678222656f));
    q = _mm256_fmadd_ps(q, z, _mm256_set1_ps(-0.33333316445350647f));
    const __m256 small = _mm256_fmadd_ps(q, _mm256_mul_ps(a, z), a);
    __m256 e = _mm256_min_ps(_mm256_set1_ps(40.0f), _mm256_add_ps(a, a));
    exp256_n(1, &e);
    const __m256 big =
        _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
    const __m256 t =
        _mm256_blendv_ps(big, small, _mm256_cmp_ps(a, _mm256_set1_ps(0.55f), _CMP_LT_OQ));
    return _mm256_or_ps(t, _mm256_and_ps(sign, y));
}

/* softcap (ukernels.h), 8 values a step. */
static void softcap_avx2(int64_t n, float *x, float cap, float *dsdx) {
    const __m256 c = _mm256_set1_ps(cap), one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 t = tanh256(_mm256_div_ps(_mm256_loadu_ps(x + i), c));
        _mm256_storeu_ps(x + i, _mm256_mul_ps(c, t));
        if (dsdx != NULL)
            _mm256_storeu_ps(dsdx + i, _mm256_mul_ps(_mm256_sub_ps(one, t), _mm256_add_ps(one, t)));
    }
    if (i < n) { /* the tail through a vector of copies */
        float xb[8] = {0}, db[8];
        memcpy(xb, x + i, (size_t)(n - i) * sizeof *xb);
        softcap_avx2(8, xb, cap, dsdx != NULL ? db : NULL);
        memcpy(x + i, xb, (size_t)(n - i) * sizeof *xb);
        if (dsdx != NULL)
            memcpy(dsdx + i, db, (size_t)(n - i) * sizeof *db);
    }
}

/* The backward's dS (ukernels.h), 8 lanes at a time, the last vector of a row masked. */
static void ds_avx2(int64_t nr, int64_t n, float *dp, int64_t ld, const float *w, const float *z,
                    const float *dsdx, const float *delta, int per_lane) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i neg_zero_bits = _mm256_set1_epi32((int)0x80000000u);
    const __m256 neg_zero = _mm256_set1_ps(-0.0f);
    for (int64_t r = 0; r < nr; r++) {
        const __m256 dl_r = per_lane ? neg_zero : _mm256_set1_ps(delta[r]);
        for (int64_t c = 0; c < n; c += 8) {
            const __m256i m =
                _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - c < 8 ? n - c : 8)), lane);
            const int64_t e = r * ld + c;
            __m256 x = _mm256_maskload_ps(dp + e, m);
            if (z != NULL)
                x = _mm256_mul_ps(x, _mm256_maskload_ps(z + e, m));
            const __m256 wv = _mm256_maskload_ps(w + e, m);
            const __m256 dl = per_lane ? _mm256_maskload_ps(delta + c, m) : dl_r;
            x = _mm256_mul_ps(wv, _mm256_sub_ps(x, dl));
            if (dsdx != NULL)
                x = _mm256_mul_ps(x, _mm256_maskload_ps(dsdx + e, m));
            const __m256 hid =
                _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_castps_si256(wv), neg_zero_bits));
            _mm256_maskstore_ps(dp + e, m, _mm256_blendv_ps(x, neg_zero, hid));
        }
    }
}

/* Loads and stores of a vector of o or v: the last one of a row (lane mask `last`) only when
 * `masked`, so that full-width rows keep no masks in registers. */
INLINE __m256 load_cols(int masked, __m256i last, const float *x) {
    return masked ? _mm256_maskload_ps(x, last) : _mm256_loadu_ps(x);
}

INLINE void store_cols(int masked, __m256i last, float *x, __m256 y) {
    if (masked)
        _mm256_maskstore_ps(x, last, y);
    else
        _mm256_storeu_ps(x, y);
}

/* o[a][cols] = alpha[a] o[a][cols] + sum_j p[j][a] v[j][cols] for a < mr rows and nv vectors
 * of columns; with `masked`, the last vector is limited to the lanes of `last`. With `tr` the
 * weights are stored transposed, p[a][j] (pv_t). Unless vn is NULL, the same columns of the
 * rows at vn (the next slice's) are asked into L2 as these are read (see pv_all). */
INLINE void pv_block(int tr, int elem, int mr, int nv, int masked, int careful, __m256i last,
                     int64_t nk, const float *p, int64_t ldp, const float *alpha, const void *v,
                     int64_t ldv, const void *vn, float *o, int64_t ldo) {
    __m256 acc[6][8];
    for (int a = 0; a < mr; a++) {
        const __m256 al = _mm256_broadcast_ss(alpha + a);
        for (int c = 0; c < nv; c++)
            acc[a][c] =
                _mm256_mul_ps(al, load_cols(masked && c == nv - 1, last, o + a * ldo + 8 * c));
    }
    for (int64_t j = 0; j < nk; j++) {
        __m256 vv[8];
        if (vn != NULL) /* each 64-byte line the block's columns start */
            for (int c = 0; c < nv; c++)
                if (8 * c % (elem == SDPA__ELEM_F32 ? 16 : 32) == 0)
                    _mm_prefetch(elem_at(elem, vn, j * ldv + 8 * c), _MM_HINT_T1);
        for (int c = 0; c < nv; c++)
            vv[c] = masked && c == nv - 1 ? load8_tail(elem, v, j * ldv + 8 * c, last)
                                          : load8(elem, v, j * ldv + 8 * c);
        for (int a = 0; a < mr; a++) {
            const __m256 pb = _mm256_broadcast_ss(tr ? p + a * ldp + j : p + j * ldp + a);
            /* careful: a zero weight multiplies 0 instead of v, which adds +-0 as it would
             * for a finite v, and not NaN */
            const __m256 hidden =
                careful ? _mm256_cmp_ps(pb, _mm256_setzero_ps(), _CMP_EQ_OQ) : _mm256_setzero_ps();
            for (int c = 0; c < nv; c++)
                acc[a][c] = _mm256_fmadd_ps(pb, careful ? _mm256_andnot_ps(hidden, vv[c]) : vv[c],
                                            acc[a][c]);
        }
    }
    for (int a = 0; a < mr; a++)
        for (int c = 0; c < nv; c++)
            store_cols(masked && c == nv - 1, last, o + a * ldo + 8 * c, acc[a][c]);
}

/* n < 6 rows in one block (see qk_tail). */
INLINE void pv_tail(int tr, int elem, int64_t n, int nv, int masked, int careful, __m256i last,
                    int64_t nk, const float *p, int64_t ldp, const float *alpha, const void *v,
                    int64_t ldv, const void *vn, float *o, int64_t ldo) {
    switch (n) {
    case 1:
        pv_block(tr, elem, 1, nv, masked, careful, last, nk, p, ldp, alpha, v, ldv, vn, o, ldo);
        break;
    case 2:
        pv_block(tr, elem, 2, nv, masked, careful, last, nk, p, ldp, alpha, v, ldv, vn, o, ldo);
        break;
    case 3:
        pv_block(tr, elem, 3, nv, masked, careful, last, nk, p, ldp, alpha, v, ldv, vn, o, ldo);
        break;
    case 4:
        pv_block(tr, elem, 4, nv, masked, careful, last, nk, p, ldp, alpha, v, ldv, vn, o, ldo);
        break;
    case 5:
        if (elem == SDPA__ELEM_F32) /* a half type comes from pv_few: at most 4 rows */
            pv_block(tr, elem, 5, nv, masked, careful, last, nk, p, ldp, alpha, v, ldv, vn, o, ldo);
        break;
    default:
        break;
    }
}

INLINE void pv_cols(int tr, int elem, int nv, int masked, int careful, __m256i last, int64_t nk,
                    int64_t nr, const float *p, int64_t ldp, const float *alpha, const void *v,
                    int64_t ldv, const void *vn, float *o, int64_t ldo) {
    int64_t r = 0;
    if (elem == SDPA__ELEM_F32)
        for (; r + 6 <= nr; r += 6)
            pv_block(tr, elem, 6, nv, masked, careful, last, nk, tr ? p + r * ldp : p + r, ldp,
                     alpha + r, v, ldv, vn, o + r * ldo, ldo);
    pv_tail(tr, elem, nr - r, nv, masked, careful, last, nk, tr ? p + r * ldp : p + r, ldp,
            alpha + r, v, ldv, vn, o + r * ldo, ldo);
}

/* Column c of the rows at vn when c starts a 64-byte line of the row, else NULL (pv_all). */
INLINE const void *line_ahead(int elem, const void *vn, int64_t c) {
    return vn != NULL && (elem == SDPA__ELEM_F32 || c % 32 == 0) ? elem_at(elem, vn, c) : NULL;
}

/* P V over the columns in blocks of 16 (64 or 32 first for one or two rows), each block a pass
 * over the keys. Unless vn is NULL (pv_few: a decode step's few rows), each pass that starts a
 * 64-byte line of the row (every pass of f32, every other of f16 and bf16; each line of a wider
 * block) also requests that line of the rows at vn, the next
 * slice's, into L2: the next slice's V is asked for a slice ahead, spread over this one's work
 * rather than in a burst that would stall the loads behind it (a prefetch never faults). */
INLINE void pv_all(int tr, int elem, int careful, int64_t nk, int64_t nr, int64_t dv,
                   const float *p, int64_t ldp, const float *alpha, const void *v, int64_t ldv,
                   const void *vn, float *o, int64_t ldo) {
    const __m256i none = _mm256_setzero_si256();
    int64_t c = 0;
    /* one or two rows (a decode step without grouped heads, or a group of two): 64 or 32
     * columns a pass, so that 8 accumulators, not 2 or 4, cover the FMAs' latency (each
     * column's sum is the same) */
    if (nr == 1)
        for (; c + 64 <= dv; c += 64)
            pv_block(tr, elem, 1, 8, 0, careful, none, nk, p, ldp, alpha, elem_at(elem, v, c), ldv,
                     vn != NULL ? elem_at(elem, vn, c) : NULL, o + c, ldo);
    if (nr == 2)
        for (; c + 32 <= dv; c += 32)
            pv_block(tr, elem, 2, 4, 0, careful, none, nk, p, ldp, alpha, elem_at(elem, v, c), ldv,
                     vn != NULL ? elem_at(elem, vn, c) : NULL, o + c, ldo);
    for (; c + 16 <= dv; c += 16)
        pv_cols(tr, elem, 2, 0, careful, none, nk, nr, p, ldp, alpha, elem_at(elem, v, c), ldv,
                line_ahead(elem, vn, c), o + c, ldo);
    const int64_t rest = dv - c;
    const void *vc = elem_at(elem, v, c), *vnc = line_ahead(elem, vn, c);
    if (rest == 0)
        return;
    if (rest == 8) {
        pv_cols(tr, elem, 1, 0, careful, none, nk, nr, p, ldp, alpha, vc, ldv, vnc, o + c, ldo);
        return;
    }
    /* lanes below rest % 8 (or all 8) of the last vector */
    const int keep = rest % 8 == 0 ? 8 : (int)(rest % 8);
    const __m256i last =
        _mm256_cmpgt_epi32(_mm256_set1_epi32(keep), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    if (rest > 8)
        pv_cols(tr, elem, 2, 1, careful, last, nk, nr, p, ldp, alpha, vc, ldv, vnc, o + c, ldo);
    else
        pv_cols(tr, elem, 1, 1, careful, last, nk, nr, p, ldp, alpha, vc, ldv, vnc, o + c, ldo);
}

static void pv_avx2(int64_t nk, int64_t nr, int64_t dv, const float *p, int64_t ldp,
                    const float *alpha, const float *v, int64_t ldv, float *o, int64_t ldo) {
    pv_all(0, SDPA__ELEM_F32, 0, nk, nr, dv, p, ldp, alpha, v, ldv, NULL, o, ldo);
}

/* pv with the weights transposed (ukernels.h): the same blocks and order as pv_avx2. */
static void pv_t_avx2(int64_t nk, int64_t nr, int64_t dv, const float *p, int64_t ldp,
                      const float *alpha, const float *v, int64_t ldv, float *o, int64_t ldo) {
    pv_all(1, SDPA__ELEM_F32, 0, nk, nr, dv, p, ldp, alpha, v, ldv, NULL, o, ldo);
}

/* The same blocks and order as pv_avx2. */
static void pv_careful_avx2(int64_t nk, int64_t nr, int64_t dv, const float *p, int64_t ldp,
                            const float *alpha, const float *v, int64_t ldv, float *o,
                            int64_t ldo) {
    pv_all(0, SDPA__ELEM_F32, 1, nk, nr, dv, p, ldp, alpha, v, ldv, NULL, o, ldo);
}

/* pv_avx2 for a decode step's few rows, V's rows in f32, f16 or bf16 (widened as loaded), with
 * the next slice's rows asked for (prefetching changes no result). */
static void pv_few_avx2(int elem, int64_t nk, int64_t nr, int64_t dv, const float *p, int64_t ldp,
                        const float *alpha, const void *v, int64_t ldv, const void *v_next,
                        float *o, int64_t ldo) {
    if (elem == SDPA__ELEM_F32)
        pv_all(0, SDPA__ELEM_F32, 0, nk, nr, dv, p, ldp, alpha, v, ldv, v_next, o, ldo);
    else if (elem == SDPA__ELEM_F16)
        pv_all(0, SDPA__ELEM_F16, 0, nk, nr, dv, p, ldp, alpha, v, ldv, v_next, o, ldo);
    else
        pv_all(0, SDPA__ELEM_BF16, 0, nk, nr, dv, p, ldp, alpha, v, ldv, v_next, o, ldo);
}

const sdpa__ukernels sdpa__uk_avx2 = {
    .name = "avx2",
    .lanes = 8,
    .pack_q = pack_q_avx2,
    .qk = qk_avx2,
    .qk_few = sdpa__qk_few_avx2,
    .qk_few_half = sdpa__qk_few_half_avx2,
    .pv_few = pv_few_avx2,
    .softmax = softmax_avx2,
    .softmax_few = sdpa__softmax_few_avx2,
    .exp_lse = exp_lse_avx2,
    .exp_lse_rows = exp_lse_rows_avx2,
    .ds = ds_avx2,
    .softcap = softcap_avx2,
    .bias = sdpa__bias_avx2,
    .pv = pv_avx2,
    .pv_t = pv_t_avx2,
    .pv_careful = pv_careful_avx2,
    .load_row = sdpa__load_row_avx2,
    .store_row = sdpa__store_row_avx2,
    .dropout_row = sdpa__dropout_row_avx2,
};
