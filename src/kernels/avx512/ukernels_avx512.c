/*
 * ukernels_avx512.c — the flash micro-kernels for AVX-512 (F, DQ, BW, VL) with FMA; compiled
 * with those flags for this file only, and called only after the dispatcher has checked CPUID
 * and XGETBV. See ukernels.h for what each computes.
 *
 * Register blocking: a block of `mr` broadcast scalars times `nv` vectors of 16 floats, with
 * mr x nv <= 24 accumulators of the 32 zmm registers. The block functions are always inlined
 * with constant mr and nv, so the compiler keeps the accumulators in registers.
 *
 * A decode step's scores and softmax for its few rows (qk_few, qk_few_half, softmax_few) are
 * in decode_avx512.c (its P V, pv_few, is this file's pv_all); the exp and the widening both files
 * use, in simd_avx512.h.
 */
#include "simd_avx512.h"

/* pack_q: 16 rows x 16 features at a time, transposed in registers. After unpacking pairs of
 * floats and of doubles, 128-bit lane k of u[4g + m] holds feature 4k + m of rows 4g..4g+3;
 * two rounds of lane shuffles gather those four pieces into feature 4k + m of rows 0..15. */
static void pack_q_avx512(int64_t nr, int64_t dk, const float *const *rows, float *qt,
                          int64_t ldq) {
    for (int64_t r0 = 0; r0 < nr; r0 += 16) {
        const int64_t nrows = nr - r0 < 16 ? nr - r0 : 16;
        for (int64_t d0 = 0; d0 < dk; d0 += 16) {
            const int64_t nd = dk - d0 < 16 ? dk - d0 : 16;
            const __mmask16 dm = (__mmask16)(nd == 16 ? 0xffff : (1u << nd) - 1u);
            __m512 x[16], t[16], u[16];
            for (int a = 0; a < 16; a++)
                x[a] =
                    a < nrows ? _mm512_maskz_loadu_ps(dm, rows[r0 + a] + d0) : _mm512_setzero_ps();
            for (int a = 0; a < 16; a += 2) {
                t[a] = _mm512_unpacklo_ps(x[a], x[a + 1]);
                t[a + 1] = _mm512_unpackhi_ps(x[a], x[a + 1]);
            }
            for (int g = 0; g < 4; g++) {
                const __m512d t0 = _mm512_castps_pd(t[4 * g]), t1 = _mm512_castps_pd(t[4 * g + 1]);
                const __m512d t2 = _mm512_castps_pd(t[4 * g + 2]);
                const __m512d t3 = _mm512_castps_pd(t[4 * g + 3]);
                u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
                u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
                u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
                u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
            }
            for (int m = 0; m < 4; m++) {
                const __m512 x0 = _mm512_shuffle_f32x4(u[m], u[4 + m], 0x44);
                const __m512 x1 = _mm512_shuffle_f32x4(u[m], u[4 + m], 0xee);
                const __m512 y0 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0x44);
                const __m512 y1 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0xee);
                const __m512 col[4] = {
                    _mm512_shuffle_f32x4(x0, y0, 0x88), _mm512_shuffle_f32x4(x0, y0, 0xdd),
                    _mm512_shuffle_f32x4(x1, y1, 0x88), _mm512_shuffle_f32x4(x1, y1, 0xdd)};
                for (int k = 0; k < 4; k++)
                    if (4 * k + m < nd)
                        _mm512_storeu_ps(qt + (d0 + 4 * k + m) * ldq + r0, col[k]);
            }
        }
    }
}

/* s[a][16v..] = sum_d k[a][d] * qt[d][16v..] for a < mr keys, v < nv vectors of rows. */
INLINE void qk_block(int mr, int nv, int64_t dk, const float *k, int64_t ldk, const float *qt,
                     int64_t ldq, float scale, float *s, int64_t lds) {
    __m512 acc[12][4];
    for (int a = 0; a < mr; a++)
        for (int v = 0; v < nv; v++)
            acc[a][v] = _mm512_setzero_ps();
    for (int64_t d = 0; d < dk; d++) {
        __m512 q[4];
        for (int v = 0; v < nv; v++)
            q[v] = _mm512_loadu_ps(qt + d * ldq + 16 * v);
        for (int a = 0; a < mr; a++) {
            const __m512 kb = _mm512_set1_ps(k[a * ldk + d]);
            for (int v = 0; v < nv; v++)
                acc[a][v] = _mm512_fmadd_ps(kb, q[v], acc[a][v]);
        }
    }
    const __m512 sc = _mm512_set1_ps(scale);
    for (int a = 0; a < mr; a++)
        for (int v = 0; v < nv; v++)
            _mm512_storeu_ps(s + a * lds + 16 * v, _mm512_mul_ps(sc, acc[a][v]));
}

