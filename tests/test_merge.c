/*
 * test_merge.c — sdpa_merge through the public API. The keys are cut into 1, 2, 3 and 7 parts
 * (uneven, some empty, some fully masked for some rows by a bool mask stated with the keys'
 * global positions), each part is sdpa_forward over its slice of K and V, and the merge must
 * pass the rule of testing.md against the golden over all keys, as the one-shot forward does.
 * Then the row rules (all parts -inf, NaN and +inf LSEs, NaN in a part's output, a -inf
 * part's output never read), one rounding to the output's dtype, strided views, the same
 * bytes for any thread count, and every bad argument refused with its status, a message
 * naming it and the outputs untouched.
 */
#include "check.h"
#include "testutil.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_PARTS = 8 };

/* The n_parts partial results: outputs and LSEs, owned, with their views side by side as
 * sdpa_merge takes them. */
typedef struct parts {
    int n;
    tu_tensor o[MAX_PARTS], lse[MAX_PARTS];
    sdpa_tensor ot[MAX_PARTS], lt[MAX_PARTS];
} parts;

static void parts_free(parts *ps) {
    for (int p = 0; p < ps->n; p++) {
        tu_free(&ps->o[p]);
        tu_free(&ps->lse[p]);
    }
    ps->n = 0;
}

/* Every element of t set to x. */
static void fill(tu_tensor *t, double x) {
    for (int64_t b = 0; b < t->t.shape[0]; b++)
        for (int64_t h = 0; h < t->t.shape[1]; h++)
            for (int64_t l = 0; l < t->t.shape[2]; l++)
                for (int64_t d = 0; d < t->t.shape[3]; d++)
                    tu_set(&t->t, b, h, l, d, x);
}

/* The view of n entries of t from `from` along dimension dim. */
static sdpa_tensor slice(const sdpa_tensor *t, int dim, int64_t from, int64_t n) {
    sdpa_tensor s = *t;
    s.data = (char *)t->data + from * t->stride[dim] * (int64_t)sdpa_dtype_size(t->dtype);
    s.shape[dim] = n;
    return s;
}

/* The parts of attention over the keys cut at cuts[0] = 0 < ... <= cuts[n] = Lk: part p is
 * sdpa_forward over keys [cuts[p], cuts[p+1]) with the mask's columns of those keys, its
 * output of dtype dt in a layout of its own (BLHD or BHLD, padded rows, odd offsets). An empty
 * part is O = 0, LSE = -inf, given directly (the second one holds NaN in O instead, which must
 * never be read). */
static void make_parts(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                       const sdpa_tensor *v, const sdpa_params *params, const int64_t *cuts, int n,
                       sdpa_dtype dt, parts *ps) {
    const int64_t B = q->shape[0], H = q->shape[1], L = q->shape[2], D = v->shape[3];
    int empties = 0;
    ps->n = n;
    for (int p = 0; p < n; p++) {
        const int64_t j0 = cuts[p], nk = cuts[p + 1] - cuts[p];
        ps->o[p] = tu_alloc(dt, B, H, L, D, p % 2 ? TU_BLHD : TU_BHLD, p % 3, p % 2);
        ps->lse[p] = tu_alloc(SDPA_F32, B, H, L, 1, TU_BHLD, p % 2, 0);
        ps->ot[p] = ps->o[p].t;
        ps->lt[p] = ps->lse[p].t;
        if (nk == 0) {
            fill(&ps->o[p], empties++ == 1 ? NAN : 0.0);
            fill(&ps->lse[p], -INFINITY);
            continue;
        }
        const sdpa_tensor kp = slice(k, 2, j0, nk), vp = slice(v, 2, j0, nk);
        sdpa_tensor mp;
        sdpa_params pp = *params;
        if (params->mask != NULL) {
            mp = slice(params->mask, 3, j0, nk);
            pp.mask = &mp;
        }
        const sdpa_status st = sdpa_forward(ctx, q, &kp, &vp, &pp, &ps->o[p].t, &ps->lse[p].t);
        CHECK_MSG(st == SDPA_OK, "part %d: %s: %s", p, sdpa_status_name(st),
                  sdpa_ctx_last_error(ctx));
    }
}

static double rule_k(sdpa_dtype dt) {
    return dt == SDPA_F32 ? 3.0 : 2.0;
}

static double nmse_gate(sdpa_dtype dt) {
    return dt == SDPA_F32 ? 1e-10 : dt == SDPA_F16 ? 1e-6 : 5e-5;
}

/* A bool mask (1, H, L, Lk) in global key positions: even heads see a bottom-right causal
 * band of 7 keys (so the parts before the band are fully masked for them), odd heads a random
 * 70 % of the keys, and every row with (i + h) % 5 == 4 sees none. */
static tu_tensor make_mask(int64_t H, int64_t L, int64_t Lk, tu_rng *r) {
    tu_tensor m = tu_alloc(SDPA_BOOL, 1, H, L, Lk, TU_BHLD, 0, 0);
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < L; i++)
            for (int64_t j = 0; j < Lk; j++) {
                const int64_t diag = i + Lk - L;
                int see = h % 2 == 0 ? (j <= diag && j >= diag - 6) : tu_uniform(r) < 0.7;
                if ((i + h) % 5 == 4)
                    see = 0;
                tu_set(&m.t, 0, h, i, j, see);
            }
    m.t.shape[0] = 2; /* broadcast over the batch of two */
    m.t.stride[0] = 0;
    return m;
}

