/*
 * test_flash.c — the tiled forward path at every ISA level the CPU has: sizes around the tile
 * and vector widths, large shapes, the NaN and masked-row rules inside tiles, and bitwise
 * determinism for any thread count (the tables' entries alone: test_entries.c). Every
 * implementation the build registered is visited; those the CPU cannot run are reported as
 * skipped, never as passed.
 */
#include "check.h"
#include "testutil.h"

#include "../src/dispatch/impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Whether the cases run table t on problem pb: the CPU runs it, and it computes pb's forward
 * itself (tu_impl_takes: flash-amx takes bf16 alone, and hands these f32 problems to
 * flash-avx512, tested under its own name). */
static int runs_on(const tu_impl *t, const tu_problem *pb) {
    return t->runs && tu_impl_takes(t, &pb->q.t, &pb->k.t, &pb->v.t, &pb->p, &pb->o.t);
}

/* One problem against the golden at every level the CPU has, by the rule (each level writes
 * the problem's o and lse). */
static int check_all_isas(const char *name, tu_problem *pb) {
    const sdpa_tensor *q = &pb->q.t, *k = &pb->k.t, *v = &pb->v.t;
    const sdpa_params *p = &pb->p;
    const int64_t n_out = q->shape[0] * q->shape[1] * q->shape[2] * v->shape[3];
    const int64_t n_lse = q->shape[0] * q->shape[1] * q->shape[2];
    double *want = malloc((size_t)n_out * sizeof *want), *lp = malloc((size_t)n_out * sizeof *lp);
    double *want_lse = malloc((size_t)n_lse * sizeof *want_lse);
    double *lp_lse = malloc((size_t)n_lse * sizeof *lp_lse);
    tu_naive_forward(q, k, v, p, -1, want, want_lse);
    tu_naive_forward(q, k, v, p, SDPA_F32, lp, lp_lse);
    int ok = 1;
    tu_impl impls[TU_MAX_IMPLS];
    const int n_impls = tu_impls(impls);
    for (int t = 0; t < n_impls; t++) {
        const char *isa = impls[t].name;
        if (!impls[t].runs)
            printf("    %-40s [%s] skipped: the CPU lacks %s\n", name, isa, impls[t].missing);
        if (!runs_on(&impls[t], pb))
            continue;
        sdpa_ctx *ctx = tu_ctx(0, impls[t].level);
        if (tu_problem_forward(ctx, pb) != SDPA_OK) {
            printf("    %s: %s\n", name, sdpa_ctx_last_error(ctx));
            ok = 0;
        } else {
            CHECK_MSG(strcmp(sdpa_ctx_last_kernel(ctx), isa) == 0, "%s: ran %s, not %s", name,
                      sdpa_ctx_last_kernel(ctx), isa);
            double *got = tu_to_doubles(&pb->o.t), *got_lse = tu_to_doubles(&pb->lse.t);
            char what[96];
            snprintf(what, sizeof what, "%s [%s] out", name, isa);
            ok &= tu_rule(what, got, lp, want, (size_t)n_out, SDPA_F32, 3.0, 1e-10);
            snprintf(what, sizeof what, "%s [%s] lse", name, isa);
            ok &= tu_rule(what, got_lse, lp_lse, want_lse, (size_t)n_lse, SDPA_F32, 3.0, 0.0);
            free(got);
            free(got_lse);
        }
        sdpa_ctx_destroy(ctx);
    }
    free(want);
    free(lp);
    free(want_lse);
    free(lp_lse);
    return ok;
}

/* Lengths at, below and above the key tile (64) and the row block (64 rows / group), and
 * large shapes, with and without causal, for GQA groups 1 and 3. */
static void test_tile_boundaries(void) {
    static const int64_t lens[][2] = {{63, 63}, {64, 64}, {65, 65},     {129, 129},
                                      {1, 129}, {65, 1},  {127, 193},   {193, 127},
                                      {22, 64}, {21, 65}, {1023, 1024}, {1024, 1023}};
    tu_rng r = {99};
    for (size_t n = 0; n < sizeof lens / sizeof lens[0]; n++)
        for (int variant = 0; variant < 4; variant++) {
            const int64_t hkv = 1, hq = variant & 1 ? 3 : 1, d = lens[n][0] > 500 ? 64 : 40;
            tu_problem pb = tu_problem_new((tu_dims){1, hq, hkv, lens[n][0], lens[n][1], d, d}, &r);
            pb.p.causal = variant >= 2;
            pb.p.align = n % 2 ? SDPA_ALIGN_BOTTOM_RIGHT : SDPA_ALIGN_TOP_LEFT;
            char name[64];
            snprintf(name, sizeof name, "Lq=%lld Lk=%lld Hq=%lld causal=%d", (long long)lens[n][0],
                     (long long)lens[n][1], (long long)hq, pb.p.causal);
            CHECK_MSG(check_all_isas(name, &pb), "%s", name);
            tu_problem_free(&pb);
        }
}

