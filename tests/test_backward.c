/*
 * test_backward.c — sdpa_backward through the public API: gradients against central
 * differences of sdpa_forward itself (end to end: the scale, the sign, GQA and dropout wired
 * the way the forward runs them), the same bytes for any thread count and on a repeated call,
 * and bad arguments refused with a named status and the outputs untouched. The reference
 * backward's own accuracy is test_ref_backward.c's subject.
 */
#include "check.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* One problem's tensors: the forward's and the backward's. */
typedef struct bw {
    tu_dims d;
    tu_tensor q, k, v, o, lse, dout, dq, dk, dv;
} bw;

static bw bw_new(tu_dims d, uint64_t seed) {
    bw b;
    b.d = d;
    tu_rng r = {seed};
    b.q = tu_alloc(SDPA_F32, d.B, d.Hq, d.Lq, d.Dk, TU_BHLD, 0, 0);
    b.k = tu_alloc(SDPA_F32, d.B, d.Hkv, d.Lk, d.Dk, TU_BLHD, 1, 0);
    b.v = tu_alloc(SDPA_F32, d.B, d.Hkv, d.Lk, d.Dv, TU_BHLD, 0, 3);
    b.o = tu_alloc(SDPA_F32, d.B, d.Hq, d.Lq, d.Dv, TU_BHLD, 0, 0);
    b.lse = tu_alloc(SDPA_F32, d.B, d.Hq, d.Lq, 1, TU_BHLD, 0, 0);
    b.dout = tu_alloc(SDPA_F32, d.B, d.Hq, d.Lq, d.Dv, TU_BHLD, 0, 0);
    b.dq = tu_alloc(SDPA_F32, d.B, d.Hq, d.Lq, d.Dk, TU_BLHD, 0, 0);
    b.dk = tu_alloc(SDPA_F32, d.B, d.Hkv, d.Lk, d.Dk, TU_BHLD, 2, 1);
    b.dv = tu_alloc(SDPA_F16, d.B, d.Hkv, d.Lk, d.Dv, TU_BHLD, 0, 0);
    tu_fill_randn(&b.q, &r, 1, 0);
    tu_fill_randn(&b.k, &r, 1, 0);
    tu_fill_randn(&b.v, &r, 1, 0);
    tu_fill_randn(&b.dout, &r, 1, 0);
    return b;
}

static void bw_free(bw *b) {
    tu_tensor *all[] = {&b->q, &b->k, &b->v, &b->o, &b->lse, &b->dout, &b->dq, &b->dk, &b->dv};
    for (size_t n = 0; n < sizeof all / sizeof all[0]; n++)
        tu_free(all[n]);
}

static sdpa_status forward(sdpa_ctx *ctx, bw *b, const sdpa_params *p) {
    return sdpa_forward(ctx, &b->q.t, &b->k.t, &b->v.t, p, &b->o.t, &b->lse.t);
}

static sdpa_status backward(sdpa_ctx *ctx, bw *b, const sdpa_params *p) {
    return sdpa_backward(ctx, &b->q.t, &b->k.t, &b->v.t, &b->o.t, &b->lse.t, &b->dout.t, p,
                         &b->dq.t, &b->dk.t, &b->dv.t);
}

/* L = sum dout . out, with sdpa_forward's f32 output, summed in double. */
static double loss(sdpa_ctx *ctx, bw *b, const sdpa_params *p) {
    CHECK(forward(ctx, b, p) == SDPA_OK);
    double l = 0.0;
    for (int64_t i0 = 0; i0 < b->d.B; i0++)
        for (int64_t h = 0; h < b->d.Hq; h++)
            for (int64_t i = 0; i < b->d.Lq; i++)
                for (int64_t c = 0; c < b->d.Dv; c++)
                    l += tu_get(&b->dout.t, i0, h, i, c) * tu_get(&b->o.t, i0, h, i, c);
    return l;
}

/* Every element of x's gradient g against (L(x + e) - L(x - e)) / 2e, with f32 forwards:
 * e = 1e-2 leaves a truncation error of order e^2 and a rounding error of order 1e-7 / e,
 * both near 1e-4 of the gradient's scale; the bound is 2e-3 of the largest gradient. */
