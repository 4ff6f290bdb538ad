/*
 * validate_fixture.h — what the test_validate_*.c programs share: the baseline problem of the
 * argument checks of sdpa_forward and sdpa_weights (src/core/validate.c), the calls that break
 * it and the checks that follow each call.
 *
 * A case sets up the valid baseline, breaks one thing and asserts the exact status, a
 * substring of sdpa_ctx_last_error() naming the argument and its values, that the
 * canary-filled outputs (out, lse, weights) are byte-for-byte unchanged and that the inputs
 * were not written. An accepted call is compared with the naive implementation of testutil.c.
 *
 * Header-only, like check.h, and for the same reason: the CHECKs below count in the program
 * that includes them (check.h's failure count is per translation unit). The functions are
 * static inline so that a program that does not use one of them is not warned about it.
 */
#ifndef SDPA_TEST_VALIDATE_FIXTURE_H
#define SDPA_TEST_VALIDATE_FIXTURE_H

#include "check.h"
#include "testutil.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The baseline problem: every extent distinct, so that messages name unambiguous values. */
enum { NB = 2, NHQ = 4, NHKV = 2, NLQ = 3, NLK = 5, NDK = 8, NDV = 6 };

/* Strides far beyond any buffer, declared on small ones. */
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

/* The fixture's tensors, in fx_tensor's order. */
enum { FX_Q, FX_K, FX_V, FX_MASK, FX_OUT, FX_LSE, FX_W };

static inline tu_tensor *fx_tensor(fx *f, int i) {
    tu_tensor *all[7] = {&f->q, &f->k, &f->v, &f->mask, &f->out, &f->lse, &f->w};
    return all[i];
}

