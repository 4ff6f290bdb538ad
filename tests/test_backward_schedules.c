/*
 * test_backward_schedules.c — the tiled backward's schedules (src/attn/flash_backward_plan.c),
 * reached through the driver's internal tuning hook (sdpa__flash_backward_tuned in
 * flash_backward.c), at every ISA level the
 * CPU has: bitwise identical results for 1 to 16 threads and on repeated calls; the one-pass
 * schedule in several waves (bitwise the one-wave result), with forced chunk counts, and with
 * several key blocks to a step (bitwise one at a time), and the two kinds of task it falls back
 * to, each by testing.md's gradient rule (backward_fixture.h) and for 1 to 16 threads; the two
 * schedules bitwise equal; Q and dO rows widened once per task bitwise as widened per tile;
 * the budget's growth for the workers, the waves it gives, and partials the allocator refuses.
 * Its determinism cases also run under ThreadSanitizer (tests/tsan/run_tsan.sh).
 */
#include "backward_fixture.h"

/* ---- determinism and the schedules ---------------------------------------------------------- */

/* The gradients of t at one level for 1, 2, 3, 4, 7 and 16 threads, two calls each: all the
 * same bytes, which are left in want[] (the caller frees them). */
static void same_bytes(const tu_impl *impl, fb_tensors *t, const char *what, void *want[3]) {
    static const int threads[] = {1, 2, 3, 4, 7, 16};
    tu_tensor *got[3] = {&t->dq, &t->dk, &t->dv};
    for (int x = 0; x < 3; x++)
        want[x] = NULL;
    t->impl = impl->impl;
    for (size_t th = 0; th < sizeof threads / sizeof threads[0]; th++) {
        sdpa_ctx *ctx = tu_ctx(threads[th], impl->level);
        for (int rep = 0; rep < 2; rep++) {
            CHECK_INT_EQ(backward(ctx, t), SDPA_OK);
            for (int x = 0; x < 3; x++) {
                if (want[x] == NULL) {
                    want[x] = malloc(got[x]->bytes);
                    memcpy(want[x], got[x]->buf, got[x]->bytes);
                }
                CHECK_MSG(memcmp(want[x], got[x]->buf, got[x]->bytes) == 0,
                          "[%s] %s, %d threads, call %d: gradient %d differs", impl->name, what,
                          threads[th], rep + 1, x);
            }
        }
        sdpa_ctx_destroy(ctx);
    }
    printf("    determinism [%s] %s: 1..16 threads, same bytes\n", impl->name, what);
}

static void free3(void *x[3]) {
    for (int n = 0; n < 3; n++)
        free(x[n]);
}

/* The gradients got[] (of t's sizes) bitwise want[]: else a failure naming `what` and `than`,
 * what they were to equal. */
static void same_as(const tu_impl *impl, const fb_tensors *t, void *want[3], void *got[3],
                    const char *what, const char *than) {
    const size_t bytes[3] = {t->dq.bytes, t->dk.bytes, t->dv.bytes};
    for (int x = 0; x < 3; x++)
        CHECK_MSG(memcmp(want[x], got[x], bytes[x]) == 0, "[%s] %s: gradient %d differs from %s",
                  impl->name, what, x, than);
}

/* The case's tensors, with the golden forward's out and LSE. */
static void make_with_forward(const fb_case *c, fb_tensors *t) {
    make(c, t);
    sdpa_ctx *gen = tu_ctx(1, SDPA_ISA_GENERIC);
    CHECK(tu_golden_forward(gen, &t->q.t, &t->k.t, &t->v.t, &t->p, &t->o.t, &t->lse.t) == SDPA_OK);
    sdpa_ctx_destroy(gen);
}

/* Bitwise the same gradients for 1, 2, 3, 4, 7 and 16 threads and on repeated calls, per level,
 * on problems with several chunks of keys per (b, kv head) and every feature that changes the
 * tiles' work, in the one-pass schedule and in the two-kind one (budget 0). */
static void test_deterministic(void) {
    for (int variant = 0; variant < 4; variant++) {
        fb_case c = plain(6, 2, 200, 190, 40, 24);
        c.d.B = 2;
        c.p.causal = 1;
        c.p.align = SDPA_ALIGN_BOTTOM_RIGHT;
        if (variant % 2 == 1) {
            c.dt = SDPA_BF16;
            c.layout = TU_BLHD;
            c.mask = MASK_ADD;
            c.alibi = 1;
            c.p.softcap = 6.0f;
            c.p.dropout_p = 0.25f;
            c.p.dropout_seed = 5;
        }
        c.tuned = variant >= 2;
        fb_tensors t;
        make_with_forward(&c, &t);
        tu_impl impls[TU_MAX_IMPLS];
        const int n_impls = tu_impls(impls);
        for (int n = 0; n < n_impls; n++) {
            if (!impls[n].runs)
                printf("    determinism [%s] skipped: the CPU lacks %s\n", impls[n].name,
                       impls[n].missing);
            if (!runs_backward(impls, n_impls, n))
                continue;
            char what[64];
            snprintf(what, sizeof what, "variant %d%s", variant % 2,
                     c.tuned ? ", two kinds of task" : "");
            void *want[3];
            same_bytes(&impls[n], &t, what, want);
            free3(want);
        }
        release(&t);
    }
}