/* Merges the parts of one cut into out (dtype dt) and lse, and checks both by the rule
 * against the golden, with the one-shot forward beside it; fully masked rows exactly 0. */
static void check_cut(sdpa_ctx *ctx, const char *name, const tu_problem *pb, const int64_t *cuts,
                      int n, sdpa_dtype dt) {
    const sdpa_tensor *q = &pb->q.t, *k = &pb->k.t, *v = &pb->v.t;
    const int64_t B = q->shape[0], H = q->shape[1], L = q->shape[2], D = v->shape[3];
    const size_t n_out = (size_t)(B * H * L * D), n_lse = (size_t)(B * H * L);
    double *want = malloc(n_out * sizeof *want), *lp = malloc(n_out * sizeof *lp);
    double *lp32 = malloc(n_out * sizeof *lp32);
    double *want_lse = malloc(n_lse * sizeof *want_lse), *lp_lse = malloc(n_lse * sizeof *lp_lse);
    /* the golden; the same-precision baseline of the outputs' dtype for O, and of f32 for the
     * LSE, which is f32 whatever the outputs' dtype */
    tu_naive_forward(q, k, v, &pb->p, -1, want, want_lse);
    tu_naive_forward(q, k, v, &pb->p, (int)dt, lp, NULL);
    tu_naive_forward(q, k, v, &pb->p, SDPA_F32, lp32, lp_lse);

    parts ps;
    make_parts(ctx, q, k, v, &pb->p, cuts, n, dt, &ps);
    tu_tensor out = tu_alloc(dt, B, H, L, D, TU_BHLD, 0, 0);
    tu_tensor lse = tu_alloc(SDPA_F32, B, H, L, 1, TU_BHLD, 0, 0);
    const sdpa_status st = sdpa_merge(ctx, n, ps.ot, ps.lt, &out.t, &lse.t);
    CHECK_MSG(st == SDPA_OK, "%s: %s: %s", name, sdpa_status_name(st), sdpa_ctx_last_error(ctx));
    tu_tensor one = tu_alloc(dt, B, H, L, D, TU_BHLD, 0, 0);
    tu_tensor one_lse = tu_alloc(SDPA_F32, B, H, L, 1, TU_BHLD, 0, 0);
    CHECK(sdpa_forward(ctx, q, k, v, &pb->p, &one.t, &one_lse.t) == SDPA_OK);

    double *got = tu_to_doubles(&out.t), *got_lse = tu_to_doubles(&lse.t);
    double *ref = tu_to_doubles(&one.t), *ref_lse = tu_to_doubles(&one_lse.t);
    char what[128];
    snprintf(what, sizeof what, "%s merged out", name);
    CHECK_MSG(tu_rule(what, got, lp, want, n_out, dt, rule_k(dt), nmse_gate(dt)), "%s", what);
    snprintf(what, sizeof what, "%s merged lse", name);
    CHECK_MSG(tu_rule(what, got_lse, lp_lse, want_lse, n_lse, SDPA_F32, 3.0, 0.0), "%s", what);
    snprintf(what, sizeof what, "%s one-shot out", name);
    CHECK_MSG(tu_rule(what, ref, lp, want, n_out, dt, rule_k(dt), nmse_gate(dt)), "%s", what);
    snprintf(what, sizeof what, "%s one-shot lse", name);
    CHECK_MSG(tu_rule(what, ref_lse, lp_lse, want_lse, n_lse, SDPA_F32, 3.0, 0.0), "%s", what);
    int masked = 0, nonzero = 0;
    for (size_t r = 0; r < n_lse; r++) {
        if (want_lse[r] != -INFINITY)
            continue;
        masked++;
        nonzero += got_lse[r] != -INFINITY;
        for (int64_t c = 0; c < D; c++)
            nonzero += got[r * (size_t)D + (size_t)c] != 0.0;
    }
    CHECK_MSG(masked > 0 && nonzero == 0, "%s: %d fully masked rows, %d values not 0 / -inf", name,
              masked, nonzero);
    free(got);
    free(got_lse);
    free(ref);
    free(ref_lse);
    free(want);
    free(lp);
    free(lp32);
    free(want_lse);
    free(lp_lse);
    tu_free(&out);
    tu_free(&lse);
    tu_free(&one);
    tu_free(&one_lse);
    parts_free(&ps);
}

/* Lk = 37 cut into 1, 2, 3 and 7 parts, outputs in f32, f16 and bf16, with GQA. */
static void test_split_keys(void) {
    static const int64_t cut1[] = {0, 37}, cut2[] = {0, 30, 37}, cut3[] = {0, 5, 5, 37},
                         cut3b[] = {0, 0, 29, 37}, cut7[] = {0, 1, 8, 8, 20, 21, 33, 37},
                         cut7b[] = {0, 0, 6, 6, 6, 30, 31, 37};
    static const struct {
        const int64_t *cuts;
        int n;
    } cuts[] = {{cut1, 1}, {cut2, 2}, {cut3, 3}, {cut3b, 3}, {cut7, 7}, {cut7b, 7}};
    static const sdpa_dtype dts[] = {SDPA_F32, SDPA_F16, SDPA_BF16};
    const tu_dims d = {2, 4, 2, 9, 37, 16, 24};
    tu_rng r = {31};
    tu_problem pb = tu_problem_new(d, &r);
    tu_tensor mask = make_mask(d.Hq, d.Lq, d.Lk, &r);
    pb.p.mask = &mask.t;
    sdpa_ctx *ctx = tu_ctx(2, SDPA_ISA_AUTO);
    for (size_t t = 0; t < sizeof dts / sizeof dts[0]; t++)
        for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
            char name[64];
            snprintf(name, sizeof name, "%d parts (%zu) %s", cuts[c].n, c, sdpa_dtype_name(dts[t]));
            check_cut(ctx, name, &pb, cuts[c].cuts, cuts[c].n, dts[t]);
        }
    sdpa_ctx_destroy(ctx);
    tu_free(&mask);
    tu_problem_free(&pb);
}

