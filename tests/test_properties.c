/*
 * test_properties.c — properties attention has whatever the numbers: rows of weights sum to
 * 1; permuting the keys (with their values and mask columns) changes nothing; adding a
 * constant to every score of a row changes the weights and output not at all and the LSE by
 * that constant; the output lies in the convex hull of the visible values; weights @ V is the
 * output; w_ij = exp(s_ij - LSE_i); and results are bitwise repeatable, call after call and
 * for any thread count.
 */
#include "check.h"
#include "testutil.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { B = 2, H = 3, LQ = 13, LK = 21, D = 16 };

typedef struct fixture {
    tu_problem pb; /* q, k, v, o, lse and the params p */
    tu_tensor w, mask;
    sdpa_ctx *ctx;
} fixture;

/* q, k, v random; a random bool mask (B, 1, LQ, LK) that leaves every row a key; causal
 * bottom-right with a window, so several rules act at once. */
static void setup(fixture *f, uint64_t seed) {
    tu_rng r = {seed};
    memset(f, 0, sizeof *f);
    f->pb = tu_problem_new((tu_dims){B, H, H, LQ, LK, D, D}, NULL);
    f->w = tu_alloc(SDPA_F32, B, H, LQ, LK, TU_BHLD, 0, 0);
    f->mask = tu_alloc(SDPA_BOOL, B, 1, LQ, LK, TU_BHLD, 0, 0);
    tu_fill_randn(&f->pb.q, &r, 2.0, 0);
    tu_fill_randn(&f->pb.k, &r, 1.0, 0);
    tu_fill_randn(&f->pb.v, &r, 1.0, 0);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < LQ; i++)
            for (int j = 0; j < LK; j++)
                tu_set(&f->mask.t, b, 0, i, j, j == LK - LQ + i || tu_uniform(&r) < 0.7);
    f->pb.p.mask = &f->mask.t;
    f->pb.p.causal = 1;
    f->pb.p.align = SDPA_ALIGN_BOTTOM_RIGHT;
    f->pb.p.use_window = 1;
    f->pb.p.window_left = 9;
    f->pb.p.window_right = -1;
    f->ctx = tu_ctx(0, SDPA_ISA_AUTO);
}

static void teardown(fixture *f) {
    tu_problem_free(&f->pb);
    tu_free(&f->w);
    tu_free(&f->mask);
    sdpa_ctx_destroy(f->ctx);
}

static void run(fixture *f) {
    CHECK_INT_EQ(tu_problem_forward(f->ctx, &f->pb), SDPA_OK);
    CHECK_INT_EQ(sdpa_weights(f->ctx, &f->pb.q.t, &f->pb.k.t, &f->pb.p, &f->w.t), SDPA_OK);
}

static void test_rows_sum_to_one_and_match_output(void) {
    fixture f;
    setup(&f, 1);
    run(&f);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < LQ; i++) {
                double sum = 0.0;
                for (int j = 0; j < LK; j++) {
                    const double w = tu_get(&f.w.t, b, h, i, j);
                    CHECK(w >= 0.0 && w <= 1.0);
                    sum += w;
                }
                CHECK_NEAR(sum, 1.0, 1e-6);
                for (int d = 0; d < D; d++) {
                    double acc = 0.0, lo = INFINITY, hi = -INFINITY;
                    for (int j = 0; j < LK; j++) {
                        const double w = tu_get(&f.w.t, b, h, i, j),
                                     x = tu_get(&f.pb.v.t, b, h, j, d);
                        acc += w * x;
                        if (w > 0.0) {
                            lo = fmin(lo, x);
                            hi = fmax(hi, x);
                        }
                    }
                    const double o = tu_get(&f.pb.o.t, b, h, i, d);
                    CHECK_NEAR(o, acc, 1e-5);
                    CHECK(o >= lo - 1e-6 && o <= hi + 1e-6); /* convex hull */
                }
            }
    teardown(&f);
}