/* The one-pass schedule with its dQ partials bounded (the internal hook): 4 pairs (b, kv head)
 * of 3 chunks each, run in waves of 1, 2 and 3 pairs, give bitwise the gradients of one wave
 * (waves change no sum), for any thread count; bounds too small for a pair's 3 chunks give
 * two kinds of task, which keep the 3 chunks' sums (the chunks come from the problem, not the
 * budget): again the same bytes, and by the gradient rule. Then one pair in 8 chunks (causal:
 * balanced by the rows that see each block; one of them empty), in 4 and in 2 (forced), each
 * in one pass by the gradient rule and as two kinds of task bitwise the same. */
static void test_deterministic_waves(void) {
    fb_case c = plain(6, 2, 200, 190, 40, 24);
    c.d.B = 2;
    c.p.causal = 1;
    c.p.align = SDPA_ALIGN_BOTTOM_RIGHT;
    /* A pair's key blocks (causal, bottom-right, Lq - Lk = 10) are seen by rows 10.., 74.. and
     * 138.. of 200: its 3 chunks' partials hold 3 heads x (190 + 126 + 62) rows of 40 floats
     * rounded up to 48. Budgets below that: two kinds of task. */
    const size_t pair = 3 * (190 + 126 + 62) * 48 * sizeof(float);
    const size_t whole[] = {pair, 2 * pair, 3 * pair};
    const size_t less[] = {3 * (190 + 126) * 48 * sizeof(float), pair / 2};
    fb_tensors t;
    make_with_forward(&c, &t);
    tu_impl impls[TU_MAX_IMPLS];
    const int n_impls = tu_impls(impls);
    for (int n = 0; n < n_impls; n++) {
        if (!runs_backward(impls, n_impls, n))
            continue;
        void *want[3], *got[3];
        t.tuned = 0;
        same_bytes(&impls[n], &t, "one wave", want);
        for (size_t w = 0; w < sizeof whole / sizeof whole[0]; w++) {
            char what[64];
            snprintf(what, sizeof what, "waves of %zu pair(s)", w + 1);
            t.tuned = 1;
            t.tuning.dq_budget = whole[w];
            same_bytes(&impls[n], &t, what, got);
            same_as(&impls[n], &t, want, got, what, "one wave's");
            free3(got);
        }
        for (size_t w = 0; w < sizeof less / sizeof less[0]; w++) {
            char what[64];
            snprintf(what, sizeof what, "partials of %zu bytes", less[w]);
            t.tuned = 1;
            t.tuning.dq_budget = less[w];
            same_bytes(&impls[n], &t, what, got);
            same_as(&impls[n], &t, want, got, what, "one wave's");
            free3(got);
        }
        free3(want);
    }
    release(&t);
    for (size_t w = 0; w < sizeof less / sizeof less[0]; w++) {
        c.tuned = 1;
        c.tuning.dq_budget = less[w];
        char name[64];
        snprintf(name, sizeof name, "causal BR, partials of %zu bytes", less[w]);
        CHECK_MSG(run_case(name, &c), "%s", name);
    }

    /* one pair, 10 key blocks: 8, 4 and 2 chunks in one pass by the gradient rule, and as two
     * kinds of task bitwise the same */
    fb_case one = plain(2, 1, 600, 600, 16, 16);
    one.p.causal = 1;
    one.seed = 7;
    one.tuned = 1;
    for (int chunks = 8; chunks >= 2; chunks /= 2) {
        one.tuning.chunks = chunks;
        one.tuning.dq_budget = (size_t)32 << 20;
        char name[64];
        snprintf(name, sizeof name, "one pair, causal 600, %d chunks", chunks);
        CHECK_MSG(run_case(name, &one), "%s", name);
        fb_tensors u;
        make_with_forward(&one, &u);
        for (int n = 0; n < n_impls; n++) {
            if (!runs_backward(impls, n_impls, n))
                continue;
            void *want[3], *got[3];
            u.tuning.dq_budget = (size_t)32 << 20;
            same_bytes(&impls[n], &u, name, want);
            u.tuning.dq_budget = 0;
            same_bytes(&impls[n], &u, name, got);
            same_as(&impls[n], &u, want, got, "two kinds", "the one pass's");
            free3(want);
            free3(got);
        }
        release(&u);
    }
}

/* bf16 storage with every feature that changes a tile's work: an additive mask, ALiBi,
 * softcap, dropout and a left window of 150. */
static void every_feature(fb_case *c) {
    c->dt = SDPA_BF16;
    c->mask = MASK_ADD;
    c->alibi = 1;
    c->p.softcap = 6.0f;
    c->p.dropout_p = 0.25f;
    c->p.dropout_seed = 5;
    c->p.use_window = 1;
    c->p.window_left = 150;
}

