/*
 * test_entries.c — the micro-kernel tables' entries (src/kernels/ukernels.h) one at a time,
 * against their contracts, at every ISA level the CPU has: the accuracy of each table's exp
 * (through its softmax) and softcap, the widening and storing, the decode entries that read a
 * cache in place, the few-rows softmax, and ALiBi's and the mask's terms (bias). The drivers' use
 * of them is tested through the public calls (test_flash.c, test_flash_backward.c,
 * test_backward_schedules.c). Tables the CPU cannot run are reported as skipped, never as passed.
 */
#include "check.h"
#include "testutil.h"

#include "../src/dispatch/impl.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Table uk's softmax, or (bf16p) its softmax_bf16p on scores that are scaled already. */
static int softmax_of(const sdpa__ukernels *uk, int bf16p, int64_t nk, int64_t nr, float *s,
                      int64_t lds, float *m, float *l, float *alpha) {
    return bf16p ? uk->softmax_bf16p(nk, nr, s, lds, 1.0f, m, l, alpha)
                 : uk->softmax(nk, nr, s, lds, m, l, alpha);
}

/* exp through table uk's softmax (or, with bf16p, its softmax_bf16p): one key per row and
 * m = 0, so that with scores <= 0 the weights are exp(score), times 2^weight_exp2 (taken out
 * here, exactly, in double), within `ulps` units in the last place. */
static void check_softmax_exp(const sdpa__ukernels *uk, int bf16p, double ulps) {
    const char *which = bf16p ? "softmax_bf16p" : "softmax";
    enum { N = 4096 };
    static float s[N], m[N], l[N], alpha[N];
    double worst = 0.0, worst_x = 0.0;
    for (int i = 0; i < N; i++) {
        s[i] = -87.0f * (float)i / (N - 1); /* [-87, 0]: the range a softmax uses */
        m[i] = 0.0f;
        l[i] = 0.0f;
    }
    softmax_of(uk, bf16p, 1, N, s, N, m, l, alpha);
    const int e2 = uk->weight_exp2;
    for (int i = 0; i < N; i++) {
        const double want = exp((double)(-87.0f * (float)i / (N - 1)));
        const double ulp = ldexp(1.0, ilogb(want) - 23);
        const double e = fabs(ldexp((double)s[i], -e2) - want) / ulp;
        if (e > worst) {
            worst = e;
            worst_x = log(want);
        }
    }
    printf("    %-8s %s's exp: worst %.2f ulp at x = %.3f\n", uk->name, which, worst, worst_x);
    CHECK_MSG(worst <= ulps, "%s %s's exp error %.2f ulp", uk->name, which, worst);
    CHECK_MSG(s[0] == ldexpf(1.0f, e2), "%s %s: exp(0) = %.9g, not 1", uk->name, which,
              ldexp((double)s[0], -e2));
    /* Below e^-87: a table may stop there (AVX2 returns e^-87); one whose exp goes on
     * must give +0, the f32 value, below -104 (far below every other key's, as a -1e9 mask
     * value puts a score), never -0.0, the hidden keys' mark; in [-104, -87] it must be
     * within its ulps of exp(x) where its scale keeps the weights normal (weight_exp2 >= 25),
     * else within one subnormal step. */
    static const float deep[] = {-87.5f,   -90.0f,   -95.0f,  -100.0f,  -102.0f, -103.5f,
                                 -103.95f, -104.01f, -110.0f, -1000.0f, -1e9f,   -3.4e38f};
    enum { NDEEP = sizeof deep / sizeof deep[0] };
    for (int i = 0; i < NDEEP; i++) {
        s[i] = deep[i];
        m[i] = 0.0f;
        l[i] = 0.0f;
    }
    softmax_of(uk, bf16p, 1, NDEEP, s, NDEEP, m, l, alpha);
    const int goes_on = ldexp((double)s[2], -e2) < 1e-38; /* exp(-95) = 5.5e-42 */
    for (int i = 0; i < NDEEP; i++) {
        const double w = ldexp((double)s[i], -e2), want = exp((double)deep[i]);
        CHECK_MSG(!signbit(s[i]) && w <= 1.7e-38, "%s %s: exp(%g) = %g", uk->name, which,
                  (double)deep[i], w);
        if (!goes_on)
            continue;
        if (deep[i] < -104.0f)
            CHECK_MSG(s[i] == 0.0f, "%s %s: exp(%g) = %g, not +0", uk->name, which, (double)deep[i],
                      w);
        else if (e2 >= 25)
            CHECK_MSG(fabs(w - want) <= ulps * ldexp(1.0, ilogb(want) - 23),
                      "%s %s: exp(%g) = %g, more than %g ulp from %g", uk->name, which,
                      (double)deep[i], w, ulps, want);
        else
            CHECK_MSG(fabs(w - want) <= 0x1p-149,
                      "%s %s: exp(%g) = %g, more than a subnormal step from %g", uk->name, which,
                      (double)deep[i], w, want);
    }
    /* a NaN score gives a NaN weight whatever its payload and sign (a kernel that builds
     * 2^n from the bits of a rounded x must not turn one into a number) */
    for (int i = 0; i < N; i++) {
        const uint32_t bits =
            (i % 2 ? 0xff800000u : 0x7f800000u) | (1u + (uint32_t)i * 2053u) % 0x7fffffu;
        memcpy(&s[i], &bits, sizeof bits);
        m[i] = 0.0f;
        l[i] = 0.0f;
    }
    softmax_of(uk, bf16p, 1, N, s, N, m, l, alpha);
    int not_nan = 0;
    for (int i = 0; i < N; i++)
        not_nan += !isnan(s[i]) || !isnan(l[i]);
    CHECK_MSG(not_nan == 0, "%s %s: %d NaN scores gave a number", uk->name, which, not_nan);
    /* hidden keys are -0.0, and alpha for a row that had seen nothing is harmless */
    s[0] = -INFINITY;
    m[0] = -INFINITY;
    l[0] = 0.0f;
    softmax_of(uk, bf16p, 1, uk->lanes, s, uk->lanes, m, l, alpha);
    CHECK(s[0] == 0.0f && signbit(s[0]));
    CHECK(l[0] == 0.0f && m[0] == -INFINITY);
    /* a hidden key keeps its mark in a row that also holds a NaN score, wherever the NaN
     * falls after it (a table that finds hidden keys by a min must not let the NaN hide the
     * -inf): keys 0..8 of one row, key 0 hidden, key k NaN, the rest 0 */
    for (int k = 1; k < 9; k++) {
        for (int j = 0; j < 9; j++)
            for (int r = 0; r < uk->lanes; r++)
                s[j * uk->lanes + r] = j == 0 && r == 0 ? -INFINITY : j == k && r == 0 ? NAN : 0.0f;
        for (int r = 0; r < uk->lanes; r++) {
            m[r] = 0.0f;
            l[r] = 0.0f;
        }
        const int hidden = softmax_of(uk, bf16p, 9, uk->lanes, s, uk->lanes, m, l, alpha);
        CHECK_MSG(hidden && s[0] == 0.0f && signbit(s[0]),
                  "%s %s: a hidden key before a NaN (key %d) lost its mark", uk->name, which, k);
    }
}