/* n < 12 keys in one block: a key at a time would leave the FMA units waiting on latency.
 * Each case is qk_block with a constant key count, so its accumulators stay in registers. */
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
    case 6:
        qk_block(6, nv, dk, k, ldk, qt, ldq, scale, s, lds);
        break;
    case 7:
        qk_block(7, nv, dk, k, ldk, qt, ldq, scale, s, lds);
        break;
    case 8:
        qk_block(8, nv, dk, k, ldk, qt, ldq, scale, s, lds);
        break;
    case 9:
        qk_block(9, nv, dk, k, ldk, qt, ldq, scale, s, lds);
        break;
    case 10:
        qk_block(10, nv, dk, k, ldk, qt, ldq, scale, s, lds);
        break;
    case 11:
        qk_block(11, nv, dk, k, ldk, qt, ldq, scale, s, lds);
        break;
    default:
        break;
    }
}

/* All keys against nv vectors of rows, mr keys at a time, then the tail in one block. */
INLINE void qk_rows(int mr, int nv, int64_t nk, int64_t dk, const float *k, int64_t ldk,
                    const float *qt, int64_t ldq, float scale, float *s, int64_t lds) {
    int64_t j = 0;
    for (; j + mr <= nk; j += mr)
        qk_block(mr, nv, dk, k + j * ldk, ldk, qt, ldq, scale, s + j * lds, lds);
    qk_tail(nk - j, nv, dk, k + j * ldk, ldk, qt, ldq, scale, s + j * lds, lds);
}

static void qk_avx512(int64_t nk, int64_t nr, int64_t dk, const float *k, int64_t ldk,
                      const float *qt, int64_t ldq, float scale, float *s, int64_t lds) {
    int64_t r = 0;
    for (; r + 64 <= nr; r += 64)
        qk_rows(6, 4, nk, dk, k, ldk, qt + r, ldq, scale, s + r, lds);
    switch ((nr - r) / 16) {
    case 3:
        qk_rows(8, 3, nk, dk, k, ldk, qt + r, ldq, scale, s + r, lds);
        break;
    case 2:
        qk_rows(12, 2, nk, dk, k, ldk, qt + r, ldq, scale, s + r, lds);
        break;
    case 1:
        qk_rows(12, 1, nk, dk, k, ldk, qt + r, ldq, scale, s + r, lds);
        break;
    default:
        break;
    }
}

/* exp(x) * 2^WEIGHT_EXP2 for weights that are rounded to bf16 next (softmax_bf16p), in the
 * lanes outside `hide`, v in those; +0 below -104, as exp512. 2^(x log2 e) is split as 2^n 2^f
 * with n = round(x log2 e) by the shifter (one add; round to nearest) and f = x log2 e - n by
 * one FMA with log2 e in f32 (off by up to |x| 1.9e-8, 1.4e-6 of the result at x = -104);
 * 2^f, |f| <= 1/2, by a degree-4 polynomial (its constant 1, so that exp(0) is 1 exactly, as
 * exp512 gives it; the others fitted for relative error on [-1/2, 1/2] by
 * tools/fit_exp2.py 4, 2.8e-6 there; scaled by 2^WEIGHT_EXP2, exactly) and 2^n applied by
 * vscalefps, whose mask gives +0 below -104 (whatever n and f are there: the masked lanes
 * cost no assist, scores of -1e9 or -110 took as long as others within the run-to-run
 * noise, bench/softmax_bf16p.c). Within 4.25e-6 relative of exp(x) on [-104, 0] (the worst
 * of a million random x, the same program), which rounding to bf16 (2^-9 relative) hides 400
 * times over; ten vector instructions against exp512's sixteen. (With log2 e in two parts and
 * degree 5, 2.3 ulp: a key's weight cost 1.5-2 TSC cycles more per 16 rows,
 * bench/mx_kernels.c, an Intel Xeon with AMX.) */
