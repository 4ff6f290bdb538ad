/*
 * test_validate.c — the argument checks of sdpa_forward and sdpa_weights (src/core/validate.c)
 * and of the context (sdpa_ctx_create, the allocator hooks, the status strings).
 *
 * Every branch of the validator has a case that sets up a valid baseline problem, breaks one
 * thing and asserts the exact status, a substring of sdpa_ctx_last_error() naming the argument
 * and its values, that the canary-filled outputs (out, lse, weights) are byte-for-byte
 * unchanged and that the inputs were not written. Huge extents and strides are declared on
 * small buffers: the checks must refuse them before memory is touched. Legal but tricky inputs
 * (negative and zero strides, broadcast masks, odd scales, Lq != Lk) are checked to be accepted
 * and computed like the naive implementation of testutil.c.
 */
#include "check.h"
#include "testutil.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The baseline problem: every extent distinct, so that messages name unambiguous values. */
enum { NB = 2, NHQ = 4, NHKV = 2, NLQ = 3, NLK = 5, NDK = 8, NDV = 6 };

#define EXT_TOO_BIG (SDPA_MAX_EXTENT + 1)
#define P62 (INT64_C(1) << 62)
#define P60 (INT64_C(1) << 60)

/* ---- the fixture: a valid problem whose views a case breaks one at a time ---------------- */

typedef struct fx {
    sdpa_ctx *ctx;
    tu_tensor q, k, v, mask, out, lse, w;
    sdpa_tensor base[7]; /* the views above as allocated, for fx_reset */
    float slopes[NHQ + 1];
    sdpa_params pr;
    /* what the calls receive: the fixture's tensors unless a case changes them */
    const sdpa_tensor *qp, *kp, *vp;
    sdpa_tensor *outp, *lsep, *wp;
    const sdpa_params *prp;
    unsigned char *snap[4]; /* copies of the q, k, v and mask buffers */
} fx;

static tu_tensor *fx_tensor(fx *f, int i) {
    tu_tensor *all[7] = {&f->q, &f->k, &f->v, &f->mask, &f->out, &f->lse, &f->w};
    return all[i];
}

/* Restores every view, pointer and parameter of the baseline and refills the canaries. */
static void fx_reset(fx *f) {
    for (int i = 0; i < 7; i++)
        fx_tensor(f, i)->t = f->base[i];
    for (int h = 0; h <= NHQ; h++)
        f->slopes[h] = 0.5f / (float)(h + 1);
    memset(&f->pr, 0, sizeof f->pr);
    f->qp = &f->q.t;
    f->kp = &f->k.t;
    f->vp = &f->v.t;
    f->outp = &f->out.t;
    f->lsep = &f->lse.t;
    f->wp = &f->w.t;
    f->prp = &f->pr;
    tu_fill_canary(&f->out);
    tu_fill_canary(&f->lse);
    tu_fill_canary(&f->w);
}

static void fx_init(fx *f) {
    memset(f, 0, sizeof *f);
    f->ctx = tu_ctx(1, SDPA_ISA_AUTO);
    tu_rng r = {0x5eed};
    f->q = tu_alloc(SDPA_F32, NB, NHQ, NLQ, NDK, TU_BHLD, 0, 0);
    f->k = tu_alloc(SDPA_F32, NB, NHKV, NLK, NDK, TU_BHLD, 0, 0);
    f->v = tu_alloc(SDPA_F32, NB, NHKV, NLK, NDV, TU_BHLD, 0, 0);
    f->mask = tu_alloc(SDPA_F32, NB, NHQ, NLQ, NLK, TU_BHLD, 0, 0);
    f->out = tu_alloc(SDPA_F32, NB, NHQ, NLQ, NDV, TU_BHLD, 0, 0);
    f->lse = tu_alloc(SDPA_F32, NB, NHQ, NLQ, 1, TU_BHLD, 0, 0);
    f->w = tu_alloc(SDPA_F32, NB, NHQ, NLQ, NLK, TU_BHLD, 0, 0);
    tu_fill_randn(&f->q, &r, 1.0, 0.0);
    tu_fill_randn(&f->k, &r, 1.0, 0.0);
    tu_fill_randn(&f->v, &r, 1.0, 0.0);
    tu_fill_randn(&f->mask, &r, 0.5, 0.0);
    for (int i = 0; i < 7; i++)
        f->base[i] = fx_tensor(f, i)->t;
    for (int i = 0; i < 4; i++) {
        const tu_tensor *t = fx_tensor(f, i);
        f->snap[i] = malloc(t->bytes);
        if (f->snap[i] == NULL) {
            fprintf(stderr, "fx_init: out of memory\n");
            exit(2);
        }
        memcpy(f->snap[i], t->buf, t->bytes);
    }
    fx_reset(f);
}

static void fx_free(fx *f) {
    for (int i = 0; i < 7; i++)
        tu_free(fx_tensor(f, i));
    for (int i = 0; i < 4; i++)
        free(f->snap[i]);
    sdpa_ctx_destroy(f->ctx);
}

static float *arena_new(size_t n) {
    float *a = calloc(n, sizeof *a);
    if (a == NULL) {
        fprintf(stderr, "arena_new: out of memory\n");
        exit(2);
    }
    return a;
}

/* Leaves a message in ctx that does not contain `msg`, so that the message a case then checks
 * is the one of its own call and not a leftover. */
static void prime(sdpa_ctx *ctx, const char *msg) {
    static float dummy;
    sdpa_tensor t = {&dummy, SDPA_F32, {1, 1, 1, 1}, {1, 1, 1, 1}};
    (void)sdpa_forward(ctx, NULL, NULL, NULL, NULL, NULL, NULL); /* "q is NULL" */
    if (msg != NULL && strstr(sdpa_ctx_last_error(ctx), msg) != NULL)
        (void)sdpa_forward(ctx, &t, NULL, NULL, NULL, NULL, NULL); /* "k is NULL" */
}

/* Calls sdpa_forward (weights = 0) or sdpa_weights on the fixture and checks the status, the
 * message (when msg is not NULL), that a failure left every output as it was, and that the
 * inputs were never written. */
static void expect_impl(fx *f, int weights, sdpa_status want, const char *msg, int line) {
    static const char *const in_names[4] = {"q", "k", "v", "mask"};
    const char *fn = weights ? "sdpa_weights" : "sdpa_forward";
    tu_fill_canary(&f->out);
    tu_fill_canary(&f->lse);
    tu_fill_canary(&f->w);
    prime(f->ctx, msg);
    const sdpa_status got =
        weights ? sdpa_weights(f->ctx, f->qp, f->kp, f->prp, f->wp)
                : sdpa_forward(f->ctx, f->qp, f->kp, f->vp, f->prp, f->outp, f->lsep);
    const char *err = sdpa_ctx_last_error(f->ctx);
    CHECK_MSG(got == want, "line %d: %s returned %s, expected %s (message \"%s\")", line, fn,
              sdpa_status_name(got), sdpa_status_name(want), err);
    if (msg != NULL)
        CHECK_MSG(strstr(err, msg) != NULL, "line %d: %s: message \"%s\" lacks \"%s\"", line, fn,
                  err, msg);
    if (want != SDPA_OK) {
        CHECK_MSG(tu_is_canary(&f->out), "line %d: %s wrote out although it failed", line, fn);
        CHECK_MSG(tu_is_canary(&f->lse), "line %d: %s wrote lse although it failed", line, fn);
        CHECK_MSG(tu_is_canary(&f->w), "line %d: %s wrote weights although it failed", line, fn);
    }
    for (int i = 0; i < 4; i++) {
        const tu_tensor *t = fx_tensor(f, i);
        CHECK_MSG(memcmp(t->buf, f->snap[i], t->bytes) == 0, "line %d: %s modified input %s", line,
                  fn, in_names[i]);
    }
}

#define EXPECT_FWD(f, st, msg) expect_impl((f), 0, (st), (msg), __LINE__)
#define EXPECT_W(f, st, msg) expect_impl((f), 1, (st), (msg), __LINE__)
#define EXPECT_BOTH(f, st, msg)                                                                    \
    do {                                                                                           \
        EXPECT_FWD(f, st, msg);                                                                    \
        EXPECT_W(f, st, msg);                                                                      \
    } while (0)

static int near(double got, double want, double tol) {
    if (isnan(got) || isnan(want))
        return isnan(got) && isnan(want);
    if (isinf(got) || isinf(want))
        return got == want;
    return fabs(got - want) <= tol * (1.0 + fabs(want));
}

/* After an accepted forward call: out and lse agree with the naive implementation in double. */
static void check_naive(const fx *f, double tol, int line) {
    const sdpa_tensor *o = f->outp;
    const int64_t rows = o->shape[0] * o->shape[1] * o->shape[2];
    const int64_t n = rows * o->shape[3];
    double *want = malloc((size_t)n * sizeof *want);
    double *want_lse = malloc((size_t)rows * sizeof *want_lse);
    if (want == NULL || want_lse == NULL) {
        fprintf(stderr, "check_naive: out of memory\n");
        exit(2);
    }
    tu_naive_forward(f->qp, f->kp, f->vp, f->prp, -1, want, want_lse);
    double *got = tu_to_doubles(o);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += !near(got[i], want[i], tol);
    CHECK_MSG(bad == 0, "line %d: %lld of %lld outputs differ from the naive implementation", line,
              (long long)bad, (long long)n);
    if (f->lsep != NULL) {
        int64_t at = 0, bad_lse = 0;
        for (int64_t b = 0; b < o->shape[0]; b++)
            for (int64_t h = 0; h < o->shape[1]; h++)
                for (int64_t l = 0; l < o->shape[2]; l++, at++)
                    bad_lse += !near(tu_get(f->lsep, b, h, l, 0), want_lse[at], 1e-5);
        CHECK_MSG(bad_lse == 0, "line %d: %lld of %lld lse values differ from the naive one", line,
                  (long long)bad_lse, (long long)rows);
    }
    free(got);
    free(want);
    free(want_lse);
}