/* softmax_bf16p at scale c against softmax on the scores fl(c s) over a slice of random
 * scores across steps, with hidden keys (c s = -inf) in some row blocks only (so that both of
 * a table's ways through a block are compared), and at c = 2.5 a score whose product
 * overflows to +inf: m, alpha, the hidden keys' marks, the NaN weights and the return value
 * bitwise the same; the +0 floor too at c = 1 (elsewhere a weight at the floor's edge may be
 * +0 on one side and tiny on the other: x rounded once, or twice); the weights and l within
 * 1e-5 relative at c = 1 (the AVX-512 exp's measured 4.25e-6 and softmax's own 2 ulp), 2e-5
 * elsewhere (softmax rounds c s and then c s - u where softmax_bf16p rounds c s - u once:
 * with scores up to about 150 here, up to 1.6e-5 more). */
static void check_softmax_bf16p(const sdpa__ukernels *uk) {
    enum { NK = 37, NR = 64 };
    static float s0[NK * NR], s1[NK * NR], m0[NR], m1[NR], l0[NR], l1[NR], a0[NR], a1[NR];
    static const float scales[] = {1.0f, 0.08838835f, -0.3f, 2.5f};
    for (int k = 0; k < 4; k++) {
        const float c = scales[k];
        tu_rng r = {7};
        for (int i = 0; i < NR; i++) {
            m0[i] = m1[i] = i % 3 == 0 ? -INFINITY : (float)(tu_randn(&r) * 4.0);
            l0[i] = l1[i] = i % 3 == 0 ? 0.0f : 0x1p25f;
        }
        for (int step = 0; step < 3; step++) {
            for (int e = 0; e < NK * NR; e++) {
                const int row = e % NR, block = row / 16;
                /* hidden keys in row blocks 1 and 3 at step 0, none at step 1, all at step 2 */
                const int hides = step == 2 || (step == 0 && block % 2 == 1);
                s1[e] = hides && e % 11 == 3 ? (c > 0.0f ? -INFINITY : INFINITY)
                                             : (float)(tu_randn(&r) * (step ? 30.0 : 3.0) / c);
                if (c == 2.5f && step == 1 && e == 7 * NR + 5)
                    s1[e] = 3e38f; /* 2.5 s overflows: row 5's weights NaN, as softmax's */
                s0[e] = c * s1[e];
            }
            const int h0 = uk->softmax(NK, NR, s0, NR, m0, l0, a0);
            const int h1 = uk->softmax_bf16p(NK, NR, s1, NR, c, m1, l1, a1);
            CHECK_MSG(h0 == h1, "%s softmax_bf16p at %g: hidden %d, softmax's %d", uk->name,
                      (double)c, h1, h0);
            CHECK_MSG(memcmp(m0, m1, sizeof m0) == 0 && memcmp(a0, a1, sizeof a0) == 0,
                      "%s softmax_bf16p at %g: m or alpha differ from softmax's", uk->name,
                      (double)c);
            double worst = 0.0;
            int zeros = 0, nans = 0;
            for (int e = 0; e < NK * NR + NR; e++) {
                /* the weights, then l */
                const float w0 = e < NK * NR ? s0[e] : l0[e - NK * NR];
                const float w1 = e < NK * NR ? s1[e] : l1[e - NK * NR];
                if (isnan(w0) || isnan(w1)) {
                    nans++;
                    CHECK_MSG(isnan(w0) && isnan(w1),
                              "%s softmax_bf16p at %g: %d is %g, softmax's %g", uk->name, (double)c,
                              e, (double)w1, (double)w0);
                } else if (c != 1.0f && !signbit(w0) && !signbit(w1) &&
                           (w0 == 0.0f) != (w1 == 0.0f)) {
                    /* the floor's edge: x = -104 rounded once or twice (e^-104 2^25 = 2.2e-38) */
                    zeros++;
                    CHECK_MSG(w0 + w1 < 3e-38f, "%s softmax_bf16p at %g: %d is %g, softmax's %g",
                              uk->name, (double)c, e, (double)w1, (double)w0);
                } else if (w0 == 0.0f || w1 == 0.0f) { /* a mark or the floor: the same bits */
                    zeros++;
                    CHECK_MSG(memcmp(&w0, &w1, sizeof w0) == 0,
                              "%s softmax_bf16p at %g: %d is %g, softmax's %g", uk->name, (double)c,
                              e, (double)w1, (double)w0);
                } else
                    worst = fmax(worst, fabs((double)w1 / (double)w0 - 1.0));
            }
            printf("    %-8s softmax_bf16p at %g against softmax, step %d: worst %.2e relative "
                   "(%d zero weights, %d NaN, hidden %d)\n",
                   uk->name, (double)c, step, worst, zeros, nans, h0);
            CHECK_MSG(worst <= (c == 1.0f ? 1e-5 : 2e-5),
                      "%s softmax_bf16p at %g: %.2e relative from softmax", uk->name, (double)c,
                      worst);
        }
    }
}

