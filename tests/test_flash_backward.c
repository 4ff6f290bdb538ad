/*
 * test_flash_backward.c — the tiled backward (src/attn/flash_backward.c) at every ISA level the
 * CPU has, against the reference backward (src/ref/ref_backward.c, in double: the golden) by
 * testing.md's gradient rule: err(test) <= k err(lp) + floor, with k = 8 for f32 storage and 3
 * for f16/bf16, an NMSE gate on dV only, non-finite values at the same places, and the dQ of
 * fully masked rows exactly 0 (backward_fixture.h: the golden, the same-precision baseline and
 * the rule).
 *
 * The sweep: no features, causal in both alignments with Lq < Lk and Lq > Lk, windows, bool and
 * additive masks (broadcast too) with fully masked rows, softcap, ALiBi, GQA and MQA, Dk != Dv,
 * lengths around the kernel's block of 64 and odd ones, strided and (B, L, H, D) layouts,
 * f16/bf16 storage and dropout. Then: every element written and nothing around it; NaN and Inf
 * in keys hidden from every row reach no gradient (bitwise the clean run's), and a key that some
 * rows see makes exactly their gradients NaN; the tables' exp_lse; and running out of memory.
 * Levels the CPU lacks are reported as skipped. The backward's schedules, its determinism over
 * thread counts and its memory budget are test_backward_schedules.c's.
 */
#include "backward_fixture.h"

/* ---- the tables' exp_lse -------------------------------------------------------------------- */

/* Each table's exp_lse: exp(s - u) within 2 ulp on the range a softmax uses, -inf scores as -0.0
 * (and reported), NaN in s or u as NaN, in both shapes the backward calls it with (one key over
 * a tile of lanes, and many keys over the rows). */
static void test_exp_lse(void) {
    enum { N = 256, NK = 8 };
    tu_impl impls[TU_MAX_IMPLS];
    const int n_impls = tu_impls(impls);
    for (int n = 0; n < n_impls; n++) {
        const sdpa__ukernels *uk = impls[n].impl->uk;
        if (!impls[n].runs)
            printf("    %-8s skipped: the CPU lacks %s\n", uk->name, impls[n].missing);
        if (!impls[n].runs || !impls[n].own_uk) /* (flash-amx drives flash-avx512's) */
            continue;
        static float s[NK * N], u[N];
        double worst = 0.0;
        for (int r = 0; r < N; r++)
            u[r] = 3.0f - (float)r / 16.0f;
        for (int j = 0; j < NK; j++)
            for (int r = 0; r < N; r++)
                s[j * N + r] = u[r] - 80.0f * (float)((j * N + r) % 97) / 96.0f;
        CHECK(uk->exp_lse(NK, N, s, N, u) == 0);
        for (int j = 0; j < NK; j++)
            for (int r = 0; r < N; r++) {
                const float x = u[r] - 80.0f * (float)((j * N + r) % 97) / 96.0f;
                const double want = exp((double)(x - u[r]));
                worst =
                    fmax(worst, fabs((double)s[j * N + r] - want) / ldexp(1.0, ilogb(want) - 23));
            }
        printf("    %-8s exp_lse: worst %.2f ulp\n", uk->name, worst);
        CHECK_MSG(worst <= 2.0, "%s exp_lse error %.2f ulp", uk->name, worst);
        /* below e^-87 the table's floor (ukernels.h): e^-87 or +0, never a subnormal (each one
         * a microcode assist in the products that read it) and never -0.0 */
        static const float deep[] = {-87.5f, -90.0f, -95.0f, -100.0f, -104.5f, -200.0f, -1e9f};
        enum { NDEEP = sizeof deep / sizeof deep[0] };
        for (int r = 0; r < N; r++) {
            u[r] = 2.0f;
            s[r] = 2.0f + deep[r % NDEEP];
        }
        CHECK(uk->exp_lse(1, N, s, N, u) == 0);
        int sub = 0;
        for (int r = 0; r < N; r++)
            sub += signbit(s[r]) || !(s[r] == 0.0f || (s[r] >= 0x1p-126f && s[r] <= 1.7e-38f));
        CHECK_MSG(sub == 0, "%s exp_lse: %d weights below e^-87 subnormal or out of the floor",
                  uk->name, sub);
        /* one key across the lanes: -inf hidden, NaN stays NaN, a NaN LSE makes NaN */
        for (int r = 0; r < N; r++) {
            s[r] = r % 3 == 0 ? -INFINITY : r % 3 == 1 ? NAN : 0.5f;
            u[r] = r % 5 == 0 ? NAN : 1.0f;
        }
        CHECK(uk->exp_lse(1, N, s, N, u) != 0);
        int wrong = 0;
        for (int r = 0; r < N; r++) {
            if (r % 3 == 0)
                wrong += !(s[r] == 0.0f && signbit(s[r]));
            else if (r % 3 == 1 || r % 5 == 0)
                wrong += !isnan(s[r]);
            else
                wrong += !(fabs((double)s[r] - exp(-0.5)) < 1e-6);
        }
        CHECK_MSG(wrong == 0, "%s exp_lse: %d special values wrong", uk->name, wrong);
    }
}