/* After an accepted weights call: rows of probabilities that sum to 1. */
static void check_rows_sum_to_one(const fx *f, int line) {
    const sdpa_tensor *w = f->wp;
    int bad = 0;
    for (int64_t b = 0; b < w->shape[0]; b++)
        for (int64_t h = 0; h < w->shape[1]; h++)
            for (int64_t i = 0; i < w->shape[2]; i++) {
                double sum = 0.0;
                for (int64_t j = 0; j < w->shape[3]; j++) {
                    const double p = tu_get(w, b, h, i, j);
                    bad += !(p >= 0.0 && p <= 1.0);
                    sum += p;
                }
                bad += !(fabs(sum - 1.0) <= 1e-5);
            }
    CHECK_MSG(bad == 0, "line %d: %d weights or row sums are not probabilities", line, bad);
}

/* ---- the context ------------------------------------------------------------------------ */

/* An allocator that counts, tracks what it handed out, and can fail from (or only at) a given
 * allocation number. */
typedef struct counting {
    long allocs, frees, live;
    long fail_at;  /* -1: never fail */
    int fail_only; /* fail only allocation fail_at, not every one from it */
    int bad_align, bad_free, bad_user;
    void *ptrs[256];
} counting;

static void *count_alloc(size_t size, size_t align, void *user) {
    counting *c = user;
    if (align == 0 || (align & (align - 1)) != 0 || align > 4096)
        c->bad_align++;
    const long n = c->allocs++;
    if (c->fail_at >= 0 && (c->fail_only ? n == c->fail_at : n >= c->fail_at))
        return NULL;
    void *p = NULL;
    if (posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, size) != 0)
        return NULL;
    for (int i = 0; i < 256; i++)
        if (c->ptrs[i] == NULL) {
            c->ptrs[i] = p;
            c->live++;
            return p;
        }
    free(p);
    return NULL;
}

static void count_free(void *ptr, void *user) {
    counting *c = user;
    c->frees++;
    for (int i = 0; i < 256; i++)
        if (c->ptrs[i] == ptr && ptr != NULL) {
            c->ptrs[i] = NULL;
            c->live--;
            free(ptr);
            return;
        }
    c->bad_free++; /* not ours: leave it alone */
}

static sdpa_status count_ctx(counting *c, sdpa_ctx **ctx) {
    sdpa_ctx_params cp;
    memset(&cp, 0, sizeof cp);
    cp.n_threads = 1;
    cp.allocator.alloc = count_alloc;
    cp.allocator.free = count_free;
    cp.allocator.user = c;
    return sdpa_ctx_create(&cp, ctx);
}

static void test_ctx_create_null_out(void) {
    sdpa_ctx_params cp;
    memset(&cp, 0, sizeof cp);
    CHECK_INT_EQ(sdpa_ctx_create(NULL, NULL), SDPA_ERR_NULL);
    CHECK_INT_EQ(sdpa_ctx_create(&cp, NULL), SDPA_ERR_NULL);
}

static void test_ctx_create_defaults(void) {
    sdpa_ctx *ctx = NULL;
    CHECK_INT_EQ(sdpa_ctx_create(NULL, &ctx), SDPA_OK);
    CHECK(ctx != NULL);
    CHECK(sdpa_ctx_n_threads(ctx) >= 1);
    CHECK(strcmp(sdpa_ctx_last_error(ctx), "") == 0);
    sdpa_ctx_destroy(ctx);

    sdpa_ctx_params cp;
    memset(&cp, 0, sizeof cp);
    cp.allocator.user = &cp; /* user alone, without hooks, is ignored */
    CHECK_INT_EQ(sdpa_ctx_create(&cp, &ctx), SDPA_OK);
    sdpa_ctx_destroy(ctx);
}

static void test_ctx_threads(void) {
    static const int bad[] = {-1, SDPA_MAX_THREADS + 1, INT_MIN, INT_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sdpa_ctx_params cp;
        memset(&cp, 0, sizeof cp);
        cp.n_threads = bad[i];
        sdpa_ctx *ctx = (sdpa_ctx *)&cp; /* must be overwritten with NULL */
        CHECK_INT_EQ(sdpa_ctx_create(&cp, &ctx), SDPA_ERR_THREADS);
        CHECK(ctx == NULL);
    }
    sdpa_ctx *ctx = tu_ctx(1, SDPA_ISA_AUTO);
    CHECK_INT_EQ(sdpa_ctx_n_threads(ctx), 1);
    sdpa_ctx_destroy(ctx);
    ctx = tu_ctx(3, SDPA_ISA_AUTO);
    CHECK_INT_EQ(sdpa_ctx_n_threads(ctx), 3);
    sdpa_ctx_destroy(ctx);
}

static void test_ctx_max_isa(void) {
    static const sdpa_isa bad[] = {(sdpa_isa)99, (sdpa_isa)5, (sdpa_isa)-1};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sdpa_ctx_params cp;
        memset(&cp, 0, sizeof cp);
        cp.max_isa = bad[i];
        sdpa_ctx *ctx = (sdpa_ctx *)&cp;
        CHECK_INT_EQ(sdpa_ctx_create(&cp, &ctx), SDPA_ERR_PARAM);
        CHECK(ctx == NULL);
    }
    for (int cap = SDPA_ISA_AUTO; cap <= SDPA_ISA_AMX; cap++) {
        sdpa_ctx *ctx = tu_ctx(1, (sdpa_isa)cap);
        const sdpa_isa isa = sdpa_ctx_isa(ctx);
        CHECK_MSG(isa >= SDPA_ISA_GENERIC && (cap == SDPA_ISA_AUTO || (int)isa <= cap),
                  "max_isa=%s gave isa=%s", sdpa_isa_name((sdpa_isa)cap), sdpa_isa_name(isa));
        sdpa_ctx_destroy(ctx);
    }
}

static void test_ctx_allocator_half_set(void) {
    counting c;
    memset(&c, 0, sizeof c);
    c.fail_at = -1;
    for (int which = 0; which < 2; which++) {
        sdpa_ctx_params cp;
        memset(&cp, 0, sizeof cp);
        if (which == 0)
            cp.allocator.alloc = count_alloc;
        else
            cp.allocator.free = count_free;
        cp.allocator.user = &c;
        sdpa_ctx *ctx = (sdpa_ctx *)&cp;
        CHECK_INT_EQ(sdpa_ctx_create(&cp, &ctx), SDPA_ERR_PARAM);
        CHECK(ctx == NULL);
    }
    CHECK_INT_EQ(c.allocs, 0);
    CHECK_INT_EQ(c.frees, 0);
}

static void test_ctx_allocator_used(void) {
    counting c;
    memset(&c, 0, sizeof c);
    c.fail_at = -1;
    sdpa_ctx *ctx = NULL;
    CHECK_INT_EQ(count_ctx(&c, &ctx), SDPA_OK);
    CHECK(c.allocs >= 1); /* the context itself lives in the caller's memory */
    CHECK(c.live >= 1);

    fx f;
    fx_init(&f);
    sdpa_ctx_destroy(f.ctx);
    f.ctx = ctx;
    EXPECT_FWD(&f, SDPA_OK, NULL);
    check_naive(&f, 1e-5, __LINE__);
    EXPECT_W(&f, SDPA_OK, NULL);
    check_rows_sum_to_one(&f, __LINE__);
    fx_free(&f); /* destroys ctx */

    CHECK_INT_EQ(c.live, 0);
    CHECK_INT_EQ(c.frees, c.allocs);
    CHECK_INT_EQ(c.bad_align, 0);
    CHECK_INT_EQ(c.bad_free, 0);
}

static void test_ctx_allocator_fails_at_create(void) {
    counting c;
    memset(&c, 0, sizeof c);
    c.fail_at = 0;
    sdpa_ctx *ctx = (sdpa_ctx *)&c;
    CHECK_INT_EQ(count_ctx(&c, &ctx), SDPA_ERR_NOMEM);
    CHECK(ctx == NULL);
    CHECK(c.allocs >= 1);
    CHECK_INT_EQ(c.live, 0);
}

/* An allocator that starts failing after the context exists: every call either fails with
 * SDPA_ERR_NOMEM, leaving the outputs as they were and freeing what it had got, or succeeds. */
static void nomem(int weights, int fail_only) {
    int n_nomem = 0, done = 0;
    long attempted_first = 0;
    for (long n = 0; n < 64 && !done; n++) {
        counting c;
        memset(&c, 0, sizeof c);
        c.fail_at = -1;
        fx f;
        fx_init(&f);
        sdpa_ctx_destroy(f.ctx);
        f.ctx = NULL;
        CHECK_INT_EQ(count_ctx(&c, &f.ctx), SDPA_OK);
        if (f.ctx == NULL) {
            fx_free(&f);
            return;
        }
        const long base = c.allocs, live = c.live;
        c.fail_at = base + n;
        c.fail_only = fail_only;
        f.pr.mask = &f.mask.t;
        tu_fill_canary(&f.out);
        tu_fill_canary(&f.lse);
        tu_fill_canary(&f.w);
        const sdpa_status st = weights
                                   ? sdpa_weights(f.ctx, f.qp, f.kp, f.prp, f.wp)
                                   : sdpa_forward(f.ctx, f.qp, f.kp, f.vp, f.prp, f.outp, f.lsep);
        if (n == 0)
            attempted_first = c.allocs - base;
        if (st == SDPA_OK) {
            done = 1;
            if (weights)
                check_rows_sum_to_one(&f, __LINE__);
            else
                check_naive(&f, 1e-5, __LINE__);
        } else {
            n_nomem++;
            CHECK_MSG(st == SDPA_ERR_NOMEM, "allocation %ld failing gave %s", n,
                      sdpa_status_name(st));
            CHECK(sdpa_ctx_last_error(f.ctx)[0] != '\0');
            CHECK(tu_is_canary(&f.out));
            CHECK(tu_is_canary(&f.lse));
            CHECK(tu_is_canary(&f.w));
        }
        CHECK_MSG(c.live == live, "allocation %ld failing: %ld blocks leaked", n, c.live - live);
        fx_free(&f);
        CHECK_INT_EQ(c.live, 0);
        CHECK_INT_EQ(c.bad_free, 0);
    }
    CHECK_MSG(done, "never succeeded within 64 allocations");
    /* If the call needs scratch at all, failing every allocation must have given NOMEM. */
    CHECK(n_nomem >= 1 || attempted_first == 0);
}

static void test_nomem_forward(void) {
    nomem(0, 0);
    nomem(0, 1);
}

static void test_nomem_weights(void) {
    nomem(1, 0);
    nomem(1, 1);
}