/* One part is the part itself: w = 1, sum 1, so the output is its input, bit for bit. */
static void test_one_part_is_identity(void) {
    tu_rng r = {5};
    tu_tensor o = tu_alloc(SDPA_F32, 2, 3, 5, 7, TU_BLHD, 1, 0);
    tu_tensor l = tu_alloc(SDPA_F32, 2, 3, 5, 1, TU_BHLD, 0, 0);
    tu_fill_randn(&o, &r, 3.0, 0.0);
    tu_fill_randn(&l, &r, 10.0, 0.0);
    tu_tensor out = tu_alloc(SDPA_F32, 2, 3, 5, 7, TU_BHLD, 0, 0);
    tu_tensor lse = tu_alloc(SDPA_F32, 2, 3, 5, 1, TU_BHLD, 0, 0);
    sdpa_ctx *ctx = tu_ctx(3, SDPA_ISA_AUTO);
    CHECK(sdpa_merge(ctx, 1, &o.t, &l.t, &out.t, &lse.t) == SDPA_OK);
    int diff = 0;
    for (int64_t b = 0; b < 2; b++)
        for (int64_t h = 0; h < 3; h++)
            for (int64_t i = 0; i < 5; i++) {
                diff += tu_get(&lse.t, b, h, i, 0) != tu_get(&l.t, b, h, i, 0);
                for (int64_t c = 0; c < 7; c++)
                    diff += tu_get(&out.t, b, h, i, c) != tu_get(&o.t, b, h, i, c);
            }
    CHECK_INT_EQ(diff, 0);
    sdpa_ctx_destroy(ctx);
    tu_free(&o);
    tu_free(&l);
    tu_free(&out);
    tu_free(&lse);
}