/* Each table's softmax entries: the exp's accuracy, its floor, NaN and the hidden marks. */
static void test_exp_accuracy(void) {
    tu_impl impls[TU_MAX_IMPLS];
    const int n_impls = tu_impls(impls);
    for (int t = 0; t < n_impls; t++) {
        const sdpa__ukernels *uk = impls[t].impl->uk;
        if (!impls[t].own_uk) /* (flash-amx drives flash-avx512's) */
            continue;
        if (!impls[t].runs) {
            printf("    %-8s skipped: the CPU lacks %s\n", uk->name, impls[t].missing);
            continue;
        }
        check_softmax_exp(uk, 0, 2.0);
        if (uk->softmax_bf16p != NULL) {
            /* 2^-16 relative (ukernels.h) is 128 ulp at the bottom of a binade, 256 at its
             * top: the stricter bound; the AVX-512 table's exp reaches 63.5 ulp */
            check_softmax_exp(uk, 1, 128.0);
            check_softmax_bf16p(uk);
        }
    }
}

/* softcap through each table's entry: within 3.5 ulp of cap tanh(x / cap) (x / cap rounded
 * once, as the entry does; with libm's tanhf, the rounding of t and of cap t alone reach 3.1:
 * an ulp of t can be 3.3 of cap t's) over
 * scores from 0 to far past the cap, both signs, and the derivative (1 - t)(1 + t) within 4
 * units of ulp(itself) + 2^-23 (t, an f32, is 2^-24 from 1 at best, which leaves the
 * derivative near 1 - t^2 = 0 an absolute error of that order);
 * the special values: +-inf give +-cap, NaN stays NaN, -0.0 stays -0.0; and any n (the
 * tail of a vector). */
static void test_softcap_accuracy(void) {
    tu_impl impls[TU_MAX_IMPLS];
    const int n_impls = tu_impls(impls);
    enum { N = 20001 };
    static float x[N], dsdx[N];
    static const float caps[] = {50.0f, 30.0f, 1.0f};
    for (int t = 0; t < n_impls; t++) {
        const sdpa__ukernels *uk = impls[t].impl->uk;
        if (!impls[t].own_uk) /* (flash-amx drives flash-avx512's) */
            continue;
        if (!impls[t].runs) {
            printf("    %-8s skipped: the CPU lacks %s\n", uk->name, impls[t].missing);
            continue;
        }
        double worst = 0.0, worst_d = 0.0;
        for (size_t c = 0; c < sizeof caps / sizeof caps[0]; c++) {
            const float cap = caps[c];
            for (int i = 0; i < N; i++) /* |x| / cap from 0 to 10, both signs */
                x[i] = (i % 2 ? -1.0f : 1.0f) * cap * 10.0f * (float)(i / 2) / (N / 2);
            uk->softcap(N, x, cap, dsdx);
            for (int i = 0; i < N; i++) {
                const float x0 = (i % 2 ? -1.0f : 1.0f) * cap * 10.0f * (float)(i / 2) / (N / 2);
                const double y = (double)(x0 / cap), tw = tanh(y), want = (double)cap * tw;
                const double ulp = want == 0.0 ? 0x1p-149 : ldexp(1.0, ilogb(want) - 23);
                const double e = fabs((double)x[i] - want) / ulp;
                worst = e > worst ? e : worst;
                const double dw = (1.0 - tw) * (1.0 + tw);
                const double dulp = (dw > 0.0 ? ldexp(1.0, ilogb(dw) - 23) : 0.0) + 0x1p-23;
                const double ed = fabs((double)dsdx[i] - dw) / dulp;
                worst_d = ed > worst_d ? ed : worst_d;
            }
        }
        printf("    %-8s softcap: worst %.2f ulp, derivative %.2f\n", uk->name, worst, worst_d);
        CHECK_MSG(worst <= 3.5, "%s softcap error %.2f ulp", uk->name, worst);
        CHECK_MSG(worst_d <= 4.0, "%s softcap derivative error %.2f", uk->name, worst_d);
        float sp[5] = {INFINITY, -INFINITY, NAN, -0.0f, 0.0f}, dsp[5];
        uk->softcap(5, sp, 50.0f, dsp);
        CHECK(sp[0] == 50.0f && sp[1] == -50.0f && isnan(sp[2]) && sp[3] == 0.0f &&
              signbit(sp[3]) && sp[4] == 0.0f && !signbit(sp[4]));
        CHECK(dsp[0] == 0.0f && dsp[1] == 0.0f && dsp[3] == 1.0f);
        for (int n = 0; n <= 19; n++) { /* only x[0, n) is touched */
            for (int i = 0; i < 24; i++)
                x[i] = i < n ? 100.0f : 7.0f;
            uk->softcap(n, x, 50.0f, NULL);
            int ok = 1;
            for (int i = 0; i < 24; i++)
                ok &= i < n ? fabsf(x[i] - 48.201379f) < 1e-4f : x[i] == 7.0f;
            CHECK_MSG(ok, "%s softcap of %d values", uk->name, n);
        }
    }
}

