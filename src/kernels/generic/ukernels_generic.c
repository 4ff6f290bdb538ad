/*
 * ukernels_generic.c — the flash micro-kernels in portable C (see ukernels.h for the
 * contract of each). Always built, always available: the fallback on CPUs without AVX2 and
 * the readable statement of what the SIMD versions must compute.
 *
 * Compiled with no ISA flags, so its speed comes from the compiler's auto-vectorisation for
 * the baseline vector unit (SSE2 on x86-64, NEON on AArch64; 4 floats a vector): every hot
 * loop runs along a contiguous index (query rows in Q^T and in the scores, columns in V and
 * O) with the other indices fixed and every inner count a constant, and has no branch and no
 * float sum along its own index (which the compiler may not reorder), except qk_few's, which
 * keeps one sum per lane. Blocks are written with the block size in the code (four keys, four
 * rows) rather than as a parameter, so that they vectorise whether or not the compiler
 * inlines them (clang 14 does not).
 *
 * Accuracy without FMA: portable C does not contract a * b + c, so a sequential float sum
 * rounds every product and every addition and would be less accurate than the f32 baseline
 * that the tests hold the tables to (which uses FMA, as the SIMD tables do). The dot products
 * here are summed in blocks of BLOCK_TERMS terms, each block's partial sum then added to the
 * total: the error grows with BLOCK_TERMS + n / BLOCK_TERMS rather than with n.
 */
#include "../ukernels.h"

#include "../../core/half.h"

#include <math.h>
#include <string.h>

/* BLOCK_TERMS: terms per partial sum of a dot product (see the file's head): in a sum of 128
 * terms each term goes through at most 7 + 16 roundings instead of 127 (four terms measured
 * no faster). LANES: query rows per vector of the baseline ISAs, the table's lanes. */
enum { BLOCK_TERMS = 8, LANES = 4 };

void sdpa__pack_q_generic(int64_t nr, int64_t dk, const float *const *rows, float *qt,
                          int64_t ldq) {
    const int64_t npad = (nr + 7) / 8 * 8; /* a multiple of every table's lanes using this */
    for (int64_t d = 0; d < dk; d++) {
        float *qt_d = qt + d * ldq;
        for (int64_t r = 0; r < nr; r++)
            qt_d[r] = rows[r][d];
        for (int64_t r = nr; r < npad; r++)
            qt_d[r] = 0.0f;
    }
}

/* sum_e x[e * incx] * y[e * incy] for e < BLOCK_TERMS, in that order: one block's partial sum
 * of a dot product (see the file's head). */
static inline float block_dot(const float *x, int64_t incx, const float *y, int64_t incy) {
    float sum = x[0] * y[0];
    for (int e = 1; e < BLOCK_TERMS; e++)
        sum += x[e * incx] * y[e * incy];
    return sum;
}

/* The scores of keys k0..k3 (rows s0..s3 of the scores) for all nr rows; the same for one key
 * below. The loop over rows is the vectorised one: for each block of features its body holds
 * the partial sums of one vector of rows in registers, reads each vector of Q once for all
 * four keys, and finds the keys' values (the same for every row) hoisted out of it. The
 * totals live in s. A key's score is summed in the same order by both. */
static void qk_four(int64_t nr, int64_t dk, const float *restrict k0, const float *restrict k1,
                    const float *restrict k2, const float *restrict k3, const float *restrict qt,
                    int64_t ldq, float scale, float *restrict s0, float *restrict s1,
                    float *restrict s2, float *restrict s3) {
    for (int64_t r = 0; r < nr; r++)
        s0[r] = s1[r] = s2[r] = s3[r] = 0.0f;
    int64_t d = 0;
    for (; d + BLOCK_TERMS <= dk; d += BLOCK_TERMS) {
        const float *restrict q = qt + d * ldq;
        for (int64_t r = 0; r < nr; r++) {
            s0[r] += block_dot(k0 + d, 1, q + r, ldq);
            s1[r] += block_dot(k1 + d, 1, q + r, ldq);
            s2[r] += block_dot(k2 + d, 1, q + r, ldq);
            s3[r] += block_dot(k3 + d, 1, q + r, ldq);
        }
    }
    /* the last dk % BLOCK_TERMS features, one at a time into the totals */
    for (; d < dk; d++)
        for (int64_t r = 0; r < nr; r++) {
            const float q = qt[d * ldq + r];
            s0[r] += k0[d] * q;
            s1[r] += k1[d] * q;
            s2[r] += k2[d] * q;
            s3[r] += k3[d] * q;
        }
    for (int64_t r = 0; r < nr; r++) {
        s0[r] *= scale;
        s1[r] *= scale;
        s2[r] *= scale;
        s3[r] *= scale;
    }
}