/* A key the row sees with a weight that underflows f32 (its score far below the row's best:
 * a finite mask value of -120, -200 or -700) and an Inf in its V: the output column is +Inf
 * at every level, as in the reference, where the weight is positive in double, not
 * 0 x Inf = NaN (the AVX-512 table's weight is +0 there, and the driver has the row computed
 * again). Below about -745 the double weight is 0 too, and the key counts for nothing, as at
 * -1e9. */
static void test_underflowed_weight_inf(void) {
    static const float masks[] = {-120.0f, -200.0f, -700.0f};
    tu_rng r = {77};
    for (size_t m = 0; m < sizeof masks / sizeof masks[0]; m++) {
        tu_problem pb = tu_problem_new((tu_dims){1, 1, 1, 20, 40, 16, 16}, &r);
        tu_tensor mask = tu_alloc(SDPA_F32, 1, 1, 20, 40, TU_BHLD, 0, 0);
        for (int64_t i = 0; i < 20; i++)
            for (int64_t j = 0; j < 40; j++)
                tu_set(&mask.t, 0, 0, i, j, j == 5 ? masks[m] : 0.0);
        pb.p.mask = &mask.t;
        tu_set(&pb.v.t, 0, 0, 5, 0, INFINITY);
        tu_impl impls[TU_MAX_IMPLS];
        const int n_impls = tu_impls(impls);
        for (int t = 0; t < n_impls; t++) {
            if (!runs_on(&impls[t], &pb))
                continue;
            sdpa_ctx *ctx = tu_ctx(0, impls[t].level);
            CHECK_INT_EQ(tu_problem_forward(ctx, &pb), SDPA_OK);
            int inf = 0, finite = 0;
            for (int64_t i = 0; i < 20; i++) {
                inf += tu_get(&pb.o.t, 0, 0, i, 0) == INFINITY;
                for (int64_t c = 1; c < 16; c++)
                    finite += isfinite(tu_get(&pb.o.t, 0, 0, i, c)) != 0;
            }
            CHECK_MSG(inf == 20 && finite == 20 * 15,
                      "[%s] mask %g: %d of 20 rows +Inf, %d of 300 finite", impls[t].name,
                      (double)masks[m], inf, finite);
            sdpa_ctx_destroy(ctx);
        }
        tu_free(&mask);
        tu_problem_free(&pb);
    }
}

/* Windows that cut a key tile on one side or both: the rows that see all of a tile take it
 * whole and the others in slices, before, after or on both sides of them (a window longer
 * than a tile, with both bounds, leaves whole rows in the middle of a task's block), against
 * the golden at every level, for GQA groups 1 and 3 and both alignments. */
static void test_window_passes(void) {
    static const int64_t windows[][2] = {{100, 20}, {0, 100}, {150, -1},
                                         {-1, 30},  {50, 40}, {45, 45}};
    static const int64_t lens[][2] = {{300, 300}, {200, 333}};
    tu_rng r = {2024};
    for (size_t w = 0; w < sizeof windows / sizeof windows[0]; w++)
        for (size_t n = 0; n < sizeof lens / sizeof lens[0]; n++)
            for (int variant = 0; variant < 2; variant++) {
                const int64_t hq = variant ? 3 : 1;
                tu_problem pb =
                    tu_problem_new((tu_dims){1, hq, 1, lens[n][0], lens[n][1], 32, 24}, &r);
                pb.p.use_window = 1;
                pb.p.window_left = windows[w][0];
                pb.p.window_right = windows[w][1];
                pb.p.align = (w + n) % 2 ? SDPA_ALIGN_BOTTOM_RIGHT : SDPA_ALIGN_TOP_LEFT;
                char name[80];
                snprintf(name, sizeof name, "window (%lld,%lld) Lq=%lld Lk=%lld Hq=%lld",
                         (long long)windows[w][0], (long long)windows[w][1], (long long)lens[n][0],
                         (long long)lens[n][1], (long long)hq);
                CHECK_MSG(check_all_isas(name, &pb), "%s", name);
                tu_problem_free(&pb);
            }
}

/* A decode step's few query rows (1 to 4 rows per task: Lq = 1 with GQA groups 1 to 4, and
 * Lq = 2 with a group of 2) take the tables' qk_few: every feature count around the vector
 * widths and key counts around its key blocks and the key tile. */