/* Every table's widening and storing are bitwise the portable entries' (ukernels.h), NaN
 * included: all 65536 patterns of f16 and bf16 widened at every alignment of a row's tail,
 * and, stored as f32 or narrowed, f32 values of every exponent with the ties, overflow
 * edges, subnormals, zeros, infinities and NaNs, times scales that make more of them, at
 * lengths 1 to 37 (the vector tails) and with a feature stride of 3; and store_row reports
 * the Infs and NaNs of each row it stored from. */
static void test_convert_rows(void) {
    enum { NP = 65536, NF = 1 << 16 };
    uint16_t *h = malloc(NP * sizeof *h);
    float *want = malloc(NP * sizeof *want), *got = malloc(NP * sizeof *got);
    float *f = malloc(NF * sizeof *f);
    /* (room for f32 too: store_row's f32 rows, strided 3 apart) */
    uint16_t *hw = malloc(6 * NF * sizeof *hw), *hg = malloc(6 * NF * sizeof *hg);
    for (unsigned u = 0; u < NP; u++)
        h[u] = (uint16_t)u;
    tu_rng rng = {12345};
    static const uint32_t special[] = {
        0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u,
        0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477fffffu, 0x33800000u, 0x33000000u, 0x33000001u,
        0x387fc000u, 0x7f7f8000u, 0x7f7fffffu, 0x7f7f7fffu, 0x00008000u, 0x00018000u};
    const size_t n_special = sizeof special / sizeof special[0];
    for (int c = 0; c < NF; c++) {
        uint32_t u = (uint32_t)tu_next(&rng);
        if ((size_t)c < n_special)
            u = special[c];
        else if (c % 997 == 500) /* an Inf among numbers, with no NaN in its vector */
            u = c % 2 ? 0x7f800000u : 0xff800000u;
        else if (c % 3 == 0) /* ties of f16 and bf16: the cut bits exactly one half */
            u = (u & 0xffff0000u) | (c % 2 ? 0x8000u : 0x1000u);
        else if (c % 3 == 1) /* exponents around f16's range and subnormals */
            u = (u & 0x807fffffu) | ((uint32_t)(96 + tu_next(&rng) % 48) << 23);
        memcpy(&f[c], &u, sizeof u);
    }
    /* (0: an empty row's; NaN: a NaN row's 1 / l, whose NaN must not replace src's, and
     * which may carry a payload of either sign, from a NaN in the inputs, that a narrowed
     * result must not keep; and an infinite scale of either sign) */
    float scales[] = {1.0f, 0.5f, 3.0f, 1e-30f, 0.0f, NAN, INFINITY, 0.0f, 0.0f, -INFINITY};
    const uint32_t payload_nans[2] = {0x7fe12345u, 0xffd0f0f0u};
    memcpy(&scales[7], &payload_nans[0], sizeof scales[7]);
    memcpy(&scales[8], &payload_nans[1], sizeof scales[8]);
    tu_impl impls[TU_MAX_IMPLS];
    const int n_impls = tu_impls(impls);
    for (int t = 0; t < n_impls; t++) {
        const sdpa__ukernels *uk = impls[t].impl->uk;
        if (!impls[t].own_uk) /* (flash-amx drives flash-avx512's) */
            continue;
        if (!impls[t].runs) {
            printf("    %-8s skipped: the CPU lacks %s\n", uk->name, impls[t].missing);
            continue;
        }
        int bad = 0;
        for (int elem = SDPA__ELEM_F32; elem <= SDPA__ELEM_BF16; elem++) {
            const size_t es = elem == SDPA__ELEM_F32 ? 4 : 2; /* bytes of a stored element */
            if (elem != SDPA__ELEM_F32) { /* (f16 and bf16 widened: every bit pattern) */
                sdpa__load_row_generic(elem, NP, h, 1, want);
                for (int64_t n0 = 0; n0 < 37; n0++) { /* rows of 1..37 from every start */
                    uk->load_row(elem, NP - n0 * 1000 - n0, h + n0 * 1000, 1, got);
                    if (memcmp(got, want + n0 * 1000, (size_t)(NP - n0 * 1001) * sizeof *got) != 0)
                        CHECK_MSG(bad++ > 0, "[%s] load_row elem %d from %lld differs", uk->name,
                                  elem, (long long)(n0 * 1000));
                }
                uk->load_row(elem, NP / 3, h, 3, got);
                sdpa__load_row_generic(elem, NP / 3, h, 3, want);
                if (memcmp(got, want, (size_t)(NP / 3) * sizeof *got) != 0)
                    CHECK_MSG(bad++ > 0, "[%s] strided load_row elem %d differs", uk->name, elem);
            }
            for (size_t sc = 0; sc < sizeof scales / sizeof scales[0]; sc++)
                for (int64_t len = 1; len <= 37; len++) {
                    /* rows one element apart, the buffers filled alike first: an element
                     * written past a row, or one not written, differs */
                    memset(hg, 0xa5, 6 * NF * sizeof *hg);
                    memset(hw, 0xa5, 6 * NF * sizeof *hw);
                    for (int64_t c0 = 0; c0 + len <= NF; c0 += len + 1) {
                        /* what the row holds besides numbers, as store_row must report it */
                        int kinds = 0;
                        for (int64_t c = c0; c < c0 + len; c++)
                            kinds |= isinf(f[c])   ? SDPA__STORED_INF
                                     : isnan(f[c]) ? SDPA__STORED_NAN
                                                   : 0;
                        const int got_kinds =
                            uk->store_row(elem, len, f + c0, scales[sc], (char *)hg + c0 * es, 1);
                        const int want_kinds = sdpa__store_row_generic(
                            elem, len, f + c0, scales[sc], (char *)hw + c0 * es, 1);
                        if (got_kinds != kinds || want_kinds != kinds)
                            CHECK_MSG(bad++ > 0,
                                      "[%s] store_row elem %d at %lld len %lld reports %d "
                                      "(portable %d), not %d",
                                      uk->name, elem, (long long)c0, (long long)len, got_kinds,
                                      want_kinds, kinds);
                    }
                    if (memcmp(hg, hw, (size_t)NF * es) != 0)
                        CHECK_MSG(bad++ > 0, "[%s] store_row elem %d len %lld scale %g differs",
                                  uk->name, elem, (long long)len, (double)scales[sc]);
                }
            memset(hg, 0, 6 * NF * sizeof *hg);
            memset(hw, 0, 6 * NF * sizeof *hw);
            const int got_kinds = uk->store_row(elem, NF, f, 1.0f, hg, 3);
            const int want_kinds = sdpa__store_row_generic(elem, NF, f, 1.0f, hw, 3);
            if (memcmp(hg, hw, 3 * NF * es) != 0 ||
                got_kinds != (SDPA__STORED_INF | SDPA__STORED_NAN) || want_kinds != got_kinds)
                CHECK_MSG(bad++ > 0, "[%s] strided store_row elem %d differs", uk->name, elem);
            for (int c = 0; c < 8; c++) { /* one element, a stride given: the specials */
                const int k1 = uk->store_row(elem, 1, f + c, 1.0f, hg, 3);
                const int want1 = isinf(f[c])   ? SDPA__STORED_INF
                                  : isnan(f[c]) ? SDPA__STORED_NAN
                                                : 0;
                if (k1 != want1)
                    CHECK_MSG(bad++ > 0, "[%s] store_row of one element %d reports %d, not %d",
                              uk->name, c, k1, want1);
            }
        }
        printf("    %-8s load_row and store_row: %s\n", uk->name, bad ? "DIFFER" : "bitwise equal");
        CHECK_INT_EQ(bad, 0);
    }
    free(h);
    free(want);
    free(got);
    free(f);
    free(hw);
    free(hg);
}