/* The row rules, on parts written by hand: one row per rule, for each output dtype. */
static void test_row_rules(void) {
    enum { N = 3, ROWS = 7, D = 4 };
    const double ninf = -INFINITY;
    /* the parts' LSEs per row */
    static const double lses[ROWS][N] = {
        {-INFINITY, -INFINITY, -INFINITY},    /* 0: all empty: 0 and -inf, though O holds NaN */
        {0.5, NAN, 1.0},                      /* 1: a NaN lse: the row NaN */
        {INFINITY, 0.0, -INFINITY},           /* 2: a +inf lse: the row NaN */
        {0.0, 1.0, 2.0},                      /* 3: NaN in O[2] of part 1: column 2 NaN */
        {-INFINITY, 0.0, 1.0986122886681098}, /* 4: weights 1 and 3; part 0 NaN, unread */
        {1000.0, -1000.0, -INFINITY},         /* 5: exp(-2000) = 0: part 0 alone */
        {-5.0, -INFINITY, -INFINITY},         /* 6: one part seen */
    };
    static const sdpa_dtype dts[] = {SDPA_F32, SDPA_F16, SDPA_BF16};
    sdpa_ctx *ctx = tu_ctx(2, SDPA_ISA_AUTO);
    for (size_t t = 0; t < 3; t++) {
        const sdpa_dtype dt = dts[t];
        parts ps;
        ps.n = N;
        for (int p = 0; p < N; p++) {
            ps.o[p] = tu_alloc(p == 1 ? SDPA_BF16 : dt, 1, 1, ROWS, D, TU_BHLD, 0, 0);
            ps.lse[p] = tu_alloc(SDPA_F32, 1, 1, ROWS, 1, TU_BHLD, 0, 0);
            for (int i = 0; i < ROWS; i++) {
                tu_set(&ps.lse[p].t, 0, 0, i, 0, lses[i][p]);
                for (int c = 0; c < D; c++) {
                    double x = 1.0 + p * 4.0 + c; /* part p: 1 + 4p + c */
                    if ((i == 0 || i == 4) && p == 0)
                        x = NAN; /* -inf parts: never read */
                    if (i == 3 && p == 1 && c == 2)
                        x = NAN;
                    tu_set(&ps.o[p].t, 0, 0, i, c, x);
                }
            }
            ps.ot[p] = ps.o[p].t;
            ps.lt[p] = ps.lse[p].t;
        }
        tu_tensor out = tu_alloc(dt, 1, 1, ROWS, D, TU_BHLD, 0, 0);
        tu_tensor lse = tu_alloc(SDPA_F32, 1, 1, ROWS, 1, TU_BHLD, 0, 0);
        CHECK(sdpa_merge(ctx, N, ps.ot, ps.lt, &out.t, &lse.t) == SDPA_OK);
        const char *dn = sdpa_dtype_name(dt);
        for (int c = 0; c < D; c++) {
            const double o0 = tu_get(&out.t, 0, 0, 0, c);
            CHECK_MSG(o0 == 0.0 && !signbit(o0), "%s row 0 [%d]: %g", dn, c, o0);
            CHECK_MSG(isnan(tu_get(&out.t, 0, 0, 1, c)), "%s row 1 [%d]", dn, c);
            CHECK_MSG(isnan(tu_get(&out.t, 0, 0, 2, c)), "%s row 2 [%d]", dn, c);
            /* row 3: weights e^-2, e^-1, 1 over parts 1 + c, 5 + c, 9 + c */
            const double w0 = exp(-2.0), w1 = exp(-1.0), sum = w0 + w1 + 1.0;
            const double want3 = (w0 * (1 + c) + w1 * (5 + c) + (9 + c)) / sum;
            const double got3 = tu_get(&out.t, 0, 0, 3, c);
            if (c == 2)
                CHECK_MSG(isnan(got3), "%s row 3 [2]: %g", dn, got3);
            else
                CHECK_MSG(fabs(got3 - want3) <= 1e-2 * want3, "%s row 3 [%d]: %g vs %g", dn, c,
                          got3, want3);
            /* row 4: (1 (5 + c) + 3 (9 + c)) / 4 = 8 + c, exact in every dtype */
            CHECK_MSG(tu_get(&out.t, 0, 0, 4, c) == 8.0 + c, "%s row 4 [%d]: %g", dn, c,
                      tu_get(&out.t, 0, 0, 4, c));
            CHECK_MSG(tu_get(&out.t, 0, 0, 5, c) == 1.0 + c, "%s row 5 [%d]", dn, c);
            CHECK_MSG(tu_get(&out.t, 0, 0, 6, c) == 1.0 + c, "%s row 6 [%d]", dn, c);
        }
        CHECK(tu_get(&lse.t, 0, 0, 0, 0) == ninf);
        CHECK(isnan(tu_get(&lse.t, 0, 0, 1, 0)) && isnan(tu_get(&lse.t, 0, 0, 2, 0)));
        CHECK_NEAR(tu_get(&lse.t, 0, 0, 3, 0), 2.0 + log(exp(-2.0) + exp(-1.0) + 1.0), 1e-6);
        CHECK_NEAR(tu_get(&lse.t, 0, 0, 4, 0), log(4.0), 1e-6);
        CHECK(tu_get(&lse.t, 0, 0, 5, 0) == 1000.0);
        CHECK(tu_get(&lse.t, 0, 0, 6, 0) == -5.0);
        /* and without lse: the same output */
        tu_tensor out2 = tu_alloc(dt, 1, 1, ROWS, D, TU_BLHD, 1, 1);
        CHECK(sdpa_merge(ctx, N, ps.ot, ps.lt, &out2.t, NULL) == SDPA_OK);
        int diff = 0;
        for (int i = 0; i < ROWS; i++)
            for (int c = 0; c < D; c++) {
                const double a = tu_get(&out.t, 0, 0, i, c), b = tu_get(&out2.t, 0, 0, i, c);
                diff += !(a == b || (isnan(a) && isnan(b)));
            }
        CHECK_MSG(diff == 0, "%s: %d values differ without lse", dn, diff);
        tu_free(&out);
        tu_free(&out2);
        tu_free(&lse);
        parts_free(&ps);
    }
    sdpa_ctx_destroy(ctx);
}

/* Random parts of mixed dtypes and layouts: B = 2, H = 3, L = 301, D = 40, 7 parts, LSEs in
 * [-4, 4], a fifth of them -inf, part 3 -inf on every third row and every part on rows
 * 7, 57, 107, ... */
static void random_parts(parts *ps, uint64_t seed) {
    static const sdpa_dtype dts[] = {SDPA_F32, SDPA_F16, SDPA_BF16};
    tu_rng r = {seed};
    ps->n = 7;
    for (int p = 0; p < ps->n; p++) {
        ps->o[p] = tu_alloc(dts[p % 3], 2, 3, 301, 40, p % 2 ? TU_BLHD : TU_BHLD, p % 4, p);
        ps->lse[p] = tu_alloc(SDPA_F32, 2, 3, 301, 1, TU_BHLD, 0, 0);
        tu_fill_randn(&ps->o[p], &r, 2.0, 0.5);
        for (int64_t b = 0; b < 2; b++)
            for (int64_t h = 0; h < 3; h++)
                for (int64_t i = 0; i < 301; i++) {
                    double x = 8.0 * tu_uniform(&r) - 4.0;
                    if (tu_uniform(&r) < 0.2 || (p == 3 && i % 3 == 0) || i % 50 == 7)
                        x = -INFINITY;
                    tu_set(&ps->lse[p].t, b, h, i, 0, x);
                }
        ps->ot[p] = ps->o[p].t;
        ps->lt[p] = ps->lse[p].t;
    }
}

/* The spacing of dt's values at x (its ulp, subnormals included). */
static double ulp_of(sdpa_dtype dt, double x) {
    const int bits = dt == SDPA_F32 ? 23 : dt == SDPA_F16 ? 10 : 7;
    const int emin = dt == SDPA_F16 ? -14 : -126;
    int e = x == 0.0 ? emin : ilogb(x);
    if (e < emin)
        e = emin;
    return ldexp(1.0, e - bits);
}