static void test_few_rows(void) {
    static const int64_t dims[] = {1, 3, 7, 8, 9, 15, 16, 17, 33, 64, 127, 128, 129};
    static const int64_t keys[] = {1, 2, 5, 7, 64, 65, 200};
    tu_rng r = {7};
    for (int shape = 0; shape < 5; shape++)
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
            for (size_t ki = 0; ki < sizeof keys / sizeof keys[0]; ki++) {
                const int64_t group = shape < 4 ? shape + 1 : 2, lq = shape < 4 ? 1 : 2;
                const int64_t d = dims[di], lk = keys[ki];
                tu_problem pb = tu_problem_new((tu_dims){2, 2 * group, 2, lq, lk, d, d}, &r);
                char name[64];
                snprintf(name, sizeof name, "few rows: group=%lld Lq=%lld Lk=%lld D=%lld",
                         (long long)group, (long long)lq, (long long)lk, (long long)d);
                CHECK_MSG(check_all_isas(name, &pb), "%s", name);
                tu_problem_free(&pb);
            }
}

/* A hidden key has no effect at all: with NaN and Inf in the K and V rows of keys that the
 * window, the causal rule or a -inf mask hide, every output is bitwise what it is when those
 * rows hold ordinary numbers, at every level (the careful P V that such slices take must add
 * exactly what the fast one adds). Rows 0..3 of V also hold NaN where row i sees them, so
 * the careful path runs on slices with visible keys too. */
static void test_hidden_keys_bitwise(void) {
    enum { L = 150, D = 40 };
    tu_rng r = {11};
    for (int variant = 0; variant < 2; variant++) {
        tu_problem clean = tu_problem_new((tu_dims){1, 4, 2, L, L, D, D}, &r);
        clean.p.causal = 1;
        clean.p.use_window = 1;
        clean.p.window_left = 37;
        tu_tensor mask = tu_alloc(SDPA_F32, 1, 1, L, L, TU_BHLD, 0, 0);
        if (variant == 1) { /* and a -inf additive mask hiding every 5th key */
            for (int i = 0; i < L; i++)
                for (int j = 0; j < L; j++)
                    tu_set(&mask.t, 0, 0, i, j, j % 5 == 2 ? -INFINITY : 0.0);
            clean.p.mask = &mask.t;
        }
        tu_problem dirty = tu_problem_new((tu_dims){1, 4, 2, L, L, D, D}, &r);
        dirty.p = clean.p;
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < L; j++)
                for (int d = 0; d < D; d++) {
                    tu_set(&dirty.q.t, 0, 2 * h, j, d, tu_get(&clean.q.t, 0, 2 * h, j, d));
                    tu_set(&dirty.q.t, 0, 2 * h + 1, j, d, tu_get(&clean.q.t, 0, 2 * h + 1, j, d));
                    tu_set(&dirty.k.t, 0, h, j, d, tu_get(&clean.k.t, 0, h, j, d));
                    tu_set(&dirty.v.t, 0, h, j, d, tu_get(&clean.v.t, 0, h, j, d));
                }
        /* keys 140..149 are hidden from every row below 140 by the causal rule, and keys j
         * from rows past j + 37 by the window; key 77 (and, with the mask, every key 5n + 2)
         * is poisoned in both heads: the rows that see it go NaN, all others must be equal */
        for (int h = 0; h < 2; h++)
            for (int d = 0; d < D; d++) {
                tu_set(&dirty.v.t, 0, h, 77, d, d % 2 ? NAN : INFINITY);
                tu_set(&dirty.k.t, 0, h, 77, d, NAN);
                if (variant == 1)
                    for (int j = 2; j < L; j += 5) {
                        tu_set(&dirty.v.t, 0, h, j, d, NAN);
                        tu_set(&dirty.k.t, 0, h, j, d, -INFINITY);
                    }
            }
        tu_impl impls[TU_MAX_IMPLS];
        const int n_impls = tu_impls(impls);
        for (int t = 0; t < n_impls; t++) {
            if (!runs_on(&impls[t], &clean))
                continue;
            sdpa_ctx *ctx = tu_ctx(0, impls[t].level);
            CHECK_INT_EQ(tu_problem_forward(ctx, &clean), SDPA_OK);
            CHECK_INT_EQ(tu_problem_forward(ctx, &dirty), SDPA_OK);
            int differ = 0, not_nan = 0;
            for (int h = 0; h < 4; h++)
                for (int i = 0; i < L; i++) {
                    /* without the mask, rows 77..114 see key 77; with it, nobody does */
                    const int sees77 = variant == 0 && i >= 77 && i <= 77 + 37;
                    for (int d = 0; d < D; d++) {
                        const float a = (float)tu_get(&clean.o.t, 0, h, i, d);
                        const float b = (float)tu_get(&dirty.o.t, 0, h, i, d);
                        if (sees77)
                            not_nan += !isnan(b);
                        else
                            differ += memcmp(&a, &b, sizeof a) != 0;
                    }
                }
            CHECK_MSG(differ == 0,
                      "[%s] variant %d: %d outputs of rows that see no poisoned key differ from "
                      "the clean run",
                      impls[t].name, variant, differ);
            CHECK_MSG(not_nan == 0, "[%s] %d outputs of rows that see key 77 are not NaN",
                      impls[t].name, not_nan);
            sdpa_ctx_destroy(ctx);
        }
        tu_problem_free(&clean);
        tu_problem_free(&dirty);
        tu_free(&mask);
    }
}