static void qk_one(int64_t nr, int64_t dk, const float *restrict k0, const float *restrict qt,
                   int64_t ldq, float scale, float *restrict s0) {
    for (int64_t r = 0; r < nr; r++)
        s0[r] = 0.0f;
    int64_t d = 0;
    for (; d + BLOCK_TERMS <= dk; d += BLOCK_TERMS) {
        const float *restrict q = qt + d * ldq;
        for (int64_t r = 0; r < nr; r++)
            s0[r] += block_dot(k0 + d, 1, q + r, ldq);
    }
    for (; d < dk; d++)
        for (int64_t r = 0; r < nr; r++)
            s0[r] += k0[d] * qt[d * ldq + r];
    for (int64_t r = 0; r < nr; r++)
        s0[r] *= scale;
}

/* Four keys at a time share each load of Q; the last nk % 4 one at a time. */
static void qk_generic(int64_t nk, int64_t nr, int64_t dk, const float *k, int64_t ldk,
                       const float *qt, int64_t ldq, float scale, float *s, int64_t lds) {
    int64_t j = 0;
    for (; j + 4 <= nk; j += 4) {
        const float *k_j = k + j * ldk;
        float *s_j = s + j * lds;
        qk_four(nr, dk, k_j, k_j + ldk, k_j + 2 * ldk, k_j + 3 * ldk, qt, ldq, scale, s_j,
                s_j + lds, s_j + 2 * lds, s_j + 3 * lds);
    }
    for (; j < nk; j++)
        qk_one(nr, dk, k + j * ldk, qt, ldq, scale, s + j * lds);
}

/* The dot product of a key and a query row along their features, for qk_few: eight partial
 * sums, one per position in a block of eight features, which GCC vectorises as a group of
 * independent sums (a single float sum it may not: that would reorder it; clang 14 leaves
 * this loop scalar); each step adds the products of two blocks, summed first. The partial
 * sums are added pairwise at the end, then the last dk % 8 features in double (that loop is
 * scalar anyway, and a short dot product, dk < 8, is then rounded once). */
static inline float dot_few(int64_t dk, const float *restrict k, const float *restrict q) {
    float a[8] = {0.0f};
    int64_t d = 0;
    for (; d + 16 <= dk; d += 16)
        for (int i = 0; i < 8; i++)
            a[i] += k[d + i] * q[d + i] + k[d + 8 + i] * q[d + 8 + i];
    for (; d + 8 <= dk; d += 8)
        for (int i = 0; i < 8; i++)
            a[i] += k[d + i] * q[d + i];
    double t = (double)(((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7])));
    for (; d < dk; d++)
        t += (double)k[d] * (double)q[d];
    return (float)t;
}

/* A decode step's few rows: qk would hoist every key's values out of a loop over rows that
 * runs once, and spend a whole vector on rows that may be padding. Plain C asks for no rows
 * ahead, so k_next goes unused. */
static void qk_few_generic(int64_t nk, int64_t nr, int64_t dk, const float *k, int64_t ldk,
                           const float *k_next, const float *const *q_rows, float scale, float *s,
                           int64_t lds) {
    (void)k_next;
    for (int64_t j = 0; j < nk; j++) {
        float *s_j = s + j * lds;
        for (int64_t r = 0; r < nr; r++)
            s_j[r] = scale * dot_few(dk, k + j * ldk, q_rows[r]);
        for (int64_t r = nr; r < LANES; r++)
            s_j[r] = 0.0f;
    }
}