INLINE __m512 exp512_bf16p(__m512 x, __mmask16 hide, __m512 v) {
    const __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(EXP_LO), _CMP_LT_OQ);
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f), shifter = _mm512_set1_ps(0x1.8p23f);
    const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, log2e, shifter), shifter);
    const __m512 f = _mm512_fmsub_ps(x, log2e, n); /* NaN x: NaN f, n and result */
    const float e = 0x1p25f;                       /* 2^WEIGHT_EXP2 */
    __m512 p = _mm512_set1_ps(0x1.3a02f4p-7f * e);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0x1.c9fc6ep-5f * e));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0x1.ec0378p-3f * e));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0x1.62e12cp-1f * e));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(e));
    return _mm512_mask_blend_ps(hide, _mm512_maskz_scalef_ps((__mmask16)~under, p, n), v);
}
_Static_assert(WEIGHT_EXP2 == 25, "exp512_bf16p's coefficients carry 2^WEIGHT_EXP2");

/* The weights of keys [0, nk) for one vector of rows (the softmax's second pass), stored
 * over their scores, and their sum: exp512 or, with bf16p, exp512_bf16p of sc s - u. With
 * `careful`, the scores are scaled first (sc s rounded, then minus u: for bf16p; softmax's sc
 * is 1) and a hidden key's (sc s = -inf) weight is -0.0, the keys' union going to *hidden;
 * without, the caller has seen that no scaled score is -inf or +inf, so that sc s - u is one
 * FMA (bf16p) and the two instructions a key that finding hidden ones takes are saved (bf16p
 * and careful are compile-time constants where this is inlined). */
INLINE __m512 softmax_weights(int bf16p, int careful, int64_t nk, float *s, int64_t lds, __m512 u,
                              __m512 sc, __mmask16 *hidden) {
    const __m512 neg_zero = _mm512_set1_ps(-0.0f);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < nk; j++) {
        const __m512 x = _mm512_loadu_ps(s + j * lds);
        __m512 d;
        __mmask16 inf = 0;
        if (bf16p && !careful)
            d = _mm512_fmsub_ps(x, sc, u);
        else {
            const __m512 xs = bf16p ? _mm512_mul_ps(x, sc) : x;
            if (careful)
                inf = _mm512_cmp_ps_mask(xs, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ);
            d = _mm512_sub_ps(xs, u);
        }
        *hidden |= inf;
        const __m512 p =
            bf16p ? exp512_bf16p(d, inf, neg_zero) : exp512(d, inf, neg_zero, WEIGHT_EXP2, EXP_LO);
        _mm512_storeu_ps(s + j * lds, p);
        sum = _mm512_add_ps(sum, p);
    }
    return sum;
}

/* The online-softmax step (ukernels.h) with exp512 for its weights, or with exp512_bf16p
 * (bf16p, a compile-time constant where this is inlined) on the scores times `scale`
 * (softmax's is 1); alpha by exp512 in both. */