static void check_grad(const char *what, sdpa_ctx *ctx, bw *b, const sdpa_params *p, tu_tensor *x,
                       int64_t h_n, int64_t l_n, int64_t d_n, const sdpa_tensor *g) {
    double scale = 0.0, worst = 0.0;
    for (int64_t i0 = 0; i0 < b->d.B; i0++)
        for (int64_t h = 0; h < h_n; h++)
            for (int64_t i = 0; i < l_n; i++)
                for (int64_t c = 0; c < d_n; c++)
                    scale = fmax(scale, fabs(tu_get(g, i0, h, i, c)));
    const double e = 1e-2;
    for (int64_t i0 = 0; i0 < b->d.B; i0++)
        for (int64_t h = 0; h < h_n; h++)
            for (int64_t i = 0; i < l_n; i++)
                for (int64_t c = 0; c < d_n; c++) {
                    const double x0 = tu_get(&x->t, i0, h, i, c);
                    tu_set(&x->t, i0, h, i, c, x0 + e);
                    const double up = loss(ctx, b, p);
                    tu_set(&x->t, i0, h, i, c, x0 - e);
                    const double down = loss(ctx, b, p);
                    tu_set(&x->t, i0, h, i, c, x0);
                    const double fd = (up - down) / (2 * e);
                    worst = fmax(worst, fabs(fd - tu_get(g, i0, h, i, c)));
                }
    CHECK_MSG(scale > 0 && worst <= 2e-3 * scale, "%s: worst |fd - grad| %.3g, scale %.3g", what,
              worst, scale);
}

static void gradients_of(const char *what, tu_dims d, sdpa_params p) {
    sdpa_ctx *ctx = tu_ctx(2, SDPA_ISA_AUTO);
    bw b = bw_new(d, 77);
    CHECK(forward(ctx, &b, &p) == SDPA_OK);
    CHECK(backward(ctx, &b, &p) == SDPA_OK);
    char name[128];
    snprintf(name, sizeof name, "%s: dq", what);
    check_grad(name, ctx, &b, &p, &b.q, d.Hq, d.Lq, d.Dk, &b.dq.t);
    snprintf(name, sizeof name, "%s: dk", what);
    check_grad(name, ctx, &b, &p, &b.k, d.Hkv, d.Lk, d.Dk, &b.dk.t);
    snprintf(name, sizeof name, "%s: dv", what);
    check_grad(name, ctx, &b, &p, &b.v, d.Hkv, d.Lk, d.Dv, &b.dv.t);
    bw_free(&b);
    sdpa_ctx_destroy(ctx);
}

/* The gradients of sdpa_forward as it runs (on whichever kernel this CPU picks), for plain,
 * causal bottom-right GQA with softcap and ALiBi, and dropout (the same mask both ways). */
static void test_against_forward(void) {
    const tu_dims plain = {1, 2, 2, 5, 7, 4, 3};
    gradients_of("plain", plain, (sdpa_params){0});
    const float slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
    sdpa_params p = {0};
    p.causal = 1;
    p.align = SDPA_ALIGN_BOTTOM_RIGHT;
    p.softcap = 2.0f;
    p.alibi_slopes = slopes;
    const tu_dims gqa = {2, 4, 2, 3, 6, 5, 4};
    gradients_of("causal bottom-right GQA softcap ALiBi", gqa, p);
    sdpa_params pd = {0};
    pd.dropout_p = 0.3f;
    pd.dropout_seed = 1234;
    pd.dropout_offset = 7;
    gradients_of("dropout 0.3", plain, pd);
}

/* Bitwise the same gradients for 1, 2 and 5 threads and on a repeated call, at every ISA
 * cap the machine has (and with no cap): each cap against its own one-thread result, since
 * the tables' products may differ from each other in the last bit. */
