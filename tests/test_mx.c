/*
 * test_mx.c — the tiled forward through a matrix unit's entries (AMX-BF16: ukernels.h,
 * sdpa__mx_kernels), which take problems whose Q, K and V are all bf16. Every implementation
 * that has such entries and runs on this CPU (the AMX table, or its emulation in a
 * -DSDPA_AMX_EMULATE build) is held to testing.md's bf16 rule over shapes around its tile
 * sizes, every mask feature, GQA and a paged cache; shown to take the unit's path at all (its
 * results differ from the vector table's, which rounds no weight to bf16); to read as they are
 * the values the unit reads as 0 (bf16 subnormals in Q, K and V, weights below 2^-126);
 * to keep hidden keys' NaN, Inf and subnormals from changing any bit of a row; to write rows
 * past a sequence's queries as 0; and to give the same bits for any thread count. Where no
 * implementation with such entries runs, the cases say so and pass nothing.
 */
#include "check.h"
#include "testutil.h"

#include "../src/dispatch/impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The implementations with a matrix unit that run here; 0 (and a line said) if none. */
static int mx_impls(tu_impl out[TU_MAX_IMPLS], const char *what) {
    tu_impl all[TU_MAX_IMPLS];
    const int n = tu_impls(all);
    int m = 0;
    for (int t = 0; t < n; t++) {
        if (all[t].impl->mx == NULL)
            continue;
        if (!all[t].runs) {
            printf("    %s [%s] skipped: the CPU lacks %s\n", what, all[t].name, all[t].missing);
            continue;
        }
        out[m++] = all[t];
    }
    if (m == 0)
        printf("    %s: no implementation with a matrix unit runs here\n", what);
    return m;
}

/* The vector implementation a matrix one falls back to: the best one without mx. */
static sdpa_isa vector_level(void) {
    tu_impl all[TU_MAX_IMPLS];
    const int n = tu_impls(all);
    sdpa_isa best = SDPA_ISA_GENERIC;
    for (int t = 0; t < n; t++)
        if (all[t].impl->mx == NULL && all[t].runs && all[t].level > best)
            best = all[t].level;
    return best;
}

typedef struct mx_case {
    int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
    double q_scale, k_scale;
    sdpa_dtype out_dt;
} mx_case;

typedef struct mx_problem {
    tu_tensor q, k, v, o, l;
    sdpa_params p;
    int64_t n_out, n_lse;
} mx_problem;

static mx_problem mx_new(const mx_case *c, uint64_t seed) {
    tu_rng r = {seed};
    mx_problem m;
    memset(&m, 0, sizeof m);
    m.q = tu_alloc(SDPA_BF16, c->B, c->Hq, c->Lq, c->Dk, TU_BHLD, 0, 0);
    m.k = tu_alloc(SDPA_BF16, c->B, c->Hkv, c->Lk, c->Dk, TU_BHLD, 0, 0);
    m.v = tu_alloc(SDPA_BF16, c->B, c->Hkv, c->Lk, c->Dv, TU_BHLD, 0, 0);
    m.o = tu_alloc(c->out_dt, c->B, c->Hq, c->Lq, c->Dv, TU_BHLD, 0, 0);
    m.l = tu_alloc(SDPA_F32, c->B, c->Hq, c->Lq, 1, TU_BHLD, 0, 0);
    tu_fill_randn(&m.q, &r, c->q_scale, 0.0);
    tu_fill_randn(&m.k, &r, c->k_scale, 0.0);
    tu_fill_randn(&m.v, &r, 1.0, 0.0);
    m.n_out = c->B * c->Hq * c->Lq * c->Dv;
    m.n_lse = c->B * c->Hq * c->Lq;
    return m;
}

static void mx_free(mx_problem *m) {
    tu_free(&m->q);
    tu_free(&m->k);
    tu_free(&m->v);
    tu_free(&m->o);
    tu_free(&m->l);
}

/* sdpa_forward at `level` on n threads into m's o and l: copies of them, as doubles. */
static int run(mx_problem *m, sdpa_isa level, int threads, double **out, double **lse) {
    sdpa_ctx *ctx = tu_ctx(threads, level);
    tu_fill_canary(&m->o);
    const sdpa_status st = sdpa_forward(ctx, &m->q.t, &m->k.t, &m->v.t, &m->p, &m->o.t, &m->l.t);
    if (st != SDPA_OK)
        printf("    status %s: %s\n", sdpa_status_name(st), sdpa_ctx_last_error(ctx));
    sdpa_ctx_destroy(ctx);
    *out = tu_to_doubles(&m->o.t);
    *lse = tu_to_doubles(&m->l.t);
    return st == SDPA_OK;
}