/* Each output is the exact merge (in double, from the parts' values) rounded once: within
 * half an ulp of its dtype; the LSE within half an f32 ulp. */
static void test_one_rounding(void) {
    parts ps;
    random_parts(&ps, 11);
    static const sdpa_dtype dts[] = {SDPA_F32, SDPA_F16, SDPA_BF16};
    sdpa_ctx *ctx = tu_ctx(2, SDPA_ISA_AUTO);
    for (size_t t = 0; t < 3; t++) {
        const sdpa_dtype dt = dts[t];
        tu_tensor out = tu_alloc(dt, 2, 3, 301, 40, TU_BHLD, 0, 0);
        tu_tensor lse = tu_alloc(SDPA_F32, 2, 3, 301, 1, TU_BHLD, 0, 0);
        CHECK(sdpa_merge(ctx, ps.n, ps.ot, ps.lt, &out.t, &lse.t) == SDPA_OK);
        double worst = 0.0, worst_lse = 0.0;
        int masked = 0;
        for (int64_t b = 0; b < 2; b++)
            for (int64_t h = 0; h < 3; h++)
                for (int64_t i = 0; i < 301; i++) {
                    double m = -INFINITY, sum = 0.0;
                    for (int p = 0; p < ps.n; p++)
                        m = fmax(m, tu_get(&ps.lt[p], b, h, i, 0));
                    if (m == -INFINITY) {
                        masked++;
                        CHECK(tu_get(&lse.t, b, h, i, 0) == -INFINITY);
                        for (int64_t c = 0; c < 40; c++)
                            CHECK(tu_get(&out.t, b, h, i, c) == 0.0);
                        continue;
                    }
                    for (int p = 0; p < ps.n; p++)
                        sum += exp(tu_get(&ps.lt[p], b, h, i, 0) - m);
                    const double want_lse = m + log(sum);
                    worst_lse = fmax(worst_lse, fabs(tu_get(&lse.t, b, h, i, 0) - want_lse) /
                                                    ulp_of(SDPA_F32, want_lse));
                    for (int64_t c = 0; c < 40; c++) {
                        double acc = 0.0;
                        for (int p = 0; p < ps.n; p++) {
                            const double l = tu_get(&ps.lt[p], b, h, i, 0);
                            if (l != -INFINITY)
                                acc += exp(l - m) * tu_get(&ps.ot[p], b, h, i, c);
                        }
                        const double want = acc / sum;
                        worst =
                            fmax(worst, fabs(tu_get(&out.t, b, h, i, c) - want) / ulp_of(dt, want));
                    }
                }
        printf("    %-5s worst %.6f ulp, lse %.6f ulp, %d rows with every part -inf\n",
               sdpa_dtype_name(dt), worst, worst_lse, masked);
        CHECK_MSG(worst <= 0.5 + 1e-6, "%s: %.6f ulp", sdpa_dtype_name(dt), worst);
        CHECK_MSG(worst_lse <= 0.5 + 1e-6, "lse: %.6f ulp", worst_lse);
        CHECK(masked > 0);
        tu_free(&out);
        tu_free(&lse);
    }
    sdpa_ctx_destroy(ctx);
    parts_free(&ps);
}

/* Outputs as views (BLHD, padded rows, an odd offset, negative strides) hold the same values
 * as contiguous ones. */
static void test_output_views(void) {
    parts ps;
    random_parts(&ps, 12);
    sdpa_ctx *ctx = tu_ctx(2, SDPA_ISA_AUTO);
    tu_tensor out = tu_alloc(SDPA_F16, 2, 3, 301, 40, TU_BHLD, 0, 0);
    tu_tensor lse = tu_alloc(SDPA_F32, 2, 3, 301, 1, TU_BHLD, 0, 0);
    CHECK(sdpa_merge(ctx, ps.n, ps.ot, ps.lt, &out.t, &lse.t) == SDPA_OK);
    tu_tensor vout = tu_alloc(SDPA_F16, 2, 3, 301, 40, TU_BLHD, 5, 3);
    tu_tensor vlse = tu_alloc(SDPA_F32, 2, 301, 3, 1, TU_BHLD, 2, 1); /* (B, L, H) storage */
    sdpa_tensor lv = vlse.t;
    lv.shape[1] = 3;
    lv.shape[2] = 301;
    lv.stride[1] = vlse.t.stride[2];
    lv.stride[2] = vlse.t.stride[1];
    /* the features in reverse order: data at the last one, stride -1 */
    sdpa_tensor ov = vout.t;
    ov.data = (uint16_t *)ov.data + 39;
    ov.stride[3] = -1;
    CHECK(sdpa_merge(ctx, ps.n, ps.ot, ps.lt, &ov, &lv) == SDPA_OK);
    int diff = 0;
    for (int64_t b = 0; b < 2; b++)
        for (int64_t h = 0; h < 3; h++)
            for (int64_t i = 0; i < 301; i++) {
                diff += memcmp(&(double){tu_get(&lse.t, b, h, i, 0)},
                               &(double){tu_get(&lv, b, h, i, 0)}, sizeof(double)) != 0;
                for (int64_t c = 0; c < 40; c++) /* stored in reverse in vout's memory */
                    diff +=
                        memcmp(&(double){tu_get(&out.t, b, h, i, c)},
                               &(double){tu_get(&vout.t, b, h, i, 39 - c)}, sizeof(double)) != 0;
            }
    CHECK_INT_EQ(diff, 0);
    sdpa_ctx_destroy(ctx);
    tu_free(&out);
    tu_free(&lse);
    tu_free(&vout);
    tu_free(&vlse);
    parts_free(&ps);
}