/* Several key blocks to a step of a chunk (key_group 2 to 4, which the backward takes for
 * itself where a sweep over a pair's query rows would leave the cache): bitwise the gradients
 * of one block at a time, for 1 to 16 threads. Causal with 7 key blocks per pair in 4 chunks
 * (groups cut short by the chunks' ends), then with a window, a mask, ALiBi, softcap, dropout
 * and bf16; then 16 pairs of one chunk each (7 blocks as 4 + 3, 3 + 3 + 1, 2 + 2 + 2 + 1). */
static void test_deterministic_key_groups(void) {
    for (int variant = 0; variant < 3; variant++) {
        fb_case c = plain(6, 2, 200, 390, 40, 24);
        if (variant == 2)
            c = plain(8, 8, 70, 390, 24, 40);
        c.d.B = 2;
        c.p.causal = 1;
        c.p.align = SDPA_ALIGN_BOTTOM_RIGHT;
        if (variant == 1)
            every_feature(&c);
        c.tuned = 1;
        c.tuning.dq_budget = (size_t)32 << 20; /* sdpa__flash_backward's */
        fb_tensors t;
        make_with_forward(&c, &t);
        tu_impl impls[TU_MAX_IMPLS];
        const int n_impls = tu_impls(impls);
        for (int n = 0; n < n_impls; n++) {
            if (!runs_backward(impls, n_impls, n))
                continue;
            void *want[3], *got[3];
            char what[64];
            t.tuning.key_group = 1;
            snprintf(what, sizeof what, "variant %d, key blocks one at a time", variant);
            same_bytes(&impls[n], &t, what, want);
            for (int g = 2; g <= 4; g++) {
                t.tuning.key_group = g;
                snprintf(what, sizeof what, "variant %d, key blocks %d at a time", variant, g);
                same_bytes(&impls[n], &t, what, got);
                same_as(&impls[n], &t, want, got, what, "one block at a time's");
                free3(got);
            }
            free3(want);
        }
        release(&t);
    }
}

/* q and dout of t moved into f32 buffers with a feature stride of 2 (same values), which the
 * backward cannot read in place. */
static void feature_stride_2(tu_tensor *x) {
    const sdpa_tensor *a = &x->t;
    tu_tensor y =
        tu_alloc(SDPA_F32, a->shape[0], a->shape[1], a->shape[2], 2 * a->shape[3], TU_BHLD, 0, 0);
    y.t.shape[3] = a->shape[3];
    y.t.stride[3] = 2;
    tu_copy(&y.t, a);
    tu_free(x);
    *x = y;
}

/* A context of `workers` threads at impl's level whose allocator is fa (it notes the largest
 * request, and refuses as fa says). */
static sdpa_ctx *counting_ctx(const tu_impl *impl, int workers, tu_failing_alloc *fa) {
    sdpa_ctx_params cp = {0};
    cp.n_threads = workers;
    cp.max_isa = impl->level;
    cp.allocator = tu_failing_allocator(fa);
    sdpa_ctx *ctx = NULL;
    CHECK_INT_EQ(sdpa_ctx_create(&cp, &ctx), SDPA_OK);
    return ctx;
}

/* The same, refusing every request from now on. */
static sdpa_ctx *refusing_ctx(const tu_impl *impl, int workers, tu_failing_alloc *fa) {
    sdpa_ctx *ctx = counting_ctx(impl, workers, fa);
    fa->fail = 1;
    return ctx;
}

/* Whether the backward of f16 Hq=8 Hkv=1 Lq=4096 Lk D=72 with `workers` threads takes the
 * widened rows by the rule: its largest request, refused (nothing runs), is larger with the
 * rule than without them. 8 chunks (the hook's, with a budget that holds their partials) of
 * Lk / 512 steps (key blocks one at a time); the rows take 18.9 MB a worker. */
static int takes_widened_rows(const tu_impl *impl, int64_t lk, int workers) {
    fb_case c = plain(8, 1, 4096, lk, 72, 72);
    c.dt = SDPA_F16;
    fb_tensors t;
    make(&c, &t);
    t.tuned = 1;
    t.tuning.dq_budget = (size_t)1 << 30;
    t.tuning.chunks = 8;
    t.tuning.key_group = 1;
    t.impl = impl->impl;
    tu_failing_alloc fa = {0};
    sdpa_ctx *ctx = refusing_ctx(impl, workers, &fa);
    size_t largest[2];
    for (int wide = -1; wide <= 0; wide++) {
        t.tuning.wide = wide;
        fa.largest = 0;
        CHECK_INT_EQ(backward(ctx, &t), SDPA_ERR_NOMEM);
        largest[wide + 1] = fa.largest;
    }
    sdpa_ctx_destroy(ctx);
    release(&t);
    return largest[1] > largest[0];
}

