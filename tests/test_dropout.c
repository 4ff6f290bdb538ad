/*
 * test_dropout.c — dropout's generator and keep decision (src/core/philox.c), and the
 * reference forward with dropout (src/ref/ref_forward.c).
 *
 * Philox4x32-10 against published known answers; the documented mapping of (seed, offset, b,
 * h, i, j) to key and counter pinned, so a fast kernel that draws other bits fails here; the
 * threshold rule and its rounding; keep rates over 2^20 elements within 5 sigma (overall, per
 * lane of a Philox call, for neighbouring pairs); fresh masks for fresh offsets and seeds;
 * the same mask for the same inputs; every table's dropout_row against the scalar draws; the
 * tiled forward with dropout at every level against the reference. The gradients of the dropped
 * forward are checked in test_ref_backward.c.
 */
#include "check.h"
#include "testutil.h"

#include "../src/core/philox.h"
#include "../src/core/validate.h"
#include "../src/dispatch/impl.h"
#include "../src/ref/ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Philox4x32-10 known answers: the (counter, key, output) triples of Random123's kat_vectors
 * file (D. E. Shaw Research), lines "philox4x32 10 ...", as reproduced in
 * DEShawResearch/fs123, core123/ut/ut_philox.cpp (test_kat_philox4x32). */