/* m at `level` against the golden by the bf16 rule (the naive bf16 computation as the
 * baseline); with `differs`, its output must also differ somewhere from the vector table's
 * which rounds no weight to bf16. @return 1 if it passes. */
static int check_rule(const char *name, mx_problem *m, sdpa_isa level, int differs) {
    double *want = malloc((size_t)m->n_out * sizeof *want);
    double *lp = malloc((size_t)m->n_out * sizeof *lp);
    double *want_lse = malloc((size_t)m->n_lse * sizeof *want_lse);
    double *lp_lse = malloc((size_t)m->n_lse * sizeof *lp_lse);
    tu_naive_forward(&m->q.t, &m->k.t, &m->v.t, &m->p, -1, want, want_lse);
    tu_naive_forward(&m->q.t, &m->k.t, &m->v.t, &m->p, SDPA_BF16, lp, lp_lse);
    double *got, *got_lse;
    int ok = run(m, level, 2, &got, &got_lse);
    char what[128];
    snprintf(what, sizeof what, "%s out", name);
    /* k = 2 for either output: the baseline is bf16's (testing.md), whatever out's dtype */
    ok &= tu_rule(what, got, lp, want, (size_t)m->n_out, m->o.t.dtype, 2.0, 5e-5);
    snprintf(what, sizeof what, "%s lse", name);
    ok &= tu_rule(what, got_lse, lp_lse, want_lse, (size_t)m->n_lse, SDPA_F32, 3.0, 0.0);
    if (differs) {
        double *vec, *vec_lse;
        ok &= run(m, vector_level(), 2, &vec, &vec_lse);
        int same = 1;
        for (int64_t e = 0; e < m->n_out && same; e++)
            same = memcmp(&vec[e], &got[e], sizeof got[e]) == 0;
        CHECK_MSG(!same,
                  "%s: the matrix unit's output is bitwise the vector table's: its path "
                  "did not run",
                  name);
        free(vec);
        free(vec_lse);
    }
    free(got);
    free(got_lse);
    free(want);
    free(lp);
    free(want_lse);
    free(lp_lse);
    return ok;
}

/* Shapes around the unit's tiles (16 rows, 16 keys, 32 features of K, 16 of V; 2 x 2 blocks)
 * and the driver's (64 or 128 keys a tile, 256 rows a task), unmasked and causal: 2 query heads
 * to a kv head, but one at L 256 and 320/384, where the causal diagonal's tiles cut at most 64
 * rows, so that the driver takes each in one slice, as a half tile at Dv <= 64; and decode-sized
 * rows over 2100 and 2600 keys, which split-KV cuts into chunks merged afterwards. */
static void test_mx_shapes(void) {
    tu_impl impls[TU_MAX_IMPLS];
    const int n = mx_impls(impls, "shapes");
    /* (the last two: one task, whose keys split-KV cuts into chunks of 512 and more) */
    static const int64_t lens[][2] = {{1, 1},     {16, 16},   {15, 17},  {17, 33},   {33, 65},
                                      {64, 64},   {3, 130},   {130, 3},  {129, 200}, {200, 129},
                                      {256, 256}, {320, 384}, {1, 2100}, {5, 2600}};
    static const int64_t dims[][2] = {{32, 16}, {64, 64}, {128, 128}, {96, 48}, {64, 144}};
    for (int t = 0; t < n; t++)
        for (size_t a = 0; a < sizeof lens / sizeof lens[0]; a++)
            for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++) {
                if (d > 1 && a % 3 != 0 && lens[a][0] > 16) /* keep the sweep short */
                    continue;
                const int64_t hq = lens[a][0] >= 256 ? 1 : 2;
                const mx_case c = {
                    1,          hq,         1,   lens[a][0], lens[a][1],
                    dims[d][0], dims[d][1], 1.0, 1.0,        a % 2 ? SDPA_BF16 : SDPA_F32};
                for (int causal = 0; causal < 2; causal++) {
                    mx_problem m = mx_new(&c, 100 + a * 10 + d);
                    m.p.causal = causal;
                    m.p.align = SDPA_ALIGN_BOTTOM_RIGHT;
                    char name[96];
                    snprintf(name, sizeof name, "[%s] L %lld/%lld D %lld/%lld%s", impls[t].name,
                             (long long)c.Lq, (long long)c.Lk, (long long)c.Dk, (long long)c.Dv,
                             causal ? " causal" : "");
                    /* (in bf16 the output's rounding hides the weights' on shapes this small) */
                    const int differs = c.Lk > 1 && c.out_dt == SDPA_F32;
                    CHECK_MSG(check_rule(name, &m, impls[t].level, differs), "%s", name);
                    mx_free(&m);
                }
            }
}