/* The one-pass schedule's tasks keep their rows of Q and dO widened where those cannot be read
 * in place (flash_backward_plan.c, WIDE_MAX_BYTES): the gradients are bitwise those without, for 1
 * to 16 threads, and by the gradient rule. Variants: 0, f16 with GQA (3 heads a group), causal
 * bottom-right with Lq < Lk (tiles starting inside a query block, chunks of different rows);
 * 1, bf16 with a window, mask, ALiBi, softcap, dropout and two key blocks to a step; 2, f32 q
 * and dout with a feature stride of 2, 4 heads a group, Lq > Lk (fully masked rows) and a last
 * query block of 2 rows; 3 and 4, as 0 in f32 with only dout, then only q, strided (the other
 * read in place); 5, f16, causal top-left with a left window of 40 at L = 512 (chunks whose
 * rows start past the first query block). Then the rule: a problem of two steps per chunk takes
 * the widened rows by itself (its largest request grows), unless they pass WIDE_MAX_BYTES (the
 * same problem with 2 workers) or a chunk's keys are one step, and f32 read in place never
 * does; and an allocator that refuses them gives the same bits without them. */
static void test_widened_rows(void) {
    tu_impl impls[TU_MAX_IMPLS];
    const int n_impls = tu_impls(impls);
    for (int variant = 0; variant < 6; variant++) {
        fb_case c = variant == 2   ? plain(8, 2, 130, 100, 24, 40)
                    : variant == 5 ? plain(4, 2, 512, 512, 24, 24)
                                   : plain(6, 2, 200, 390, 40, 24);
        c.d.B = variant == 5 ? 1 : 2;
        c.p.causal = 1;
        c.p.align = variant == 5 ? SDPA_ALIGN_TOP_LEFT : SDPA_ALIGN_BOTTOM_RIGHT;
        c.dt = variant == 0 || variant == 5 ? SDPA_F16 : variant == 1 ? SDPA_BF16 : SDPA_F32;
        if (variant == 5) {
            c.p.use_window = 1;
            c.p.window_left = 40;
            c.p.window_right = 0;
        }
        if (variant == 1)
            every_feature(&c);
        c.tuned = 1;
        c.tuning.dq_budget = (size_t)32 << 20;
        c.tuning.key_group = variant == 1 ? 2 : 0;
        if (variant < 2 || variant == 5) {
            c.tuning.wide = 1;
            char name[64];
            snprintf(name, sizeof name, "widened rows, variant %d", variant);
            CHECK_MSG(run_case(name, &c), "%s", name);
        }
        fb_tensors t;
        make_with_forward(&c, &t);
        if (variant == 2 || variant == 4)
            feature_stride_2(&t.q);
        if (variant == 2 || variant == 3)
            feature_stride_2(&t.dout);
        for (int n = 0; n < n_impls; n++) {
            if (!runs_backward(impls, n_impls, n))
                continue;
            void *want[3], *got[3];
            char what[64];
            t.tuning.wide = -1;
            snprintf(what, sizeof what, "variant %d, rows widened per tile", variant);
            same_bytes(&impls[n], &t, what, want);
            for (int wide = 0; wide <= 1; wide++) {
                t.tuning.wide = wide;
                snprintf(what, sizeof what, "variant %d, rows widened once (%s)", variant,
                         wide ? "always" : "by the rule");
                same_bytes(&impls[n], &t, what, got);
                same_as(&impls[n], &t, want, got, what, "the rows widened per tile's");
                free3(got);
            }
            free3(want);
        }
        release(&t);
    }

    /* the rule: two steps a chunk, not one; within WIDE_MAX_BYTES (1 worker), not past it (2) */
    for (int n = 0; n < n_impls; n++) {
        if (!runs_backward(impls, n_impls, n))
            continue;
        CHECK_MSG(takes_widened_rows(&impls[n], 1024, 1), "[%s] two steps, 1 worker: not widened",
                  impls[n].name);
        CHECK_MSG(!takes_widened_rows(&impls[n], 1024, 2),
                  "[%s] two steps, 2 workers (37.7 MB): widened", impls[n].name);
        CHECK_MSG(!takes_widened_rows(&impls[n], 512, 1), "[%s] one step, 1 worker: widened",
                  impls[n].name);
    }

    /* the allocator's refusal, and f32 read in place: one pair, 8 chunks of 2 or 3 key blocks */
    for (int half = 0; half <= 1; half++) {
        fb_case c = plain(2, 1, 1280, 1280, 16, 16);
        c.dt = half ? SDPA_F16 : SDPA_F32;
        c.seed = 9;
        fb_tensors t;
        make_with_forward(&c, &t);
        t.tuned = 1;
        t.tuning.dq_budget = (size_t)32 << 20;
        for (int n = 0; n < n_impls; n++) {
            if (!runs_backward(impls, n_impls, n))
                continue;
            t.impl = impls[n].impl;
            tu_failing_alloc fa = {0};
            sdpa_ctx *ctx = counting_ctx(&impls[n], 2, &fa);
            size_t largest[2];
            void *want[3];
            tu_tensor *got[3] = {&t.dq, &t.dk, &t.dv};
            for (int wide = -1; wide <= 0; wide++) {
                t.tuning.wide = wide;
                fa.largest = 0;
                CHECK_INT_EQ(backward(ctx, &t), SDPA_OK);
                largest[wide + 1] = fa.largest;
                for (int x = 0; x < 3 && wide < 0; x++) {
                    want[x] = malloc(got[x]->bytes);
                    memcpy(want[x], got[x]->buf, got[x]->bytes);
                }
            }
            CHECK_MSG(half ? largest[1] > largest[0] : largest[1] == largest[0],
                      "[%s] %s: the largest request %zu with the rule, %zu without the widened "
                      "rows",
                      impls[n].name, half ? "f16" : "f32", largest[1], largest[0]);
            if (half) { /* refused: the same bits without them */
                fa.limit = largest[0];
                fa.refused = 0;
                tu_fill_canary(&t.dq);
                CHECK_INT_EQ(backward(ctx, &t), SDPA_OK);
                CHECK_INT_EQ(fa.refused, 1);
                for (int x = 0; x < 3; x++)
                    CHECK_MSG(memcmp(want[x], got[x]->buf, got[x]->bytes) == 0,
                              "[%s] widened rows refused: gradient %d differs", impls[n].name, x);
                fa.limit = 0;
            }
            free3(want);
            sdpa_ctx_destroy(ctx);
            CHECK_INT_EQ(fa.outstanding, 0);
        }
        release(&t);
    }
}