/* softmax_few against the same table's softmax on the same scores: nr = 1..4 rows, key counts
 * around its groups of four (and of a vector), running states fresh (m = -inf, l = 0),
 * carried from earlier keys, and above every score; hidden keys (-inf) scattered, a row all
 * hidden, and scores far below the row's best (weights +0). The weights, m and alpha are
 * bitwise softmax's in lanes [0, nr), l within its sum's rounding ((nk + 1) 2^-24 relative:
 * it may add in another fixed order), the report of hidden keys the same; nothing is written
 * in lanes [nr, lanes) of the scores or past nr in m, l and alpha. */
static void test_softmax_few(void) {
    static const int64_t counts[] = {1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 33, 64, 65, 70};
    enum { NK = 70, LANES = 16 };
    const float canary = 12345.0f;
    static float s_few[NK * LANES], s_ref[NK * LANES];
    tu_rng rng = {77};
    tu_impl impls[TU_MAX_IMPLS];
    const int n_impls = tu_impls(impls);
    for (int t = 0; t < n_impls; t++) {
        const sdpa__ukernels *uk = impls[t].impl->uk;
        if (!impls[t].own_uk)
            continue;
        if (uk->softmax_few == NULL) {
            printf("    %-8s offers no softmax_few\n", uk->name);
            continue;
        }
        if (!impls[t].runs) {
            printf("    %-8s skipped: the CPU lacks %s\n", uk->name, impls[t].missing);
            continue;
        }
        const int64_t lanes = uk->lanes, lds = lanes;
        int bad = 0, cases = 0;
        for (int64_t nr = 1; nr <= SDPA__FEW_ROWS; nr++)
            for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++)
                for (int state = 0; state < 3; state++) {
                    const int64_t nk = counts[ci];
                    float m_few[LANES], l_few[LANES], a_few[LANES];
                    float m_ref[LANES], l_ref[LANES], a_ref[LANES];
                    for (int64_t r = 0; r < LANES; r++) {
                        const int carried = state == 1 && r < nr;
                        m_ref[r] = state == 2 ? 40.0f
                                   : carried  ? (float)(3.0 * tu_randn(&rng))
                                              : -INFINITY;
                        l_ref[r] = state == 0 ? 0.0f : (float)(1.0 + 100.0 * tu_uniform(&rng));
                        a_ref[r] = 0.0f;
                        m_few[r] = r < nr ? m_ref[r] : canary;
                        l_few[r] = r < nr ? l_ref[r] : canary;
                        a_few[r] = canary;
                    }
                    for (int64_t j = 0; j < nk; j++)
                        for (int64_t r = 0; r < lanes; r++) {
                            const double u = tu_uniform(&rng);
                            float x = (float)(4.0 * tu_randn(&rng));
                            if (u < 0.15 || (r == 1 && nr > 2)) /* row 1 of 3 or 4: all hidden */
                                x = -INFINITY;
                            else if (u < 0.25)
                                x -= 150.0f; /* a weight of +0 */
                            s_ref[j * lds + r] = r < nr ? x : 0.0f;
                            s_few[j * lds + r] = r < nr ? x : canary;
                        }
                    const int hf = uk->softmax_few(nk, nr, s_few, lds, m_few, l_few, a_few);
                    const int hr = uk->softmax(nk, lanes, s_ref, lds, m_ref, l_ref, a_ref);
                    int ok = (hf != 0) == (hr != 0);
                    for (int64_t r = 0; r < LANES; r++) {
                        if (r >= nr) {
                            ok &= m_few[r] == canary && l_few[r] == canary && a_few[r] == canary;
                            continue;
                        }
                        ok &= memcmp(&m_few[r], &m_ref[r], sizeof(float)) == 0 &&
                              memcmp(&a_few[r], &a_ref[r], sizeof(float)) == 0;
                        ok &= fabs((double)l_few[r] - l_ref[r]) <=
                              (double)(nk + 1) * 0x1p-24 * fabs((double)l_ref[r]);
                    }
                    for (int64_t j = 0; j < nk; j++)
                        for (int64_t r = 0; r < lanes; r++)
                            ok &= r < nr ? memcmp(&s_few[j * lds + r], &s_ref[j * lds + r],
                                                  sizeof(float)) == 0
                                         : s_few[j * lds + r] == canary;
                    if (!ok)
                        CHECK_MSG(bad++ > 0, "[%s] softmax_few nr=%lld nk=%lld state %d differs",
                                  uk->name, (long long)nr, (long long)nk, state);
                    cases++;
                }
        printf("    %-8s softmax_few: %d cases, %s\n", uk->name, cases,
               bad ? "DIFFER" : "as softmax (l within its rounding)");
        CHECK_INT_EQ(bad, 0);
    }
}