/* w_ij = exp(s_ij - LSE_i), with s_ij recomputed here for visible keys. */
static void test_weights_from_lse(void) {
    fixture f;
    setup(&f, 2);
    run(&f);
    const double scale = 1.0 / sqrt((double)D);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < LQ; i++)
                for (int j = 0; j < LK; j++) {
                    const double w = tu_get(&f.w.t, b, h, i, j);
                    if (w == 0.0)
                        continue;
                    double s = 0.0;
                    for (int d = 0; d < D; d++)
                        s += tu_get(&f.pb.q.t, b, h, i, d) * tu_get(&f.pb.k.t, b, h, j, d);
                    CHECK_NEAR(w, exp(s * scale - tu_get(&f.pb.lse.t, b, h, i, 0)), 1e-6);
                }
    teardown(&f);
}

/* Permuting keys, values and mask columns together leaves a non-causal result unchanged. */
static void test_key_permutation(void) {
    fixture f;
    setup(&f, 3);
    f.pb.p.causal = 0;
    f.pb.p.use_window = 0;
    run(&f);
    double *o1 = tu_to_doubles(&f.pb.o.t), *l1 = tu_to_doubles(&f.pb.lse.t);
    int perm[LK];
    for (int j = 0; j < LK; j++)
        perm[j] = (j * 8 + 5) % LK; /* 8 and 21 are coprime: a permutation */
    tu_tensor k2 = tu_alloc(SDPA_F32, B, H, LK, D, TU_BHLD, 0, 0);
    tu_tensor v2 = tu_alloc(SDPA_F32, B, H, LK, D, TU_BHLD, 0, 0);
    tu_tensor m2 = tu_alloc(SDPA_BOOL, B, 1, LQ, LK, TU_BHLD, 0, 0);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++)
            for (int j = 0; j < LK; j++)
                for (int d = 0; d < D; d++) {
                    tu_set(&k2.t, b, h, perm[j], d, tu_get(&f.pb.k.t, b, h, j, d));
                    tu_set(&v2.t, b, h, perm[j], d, tu_get(&f.pb.v.t, b, h, j, d));
                }
        for (int i = 0; i < LQ; i++)
            for (int j = 0; j < LK; j++)
                tu_set(&m2.t, b, 0, i, perm[j], tu_get(&f.mask.t, b, 0, i, j));
    }
    f.pb.p.mask = &m2.t;
    CHECK_INT_EQ(sdpa_forward(f.ctx, &f.pb.q.t, &k2.t, &v2.t, &f.pb.p, &f.pb.o.t, &f.pb.lse.t),
                 SDPA_OK);
    double *o2 = tu_to_doubles(&f.pb.o.t), *l2 = tu_to_doubles(&f.pb.lse.t);
    for (int n = 0; n < B * H * LQ * D; n++)
        CHECK_NEAR(o1[n], o2[n], 1e-6);
    for (int n = 0; n < B * H * LQ; n++)
        CHECK_NEAR(l1[n], l2[n], 1e-6);
    free(o1);
    free(o2);
    free(l1);
    free(l2);
    tu_free(&k2);
    tu_free(&v2);
    tu_free(&m2);
    teardown(&f);
}

/* An additive bias c_i, constant along a row (mask shape (1, 1, LQ, 1)), shifts LSE_i by c_i
 * and leaves weights and outputs alone, up to the rounding the bias itself brings: each
 * biased score s + c is rounded at its magnitude (up to max |c| + max |s|), so the
 * differences from the row's max move by a few ulp of that magnitude, and each weight by that
 * much relative (a tolerance of about 1e-5 here; 1e-6 failed by 8 % with the AVX2 table's
 * exp). An implementation that ignored or misapplied the bias would be off by far more. */