/* The gradients of t at one level on `threads` threads, one call: compared with want[] where it
 * holds them, else copied there (the caller frees them). */
static void bytes_on(const tu_impl *impl, fb_tensors *t, int threads, const char *what,
                     void *want[3]) {
    tu_tensor *got[3] = {&t->dq, &t->dk, &t->dv};
    t->impl = impl->impl;
    sdpa_ctx *ctx = tu_ctx(threads, impl->level);
    CHECK_INT_EQ(backward(ctx, t), SDPA_OK);
    sdpa_ctx_destroy(ctx);
    for (int x = 0; x < 3; x++) {
        if (want[x] == NULL) {
            want[x] = malloc(got[x]->bytes);
            memcpy(want[x], got[x]->buf, got[x]->bytes);
        } else {
            CHECK_MSG(memcmp(want[x], got[x]->buf, got[x]->bytes) == 0,
                      "[%s] %s, %d threads: gradient %d differs from the first run's", impl->name,
                      what, threads, x);
        }
    }
}

/* The case of variant v of test_schedules_agree, its tensors made and its forward run. */
static void schedule_case(int v, fb_tensors *t) {
    fb_case c = plain(6, 2, 200, 150, 40, 24);
    c.p.causal = 1;
    c.p.align = SDPA_ALIGN_BOTTOM_RIGHT;
    if (v == 1) {
        c = plain(3, 1, 150, 330, 24, 40);
        c.p.causal = 1;
        c.dt = SDPA_F16;
    } else if (v == 2) {
        c = plain(4, 2, 200, 390, 40, 24);
        c.d.B = 2;
        c.p.causal = 1;
        c.p.align = SDPA_ALIGN_BOTTOM_RIGHT;
        every_feature(&c);
    } else if (v >= 3 && v <= 5) {
        c = plain(4, 2, 260, 257, 24, 24);
        c.p.use_window = 1;
        c.p.window_left = 40;
        c.p.window_right = 20;
        c.mask = v == 3 ? MASK_BOOL : MASK_NONE;
        c.nan_q = v == 3 ? 70 : 0;
        c.nan_dout = v == 3 ? 130 : 0;
        c.p.softcap = v == 4 ? 5.0f : 0.0f;
    } else if (v == 6) {
        c = plain(8, 1, 300, 300, 16, 16);
        c.p.causal = 1;
    } else if (v == 7) {
        c = plain(2, 1, 300, 300, 16, 16);
        c.p.use_window = 1;
        c.p.window_left = 200;
        c.p.window_right = 200;
        c.p.softcap = 5.0f;
    }
    c.seed = 40 + (uint64_t)v;
    make(&c, t);
    const tu_dims d = c.d;
    for (int64_t h = 0; h < d.Hkv; h++)
        for (int64_t j = 0; j < d.Lk; j++)
            for (int64_t x = 0; x < d.Dk; x++) {
                if (v == 4 && (j == 100 || j == 201 || j == 256) && x % 5 == 0)
                    tu_set(&t->k.t, 0, h, j, x, j == 201 ? NAN : INFINITY);
                if (v == 5) /* f32 subnormals: dQ's terms round to +-0 and the smallest */
                    tu_set(&t->k.t, 0, h, j, x, tu_get(&t->k.t, 0, h, j, x) * 1e-43);
                if (v == 7 && (j == 10 || j == 250) && x == 0)
                    tu_set(&t->k.t, 0, h, j, x, INFINITY);
            }
    sdpa_ctx *gen = tu_ctx(1, SDPA_ISA_GENERIC);
    CHECK(tu_golden_forward(gen, &t->q.t, &t->k.t, &t->v.t, &t->p, &t->o.t, &t->lse.t) == SDPA_OK);
    sdpa_ctx_destroy(gen);
}