/* ---- the sweep ------------------------------------------------------------------------------ */

static void test_shapes(void) {
    static const int64_t lens[][2] = {{1, 1},     {1, 2},   {2, 1},   {3, 17},   {17, 3},
                                      {63, 65},   {64, 64}, {65, 63}, {1, 130},  {130, 1},
                                      {129, 129}, {3, 199}, {199, 3}, {127, 193}};
    for (size_t n = 0; n < sizeof lens / sizeof lens[0]; n++) {
        fb_case c = plain(2, 2, lens[n][0], lens[n][1], 16, 16);
        c.seed = 10 + n;
        char name[64];
        snprintf(name, sizeof name, "Lq=%lld Lk=%lld", (long long)lens[n][0],
                 (long long)lens[n][1]);
        CHECK_MSG(run_case(name, &c), "%s", name);
    }
    static const int64_t dims[][2] = {{1, 1},   {3, 7},  {17, 33}, {64, 32}, {32, 128},
                                      {65, 65}, {1, 65}, {80, 96}, {129, 17}};
    for (size_t n = 0; n < sizeof dims / sizeof dims[0]; n++) {
        fb_case c = plain(2, 1, 70, 67, dims[n][0], dims[n][1]);
        c.seed = 40 + n;
        char name[64];
        snprintf(name, sizeof name, "Dk=%lld Dv=%lld GQA 2:1", (long long)dims[n][0],
                 (long long)dims[n][1]);
        CHECK_MSG(run_case(name, &c), "%s", name);
    }
    fb_case c = plain(3, 3, 33, 41, 8, 8);
    c.d.B = 3;
    c.p.scale = -0.3f;
    CHECK(run_case("B=3, scale=-0.3", &c));
}

static void test_causal_and_windows(void) {
    static const int64_t lens[][2] = {{65, 129}, {129, 65}, {64, 64}, {1, 70}, {70, 1}};
    for (size_t n = 0; n < sizeof lens / sizeof lens[0]; n++)
        for (int align = 0; align < 2; align++) {
            fb_case c = plain(2, 1, lens[n][0], lens[n][1], 24, 24);
            c.p.causal = 1;
            c.p.align = align ? SDPA_ALIGN_BOTTOM_RIGHT : SDPA_ALIGN_TOP_LEFT;
            c.seed = 60 + n;
            char name[64];
            snprintf(name, sizeof name, "causal %s Lq=%lld Lk=%lld", align ? "BR" : "TL",
                     (long long)lens[n][0], (long long)lens[n][1]);
            CHECK_MSG(run_case(name, &c), "%s", name);
        }
    static const int64_t windows[][2] = {{5, 3}, {0, 0}, {-1, 7}, {20, -1}, {300, 300}, {70, 0}};
    for (size_t n = 0; n < sizeof windows / sizeof windows[0]; n++) {
        fb_case c = plain(2, 2, 150, 140, 16, 20);
        c.p.use_window = 1;
        c.p.window_left = windows[n][0];
        c.p.window_right = windows[n][1];
        c.p.align = n % 2 ? SDPA_ALIGN_BOTTOM_RIGHT : SDPA_ALIGN_TOP_LEFT;
        c.seed = 70 + n;
        char name[64];
        snprintf(name, sizeof name, "window (%lld, %lld)", (long long)windows[n][0],
                 (long long)windows[n][1]);
        CHECK_MSG(run_case(name, &c), "%s", name);
    }
}