INLINE int softmax_body(int bf16p, int64_t nk, int64_t nr, float *s, int64_t lds, float scale,
                        float *m, float *l, float *alpha) {
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY), pos_inf = _mm512_set1_ps(INFINITY);
    const __m512 sc = _mm512_set1_ps(scale);
    __mmask16 hidden = 0;
    for (int64_t r = 0; r < nr; r += 16) {
        /* the max and the min in four independent chains each, keys j = 0, 1, 2, 3 mod 4 (a
         * max is exact, so any order gives the same for scores without NaN: 4x shorter
         * latency); the min, which passes over a NaN (vminps gives its second operand where
         * either is one), says whether a key is hidden. For bf16p the chains take the
         * unscaled scores, the max passing over a NaN too (so that, with a negative scale,
         * it still finds a +inf score: a hidden key), and the scale is applied to their max
         * and min after (to the min and the max where it is negative): rounding is
         * monotonic, so these are the max and the min of the scaled scores */
        const __m512 m_old = _mm512_loadu_ps(m + r);
        __m512 mc[4] = {bf16p ? neg_inf : m_old, neg_inf, neg_inf, neg_inf};
        __m512 nc[4] = {pos_inf, pos_inf, pos_inf, pos_inf};
        int64_t j = 0;
        for (; j + 4 <= nk; j += 4)
            for (int c = 0; c < 4; c++) {
                const __m512 x = _mm512_loadu_ps(s + (j + c) * lds + r);
                mc[c] = bf16p ? _mm512_max_ps(x, mc[c]) : _mm512_max_ps(mc[c], x);
                nc[c] = _mm512_min_ps(x, nc[c]);
            }
        for (; j < nk; j++) {
            const __m512 x = _mm512_loadu_ps(s + j * lds + r);
            mc[0] = bf16p ? _mm512_max_ps(x, mc[0]) : _mm512_max_ps(mc[0], x);
            nc[0] = _mm512_min_ps(x, nc[0]);
        }
        __m512 mx = _mm512_max_ps(_mm512_max_ps(mc[0], mc[1]), _mm512_max_ps(mc[2], mc[3]));
        __m512 mn = _mm512_min_ps(_mm512_min_ps(nc[0], nc[1]), _mm512_min_ps(nc[2], nc[3]));
        int overflow = 0; /* a scaled score is +inf: the weights as softmax forms them */
        if (bf16p) {
            const __m512 hi = _mm512_mul_ps(sc, scale > 0.0f ? mx : mn);
            mn = _mm512_mul_ps(sc, scale > 0.0f ? mn : mx);
            overflow = _mm512_cmp_ps_mask(hi, pos_inf, _CMP_EQ_OQ) != 0;
            mx = _mm512_max_ps(m_old, hi);
        }
        /* a NaN score need not reach mx: its own weight is NaN, and so becomes l */
        const __m512 u = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(mx, neg_inf, _CMP_EQ_OQ), mx,
                                              _mm512_setzero_ps());
        /* alpha = 0 where the row has seen nothing yet (m = -inf): its l and o are 0 */
        const __m512 a =
            exp512(_mm512_sub_ps(m_old, u), _mm512_cmp_ps_mask(m_old, neg_inf, _CMP_EQ_OQ),
                   _mm512_setzero_ps(), 0, EXP_LO);
        const __m512 sum = _mm512_cmp_ps_mask(mn, neg_inf, _CMP_EQ_OQ) != 0 || overflow
                               ? softmax_weights(bf16p, 1, nk, s + r, lds, u, sc, &hidden)
                               : softmax_weights(bf16p, 0, nk, s + r, lds, u, sc, &hidden);
        _mm512_storeu_ps(alpha + r, a);
        _mm512_storeu_ps(l + r, _mm512_fmadd_ps(_mm512_loadu_ps(l + r), a, sum));
        _mm512_storeu_ps(m + r, mx);
    }
    return hidden != 0;
}

static int softmax_avx512(int64_t nk, int64_t nr, float *s, int64_t lds, float *m, float *l,
                          float *alpha) {
    return softmax_body(0, nk, nr, s, lds, 1.0f, m, l, alpha);
}

static int softmax_bf16p_avx512(int64_t nk, int64_t nr, float *s, int64_t lds, float scale,
                                float *m, float *l, float *alpha) {
    return softmax_body(1, nk, nr, s, lds, scale, m, l, alpha);
}

/* exp(s - u) for n vectors of one key's rows (see exp_lse_avx512), u one per lane, or with
 * `one` the single *u for all (exp_lse_rows). */
INLINE void exp_lse_vectors(int n, int one, float *s, const float *u, __mmask16 *hidden) {
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY), neg_zero = _mm512_set1_ps(-0.0f);
    for (int i = 0; i < n; i++) {
        const __m512 x = _mm512_loadu_ps(s + 16 * i);
        const __mmask16 inf = _mm512_cmp_ps_mask(x, neg_inf, _CMP_EQ_OQ);
        *hidden |= inf;
        const __m512 ui = one ? _mm512_set1_ps(*u) : _mm512_loadu_ps(u + 16 * i);
        _mm512_storeu_ps(s + 16 * i, exp512(_mm512_sub_ps(x, ui), inf, neg_zero, 0, EXP_LSE_LO));
    }
}

/* The backward's weights (ukernels.h): along the rows of one key, four vectors at a time so
 * that their exps (inlined, independent) interleave. */