/* The same for a decode step's few rows (Lq = 1, groups of 1 to 4 query heads per kv head:
 * qk_few, the tables' few-rows softmax and P V), key counts around the groups of four keys
 * and the key tile: keys 5n + 2 hidden by a -inf mask hold NaN and Inf in K and V, and every
 * output is bitwise what it is when they hold ordinary numbers. */
static void test_hidden_keys_few_rows(void) {
    static const int64_t keys[] = {3, 7, 64, 66, 150};
    enum { D = 40 };
    tu_rng r = {13};
    for (int64_t group = 1; group <= 4; group++)
        for (size_t ki = 0; ki < sizeof keys / sizeof keys[0]; ki++) {
            const int64_t lk = keys[ki];
            const tu_dims dims = {1, 2 * group, 2, 1, lk, D, D};
            tu_problem clean = tu_problem_new(dims, &r), dirty = tu_problem_new(dims, &r);
            tu_tensor mask = tu_alloc(SDPA_F32, 1, 1, 1, lk, TU_BHLD, 0, 0);
            for (int64_t j = 0; j < lk; j++)
                tu_set(&mask.t, 0, 0, 0, j, j % 5 == 2 ? -INFINITY : 0.0);
            clean.p.mask = &mask.t;
            dirty.p = clean.p;
            for (int64_t h = 0; h < 2 * group; h++)
                for (int64_t d = 0; d < D; d++)
                    tu_set(&dirty.q.t, 0, h, 0, d, tu_get(&clean.q.t, 0, h, 0, d));
            for (int64_t h = 0; h < 2; h++)
                for (int64_t j = 0; j < lk; j++)
                    for (int64_t d = 0; d < D; d++) {
                        const int bad = j % 5 == 2;
                        tu_set(&dirty.k.t, 0, h, j, d, bad ? NAN : tu_get(&clean.k.t, 0, h, j, d));
                        tu_set(&dirty.v.t, 0, h, j, d,
                               bad ? (d % 2 ? NAN : INFINITY) : tu_get(&clean.v.t, 0, h, j, d));
                    }
            tu_impl impls[TU_MAX_IMPLS];
            const int n_impls = tu_impls(impls);
            for (int t = 0; t < n_impls; t++) {
                if (!runs_on(&impls[t], &clean))
                    continue;
                sdpa_ctx *ctx = tu_ctx(0, impls[t].level);
                CHECK_INT_EQ(tu_problem_forward(ctx, &clean), SDPA_OK);
                CHECK_INT_EQ(tu_problem_forward(ctx, &dirty), SDPA_OK);
                int differ = 0;
                for (int64_t h = 0; h < 2 * group; h++)
                    for (int64_t d = 0; d < D; d++) {
                        const float a = (float)tu_get(&clean.o.t, 0, h, 0, d);
                        const float b = (float)tu_get(&dirty.o.t, 0, h, 0, d);
                        differ += memcmp(&a, &b, sizeof a) != 0;
                    }
                CHECK_MSG(differ == 0,
                          "[%s] group %lld Lk %lld: %d outputs differ from the clean run",
                          impls[t].name, (long long)group, (long long)lk, differ);
                sdpa_ctx_destroy(ctx);
            }
            tu_problem_free(&clean);
            tu_problem_free(&dirty);
            tu_free(&mask);
        }
}

/* The unnormalised accumulator may pass FLT_MAX where the output does not: V = 1e35 over 4096
 * keys with equal scores (exact output 1e35), V = +-3e38 over 3 keys (exact +-3e38). Every
 * level gives the exact output, finite, and the right LSE; a head with ordinary values
 * beside them is untouched. At Lk = 4096 the problem is small enough to be split (flash_plan.c,
 * split-KV): chunks of 512 keys stay below FLT_MAX, so no row is redone exactly, and the
 * output is what f32 accumulation gives (within 512 roundings: 512 x 2^-24). */