static void test_masks_softcap_alibi(void) {
    fb_case c = plain(2, 2, 70, 90, 16, 16);
    c.mask = MASK_BOOL;
    CHECK(run_case("bool mask, every 4th row hidden", &c));
    c.mask = MASK_ADD;
    c.d.B = 2;
    CHECK(run_case("additive f32 mask, B=2", &c));
    c = plain(4, 2, 65, 65, 32, 32);
    c.mask = MASK_ADD_F16_BCAST;
    c.p.causal = 1;
    CHECK(run_case("additive f16 mask (1,1,Lq,Lk), causal", &c));
    c = plain(2, 2, 80, 100, 32, 32);
    c.p.softcap = 3.0f;
    CHECK(run_case("softcap 3", &c));
    c.p.softcap = 0.0f;
    c.alibi = 1;
    CHECK(run_case("ALiBi", &c));
    c.p.softcap = 5.0f;
    c.p.causal = 1;
    c.p.align = SDPA_ALIGN_BOTTOM_RIGHT;
    c.mask = MASK_BOOL;
    CHECK(run_case("softcap ALiBi bool mask causal BR", &c));
}

static void test_heads(void) {
    static const int64_t heads[][2] = {{6, 2}, {6, 1}, {8, 2}, {12, 4}};
    for (size_t n = 0; n < sizeof heads / sizeof heads[0]; n++) {
        fb_case c = plain(heads[n][0], heads[n][1], 67, 75, 16, 8);
        c.p.causal = n % 2;
        c.seed = 90 + n;
        char name[64];
        snprintf(name, sizeof name, "Hq=%lld Hkv=%lld causal=%d", (long long)heads[n][0],
                 (long long)heads[n][1], c.p.causal);
        CHECK_MSG(run_case(name, &c), "%s", name);
    }
}

static void test_layouts_and_storage(void) {
    fb_case c = plain(4, 2, 66, 70, 20, 12);
    c.layout = TU_BLHD;
    CHECK(run_case("(B, L, H, D)", &c));
    c.pad = 5;
    c.offset = 3;
    c.layout = TU_BHLD;
    CHECK(run_case("row stride D + 5, offset 3", &c));
    c.layout = TU_BLHD;
    c.dt = SDPA_F16;
    CHECK(run_case("f16, (B, L, H, D) padded", &c));
    c.dt = SDPA_BF16;
    c.p.causal = 1;
    CHECK(run_case("bf16 causal, (B, L, H, D) padded", &c));
    c = plain(2, 2, 130, 129, 64, 64);
    c.dt = SDPA_F16;
    c.mask = MASK_ADD;
    CHECK(run_case("f16, additive mask, D=64", &c));
}

static void test_dropout(void) {
    fb_case c = plain(4, 2, 70, 80, 16, 24);
    c.p.dropout_p = 0.2f;
    c.p.dropout_seed = 42;
    c.p.dropout_offset = 3;
    CHECK(run_case("dropout 0.2, GQA", &c));
    c.p.causal = 1;
    c.p.dropout_p = 0.5f;
    c.mask = MASK_BOOL;
    c.p.softcap = 4.0f;
    c.dt = SDPA_BF16;
    CHECK(run_case("dropout 0.5, causal, mask, softcap, bf16", &c));
    c = plain(2, 2, 3, 131, 7, 9);
    c.p.dropout_p = 0.3f;
    c.p.dropout_seed = 9;
    c.p.align = SDPA_ALIGN_BOTTOM_RIGHT;
    c.p.use_window = 1;
    c.p.window_left = 70;
    c.p.window_right = 0;
    CHECK(run_case("dropout 0.3, window (70, 0) BR, Lq=3", &c));
}

/* The schedule of two kinds of task (budget 0: no dQ partials), which problems too large for
 * the budget take: the features that change the tiles' work, by the rule at every level. */
static void test_two_kinds(void) {
    fb_case c = plain(4, 2, 130, 129, 24, 20);
    c.tuned = 1;
    CHECK(run_case("two kinds: GQA, lengths around the blocks", &c));
    c.p.causal = 1;
    c.p.align = SDPA_ALIGN_BOTTOM_RIGHT;
    c.mask = MASK_BOOL;
    c.alibi = 1;
    c.p.softcap = 5.0f;
    CHECK(run_case("two kinds: causal BR, bool mask, ALiBi, softcap", &c));
    c = plain(2, 2, 150, 140, 16, 20);
    c.tuned = 1;
    c.p.use_window = 1;
    c.p.window_left = 20;
    c.p.window_right = 3;
    c.mask = MASK_ADD;
    c.dt = SDPA_F16;
    CHECK(run_case("two kinds: window (20, 3), additive mask, f16", &c));
    c = plain(2, 1, 70, 75, 16, 8);
    c.tuned = 1;
    c.p.causal = 1;
    c.mask = MASK_BOOL;
    c.nan_q = 3;
    c.nan_dout = 68;
    c.p.dropout_p = 0.4f;
    c.p.dropout_seed = 11;
    CHECK(run_case("two kinds: NaN rows, causal, mask, dropout", &c));
}