static int exp_lse_avx512(int64_t nk, int64_t nr, float *s, int64_t lds, const float *u) {
    __mmask16 hidden = 0;
    for (int64_t j = 0; j < nk; j++) {
        float *s_j = s + j * lds;
        int64_t r = 0;
        for (; r + 64 <= nr; r += 64)
            exp_lse_vectors(4, 0, s_j + r, u + r, &hidden);
        for (; r < nr; r += 16)
            exp_lse_vectors(1, 0, s_j + r, u + r, &hidden);
    }
    return hidden != 0;
}

/* exp_lse for a row-major tile (ukernels.h): along each row, four vectors at a time. */
static int exp_lse_rows_avx512(int64_t nr, int64_t nk, float *s, int64_t lds, const float *u,
                               int64_t ldu) {
    __mmask16 hidden = 0;
    for (int64_t r = 0; r < nr; r++) {
        float *s_r = s + r * lds;
        int64_t j = 0;
        for (; j + 64 <= nk; j += 64)
            exp_lse_vectors(4, 1, s_r + j, u + r * ldu, &hidden);
        for (; j < nk; j += 16)
            exp_lse_vectors(1, 1, s_r + j, u + r * ldu, &hidden);
    }
    return hidden != 0;
}

/* tanh(y), formed for a = |y| and given y's sign: below a = 0.55 by a + a^3 Q(a^2), Q of
 * degree 4 (a least-squares fit to tanh on [0, 0.55] weighted by 1 / tanh: within 1.1e-9 of
 * it, relative), and from there on by 1 - 2 / (e^(2a) + 1), where the subtraction loses less
 * than a bit (2 / (e^(2a) + 1) <= tanh a from a = atanh(1/2) = 0.5493 on); 2a is clamped at
 * 40 (tanh is 1 in f32 from 9.01 on), so that +-inf give +-1, and NaN stays NaN (min returns
 * its second operand when either is NaN). */
INLINE __m512 tanh512(__m512 y) {
    /* on |y|, the sign put back at the end (so that -0.0 stays -0.0) */
    const __m512 sign = _mm512_set1_ps(-0.0f), one = _mm512_set1_ps(1.0f);
    const __m512 a = _mm512_andnot_ps(sign, y), z = _mm512_mul_ps(a, a);
    __m512 q = _mm512_set1_ps(-0.006269227713346481f);
    q = _mm512_fmadd_ps(q, z, _mm512_set1_ps(0.021066883578896523f));
    q = _mm512_fmadd_ps(q, z, _mm512_set1_ps(-0.05385059863328934f));
    q = _mm512_fmadd_ps(q, z, _mm512_set1_ps(0.13332557678222656f));
    q = _mm512_fmadd_ps(q, z, _mm512_set1_ps(-0.33333316445350647f));
    const __m512 small = _mm512_fmadd_ps(q, _mm512_mul_ps(a, z), a);
    const __m512 e =
        exp512(_mm512_min_ps(_mm512_set1_ps(40.0f), _mm512_add_ps(a, a)), 0, one, 0, EXP_LO);
    const __m512 big =
        _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, one)));
    const __m512 t =
        _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, _mm512_set1_ps(0.55f), _CMP_LT_OQ), big, small);
    return _mm512_or_ps(t, _mm512_and_ps(sign, y));
}

/* softcap (ukernels.h), 16 values a step. */
static void softcap_avx512(int64_t n, float *x, float cap, float *dsdx) {
    const __m512 c = _mm512_set1_ps(cap), one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1u);
        const __m512 t = tanh512(_mm512_div_ps(_mm512_maskz_loadu_ps(m, x + i), c));
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(c, t));
        if (dsdx != NULL)
            _mm512_mask_storeu_ps(dsdx + i, m,
                                  _mm512_mul_ps(_mm512_sub_ps(one, t), _mm512_add_ps(one, t)));
    }
}