static void test_ctx_null(void) {
    sdpa_ctx_destroy(NULL);
    CHECK(sdpa_ctx_last_error(NULL) != NULL);
    CHECK(strcmp(sdpa_ctx_last_error(NULL), "") == 0);
}

static void test_status_strings(void) {
#define STATUS_ROW(name, value, text) {name, value, #name, text},
    static const struct {
        sdpa_status st;
        int value;
        const char *name, *text;
    } rows[] = {SDPA_STATUS_LIST(STATUS_ROW)};
#undef STATUS_ROW
    const size_t n = sizeof rows / sizeof rows[0];
    CHECK_INT_EQ(n, 14);
    for (size_t i = 0; i < n; i++) {
        CHECK_INT_EQ(rows[i].st, rows[i].value);
        CHECK_INT_EQ(rows[i].value, -(int)i); /* stable, contiguous values */
        CHECK_MSG(strcmp(sdpa_status_str(rows[i].st), rows[i].text) == 0, "str(%d) = \"%s\"",
                  rows[i].value, sdpa_status_str(rows[i].st));
        CHECK_MSG(strcmp(sdpa_status_name(rows[i].st), rows[i].name) == 0, "name(%d) = \"%s\"",
                  rows[i].value, sdpa_status_name(rows[i].st));
        for (size_t j = 0; j < i; j++)
            CHECK(strcmp(sdpa_status_str(rows[i].st), sdpa_status_str(rows[j].st)) != 0);
    }
    CHECK(strcmp(sdpa_status_str(SDPA_OK), "success") == 0);
    CHECK(strcmp(sdpa_status_str(SDPA_ERR_NOMEM), "out of memory") == 0);
    CHECK(strcmp(sdpa_status_name(SDPA_ERR_SHAPE), "SDPA_ERR_SHAPE") == 0);
    CHECK(strcmp(sdpa_status_name(SDPA_ERR_INTERNAL), "SDPA_ERR_INTERNAL") == 0);
    static const int unknown[] = {1, -14, 12345, INT_MIN, INT_MAX};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        CHECK(strcmp(sdpa_status_str((sdpa_status)unknown[i]), "unknown status") == 0);
        CHECK(strcmp(sdpa_status_name((sdpa_status)unknown[i]), "SDPA_UNKNOWN") == 0);
    }
}

/* ---- NULL pointers ------------------------------------------------------------------------ */

static void test_null_ctx(void) {
    fx f;
    fx_init(&f);
    CHECK_INT_EQ(sdpa_forward(NULL, f.qp, f.kp, f.vp, f.prp, f.outp, f.lsep), SDPA_ERR_NULL);
    CHECK_INT_EQ(sdpa_weights(NULL, f.qp, f.kp, f.prp, f.wp), SDPA_ERR_NULL);
    CHECK(tu_is_canary(&f.out) && tu_is_canary(&f.lse) && tu_is_canary(&f.w));
    fx_free(&f);
}

static void test_null_tensor(void) {
    fx f;
    fx_init(&f);
    f.qp = NULL;
    EXPECT_BOTH(&f, SDPA_ERR_NULL, "q is NULL");
    fx_reset(&f);
    f.kp = NULL;
    EXPECT_BOTH(&f, SDPA_ERR_NULL, "k is NULL");
    fx_reset(&f);
    f.vp = NULL;
    EXPECT_FWD(&f, SDPA_ERR_NULL, "v is NULL");
    EXPECT_W(&f, SDPA_OK, NULL); /* sdpa_weights has no v */
    fx_reset(&f);
    f.outp = NULL;
    EXPECT_FWD(&f, SDPA_ERR_NULL, "out is NULL");
    fx_reset(&f);
    f.wp = NULL;
    EXPECT_W(&f, SDPA_ERR_NULL, "weights is NULL");
    /* lse, params, params.mask and params.alibi_slopes may be NULL */
    fx_reset(&f);
    f.lsep = NULL;
    f.prp = NULL;
    EXPECT_FWD(&f, SDPA_OK, NULL);
    check_naive(&f, 1e-5, __LINE__);
    EXPECT_W(&f, SDPA_OK, NULL);
    check_rows_sum_to_one(&f, __LINE__);
    fx_free(&f);
}

static void test_null_data(void) {
    fx f;
    fx_init(&f);
    f.q.t.data = NULL;
    EXPECT_BOTH(&f, SDPA_ERR_NULL, "q.data is NULL");
    fx_reset(&f);
    f.k.t.data = NULL;
    EXPECT_BOTH(&f, SDPA_ERR_NULL, "k.data is NULL");
    fx_reset(&f);
    f.v.t.data = NULL;
    EXPECT_FWD(&f, SDPA_ERR_NULL, "v.data is NULL");
    fx_reset(&f);
    f.out.t.data = NULL;
    EXPECT_FWD(&f, SDPA_ERR_NULL, "out.data is NULL");
    fx_reset(&f);
    f.lse.t.data = NULL;
    EXPECT_FWD(&f, SDPA_ERR_NULL, "lse.data is NULL");
    fx_reset(&f);
    f.w.t.data = NULL;
    EXPECT_W(&f, SDPA_ERR_NULL, "weights.data is NULL");
    fx_reset(&f);
    f.pr.mask = &f.mask.t;
    f.mask.t.data = NULL;
    EXPECT_BOTH(&f, SDPA_ERR_NULL, "mask.data is NULL");
    fx_free(&f);
}

/* ---- dtypes ------------------------------------------------------------------------------- */

static void test_dtype_not_float(void) {
    fx f;
    fx_init(&f);
    f.q.t.dtype = (sdpa_dtype)77;
    EXPECT_BOTH(&f, SDPA_ERR_DTYPE, "q.dtype=unknown (77) is not f32, f16 or bf16");
    fx_reset(&f);
    f.q.t.dtype = SDPA_BOOL;
    EXPECT_BOTH(&f, SDPA_ERR_DTYPE, "q.dtype=bool (3) is not f32, f16 or bf16");
    fx_reset(&f);
    f.k.t.dtype = SDPA_BOOL;
    EXPECT_BOTH(&f, SDPA_ERR_DTYPE, "k.dtype=bool (3)");
    fx_reset(&f);
    f.k.t.dtype = (sdpa_dtype)-1;
    EXPECT_BOTH(&f, SDPA_ERR_DTYPE, "k.dtype=unknown");
    fx_reset(&f);
    f.v.t.dtype = SDPA_BOOL;
    EXPECT_FWD(&f, SDPA_ERR_DTYPE, "v.dtype=bool (3)");
    fx_reset(&f);
    f.v.t.dtype = (sdpa_dtype)4;
    EXPECT_FWD(&f, SDPA_ERR_DTYPE, "v.dtype=unknown (4)");
    fx_reset(&f);
    f.out.t.dtype = SDPA_BOOL;
    EXPECT_FWD(&f, SDPA_ERR_DTYPE, "out.dtype=bool (3) is not f32, f16 or bf16");
    fx_reset(&f);
    f.out.t.dtype = (sdpa_dtype)77;
    EXPECT_FWD(&f, SDPA_ERR_DTYPE, "out.dtype=unknown (77)");
    fx_free(&f);
}

static void test_dtype_not_f32(void) {
    fx f;
    fx_init(&f);
    f.lse.t.dtype = SDPA_F16;
    EXPECT_FWD(&f, SDPA_ERR_DTYPE, "lse.dtype=f16 (1) must be f32");
    fx_reset(&f);
    f.lse.t.dtype = SDPA_BF16;
    EXPECT_FWD(&f, SDPA_ERR_DTYPE, "lse.dtype=bf16 (2) must be f32");
    fx_reset(&f);
    f.lse.t.dtype = (sdpa_dtype)77;
    EXPECT_FWD(&f, SDPA_ERR_DTYPE, "lse.dtype=unknown (77) must be f32");
    fx_reset(&f);
    f.w.t.dtype = SDPA_F16;
    EXPECT_W(&f, SDPA_ERR_DTYPE, "weights.dtype=f16 (1) must be f32");
    fx_reset(&f);
    f.w.t.dtype = SDPA_BF16;
    EXPECT_W(&f, SDPA_ERR_DTYPE, "weights.dtype=bf16 (2) must be f32");
    fx_reset(&f);
    f.w.t.dtype = SDPA_BOOL;
    EXPECT_W(&f, SDPA_ERR_DTYPE, "weights.dtype=bool (3) must be f32");
    fx_free(&f);
}

static void test_dtype_mask(void) {
    fx f;
    fx_init(&f);
    f.pr.mask = &f.mask.t;
    f.mask.t.dtype = (sdpa_dtype)77;
    EXPECT_BOTH(&f, SDPA_ERR_DTYPE, "mask.dtype=unknown (77) is not bool, f32, f16 or bf16");
    fx_reset(&f);
    f.pr.mask = &f.mask.t;
    f.mask.t.dtype = (sdpa_dtype)-3;
    EXPECT_BOTH(&f, SDPA_ERR_DTYPE, "mask.dtype=unknown");
    fx_free(&f);
}

/* ---- extents ------------------------------------------------------------------------------ */

static void test_dim_below_one(void) {
    fx f;
    fx_init(&f);
    f.q.t.shape[0] = 0;
    EXPECT_BOTH(&f, SDPA_ERR_DIM, "q.shape[0]=0 must be >= 1");
    fx_reset(&f);
    f.q.t.shape[2] = -3;
    EXPECT_BOTH(&f, SDPA_ERR_DIM, "q.shape[2]=-3 must be >= 1");
    fx_reset(&f);
    f.k.t.shape[1] = 0;
    EXPECT_BOTH(&f, SDPA_ERR_DIM, "k.shape[1]=0 must be >= 1");
    fx_reset(&f);
    f.k.t.shape[2] = 0; /* an empty KV cache is refused too */
    EXPECT_BOTH(&f, SDPA_ERR_DIM, "k.shape[2]=0 must be >= 1");
    fx_reset(&f);
    f.v.t.shape[2] = INT64_MIN;
    EXPECT_FWD(&f, SDPA_ERR_DIM, "v.shape[2]=-9223372036854775808 must be >= 1");
    fx_reset(&f);
    f.out.t.shape[3] = 0;
    EXPECT_FWD(&f, SDPA_ERR_DIM, "out.shape[3]=0 must be >= 1");
    fx_reset(&f);
    f.lse.t.shape[2] = -1;
    EXPECT_FWD(&f, SDPA_ERR_DIM, "lse.shape[2]=-1 must be >= 1");
    fx_reset(&f);
    f.lse.t.shape[3] = 0;
    EXPECT_FWD(&f, SDPA_ERR_DIM, "lse.shape[3]=0 must be >= 1");
    fx_reset(&f);
    f.w.t.shape[1] = -1;
    EXPECT_W(&f, SDPA_ERR_DIM, "weights.shape[1]=-1 must be >= 1");
    fx_reset(&f);
    f.pr.mask = &f.mask.t;
    f.mask.t.shape[3] = 0;
    EXPECT_BOTH(&f, SDPA_ERR_DIM, "mask.shape[3]=0 must be >= 1");
    fx_free(&f);
}