/* Every feature that acts on the scores or the weights, with GQA groups, batches and peaky
 * softmaxes, and scales other than 1/sqrt(D) (negative, above 1); bf16 values as large as 133120 in
 * K (scores live in f32: no Inf, no NaN), and V near bf16's largest, 3e38 on 30 keys, whose
 * unnormalised sum passes FLT_MAX (such rows are computed again by the reference: finite outputs,
 * the same as the vector table's). */
static void test_mx_features(void) {
    tu_impl impls[TU_MAX_IMPLS];
    const int n = mx_impls(impls, "features");
    for (int t = 0; t < n; t++)
        for (int f = 0; f < 11; f++) {
            const mx_case c = {
                2,       6, f % 2 ? 2 : 3, 70, 150, 64, 32, f == 5 ? 5.0 : 1.0, f == 5 ? 3.0 : 1.0,
                SDPA_F32};
            mx_problem m = mx_new(&c, 200 + f);
            tu_tensor mask = {0};
            float slopes[6];
            static const char *const what[] = {"causal top-left",
                                               "window 20/5",
                                               "softcap 20",
                                               "ALiBi",
                                               "bool mask",
                                               "peaky",
                                               "large values",
                                               "additive mask",
                                               "V near bf16's largest",
                                               "scale -0.3, causal",
                                               "scale 2.5"};
            switch (f) {
            case 0:
                m.p.causal = 1;
                m.p.align = SDPA_ALIGN_TOP_LEFT;
                break;
            case 1:
                m.p.window_left = 20;
                m.p.window_right = 5;
                break;
            case 2:
                m.p.softcap = 20.0f;
                break;
            case 3:
                for (int h = 0; h < 6; h++)
                    slopes[h] = (float)pow(2.0, -(h + 1.0));
                m.p.alibi_slopes = slopes;
                break;
            case 4:
            case 7: {
                mask = tu_alloc(f == 4 ? SDPA_BOOL : SDPA_BF16, 1, 6, c.Lq, c.Lk, TU_BHLD, 0, 0);
                tu_rng r = {300 + (uint64_t)f};
                for (int64_t h = 0; h < 6; h++)
                    for (int64_t i = 0; i < c.Lq; i++)
                        for (int64_t j = 0; j < c.Lk; j++) {
                            const int hole = tu_uniform(&r) < 0.3;
                            tu_set(&mask.t, 0, h, i, j,
                                   f == 4 ? !hole
                                   : hole ? -INFINITY
                                          : tu_randn(&r));
                        }
                mask.t.stride[0] = 0;
                mask.t.shape[0] = 1;
                m.p.mask = &mask.t;
                break;
            }
            case 6:
                for (int64_t e = 0; e < c.Lk; e += 7)
                    tu_set(&m.k.t, 0, 0, e, 3, 133120.0);
                break;
            case 8:
                for (int64_t e = 0; e < c.Lk; e += 5)
                    tu_set(&m.v.t, 0, 0, e, 2, 3.0e38);
                break;
            case 9: /* the softmax scales the unit's sums where a slice is whole (flash.c's
                     * raw): a negative scale turns their max into the min */
                m.p.scale = -0.3f;
                m.p.causal = 1;
                break;
            case 10:
                m.p.scale = 2.5f;
                break;
            default:
                break;
            }
            char name[96];
            snprintf(name, sizeof name, "[%s] %s", impls[t].name, what[f]);
            CHECK_MSG(check_rule(name, &m, impls[t].level, f != 8), "%s", name);
            if (mask.buf != NULL)
                tu_free(&mask);
            mx_free(&m);
        }
}