static void test_philox_kat(void) {
    static const struct {
        uint32_t ctr[4], key[2], out[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        /* the digits of pi */
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t n = 0; n < sizeof kat / sizeof kat[0]; n++) {
        uint32_t out[4];
        sdpa__philox4x32_10(kat[n].ctr, kat[n].key, out);
        for (int w = 0; w < 4; w++)
            CHECK_MSG(out[w] == kat[n].out[w], "vector %zu word %d: %08x, want %08x", n, w,
                      (unsigned)out[w], (unsigned)kat[n].out[w]);
        /* in place */
        uint32_t c[4] = {kat[n].ctr[0], kat[n].ctr[1], kat[n].ctr[2], kat[n].ctr[3]};
        sdpa__philox4x32_10(c, kat[n].key, c);
        CHECK(memcmp(c, out, sizeof c) == 0);
    }
}

/* The mapping of philox.h, pinned: a fast kernel must draw exactly these bits. */
static void test_dropout_mapping(void) {
    const uint64_t seed = 0x1122334455667788u, offset = 3;
    const uint64_t key64 = seed + offset * UINT64_C(0x9E3779B97F4A7C15);
    const uint32_t key[2] = {(uint32_t)key64, (uint32_t)(key64 >> 32)};
    uint32_t k2[2];
    sdpa__dropout_key(seed, offset, k2);
    CHECK(k2[0] == key[0] && k2[1] == key[1]);
    for (int64_t j = 0; j < 12; j++) {
        const uint32_t ctr[4] = {(uint32_t)(j / 4), 5, 6, 7};
        uint32_t out[4];
        sdpa__philox4x32_10(ctr, key, out);
        CHECK(sdpa__dropout_draw(seed, offset, 7, 6, 5, j) == out[j % 4]);
    }
    /* the largest indices a problem can have fit their words */
    const int64_t big = SDPA_MAX_EXTENT - 1;
    const uint32_t ctr[4] = {(uint32_t)(big / 4), (uint32_t)big, (uint32_t)big, (uint32_t)big};
    uint32_t out[4];
    sdpa__philox4x32_10(ctr, key, out);
    CHECK(sdpa__dropout_draw(seed, offset, big, big, big, big) == out[big % 4]);
    /* moving one index by one changes the draw (a distinct counter or lane each time) */
    const uint32_t d0 = sdpa__dropout_draw(seed, offset, 1, 1, 1, 1);
    CHECK(d0 != sdpa__dropout_draw(seed, offset, 2, 1, 1, 1));
    CHECK(d0 != sdpa__dropout_draw(seed, offset, 1, 2, 1, 1));
    CHECK(d0 != sdpa__dropout_draw(seed, offset, 1, 1, 2, 1));
    CHECK(d0 != sdpa__dropout_draw(seed, offset, 1, 1, 1, 2));
    CHECK(d0 != sdpa__dropout_draw(seed, offset, 1, 1, 1, 5));
    CHECK(d0 != sdpa__dropout_draw(seed, offset + 1, 1, 1, 1, 1));
    CHECK(d0 != sdpa__dropout_draw(seed + 1, offset, 1, 1, 1, 1));
    /* offsets that differ by n < 2^30 move the key by n * phi, more than 2^33 from 0 either
     * way round (philox.h; searched exhaustively there, repeated here up to 2^22) */
    uint64_t x = 0, closest = UINT64_MAX;
    for (uint64_t n = 1; n < (UINT64_C(1) << 22); n++) {
        x += UINT64_C(0x9E3779B97F4A7C15);
        const uint64_t dist = x < UINT64_MAX - x ? x : 0 - x;
        closest = dist < closest ? dist : closest;
    }
    CHECK_MSG(closest > (UINT64_C(1) << 33), "closest %llu", (unsigned long long)closest);
}

static void test_dropout_threshold(void) {
    const uint64_t one = UINT64_C(1) << 32;
    CHECK(sdpa__dropout_threshold(0.0) == one);
    CHECK(sdpa__dropout_threshold(-0.5) == one);
    CHECK(sdpa__dropout_threshold(NAN) == one);
    CHECK(sdpa__dropout_threshold(1.0) == 0);
    CHECK(sdpa__dropout_threshold(1.5) == 0);
    CHECK(sdpa__dropout_threshold(0.5) == one / 2);
    CHECK(sdpa__dropout_threshold(0.25) == 3 * (one / 4));
    /* 0.1 * 2^32 = 429496729.6 rounds to 429496730 dropped */
    CHECK(sdpa__dropout_threshold(0.1) == one - 429496730u);
    /* half a step rounds up, less rounds down; 1 - 2^-33 rounds to a threshold of 0 */
    CHECK(sdpa__dropout_threshold(0x1p-33) == one - 1);
    CHECK(sdpa__dropout_threshold(0x1p-34) == one);
    CHECK(sdpa__dropout_threshold(1.0 - 0x1p-33) == 0);
    CHECK(sdpa__dropout_threshold(1.0 - 0x1p-32) == 1);
    /* the keep probability is within 2^-33 of 1 - p */
    tu_rng r = {29};
    for (int n = 0; n < 10000; n++) {
        const double p = tu_uniform(&r);
        const double keep = (double)sdpa__dropout_threshold(p) / 4294967296.0;
        CHECK_MSG(fabs(keep - (1.0 - p)) <= 0x1p-33, "p=%.17g keep=%.17g", p, keep);
    }
    /* the decision is the comparison with the threshold */
    for (int64_t j = 0; j < 64; j++) {
        const uint32_t draw = sdpa__dropout_draw(9, 0, 0, 0, 0, j);
        CHECK(sdpa__dropout_keep(9, 0, 0, 0, 0, j, 0.3) ==
              ((uint64_t)draw < sdpa__dropout_threshold(0.3)));
    }
}

/* |count - n * prob| <= 5 sigma of a binomial. */
static int within_5_sigma(double p, const char *what, long count, long n, double prob) {
    const double sigma = sqrt((double)n * prob * (1.0 - prob));
    const double z = ((double)count - (double)n * prob) / sigma;
    const int ok = fabs(z) <= 5.0;
    printf("    p=%.1f %-28s %ld of %ld, expected %.0f, z = %+.2f%s\n", p, what, count, n,
           (double)n * prob, z, ok ? "" : "  FAILS");
    return ok;
}

/* Keep rates over 2^20 elements for p in {0.1, 0.5, 0.9}: overall, per lane of a Philox
 * call, and for pairs of neighbours inside a call and across two calls. */
static void test_dropout_rates(void) {
    enum { B = 2, H = 4, LQ = 256, LK = 512 };
    static const double ps[] = {0.1, 0.5, 0.9};
    unsigned char *keep = malloc((size_t)B * H * LQ * LK);
    for (int n = 0; n < 3; n++) {
        const double p = ps[n];
        const double prob = (double)sdpa__dropout_threshold(p) / 4294967296.0;
        long kept = 0, lane[4] = {0}, pairs_in = 0, pairs_across = 0, n_in = 0, n_across = 0;
        size_t at = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < LQ; i++)
                    for (int64_t j = 0; j < LK; j++, at++) {
                        keep[at] = (unsigned char)sdpa__dropout_keep(1234, 5, b, h, i, j, p);
                        kept += keep[at];
                        lane[j % 4] += keep[at];
                        if (j % 2 == 1) { /* (2m, 2m+1): lanes (0,1) and (2,3) of one call */
                            pairs_in += keep[at] && keep[at - 1];
                            n_in++;
                        }
                        if (j % 4 == 0 && j > 0) { /* (4m-1, 4m): lane 3, then next call's 0 */
                            pairs_across += keep[at] && keep[at - 1];
                            n_across++;
                        }
                    }
        const long total = (long)B * H * LQ * LK;
        CHECK(within_5_sigma(p, "kept", kept, total, prob));
        for (int l = 0; l < 4; l++) {
            char what[32];
            snprintf(what, sizeof what, "kept in lane %d", l);
            CHECK(within_5_sigma(p, what, lane[l], total / 4, prob));
        }
        CHECK(within_5_sigma(p, "pairs kept, one call", pairs_in, n_in, prob * prob));
        CHECK(within_5_sigma(p, "pairs kept, two calls", pairs_across, n_across, prob * prob));
    }
    free(keep);
}

