/*
 * test_flash_weights.c — sdpa_weights on the tiled path (flash.c, weights_task) at every ISA
 * level the CPU has: against the reference's weights (in double) by the rule of testing.md,
 * with the same-precision naive weights as the baseline, over head sizes, lengths around the
 * tiles, GQA, every mask feature and strided views; the contract's corners (fully masked rows
 * exactly 0, the NaN rule, weights below f32's normal range as PyTorch gives them); bitwise
 * determinism for any thread count. Levels the CPU lacks are reported as skipped.
 */
#include "check.h"
#include "testutil.h"

#include "../src/dispatch/impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* One weights problem: q (B, Hq, Lq, Dk) and k (B, Hkv, Lk, Dk), the weights w (B, Hq, Lq,
 * Lk) F32 with `pad` elements after each row, and the params. */
typedef struct w_case {
    tu_tensor q, k, w, mask;
    sdpa_params p;
    float slopes[8];
} w_case;

static w_case case_new(tu_rng *r, int64_t B, int64_t hq, int64_t hkv, int64_t lq, int64_t lk,
                       int64_t d, tu_layout layout, int64_t pad) {
    w_case c;
    memset(&c, 0, sizeof c);
    c.q = tu_alloc(SDPA_F32, B, hq, lq, d, layout, pad, pad);
    c.k = tu_alloc(SDPA_F32, B, hkv, lk, d, layout, pad, 0);
    c.w = tu_alloc(SDPA_F32, B, hq, lq, lk, TU_BHLD, pad, 0);
    tu_fill_randn(&c.q, r, 1.0, 0.0);
    tu_fill_randn(&c.k, r, 1.0, 0.0);
    for (int h = 0; h < 8; h++)
        c.slopes[h] = 0.5f / (float)(h + 1);
    return c;
}

static void case_free(w_case *c) {
    tu_free(&c->q);
    tu_free(&c->k);
    tu_free(&c->w);
    tu_free(&c->mask);
}

static size_t n_weights(const w_case *c) {
    const int64_t *s = c->w.t.shape;
    return (size_t)(s[0] * s[1] * s[2] * s[3]);
}

/* The case at every level against the golden, by the rule (k = 3, NMSE gate 1e-10, as the
 * output O). Every level writes the case's w. */
static int check_all_isas(const char *name, w_case *c) {
    const size_t n = n_weights(c);
    double *want = malloc(n * sizeof *want), *lp = malloc(n * sizeof *lp);
    tu_tensor g = tu_alloc(SDPA_F32, c->w.t.shape[0], c->w.t.shape[1], c->w.t.shape[2],
                           c->w.t.shape[3], TU_BHLD, 0, 0);
    sdpa_ctx *ref = tu_ctx(1, SDPA_ISA_AUTO);
    int ok = tu_golden_weights(ref, &c->q.t, &c->k.t, &c->p, &g.t) == SDPA_OK;
    CHECK_MSG(ok, "%s: golden: %s", name, sdpa_ctx_last_error(ref));
    sdpa_ctx_destroy(ref);
    double *golden = tu_to_doubles(&g.t);
    for (size_t i = 0; i < n; i++)
        want[i] = golden[i];
    tu_naive_weights(&c->q.t, &c->k.t, &c->p, SDPA_F32, lp);
    tu_impl impls[TU_MAX_IMPLS];
    const int n_impls = tu_impls(impls);
    for (int t = 0; t < n_impls && ok; t++) {
        if (!impls[t].runs)
            printf("    %-44s [%s] skipped: the CPU lacks %s\n", name, impls[t].name,
                   impls[t].missing);
        if (!impls[t].runs || !impls[t].weights)
            continue;
        sdpa_ctx *ctx = tu_ctx(0, impls[t].level);
        tu_fill_canary(&c->w);
        if (sdpa_weights(ctx, &c->q.t, &c->k.t, &c->p, &c->w.t) != SDPA_OK) {
            printf("    %s: %s\n", name, sdpa_ctx_last_error(ctx));
            ok = 0;
        } else {
            double *got = tu_to_doubles(&c->w.t);
            char what[128];
            snprintf(what, sizeof what, "%s [%s] weights", name, impls[t].name);
            ok &= tu_rule(what, got, lp, want, n, SDPA_F32, 3.0, 1e-10);
            /* zero where the golden is zero (hidden keys, fully masked rows): exactly +0 */
            size_t nonzero = 0;
            for (size_t i = 0; i < n; i++)
                nonzero += want[i] == 0.0 && !(got[i] == 0.0 && !signbit(got[i]));
            CHECK_MSG(nonzero == 0, "%s [%s]: %zu hidden weights are not +0", name, impls[t].name,
                      nonzero);
            ok &= nonzero == 0;
            free(got);
        }
        sdpa_ctx_destroy(ctx);
    }
    free(golden);
    free(want);
    free(lp);
    tu_free(&g);
    return ok;
}