/* Column c of out (B = 1) within 1 % of the golden's largest magnitude in that column: the
 * rule's floor is set by the whole output, so a column of subnormal values needs its own. */
static int column_close(const mx_problem *m, const double *got, int64_t c) {
    double *want = malloc((size_t)m->n_out * sizeof *want);
    double *want_lse = malloc((size_t)m->n_lse * sizeof *want_lse);
    tu_naive_forward(&m->q.t, &m->k.t, &m->v.t, &m->p, -1, want, want_lse);
    const int64_t dv = m->v.t.shape[3];
    double big = 0.0, err = 0.0;
    for (int64_t r = 0; r < m->n_lse; r++) {
        big = fmax(big, fabs(want[r * dv + c]));
        err = fmax(err, fabs(got[r * dv + c] - want[r * dv + c]));
    }
    free(want);
    free(want_lse);
    return big > 0.0 && err <= 0.01 * big;
}

/* Values the unit reads as 0 (bf16 subnormals) are read as they are, where they decide the
 * result: a Q whose scores come only from subnormal features (times K near bf16's largest), a
 * key whose score comes mostly from one, a column of V made of them; and a NaN in V that the
 * causal rule hides from some rows reaches only the others. */
static void test_mx_special_values(void) {
    tu_impl impls[TU_MAX_IMPLS];
    const int n = mx_impls(impls, "special values");
    const mx_case c = {1, 2, 1, 80, 140, 64, 48, 1.0, 1.0, SDPA_F32};
    for (int t = 0; t < n; t++) {
        for (int s = 0; s < 5; s++) {
            mx_problem m = mx_new(&c, 400 + s);
            tu_rng r = {410 + (uint64_t)s};
            static const char *const what[] = {"subnormal Q", "subnormal K", "subnormal V",
                                               "NaN in V hidden by causal",
                                               "a weight below 2^-126 times V near 3e38"};
            switch (s) {
            case 0: /* head 0's scores: q (subnormal, feature 5 only) times k (~1e38); head
                     * 1 has no feature 5 */
                for (int64_t i = 0; i < c.Lq; i++)
                    for (int64_t d = 0; d < c.Dk; d++)
                        tu_set(&m.q.t, 0, 0, i, d, d == 5 ? (1.0 + (double)(i % 9)) * -1e-39 : 0.0);
                for (int64_t i = 0; i < c.Lq; i++)
                    tu_set(&m.q.t, 0, 1, i, 5, 0.0);
                for (int64_t j = 0; j < c.Lk; j++)
                    tu_set(&m.k.t, 0, 0, j, 5, (2.0 * tu_uniform(&r) - 1.0) * 3e38);
                break;
            case 1: /* every fifth key's score mostly from its subnormal feature 9 */
                for (int64_t i = 0; i < c.Lq; i++)
                    for (int64_t h = 0; h < c.Hq; h++)
                        tu_set(&m.q.t, 0, h, i, 9, (1.0 + tu_uniform(&r)) * 1e38);
                for (int64_t j = 0; j < c.Lk; j++)
                    tu_set(&m.k.t, 0, 0, j, 9, j % 5 ? 0.0 : tu_randn(&r) * 1e-38);
                break;
            case 2: /* V's column 1 all subnormal */
                for (int64_t j = 0; j < c.Lk; j++)
                    tu_set(&m.v.t, 0, 0, j, 1, tu_randn(&r) * 3e-39);
                break;
            case 3:
                m.p.causal = 1;
                m.p.align = SDPA_ALIGN_BOTTOM_RIGHT; /* row i sees keys up to 60 + i */
                tu_set(&m.v.t, 0, 0, 100, 7, NAN);
                break;
            default: /* scale 1, q = e0: key 0 scores 0, key 1 -88 (weight 2^-127) with V =
                      * 3e38, a term of 1.8 in outputs of 2.8; the other keys hidden (the
                      * softmax's weights come scaled by 2^25, so this one reaches the unit
                      * as a normal bf16, rounded as every weight is) */
                m.p.scale = 1.0f;
                m.p.mask = NULL;
                for (int64_t h = 0; h < c.Hq; h++)
                    for (int64_t i = 0; i < c.Lq; i++)
                        for (int64_t d = 0; d < c.Dk; d++)
                            tu_set(&m.q.t, 0, h, i, d, d == 0);
                for (int64_t j = 0; j < c.Lk; j++)
                    for (int64_t d = 0; d < c.Dk; d++)
                        tu_set(&m.k.t, 0, 0, j, d,
                               d > 0    ? 0.0
                               : j == 0 ? 0.0
                               : j == 1 ? -88.0
                                        : -1e4);
                for (int64_t j = 0; j < 2; j++)
                    for (int64_t d = 0; d < c.Dv; d++)
                        tu_set(&m.v.t, 0, 0, j, d, j == 0 ? 1.0 : 3e38);
                break;
            }
            char name[96];
            snprintf(name, sizeof name, "[%s] %s", impls[t].name, what[s]);
            CHECK_MSG(check_rule(name, &m, impls[t].level, s != 4), "%s", name);
            double *a, *al;
            CHECK(run(&m, impls[t].level, 2, &a, &al));
            if (s == 2)
                CHECK_MSG(column_close(&m, a, 1), "%s: the subnormal column is not read as it is",
                          name);
            if (s == 3) {
                int nan_seen = 0, nan_leaked = 0;
                for (int64_t h = 0; h < 2; h++)
                    for (int64_t i = 0; i < c.Lq; i++) {
                        const int sees = 60 + i >= 100;
                        const double x = a[(h * c.Lq + i) * c.Dv + 7];
                        nan_seen += sees && isnan(x);
                        nan_leaked += !sees && isnan(x);
                    }
                CHECK_MSG(nan_seen == 2 * 40 && nan_leaked == 0,
                          "%s: NaN in %d rows that see it (of 80), %d that do not", name, nan_seen,
                          nan_leaked);
            }
            free(a), free(al);
            mx_free(&m);
        }
    }
}