static void test_dim_above_max_extent(void) {
    fx f;
    fx_init(&f);
    f.q.t.shape[2] = EXT_TOO_BIG;
    EXPECT_BOTH(&f, SDPA_ERR_DIM, "q.shape[2]=2147483648 exceeds SDPA_MAX_EXTENT=2147483647");
    fx_reset(&f);
    f.k.t.shape[0] = INT64_MAX;
    EXPECT_BOTH(&f, SDPA_ERR_DIM, "k.shape[0]=9223372036854775807 exceeds SDPA_MAX_EXTENT");
    fx_reset(&f);
    f.v.t.shape[1] = EXT_TOO_BIG;
    EXPECT_FWD(&f, SDPA_ERR_DIM, "v.shape[1]=2147483648 exceeds SDPA_MAX_EXTENT");
    fx_reset(&f);
    f.out.t.shape[0] = EXT_TOO_BIG;
    EXPECT_FWD(&f, SDPA_ERR_DIM, "out.shape[0]=2147483648 exceeds SDPA_MAX_EXTENT");
    fx_reset(&f);
    f.lse.t.shape[1] = EXT_TOO_BIG;
    EXPECT_FWD(&f, SDPA_ERR_DIM, "lse.shape[1]=2147483648 exceeds SDPA_MAX_EXTENT");
    fx_reset(&f);
    f.w.t.shape[3] = EXT_TOO_BIG;
    EXPECT_W(&f, SDPA_ERR_DIM, "weights.shape[3]=2147483648 exceeds SDPA_MAX_EXTENT");
    fx_reset(&f);
    f.pr.mask = &f.mask.t;
    f.mask.t.shape[2] = EXT_TOO_BIG;
    EXPECT_BOTH(&f, SDPA_ERR_DIM, "mask.shape[2]=2147483648 exceeds SDPA_MAX_EXTENT");
    fx_free(&f);
}

/* The limits themselves are legal: the call goes on to the next check. */
static void test_dim_limits_pass(void) {
    fx f;
    fx_init(&f);
    f.q.t.shape[2] = SDPA_MAX_EXTENT;
    f.q.t.stride[2] = 0;
    EXPECT_FWD(&f, SDPA_ERR_SHAPE, "out.shape[2]=3 but q.shape[2]=2147483647");
    EXPECT_W(&f, SDPA_ERR_SHAPE, "weights.shape[2]=3 but q.shape[2]=2147483647");
    fx_reset(&f);
    f.q.t.shape[3] = SDPA_MAX_HEAD_DIM;
    f.q.t.stride[3] = 0;
    EXPECT_BOTH(&f, SDPA_ERR_SHAPE, "k.shape[3]=8 but q.shape[3]=65536");
    fx_free(&f);
}

static void test_dim_above_max_head_dim(void) {
    fx f;
    fx_init(&f);
    f.q.t.shape[3] = SDPA_MAX_HEAD_DIM + 1;
    EXPECT_BOTH(&f, SDPA_ERR_DIM, "q.shape[3]=65537 exceeds SDPA_MAX_HEAD_DIM=65536");
    fx_reset(&f);
    f.k.t.shape[3] = SDPA_MAX_HEAD_DIM + 1;
    EXPECT_BOTH(&f, SDPA_ERR_DIM, "k.shape[3]=65537 exceeds SDPA_MAX_HEAD_DIM=65536");
    fx_reset(&f);
    f.v.t.shape[3] = SDPA_MAX_HEAD_DIM + 1;
    EXPECT_FWD(&f, SDPA_ERR_DIM, "v.shape[3]=65537 exceeds SDPA_MAX_HEAD_DIM=65536");
    fx_reset(&f);
    f.out.t.shape[3] = SDPA_MAX_HEAD_DIM + 1;
    EXPECT_FWD(&f, SDPA_ERR_DIM, "out.shape[3]=65537 exceeds SDPA_MAX_HEAD_DIM=65536");
    /* the last extent of lse, weights and mask is not a head dimension */
    fx_reset(&f);
    f.lse.t.shape[3] = SDPA_MAX_HEAD_DIM + 1;
    EXPECT_FWD(&f, SDPA_ERR_SHAPE, "lse.shape[3]=65537 must be 1");
    fx_reset(&f);
    f.w.t.shape[3] = SDPA_MAX_HEAD_DIM + 1;
    EXPECT_W(&f, SDPA_ERR_SHAPE, "weights.shape[3]=65537 but k.shape[2]=5");
    fx_reset(&f);
    f.pr.mask = &f.mask.t;
    f.mask.t.shape[3] = SDPA_MAX_HEAD_DIM + 1;
    EXPECT_BOTH(&f, SDPA_ERR_BROADCAST, "mask.shape[3]=65537 is neither 1 nor Lk=5");
    fx_free(&f);
}

/* ---- shape agreement ---------------------------------------------------------------------- */

static void test_shape_batch(void) {
    fx f;
    fx_init(&f);
    f.k.t.shape[0] = 1;
    EXPECT_BOTH(&f, SDPA_ERR_SHAPE, "k.shape[0]=1 but q.shape[0]=2");
    fx_reset(&f);
    f.v.t.shape[0] = 1;
    EXPECT_FWD(&f, SDPA_ERR_SHAPE, "v.shape[0]=1 but k.shape[0]=2");
    fx_reset(&f);
    f.out.t.shape[0] = 1;
    EXPECT_FWD(&f, SDPA_ERR_SHAPE, "out.shape[0]=1 but q.shape[0]=2");
    fx_reset(&f);
    f.lse.t.shape[0] = 1;
    EXPECT_FWD(&f, SDPA_ERR_SHAPE, "lse.shape[0]=1 but q.shape[0]=2");
    fx_reset(&f);
    f.w.t.shape[0] = 1;
    EXPECT_W(&f, SDPA_ERR_SHAPE, "weights.shape[0]=1 but q.shape[0]=2");
    fx_free(&f);
}

static void test_shape_head_dim(void) {
    fx f;
    fx_init(&f);
    f.k.t.shape[3] = 7;
    EXPECT_BOTH(&f, SDPA_ERR_SHAPE, "k.shape[3]=7 but q.shape[3]=8");
    fx_free(&f);
}

static void test_shape_kv_heads(void) {
    fx f;
    fx_init(&f);
    f.v.t.shape[1] = 1;
    EXPECT_FWD(&f, SDPA_ERR_SHAPE, "v.shape[1]=1 but k.shape[1]=2");
    fx_reset(&f);
    f.v.t.shape[1] = NHQ; /* v with the query's heads */
    EXPECT_FWD(&f, SDPA_ERR_SHAPE, "v.shape[1]=4 but k.shape[1]=2");
    fx_free(&f);
}

static void test_shape_lk(void) {
    fx f;
    fx_init(&f);
    f.v.t.shape[2] = 4;
    EXPECT_FWD(&f, SDPA_ERR_SHAPE, "v.shape[2]=4 but k.shape[2]=5");
    fx_reset(&f);
    f.w.t.shape[3] = NLQ;
    EXPECT_W(&f, SDPA_ERR_SHAPE, "weights.shape[3]=3 but k.shape[2]=5");
    fx_free(&f);
}

static void test_shape_dv(void) {
    fx f;
    fx_init(&f);
    f.out.t.shape[3] = NDK; /* out sized like q instead of like v */
    EXPECT_FWD(&f, SDPA_ERR_SHAPE, "out.shape[3]=8 but v.shape[3]=6");
    fx_free(&f);
}

static void test_shape_out(void) {
    fx f;
    fx_init(&f);
    f.out.t.shape[1] = NHKV;
    EXPECT_FWD(&f, SDPA_ERR_SHAPE, "out.shape[1]=2 but q.shape[1]=4");
    fx_reset(&f);
    f.out.t.shape[2] = NLK;
    EXPECT_FWD(&f, SDPA_ERR_SHAPE, "out.shape[2]=5 but q.shape[2]=3");
    fx_free(&f);
}

static void test_shape_lse(void) {
    fx f;
    fx_init(&f);
    f.lse.t.shape[1] = NHKV;
    EXPECT_FWD(&f, SDPA_ERR_SHAPE, "lse.shape[1]=2 but q.shape[1]=4");
    fx_reset(&f);
    f.lse.t.shape[2] = NLK;
    EXPECT_FWD(&f, SDPA_ERR_SHAPE, "lse.shape[2]=5 but q.shape[2]=3");
    fx_free(&f);
}

static void test_shape_lse_last_not_one(void) {
    fx f;
    fx_init(&f);
    f.lse.t.shape[3] = 2;
    EXPECT_FWD(&f, SDPA_ERR_SHAPE, "lse.shape[3]=2 must be 1");
    fx_reset(&f);
    tu_tensor big = tu_alloc(SDPA_F32, NB, NHQ, NLQ, NDV, TU_BHLD, 0, 0);
    tu_fill_canary(&big);
    f.lsep = &big.t; /* a (B, Hq, Lq, Dv) tensor passed as lse */
    EXPECT_FWD(&f, SDPA_ERR_SHAPE, "lse.shape[3]=6 must be 1");
    CHECK(tu_is_canary(&big));
    tu_free(&big);
    fx_free(&f);
}

static void test_shape_weights(void) {
    fx f;
    fx_init(&f);
    f.w.t.shape[1] = NHKV;
    EXPECT_W(&f, SDPA_ERR_SHAPE, "weights.shape[1]=2 but q.shape[1]=4");
    fx_reset(&f);
    f.w.t.shape[2] = NLK;
    EXPECT_W(&f, SDPA_ERR_SHAPE, "weights.shape[2]=5 but q.shape[2]=3");
    fx_free(&f);
}