/* The backward's dS (ukernels.h), 16 lanes at a time, the last vector of a row masked. */
static void ds_avx512(int64_t nr, int64_t n, float *dp, int64_t ld, const float *w, const float *z,
                      const float *dsdx, const float *delta, int per_lane) {
    const __m512i neg_zero_bits = _mm512_set1_epi32((int)0x80000000u);
    const __m512 neg_zero = _mm512_set1_ps(-0.0f);
    for (int64_t r = 0; r < nr; r++) {
        const __m512 dl_r = per_lane ? neg_zero : _mm512_set1_ps(delta[r]);
        for (int64_t c = 0; c < n; c += 16) {
            const __mmask16 m = n - c >= 16 ? 0xffff : (__mmask16)((1u << (n - c)) - 1u);
            const int64_t e = r * ld + c;
            __m512 x = _mm512_maskz_loadu_ps(m, dp + e);
            if (z != NULL)
                x = _mm512_mul_ps(x, _mm512_maskz_loadu_ps(m, z + e));
            const __m512 wv = _mm512_maskz_loadu_ps(m, w + e);
            const __m512 dl = per_lane ? _mm512_maskz_loadu_ps(m, delta + c) : dl_r;
            x = _mm512_mul_ps(wv, _mm512_sub_ps(x, dl));
            if (dsdx != NULL)
                x = _mm512_mul_ps(x, _mm512_maskz_loadu_ps(m, dsdx + e));
            const __mmask16 hid = _mm512_cmpeq_epi32_mask(_mm512_castps_si512(wv), neg_zero_bits);
            _mm512_mask_storeu_ps(dp + e, m, _mm512_mask_blend_ps(hid, x, neg_zero));
        }
    }
}

/* o[a][cols] = alpha[a] o[a][cols] + sum_j p[j][a] v[j][cols] for a < mr rows and nv vectors
 * of columns starting at o and v; the last vector is limited by `last` (a lane mask). With
 * `tr` the weights are stored transposed, p[a][j] (pv_t). Unless vn is NULL, the same columns
 * of the rows at vn (the next slice's) are asked into L2 as these are read (see pv_all). */
INLINE void pv_block(int tr, int elem, int mr, int nv, int careful, __mmask16 last, int64_t nk,
                     const float *p, int64_t ldp, const float *alpha, const void *v, int64_t ldv,
                     const void *vn, float *o, int64_t ldo) {
    /* bf16 rows of whole pairs of vectors are widened by load_bf16_pairs, and the
     * accumulators of each pair hold its even and odd columns: each column's products and
     * sums are the same, in the same order */
    const int pairs = elem == SDPA__ELEM_BF16 && nv % 2 == 0 && last == 0xffff;
    __m512 acc[12][8];
    for (int a = 0; a < mr; a++) {
        const __m512 al = _mm512_set1_ps(alpha[a]);
        for (int c = 0; c < nv; c++)
            acc[a][c] = _mm512_maskz_loadu_ps(c == nv - 1 ? last : 0xffff, o + a * ldo + 16 * c);
        if (pairs)
            for (int c = 0; c < nv; c += 2) {
                const __m512 lo = acc[a][c];
                acc[a][c] = even_of(lo, acc[a][c + 1]);
                acc[a][c + 1] = odd_of(lo, acc[a][c + 1]);
            }
        for (int c = 0; c < nv; c++)
            acc[a][c] = _mm512_mul_ps(al, acc[a][c]);
    }
    for (int64_t j = 0; j < nk; j++) {
        __m512 vv[8];
        if (vn != NULL)
            for (int c = 0; c < nv; c++)
                if (elem == SDPA__ELEM_F32 || c % 2 == 0) /* once per 64-byte line */
                    _mm_prefetch(elem_at(elem, vn, j * ldv + 16 * c), _MM_HINT_T1);
        if (pairs)
            for (int c = 0; c < nv; c += 2)
                load_bf16_pairs(v, j * ldv + 16 * c, &vv[c], &vv[c + 1]);
        else
            for (int c = 0; c < nv; c++)
                vv[c] = load_elems(elem, v, j * ldv + 16 * c, c == nv - 1 ? last : 0xffff);
        for (int a = 0; a < mr; a++) {
            const __m512 pb = _mm512_set1_ps(tr ? p[a * ldp + j] : p[j * ldp + a]);
            if (careful) {
                /* a zero weight leaves acc as it is, which is what adding its +-0 product
                 * with a finite v does, and lets no NaN in */
                const __mmask16 seen = _mm512_cmp_ps_mask(pb, _mm512_setzero_ps(), _CMP_NEQ_UQ);
                for (int c = 0; c < nv; c++)
                    acc[a][c] = _mm512_mask3_fmadd_ps(pb, vv[c], acc[a][c], seen);
            } else {
                for (int c = 0; c < nv; c++)
                    acc[a][c] = _mm512_fmadd_ps(pb, vv[c], acc[a][c]);
            }
        }
    }
    for (int a = 0; a < mr; a++) {
        if (pairs)
            for (int c = 0; c < nv; c += 2) {
                const __m512 ev = acc[a][c];
                acc[a][c] = features_lo(ev, acc[a][c + 1]);
                acc[a][c + 1] = features_hi(ev, acc[a][c + 1]);
            }
        for (int c = 0; c < nv; c++)
            _mm512_mask_storeu_ps(o + a * ldo + 16 * c, c == nv - 1 ? last : 0xffff, acc[a][c]);
    }
}