/* sdpa.h's rule for hidden keys: a row is bitwise what it is when the keys hidden from it
 * hold any finite numbers. Causal (row i sees keys up to i, 16 rows of a tile block), the
 * last key's V row and K row set to NaN, Inf, a subnormal, against 1.0: rows 0 .. L-2 the
 * same bits. */
static void test_mx_hidden_keys(void) {
    tu_impl impls[TU_MAX_IMPLS];
    const int n = mx_impls(impls, "hidden keys");
    enum { L = 64 };
    const mx_case c = {1, 1, 1, L, L, 32, 32, 1.0, 1.0, SDPA_F32};
    static const double odd[] = {NAN, INFINITY, -INFINITY, 3e-39};
    for (int t = 0; t < n; t++)
        for (int which = 0; which < 2; which++) /* V's row, K's row */
            for (size_t v = 0; v < sizeof odd / sizeof odd[0]; v++) {
                mx_problem m = mx_new(&c, 600);
                m.p.causal = 1;
                tu_tensor *x = which == 0 ? &m.v : &m.k;
                for (int64_t d = 0; d < 32; d++)
                    tu_set(&x->t, 0, 0, L - 1, d, 1.0);
                double *ref, *ref_l;
                CHECK(run(&m, impls[t].level, 1, &ref, &ref_l));
                for (int64_t d = 0; d < 32; d += 3)
                    tu_set(&x->t, 0, 0, L - 1, d, odd[v]);
                double *got, *got_l;
                CHECK(run(&m, impls[t].level, 1, &got, &got_l));
                CHECK_MSG(memcmp(ref, got, (size_t)((L - 1) * 32) * sizeof *got) == 0 &&
                              memcmp(ref_l, got_l, (size_t)(L - 1) * sizeof *got_l) == 0,
                          "[%s] %s of the last key = %g changed rows that do not see it",
                          impls[t].name, which == 0 ? "V" : "K", odd[v]);
                free(ref), free(ref_l), free(got), free(got_l);
                mx_free(&m);
            }
}

/* A ragged batch: rows past a sequence's queries are exactly 0 (LSE -inf), though the unit
 * writes whole blocks of 16 rows, when the rows it computes see a NaN in V or score -inf
 * against an Inf in K. */