/* Head sizes, lengths around the key tile (64) and the row block (128 rows / group), GQA,
 * batches, and both layouts with padded rows. */
static void test_sweep(void) {
    static const int64_t lens[][2] = {{1, 1},   {1, 239},  {239, 1},   {17, 127},  {127, 17},
                                      {63, 65}, {64, 64},  {129, 129}, {113, 203}, {3, 799},
                                      {1, 513}, {130, 67}, {267, 514}};
    static const int64_t dims[] = {1, 3, 8, 17, 33, 64, 80, 129};
    static const int64_t heads[][2] = {{1, 1}, {6, 2}, {8, 2}, {6, 1}};
    tu_rng r = {17};
    for (size_t n = 0; n < sizeof lens / sizeof lens[0]; n++) {
        const int64_t d = dims[n % (sizeof dims / sizeof dims[0])];
        const int64_t *hh = heads[n % 4];
        const int64_t B = 1 + (int64_t)(n % 3 == 2);
        const tu_layout layout = n % 2 ? TU_BLHD : TU_BHLD;
        w_case c = case_new(&r, B, hh[0], hh[1], lens[n][0], lens[n][1], d, layout, (int64_t)n % 3);
        char name[96];
        snprintf(name, sizeof name, "B=%lld H=%lld/%lld Lq=%lld Lk=%lld D=%lld %s", (long long)B,
                 (long long)hh[0], (long long)hh[1], (long long)lens[n][0], (long long)lens[n][1],
                 (long long)d, layout == TU_BLHD ? "BLHD" : "BHLD");
        CHECK_MSG(check_all_isas(name, &c), "%s", name);
        case_free(&c);
    }
}

/* Every mask feature: causal in both alignments for Lq <, = and > Lk (bottom-right with
 * Lq > Lk leaves rows without keys); windows (0, and a
 * band); softcap with ALiBi; bool and additive masks with -inf
 * blocks and finite -1e9 entries, broadcast over heads; peaky scores (q x 5, k x 3). */
static void test_masks(void) {
    static const int64_t lens[][2] = {{90, 150}, {150, 150}, {150, 90}};
    tu_rng r = {23};
    for (size_t n = 0; n < 3; n++)
        for (int variant = 0; variant < 6; variant++) {
            w_case c = case_new(&r, 2, 4, 2, lens[n][0], lens[n][1], 40, TU_BHLD, 0);
            const char *what = "";
            switch (variant) {
            case 0:
                c.p.causal = 1;
                what = "causal top-left";
                break;
            case 1:
                c.p.causal = 1;
                c.p.align = SDPA_ALIGN_BOTTOM_RIGHT;
                what = "causal bottom-right";
                break;
            case 2:
                c.p.use_window = 1;
                c.p.window_left = 0;
                c.p.window_right = 0;
                what = "window 0,0";
                break;
            case 3:
                c.p.use_window = 1;
                c.p.window_left = 30;
                c.p.window_right = 10;
                what = "window 30,10";
                break;
            case 4:
                c.p.softcap = 2.5f;
                c.p.alibi_slopes = c.slopes;
                tu_free(&c.q);
                c.q = tu_alloc(SDPA_F32, 2, 4, lens[n][0], 40, TU_BHLD, 0, 0);
                tu_fill_randn(&c.q, &r, 5.0, 0.0);
                what = "softcap ALiBi peaky";
                break;
            default: {
                const int additive = n != 1;
                c.mask = tu_alloc(additive ? SDPA_F32 : SDPA_BOOL, 2, 1, lens[n][0], lens[n][1],
                                  TU_BHLD, 0, 0);
                for (int64_t b = 0; b < 2; b++)
                    for (int64_t i = 0; i < lens[n][0]; i++)
                        for (int64_t j = 0; j < lens[n][1]; j++) {
                            const int hide = (i / 16 + j / 32 + b) % 3 == 0 || i % 7 == 3;
                            const double x = additive ? (hide         ? -INFINITY
                                                         : j % 5 == 0 ? -1e9
                                                                      : tu_randn(&r))
                                                      : !hide;
                            tu_set(&c.mask.t, b, 0, i, j, x);
                        }
                c.mask.t.stride[1] = 0;
                c.mask.t.shape[1] = 4;
                c.p.mask = &c.mask.t;
                what = additive ? "additive mask" : "bool mask";
            }
            }
            char name[96];
            snprintf(name, sizeof name, "Lq=%lld Lk=%lld %s", (long long)lens[n][0],
                     (long long)lens[n][1], what);
            CHECK_MSG(check_all_isas(name, &c), "%s", name);
            case_free(&c);
        }
}