/* The scores of qk_few on f32 keys (wide), or of qk_few_half on the same keys in elem (h,
 * row stride ld), into s (16 lanes a key). */
static void few_scores(const sdpa__ukernels *uk, int elem, int64_t nk, int64_t nr, int64_t d,
                       const float *wide, const uint16_t *h, int64_t ld, const float *const *rows,
                       float *s) {
    if (elem == SDPA__ELEM_F32)
        uk->qk_few(nk, nr, d, wide, d, wide, rows, 0.125f, s, 16);
    else
        uk->qk_few_half(elem, nk, nr, d, h, ld, h + ld, rows, 0.125f, s, 16);
}

/* The decode entries that read a cache in place (qk_few_half for f16, pv_few for f16, bf16
 * and f32) give bitwise what qk_few and pv give on the same rows widened (or copied) first,
 * and qk_few_half for bf16 the exact scores within a dot product's error bound, for every
 * row count they take (1..4), feature counts around the vector widths, key counts around
 * their blocks, and a row stride wider than the row. The rows they may ask for ahead
 * (k_next, v_next) are other rows of the same buffer: a request changes no result. And
 * qk_few's and qk_few_half's scores of several rows are bitwise those of each row alone. */
static void test_few_in_place_entries(void) {
    /* (160: a pair of vectors after two blocks of 64 columns; 577: past the 512 features a
     * table regroups on the stack for bf16 keys) */
    static const int64_t dims[] = {1, 7, 8, 9, 15, 16, 17, 33, 64, 127, 128, 129, 160, 577};
    enum { NK = 37, LD_PAD = 5, MAXD = 577 };
    const int64_t ld = MAXD + LD_PAD;
    uint16_t *h = malloc(NK * ld * sizeof *h);
    float *f = malloc(NK * ld * sizeof *f); /* the f32 cache */
    float *wide = malloc(NK * ld * sizeof *wide), *q = malloc(4 * MAXD * sizeof *q);
    float *s_want = malloc(NK * 16 * sizeof *s_want), *s_got = malloc(NK * 16 * sizeof *s_got);
    float *p = malloc(NK * 16 * sizeof *p), *alpha = malloc(16 * sizeof *alpha);
    float *o_want = malloc(4 * MAXD * sizeof *o_want), *o_got = malloc(4 * MAXD * sizeof *o_got);
    tu_rng rng = {99};
    tu_impl impls[TU_MAX_IMPLS];
    const int n_impls = tu_impls(impls);
    for (int t = 0; t < n_impls; t++) {
        const sdpa__ukernels *uk = impls[t].impl->uk;
        if (!impls[t].own_uk) /* (flash-amx drives flash-avx512's) */
            continue;
        if (uk->qk_few_half == NULL && uk->pv_few == NULL) {
            printf("    %-8s offers no in-place decode entries\n", uk->name);
            continue;
        }
        if (!impls[t].runs) {
            printf("    %-8s skipped: the CPU lacks %s\n", uk->name, impls[t].missing);
            continue;
        }
        int bad = 0, cases = 0;
        for (int elem = SDPA__ELEM_F32; elem <= SDPA__ELEM_BF16; elem++)
            for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
                for (int64_t nr = 1; nr <= SDPA__FEW_ROWS; nr++)
                    for (int64_t nk = 1; nk <= NK; nk += 6) {
                        const int64_t d = dims[di];
                        for (int64_t n = 0; n < NK * ld; n++) {
                            const float x = (float)tu_randn(&rng);
                            uint32_t u;
                            memcpy(&u, &x, sizeof u);
                            /* f16 from a value in its range; bf16 the top half */
                            h[n] = elem == SDPA__ELEM_BF16 ? (uint16_t)(u >> 16)
                                                           : (uint16_t)(0x3c00u ^ (u & 0x83ffu));
                            f[n] = x;
                        }
                        const void *cache = elem == SDPA__ELEM_F32 ? (const void *)f : h;
                        for (int64_t j = 0; j < nk; j++)
                            sdpa__load_row_generic(
                                elem, d,
                                elem == SDPA__ELEM_F32 ? (const void *)(f + j * ld) : h + j * ld, 1,
                                wide + j * d);
                        const float *rows[4];
                        for (int64_t r = 0; r < 4; r++) {
                            for (int64_t c = 0; c < d; c++)
                                q[r * MAXD + c] = (float)tu_randn(&rng);
                            rows[r] = q + r * MAXD;
                        }
                        if (uk->qk_few_half != NULL && elem == SDPA__ELEM_F16) {
                            memset(s_want, 0, NK * 16 * sizeof *s_want);
                            memset(s_got, 0, NK * 16 * sizeof *s_got);
                            uk->qk_few(nk, nr, d, wide, d, wide, rows, 0.125f, s_want, 16);
                            uk->qk_few_half(elem, nk, nr, d, h, ld, h + ld, rows, 0.125f, s_got,
                                            16);
                            if (memcmp(s_want, s_got, (size_t)(nk * 16) * sizeof *s_got) != 0)
                                CHECK_MSG(bad++ > 0,
                                          "[%s] qk_few_half elem %d d=%lld nr=%lld "
                                          "nk=%lld differs from qk_few",
                                          uk->name, elem, (long long)d, (long long)nr,
                                          (long long)nk);
                        }
                        if (uk->qk_few_half != NULL && elem == SDPA__ELEM_BF16) {
                            /* bf16 keys may be summed in an order of the table's own: each
                             * score within a dot product's error bound of the exact one,
                             * (d + 1) u sum |k q| (u = 2^-24; the scale's rounding too),
                             * lanes [nr, lanes) zero */
                            memset(s_got, 0xff, NK * 16 * sizeof *s_got);
                            uk->qk_few_half(elem, nk, nr, d, h, ld, h + ld, rows, 0.125f, s_got,
                                            16);
                            for (int64_t j = 0; j < nk; j++)
                                for (int64_t r = 0; r < uk->lanes; r++) {
                                    double exact = 0.0, mag = 0.0;
                                    for (int64_t c = 0; c < d && r < nr; c++) {
                                        exact += 0.125 * wide[j * d + c] * rows[r][c];
                                        mag += fabs(0.125 * wide[j * d + c] * rows[r][c]);
                                    }
                                    const double got = s_got[j * 16 + r];
                                    if (!(fabs(got - exact) <= (double)(d + 1) * 0x1p-24 * mag))
                                        CHECK_MSG(bad++ > 0,
                                                  "[%s] qk_few_half bf16 d=%lld nr=%lld "
                                                  "nk=%lld: key %lld row %lld %.9g, exact %.9g",
                                                  uk->name, (long long)d, (long long)nr,
                                                  (long long)nk, (long long)j, (long long)r, got,
                                                  exact);
                                }
                        }
                        if (nr > 1 && (elem == SDPA__ELEM_F32 || uk->qk_few_half != NULL)) {
                            /* each of nr rows as qk_few (qk_few_half) gives it alone: the
                             * sums over the features of a block of rows by keys (AVX-512:
                             * one tree for 3 and 4 rows) add in the order of one row's */
                            few_scores(uk, elem, nk, nr, d, wide, h, ld, rows, s_got);
                            for (int64_t r = 0; r < nr; r++) {
                                few_scores(uk, elem, nk, 1, d, wide, h, ld, rows + r, s_want);
                                for (int64_t j = 0; j < nk; j++)
                                    if (memcmp(s_want + j * 16, s_got + j * 16 + r,
                                               sizeof *s_got) != 0)
                                        CHECK_MSG(bad++ > 0,
                                                  "[%s] qk_few d=%lld nr=%lld nk=%lld: row %lld "
                                                  "of key %lld differs from the row alone",
                                                  uk->name, (long long)d, (long long)nr,
                                                  (long long)nk, (long long)r, (long long)j);
                            }
                        }
                        if (uk->pv_few != NULL) {
                            for (int64_t n = 0; n < nk * 16; n++)
                                p[n] = (float)tu_uniform(&rng);
                            for (int64_t r = 0; r < 16; r++)
                                alpha[r] = (float)tu_uniform(&rng);
                            for (int64_t n = 0; n < 4 * MAXD; n++)
                                o_want[n] = o_got[n] = (float)tu_randn(&rng);
                            uk->pv(nk, nr, d, p, 16, alpha, wide, d, o_want, MAXD);
                            uk->pv_few(elem, nk, nr, d, p, 16, alpha, cache, ld, cache, o_got,
                                       MAXD);
                            if (memcmp(o_want, o_got, 4 * MAXD * sizeof *o_got) != 0)
                                CHECK_MSG(bad++ > 0,
                                          "[%s] pv_few elem %d d=%lld nr=%lld "
                                          "nk=%lld differs from pv",
                                          uk->name, elem, (long long)d, (long long)nr,
                                          (long long)nk);
                        }
                        cases++;
                    }
        printf("    %-8s qk_few_half, pv_few: %d cases, %s\n", uk->name, cases,
               bad ? "DIFFER" : "as widening first (bf16 scores: within the bound)");
        CHECK_INT_EQ(bad, 0);
    }
    free(h);
    free(f);
    free(wide);
    free(q);
    free(s_want);
    free(s_got);
    free(p);
    free(alpha);
    free(o_want);
    free(o_got);
}