static void test_mx_ragged_rows(void) {
    tu_impl impls[TU_MAX_IMPLS];
    const int n = mx_impls(impls, "ragged rows");
    const mx_case c = {1, 1, 1, 8, 64, 32, 32, 1.0, 1.0, SDPA_F32};
    for (int t = 0; t < n; t++)
        for (int kind = 0; kind < 2; kind++) {
            mx_problem m = mx_new(&c, 700 + kind);
            if (kind == 0)
                tu_set(&m.v.t, 0, 0, 3, 3, NAN);
            else
                tu_set(&m.k.t, 0, 0, 0, 0, INFINITY);
            int32_t lq = 5, lk = 64;
            sdpa_kv_cache kv;
            memset(&kv, 0, sizeof kv);
            kv.k = &m.k.t;
            kv.v = &m.v.t;
            kv.seqlens_k = &lk;
            kv.seqlens_q = &lq;
            sdpa_ctx *ctx = tu_ctx(1, impls[t].level);
            CHECK(sdpa_forward_kv(ctx, &m.q.t, &kv, &m.p, &m.o.t, &m.l.t) == SDPA_OK);
            sdpa_ctx_destroy(ctx);
            int bad = 0;
            for (int64_t i = lq; i < c.Lq; i++) {
                bad += tu_get(&m.l.t, 0, 0, i, 0) != -INFINITY;
                for (int64_t d = 0; d < c.Dv; d++)
                    bad += tu_get(&m.o.t, 0, 0, i, d) != 0.0;
            }
            CHECK_MSG(bad == 0, "[%s] %s: %d values of the rows past seqlens_q are not 0 / -inf",
                      impls[t].name, kind == 0 ? "NaN in V" : "Inf in K", bad);
            mx_free(&m);
        }
}

/* Bitwise the same outputs on 1, 2, 3 and 7 threads (a problem of several tasks and chunks),
 * and a paged cache of bf16 pages by the rule. */
static void test_mx_threads_and_pages(void) {
    tu_impl impls[TU_MAX_IMPLS];
    const int n = mx_impls(impls, "threads and pages");
    const mx_case c = {2, 4, 2, 300, 333, 64, 64, 1.0, 1.0, SDPA_BF16};
    for (int t = 0; t < n; t++) {
        mx_problem m = mx_new(&c, 500);
        m.p.causal = 1;
        double *first = NULL, *first_lse = NULL;
        for (int threads = 1; threads <= 7; threads += threads == 3 ? 4 : 1) {
            double *o, *l;
            CHECK(run(&m, impls[t].level, threads, &o, &l));
            if (first == NULL) {
                first = o;
                first_lse = l;
                continue;
            }
            CHECK_MSG(memcmp(first, o, (size_t)m.n_out * sizeof *o) == 0 &&
                          memcmp(first_lse, l, (size_t)m.n_lse * sizeof *l) == 0,
                      "[%s] %d threads differ from 1", impls[t].name, threads);
            free(o);
            free(l);
        }
        free(first);
        free(first_lse);

        /* the same keys in a shuffled pool of pages of 16, one decode-sized and one
         * prefill-sized query block per sequence, by the rule against the contiguous problem */
        enum { PAGE = 16 };
        const int64_t pages = (c.Lk + PAGE - 1) / PAGE;
        tu_tensor kp = tu_alloc(SDPA_BF16, c.B * pages, c.Hkv, PAGE, c.Dk, TU_BHLD, 0, 0);
        tu_tensor vp = tu_alloc(SDPA_BF16, c.B * pages, c.Hkv, PAGE, c.Dv, TU_BHLD, 0, 0);
        int32_t *table = malloc((size_t)(c.B * pages) * sizeof *table);
        for (int64_t e = 0; e < c.B * pages; e++)
            table[e] = (int32_t)((e * 5 + 3) % (c.B * pages)); /* 5 is prime to 42 */
        for (int64_t b = 0; b < c.B; b++)
            for (int64_t g = 0; g < pages; g++)
                for (int64_t h = 0; h < c.Hkv; h++)
                    for (int64_t j = 0; j < PAGE && g * PAGE + j < c.Lk; j++) {
                        const int64_t pg = table[b * pages + g];
                        for (int64_t d = 0; d < c.Dk; d++)
                            tu_set(&kp.t, pg, h, j, d, tu_get(&m.k.t, b, h, g * PAGE + j, d));
                        for (int64_t d = 0; d < c.Dv; d++)
                            tu_set(&vp.t, pg, h, j, d, tu_get(&m.v.t, b, h, g * PAGE + j, d));
                    }
        int32_t lens[2] = {(int32_t)c.Lk, (int32_t)c.Lk};
        sdpa_kv_cache kv;
        memset(&kv, 0, sizeof kv);
        kv.k = &kp.t;
        kv.v = &vp.t;
        kv.seqlens_k = lens;
        kv.block_table = table;
        kv.max_pages = pages;
        double *want = malloc((size_t)m.n_out * sizeof *want);
        double *lp = malloc((size_t)m.n_out * sizeof *lp);
        double *want_lse = malloc((size_t)m.n_lse * sizeof *want_lse);
        double *lp_lse = malloc((size_t)m.n_lse * sizeof *lp_lse);
        tu_naive_forward(&m.q.t, &m.k.t, &m.v.t, &m.p, -1, want, want_lse);
        tu_naive_forward(&m.q.t, &m.k.t, &m.v.t, &m.p, SDPA_BF16, lp, lp_lse);
        sdpa_ctx *ctx = tu_ctx(2, impls[t].level);
        const sdpa_status st = sdpa_forward_kv(ctx, &m.q.t, &kv, &m.p, &m.o.t, &m.l.t);
        CHECK_MSG(st == SDPA_OK, "[%s] paged: %s", impls[t].name, sdpa_ctx_last_error(ctx));
        sdpa_ctx_destroy(ctx);
        double *o = tu_to_doubles(&m.o.t), *l = tu_to_doubles(&m.l.t);
        char name[96];
        snprintf(name, sizeof name, "[%s] paged out", impls[t].name);
        CHECK(tu_rule(name, o, lp, want, (size_t)m.n_out, SDPA_BF16, 2.0, 5e-5));
        snprintf(name, sizeof name, "[%s] paged lse", impls[t].name);
        CHECK(tu_rule(name, l, lp_lse, want_lse, (size_t)m.n_lse, SDPA_F32, 3.0, 0.0));
        free(o), free(l), free(want), free(lp), free(want_lse), free(lp_lse), free(table);
        tu_free(&kp);
        tu_free(&vp);
        mx_free(&m);
    }
}