/* The same bytes for 1, 2, 3 and 7 threads and on a repeated call (enough rows for many
 * tasks). */
static void test_deterministic(void) {
    parts ps;
    random_parts(&ps, 13);
    static const int threads[] = {1, 2, 3, 7};
    static const sdpa_dtype dts[] = {SDPA_F32, SDPA_BF16};
    for (size_t t = 0; t < 2; t++) {
        tu_tensor ref = tu_alloc(dts[t], 2, 3, 301, 40, TU_BHLD, 0, 0);
        tu_tensor ref_lse = tu_alloc(SDPA_F32, 2, 3, 301, 1, TU_BHLD, 0, 0);
        for (size_t n = 0; n < sizeof threads / sizeof threads[0]; n++) {
            sdpa_ctx *ctx = tu_ctx(threads[n], SDPA_ISA_AUTO);
            tu_tensor out = tu_alloc(dts[t], 2, 3, 301, 40, TU_BHLD, 0, 0);
            tu_tensor lse = tu_alloc(SDPA_F32, 2, 3, 301, 1, TU_BHLD, 0, 0);
            for (int rep = 0; rep < 2; rep++) {
                tu_fill_canary(&out);
                CHECK(sdpa_merge(ctx, ps.n, ps.ot, ps.lt, &out.t, &lse.t) == SDPA_OK);
                if (n == 0 && rep == 0) {
                    memcpy(ref.buf, out.buf, out.bytes);
                    memcpy(ref_lse.buf, lse.buf, lse.bytes);
                }
                CHECK_MSG(memcmp(out.buf, ref.buf, out.bytes) == 0 &&
                              memcmp(lse.buf, ref_lse.buf, lse.bytes) == 0,
                          "%s, %d threads, call %d: other bytes", sdpa_dtype_name(dts[t]),
                          threads[n], rep + 1);
            }
            sdpa_ctx_destroy(ctx);
            tu_free(&out);
            tu_free(&lse);
        }
        tu_free(&ref);
        tu_free(&ref_lse);
    }
    parts_free(&ps);
}

/* ---- bad arguments ------------------------------------------------------------------------ */

/* Three parts (B, H, L, D) = (1, 8, 3, 4), out and lse, and a context: the fixture the cases
 * break. */
typedef struct bad_fx {
    parts ps;
    tu_tensor out, lse;
    sdpa_tensor o[3], l[3], out_t, lse_t; /* the views a case breaks */
    sdpa_ctx *ctx;
} bad_fx;

/* The views back to the fixture's tensors. */
static void bad_reset(bad_fx *f) {
    for (int p = 0; p < 3; p++) {
        f->o[p] = f->ps.o[p].t;
        f->l[p] = f->ps.lse[p].t;
    }
    f->out_t = f->out.t;
    f->lse_t = f->lse.t;
}

/* The fixture, owning ctx. */
static void bad_new(bad_fx *f, sdpa_ctx *ctx) {
    tu_rng r = {3};
    f->ctx = ctx;
    f->ps.n = 3;
    for (int p = 0; p < 3; p++) {
        f->ps.o[p] = tu_alloc(SDPA_F32, 1, 8, 3, 4, TU_BHLD, 0, 0);
        f->ps.lse[p] = tu_alloc(SDPA_F32, 1, 8, 3, 1, TU_BHLD, 0, 0);
        tu_fill_randn(&f->ps.o[p], &r, 1.0, 0.0);
        tu_fill_randn(&f->ps.lse[p], &r, 1.0, 0.0);
    }
    f->out = tu_alloc(SDPA_F32, 1, 8, 3, 4, TU_BHLD, 0, 0);
    f->lse = tu_alloc(SDPA_F32, 1, 8, 3, 1, TU_BHLD, 0, 0);
    bad_reset(f);
}

static void bad_free(bad_fx *f) {
    sdpa_ctx_destroy(f->ctx);
    tu_free(&f->out);
    tu_free(&f->lse);
    parts_free(&f->ps);
}

/* sdpa_merge on the fixture's views (out and lse NULL when asked) must fail with `want`, a
 * message containing `message`, and the outputs' buffers untouched. */
static void expect_refused(const char *what, sdpa_ctx *ctx, bad_fx *f, int64_t n,
                           const sdpa_tensor *outs, const sdpa_tensor *lses, int out_null,
                           int lse_null, sdpa_status want, const char *message) {
    tu_fill_canary(&f->out);
    tu_fill_canary(&f->lse);
    const sdpa_status st =
        sdpa_merge(ctx, n, outs, lses, out_null ? NULL : &f->out_t, lse_null ? NULL : &f->lse_t);
    CHECK_MSG(st == want, "%s: %s, want %s (%s)", what, sdpa_status_name(st),
              sdpa_status_name(want), sdpa_ctx_last_error(ctx));
    CHECK_MSG(strstr(sdpa_ctx_last_error(ctx), message) != NULL, "%s: \"%s\" lacks \"%s\"", what,
              sdpa_ctx_last_error(ctx), message);
    CHECK_MSG(tu_is_canary(&f->out) && tu_is_canary(&f->lse), "%s: an output was written", what);
    bad_reset(f);
}