static void test_heads_not_multiple(void) {
    fx f;
    fx_init(&f);
    f.k.t.shape[1] = 3;
    EXPECT_BOTH(&f, SDPA_ERR_HEADS, "q.shape[1]=4 (Hq) is not a multiple of k.shape[1]=3 (Hkv)");
    fx_reset(&f);
    f.k.t.shape[1] = 8; /* more kv heads than query heads */
    EXPECT_BOTH(&f, SDPA_ERR_HEADS, "q.shape[1]=4 (Hq) is not a multiple of k.shape[1]=8");
    fx_reset(&f);
    f.q.t.shape[1] = 3;
    EXPECT_BOTH(&f, SDPA_ERR_HEADS, "q.shape[1]=3 (Hq) is not a multiple of k.shape[1]=2");
    fx_free(&f);
}

static void test_mask_not_broadcastable(void) {
    static const int64_t bad[4] = {3, NHKV, 2, 4};
    static const char *const msg[4] = {
        "mask.shape[0]=3 is neither 1 nor B=2 (mask shape (3, 4, 3, 5), target (2, 4, 3, 5))",
        "mask.shape[1]=2 is neither 1 nor Hq=4", "mask.shape[2]=2 is neither 1 nor Lq=3",
        "mask.shape[3]=4 is neither 1 nor Lk=5"};
    fx f;
    fx_init(&f);
    for (int i = 0; i < 4; i++) {
        fx_reset(&f);
        f.pr.mask = &f.mask.t;
        f.mask.t.shape[i] = bad[i];
        EXPECT_BOTH(&f, SDPA_ERR_BROADCAST, msg[i]);
    }
    fx_free(&f);
}

/* ---- address spans ------------------------------------------------------------------------ */

static void test_overflow_extent_times_stride(void) {
    fx f;
    fx_init(&f);
    f.q.t.stride[2] = P62; /* 2 x 2^62 = 2^63 */
    EXPECT_BOTH(&f, SDPA_ERR_OVERFLOW,
                "q: the span of dimensions 0..2 overflows int64 (extent 3 x stride "
                "4611686018427387904)");
    fx_reset(&f);
    f.v.t.stride[2] = INT64_MIN;
    EXPECT_FWD(&f, SDPA_ERR_OVERFLOW,
               "v: the span of dimensions 0..2 overflows int64 (extent 5 x stride "
               "-9223372036854775808)");
    fx_reset(&f);
    f.pr.mask = &f.mask.t;
    f.mask.t.stride[3] = P62;
    EXPECT_BOTH(&f, SDPA_ERR_OVERFLOW,
                "mask: the span of dimensions 0..3 overflows int64 (extent 5 x stride "
                "4611686018427387904)");
    fx_reset(&f);
    f.out.t.stride[2] = P62;
    EXPECT_FWD(
        &f, SDPA_ERR_OVERFLOW,
        "out: the span of dimensions 0..2 overflows int64 (extent 3 x stride 4611686018427387904");
    fx_reset(&f);
    f.lse.t.stride[1] = -P62;
    EXPECT_FWD(&f, SDPA_ERR_OVERFLOW,
               "lse: the span of dimensions 0..1 overflows int64 (extent 4 x stride "
               "-4611686018427387904)");
    fx_reset(&f);
    f.w.t.stride[1] = INT64_MAX / 2; /* 3 x (2^62 - 1) */
    EXPECT_W(&f, SDPA_ERR_OVERFLOW,
             "weights: the span of dimensions 0..1 overflows int64 (extent 4 x stride "
             "4611686018427387903)");
    fx_free(&f);
}

/* Each product fits, their sum does not. */
static void test_overflow_sum_of_extents(void) {
    fx f;
    fx_init(&f);
    f.k.t.stride[1] = P62; /* 1 x 2^62 */
    f.k.t.stride[2] = P60; /* 4 x 2^60 = 2^62: fine alone, 2^63 with the above */
    EXPECT_BOTH(&f, SDPA_ERR_OVERFLOW,
                "k: the span of dimensions 0..2 overflows int64 (extent 5 x stride "
                "1152921504606846976)");
    fx_reset(&f);
    f.q.t.stride[0] = -P62; /* 1 x -2^62, then 2 x -2^62 = INT64_MIN: their sum overflows */
    f.q.t.stride[2] = -P62;
    EXPECT_BOTH(&f, SDPA_ERR_OVERFLOW,
                "q: the span of dimensions 0..2 overflows int64 (extent 3 x stride "
                "-4611686018427387904)");
    fx_free(&f);
}

/* The element span fits in int64, the byte span does not (or elements - 1 overflows). */
static void test_overflow_bytes(void) {
    fx f;
    fx_init(&f);
    f.q.t.stride[3] = INT64_MAX / 8; /* 7 x (2^60 - 1) elements fit; x 4 bytes does not */
    EXPECT_BOTH(&f, SDPA_ERR_OVERFLOW,
                "q: the address span of shape (2, 4, 3, 8) with strides (96, 24, 8, "
                "1152921504606846975) overflows int64 bytes");
    fx_reset(&f);
    f.v.t.stride[0] = INT64_MIN; /* 1 x INT64_MIN fits; the span INT64_MAX + more does not */
    EXPECT_FWD(&f, SDPA_ERR_OVERFLOW,
               "v: the address span of shape (2, 2, 5, 6) with strides "
               "(-9223372036854775808, 30, 6, 1) overflows int64 bytes");
    fx_reset(&f);
    f.q.t.stride[0] = INT64_MAX; /* a span of exactly INT64_MAX + 1 elements */
    f.q.t.stride[1] = f.q.t.stride[2] = f.q.t.stride[3] = 0;
    EXPECT_BOTH(&f, SDPA_ERR_OVERFLOW,
                "q: the address span of shape (2, 4, 3, 8) with strides "
                "(9223372036854775807, 0, 0, 0) overflows int64 bytes");
    fx_reset(&f);
    tu_tensor bm = tu_alloc(SDPA_BOOL, NB, 1, 1, 1, TU_BHLD, 0, 0); /* 1-byte elements */
    bm.t.stride[0] = INT64_MAX; /* INT64_MAX + 1 bytes: only the + 1 overflows */
    f.pr.mask = &bm.t;
    EXPECT_BOTH(&f, SDPA_ERR_OVERFLOW,
                "mask: the address span of shape (2, 1, 1, 1) with "
                "strides (9223372036854775807, 1, 1, 1) overflows");
    tu_free(&bm);
    fx_reset(&f);
    f.w.t.stride[3] = INT64_MAX / 8;
    EXPECT_W(&f, SDPA_ERR_OVERFLOW, "weights: the address span of shape (2, 4, 3, 5)");
    fx_reset(&f);
    f.lse.t.stride[0] = INT64_MAX / 4; /* (2^61 - 1) + 2 x (2^60 - 1) elements: 2^62 + ... */
    f.lse.t.stride[2] = INT64_MAX / 8; /* ... which x 4 bytes overflows */
    EXPECT_FWD(&f, SDPA_ERR_OVERFLOW, "lse: the address span of shape (2, 4, 3, 1)");
    fx_free(&f);
}

/* Spans that fit in int64 but run off either end of the address space. */
static void test_overflow_address_space(void) {
    fx f;
    fx_init(&f);
    f.q.t.data = (void *)(uintptr_t)64; /* a tiny pointer, never dereferenced */
    f.q.t.stride[2] = -100;
    EXPECT_BOTH(&f, SDPA_ERR_OVERFLOW,
                "q: shape (2, 4, 3, 8) with strides (96, 24, -100, 1) reaches 800 bytes below");
    fx_reset(&f);
    f.k.t.stride[2] = -(INT64_C(1) << 58); /* a real pointer, 2^62 bytes below it */
    EXPECT_BOTH(&f, SDPA_ERR_OVERFLOW, "outside the address space");
    fx_reset(&f);
    f.v.t.data = (void *)(UINTPTR_MAX - 255); /* 256 bytes below the top */
    EXPECT_FWD(&f, SDPA_ERR_OVERFLOW, "outside the address space");
    fx_reset(&f);
    f.out.t.data = (void *)(uintptr_t)4096;
    f.out.t.stride[1] = -2048;
    EXPECT_FWD(&f, SDPA_ERR_OVERFLOW,
               "out: shape (2, 4, 3, 6) with strides (72, -2048, 6, 1) reaches 24576 bytes below");
    fx_reset(&f);
    f.pr.mask = &f.mask.t;
    f.mask.t.stride[0] = -(INT64_C(1) << 60);
    EXPECT_BOTH(&f, SDPA_ERR_OVERFLOW, "outside the address space");
    fx_reset(&f);
    f.w.t.data = (void *)(UINTPTR_MAX - 15);
    EXPECT_W(&f, SDPA_ERR_OVERFLOW, "outside the address space");
    fx_free(&f);
}

/* The stride of an extent of 1 is never used, whatever it is. */
static void test_overflow_unit_extent_ignored(void) {
    fx f;
    fx_init(&f);
    f.lse.t.stride[3] = INT64_MIN;
    f.q.t.shape[0] = f.k.t.shape[0] = f.v.t.shape[0] = f.out.t.shape[0] = f.lse.t.shape[0] =
        f.w.t.shape[0] = 1;
    f.q.t.stride[0] = INT64_MAX;
    f.k.t.stride[0] = INT64_MIN;
    f.v.t.stride[0] = P62;
    f.out.t.stride[0] = -P62;
    f.lse.t.stride[0] = INT64_MAX;
    f.w.t.stride[0] = INT64_MIN;
    EXPECT_FWD(&f, SDPA_OK, NULL);
    check_naive(&f, 1e-5, __LINE__);
    EXPECT_W(&f, SDPA_OK, NULL);
    check_rows_sum_to_one(&f, __LINE__);
    fx_free(&f);
}

/* ---- scalar parameters -------------------------------------------------------------------- */

static void test_param_align(void) {
    fx f;
    fx_init(&f);
    f.pr.align = (sdpa_align)2;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM,
                "params.align=2 is not SDPA_ALIGN_TOP_LEFT (0) or SDPA_ALIGN_BOTTOM_RIGHT (1)");
    fx_reset(&f);
    f.pr.align = (sdpa_align)77;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "params.align=77 is not");
    fx_free(&f);
}