/* Q's rows are read in Q's own type (the unit packs them without widening): a Q whose
 * features are not adjacent (every other element of a larger buffer, in the (B, L, H, D)
 * order) is gathered first, and gives bitwise the outputs of the same values laid out
 * plainly, a subnormal feature included (the rows' flags, amx_qk's exact scores). */
static void test_mx_q_views(void) {
    tu_impl impls[TU_MAX_IMPLS];
    const int n = mx_impls(impls, "Q views");
    const mx_case c = {2, 4, 2, 40, 96, 64, 32, 1.0, 1.0, SDPA_F32};
    for (int t = 0; t < n; t++) {
        mx_problem m = mx_new(&c, 900);
        tu_set(&m.q.t, 1, 3, 17, 5, 1e-39); /* a bf16 subnormal */
        /* the same Q, features 2 elements apart, heads inside positions */
        const int64_t hd = c.Hq * 2 * c.Dk;
        uint16_t *buf = calloc((size_t)(c.B * c.Lq * hd), sizeof *buf);
        sdpa_tensor qv = {buf, SDPA_BF16, {c.B, c.Hq, c.Lq, c.Dk}, {c.Lq * hd, 2 * c.Dk, hd, 2}};
        tu_copy(&qv, &m.q.t);
        double *plain, *plain_lse, *view, *view_lse;
        int ok = run(&m, impls[t].level, 2, &plain, &plain_lse);
        const sdpa_tensor q_plain = m.q.t;
        m.q.t = qv;
        ok &= run(&m, impls[t].level, 2, &view, &view_lse);
        m.q.t = q_plain;
        CHECK_MSG(ok, "[%s] Q views: a call failed", impls[t].name);
        CHECK_MSG(memcmp(plain, view, (size_t)m.n_out * sizeof *plain) == 0 &&
                      memcmp(plain_lse, view_lse, (size_t)m.n_lse * sizeof *plain_lse) == 0,
                  "[%s] a Q with features 2 apart differs from the same Q laid out plainly",
                  impls[t].name);
        free(plain);
        free(plain_lse);
        free(view);
        free(view_lse);
        free(buf);
        mx_free(&m);
    }
}

int main(int argc, char **argv) {
    tu_report_impls();
    return CHECK_RUN(argc, argv, CASE(test_mx_shapes), CASE(test_mx_features),
                     CASE(test_mx_special_values), CASE(test_mx_hidden_keys),
                     CASE(test_mx_ragged_rows), CASE(test_mx_threads_and_pages),
                     CASE(test_mx_q_views));
}