static void test_deterministic(void) {
    const tu_dims d = {2, 4, 2, 9, 13, 8, 6};
    sdpa_params p = {0};
    p.causal = 1;
    bw fwd = bw_new(d, 5);
    sdpa_ctx *c1 = tu_ctx(1, SDPA_ISA_AUTO);
    CHECK(forward(c1, &fwd, &p) == SDPA_OK);
    sdpa_ctx_destroy(c1);
    const int threads[3] = {1, 2, 5};
    tu_impl impls[TU_MAX_IMPLS];
    const int n_impls = tu_impls(impls);
    for (int n = 0; n <= n_impls; n++) {
        const sdpa_isa cap = n == n_impls ? SDPA_ISA_AUTO : impls[n].level;
        if (n < n_impls && !impls[n].runs)
            continue;
        bw ref = bw_new(d, 5);
        for (int t = 0; t < 3; t++) {
            bw b = bw_new(d, 5);
            sdpa_ctx *ctx = tu_ctx(threads[t], cap);
            tu_copy(&b.o.t, &fwd.o.t); /* the forward's outputs as the first context wrote */
            tu_copy(&b.lse.t, &fwd.lse.t);
            for (int rep = 0; rep < 2; rep++) {
                CHECK(backward(ctx, &b, &p) == SDPA_OK);
                if (t == 0 && rep == 0) {
                    tu_copy(&ref.dq.t, &b.dq.t);
                    tu_copy(&ref.dk.t, &b.dk.t);
                    tu_copy(&ref.dv.t, &b.dv.t);
                }
                CHECK_MSG(memcmp(b.dq.buf, ref.dq.buf, ref.dq.bytes) == 0 &&
                              memcmp(b.dk.buf, ref.dk.buf, ref.dk.bytes) == 0 &&
                              memcmp(b.dv.buf, ref.dv.buf, ref.dv.bytes) == 0,
                          "cap %s, %d threads, call %d: other bytes", sdpa_isa_name(cap),
                          threads[t], rep + 1);
            }
            sdpa_ctx_destroy(ctx);
            bw_free(&b);
        }
        bw_free(&ref);
    }
    bw_free(&fwd);
}

/* Bad arguments: the status, a message naming the argument, and dq, dk, dv untouched. */
static void expect_refused(const char *what, sdpa_ctx *ctx, bw *b, const sdpa_params *p,
                           const sdpa_tensor *dq, const sdpa_tensor *dk, sdpa_status want,
                           const char *message) {
    tu_fill_canary(&b->dq);
    tu_fill_canary(&b->dk);
    tu_fill_canary(&b->dv);
    const sdpa_status st =
        sdpa_backward(ctx, &b->q.t, &b->k.t, &b->v.t, &b->o.t, &b->lse.t, &b->dout.t, p,
                      (sdpa_tensor *)dq, (sdpa_tensor *)dk, &b->dv.t);
    CHECK_MSG(st == want, "%s: %s, want %s", what, sdpa_status_name(st), sdpa_status_name(want));
    CHECK_MSG(strstr(sdpa_ctx_last_error(ctx), message) != NULL, "%s: \"%s\" lacks \"%s\"", what,
              sdpa_ctx_last_error(ctx), message);
    CHECK_MSG(tu_is_canary(&b->dq) && tu_is_canary(&b->dk) && tu_is_canary(&b->dv),
              "%s: an output was written", what);
}