/* ---- NaN ------------------------------------------------------------------------------------- */

/* NaN and Inf in K and V of keys no row may see reach no gradient: every gradient is bitwise
 * the clean run's. Then key 77 poisoned where rows 77..114 see it (causal, window 37): exactly
 * those rows' dq and the dk, dv of the keys they see (40..114) are NaN, everything else bitwise
 * the clean run's. At every level, in the one-pass schedule (one and three key blocks at a
 * time) and in the two-kind one. */
static void test_hidden_nan(void) {
    enum { L = 150, LK = 160, D = 24 };
    for (int variant = 0; variant < 6; variant++) {
        fb_case c = plain(4, 2, L, LK, D, D);
        c.p.causal = 1;
        c.p.use_window = 1;
        c.p.window_left = 37;
        c.seed = 123;
        /* variants 2, 3: budget 0, two kinds of task; 4, 5: key blocks 3 at a time */
        c.tuned = variant >= 2;
        c.tuning.dq_budget = variant >= 4 ? (size_t)32 << 20 : 0;
        c.tuning.key_group = variant >= 4 ? 3 : 0;
        fb_tensors clean, dirty;
        make(&c, &clean);
        make(&c, &dirty);
        tu_tensor mask = tu_alloc(SDPA_BOOL, 1, 1, L, LK, TU_BHLD, 0, 0);
        for (int i = 0; i < L; i++)
            for (int j = 0; j < LK; j++)
                tu_set(&mask.t, 0, 0, i, j, j % 7 != 3);
        clean.p.mask = dirty.p.mask = &mask.t;
        /* keys 150..159 are hidden from every row by the causal rule, keys 7n + 3 by the mask;
         * with an odd variant key 77 (7 * 10 + 7, not masked) is poisoned too */
        for (int h = 0; h < 2; h++)
            for (int dd = 0; dd < D; dd++) {
                for (int j = 3; j < LK; j += 7) {
                    tu_set(&dirty.k.t, 0, h, j, dd, dd % 2 ? NAN : INFINITY);
                    tu_set(&dirty.v.t, 0, h, j, dd, dd % 3 ? -INFINITY : NAN);
                }
                for (int j = L; j < LK; j++) {
                    tu_set(&dirty.k.t, 0, h, j, dd, NAN);
                    tu_set(&dirty.v.t, 0, h, j, dd, NAN);
                }
                if (variant % 2 == 1) {
                    tu_set(&dirty.k.t, 0, h, 77, dd, NAN);
                    tu_set(&dirty.v.t, 0, h, 77, dd, NAN);
                }
            }
        sdpa_ctx *gen = tu_ctx(1, SDPA_ISA_GENERIC);
        CHECK(tu_golden_forward(gen, &clean.q.t, &clean.k.t, &clean.v.t, &clean.p, &clean.o.t,
                                &clean.lse.t) == SDPA_OK);
        CHECK(tu_golden_forward(gen, &dirty.q.t, &dirty.k.t, &dirty.v.t, &dirty.p, &dirty.o.t,
                                &dirty.lse.t) == SDPA_OK);
        sdpa_ctx_destroy(gen);
        tu_impl impls[TU_MAX_IMPLS];
        const int n_impls = tu_impls(impls);
        for (int n = 0; n < n_impls; n++) {
            if (!runs_backward(impls, n_impls, n))
                continue;
            sdpa_ctx *ctx = tu_ctx(3, impls[n].level);
            clean.impl = dirty.impl = impls[n].impl;
            CHECK_INT_EQ(backward(ctx, &clean), SDPA_OK);
            CHECK_INT_EQ(backward(ctx, &dirty), SDPA_OK);
            sdpa_ctx_destroy(ctx);
            int64_t differ = 0, not_nan = 0;
            for (int h = 0; h < 4; h++)
                for (int i = 0; i < L; i++) {
                    const int sees77 = variant % 2 == 1 && i >= 77 && i <= 77 + 37;
                    for (int dd = 0; dd < D; dd++) {
                        const float a = (float)tu_get(&clean.dq.t, 0, h, i, dd);
                        const float b = (float)tu_get(&dirty.dq.t, 0, h, i, dd);
                        if (sees77)
                            not_nan += !isnan(b);
                        else
                            differ += memcmp(&a, &b, sizeof a) != 0;
                    }
                }
            for (int hk = 0; hk < 2; hk++)
                for (int j = 0; j < LK; j++) {
                    /* seen by a NaN row, and not hidden from it by the mask */
                    const int nan_key = variant % 2 == 1 && j >= 40 && j <= 114 && j % 7 != 3;
                    for (int dd = 0; dd < D; dd++) {
                        const tu_tensor *g[4] = {&clean.dk, &dirty.dk, &clean.dv, &dirty.dv};
                        for (int x = 0; x < 2; x++) {
                            const float a = (float)tu_get(&g[2 * x]->t, 0, hk, j, dd);
                            const float b = (float)tu_get(&g[2 * x + 1]->t, 0, hk, j, dd);
                            if (nan_key)
                                not_nan += !isnan(b);
                            else
                                differ += memcmp(&a, &b, sizeof a) != 0;
                        }
                    }
                }
            CHECK_MSG(differ == 0, "[%s] variant %d: %lld gradients differ from the clean run",
                      impls[n].name, variant, (long long)differ);
            CHECK_MSG(not_nan == 0, "[%s] variant %d: %lld gradients that see key 77 not NaN",
                      impls[n].name, variant, (long long)not_nan);
        }
        tu_free(&mask);
        release(&clean);
        release(&dirty);
    }
}