/* The one-pass schedule and the two kinds of task sum dQ in the same order (flash_backward.c), so
 * the choice between them may follow the workers and the memory: for each problem and chunk count
 * (the rule's, and 1, 3 and 8 forced), the one-pass schedule (a budget that holds every partial; 3
 * threads), two kinds of task (budget 0; 2 threads), and the budget grown for the workers (budget
 * 0 and `adapt`: the one pass where waves of a pair a worker keep them busy, two kinds elsewhere;
 * 1, 2, 3 and 16 threads, which cross from one to the other) give bitwise the same gradients at
 * every level; with the rule's chunks, sdpa_backward's too (2 and 3 threads). The problems: 0,
 * causal bottom-right with Lq > Lk (rows that see nothing, tiles that start inside key blocks); 1,
 * f16, causal top-left with Lq < Lk, 3 query heads to one kv head; 2, bf16 with every feature; 3,
 * a window both sides, a bool mask with rows hidden whole, NaN in a row of q and in dout; 4, the
 * window with softcap, and Inf and NaN in keys of K that some rows of their tiles see (pv_careful
 * and the NaN of visible zeros), one of them the last block's only key, which the rows that see it
 * see whole while the others of their query block do not; 5, the window with K subnormal, so that
 * dQ's chains take terms that round to -0 and to the smallest subnormals; 6, one kv head for 8
 * query heads, causal, 5 key blocks; 7, a wide window with softcap and +Inf in two keys of K, so
 * that a row's chunks hold NaNs of both signs (the NaN of a visible zero weight, and 0 x Inf in
 * pv), which the chunks' sums must add alike. */
static void test_schedules_agree(void) {
    tu_impl impls[TU_MAX_IMPLS];
    const int n_impls = tu_impls(impls);
    for (int v = 0; v < 8; v++) {
        fb_tensors t;
        schedule_case(v, &t);
        static const int chunks[] = {0, 1, 3, 8}, grown_threads[] = {1, 2, 3, 16};
        for (int n = 0; n < n_impls; n++) {
            if (!runs_backward(impls, n_impls, n))
                continue;
            for (size_t x = 0; x < sizeof chunks / sizeof chunks[0]; x++) {
                void *want[3] = {NULL, NULL, NULL};
                char what[80];
                t.tuned = 1;
                t.tuning = (sdpa__bwd_tuning){(size_t)1 << 30, 0, 0, chunks[x], 0};
                snprintf(what, sizeof what, "problem %d, chunks %d, one pass", v, chunks[x]);
                bytes_on(&impls[n], &t, 3, what, want);
                t.tuning.dq_budget = 0;
                snprintf(what, sizeof what, "problem %d, chunks %d, two kinds", v, chunks[x]);
                bytes_on(&impls[n], &t, 2, what, want);
                t.tuning.adapt = 1;
                snprintf(what, sizeof what, "problem %d, chunks %d, grown", v, chunks[x]);
                for (int g = 0; g < 4; g++)
                    bytes_on(&impls[n], &t, grown_threads[g], what, want);
                if (chunks[x] == 0) {
                    t.tuned = 0;
                    snprintf(what, sizeof what, "problem %d, sdpa_backward", v);
                    bytes_on(&impls[n], &t, 2, what, want);
                    bytes_on(&impls[n], &t, 3, what, want);
                }
                free3(want);
            }
            printf("    schedules [%s] problem %d: the same bytes\n", impls[n].name, v);
        }
        release(&t);
    }
}

/* The largest request of the backward of t on `workers` threads, refused (nothing runs): with
 * the hook's dq_budget `budget`, the schedule following the workers or not (`adapt`), or, with
 * adapt < 0, as sdpa_backward chooses. */
static size_t largest_request(const tu_impl *impl, fb_tensors *t, int workers, size_t budget,
                              int adapt) {
    t->tuned = adapt >= 0;
    t->tuning = (sdpa__bwd_tuning){budget, 0, 0, 0, adapt};
    t->impl = impl->impl;
    tu_failing_alloc fa = {0};
    sdpa_ctx *ctx = refusing_ctx(impl, workers, &fa);
    CHECK_INT_EQ(backward(ctx, t), SDPA_ERR_NOMEM);
    sdpa_ctx_destroy(ctx);
    return fa.largest;
}

enum { DQ_BUDGET_BYTES = 32 << 20 }; /* sdpa__flash_backward's */

/* The budget grows only to feed every worker: where a pair's partials pass DQ_BUDGET (one kv
 * head of 8 query heads, 2 chunks of 18.9 MB), 1 and 2 workers hold them (a wave of that one
 * pair, 2 tasks), 3 and 16 take two kinds of task (a wave would need 2 and 8 pairs), and so
 * does any number without `adapt`; sdpa_backward grows it as the hook's `adapt` does. */