/* Restores every view, pointer and parameter of the baseline and refills the canaries. */
static inline void fx_reset(fx *f) {
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

static inline void fx_init(fx *f) {
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

static inline void fx_free(fx *f) {
    for (int i = 0; i < 7; i++)
        tu_free(fx_tensor(f, i));
    for (int i = 0; i < 4; i++)
        free(f->snap[i]);
    sdpa_ctx_destroy(f->ctx);
}

/* Leaves a message in ctx that does not contain `msg`, so that the message a case then checks
 * is the one of its own call and not a leftover. */
static inline void prime(sdpa_ctx *ctx, const char *msg) {
    static float dummy;
    sdpa_tensor t = {&dummy, SDPA_F32, {1, 1, 1, 1}, {1, 1, 1, 1}};
    (void)sdpa_forward(ctx, NULL, NULL, NULL, NULL, NULL, NULL); /* "q is NULL" */
    if (msg != NULL && strstr(sdpa_ctx_last_error(ctx), msg) != NULL)
        (void)sdpa_forward(ctx, &t, NULL, NULL, NULL, NULL, NULL); /* "k is NULL" */
}

/* Calls sdpa_forward (weights = 0) or sdpa_weights on the fixture and checks the status, the
 * message (when msg is not NULL), that a failure left every output as it was, and that the
 * inputs were never written. */
static inline void expect_impl(fx *f, int weights, sdpa_status want, const char *msg,
                               const char *where) {
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
    CHECK_MSG(got == want, "%s: %s returned %s, expected %s (message \"%s\")", where, fn,
              sdpa_status_name(got), sdpa_status_name(want), err);
    if (msg != NULL)
        CHECK_MSG(strstr(err, msg) != NULL, "%s: %s: message \"%s\" lacks \"%s\"", where, fn, err,
                  msg);
    if (want != SDPA_OK) {
        CHECK_MSG(tu_is_canary(&f->out), "%s: %s wrote out although it failed", where, fn);
        CHECK_MSG(tu_is_canary(&f->lse), "%s: %s wrote lse although it failed", where, fn);
        CHECK_MSG(tu_is_canary(&f->w), "%s: %s wrote weights although it failed", where, fn);
    }
    for (int i = 0; i < 4; i++) {
        const tu_tensor *t = fx_tensor(f, i);
        CHECK_MSG(memcmp(t->buf, f->snap[i], t->bytes) == 0, "%s: %s modified input %s", where, fn,
                  in_names[i]);
    }
}

#define FX_STR_(x) #x
#define FX_STR(x) FX_STR_(x)
#define EXPECT_FWD(f, st, msg) expect_impl((f), 0, (st), (msg), "line " FX_STR(__LINE__))
#define EXPECT_W(f, st, msg) expect_impl((f), 1, (st), (msg), "line " FX_STR(__LINE__))
#define EXPECT_BOTH(f, st, msg)                                                                    \
    do {                                                                                           \
        EXPECT_FWD(f, st, msg);                                                                    \
        EXPECT_W(f, st, msg);                                                                      \
    } while (0)

static inline int near(double got, double want, double tol) {
    if (isnan(got) || isnan(want))
        return isnan(got) && isnan(want);
    if (isinf(got) || isinf(want))
        return got == want;
    return fabs(got - want) <= tol * (1.0 + fabs(want));
}

/* After an accepted forward call: out and lse agree with the naive implementation in double. */
static inline void check_naive(const fx *f, double tol, int line) {
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
static inline void check_rows_sum_to_one(const fx *f, int line) {
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

/* Both calls accept the fixture as it stands: out and lse are the naive implementation's,
 * the weights are probabilities. */
#define EXPECT_ACCEPTED(f)                                                                         \
    do {                                                                                           \
        EXPECT_FWD(f, SDPA_OK, NULL);                                                              \
        check_naive(f, 1e-5, __LINE__);                                                            \
        EXPECT_W(f, SDPA_OK, NULL);                                                                \
        check_rows_sum_to_one(f, __LINE__);                                                        \
    } while (0)

/* ---- breaking one field of one tensor, a table row at a time ------------------------------ */

enum { BREAK_DATA, BREAK_DTYPE, BREAK_SHAPE, BREAK_STRIDE }; /* what a row changes */
enum { ON_FWD = 1, ON_W = 2, ON_BOTH = 3 };                  /* the calls that must fail */

/* From the baseline, tensor `tensor` gets a NULL data pointer, dtype `value`, or `value` in
 * shape[dim] or stride[dim] (a broken mask is passed as params.mask); each call in `on` must
 * then return `status` with `msg` in its message. */
typedef struct fx_break {
    int tensor, field, dim;
    int64_t value;
    int on;
    sdpa_status status;
    const char *msg;
} fx_break;

/* Runs the rows of a table on a fresh fixture, each from the baseline; failures name the
 * case and the row. */
static inline void expect_breaks(const fx_break *rows, size_t n, const char *name) {
    fx f;
    fx_init(&f);
    for (size_t i = 0; i < n; i++) {
        const fx_break *r = &rows[i];
        fx_reset(&f);
        sdpa_tensor *t = &fx_tensor(&f, r->tensor)->t;
        if (r->tensor == FX_MASK)
            f.pr.mask = t;
        if (r->field == BREAK_DATA)
            t->data = NULL;
        else if (r->field == BREAK_DTYPE)
            t->dtype = (sdpa_dtype)r->value;
        else if (r->field == BREAK_SHAPE)
            t->shape[r->dim] = r->value;
        else
            t->stride[r->dim] = r->value;
        char where[96];
        snprintf(where, sizeof where, "%s, row %zu", name, i);
        if (r->on & ON_FWD)
            expect_impl(&f, 0, r->status, r->msg, where);
        if (r->on & ON_W)
            expect_impl(&f, 1, r->status, r->msg, where);
    }
    fx_free(&f);
}

#define EXPECT_BREAKS(rows) expect_breaks((rows), sizeof(rows) / sizeof((rows)[0]), __func__)

#endif /* SDPA_TEST_VALIDATE_FIXTURE_H */