static void test_bad_arguments(void) {
    const tu_dims d = {1, 2, 1, 3, 4, 4, 2};
    bw b = bw_new(d, 9);
    sdpa_ctx *ctx = tu_ctx(1, SDPA_ISA_AUTO);
    sdpa_params p = {0};
    CHECK(forward(ctx, &b, &p) == SDPA_OK);
    /* dout of the wrong shape: Dk instead of Dv */
    tu_tensor wide = tu_alloc(SDPA_F32, d.B, d.Hq, d.Lq, d.Dk, TU_BHLD, 0, 0);
    sdpa_tensor saved = b.dout.t;
    b.dout.t = wide.t;
    expect_refused("dout (.., Dk)", ctx, &b, &p, &b.dq.t, &b.dk.t, SDPA_ERR_SHAPE, "dout");
    b.dout.t = saved;
    /* an lse of f16 */
    tu_tensor lse16 = tu_alloc(SDPA_F16, d.B, d.Hq, d.Lq, 1, TU_BHLD, 0, 0);
    saved = b.lse.t;
    b.lse.t = lse16.t;
    expect_refused("lse f16", ctx, &b, &p, &b.dq.t, &b.dk.t, SDPA_ERR_DTYPE, "lse");
    b.lse.t = saved;
    /* dq over q, dk over dv's bytes */
    expect_refused("dq = q", ctx, &b, &p, &b.q.t, &b.dk.t, SDPA_ERR_ALIAS, "dq");
    sdpa_tensor dk_on_dout = b.dk.t;
    dk_on_dout.data = b.dout.t.data;
    dk_on_dout.dtype = SDPA_F32;
    expect_refused("dk over dout", ctx, &b, &p, &b.dq.t, &dk_on_dout, SDPA_ERR_ALIAS, "dk");
    /* a missing dk; dropout_p outside [0, 1) */
    expect_refused("dk NULL", ctx, &b, &p, &b.dq.t, NULL, SDPA_ERR_NULL, "dk");
    const float bad_p[4] = {1.0f, -0.1f, NAN, 2.0f};
    for (int n = 0; n < 4; n++) {
        p.dropout_p = bad_p[n];
        expect_refused("dropout_p", ctx, &b, &p, &b.dq.t, &b.dk.t, SDPA_ERR_PARAM,
                       "params.dropout_p=");
    }
    p.dropout_p = 0.5f;
    CHECK(sdpa_forward(ctx, &b.q.t, &b.k.t, &b.v.t, &p, &b.o.t, NULL) == SDPA_OK);
    CHECK(sdpa_backward(NULL, &b.q.t, &b.k.t, &b.v.t, &b.o.t, &b.lse.t, &b.dout.t, &p, &b.dq.t,
                        &b.dk.t, &b.dv.t) == SDPA_ERR_NULL);
    tu_free(&wide);
    tu_free(&lse16);
    sdpa_ctx_destroy(ctx);
    bw_free(&b);
}

/* A forward with dropout draws its mask by (seed, offset): the same pair gives the same mask
 * on every kernel cap (outputs equal to f32 rounding: the tables sum in their own orders),
 * another offset another output, p = 0 the plain forward. */
static double max_diff(const bw *x, const bw *y) {
    double worst = 0.0;
    const float *a = x->o.buf, *b = y->o.buf;
    for (size_t n = 0; n < x->o.bytes / sizeof *a; n++)
        worst = fmax(worst, fabs((double)a[n] - (double)b[n]));
    return worst;
}

static void test_dropout_forward(void) {
    const tu_dims d = {1, 2, 2, 6, 10, 4, 4};
    sdpa_params p = {0};
    p.dropout_p = 0.4f;
    p.dropout_seed = 99;
    bw a = bw_new(d, 3), c = bw_new(d, 3);
    sdpa_ctx *ctx = tu_ctx(2, SDPA_ISA_AUTO), *gen = tu_ctx(1, SDPA_ISA_GENERIC);
    CHECK(forward(ctx, &a, &p) == SDPA_OK && forward(gen, &c, &p) == SDPA_OK);
    CHECK_MSG(max_diff(&a, &c) <= 1e-5, "the same mask differs by %g", max_diff(&a, &c));
    p.dropout_offset = 1;
    CHECK(forward(gen, &c, &p) == SDPA_OK);
    CHECK_MSG(max_diff(&a, &c) > 1e-2, "another offset differs by %g only", max_diff(&a, &c));
    sdpa_params none = {0};
    none.dropout_seed = 99; /* no effect without dropout_p */
    CHECK(forward(ctx, &a, &none) == SDPA_OK && forward(ctx, &c, &(sdpa_params){0}) == SDPA_OK);
    CHECK(memcmp(a.o.buf, c.o.buf, a.o.bytes) == 0);
    sdpa_ctx_destroy(ctx);
    sdpa_ctx_destroy(gen);
    bw_free(&a);
    bw_free(&c);
}

CHECK_MAIN(CASE(test_against_forward), CASE(test_deterministic), CASE(test_bad_arguments),
           CASE(test_dropout_forward))