/* Windows whose rows take some tiles whole and others in slices, before, after or on both
 * sides of the whole ones (a window longer than a tile with both bounds), and a window that
 * leaves the last query block no key at all (Lq = 257: its one row's window starts past the
 * 200 keys), which once made a slice of -6 keys and wrote past the weights. */
static void test_window_passes(void) {
    static const int64_t windows[][2] = {{50, 40}, {45, 45}, {100, 20}, {0, 100}, {50, -1}};
    static const int64_t lens[][2] = {{300, 300}, {257, 200}};
    tu_rng r = {31};
    for (size_t w = 0; w < sizeof windows / sizeof windows[0]; w++)
        for (size_t n = 0; n < sizeof lens / sizeof lens[0]; n++)
            for (int variant = 0; variant < 4; variant++) {
                const int br = variant & 1;
                const int64_t hq = variant & 2 ? 3 : 1;
                w_case c = case_new(&r, 1, hq, 1, lens[n][0], lens[n][1], 24, TU_BHLD, 0);
                c.p.use_window = 1;
                c.p.window_left = windows[w][0];
                c.p.window_right = windows[w][1];
                c.p.align = br ? SDPA_ALIGN_BOTTOM_RIGHT : SDPA_ALIGN_TOP_LEFT;
                /* softcap with GQA: it must not make the window's hidden keys -cap */
                c.p.softcap = hq > 1 ? 30.0f : 0.0f;
                char name[96];
                snprintf(name, sizeof name, "window (%lld,%lld) Lq=%lld Lk=%lld Hq=%lld %s",
                         (long long)windows[w][0], (long long)windows[w][1], (long long)lens[n][0],
                         (long long)lens[n][1], (long long)hq, br ? "bottom-right" : "top-left");
                CHECK_MSG(check_all_isas(name, &c), "%s", name);
                case_free(&c);
            }
}

/* The NaN rule: a NaN in a query row makes that row NaN wherever it sees a key (0 where it
 * does not); a NaN in a key row reaches exactly the rows that see it; rows that cannot see it
 * (causal, window) stay finite. A window past every key leaves rows of exact zeros. */
static void test_nan_and_masked_rows(void) {
    enum { L = 150, D = 24 };
    tu_rng r = {5};
    w_case c = case_new(&r, 1, 2, 1, L, L, D, TU_BHLD, 0);
    tu_set(&c.q.t, 0, 1, 40, 2, NAN);  /* head 1, row 40 */
    tu_set(&c.k.t, 0, 0, 100, 0, NAN); /* key 100: seen by rows 100..110 */
    c.p.causal = 1;
    c.p.use_window = 1;
    c.p.window_left = 10;
    tu_impl impls[TU_MAX_IMPLS];
    const int n_impls = tu_impls(impls);
    for (int t = 0; t < n_impls; t++) {
        if (!impls[t].runs || !impls[t].weights) /* (flash-amx: flash-avx512's) */
            continue;
        sdpa_ctx *ctx = tu_ctx(0, impls[t].level);
        CHECK_INT_EQ(sdpa_weights(ctx, &c.q.t, &c.k.t, &c.p, &c.w.t), SDPA_OK);
        int wrong = 0;
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < L; i++)
                for (int j = 0; j < L; j++) {
                    const double x = tu_get(&c.w.t, 0, h, i, j);
                    const int seen = j <= i && j >= i - 10;
                    const int nan = seen && ((h == 1 && i == 40) || (i >= 100 && i <= 110));
                    if (!seen)
                        wrong += !(x == 0.0 && !signbit(x));
                    else if (nan)
                        wrong += !isnan(x);
                    else
                        wrong += !isfinite(x);
                }
        CHECK_MSG(wrong == 0, "[%s] %d weights break the NaN rule", impls[t].name, wrong);
        sdpa_ctx_destroy(ctx);
    }
    case_free(&c);
}