/* n < 6 rows in one block (see qk_tail). */
INLINE void pv_tail(int tr, int elem, int64_t n, int nv, int careful, __mmask16 last, int64_t nk,
                    const float *p, int64_t ldp, const float *alpha, const void *v, int64_t ldv,
                    const void *vn, float *o, int64_t ldo) {
    switch (n) {
    case 1:
        pv_block(tr, elem, 1, nv, careful, last, nk, p, ldp, alpha, v, ldv, vn, o, ldo);
        break;
    case 2:
        pv_block(tr, elem, 2, nv, careful, last, nk, p, ldp, alpha, v, ldv, vn, o, ldo);
        break;
    case 3:
        pv_block(tr, elem, 3, nv, careful, last, nk, p, ldp, alpha, v, ldv, vn, o, ldo);
        break;
    case 4:
        pv_block(tr, elem, 4, nv, careful, last, nk, p, ldp, alpha, v, ldv, vn, o, ldo);
        break;
    case 5:
        if (elem == SDPA__ELEM_F32) /* a half type comes from pv_few: at most 4 rows */
            pv_block(tr, elem, 5, nv, careful, last, nk, p, ldp, alpha, v, ldv, vn, o, ldo);
        break;
    default:
        break;
    }
}

/* All rows for nv vectors of columns: 6 rows at a time, then the row tail in one block. */
INLINE void pv_cols(int tr, int elem, int nv, int careful, __mmask16 last, int64_t nk, int64_t nr,
                    const float *p, int64_t ldp, const float *alpha, const void *v, int64_t ldv,
                    const void *vn, float *o, int64_t ldo) {
    int64_t r = 0;
    if (elem == SDPA__ELEM_F32)
        for (; r + 6 <= nr; r += 6)
            pv_block(tr, elem, 6, nv, careful, last, nk, tr ? p + r * ldp : p + r, ldp, alpha + r,
                     v, ldv, vn, o + r * ldo, ldo);
    pv_tail(tr, elem, nr - r, nv, careful, last, nk, tr ? p + r * ldp : p + r, ldp, alpha + r, v,
            ldv, vn, o + r * ldo, ldo);
}

/* P V over the columns in blocks of up to 64 (of 128 first for one row), each block a pass
 * over the keys. Unless vn is
 * NULL (pv_few: a decode step's few rows), each pass also requests its columns of the rows at
 * vn, the next slice's, into L2: the next slice's V is asked for a slice ahead, spread over
 * this one's work. A prefetch never faults. */
INLINE void pv_all(int tr, int elem, int careful, int64_t nk, int64_t nr, int64_t dv,
                   const float *p, int64_t ldp, const float *alpha, const void *v, int64_t ldv,
                   const void *vn, float *o, int64_t ldo) {
    int64_t c = 0;
    /* one row (a decode step without grouped heads): 128 columns a pass, so that 8
     * accumulators, not 4, cover the FMAs' latency (each column's sum is the same) */
    if (nr == 1)
        for (; c + 128 <= dv; c += 128)
            pv_block(tr, elem, 1, 8, careful, 0xffff, nk, p, ldp, alpha, elem_at(elem, v, c), ldv,
                     vn != NULL ? elem_at(elem, vn, c) : NULL, o + c, ldo);
    for (; c + 64 <= dv; c += 64)
        pv_cols(tr, elem, 4, careful, 0xffff, nk, nr, p, ldp, alpha, elem_at(elem, v, c), ldv,
                vn != NULL ? elem_at(elem, vn, c) : NULL, o + c, ldo);
    const int64_t rest = dv - c;
    if (rest == 0)
        return;
    const __mmask16 last = (__mmask16)(rest % 16 == 0 ? 0xffff : (1u << (rest % 16)) - 1u);
    const void *vc = elem_at(elem, v, c), *vnc = vn != NULL ? elem_at(elem, vn, c) : NULL;
    switch ((rest + 15) / 16) {
    case 4:
        pv_cols(tr, elem, 4, careful, last, nk, nr, p, ldp, alpha, vc, ldv, vnc, o + c, ldo);
        break;
    case 3:
        pv_cols(tr, elem, 3, careful, last, nk, nr, p, ldp, alpha, vc, ldv, vnc, o + c, ldo);
        break;
    case 2:
        pv_cols(tr, elem, 2, careful, last, nk, nr, p, ldp, alpha, vc, ldv, vnc, o + c, ldo);
        break;
    default:
        pv_cols(tr, elem, 1, careful, last, nk, nr, p, ldp, alpha, vc, ldv, vnc, o + c, ldo);
        break;
    }
}