static void test_param_scale(void) {
    fx f;
    fx_init(&f);
    f.pr.scale = NAN;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "params.scale=nan is not finite");
    f.pr.scale = INFINITY;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "params.scale=inf is not finite");
    f.pr.scale = -INFINITY;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "params.scale=-inf is not finite");
    fx_free(&f);
}

static void test_param_softcap(void) {
    fx f;
    fx_init(&f);
    f.pr.softcap = -1.0f;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "params.softcap=-1 must be 0 (off) or positive and finite");
    f.pr.softcap = -0.5f;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "params.softcap=-0.5 must be");
    f.pr.softcap = NAN;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "params.softcap=nan must be");
    f.pr.softcap = INFINITY;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "params.softcap=inf must be");
    fx_free(&f);
}

static void test_param_window_left(void) {
    fx f;
    fx_init(&f);
    f.pr.use_window = 1;
    f.pr.window_left = -2;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "params.window_left=-2 must be -1 (unbounded) or >= 0");
    f.pr.window_left = INT64_MIN;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "params.window_left=-9223372036854775808 must be");
    fx_free(&f);
}

static void test_param_window_right(void) {
    fx f;
    fx_init(&f);
    f.pr.use_window = 1;
    f.pr.window_right = -2;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "params.window_right=-2 must be -1 (unbounded) or >= 0");
    f.pr.causal = 1; /* causal does not excuse it */
    f.pr.window_right = INT64_MIN;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "params.window_right=-9223372036854775808 must be");
    fx_free(&f);
}

/* Without use_window the bounds are ignored; -1 and huge bounds are legal with it. */
static void test_param_window_ignored(void) {
    fx f;
    fx_init(&f);
    f.pr.window_left = -2;
    f.pr.window_right = INT64_MIN;
    EXPECT_FWD(&f, SDPA_OK, NULL);
    check_naive(&f, 1e-5, __LINE__);
    EXPECT_W(&f, SDPA_OK, NULL);
    f.pr.causal = 1;
    EXPECT_FWD(&f, SDPA_OK, NULL);
    check_naive(&f, 1e-5, __LINE__);
    fx_reset(&f);
    f.pr.use_window = 1;
    f.pr.window_left = -1;
    f.pr.window_right = INT64_MAX;
    EXPECT_FWD(&f, SDPA_OK, NULL);
    check_naive(&f, 1e-5, __LINE__);
    EXPECT_W(&f, SDPA_OK, NULL);
    check_rows_sum_to_one(&f, __LINE__);
    /* the largest bounds, with off = Lk - Lq = -2 (bottom-right, Lk = 1): still unbounded */
    fx_reset(&f);
    f.k.t.shape[2] = f.v.t.shape[2] = f.w.t.shape[3] = 1;
    f.pr.align = SDPA_ALIGN_BOTTOM_RIGHT;
    f.pr.use_window = 1;
    f.pr.window_left = INT64_MAX;
    f.pr.window_right = INT64_MAX;
    EXPECT_FWD(&f, SDPA_OK, NULL);
    check_naive(&f, 1e-5, __LINE__);
    EXPECT_W(&f, SDPA_OK, NULL);
    check_rows_sum_to_one(&f, __LINE__);
    fx_free(&f);
}

static void test_param_alibi(void) {
    fx f;
    fx_init(&f);
    f.pr.alibi_slopes = f.slopes;
    f.slopes[2] = NAN;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "params.alibi_slopes[2]=nan is not finite");
    fx_reset(&f);
    f.pr.alibi_slopes = f.slopes;
    f.slopes[NHQ - 1] = INFINITY;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "params.alibi_slopes[3]=inf is not finite");
    fx_reset(&f);
    f.pr.alibi_slopes = f.slopes;
    f.slopes[0] = -INFINITY;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "params.alibi_slopes[0]=-inf is not finite");
    /* only Hq slopes are read; negative slopes are legal */
    fx_reset(&f);
    f.pr.alibi_slopes = f.slopes;
    f.slopes[NHQ] = NAN;
    f.slopes[1] = -0.25f;
    EXPECT_FWD(&f, SDPA_OK, NULL);
    check_naive(&f, 1e-5, __LINE__);
    EXPECT_W(&f, SDPA_OK, NULL);
    check_rows_sum_to_one(&f, __LINE__);
    fx_free(&f);
}

/* Every data pointer must be aligned to its element size (and the ALiBi slopes to floats). */
static void test_misaligned_data(void) {
    fx f;
    fx_init(&f);
    f.q.t.data = (char *)f.q.t.data + 1;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "is not aligned to its 4-byte f32 elements");
    fx_reset(&f);
    f.out.t.data = (char *)f.out.t.data + 2;
    EXPECT_FWD(&f, SDPA_ERR_PARAM, "out.data=");
    fx_reset(&f);
    f.pr.alibi_slopes = (const float *)(const void *)((const char *)f.slopes + 2);
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "is not aligned to 4-byte floats");
    fx_free(&f);
}

/* ---- aliasing ----------------------------------------------------------------------------- */

static void test_alias_output_stride_zero(void) {
    fx f;
    fx_init(&f);
    f.out.t.stride[1] = 0;
    EXPECT_FWD(&f, SDPA_ERR_ALIAS,
               "out.stride[1]=0 with out.shape[1]=4: output elements would share memory");
    fx_reset(&f);
    f.out.t.stride[3] = 0;
    EXPECT_FWD(&f, SDPA_ERR_ALIAS, "out.stride[3]=0 with out.shape[3]=6");
    fx_reset(&f);
    f.lse.t.stride[2] = 0;
    EXPECT_FWD(&f, SDPA_ERR_ALIAS, "lse.stride[2]=0 with lse.shape[2]=3");
    fx_reset(&f);
    f.w.t.stride[3] = 0;
    EXPECT_W(&f, SDPA_ERR_ALIAS, "weights.stride[3]=0 with weights.shape[3]=5");
    fx_free(&f);
}

static void test_alias_output_self_overlap(void) {
    fx f;
    fx_init(&f);
    f.out.t.stride[2] = 3; /* rows of 6 elements, 3 apart */
    EXPECT_FWD(&f, SDPA_ERR_ALIAS, "out: strides (72, 18, 3, 1) are not provably free of overlap");
    fx_reset(&f);
    f.out.t.stride[2] = -3;
    EXPECT_FWD(&f, SDPA_ERR_ALIAS, "out: strides (72, 18, -3, 1) are not provably free of overlap");
    fx_reset(&f);
    f.out.t.stride[0] = 18; /* batch 1 lands on head 1 of batch 0 */
    EXPECT_FWD(&f, SDPA_ERR_ALIAS, "out: strides (18, 18, 6, 1) are not provably free of overlap");
    fx_reset(&f);
    f.lse.t.stride[1] = 2;
    EXPECT_FWD(&f, SDPA_ERR_ALIAS, "lse: strides (12, 2, 1, 1) are not provably free of overlap");
    fx_reset(&f);
    f.w.t.stride[2] = 4;
    EXPECT_W(&f, SDPA_ERR_ALIAS,
             "weights: strides (60, 15, 4, 1) are not provably free of overlap");
    fx_free(&f);
}

static void test_alias_out_overlaps_input(void) {
    fx f;
    fx_init(&f);
    f.out.t.data = f.q.buf;
    EXPECT_FWD(&f, SDPA_ERR_ALIAS, "overlaps q (bytes ");
    CHECK_STR_CONTAINS(sdpa_ctx_last_error(f.ctx), "out (bytes ");
    fx_reset(&f);
    f.out.t.data = (float *)f.k.buf + 10;
    EXPECT_FWD(&f, SDPA_ERR_ALIAS, "overlaps k (bytes ");
    fx_reset(&f);
    f.out.t.data = (float *)f.v.buf + 100; /* overlaps v's tail only */
    EXPECT_FWD(&f, SDPA_ERR_ALIAS, "overlaps v (bytes ");
    fx_reset(&f);
    f.pr.mask = &f.mask.t;
    f.out.t.data = f.mask.buf;
    EXPECT_FWD(&f, SDPA_ERR_ALIAS, "overlaps mask (bytes ");

    /* ALiBi slopes sharing out's last element, without and then with a mask (the slopes are
     * the 4th or the 5th input); one element further they are fine */
    const size_t n_out = NB * NHQ * NLQ * NDV;
    float *arena = arena_new(n_out + NHQ);
    for (int with_mask = 0; with_mask < 2; with_mask++) {
        fx_reset(&f);
        f.pr.mask = with_mask ? &f.mask.t : NULL;
        f.pr.alibi_slopes = arena + n_out - 1;
        f.out.t.data = arena;
        EXPECT_FWD(&f, SDPA_ERR_ALIAS, "overlaps params.alibi_slopes (bytes ");
        for (size_t i = 0; i < n_out + NHQ; i++)
            CHECK(arena[i] == 0.0f);
    }
    fx_reset(&f);
    arena[n_out] = 0.125f;
    f.pr.alibi_slopes = arena + n_out;
    f.out.t.data = arena;
    f.lsep = NULL;
    EXPECT_FWD(&f, SDPA_OK, NULL);
    check_naive(&f, 1e-5, __LINE__);
    free(arena);
    fx_free(&f);
}

/* Byte-exact boundaries: a tensor that ends where the other begins is fine, one element more
 * overlaps. */