/* Fresh offsets and seeds give fresh masks (disagreeing on 2 q (1 - q) of the elements, as
 * independent masks do); the same ones give the same mask. */
static void test_dropout_offsets(void) {
    enum { L = 256 };
    const double p = 0.5, prob = 0.5;
    static const uint64_t other[][2] = {
        {77, 1}, {77, UINT64_C(1) << 32}, {78, 0}, {77 - UINT64_C(0x9E3779B97F4A7C15), 1}};
    for (size_t n = 0; n < sizeof other / sizeof other[0]; n++) {
        long differ = 0, same = 0;
        for (int64_t i = 0; i < L; i++)
            for (int64_t j = 0; j < L; j++) {
                const int a = sdpa__dropout_keep(77, 0, 0, 1, i, j, p);
                differ += a != sdpa__dropout_keep(other[n][0], other[n][1], 0, 1, i, j, p);
                same += a != sdpa__dropout_keep(77, 0, 0, 1, i, j, p);
            }
        char what[64];
        snprintf(what, sizeof what, "differ from (%llu, %llu)", (unsigned long long)other[n][0],
                 (unsigned long long)other[n][1]);
        if (n < 3)
            CHECK(within_5_sigma(p, what, differ, (long)L * L, 2.0 * prob * (1.0 - prob)));
        else /* seed - phi with offset + 1 is the documented collision: the same key */
            CHECK(differ == 0);
        CHECK(same == 0);
    }
}

/* Every table's dropout_row (the one the tiled paths draw with) against sdpa__dropout_draws4,
 * factor by factor: starts j0 = 0..9 (inside a Philox call, across the vector steps), lengths
 * 0..150 (partial steps at both ends), indices up to 2^31 - 1, thresholds at the edges (0 drops
 * all, 2^32 keeps all, 2^31 and 2^32 - 1 at the unsigned compare's edges) and that of p = 0.1.
 * Every factor must be bitwise the scalar one, and nothing written outside z[0, n). */