static void test_grown_budget(void) {
    const size_t partials = (size_t)2 * 8 * 4608 * 128 * sizeof(float);
    fb_case c = plain(8, 1, 4608, 128, 128, 128);
    c.dt = SDPA_F16;
    fb_tensors t;
    make(&c, &t);
    tu_impl impls[TU_MAX_IMPLS];
    const int n_impls = tu_impls(impls);
    for (int n = 0; n < n_impls; n++) {
        if (!runs_backward(impls, n_impls, n))
            continue;
        static const int workers[] = {1, 2, 3, 16};
        for (int w = 0; w < 4; w++) {
            const size_t grown = largest_request(&impls[n], &t, workers[w], DQ_BUDGET_BYTES, 1);
            const size_t fixed = largest_request(&impls[n], &t, workers[w], DQ_BUDGET_BYTES, 0);
            const size_t public = largest_request(&impls[n], &t, workers[w], 0, -1);
            CHECK_MSG(workers[w] <= 2 ? grown >= partials : grown < partials,
                      "[%s] %d workers, grown: largest request %zu", impls[n].name, workers[w],
                      grown);
            CHECK_MSG(fixed < partials, "[%s] %d workers, not grown: largest request %zu",
                      impls[n].name, workers[w], fixed);
            CHECK_MSG(public == grown,
                      "[%s] %d workers: sdpa_backward's largest request %zu, the hook's %zu",
                      impls[n].name, workers[w], public, grown);
        }
    }
    release(&t);
}

/* Tensors of the given sizes for a backward that never runs (refused): allocated, not filled. */
static void unfilled(fb_tensors *t, sdpa_dtype dt, int64_t B, int64_t hq, int64_t hkv, int64_t lq,
                     int64_t lk, int64_t d) {
    memset(t, 0, sizeof *t);
    t->q = tu_alloc(dt, B, hq, lq, d, TU_BHLD, 0, 0);
    t->k = tu_alloc(dt, B, hkv, lk, d, TU_BHLD, 0, 0);
    t->v = tu_alloc(dt, B, hkv, lk, d, TU_BHLD, 0, 0);
    t->o = tu_alloc(dt, B, hq, lq, d, TU_BHLD, 0, 0);
    t->lse = tu_alloc(SDPA_F32, B, hq, lq, 1, TU_BHLD, 0, 0);
    t->dout = tu_alloc(dt, B, hq, lq, d, TU_BHLD, 0, 0);
    t->dq = tu_alloc(dt, B, hq, lq, d, TU_BHLD, 0, 0);
    t->dk = tu_alloc(dt, B, hkv, lk, d, TU_BHLD, 0, 0);
    t->dv = tu_alloc(dt, B, hkv, lk, d, TU_BHLD, 0, 0);
}

/* The one-pass schedule runs only where its waves keep the workers busy at least 5/7 of the
 * time (by the largest request; refused, nothing runs). B pairs of one kv head for 8 query
 * heads, Lq=512, Lk=64, f16 (one chunk, 2.1 MB of partials a pair), through sdpa_backward (a
 * wave of all the pairs fits its budget) and through the hook with budget 0 (waves of a pair
 * a worker, grown): 3 pairs on 2 workers (3/4 busy: the one pass), 5 on 3 (5/6: the one
 * pass), 10 on 7 (5/7 exactly: the one pass), 5 on 4 (5/8 in one wave and in waves of 4 and
 * 1: two kinds). Then one pair, Hq=8, Lq=4096, Lk=128, D=128, f32, whose 2 chunks of 16 MiB
 * fit the budget in one wave of 2 tasks: the one pass on 2 workers, two kinds on 3 (2/3 busy)
 * and 16; and 4 pairs (Lq=2560, 10.5 MB each) whose budget's waves, 3 then 1, leave a worker
 * idle (2/3 busy) where waves of 2 do not. */
static void test_busy_waves(void) {
    const size_t partials = (size_t)8 * 512 * 128 * sizeof(float);
    static const struct {
        int pairs, workers, one_pass;
    } cases[] = {{3, 2, 1}, {5, 3, 1}, {10, 7, 1}, {5, 4, 0}};
    tu_impl impls[TU_MAX_IMPLS];
    const int n_impls = tu_impls(impls);
    fb_tensors t;
    for (size_t x = 0; x < sizeof cases / sizeof cases[0]; x++) {
        unfilled(&t, SDPA_F16, cases[x].pairs, 8, 1, 512, 64, 128);
        for (int n = 0; n < n_impls; n++) {
            if (!runs_backward(impls, n_impls, n))
                continue;
            for (int hook = 0; hook <= 1; hook++) {
                const size_t largest =
                    largest_request(&impls[n], &t, cases[x].workers, 0, hook ? 1 : -1);
                const size_t wave = (size_t)cases[x].workers * partials;
                CHECK_MSG(cases[x].one_pass ? largest >= wave : largest < partials,
                          "[%s] %d pairs on %d workers, %s: largest request %zu", impls[n].name,
                          cases[x].pairs, cases[x].workers, hook ? "grown" : "sdpa_backward",
                          largest);
            }
        }
        release(&t);
    }
    const size_t fitting = (size_t)2 * 8 * 4096 * 128 * sizeof(float);
    unfilled(&t, SDPA_F32, 1, 8, 1, 4096, 128, 128);
    for (int n = 0; n < n_impls; n++) {
        if (!runs_backward(impls, n_impls, n))
            continue;
        static const int workers[] = {2, 3, 16};
        for (int w = 0; w < 3; w++) {
            const size_t largest = largest_request(&impls[n], &t, workers[w], 0, -1);
            CHECK_MSG(workers[w] == 2 ? largest >= fitting : largest < fitting,
                      "[%s] one pair of 2 chunks on %d workers: largest request %zu", impls[n].name,
                      workers[w], largest);
        }
    }
    release(&t);
    /* 4 pairs of 10.5 MB, Lq=2560, f16: the budget holds 3 a wave, whose waves (3, then 1)
     * take 3 rounds for 4 tasks on 2 workers (2/3 busy); waves of 2 take 2 (the one pass) */
    const size_t pair = (size_t)8 * 2560 * 128 * sizeof(float);
    unfilled(&t, SDPA_F16, 4, 8, 1, 2560, 64, 128);
    for (int n = 0; n < n_impls; n++) {
        if (!runs_backward(impls, n_impls, n))
            continue;
        const size_t largest = largest_request(&impls[n], &t, 2, 0, -1);
        CHECK_MSG(largest >= 2 * pair && largest < 3 * pair,
                  "[%s] 4 pairs on 2 workers: largest request %zu, not waves of 2 pairs",
                  impls[n].name, largest);
    }
    release(&t);
}