static void test_alias_boundaries(void) {
    const size_t n_q = NB * NHQ * NLQ * NDK, n_out = NB * NHQ * NLQ * NDV;
    fx f;
    fx_init(&f);
    float *arena = arena_new(n_q + n_out);
    float *copy = arena_new(n_q + n_out);
    /* q first, then out */
    for (int gap = 0; gap >= -1; gap--) {
        fx_reset(&f);
        memcpy(arena, f.q.buf, n_q * sizeof(float));
        memcpy(copy, arena, (n_q + n_out) * sizeof(float));
        f.q.t.data = arena;
        f.out.t.data = arena + n_q + gap;
        if (gap == 0) {
            EXPECT_FWD(&f, SDPA_OK, NULL);
            check_naive(&f, 1e-5, __LINE__);
        } else {
            EXPECT_FWD(&f, SDPA_ERR_ALIAS, "overlaps q (bytes ");
            CHECK(memcmp(arena, copy, (n_q + n_out) * sizeof(float)) == 0);
        }
    }
    /* out first, then q */
    for (int gap = 0; gap >= -1; gap--) {
        fx_reset(&f);
        memset(arena, 0, (n_q + n_out) * sizeof(float));
        memcpy(arena + n_out + gap, f.q.buf, n_q * sizeof(float));
        memcpy(copy, arena, (n_q + n_out) * sizeof(float));
        f.q.t.data = arena + n_out + gap;
        f.out.t.data = arena;
        if (gap == 0) {
            EXPECT_FWD(&f, SDPA_OK, NULL);
            check_naive(&f, 1e-5, __LINE__);
        } else {
            EXPECT_FWD(&f, SDPA_ERR_ALIAS, "overlaps q (bytes ");
            CHECK(memcmp(arena, copy, (n_q + n_out) * sizeof(float)) == 0);
        }
    }
    /* one byte: a bool mask whose last byte is out's first byte, then the byte before it */
    const size_t n_m = NB * NHQ * NLQ * NLK;
    unsigned char *bytes = calloc(n_m + 4 * n_out + 8, 1);
    if (bytes == NULL)
        exit(2);
    for (int gap = -1; gap <= 0; gap++) {
        fx_reset(&f);
        tu_tensor m = tu_alloc(SDPA_BOOL, NB, NHQ, NLQ, NLK, TU_BHLD, 0, 0);
        m.t.data = bytes + 8 + (gap == 0 ? 0 : 1); /* ends at bytes + 8 + n_m - 1 + (1 or 0) */
        f.pr.mask = &m.t;
        f.out.t.data = bytes + 8 + n_m; /* a multiple of 4: n_m = 120 */
        if (gap == 0) {
            memset(bytes, 1, n_m + 8);
            EXPECT_FWD(&f, SDPA_OK, NULL);
            check_naive(&f, 1e-5, __LINE__);
        } else {
            EXPECT_FWD(&f, SDPA_ERR_ALIAS, "overlaps mask (bytes ");
            for (size_t i = 0; i < n_m + 4 * n_out + 8; i++)
                CHECK(bytes[i] == 0);
        }
        tu_free(&m);
    }
    free(bytes);
    free(copy);
    free(arena);
    fx_free(&f);
}

/* Two interleaved views of one buffer touch distinct elements but share an address range:
 * sdpa.h promises they are refused. */
static void test_alias_interleaved(void) {
    const size_t n_q = NB * NHQ * NLQ * NDK;
    fx f;
    fx_init(&f);
    float *arena = arena_new(2 * n_q);
    for (int i = 0; i < 4; i++)
        f.q.t.stride[i] *= 2;
    f.q.t.data = arena;
    f.out.t.data = arena + 1;
    f.out.t.stride[0] = 2 * NHQ * NLQ * NDK;
    f.out.t.stride[1] = 2 * NLQ * NDK;
    f.out.t.stride[2] = 2 * NDK;
    f.out.t.stride[3] = 2;
    EXPECT_FWD(&f, SDPA_ERR_ALIAS, "overlaps q (bytes ");
    for (size_t i = 0; i < 2 * n_q; i++)
        CHECK(arena[i] == 0.0f);
    free(arena);
    fx_free(&f);
}

static void test_alias_lse_overlaps(void) {
    const size_t n_lse = NB * NHQ * NLQ;
    fx f;
    fx_init(&f);
    f.lse.t.data = f.out.buf;
    EXPECT_FWD(&f, SDPA_ERR_ALIAS, "overlaps out (bytes ");
    CHECK_STR_CONTAINS(sdpa_ctx_last_error(f.ctx), "lse (bytes ");
    fx_reset(&f);
    f.lse.t.data = (float *)f.out.buf + NB * NHQ * NLQ * NDV - 1; /* out's last element */
    EXPECT_FWD(&f, SDPA_ERR_ALIAS, "lse (bytes ");
    fx_reset(&f);
    f.lse.t.data = f.q.buf;
    EXPECT_FWD(&f, SDPA_ERR_ALIAS, "overlaps q (bytes ");
    fx_reset(&f);
    f.lse.t.data = f.k.buf;
    EXPECT_FWD(&f, SDPA_ERR_ALIAS, "overlaps k (bytes ");
    fx_reset(&f);
    f.lse.t.data = f.v.buf;
    EXPECT_FWD(&f, SDPA_ERR_ALIAS, "overlaps v (bytes ");
    fx_reset(&f);
    f.pr.mask = &f.mask.t;
    f.lse.t.data = f.mask.buf;
    EXPECT_FWD(&f, SDPA_ERR_ALIAS, "overlaps mask (bytes ");
    fx_reset(&f);
    float *arena = arena_new(n_lse + NHQ);
    f.pr.alibi_slopes = arena + n_lse - 1;
    f.lse.t.data = arena;
    EXPECT_FWD(&f, SDPA_ERR_ALIAS, "lse (bytes ");
    CHECK_STR_CONTAINS(sdpa_ctx_last_error(f.ctx), "overlaps params.alibi_slopes (bytes ");
    free(arena);
    fx_free(&f);
}

static void test_alias_weights_overlaps(void) {
    const size_t n_w = NB * NHQ * NLQ * NLK;
    fx f;
    fx_init(&f);
    f.w.t.data = f.q.buf;
    EXPECT_W(&f, SDPA_ERR_ALIAS, "overlaps q (bytes ");
    CHECK_STR_CONTAINS(sdpa_ctx_last_error(f.ctx), "weights (bytes ");
    fx_reset(&f);
    f.w.t.data = (float *)f.k.buf + 50;
    EXPECT_W(&f, SDPA_ERR_ALIAS, "overlaps k (bytes ");
    fx_reset(&f);
    f.pr.mask = &f.mask.t;
    f.w.t.data = f.mask.buf;
    EXPECT_W(&f, SDPA_ERR_ALIAS, "overlaps mask (bytes ");
    float *arena = arena_new(n_w + NHQ);
    for (int with_mask = 0; with_mask < 2; with_mask++) {
        fx_reset(&f);
        f.pr.mask = with_mask ? &f.mask.t : NULL;
        f.pr.alibi_slopes = arena + n_w - 1;
        f.w.t.data = arena;
        EXPECT_W(&f, SDPA_ERR_ALIAS, "overlaps params.alibi_slopes (bytes ");
    }
    free(arena);
    fx_free(&f);
}

/* ---- legal tricky inputs ------------------------------------------------------------------ */

static void test_ok_negative_input_strides(void) {
    fx f;
    fx_init(&f);
    /* q reversed along L, k reversed along Lk and D, v reversed along every dimension */
    f.q.t.data = (float *)f.q.buf + (NLQ - 1) * NDK;
    f.q.t.stride[2] = -NDK;
    f.k.t.data = (float *)f.k.buf + (NLK - 1) * NDK + NDK - 1;
    f.k.t.stride[2] = -NDK;
    f.k.t.stride[3] = -1;
    f.v.t.data = (float *)f.v.buf + NB * NHKV * NLK * NDV - 1;
    for (int i = 0; i < 4; i++)
        f.v.t.stride[i] = -f.v.t.stride[i];
    f.pr.mask = &f.mask.t;
    f.mask.t.data = (float *)f.mask.buf + (NLK - 1);
    f.mask.t.stride[3] = -1;
    EXPECT_FWD(&f, SDPA_OK, NULL);
    check_naive(&f, 1e-5, __LINE__);
    EXPECT_W(&f, SDPA_OK, NULL);
    check_rows_sum_to_one(&f, __LINE__);
    fx_free(&f);
}

static void test_ok_broadcast_inputs(void) {
    fx f;
    fx_init(&f);
    f.q.t.stride[1] = 0; /* every head asks the same queries */
    f.k.t.stride[0] = 0; /* both batches share batch 0's keys */
    f.v.t.stride[2] = 0; /* one value row for every key */
    f.pr.mask = &f.mask.t;
    f.mask.t.stride[0] = 0;
    f.mask.t.stride[2] = 0;
    EXPECT_FWD(&f, SDPA_OK, NULL);
    check_naive(&f, 1e-5, __LINE__);
    EXPECT_W(&f, SDPA_OK, NULL);
    check_rows_sum_to_one(&f, __LINE__);
    fx_free(&f);
}

static void test_ok_mask_unit_extents(void) {
    static const int64_t shapes[4][4] = {
        {1, 1, NLQ, NLK}, {NB, 1, 1, NLK}, {1, NHQ, NLQ, 1}, {1, 1, 1, 1}};
    static const int64_t strides[4][4] = {{INT64_MAX, INT64_MIN, NLK, 1},
                                          {NLK, -7, INT64_MIN, 1},
                                          {P62, NLQ, 1, -P62},
                                          {INT64_MIN, INT64_MAX, INT64_MIN, INT64_MAX}};
    fx f;
    fx_init(&f);
    for (int c = 0; c < 4; c++) {
        fx_reset(&f);
        f.pr.mask = &f.mask.t;
        memcpy(f.mask.t.shape, shapes[c], sizeof shapes[c]);
        memcpy(f.mask.t.stride, strides[c], sizeof strides[c]);
        EXPECT_FWD(&f, SDPA_OK, NULL);
        check_naive(&f, 1e-5, __LINE__);
        EXPECT_W(&f, SDPA_OK, NULL);
        check_rows_sum_to_one(&f, __LINE__);
    }
    fx_free(&f);
}

static void test_ok_mask_dtypes(void) {
    static const sdpa_dtype dts[3] = {SDPA_BOOL, SDPA_F16, SDPA_BF16};
    tu_rng r = {7};
    fx f;
    fx_init(&f);
    for (int c = 0; c < 3; c++) {
        tu_tensor m = tu_alloc(dts[c], NB, NHQ, NLQ, NLK, TU_BHLD, 0, 0);
        tu_fill_randn(&m, &r, 0.5, 0.0);
        if (dts[c] == SDPA_BOOL)
            for (int64_t j = 1; j < NLK; j += 2)
                tu_set(&m.t, 1, 2, 1, j, 0.0);
        fx_reset(&f);
        f.pr.mask = &m.t;
        EXPECT_FWD(&f, SDPA_OK, NULL);
        check_naive(&f, 1e-5, __LINE__);
        EXPECT_W(&f, SDPA_OK, NULL);
        check_rows_sum_to_one(&f, __LINE__);
        tu_free(&m);
    }
    fx_free(&f);
}