static void test_accumulator_overflow(void) {
    static const struct {
        int64_t lk;
        double v;
    } cases[] = {{4096, 1e35}, {3, 3e38}, {700, 1e36}};
    for (size_t n = 0; n < sizeof cases / sizeof cases[0]; n++) {
        const int64_t lk = cases[n].lk, d = 9;
        tu_problem pb = tu_problem_new((tu_dims){1, 2, 2, 5, lk, d, d}, NULL);
        for (int64_t i = 0; i < 5; i++)
            for (int64_t c = 0; c < d; c++) {
                tu_set(&pb.q.t, 0, 0, i, c, 0.0); /* head 0: every score 0 */
                tu_set(&pb.q.t, 0, 1, i, c, 0.01 * (double)(c - i));
            }
        for (int64_t j = 0; j < lk; j++)
            for (int64_t c = 0; c < d; c++) {
                tu_set(&pb.k.t, 0, 0, j, c, 0.5);
                tu_set(&pb.k.t, 0, 1, j, c, 0.1 * (double)((j + c) % 7));
                tu_set(&pb.v.t, 0, 0, j, c, c % 2 ? -cases[n].v : cases[n].v);
                tu_set(&pb.v.t, 0, 1, j, c, (double)((j * 3 + c) % 5));
            }
        tu_impl impls[TU_MAX_IMPLS];
        const int n_impls = tu_impls(impls);
        for (int t = 0; t < n_impls; t++) {
            if (!runs_on(&impls[t], &pb))
                continue;
            sdpa_ctx *ctx = tu_ctx(0, impls[t].level);
            CHECK_INT_EQ(tu_problem_forward(ctx, &pb), SDPA_OK);
            int wrong = 0;
            const double tol = lk >= 1024 ? 512 * 0x1p-24 : 1e-6;
            for (int64_t i = 0; i < 5; i++) {
                for (int64_t c = 0; c < d; c++) {
                    const double want = c % 2 ? -cases[n].v : cases[n].v;
                    const double got = tu_get(&pb.o.t, 0, 0, i, c);
                    wrong += !(fabs(got - want) <= tol * fabs(want));
                    wrong += !isfinite(tu_get(&pb.o.t, 0, 1, i, c));
                }
                wrong += !(fabs(tu_get(&pb.lse.t, 0, 0, i, 0) - log((double)lk)) < 1e-5);
            }
            CHECK_MSG(wrong == 0, "[%s] Lk=%lld V=%g: %d outputs wrong", impls[t].name,
                      (long long)lk, cases[n].v, wrong);
            sdpa_ctx_destroy(ctx);
        }
        tu_problem_free(&pb);
    }
}

/* Scores beyond f32 follow one rule in sdpa_forward (every level) and sdpa_weights: q.k =
 * +2e40 is +inf and makes its row NaN, -2e40 is -inf and hides its key, and softcap brings
 * +-inf back to +-C. (It once gave NaN in the forward and weights (1, 0).) */
static void test_score_overflow(void) {
    for (int cap = 0; cap < 2; cap++) {
        tu_problem pb = tu_problem_new((tu_dims){1, 1, 1, 3, 2, 2, 2}, NULL);
        static const double qs[3] = {1e20, -1e20, 1.0};
        for (int i = 0; i < 3; i++)
            for (int d = 0; d < 2; d++)
                tu_set(&pb.q.t, 0, 0, i, d, qs[i]);
        for (int d = 0; d < 2; d++) {
            tu_set(&pb.k.t, 0, 0, 0, d, 1e20);
            tu_set(&pb.k.t, 0, 0, 1, d, 0.0);
            tu_set(&pb.v.t, 0, 0, 0, d, 3.0 + d);
            tu_set(&pb.v.t, 0, 0, 1, d, -1.0 - d);
        }
        pb.p.softcap = cap ? 5.0f : 0.0f;
        tu_tensor w = tu_alloc(SDPA_F32, 1, 1, 3, 2, TU_BHLD, 0, 0);
        sdpa_ctx *ctx = tu_ctx(0, SDPA_ISA_AUTO);
        CHECK_INT_EQ(sdpa_weights(ctx, &pb.q.t, &pb.k.t, &pb.p, &w.t), SDPA_OK);
        sdpa_ctx_destroy(ctx);
        /* the weights: row 0 NaN (softcap: scores (5, 0)), row 1 (0, 1), row 2 (1, 0) */
        const double e5 = 1.0 / (1.0 + exp(-5.0));
        if (cap)
            CHECK(fabs(tu_get(&w.t, 0, 0, 0, 0) - e5) < 1e-6);
        else
            CHECK(isnan(tu_get(&w.t, 0, 0, 0, 0)) && isnan(tu_get(&w.t, 0, 0, 0, 1)));
        CHECK(cap || (tu_get(&w.t, 0, 0, 1, 0) == 0.0 && tu_get(&w.t, 0, 0, 1, 1) == 1.0));
        tu_impl impls[TU_MAX_IMPLS];
        const int n_impls = tu_impls(impls);
        for (int t = 0; t < n_impls; t++) {
            if (!runs_on(&impls[t], &pb))
                continue;
            ctx = tu_ctx(0, impls[t].level);
            CHECK_INT_EQ(tu_problem_forward(ctx, &pb), SDPA_OK);
            sdpa_ctx_destroy(ctx);
            /* O = W V, row by row, from the weights */
            int wrong = 0;
            for (int i = 0; i < 3; i++)
                for (int d = 0; d < 2; d++) {
                    const double want = tu_get(&w.t, 0, 0, i, 0) * (3.0 + d) +
                                        tu_get(&w.t, 0, 0, i, 1) * (-1.0 - d);
                    const double got = tu_get(&pb.o.t, 0, 0, i, d);
                    wrong += isnan(want) ? !isnan(got) : !(fabs(got - want) <= 1e-5);
                }
            CHECK_MSG(wrong == 0, "[%s] softcap=%d: %d outputs disagree with sdpa_weights",
                      impls[t].name, cap, wrong);
        }
        tu_free(&w);
        tu_problem_free(&pb);
    }
}