/* bias (ukernels.h) one score at a time, as the contract states it. */
static float bias_one(float x, const float *slope, const double *pos, double step,
                      const float *const *m, int64_t r, int64_t j) {
    if (slope != NULL)
        x = x - slope[r] * (float)fabs(pos[r] + step * (double)j);
    if (m != NULL)
        x = m[r][j] == -INFINITY ? -INFINITY : x + m[r][j];
    return x;
}

/* Equal bits, or both NaN (a NaN's payload is not part of any contract). */
static int same_float(float a, float b) {
    return memcmp(&a, &b, sizeof a) == 0 || (isnan(a) && isnan(b));
}

/* A score or a mask value: mostly normal ones, and now and then one of the values the rules
 * single out. */
static float draw_value(tu_rng *rng, double scale, const float *special, int n_special) {
    const uint64_t u = tu_next(rng) % 8;
    if (u == 0)
        return special[tu_next(rng) % (uint64_t)n_special];
    return (float)(scale * tu_randn(rng));
}

enum { BIAS_MAXR = 37, BIAS_MAXK = 70, BIAS_PAD = 3 };
enum { BIAS_CAP = (BIAS_MAXR + BIAS_PAD) * (BIAS_MAXK + BIAS_PAD) + 64 };
static const uint32_t bias_canary = 0x7fa5a5a5u; /* a NaN no operation produces */

/* One tile of nr x nk scores through uk->bias with ALiBi (what & 1) and the mask (what & 2),
 * row-major (layout 1) or transposed (0), against bias_one. @return 1 if every float of the
 * buffer is as it should be, else 0 with a failure that names the first wrong one. */