/* (h & a) | (~h & b) on the bits, for a mask h of all ones or all zeros: a choice between
 * floats written as `c ? a : b` lets the compiler move the computation of a or b under a
 * branch, and then (lest that computation trap) not vectorise the loop. */
static inline float pick(uint32_t h, float a, float b) {
    uint32_t ab, bb;
    memcpy(&ab, &a, sizeof ab);
    memcpy(&bb, &b, sizeof bb);
    ab = (ab & h) | (bb & ~h);
    memcpy(&a, &ab, sizeof a);
    return a;
}

/* e^x in plain C that the compiler can vectorise: n = round(x / ln2) is read off the low
 * mantissa bits of x / ln2 + 1.5 * 2^23, r = x - n ln2 (Cody-Waite, ln2 in two parts, the
 * first short enough that n times it is exact, so |r| <= ln2/2 up to a rounding), e^r by
 * Cephes' degree-7 polynomial (1 + r + r^2 P(r)) and 2^n built in the exponent field and
 * multiplied in: a NaN x makes r, and so the product, NaN whatever its payload. Outside
 * [-87, 88], where 2^n would not be a normal float, the result is replaced by e^-87 or e^88.
 * P is evaluated by pairs of terms (Estrin) rather than by Horner's rule, and the range is
 * tested on x beside the main computation rather than clamped before it: a loop of exps is
 * bound by the latency of one (how many the processor keeps in flight), and the shorter
 * chain measured 10% faster. Below e^-87 (about 1.6e-38) the error is absolute and far below
 * anything a softmax can see; every result is a normal float, never -0.0. */
static inline float exp_generic(float x) {
    const uint32_t below = x < -87.0f ? 0xffffffffu : 0u;
    const uint32_t above = x > 88.0f ? 0xffffffffu : 0u;
    const float magic = 12582912.0f; /* 1.5 * 2^23 */
    const float t = x * 1.44269504088896341f + magic;
    uint32_t tb;
    memcpy(&tb, &t, sizeof tb);
    const float n = t - magic;
    float r = x - n * 0.693359375f; /* ln2, 9 significant bits */
    r = r - n * -2.12194440e-4f;    /* the rest of ln2 */
    const float r2 = r * r;
    const float p01 = 1.6666665459e-1f * r + 5.0000001201e-1f;
    const float p23 = 8.3334519073e-3f * r + 4.1665795894e-2f;
    const float p45 = 1.9875691500e-4f * r + 1.3981999507e-3f;
    const float p = (p45 * r2 + p23) * r2 + p01;
    const float y = p * r2 + r + 1.0f;
    /* (n + 127) << 23: t's bits are those of 1.5 * 2^23 plus n, for |n| < 2^22 */
    const uint32_t eb = (tb - 0x4b400000u + 127u) << 23;
    float two_n;
    memcpy(&two_n, &eb, sizeof two_n);
    return pick(below, 1.645811454e-38f, pick(above, 1.651636266e+38f, y * two_n));
}

/* Rows are taken CHUNK at a time so that their running state fits in arrays on the stack;
 * every loop over keys then runs along the rows of one key (contiguous in s), and keeps
 * per row what it gathers (max, sum, hidden keys) so that no loop reduces across rows. */