#define REFUSED(what, want, message) expect_refused(what, ctx, &f, 3, f.o, f.l, 0, 0, want, message)

static void test_bad_presence_and_dtypes(void) {
    bad_fx f;
    bad_new(&f, tu_ctx(2, SDPA_ISA_AUTO));
    sdpa_ctx *ctx = f.ctx;
    CHECK(sdpa_merge(ctx, 3, f.o, f.l, &f.out_t, &f.lse_t) == SDPA_OK);
    CHECK(sdpa_merge(NULL, 3, f.o, f.l, &f.out_t, &f.lse_t) == SDPA_ERR_NULL);
    expect_refused("n_parts 0", ctx, &f, 0, f.o, f.l, 0, 0, SDPA_ERR_PARAM,
                   "n_parts=0 must be >= 1");
    expect_refused("n_parts -2", ctx, &f, -2, NULL, NULL, 0, 0, SDPA_ERR_PARAM,
                   "n_parts=-2 must be >= 1");
    expect_refused("n_parts huge", ctx, &f, INT64_MAX, f.o, f.l, 0, 0, SDPA_ERR_OVERFLOW,
                   "n_parts=9223372036854775807: an array of that many tensors overflows size_t");
    expect_refused("outs NULL", ctx, &f, 3, NULL, f.l, 0, 0, SDPA_ERR_NULL, "outs is NULL");
    expect_refused("lses NULL", ctx, &f, 3, f.o, NULL, 0, 0, SDPA_ERR_NULL, "lses is NULL");
    expect_refused("out NULL", ctx, &f, 3, f.o, f.l, 1, 0, SDPA_ERR_NULL, "out is NULL");
    f.o[1].data = NULL;
    REFUSED("outs[1].data NULL", SDPA_ERR_NULL, "outs[1].data is NULL");
    f.l[2].data = NULL;
    REFUSED("lses[2].data NULL", SDPA_ERR_NULL, "lses[2].data is NULL");
    f.out_t.data = NULL;
    REFUSED("out.data NULL", SDPA_ERR_NULL, "out.data is NULL");
    f.lse_t.data = NULL;
    REFUSED("lse.data NULL", SDPA_ERR_NULL, "lse.data is NULL");
    f.o[2].dtype = SDPA_BOOL;
    REFUSED("outs[2] bool", SDPA_ERR_DTYPE, "outs[2].dtype=bool (3) is not f32, f16 or bf16");
    f.o[0].dtype = (sdpa_dtype)77;
    REFUSED("outs[0] 77", SDPA_ERR_DTYPE, "outs[0].dtype=unknown (77)");
    f.l[1].dtype = SDPA_F16;
    REFUSED("lses[1] f16", SDPA_ERR_DTYPE, "lses[1].dtype=f16 (1) must be f32");
    f.out_t.dtype = SDPA_BOOL;
    REFUSED("out bool", SDPA_ERR_DTYPE, "out.dtype=bool (3) is not f32, f16 or bf16");
    f.lse_t.dtype = SDPA_BF16;
    REFUSED("lse bf16", SDPA_ERR_DTYPE, "lse.dtype=bf16 (2) must be f32");
    /* presence comes before dtype, whatever the order of the arguments */
    f.o[2].dtype = SDPA_BOOL;
    f.lse_t.data = NULL;
    REFUSED("presence first", SDPA_ERR_NULL, "lse.data is NULL");
    /* an absent lse is fine */
    CHECK(sdpa_merge(ctx, 3, f.o, f.l, &f.out_t, NULL) == SDPA_OK);
    bad_free(&f);
}

static void test_bad_shapes(void) {
    bad_fx f;
    bad_new(&f, tu_ctx(2, SDPA_ISA_AUTO));
    sdpa_ctx *ctx = f.ctx;
    f.o[2].shape[1] = 4;
    REFUSED("outs[2] heads", SDPA_ERR_SHAPE, "outs[2].shape[1]=4 but out.shape[1]=8");
    f.o[0].shape[3] = 5;
    REFUSED("outs[0] D", SDPA_ERR_SHAPE, "outs[0].shape[3]=5 but out.shape[3]=4");
    f.o[1].shape[0] = 2;
    REFUSED("outs[1] B", SDPA_ERR_SHAPE, "outs[1].shape[0]=2 but out.shape[0]=1");
    f.l[1].shape[2] = 2;
    REFUSED("lses[1] L", SDPA_ERR_SHAPE, "lses[1].shape[2]=2 but out.shape[2]=3");
    f.l[0].shape[3] = 4;
    REFUSED("lses[0] D", SDPA_ERR_SHAPE, "lses[0].shape[3]=4 must be 1");
    f.lse_t.shape[1] = 1;
    REFUSED("lse H", SDPA_ERR_SHAPE, "lse.shape[1]=1 but out.shape[1]=8");
    f.lse_t.shape[3] = 2;
    REFUSED("lse D", SDPA_ERR_SHAPE, "lse.shape[3]=2 must be 1");
    f.o[1].shape[2] = 0;
    REFUSED("outs[1] L = 0", SDPA_ERR_DIM, "outs[1].shape[2]=0 must be >= 1");
    f.l[2].shape[0] = -1;
    REFUSED("lses[2] B < 0", SDPA_ERR_DIM, "lses[2].shape[0]=-1 must be >= 1");
    f.out_t.shape[3] = 70000;
    REFUSED("out D", SDPA_ERR_DIM, "out.shape[3]=70000 exceeds SDPA_MAX_HEAD_DIM=65536");
    f.o[0].shape[2] = SDPA_MAX_EXTENT + 1;
    REFUSED("outs[0] L", SDPA_ERR_DIM, "outs[0].shape[2]=2147483648 exceeds SDPA_MAX_EXTENT");
    /* extents come before shapes: a bad extent in lse is named before a mismatch in outs[0] */
    f.o[0].shape[1] = 4;
    f.lse_t.shape[2] = 0;
    REFUSED("extents first", SDPA_ERR_DIM, "lse.shape[2]=0 must be >= 1");
    bad_free(&f);
}