static void pv_avx512(int64_t nk, int64_t nr, int64_t dv, const float *p, int64_t ldp,
                      const float *alpha, const float *v, int64_t ldv, float *o, int64_t ldo) {
    pv_all(0, SDPA__ELEM_F32, 0, nk, nr, dv, p, ldp, alpha, v, ldv, NULL, o, ldo);
}

/* pv with the weights transposed (ukernels.h): the same blocks and order as pv_avx512. */
static void pv_t_avx512(int64_t nk, int64_t nr, int64_t dv, const float *p, int64_t ldp,
                        const float *alpha, const float *v, int64_t ldv, float *o, int64_t ldo) {
    pv_all(1, SDPA__ELEM_F32, 0, nk, nr, dv, p, ldp, alpha, v, ldv, NULL, o, ldo);
}

/* The same blocks and order as pv_avx512. */
static void pv_careful_avx512(int64_t nk, int64_t nr, int64_t dv, const float *p, int64_t ldp,
                              const float *alpha, const float *v, int64_t ldv, float *o,
                              int64_t ldo) {
    pv_all(0, SDPA__ELEM_F32, 1, nk, nr, dv, p, ldp, alpha, v, ldv, NULL, o, ldo);
}

/* pv_avx512 for a decode step's few rows, V's rows in f32, f16 or bf16 (widened as loaded),
 * with the next slice's rows asked for (prefetching changes no result). */
static void pv_few_avx512(int elem, int64_t nk, int64_t nr, int64_t dv, const float *p, int64_t ldp,
                          const float *alpha, const void *v, int64_t ldv, const void *v_next,
                          float *o, int64_t ldo) {
    if (elem == SDPA__ELEM_F32)
        pv_all(0, SDPA__ELEM_F32, 0, nk, nr, dv, p, ldp, alpha, v, ldv, v_next, o, ldo);
    else if (elem == SDPA__ELEM_F16)
        pv_all(0, SDPA__ELEM_F16, 0, nk, nr, dv, p, ldp, alpha, v, ldv, v_next, o, ldo);
    else
        pv_all(0, SDPA__ELEM_BF16, 0, nk, nr, dv, p, ldp, alpha, v, ldv, v_next, o, ldo);
}

const sdpa__ukernels sdpa__uk_avx512 = {
    .name = "avx512",
    .lanes = 16,
    .weight_exp2 = WEIGHT_EXP2,
    .pack_q = pack_q_avx512,
    .qk = qk_avx512,
    .qk_few = sdpa__qk_few_avx512,
    .qk_few_half = sdpa__qk_few_half_avx512,
    .pv_few = pv_few_avx512,
    .softmax = softmax_avx512,
    .softmax_few = sdpa__softmax_few_avx512,
    .softmax_bf16p = softmax_bf16p_avx512,
    .exp_lse = exp_lse_avx512,
    .exp_lse_rows = exp_lse_rows_avx512,
    .ds = ds_avx512,
    .softcap = softcap_avx512,
    .bias = sdpa__bias_avx512,
    .pv = pv_avx512,
    .pv_t = pv_t_avx512,
    .pv_careful = pv_careful_avx512,
    .load_row = sdpa__load_row_avx512,
    .store_row = sdpa__store_row_avx512,
    .dropout_row = sdpa__dropout_row_avx512,
};