/* NaN and Inf in the K/V of keys hidden inside a tile (sliding window, bool mask) must not
 * reach any output; NaN in a visible V reaches exactly its column; at every level. */
static void test_nan_inside_tiles(void) {
    enum { L = 150, D = 24 };
    tu_rng r = {5};
    tu_problem pb = tu_problem_new((tu_dims){1, 2, 2, L, L, D, D}, &r);
    tu_set(&pb.v.t, 0, 0, 70, 3, NAN);      /* seen by rows 70..80 only (window 10 left, causal) */
    tu_set(&pb.v.t, 0, 1, 10, 5, INFINITY); /* head 1: inf seen by rows 10..20 */
    tu_set(&pb.k.t, 0, 0, 100, 0, NAN);     /* seen by rows 100..110 */
    pb.p.causal = 1;
    pb.p.use_window = 1;
    pb.p.window_left = 10;
    tu_impl impls[TU_MAX_IMPLS];
    const int n_impls = tu_impls(impls);
    for (int t = 0; t < n_impls; t++) {
        if (!runs_on(&impls[t], &pb))
            continue;
        sdpa_ctx *ctx = tu_ctx(0, impls[t].level);
        CHECK_INT_EQ(sdpa_forward(ctx, &pb.q.t, &pb.k.t, &pb.v.t, &pb.p, &pb.o.t, NULL), SDPA_OK);
        int wrong = 0;
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < L; i++)
                for (int d = 0; d < D; d++) {
                    const double x = tu_get(&pb.o.t, 0, h, i, d);
                    const int nan_v = h == 0 && i >= 70 && i <= 80 && d == 3;
                    const int nan_k = h == 0 && i >= 100 && i <= 110;
                    const int inf_v = h == 1 && i >= 10 && i <= 20 && d == 5;
                    if (nan_v || nan_k)
                        wrong += !isnan(x);
                    else if (inf_v)
                        wrong += isfinite(x);
                    else
                        wrong += !isfinite(x);
                }
        CHECK_MSG(wrong == 0, "[%s] %d outputs break the NaN rule", impls[t].name, wrong);
        sdpa_ctx_destroy(ctx);
    }
    tu_problem_free(&pb);
}

/* Bitwise identical output and LSE for n_threads 1, 2, 3, 4, 7, 16, at every level. */
static void test_thread_determinism(void) {
    tu_rng r = {3};
    tu_problem pb = tu_problem_new((tu_dims){2, 6, 2, 200, 333, 48, 40}, &r); /* 1 thread */
    tu_tensor o2 = tu_alloc(SDPA_F32, 2, 6, 200, 40, TU_BHLD, 0, 0);          /* n threads */
    tu_tensor l2 = tu_alloc(SDPA_F32, 2, 6, 200, 1, TU_BHLD, 0, 0);
    pb.p.causal = 1;
    pb.p.align = SDPA_ALIGN_BOTTOM_RIGHT;
    static const int threads[] = {2, 3, 4, 7, 16};
    tu_impl impls[TU_MAX_IMPLS];
    const int n_impls = tu_impls(impls);
    for (int t = 0; t < n_impls; t++) {
        if (!runs_on(&impls[t], &pb))
            continue;
        const sdpa_isa isa = impls[t].level;
        sdpa_ctx *one = tu_ctx(1, isa);
        CHECK_INT_EQ(tu_problem_forward(one, &pb), SDPA_OK);
        sdpa_ctx_destroy(one);
        for (size_t n = 0; n < sizeof threads / sizeof threads[0]; n++) {
            sdpa_ctx *ctx = tu_ctx(threads[n], isa);
            memset(o2.buf, 0, o2.bytes);
            CHECK_INT_EQ(sdpa_forward(ctx, &pb.q.t, &pb.k.t, &pb.v.t, &pb.p, &o2.t, &l2.t),
                         SDPA_OK);
            CHECK_MSG(memcmp(pb.o.buf, o2.buf, pb.o.bytes) == 0 &&
                          memcmp(pb.lse.buf, l2.buf, pb.lse.bytes) == 0,
                      "[%s] n_threads=%d differs from 1 thread", impls[t].name, threads[n]);
            sdpa_ctx_destroy(ctx);
        }
    }
    tu_problem_free(&pb);
    tu_free(&o2);
    tu_free(&l2);
}