/* Weights below f32's normal range: scores (200, 100, 50) give exactly what PyTorch prints in
 * float32, (1, exp(-100) = 3.783505853677006e-44, 0), at every level (the tables' exp is
 * accurate only down to the smallest normal; the tiled path takes libm's expf below it). */
static void test_subnormal_weights(void) {
    static const float huge[3] = {200.0f, 100.0f, 50.0f};
    float one = 1.0f, w[3];
    sdpa_tensor q = sdpa_tensor_bhld(&one, SDPA_F32, 1, 1, 1, 1);
    sdpa_tensor k = sdpa_tensor_bhld((void *)huge, SDPA_F32, 1, 1, 3, 1);
    sdpa_tensor tw = sdpa_tensor_bhld(w, SDPA_F32, 1, 1, 1, 3);
    sdpa_params p = {0};
    p.scale = 1.0f;
    tu_impl impls[TU_MAX_IMPLS];
    const int n_impls = tu_impls(impls);
    for (int t = 0; t < n_impls; t++) {
        if (!impls[t].runs || !impls[t].weights) /* (flash-amx: flash-avx512's) */
            continue;
        sdpa_ctx *ctx = tu_ctx(1, impls[t].level);
        CHECK_INT_EQ(sdpa_weights(ctx, &q, &k, &p, &tw), SDPA_OK);
        CHECK_MSG(w[0] == 1.0f && w[1] == 3.783505853677006e-44f && w[2] == 0.0f,
                  "[%s] weights %g %g %g", impls[t].name, (double)w[0], (double)w[1], (double)w[2]);
        sdpa_ctx_destroy(ctx);
    }
}

/* Bitwise identical weights for n_threads 1, 2, 3, 4, 7, 16, at every level. */
static void test_thread_determinism(void) {
    tu_rng r = {3};
    w_case c = case_new(&r, 2, 6, 2, 200, 333, 48, TU_BHLD, 0);
    tu_tensor w2 = tu_alloc(SDPA_F32, 2, 6, 200, 333, TU_BHLD, 0, 0);
    c.p.causal = 1;
    c.p.align = SDPA_ALIGN_BOTTOM_RIGHT;
    static const int threads[] = {2, 3, 4, 7, 16};
    tu_impl impls[TU_MAX_IMPLS];
    const int n_impls = tu_impls(impls);
    for (int t = 0; t < n_impls; t++) {
        if (!impls[t].runs || !impls[t].weights) /* (flash-amx: flash-avx512's) */
            continue;
        sdpa_ctx *one = tu_ctx(1, impls[t].level);
        CHECK_INT_EQ(sdpa_weights(one, &c.q.t, &c.k.t, &c.p, &c.w.t), SDPA_OK);
        sdpa_ctx_destroy(one);
        for (size_t n = 0; n < sizeof threads / sizeof threads[0]; n++) {
            sdpa_ctx *ctx = tu_ctx(threads[n], impls[t].level);
            memset(w2.buf, 0xff, w2.bytes);
            CHECK_INT_EQ(sdpa_weights(ctx, &c.q.t, &c.k.t, &c.p, &w2.t), SDPA_OK);
            CHECK_MSG(memcmp(c.w.buf, w2.buf, w2.bytes) == 0,
                      "[%s] n_threads=%d differs from 1 thread", impls[t].name, threads[n]);
            sdpa_ctx_destroy(ctx);
        }
    }
    case_free(&c);
    tu_free(&w2);
}

int main(int argc, char **argv) {
    tu_report_impls();
    return CHECK_RUN(argc, argv, CASE(test_sweep), CASE(test_masks), CASE(test_window_passes),
                     CASE(test_nan_and_masked_rows), CASE(test_subnormal_weights),
                     CASE(test_thread_determinism));
}