static void test_dropout_row(void) {
    enum { MAX_N = 150, MAX_J0 = 9, GUARD = 8 };
    const uint64_t one = UINT64_C(1) << 32;
    const uint64_t thresholds[] = {0, 1, one / 2, one - 1, one, sdpa__dropout_threshold(0.1)};
    const int64_t big = SDPA_MAX_EXTENT - 1;
    static const int64_t rows[][3] = {{0, 0, 0}, {1, 3, 17}, {7, 31, 4095}};
    const int64_t bigs[][3] = {{big, big, big}, {big - 1, 5, big - 2}, {3, big, 0}};
    const float keep_scale = (float)(1.0 / (1.0 - 0.1));
    uint32_t key[2];
    sdpa__dropout_key(0x0123456789abcdefu, 42, key);
    tu_impl impls[TU_MAX_IMPLS];
    const int n_impls = tu_impls(impls);
    for (int t = 0; t < n_impls; t++) {
        if (!impls[t].runs) {
            printf("    [%s] skipped: the CPU lacks %s\n", impls[t].name, impls[t].missing);
            continue;
        }
        const sdpa__ukernels *uk = impls[t].impl->uk;
        CHECK(uk != NULL && uk->dropout_row != NULL);
        if (uk == NULL || uk->dropout_row == NULL)
            continue;
        long wrong = 0, checked = 0;
        for (size_t x = 0; x < 6; x++) {
            const int64_t *bhi = x < 3 ? rows[x] : bigs[x - 3];
            for (size_t k = 0; k < sizeof thresholds / sizeof thresholds[0]; k++) {
                /* the keys near 2^31 - 1 too, with the largest rows */
                const int64_t jbase = x < 3 ? 0 : big - MAX_N - MAX_J0;
                float want[MAX_J0 + MAX_N];
                for (int64_t j = jbase; j < jbase + MAX_J0 + MAX_N; j++) {
                    uint32_t draw[4];
                    sdpa__dropout_draws4(key, bhi[0], bhi[1], bhi[2], j / 4, draw);
                    want[j - jbase] = (uint64_t)draw[j % 4] < thresholds[k] ? keep_scale : 0.0f;
                }
                for (int64_t j0 = jbase; j0 <= jbase + MAX_J0; j0++)
                    for (int64_t n = 0; n <= MAX_N; n++) {
                        float buf[GUARD + MAX_N + GUARD], *z = buf + GUARD;
                        for (int g = 0; g < GUARD + MAX_N + GUARD; g++)
                            buf[g] = -1.0f;
                        uk->dropout_row(key, bhi[0], bhi[1], bhi[2], j0, n, thresholds[k],
                                        keep_scale, z);
                        for (int64_t jj = 0; jj < n; jj++) {
                            const float w = want[j0 - jbase + jj];
                            if (memcmp(&z[jj], &w, sizeof w) != 0 && wrong++ < 5)
                                printf("    [%s] (b %lld h %lld i %lld j %lld) threshold %llu: "
                                       "%g, want %g\n",
                                       uk->name, (long long)bhi[0], (long long)bhi[1],
                                       (long long)bhi[2], (long long)(j0 + jj),
                                       (unsigned long long)thresholds[k], (double)z[jj], (double)w);
                        }
                        for (int64_t g = 0; g < GUARD; g++) /* nothing outside z[0, n) */
                            wrong += buf[g] != -1.0f || z[n + g] != -1.0f;
                        checked += n;
                    }
            }
        }
        CHECK_MSG(wrong == 0, "[%s] dropout_row: %ld of %ld factors differ", uk->name, wrong,
                  checked);
        printf("    [%s] dropout_row: %ld factors as sdpa__dropout_draws4's\n", uk->name, checked);
    }
}

/* The reference forward with dropout: the same call twice gives the same bytes, another
 * offset another output, and dropout_p = 0 ignores the seed and offset bit for bit. */
static void test_dropout_forward(void) {
    enum { L = 7, D = 5 };
    tu_rng r = {31};
    tu_problem pb = tu_problem_new((tu_dims){2, 2, 1, L, L, D, D}, &r);
    tu_tensor o2 = tu_alloc(SDPA_F32, 2, 2, L, D, TU_BHLD, 0, 0);
    sdpa_ctx *ctx = tu_ctx(1, SDPA_ISA_AUTO);
    sdpa__problem p;
    CHECK_INT_EQ(sdpa__check_forward(ctx, &pb.q.t, &pb.k.t, &pb.v.t, &pb.p, &pb.o.t, &pb.lse.t, &p),
                 SDPA_OK);
    CHECK_INT_EQ(sdpa__ref_forward(ctx, &p, &pb.o.t, NULL), SDPA_OK);
    p.dropout_seed = 1;
    p.dropout_offset = 2;
    CHECK_INT_EQ(sdpa__ref_forward(ctx, &p, &o2.t, NULL), SDPA_OK);
    CHECK(memcmp(pb.o.buf, o2.buf, o2.bytes) == 0);
    p.dropout_p = 0.4;
    CHECK_INT_EQ(sdpa__ref_forward(ctx, &p, &pb.o.t, NULL), SDPA_OK);
    CHECK_INT_EQ(sdpa__ref_forward(ctx, &p, &o2.t, NULL), SDPA_OK);
    CHECK(memcmp(pb.o.buf, o2.buf, o2.bytes) == 0);
    p.dropout_offset = 3;
    CHECK_INT_EQ(sdpa__ref_forward(ctx, &p, &o2.t, NULL), SDPA_OK);
    CHECK(memcmp(pb.o.buf, o2.buf, o2.bytes) != 0);
    /* p = 1 drops everything: O = 0, no NaN from 1 / (1 - p) */
    p.dropout_p = 1.0;
    CHECK_INT_EQ(sdpa__ref_forward(ctx, &p, &o2.t, NULL), SDPA_OK);
    for (int64_t i = 0; i < L; i++)
        CHECK(tu_get(&o2.t, 1, 1, i, 2) == 0.0);
    sdpa_ctx_destroy(ctx);
    tu_problem_free(&pb);
    tu_free(&o2);
}