static int softmax_generic(int64_t nk, int64_t nr, float *s, int64_t lds, float *m, float *l,
                           float *alpha) {
    enum { CHUNK = 128 };
    float mx[CHUNK], u[CHUNK], sum[CHUNK];
    uint32_t hid[CHUNK];
    uint32_t hidden = 0;
    for (int64_t r0 = 0; r0 < nr; r0 += CHUNK) {
        const int64_t n = nr - r0 < CHUNK ? nr - r0 : CHUNK;
        for (int64_t r = 0; r < n; r++)
            mx[r] = m[r0 + r];
        /* a NaN score need not reach the max: its own weight is NaN, and so becomes l */
        for (int64_t j = 0; j < nk; j++) {
            const float *s_j = s + j * lds + r0;
            for (int64_t r = 0; r < n; r++)
                mx[r] = s_j[r] > mx[r] ? s_j[r] : mx[r];
        }
        for (int64_t r = 0; r < n; r++) {
            u[r] = mx[r] == -INFINITY ? 0.0f : mx[r];
            sum[r] = 0.0f;
            hid[r] = 0;
        }
        for (int64_t j = 0; j < nk; j++) {
            float *s_j = s + j * lds + r0;
            for (int64_t r = 0; r < n; r++) {
                const float x = s_j[r];
                const uint32_t h = x == -INFINITY ? 0xffffffffu : 0u;
                const float w = pick(h, -0.0f, exp_generic(x - u[r]));
                s_j[r] = w;
                sum[r] += w;
                hid[r] |= h;
            }
        }
        /* exp(-inf) is e^-87 here, not 0: a row that has seen nothing keeps l = 0 anyway */
        for (int64_t r = 0; r < n; r++) {
            const float a = exp_generic(m[r0 + r] - u[r]);
            alpha[r0 + r] = a;
            l[r0 + r] = l[r0 + r] * a + sum[r];
            m[r0 + r] = mx[r];
            hidden |= hid[r];
        }
    }
    return hidden != 0;
}

/* The backward's weights (ukernels.h): softmax's second pass with a given subtrahend, along
 * the rows of one key at a time. */
static int exp_lse_generic(int64_t nk, int64_t nr, float *s, int64_t lds, const float *u) {
    uint32_t hidden = 0;
    for (int64_t j = 0; j < nk; j++) {
        float *s_j = s + j * lds;
        for (int64_t r = 0; r < nr; r++) {
            const float x = s_j[r];
            const uint32_t h = x == -INFINITY ? 0xffffffffu : 0u;
            s_j[r] = pick(h, -0.0f, exp_generic(x - u[r]));
            hidden |= h;
        }
    }
    return hidden != 0;
}

/* exp_lse for a row-major tile (ukernels.h): the same loop with the row's subtrahend. */
static int exp_lse_rows_generic(int64_t nr, int64_t nk, float *s, int64_t lds, const float *u,
                                int64_t ldu) {
    uint32_t hidden = 0;
    for (int64_t r = 0; r < nr; r++) {
        float *s_r = s + r * lds;
        const float ur = u[r * ldu];
        for (int64_t j = 0; j < nk; j++) {
            const float x = s_r[j];
            const uint32_t h = x == -INFINITY ? 0xffffffffu : 0u;
            s_r[j] = pick(h, -0.0f, exp_generic(x - ur));
            hidden |= h;
        }
    }
    return hidden != 0;
}

/* The backward's dS (ukernels.h), a row at a time. */
static void ds_generic(int64_t nr, int64_t n, float *dp, int64_t ld, const float *w, const float *z,
                       const float *dsdx, const float *delta, int per_lane) {
    for (int64_t r = 0; r < nr; r++)
        for (int64_t c = 0; c < n; c++) {
            const int64_t e = r * ld + c;
            float x = z != NULL ? dp[e] * z[e] : dp[e];
            x = w[e] * (x - delta[per_lane ? c : r]);
            if (dsdx != NULL)
                x *= dsdx[e];
            uint32_t wb;
            memcpy(&wb, &w[e], sizeof wb);
            dp[e] = pick(wb == 0x80000000u ? 0xffffffffu : 0u, -0.0f, x);
        }
}

/* P V for the four output rows o0..o3 (weights p[j * ldp + a] for row a); the same for one
 * row below. The loop over columns is the vectorised one, holding the partial sums of one
 * vector of columns in registers, reading each vector of V once for all four rows, with the
 * weights (the same for every column) hoisted out of it. The totals live in o, scaled by
 * alpha first. A row's sum is formed in the same order by both. */