/* View of rows [i0, i0 + n) of t along dimension 2 (the positions). */
static sdpa_tensor rows_view(const sdpa_tensor *t, int64_t i0, int64_t n) {
    sdpa_tensor v = *t;
    v.data = (char *)t->data + i0 * t->stride[2] * (int64_t)sdpa_dtype_size(t->dtype);
    v.shape[2] = n;
    return v;
}

/* K and V that cannot be read in place (f16, bf16, f32 with a feature stride of 2) are read
 * from each worker's widened head once a head has 4 query blocks or more, two per worker
 * (flash_plan.c, WIDE_MIN_BLOCKS): the outputs are bitwise those of each query block computed alone
 * (one block: its tiles widened as it reads them), for 1 and 2 threads, unmasked, causal
 * bottom-right, and causal with a left window and softcap. A block alone is the block's rows
 * of q with the keys its rows may see, [0, Lk - Lq + i1) under bottom-right alignment, so
 * that it sees what it sees in the whole problem. Two sequences of one kv head, so that a
 * worker's next head is the same kv head of another sequence; the last block holds one
 * position (2 rows), which the few-rows kernels take, reading the widened rows. */
static void test_widened_head(void) {
    enum { B = 2, HQ = 2, HKV = 1, LQ = 257, LK = 333, DK = 48, DV = 40, BQ = 64 /* 128 / 2 */ };
    static const char *const kinds[] = {"f16", "bf16", "f32 stride 2"};
    tu_rng r = {21};
    tu_problem pb = tu_problem_new((tu_dims){B, HQ, HKV, LQ, LK, DK, DV}, &r);
    tu_tensor whole = tu_alloc(SDPA_F32, B, HQ, LQ, DV, TU_BHLD, 0, 0);
    tu_tensor whole_lse = tu_alloc(SDPA_F32, B, HQ, LQ, 1, TU_BHLD, 0, 0);
    tu_impl impls[TU_MAX_IMPLS];
    const int n_impls = tu_impls(impls);
    for (int kind = 0; kind < 3; kind++) {
        const sdpa_dtype dt = kind == 0 ? SDPA_F16 : kind == 1 ? SDPA_BF16 : SDPA_F32;
        const int64_t f = kind == 2 ? 2 : 1;
        tu_tensor kb = tu_alloc(dt, B, HKV, LK, DK * f, TU_BHLD, 0, 0);
        tu_tensor vb = tu_alloc(dt, B, HKV, LK, DV * f, TU_BHLD, 0, 0);
        sdpa_tensor k = kb.t, v = vb.t;
        k.shape[3] = DK;
        v.shape[3] = DV;
        k.stride[3] = v.stride[3] = f;
        tu_copy(&k, &pb.k.t);
        tu_copy(&v, &pb.v.t);
        for (int mask = 0; mask < 3; mask++) {
            sdpa_params prm = pb.p;
            prm.causal = mask > 0;
            prm.align = SDPA_ALIGN_BOTTOM_RIGHT;
            prm.window_left = mask == 2 ? 70 : -1;
            prm.window_right = -1;
            prm.softcap = mask == 2 ? 30.0f : 0.0f;
            for (int t = 0; t < n_impls; t++) {
                if (!impls[t].runs || !tu_impl_takes(&impls[t], &pb.q.t, &k, &v, &prm, &pb.o.t))
                    continue;
                sdpa_ctx *one = tu_ctx(1, impls[t].level), *two = tu_ctx(2, impls[t].level);
                /* each block alone, into pb.o and pb.lse */
                for (int64_t i0 = 0; i0 < LQ; i0 += BQ) {
                    const int64_t n = LQ - i0 < BQ ? LQ - i0 : BQ;
                    const int64_t lk = mask > 0 ? LK - LQ + i0 + n : LK;
                    const sdpa_tensor q = rows_view(&pb.q.t, i0, n), kk = rows_view(&k, 0, lk),
                                      vv = rows_view(&v, 0, lk);
                    sdpa_tensor o = rows_view(&pb.o.t, i0, n), l = rows_view(&pb.lse.t, i0, n);
                    CHECK_INT_EQ(sdpa_forward(one, &q, &kk, &vv, &prm, &o, &l), SDPA_OK);
                }
                for (int threads = 1; threads <= 2; threads++) {
                    memset(whole.buf, 0, whole.bytes);
                    CHECK_INT_EQ(sdpa_forward(threads == 1 ? one : two, &pb.q.t, &k, &v, &prm,
                                              &whole.t, &whole_lse.t),
                                 SDPA_OK);
                    CHECK_MSG(memcmp(pb.o.buf, whole.buf, pb.o.bytes) == 0 &&
                                  memcmp(pb.lse.buf, whole_lse.buf, pb.lse.bytes) == 0,
                              "[%s] K/V %s, mask %d, %d threads: the widened head differs from "
                              "each block alone",
                              impls[t].name, kinds[kind], mask, threads);
                }
                sdpa_ctx_destroy(one);
                sdpa_ctx_destroy(two);
            }
        }
        tu_free(&kb);
        tu_free(&vb);
    }
    tu_problem_free(&pb);
    tu_free(&whole);
    tu_free(&whole_lse);
}