/* The same-precision baseline with dropout (testing.md), in the storage precision lp (F32 or
 * BF16): per row, the scores (a dot product summed in f32, then the scale) rounded to lp, the
 * softmax in f32 over the visible keys, each weight rounded to lp and times dropout's factor,
 * and O summed in f32 and rounded to lp. Causal (top-left) or none; no mask. */
static void naive_dropout(const tu_problem *pb, int lp, double *out) {
    const sdpa_tensor *q = &pb->q.t, *k = &pb->k.t, *v = &pb->v.t;
    const int64_t B = q->shape[0], Hq = q->shape[1], Lq = q->shape[2], Dk = q->shape[3];
    const int64_t Hkv = k->shape[1], Lk = k->shape[2], Dv = v->shape[3];
    const double scale = pb->p.scale != 0.0f ? pb->p.scale : (float)(1.0 / sqrt((double)Dk));
    const double keep_scale = (float)(1.0 / (1.0 - (double)pb->p.dropout_p));
    double *w = malloc((size_t)Lk * sizeof *w);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < Lq; i++) {
                const int64_t hk = h / (Hq / Hkv), last = pb->p.causal ? i : Lk - 1;
                double m = -INFINITY, sum = 0.0;
                for (int64_t j = 0; j <= last && j < Lk; j++) {
                    double dot = 0.0;
                    for (int64_t c = 0; c < Dk; c++)
                        dot =
                            tu_acc_round(lp, dot + tu_get(q, b, h, i, c) * tu_get(k, b, hk, j, c));
                    w[j] = tu_round(lp, scale * dot);
                    m = w[j] > m ? w[j] : m;
                }
                for (int64_t j = 0; j <= last && j < Lk; j++) {
                    w[j] = tu_acc_round(lp, exp(w[j] - m));
                    sum = tu_acc_round(lp, sum + w[j]);
                }
                for (int64_t c = 0; c < Dv; c++) {
                    double o = 0.0;
                    for (int64_t j = 0; j <= last && j < Lk; j++) {
                        const int keep =
                            sdpa__dropout_keep(pb->p.dropout_seed, pb->p.dropout_offset, b, h, i, j,
                                               (double)pb->p.dropout_p);
                        const double z = keep ? tu_round(lp, w[j] / sum) * keep_scale : 0.0;
                        o = tu_acc_round(lp, o + z * tu_get(v, b, hk, j, c));
                    }
                    out[((b * Hq + h) * Lq + i) * Dv + c] = tu_round(lp, o);
                }
            }
    free(w);
}

/* A copy of t in dtype dt (values rounded to it), t freed. */
static void to_dtype(tu_tensor *t, sdpa_dtype dt) {
    tu_tensor c =
        tu_alloc(dt, t->t.shape[0], t->t.shape[1], t->t.shape[2], t->t.shape[3], TU_BHLD, 0, 0);
    tu_copy(&c.t, &t->t);
    tu_free(t);
    *t = c;
}