static void pv_four(int64_t nk, int64_t dv, const float *restrict p, int64_t ldp,
                    const float *restrict alpha, const float *restrict v, int64_t ldv,
                    float *restrict o0, float *restrict o1, float *restrict o2,
                    float *restrict o3) {
    for (int64_t c = 0; c < dv; c++) {
        o0[c] *= alpha[0];
        o1[c] *= alpha[1];
        o2[c] *= alpha[2];
        o3[c] *= alpha[3];
    }
    int64_t j = 0;
    for (; j + BLOCK_TERMS <= nk; j += BLOCK_TERMS) {
        const float *restrict p_j = p + j * ldp, *restrict v_j = v + j * ldv;
        for (int64_t c = 0; c < dv; c++) {
            o0[c] += block_dot(p_j, ldp, v_j + c, ldv);
            o1[c] += block_dot(p_j + 1, ldp, v_j + c, ldv);
            o2[c] += block_dot(p_j + 2, ldp, v_j + c, ldv);
            o3[c] += block_dot(p_j + 3, ldp, v_j + c, ldv);
        }
    }
    /* the last nk % BLOCK_TERMS keys, one at a time into the totals */
    for (; j < nk; j++)
        for (int64_t c = 0; c < dv; c++) {
            const float v_jc = v[j * ldv + c];
            o0[c] += p[j * ldp] * v_jc;
            o1[c] += p[j * ldp + 1] * v_jc;
            o2[c] += p[j * ldp + 2] * v_jc;
            o3[c] += p[j * ldp + 3] * v_jc;
        }
}

static void pv_one(int64_t nk, int64_t dv, const float *restrict p, int64_t ldp, float alpha,
                   const float *restrict v, int64_t ldv, float *restrict o0) {
    for (int64_t c = 0; c < dv; c++)
        o0[c] *= alpha;
    int64_t j = 0;
    for (; j + BLOCK_TERMS <= nk; j += BLOCK_TERMS) {
        const float *restrict p_j = p + j * ldp, *restrict v_j = v + j * ldv;
        for (int64_t c = 0; c < dv; c++)
            o0[c] += block_dot(p_j, ldp, v_j + c, ldv);
    }
    for (; j < nk; j++)
        for (int64_t c = 0; c < dv; c++)
            o0[c] += p[j * ldp] * v[j * ldv + c];
}

/* The generic table's P V: it multiplies every weight, hidden or not (the driver gives a tile
 * whose V holds NaN or Inf to pv_careful_generic when some key is hidden). Four rows at a time
 * share each load of V; the last nr % 4 one at a time. */
static void pv_fast_generic(int64_t nk, int64_t nr, int64_t dv, const float *p, int64_t ldp,
                            const float *alpha, const float *v, int64_t ldv, float *o,
                            int64_t ldo) {
    int64_t r = 0;
    for (; r + 4 <= nr; r += 4) {
        float *o_r = o + r * ldo;
        pv_four(nk, dv, p + r, ldp, alpha + r, v, ldv, o_r, o_r + ldo, o_r + 2 * ldo,
                o_r + 3 * ldo);
    }
    for (; r < nr; r++)
        pv_one(nk, dv, p + r, ldp, alpha[r], v, ldv, o + r * ldo);
}

/* block_dot for pv_careful_generic: a zero weight x multiplies 0 instead of y. */
static inline float block_dot_careful(const float *x, int64_t incx, const float *y, int64_t incy) {
    float sum = x[0] * (x[0] == 0.0f ? 0.0f : y[0]);
    for (int e = 1; e < BLOCK_TERMS; e++)
        sum += x[e * incx] * (x[e * incx] == 0.0f ? 0.0f : y[e * incy]);
    return sum;
}

/* The careful P V (ukernels.h): per output, the operations of pv_four and pv_one in their
 * order, with a zero weight's v read as 0, so that its +-0 product adds what it adds for a
 * finite v and no NaN. Used only for slices with hidden keys and NaN or Inf in V: written
 * for exactness, not speed. */