/* The widened head with split-KV (a head of 5 blocks cut into 2 key chunks) and with P V's
 * careful path (a NaN in the V row of a key that the causal rule hides from the first rows
 * of a task): 1 and 2 threads (widened heads) bitwise 16 threads (fewer than two blocks a
 * worker: tiles widened as read). Then with an allocator that refuses the widened heads'
 * scratch: the call does without them, with the same bits. f16 K/V. */
static void test_widened_head_split(void) {
    enum { LQ = 257, LK = 1100, D = 40 };
    tu_rng r = {23};
    tu_problem pb = tu_problem_new((tu_dims){1, 2, 1, LQ, LK, D, D}, &r);
    tu_tensor k = tu_alloc(SDPA_F16, 1, 1, LK, D, TU_BHLD, 0, 0);
    tu_tensor v = tu_alloc(SDPA_F16, 1, 1, LK, D, TU_BHLD, 0, 0);
    tu_copy(&k.t, &pb.k.t);
    tu_copy(&v.t, &pb.v.t);
    tu_set(&v.t, 0, 0, LK - LQ + 10, 3, NAN); /* seen by rows i >= 10 only */
    pb.p.causal = 1;
    pb.p.align = SDPA_ALIGN_BOTTOM_RIGHT;
    pb.p.window_left = 300;
    tu_tensor o2 = tu_alloc(SDPA_F32, 1, 2, LQ, D, TU_BHLD, 0, 0);
    tu_tensor l2 = tu_alloc(SDPA_F32, 1, 2, LQ, 1, TU_BHLD, 0, 0);
    tu_impl impls[TU_MAX_IMPLS];
    const int n_impls = tu_impls(impls);
    for (int t = 0; t < n_impls; t++) {
        if (!impls[t].runs || !tu_impl_takes(&impls[t], &pb.q.t, &k.t, &v.t, &pb.p, &pb.o.t))
            continue;
        sdpa_ctx *many = tu_ctx(16, impls[t].level);
        CHECK_INT_EQ(sdpa_forward(many, &pb.q.t, &k.t, &v.t, &pb.p, &pb.o.t, &pb.lse.t), SDPA_OK);
        sdpa_ctx_destroy(many);
        CHECK_MSG(isnan(tu_get(&pb.o.t, 0, 0, LQ - 1, 3)) && !isnan(tu_get(&pb.o.t, 0, 0, 5, 3)),
                  "[%s] the NaN reaches the rows that see it only", impls[t].name);
        for (int threads = 1; threads <= 2; threads++) {
            tu_failing_alloc la = {0};
            sdpa_ctx_params cp = {0};
            cp.n_threads = threads;
            cp.max_isa = impls[t].level;
            cp.allocator = tu_failing_allocator(&la);
            for (int limited = 0; limited < 2; limited++) {
                sdpa_ctx *ctx = NULL;
                CHECK_INT_EQ(sdpa_ctx_create(&cp, &ctx), SDPA_OK);
                memset(o2.buf, 0, o2.bytes);
                la.refused = 0;
                CHECK_INT_EQ(sdpa_forward(ctx, &pb.q.t, &k.t, &v.t, &pb.p, &o2.t, &l2.t), SDPA_OK);
                CHECK_MSG(memcmp(pb.o.buf, o2.buf, o2.bytes) == 0 &&
                              memcmp(pb.lse.buf, l2.buf, l2.bytes) == 0,
                          "[%s] %d threads%s: differs from tiles widened as read", impls[t].name,
                          threads, limited ? ", the widened heads refused" : "");
                CHECK_MSG(la.refused == limited, "[%s] %d threads: the largest request %s refused",
                          impls[t].name, threads, limited ? "was not" : "was");
                sdpa_ctx_destroy(ctx);
                CHECK_INT_EQ(la.outstanding, 0);
                la.limit = la.largest - 1; /* the next call: the widened heads' scratch refused */
            }
        }
    }
    tu_problem_free(&pb);
    tu_free(&k);
    tu_free(&v);
    tu_free(&o2);
    tu_free(&l2);
}

int main(int argc, char **argv) {
    tu_report_impls();
    return CHECK_RUN(argc, argv, CASE(test_window_passes), CASE(test_underflowed_weight_inf),
                     CASE(test_tile_boundaries), CASE(test_few_rows),
                     CASE(test_hidden_keys_bitwise), CASE(test_hidden_keys_few_rows),
                     CASE(test_accumulator_overflow), CASE(test_score_overflow),
                     CASE(test_nan_inside_tiles), CASE(test_thread_determinism),
                     CASE(test_widened_head), CASE(test_widened_head_split));
}