/* NaN in a row of q (a NaN row) and in one element of dout, with hidden pairs in the same
 * tiles (causal, a mask) and dropout: the gradients are NaN exactly where the reference's are
 * (the rule compares the positions of non-finite values): a NaN row's dq and the dk, dv of the
 * keys it sees, dropped ones included; dout's NaN in column 1 of those keys' dv and in the
 * row's dq and their dk; nothing of either in keys the row cannot see. */
static void test_nan_rows(void) {
    fb_case c = plain(2, 1, 70, 75, 16, 8);
    c.p.causal = 1;
    c.mask = MASK_BOOL;
    c.nan_q = 40;
    CHECK(run_case("NaN in q row 39, causal, bool mask", &c));
    c.nan_q = 0;
    c.nan_dout = 68;
    CHECK(run_case("NaN in dout row 67, causal, bool mask", &c));
    c.p.dropout_p = 0.4f;
    c.p.dropout_seed = 11;
    CHECK(run_case("NaN in dout row 67, causal, mask, dropout", &c));
    c.nan_q = 3;
    CHECK(run_case("NaN in q row 2 and dout row 67, dropout", &c));
}

/* No memory: SDPA_ERR_NOMEM naming the flash backward, nothing written, nothing leaked. */
static void test_nomem(void) {
    tu_impl impls[TU_MAX_IMPLS];
    const int n_impls = tu_impls(impls);
    fb_case c = plain(2, 2, 40, 50, 8, 8);
    fb_tensors t;
    make(&c, &t);
    sdpa_ctx *gen = tu_ctx(1, SDPA_ISA_GENERIC);
    CHECK(tu_golden_forward(gen, &t.q.t, &t.k.t, &t.v.t, &t.p, &t.o.t, &t.lse.t) == SDPA_OK);
    sdpa_ctx_destroy(gen);
    for (int n = 0; n < n_impls; n++) {
        if (!runs_backward(impls, n_impls, n))
            continue;
        tu_failing_alloc fa = {0};
        sdpa_ctx_params cp = {0};
        cp.n_threads = 2;
        cp.max_isa = impls[n].level;
        cp.allocator = tu_failing_allocator(&fa);
        sdpa_ctx *ctx = NULL;
        CHECK_INT_EQ(sdpa_ctx_create(&cp, &ctx), SDPA_OK);
        tu_fill_canary(&t.dq);
        tu_fill_canary(&t.dk);
        tu_fill_canary(&t.dv);
        const long before = fa.outstanding;
        fa.fail = 1;
        CHECK_INT_EQ(backward(ctx, &t), SDPA_ERR_NOMEM);
        CHECK_STR_CONTAINS(sdpa_ctx_last_error(ctx), "flash backward");
        CHECK(tu_is_canary(&t.dq) && tu_is_canary(&t.dk) && tu_is_canary(&t.dv));
        fa.fail = 0;
        CHECK_INT_EQ(backward(ctx, &t), SDPA_OK);
        CHECK_INT_EQ(fa.outstanding, before);
        sdpa_ctx_destroy(ctx);
    }
    release(&t);
}

int main(int argc, char **argv) {
    tu_report_impls();
    return CHECK_RUN(argc, argv, CASE(test_exp_lse), CASE(test_shapes),
                     CASE(test_causal_and_windows), CASE(test_masks_softcap_alibi),
                     CASE(test_heads), CASE(test_layouts_and_storage), CASE(test_dropout),
                     CASE(test_two_kinds), CASE(test_hidden_nan), CASE(test_nan_rows),
                     CASE(test_nomem));
}