static int bias_case(const sdpa__ukernels *uk, int what, int layout, int64_t nr, int64_t nk,
                     double step, tu_rng *rng) {
    static const float special_s[] = {INFINITY, -INFINITY, NAN, -0.0f, 0.0f, 3e38f};
    static const float special_m[] = {-INFINITY, -INFINITY, -0.0f, INFINITY, NAN, -FLT_MAX};
    static float s[BIAS_CAP], want[BIAS_CAP];
    const int64_t rs = layout ? nk + BIAS_PAD : 1, js = layout ? 1 : nr + BIAS_PAD;
    float canary;
    /* the rows' inputs in buffers of exactly their size, so that the sanitizer build sees an
     * entry read past them (every row's mask values on their own, the slopes, the positions) */
    float *slope = malloc((size_t)(nr > 0 ? nr : 1) * sizeof *slope);
    double *pos = malloc((size_t)(nr > 0 ? nr : 1) * sizeof *pos);
    float *mrow[BIAS_MAXR];
    const float *m[BIAS_MAXR];
    memcpy(&canary, &bias_canary, sizeof canary);
    for (int64_t r = 0; r < nr; r++) {
        slope[r] = (float)(0.5 * tu_uniform(rng));
        const double span = r % 5 == 0 ? 0x1p26 : 4096.0; /* some distances round */
        pos[r] = floor(span * (2.0 * tu_uniform(rng) - 1.0));
        mrow[r] = malloc((size_t)(nk > 0 ? nk : 1) * sizeof *mrow[r]);
        m[r] = mrow[r];
        for (int64_t j = 0; j < nk; j++)
            mrow[r][j] = draw_value(rng, 4.0, special_m, 6);
    }
    for (int e = 0; e < BIAS_CAP; e++)
        s[e] = canary;
    for (int64_t r = 0; r < nr; r++)
        for (int64_t j = 0; j < nk; j++)
            s[r * rs + j * js] = draw_value(rng, 10.0, special_s, 6);
    memcpy(want, s, sizeof s);
    const float *sl = what & 1 ? slope : NULL;
    const float *const *mk = what & 2 ? m : NULL;
    for (int64_t r = 0; r < nr; r++)
        for (int64_t j = 0; j < nk; j++)
            want[r * rs + j * js] = bias_one(want[r * rs + j * js], sl, pos, step, mk, r, j);
    uk->bias(nr, nk, sl, pos, step, mk, s, rs, js);
    for (int64_t r = 0; r < nr; r++)
        free(mrow[r]);
    free(slope);
    free(pos);
    for (int e = 0; e < BIAS_CAP; e++) {
        const int outside = memcmp(&want[e], &canary, sizeof canary) == 0;
        if (outside ? memcmp(&s[e], &canary, sizeof canary) == 0 : same_float(s[e], want[e]))
            continue;
        static const char *const terms[] = {"", "ALiBi", "the mask", "ALiBi and the mask"};
        CHECK_MSG(0, "[%s] bias with %s, %s, %lld rows x %lld keys: float %d is %g, not %g%s",
                  uk->name, terms[what], layout ? "row-major" : "transposed", (long long)nr,
                  (long long)nk, e, (double)s[e], (double)want[e],
                  outside ? " (outside the tile)" : "");
        return 0;
    }
    return 1;
}

/* Every table's bias is bitwise the contract (a NaN's payload aside) in both layouts (rs = 1,
 * the forward's transposed tiles; js = 1, the backward's row-major ones), for row and key
 * counts around the vector widths and the 16 x 16 blocks the tables turn (0..37 rows, 0..70
 * keys), with ALiBi alone, the mask alone and both: distances past 2^24 (rounded once), steps
 * of 1 and 3, negative and positive positions; mask values -inf, -0.0 (a bool's "attend"),
 * +inf, NaN and -FLT_MAX among random ones, and scores of +-inf, NaN and -0.0. Nothing but the
 * tile's scores is written: every other float of the buffer (the padding between rows or
 * keys, and past the tile) keeps its canary. */
static void test_bias(void) {
    static const int64_t counts_r[] = {0, 1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, BIAS_MAXR};
    static const int64_t counts_k[] = {0, 1, 3, 8, 15, 16, 17, 33, 63, 64, 65, BIAS_MAXK};
    enum { NR = sizeof counts_r / sizeof counts_r[0], NK = sizeof counts_k / sizeof counts_k[0] };
    tu_rng rng = {2024};
    tu_impl impls[TU_MAX_IMPLS];
    const int n_impls = tu_impls(impls);
    for (int t = 0; t < n_impls; t++) {
        const sdpa__ukernels *uk = impls[t].impl->uk;
        if (!impls[t].own_uk) /* (flash-amx drives flash-avx512's) */
            continue;
        if (!impls[t].runs) {
            printf("    %-8s skipped: the CPU lacks %s\n", uk->name, impls[t].missing);
            continue;
        }
        int bad = 0, cases = 0;
        for (int what = 1; what <= 3; what++)
            for (int layout = 0; layout < 2; layout++)
                for (int a = 0; a < NR; a++)
                    for (int c = 0; c < NK; c++, cases++)
                        if (bad == 0)
                            bad += !bias_case(uk, what, layout, counts_r[a], counts_k[c],
                                              (a + c) % 2 ? 3.0 : 1.0, &rng);
        printf("    %-8s bias: %d tiles, %s\n", uk->name, cases, bad ? "DIFFER" : "bitwise equal");
    }
}

int main(int argc, char **argv) {
    tu_report_impls();
    return CHECK_RUN(argc, argv, CASE(test_exp_accuracy), CASE(test_softcap_accuracy),
                     CASE(test_convert_rows), CASE(test_few_in_place_entries),
                     CASE(test_softmax_few), CASE(test_bias));
}