static void test_bad_memory(void) {
    bad_fx f;
    bad_new(&f, tu_ctx(2, SDPA_ISA_AUTO));
    sdpa_ctx *ctx = f.ctx;
    const int64_t p62 = (int64_t)1 << 62;
    f.o[1].stride[1] = p62;
    REFUSED("outs[1] span", SDPA_ERR_OVERFLOW,
            "outs[1]: the span of dimensions 0..1 overflows int64 (extent 8 x stride "
            "4611686018427387904)");
    f.l[2].stride[2] = -p62 - 1;
    REFUSED("lses[2] span", SDPA_ERR_OVERFLOW,
            "lses[2]: the span of dimensions 0..2 overflows int64 (extent 3 x stride "
            "-4611686018427387905)");
    f.out_t.stride[0] = p62; /* unused: B = 1 */
    f.out_t.stride[2] = INT64_MAX / 4;
    REFUSED("out span", SDPA_ERR_OVERFLOW, "out: the address span of shape (1, 8, 3, 4)");
    f.o[2].data = (char *)f.o[2].data + 2;
    REFUSED("outs[2] misaligned", SDPA_ERR_PARAM, "is not aligned to its 4-byte f32 elements");
    f.lse_t.data = (char *)f.lse_t.data + 1;
    REFUSED("lse misaligned", SDPA_ERR_PARAM, "lse.data=");
    /* aliasing: an output over an input, over the other output, over itself */
    f.out_t.data = f.ps.o[1].t.data;
    REFUSED("out = outs[1]", SDPA_ERR_ALIAS, "overlaps outs[1]");
    f.out_t.data = (float *)f.ps.lse[0].t.data + 20; /* lses[0] holds 24 floats */
    REFUSED("out over lses[0]", SDPA_ERR_ALIAS, "out (bytes");
    f.lse_t.data = f.ps.lse[2].t.data;
    REFUSED("lse = lses[2]", SDPA_ERR_ALIAS, "overlaps lses[2]");
    f.lse_t.data = (float *)f.out.t.data + 8; /* 24 of out's 32 floats */
    REFUSED("lse over out", SDPA_ERR_ALIAS, "overlaps out (bytes");
    f.out_t.stride[1] = 0;
    REFUSED("out self-overlap", SDPA_ERR_ALIAS, "out.stride[1]=0 with out.shape[1]=8");
    f.lse_t.stride[2] = 0;
    REFUSED("lse self-overlap", SDPA_ERR_ALIAS, "lse.stride[2]=0 with lse.shape[2]=3");
    /* inputs may overlap each other: every part the same view */
    const sdpa_tensor same_o[3] = {f.o[0], f.o[0], f.o[0]}, same_l[3] = {f.l[0], f.l[0], f.l[0]};
    CHECK(sdpa_merge(ctx, 3, same_o, same_l, &f.out_t, &f.lse_t) == SDPA_OK);
    /* with identical parts the merge is the part again and the LSE its lse + log 3 */
    CHECK_NEAR(tu_get(&f.out_t, 0, 5, 2, 3), tu_get(&f.o[0], 0, 5, 2, 3), 1e-6);
    CHECK_NEAR(tu_get(&f.lse_t, 0, 5, 2, 0), tu_get(&f.l[0], 0, 5, 2, 0) + log(3.0), 1e-5);
    bad_free(&f);
}

/* No memory for the scratch: SDPA_ERR_NOMEM, outputs untouched, nothing leaked. */
static void test_nomem(void) {
    tu_failing_alloc fa = {0};
    sdpa_ctx_params cp = {0};
    cp.n_threads = 2;
    cp.allocator = tu_failing_allocator(&fa);
    sdpa_ctx *ctx = NULL;
    CHECK_INT_EQ(sdpa_ctx_create(&cp, &ctx), SDPA_OK);
    bad_fx f;
    bad_new(&f, ctx);
    const long before = fa.outstanding;
    fa.fail = 1;
    REFUSED("no memory", SDPA_ERR_NOMEM, "merge: no memory");
    fa.fail = 0;
    CHECK(sdpa_merge(ctx, 3, f.o, f.l, &f.out_t, &f.lse_t) == SDPA_OK);
    CHECK_INT_EQ(fa.outstanding, before);
    bad_free(&f);
}

CHECK_MAIN(CASE(test_split_keys), CASE(test_one_part_is_identity), CASE(test_row_rules),
           CASE(test_one_rounding), CASE(test_output_views), CASE(test_deterministic),
           CASE(test_bad_presence_and_dtypes), CASE(test_bad_shapes), CASE(test_bad_memory),
           CASE(test_nomem))