static void test_ok_scale_negative_denormal(void) {
    static const float scales[3] = {-0.5f, 1e-40f, -1e-45f};
    fx f;
    fx_init(&f);
    for (int c = 0; c < 3; c++) {
        fx_reset(&f);
        f.pr.scale = scales[c];
        EXPECT_FWD(&f, SDPA_OK, NULL);
        check_naive(&f, 1e-5, __LINE__);
        EXPECT_W(&f, SDPA_OK, NULL);
        check_rows_sum_to_one(&f, __LINE__);
    }
    fx_free(&f);
}

/* Lq < Lk is the baseline; here Lq > Lk, bottom-right causal, so query 0 sees no key. */
static void test_ok_lq_ne_lk(void) {
    fx f;
    fx_init(&f);
    f.k.t.shape[2] = f.v.t.shape[2] = 2;
    f.w.t.shape[3] = 2;
    f.pr.causal = 1;
    f.pr.align = SDPA_ALIGN_BOTTOM_RIGHT;
    EXPECT_FWD(&f, SDPA_OK, NULL);
    check_naive(&f, 1e-5, __LINE__);
    CHECK(tu_get(&f.lse.t, 0, 0, 0, 0) == -INFINITY);
    EXPECT_W(&f, SDPA_OK, NULL);
    CHECK(tu_get(&f.w.t, 1, 3, 0, 0) == 0.0 && tu_get(&f.w.t, 1, 3, 0, 1) == 0.0);
    fx_free(&f);
}

static void test_ok_mixed_dtypes(void) {
    tu_rng r = {11};
    fx f;
    fx_init(&f);
    tu_tensor q = tu_alloc(SDPA_F16, NB, NHQ, NLQ, NDK, TU_BLHD, 1, 3);
    tu_tensor k = tu_alloc(SDPA_BF16, NB, NHKV, NLK, NDK, TU_BHLD, 0, 1);
    tu_tensor m = tu_alloc(SDPA_F16, 1, NHQ, NLQ, NLK, TU_BHLD, 0, 0);
    tu_tensor out = tu_alloc(SDPA_BF16, NB, NHQ, NLQ, NDV, TU_BLHD, 2, 0);
    tu_fill_randn(&q, &r, 1.0, 0.0);
    tu_fill_randn(&k, &r, 1.0, 0.0);
    tu_fill_randn(&m, &r, 0.5, 0.0);
    f.qp = &q.t;
    f.kp = &k.t;
    f.outp = &out.t;
    f.pr.mask = &m.t;
    EXPECT_FWD(&f, SDPA_OK, NULL);
    check_naive(&f, 1e-2, __LINE__); /* out is bf16 */
    EXPECT_W(&f, SDPA_OK, NULL);
    check_rows_sum_to_one(&f, __LINE__);
    tu_free(&q);
    tu_free(&k);
    tu_free(&m);
    tu_free(&out);
    fx_free(&f);
}

static void test_ok_head_dim_max(void) {
    const int64_t d = SDPA_MAX_HEAD_DIM;
    tu_rng r = {13};
    fx f;
    fx_init(&f);
    tu_tensor q = tu_alloc(SDPA_F32, 1, 1, 2, d, TU_BHLD, 0, 0);
    tu_tensor k = tu_alloc(SDPA_F32, 1, 1, 3, d, TU_BHLD, 0, 0);
    tu_tensor v = tu_alloc(SDPA_F32, 1, 1, 3, d, TU_BHLD, 0, 0);
    tu_tensor out = tu_alloc(SDPA_F32, 1, 1, 2, d, TU_BHLD, 0, 0);
    tu_tensor lse = tu_alloc(SDPA_F32, 1, 1, 2, 1, TU_BHLD, 0, 0);
    tu_fill_randn(&q, &r, 0.05, 0.0);
    tu_fill_randn(&k, &r, 0.05, 0.0);
    tu_fill_randn(&v, &r, 1.0, 0.0);
    f.qp = &q.t;
    f.kp = &k.t;
    f.vp = &v.t;
    f.outp = &out.t;
    f.lsep = &lse.t;
    EXPECT_FWD(&f, SDPA_OK, NULL);
    check_naive(&f, 1e-5, __LINE__);
    tu_free(&q);
    tu_free(&k);
    tu_free(&v);
    tu_free(&out);
    tu_free(&lse);
    fx_free(&f);
}

/* Outputs may use negative strides and any stride on an extent of 1. */
static void test_ok_output_strides(void) {
    fx f;
    fx_init(&f);
    f.out.t.data = (float *)f.out.buf + (NLQ - 1) * NDV + NDV - 1;
    f.out.t.stride[2] = -NDV;
    f.out.t.stride[3] = -1;
    f.lse.t.data = (float *)f.lse.buf + NB * NHQ * NLQ - 1;
    for (int i = 0; i < 3; i++)
        f.lse.t.stride[i] = -f.lse.t.stride[i];
    f.lse.t.stride[3] = 0;
    EXPECT_FWD(&f, SDPA_OK, NULL);
    check_naive(&f, 1e-5, __LINE__);
    fx_reset(&f);
    f.w.t.data = (float *)f.w.buf + NB * NHQ * NLQ * NLK - 1;
    for (int i = 0; i < 4; i++)
        f.w.t.stride[i] = -f.w.t.stride[i];
    EXPECT_W(&f, SDPA_OK, NULL);
    check_rows_sum_to_one(&f, __LINE__);
    /* a (B, L, H, D) output is a permutation, not an overlap */
    fx_reset(&f);
    f.out.t = sdpa_tensor_blhd(f.out.buf, SDPA_F32, NB, NLQ, NHQ, NDV);
    EXPECT_FWD(&f, SDPA_OK, NULL);
    check_naive(&f, 1e-5, __LINE__);
    fx_free(&f);
}

/* Inputs may overlap each other: here q, k, v and the mask are views of one buffer. */
static void test_ok_inputs_share_memory(void) {
    fx f;
    fx_init(&f);
    f.k.t = sdpa_tensor_bhld(f.q.buf, SDPA_F32, NB, NHKV, NLK, NDK);
    f.v.t = sdpa_tensor_bhld((float *)f.q.buf + 3, SDPA_F32, NB, NHKV, NLK, NDV);
    f.mask.t = sdpa_tensor_bhld((float *)f.q.buf + 1, SDPA_F32, NB, NHQ, NLQ, NLK);
    f.pr.mask = &f.mask.t;
    f.pr.alibi_slopes = (const float *)f.q.buf + 7;
    EXPECT_FWD(&f, SDPA_OK, NULL);
    check_naive(&f, 1e-5, __LINE__);
    EXPECT_W(&f, SDPA_OK, NULL);
    check_rows_sum_to_one(&f, __LINE__);
    fx_free(&f);
}

/* Every optional input at once (mask and ALiBi slopes) and both outputs. */
static void test_ok_all_inputs_with_lse(void) {
    fx f;
    fx_init(&f);
    f.pr.mask = &f.mask.t;
    f.pr.alibi_slopes = f.slopes;
    f.pr.causal = 1;
    f.pr.softcap = 5.0f;
    EXPECT_FWD(&f, SDPA_OK, NULL);
    check_naive(&f, 1e-5, __LINE__);
    EXPECT_W(&f, SDPA_OK, NULL);
    check_rows_sum_to_one(&f, __LINE__);
    fx_free(&f);
}

int main(int argc, char **argv) {
    static const check_case cases[] = {
        /* context */
        CASE(test_ctx_create_null_out),
        CASE(test_ctx_create_defaults),
        CASE(test_ctx_threads),
        CASE(test_ctx_max_isa),
        CASE(test_ctx_allocator_half_set),
        CASE(test_ctx_allocator_used),
        CASE(test_ctx_allocator_fails_at_create),
        CASE(test_nomem_forward),
        CASE(test_nomem_weights),
        CASE(test_ctx_null),
        CASE(test_status_strings),
        /* NULL pointers and dtypes */
        CASE(test_null_ctx),
        CASE(test_null_tensor),
        CASE(test_null_data),
        CASE(test_misaligned_data),
        CASE(test_dtype_not_float),
        CASE(test_dtype_not_f32),
        CASE(test_dtype_mask),
        /* extents */
        CASE(test_dim_below_one),
        CASE(test_dim_above_max_extent),
        CASE(test_dim_limits_pass),
        CASE(test_dim_above_max_head_dim),
        /* shapes, heads, mask broadcasting */
        CASE(test_shape_batch),
        CASE(test_shape_head_dim),
        CASE(test_shape_kv_heads),
        CASE(test_shape_lk),
        CASE(test_shape_dv),
        CASE(test_shape_out),
        CASE(test_shape_lse),
        CASE(test_shape_lse_last_not_one),
        CASE(test_shape_weights),
        CASE(test_heads_not_multiple),
        CASE(test_mask_not_broadcastable),
        /* address spans */
        CASE(test_overflow_extent_times_stride),
        CASE(test_overflow_sum_of_extents),
        CASE(test_overflow_bytes),
        CASE(test_overflow_address_space),
        CASE(test_overflow_unit_extent_ignored),
        /* scalar parameters */
        CASE(test_param_align),
        CASE(test_param_scale),
        CASE(test_param_softcap),
        CASE(test_param_window_left),
        CASE(test_param_window_right),
        CASE(test_param_window_ignored),
        CASE(test_param_alibi),
        /* aliasing */
        CASE(test_alias_output_stride_zero),
        CASE(test_alias_output_self_overlap),
        CASE(test_alias_out_overlaps_input),
        CASE(test_alias_boundaries),
        CASE(test_alias_interleaved),
        CASE(test_alias_lse_overlaps),
        CASE(test_alias_weights_overlaps),
        /* legal tricky inputs */
        CASE(test_ok_negative_input_strides),
        CASE(test_ok_broadcast_inputs),
        CASE(test_ok_mask_unit_extents),
        CASE(test_ok_mask_dtypes),
        CASE(test_ok_scale_negative_denormal),
        CASE(test_ok_lq_ne_lk),
        CASE(test_ok_mixed_dtypes),
        CASE(test_ok_head_dim_max),
        CASE(test_ok_output_strides),
        CASE(test_ok_inputs_share_memory),
        CASE(test_ok_all_inputs_with_lse),
    };
    return check_run(cases, sizeof cases / sizeof cases[0], argc, argv);
}