/* The tiled forward draws the masks itself: at every level it passes the rule against the
 * reference (the golden, which draws the same masks) with the f32 baseline above, gives the
 * same bytes for any thread count and on repeated calls, leaves the LSE as without dropout,
 * and a NaN in the V of a key that a row sees but drops still makes that column NaN there
 * (0 x NaN, as PyTorch), also on the careful path (a slice with a hidden key). */
static void test_tiled_forward_dropout(void) {
    /* the bf16 cases, D a multiple of 32, are the AMX table's own where the CPU has it */
    static const struct {
        tu_dims d;
        int causal;
        float p;
        sdpa_dtype dt;
    } cases[] = {{{1, 2, 2, 70, 70, 16, 16}, 0, 0.2f, SDPA_F32},
                 {{2, 4, 2, 33, 150, 24, 8}, 0, 0.5f, SDPA_F32},
                 {{1, 3, 1, 129, 129, 32, 32}, 1, 0.3f, SDPA_F32},
                 {{1, 2, 2, 1, 700, 64, 64}, 0, 0.1f, SDPA_F32},
                 {{1, 4, 2, 150, 200, 64, 64}, 1, 0.2f, SDPA_BF16},
                 {{1, 2, 1, 1, 700, 128, 128}, 0, 0.1f, SDPA_BF16}};
    tu_impl impls[TU_MAX_IMPLS];
    const int n_impls = tu_impls(impls);
    for (size_t n = 0; n < sizeof cases / sizeof cases[0]; n++) {
        tu_rng r = {77 + n};
        tu_problem pb = tu_problem_new(cases[n].d, &r);
        const sdpa_dtype dt = cases[n].dt;
        if (dt != SDPA_F32) {
            to_dtype(&pb.q, dt);
            to_dtype(&pb.k, dt);
            to_dtype(&pb.v, dt);
            to_dtype(&pb.o, dt);
        }
        pb.p.causal = cases[n].causal;
        pb.p.dropout_p = cases[n].p;
        pb.p.dropout_seed = 1234 + n;
        pb.p.dropout_offset = 5;
        const tu_dims d = cases[n].d;
        const size_t n_out = (size_t)(d.B * d.Hq * d.Lq * d.Dv),
                     n_lse = (size_t)(d.B * d.Hq * d.Lq);
        tu_tensor go = tu_alloc(SDPA_F32, d.B, d.Hq, d.Lq, d.Dv, TU_BHLD, 0, 0);
        tu_tensor gl = tu_alloc(SDPA_F32, d.B, d.Hq, d.Lq, 1, TU_BHLD, 0, 0);
        tu_tensor o2 = tu_alloc(dt, d.B, d.Hq, d.Lq, d.Dv, TU_BHLD, 0, 0);
        sdpa_ctx *ref = tu_ctx(1, SDPA_ISA_AUTO);
        CHECK_INT_EQ(tu_golden_forward(ref, &pb.q.t, &pb.k.t, &pb.v.t, &pb.p, &go.t, &gl.t),
                     SDPA_OK);
        sdpa_ctx_destroy(ref);
        double *golden = tu_to_doubles(&go.t), *golden_lse = tu_to_doubles(&gl.t);
        double *lp = malloc(n_out * sizeof *lp);
        naive_dropout(&pb, dt, lp);
        for (int t = 0; t < n_impls; t++) {
            if (!impls[t].runs)
                printf("    [%s] skipped: the CPU lacks %s\n", impls[t].name, impls[t].missing);
            if (!impls[t].runs || !tu_impl_takes(&impls[t], &pb.q.t, &pb.k.t, &pb.v.t, &pb.p,
                                                 &pb.o.t)) /* (f32: not flash-amx's) */
                continue;
            sdpa_ctx *ctx = tu_ctx(2, impls[t].level);
            CHECK_INT_EQ(tu_problem_forward(ctx, &pb), SDPA_OK);
            CHECK_MSG(strcmp(sdpa_ctx_last_kernel(ctx), impls[t].name) == 0, "ran %s, not %s",
                      sdpa_ctx_last_kernel(ctx), impls[t].name);
            double *got = tu_to_doubles(&pb.o.t), *got_lse = tu_to_doubles(&pb.lse.t);
            char what[96];
            snprintf(what, sizeof what, "dropout %.1f case %zu %s [%s] out", (double)cases[n].p, n,
                     sdpa_dtype_name(dt), impls[t].name);
            CHECK(tu_rule(what, got, lp, golden, n_out, dt, dt == SDPA_F32 ? 3.0 : 2.0, 0.0));
            double worst = 0.0;
            for (size_t x = 0; x < n_lse; x++)
                worst = fmax(worst, fabs(got_lse[x] - golden_lse[x]));
            CHECK_MSG(worst <= 1e-5, "[%s] lse differs from the reference's by %g", impls[t].name,
                      worst);
            for (int threads = 1; threads <= 7; threads += 3) {
                sdpa_ctx *c2 = tu_ctx(threads, impls[t].level);
                CHECK_INT_EQ(sdpa_forward(c2, &pb.q.t, &pb.k.t, &pb.v.t, &pb.p, &o2.t, NULL),
                             SDPA_OK);
                CHECK_MSG(memcmp(o2.buf, pb.o.buf, o2.bytes) == 0, "[%s] %d threads differ from 2",
                          impls[t].name, threads);
                sdpa_ctx_destroy(c2);
            }
            free(got);
            free(got_lse);
            sdpa_ctx_destroy(ctx);
        }
        free(golden);
        free(golden_lse);
        free(lp);
        tu_free(&go);
        tu_free(&gl);
        tu_free(&o2);
        tu_problem_free(&pb);
    }

    /* a dropped key with NaN in its V: the rows that see it are NaN in that column, as in the
     * reference, with and without a hidden key in its slice (causal: rows below it hide it) */
    for (int causal = 0; causal <= 1; causal++) {
        tu_rng r = {5};
        tu_problem pb = tu_problem_new((tu_dims){1, 1, 1, 40, 40, 8, 8}, &r);
        pb.p.causal = causal;
        pb.p.dropout_p = 0.5f;
        pb.p.dropout_seed = 3;
        int64_t jd = -1; /* a key dropped for row 39, which sees every key */
        for (int64_t j = 5; j < 40 && jd < 0; j++)
            if (!sdpa__dropout_keep(3, 0, 0, 0, 39, j, 0.5))
                jd = j;
        CHECK(jd >= 0);
        tu_set(&pb.v.t, 0, 0, jd, 2, NAN);
        tu_tensor go = tu_alloc(SDPA_F32, 1, 1, 40, 8, TU_BHLD, 0, 0);
        sdpa_ctx *ref = tu_ctx(1, SDPA_ISA_AUTO);
        CHECK_INT_EQ(tu_golden_forward(ref, &pb.q.t, &pb.k.t, &pb.v.t, &pb.p, &go.t, NULL),
                     SDPA_OK);
        sdpa_ctx_destroy(ref);
        for (int t = 0; t < n_impls; t++) {
            if (!impls[t].runs ||
                !tu_impl_takes(&impls[t], &pb.q.t, &pb.k.t, &pb.v.t, &pb.p, &pb.o.t))
                continue;
            sdpa_ctx *ctx = tu_ctx(1, impls[t].level);
            CHECK_INT_EQ(tu_problem_forward(ctx, &pb), SDPA_OK);
            int wrong = 0;
            for (int64_t i = 0; i < 40; i++)
                for (int64_t c = 0; c < 8; c++)
                    wrong += isnan(tu_get(&pb.o.t, 0, 0, i, c)) != isnan(tu_get(&go.t, 0, 0, i, c));
            CHECK_MSG(wrong == 0 && isnan(tu_get(&pb.o.t, 0, 0, 39, 2)),
                      "[%s] causal=%d: %d NaN positions differ from the reference", impls[t].name,
                      causal, wrong);
            sdpa_ctx_destroy(ctx);
        }
        tu_free(&go);
        tu_problem_free(&pb);
    }
}

int main(int argc, char **argv) {
    return CHECK_RUN(argc, argv, CASE(test_philox_kat), CASE(test_dropout_mapping),
                     CASE(test_dropout_threshold), CASE(test_dropout_rates),
                     CASE(test_dropout_offsets), CASE(test_dropout_row), CASE(test_dropout_forward),
                     CASE(test_tiled_forward_dropout));
}