/* Partials refused by the allocator: the one-pass schedule's request (its partials) passes the
 * allocator's limit, set to the two-kind schedule's largest request, and the call runs as two
 * kinds of task: SDPA_OK, a refusal, and bitwise the gradients of the one pass, for a budget
 * the hook sets and for one grown for the workers. */
static void test_partials_refused(void) {
    fb_case c = plain(4, 1, 300, 290, 32, 32);
    c.p.causal = 1;
    c.p.align = SDPA_ALIGN_BOTTOM_RIGHT;
    c.dt = SDPA_BF16;
    c.seed = 21;
    fb_tensors t;
    make_with_forward(&c, &t);
    t.tuned = 1;
    tu_impl impls[TU_MAX_IMPLS];
    const int n_impls = tu_impls(impls);
    for (int n = 0; n < n_impls; n++) {
        if (!runs_backward(impls, n_impls, n))
            continue;
        t.impl = impls[n].impl;
        tu_failing_alloc fa = {0};
        sdpa_ctx *ctx = counting_ctx(&impls[n], 2, &fa);
        t.tuning = (sdpa__bwd_tuning){0, 0, 0, 0, 0};
        CHECK_INT_EQ(backward(ctx, &t), SDPA_OK);
        const size_t two_kinds = fa.largest;
        const sdpa__bwd_tuning one_pass[2] = {{(size_t)1 << 30, 0, 0, 0, 0}, {0, 0, 0, 0, 1}};
        for (int g = 0; g < 2; g++) {
            void *want[3];
            tu_tensor *got[3] = {&t.dq, &t.dk, &t.dv};
            t.tuning = one_pass[g];
            fa.limit = 0;
            fa.largest = 0;
            CHECK_INT_EQ(backward(ctx, &t), SDPA_OK);
            CHECK_MSG(fa.largest > two_kinds, "[%s] %s: one pass's request %zu, two kinds' %zu",
                      impls[n].name, g ? "grown" : "budget", fa.largest, two_kinds);
            for (int x = 0; x < 3; x++) {
                want[x] = malloc(got[x]->bytes);
                memcpy(want[x], got[x]->buf, got[x]->bytes);
            }
            fa.limit = two_kinds;
            fa.refused = 0;
            tu_fill_canary(&t.dq);
            CHECK_INT_EQ(backward(ctx, &t), SDPA_OK);
            CHECK_INT_EQ(fa.refused, 1);
            for (int x = 0; x < 3; x++)
                CHECK_MSG(memcmp(want[x], got[x]->buf, got[x]->bytes) == 0,
                          "[%s] %s, partials refused: gradient %d differs from the one pass's",
                          impls[n].name, g ? "grown" : "budget", x);
            free3(want);
        }
        sdpa_ctx_destroy(ctx);
        CHECK_INT_EQ(fa.outstanding, 0);
    }
    release(&t);
}

int main(int argc, char **argv) {
    tu_report_impls();
    tu_impl impls[TU_MAX_IMPLS];
    const int n_impls = tu_impls(impls);
    for (int n = 0; n < n_impls; n++) {
        if (impls[n].runs && impls[n].backward && !runs_backward(impls, n_impls, n))
            printf("    %-14s not run under ThreadSanitizer: the best table alone runs there\n",
                   impls[n].name);
    }
    return CHECK_RUN(argc, argv, CASE(test_deterministic), CASE(test_deterministic_waves),
                     CASE(test_deterministic_key_groups), CASE(test_widened_rows),
                     CASE(test_schedules_agree), CASE(test_grown_budget), CASE(test_busy_waves),
                     CASE(test_partials_refused));
}