static void pv_careful_generic(int64_t nk, int64_t nr, int64_t dv, const float *p, int64_t ldp,
                               const float *alpha, const float *v, int64_t ldv, float *o,
                               int64_t ldo) {
    for (int64_t r = 0; r < nr; r++) {
        float *o_r = o + r * ldo;
        for (int64_t c = 0; c < dv; c++)
            o_r[c] *= alpha[r];
        int64_t j = 0;
        for (; j + BLOCK_TERMS <= nk; j += BLOCK_TERMS)
            for (int64_t c = 0; c < dv; c++)
                o_r[c] += block_dot_careful(p + j * ldp + r, ldp, v + j * ldv + c, ldv);
        for (; j < nk; j++) {
            const float w = p[j * ldp + r];
            for (int64_t c = 0; c < dv; c++)
                o_r[c] += w * (w == 0.0f ? 0.0f : v[j * ldv + c]);
        }
    }
}

void sdpa__load_row_generic(int elem, int64_t n, const void *src, int64_t stride, float *dst) {
    const uint16_t *h = src;
    for (int64_t c = 0; c < n; c++) {
        if (elem == SDPA__ELEM_F16)
            dst[c] = sdpa__f16_to_f32(h[c * stride]);
        else if (elem == SDPA__ELEM_BF16)
            dst[c] = sdpa__bf16_to_f32(h[c * stride]);
        else
            dst[c] = ((const float *)src)[c * stride];
    }
}

int sdpa__store_row_generic(int elem, int64_t n, const float *src, float scale, void *dst,
                            int64_t stride) {
    uint16_t *h = dst;
    uint32_t inf = 0, nan = 0;
    for (int64_t c = 0; c < n; c++) {
        uint32_t u;
        memcpy(&u, &src[c], sizeof u);
        inf |= (u & 0x7fffffffu) == 0x7f800000u;
        const int src_nan = (u & 0x7fffffffu) > 0x7f800000u;
        nan |= (uint32_t)src_nan;
        /* a NaN of src is what is stored (made quiet), whatever the scale: which of two NaN
         * operands a product keeps is the compiler's choice of their order */
        float x = src[c] * scale;
        if (src_nan) {
            u |= 0x00400000u;
            memcpy(&x, &u, sizeof x);
        }
        if (elem == SDPA__ELEM_F16)
            h[c * stride] = sdpa__f64_to_f16((double)x);
        else if (elem == SDPA__ELEM_BF16)
            h[c * stride] = sdpa__f64_to_bf16((double)x);
        else
            ((float *)dst)[c * stride] = x;
    }
    return (inf != 0 ? SDPA__STORED_INF : 0) | (nan != 0 ? SDPA__STORED_NAN : 0);
}

/* bias (ukernels.h), a score at a time. */
static void bias_generic(int64_t nr, int64_t nk, const float *slope, const double *pos, double step,
                         const float *const *m, float *s, int64_t rs, int64_t js) {
    for (int64_t r = 0; r < nr; r++)
        for (int64_t j = 0; j < nk; j++) {
            float x = s[r * rs + j * js];
            if (slope != NULL)
                x = x - slope[r] * (float)fabs(pos[r] + step * (double)j);
            if (m != NULL)
                x = m[r][j] == -INFINITY ? -INFINITY : x + m[r][j];
            s[r * rs + j * js] = x;
        }
}

/* softcap (ukernels.h) by libm's tanhf. */
static void softcap_generic(int64_t n, float *x, float cap, float *dsdx) {
    for (int64_t i = 0; i < n; i++) {
        const float t = tanhf(x[i] / cap);
        x[i] = cap * t;
        if (dsdx != NULL)
            dsdx[i] = (1.0f - t) * (1.0f + t);
    }
}

const sdpa__ukernels sdpa__uk_generic = {
    .name = "generic",
    .lanes = LANES,
    .pack_q = sdpa__pack_q_generic,
    .qk = qk_generic,
    .qk_few = qk_few_generic,
    .softmax = softmax_generic,
    .exp_lse = exp_lse_generic,
    .exp_lse_rows = exp_lse_rows_generic,
    .ds = ds_generic,
    .softcap = softcap_generic,
    .bias = bias_generic,
    .pv = pv_fast_generic,
    .pv_careful = pv_careful_generic,
    .load_row = sdpa__load_row_generic,
    .store_row = sdpa__store_row_generic,
    .dropout_row = sdpa__dropout_row_generic,
};