static void test_row_constant_invariance(void) {
    fixture f;
    setup(&f, 4);
    f.pb.p.mask = NULL;
    run(&f);
    double *o1 = tu_to_doubles(&f.pb.o.t), *l1 = tu_to_doubles(&f.pb.lse.t),
           *w1 = tu_to_doubles(&f.w.t);
    tu_tensor c = tu_alloc(SDPA_F32, 1, 1, LQ, 1, TU_BHLD, 0, 0);
    for (int i = 0; i < LQ; i++)
        tu_set(&c.t, 0, 0, i, 0, 3.0 * i - 17.5);
    f.pb.p.mask = &c.t;
    run(&f);
    double *o2 = tu_to_doubles(&f.pb.o.t), *l2 = tu_to_doubles(&f.pb.lse.t),
           *w2 = tu_to_doubles(&f.w.t);
    double vmax = 0.0, smax = 0.0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int j = 0; j < LK; j++) {
                for (int d = 0; d < D; d++)
                    vmax = fmax(vmax, fabs(tu_get(&f.pb.v.t, b, h, j, d)));
                for (int i = 0; i < LQ; i++) {
                    double dot = 0.0;
                    for (int d = 0; d < D; d++)
                        dot += tu_get(&f.pb.q.t, b, h, i, d) * tu_get(&f.pb.k.t, b, h, j, d);
                    smax = fmax(smax, fabs(dot) / sqrt((double)D));
                }
            }
    const double w_tol = 4.0 * FLT_EPSILON * (18.5 + smax); /* max |c_i| = 18.5 */
    for (int n = 0; n < B * H * LQ * D; n++)
        CHECK_NEAR(o1[n], o2[n], w_tol * vmax);
    for (int n = 0; n < B * H * LQ * LK; n++)
        CHECK_NEAR(w1[n], w2[n], w_tol);
    for (int n = 0; n < B * H * LQ; n++)
        CHECK_NEAR(l2[n] - l1[n], 3.0 * (n % LQ) - 17.5, 1e-5);
    free(o1);
    free(o2);
    free(l1);
    free(l2);
    free(w1);
    free(w2);
    tu_free(&c);
    teardown(&f);
}

/* Adding a constant vector to every value row adds it to every output row (weights sum to
 * 1); the same problem twice, and with any thread count, gives identical bytes. */
static void test_value_shift_and_repeatability(void) {
    fixture f;
    setup(&f, 5);
    run(&f);
    tu_tensor first = tu_alloc(SDPA_F32, B, H, LQ, D, TU_BHLD, 0, 0);
    memcpy(first.buf, f.pb.o.buf, f.pb.o.bytes);
    static const int threads[] = {1, 2, 3, 4, 7, 16};
    for (size_t n = 0; n < sizeof threads / sizeof threads[0]; n++) {
        sdpa_ctx *ctx = tu_ctx(threads[n], SDPA_ISA_AUTO);
        memset(f.pb.o.buf, 0, f.pb.o.bytes);
        CHECK_INT_EQ(sdpa_forward(ctx, &f.pb.q.t, &f.pb.k.t, &f.pb.v.t, &f.pb.p, &f.pb.o.t, NULL),
                     SDPA_OK);
        CHECK_MSG(memcmp(first.buf, f.pb.o.buf, f.pb.o.bytes) == 0, "n_threads=%d differs",
                  threads[n]);
        sdpa_ctx_destroy(ctx);
    }
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int j = 0; j < LK; j++)
                for (int d = 0; d < D; d++)
                    tu_set(&f.pb.v.t, b, h, j, d, tu_get(&f.pb.v.t, b, h, j, d) + 10.0 * d);
    run(&f);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < LQ; i++)
                for (int d = 0; d < D; d++)
                    CHECK_NEAR(tu_get(&f.pb.o.t, b, h, i, d),
                               tu_get(&first.t, b, h, i, d) + 10.0 * d, 1e-4);
    tu_free(&first);
    teardown(&f);
}

CHECK_MAIN(CASE(test_rows_sum_to_one_and_match_output), CASE(test_weights_from_lse),
           CASE(test_key_permutation), CASE(test_row_constant_invariance),
           CASE(test_value_shift_and_repeatability))
