/*
 * test_ref_backward.c — the reference backward (src/ref/ref_backward.c), dropout included.
 *
 * The backward is checked against f64 central differences (testing.md: eps = 1e-6, error at
 * most 1e-6 relative to the largest gradient) of a forward in double written here, from the
 * header's Semantics, on tiny shapes: every feature alone and several together, f16 and bf16
 * storage, strided views, fully masked rows, and dropout, whose mask is fixed by its seed so
 * the dropped forward is an ordinary smooth function of q, k and v. Beside the gradients each
 * case checks that the reference forward (with the case's dropout) agrees with the same double
 * forward and keeps its LSE, that every element of dq, dk and dv is written and nothing around
 * them, that keys no query sees and rows that see no key get exactly 0, and that a second call
 * gives the same bytes. Then NaN (hidden keys' NaN reaches no gradient; a NaN row's reaches
 * exactly what it sees) and running out of memory. The generator itself: test_dropout.c.
 */
#include "check.h"
#include "testutil.h"

#include "../src/core/philox.h"
#include "../src/core/validate.h"
#include "../src/ref/ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the forward in double, and its central differences ---------------------------------- */

/* Everything the double forward needs besides q, k and v; arrays contiguous (B, H, L, D). */
typedef struct fd_problem {
    tu_dims d;
    double scale, softcap; /* softcap 0 = off */
    int64_t off, wl, wr;   /* the window rule's offset and bounds, -1 = open */
    const double *slopes;  /* NULL or Hq ALiBi slopes */
    const double *bias;    /* NULL or (B, Hq, Lq, Lk): -inf hides the key, else added */
    double drop_p;         /* 0 = no dropout */
    uint64_t drop_seed, drop_offset;
    const double *dout; /* (B, Hq, Lq, Dv) */
} fd_problem;

static int64_t at4(int64_t n1, int64_t n2, int64_t n3, int64_t a, int64_t b, int64_t c, int64_t d) {
    return ((a * n1 + b) * n2 + c) * n3 + d;
}

/* Whether query i sees key j of (b, h): the window rule and the mask's -inf. */
static int fd_visible(const fd_problem *f, int64_t b, int64_t h, int64_t i, int64_t j) {
    if (f->wl >= 0 && j < i + f->off - f->wl)
        return 0;
    if (f->wr >= 0 && j > i + f->off + f->wr)
        return 0;
    return f->bias == NULL || f->bias[at4(f->d.Hq, f->d.Lq, f->d.Lk, b, h, i, j)] != -INFINITY;
}

/* O = dropout(softmax(S)) V by sdpa.h's Semantics, in double; @return L = sum dout o O, and O
 * into out (B, Hq, Lq, Dv) when out is not NULL. Fully masked rows are 0. The keep decision
 * is the library's: the mask is a function of the seed, and this file tests it below. */
static double fd_forward(const fd_problem *f, const double *q, const double *k, const double *v,
                         double *out) {
    const tu_dims d = f->d;
    const int64_t group = d.Hq / d.Hkv;
    double loss = 0.0, s[16], o[16];
    for (int64_t b = 0; b < d.B; b++)
        for (int64_t h = 0; h < d.Hq; h++)
            for (int64_t i = 0; i < d.Lq; i++) {
                const int64_t hk = h / group;
                double m = -INFINITY;
                for (int64_t j = 0; j < d.Lk; j++) {
                    s[j] = -INFINITY;
                    if (!fd_visible(f, b, h, i, j))
                        continue;
                    double x = 0.0;
                    for (int64_t c = 0; c < d.Dk; c++)
                        x += q[at4(d.Hq, d.Lq, d.Dk, b, h, i, c)] *
                             k[at4(d.Hkv, d.Lk, d.Dk, b, hk, j, c)];
                    x *= f->scale;
                    if (f->softcap > 0.0)
                        x = f->softcap * tanh(x / f->softcap);
                    if (f->slopes != NULL)
                        x -= f->slopes[h] * fabs((double)(i + f->off - j));
                    if (f->bias != NULL)
                        x += f->bias[at4(d.Hq, d.Lq, d.Lk, b, h, i, j)];
                    s[j] = x;
                    m = x > m ? x : m;
                }
                double sum = 0.0;
                for (int64_t j = 0; j < d.Lk; j++)
                    sum += s[j] == -INFINITY ? 0.0 : exp(s[j] - m);
                for (int64_t c = 0; c < d.Dv; c++)
                    o[c] = 0.0;
                for (int64_t j = 0; j < d.Lk && m != -INFINITY; j++) {
                    if (s[j] == -INFINITY)
                        continue;
                    double w = exp(s[j] - m) / sum;
                    if (f->drop_p > 0.0)
                        w *= sdpa__dropout_keep(f->drop_seed, f->drop_offset, b, h, i, j, f->drop_p)
                                 ? 1.0 / (1.0 - f->drop_p)
                                 : 0.0;
                    for (int64_t c = 0; c < d.Dv; c++)
                        o[c] += w * v[at4(d.Hkv, d.Lk, d.Dv, b, hk, j, c)];
                }
                for (int64_t c = 0; c < d.Dv; c++) {
                    const int64_t n = at4(d.Hq, d.Lq, d.Dv, b, h, i, c);
                    loss += f->dout[n] * o[c];
                    if (out != NULL)
                        out[n] = o[c];
                }
            }
    return loss;
}

/* dL/dx[n] for every n < count by central differences, x perturbed in place and restored. */
static void fd_gradient(const fd_problem *f, double *q, double *k, double *v, double *x,
                        size_t count, double *grad) {
    const double eps = 1e-6;
    for (size_t n = 0; n < count; n++) {
        const double keep = x[n];
        x[n] = keep + eps;
        const double up = fd_forward(f, q, k, v, NULL);
        x[n] = keep - eps;
        const double down = fd_forward(f, q, k, v, NULL);
        x[n] = keep;
        grad[n] = (up - down) / (2.0 * eps);
    }
}

/* ---- one case ------------------------------------------------------------------------------ */

enum mask_kind { MASK_NONE, MASK_BOOL, MASK_ADD };

typedef struct bw_case {
    tu_dims d;
    sdpa_params params; /* mask and alibi_slopes are set by run_case */
    int mask;           /* enum mask_kind: full (B, Hq, Lq, Lk), about 30% hidden */
    int masked_row;     /* > 0: query row masked_row - 1 hidden from every key by the mask */
    int alibi;
    double q_scale; /* q's spread (peaky scores for softcap); 0 = 1 */
    sdpa_dtype dt;  /* every tensor's storage */
    tu_layout layout;
    int64_t pad, offset; /* row padding and base offset of every tensor */
    double drop_p;
    uint64_t drop_seed, drop_offset;
    uint64_t seed;
} bw_case;

static bw_case base(int64_t lq, int64_t lk, int64_t dk, int64_t dv) {
    bw_case c;
    memset(&c, 0, sizeof c);
    c.d = (tu_dims){1, 2, 2, lq, lk, dk, dv};
    c.dt = SDPA_F32;
    c.seed = 1;
    return c;
}

/* Half a unit in the last place, relative, of a storage type. */
static double half_ulp(sdpa_dtype dt) {
    return dt == SDPA_F32 ? 0x1p-24 : dt == SDPA_F16 ? 0x1p-11 : 0x1p-8;
}

/* Half the smallest subnormal of a storage type: rounding error near 0. */
static double half_tiny(sdpa_dtype dt) {
    return dt == SDPA_F32 ? 0x1p-150 : dt == SDPA_F16 ? 0x1p-25 : 0x1p-134;
}

/* got against the central differences fd: |got - fd| <= 1e-6 max|fd| + the storage type's
 * rounding of got. @return 1 if within; prints the figures. */
static int within(const char *name, const char *what, const double *got, const double *fd, size_t n,
                  sdpa_dtype dt) {
    double scale = 0.0, worst = 0.0;
    size_t worst_at = 0;
    int ok = 1;
    for (size_t x = 0; x < n; x++)
        scale = fabs(fd[x]) > scale ? fabs(fd[x]) : scale;
    for (size_t x = 0; x < n; x++) {
        const double err = fabs(got[x] - fd[x]);
        const double bound = 1e-6 * scale + 1e-9 + half_ulp(dt) * fabs(fd[x]) + half_tiny(dt);
        if (!(err <= bound))
            ok = 0;
        if (!(err <= worst)) {
            worst = err;
            worst_at = x;
        }
    }
    printf("    %-44s %s: max|fd| %.3g, max err %.3g (rel %.2g)%s\n", name, what, scale, worst,
           scale > 0 ? worst / scale : 0.0, ok ? "" : "  FAILS");
    if (!ok)
        printf("      e.g. [%zu] %.12g vs %.12g\n", worst_at, got[worst_at], fd[worst_at]);
    return ok;
}

/* Runs one case. @return 1 if everything agrees. */
static int run_case(const char *name, const bw_case *c) {
    const tu_dims d = c->d;
    tu_rng r = {c->seed};
    tu_tensor q = tu_alloc(c->dt, d.B, d.Hq, d.Lq, d.Dk, c->layout, c->pad, c->offset);
    tu_tensor k = tu_alloc(c->dt, d.B, d.Hkv, d.Lk, d.Dk, c->layout, c->pad, c->offset);
    tu_tensor v = tu_alloc(c->dt, d.B, d.Hkv, d.Lk, d.Dv, c->layout, c->pad, c->offset);
    tu_tensor dout = tu_alloc(c->dt, d.B, d.Hq, d.Lq, d.Dv, c->layout, c->pad, c->offset);
    tu_tensor o = tu_alloc(c->dt, d.B, d.Hq, d.Lq, d.Dv, c->layout, c->pad, c->offset);
    tu_tensor lse = tu_alloc(SDPA_F32, d.B, d.Hq, d.Lq, 1, TU_BHLD, 0, 0);
    tu_tensor lse0 = tu_alloc(SDPA_F32, d.B, d.Hq, d.Lq, 1, TU_BHLD, 0, 0);
    tu_tensor dq = tu_alloc(c->dt, d.B, d.Hq, d.Lq, d.Dk, c->layout, c->pad, c->offset);
    tu_tensor dk = tu_alloc(c->dt, d.B, d.Hkv, d.Lk, d.Dk, c->layout, c->pad, c->offset);
    tu_tensor dv = tu_alloc(c->dt, d.B, d.Hkv, d.Lk, d.Dv, c->layout, c->pad, c->offset);
    tu_fill_randn(&q, &r, c->q_scale > 0 ? c->q_scale : 1.0, 0.0);
    tu_fill_randn(&k, &r, 1.0, 0.0);
    tu_fill_randn(&v, &r, 1.0, 0.0);
    tu_fill_randn(&dout, &r, 1.0, 0.0);

    sdpa_params params = c->params;
    tu_tensor m = {0};
    if (c->mask != MASK_NONE) {
        m = tu_alloc(c->mask == MASK_BOOL ? SDPA_BOOL : SDPA_F32, d.B, d.Hq, d.Lq, d.Lk, TU_BHLD, 0,
                     0);
        for (int64_t a = 0; a < d.B; a++)
            for (int64_t h = 0; h < d.Hq; h++)
                for (int64_t i = 0; i < d.Lq; i++)
                    for (int64_t j = 0; j < d.Lk; j++) {
                        const int hole = tu_uniform(&r) < 0.3 || i == c->masked_row - 1;
                        const double bias = hole ? -INFINITY : tu_randn(&r);
                        tu_set(&m.t, a, h, i, j, c->mask == MASK_BOOL ? !hole : bias);
                    }
        params.mask = &m.t;
    }
    float slopes[8];
    double slopes_d[8];
    if (c->alibi) {
        for (int64_t h = 0; h < d.Hq; h++) {
            slopes[h] = (float)pow(2.0, -2.0 * (double)(h + 1) / (double)d.Hq);
            slopes_d[h] = slopes[h];
        }
        params.alibi_slopes = slopes;
    }

    /* the problem as the validator makes it, with the case's dropout on top (the public
     * parameters do not carry dropout yet) */
    sdpa_ctx *ctx = tu_ctx(1, SDPA_ISA_AUTO);
    sdpa__problem p;
    sdpa_status st = sdpa__check_forward(ctx, &q.t, &k.t, &v.t, &params, &o.t, &lse.t, &p);
    CHECK_MSG(st == SDPA_OK, "%s: validation: %s", name, sdpa_ctx_last_error(ctx));
    int ok = st == SDPA_OK;

    /* the double forward's view of the same (already rounded) values */
    double *qd = tu_to_doubles(&q.t), *kd = tu_to_doubles(&k.t), *vd = tu_to_doubles(&v.t);
    double *dod = tu_to_doubles(&dout.t), *bias = m.buf ? tu_to_doubles(&m.t) : NULL;
    if (bias != NULL && c->mask == MASK_BOOL)
        for (int64_t n = 0; n < d.B * d.Hq * d.Lq * d.Lk; n++)
            bias[n] = bias[n] != 0.0 ? 0.0 : -INFINITY;
    const fd_problem f = {d,
                          p.scale,
                          p.softcap,
                          p.off,
                          p.window_left,
                          p.window_right,
                          c->alibi ? slopes_d : NULL,
                          bias,
                          c->drop_p,
                          c->drop_seed,
                          c->drop_offset,
                          dod};
    const size_t nq = (size_t)(d.B * d.Hq * d.Lq * d.Dk), nk = (size_t)(d.B * d.Hkv * d.Lk * d.Dk);
    const size_t nv = (size_t)(d.B * d.Hkv * d.Lk * d.Dv), no = (size_t)(d.B * d.Hq * d.Lq * d.Dv);
    double *want_o = malloc(no * sizeof(double));
    fd_forward(&f, qd, kd, vd, want_o);

    if (ok) {
        /* 1. the reference forward, dropout included, against the double forward; the LSE
         * is the softmax's whatever the dropout */
        CHECK(sdpa__ref_forward(ctx, &p, &o.t, &lse0.t) == SDPA_OK);
        p.dropout_p = c->drop_p;
        p.dropout_seed = c->drop_seed;
        p.dropout_offset = c->drop_offset;
        CHECK(sdpa__ref_forward(ctx, &p, &o.t, &lse.t) == SDPA_OK);
        CHECK_MSG(memcmp(lse.buf, lse0.buf, lse.bytes) == 0, "%s: dropout moved the LSE", name);
        double *got_o = tu_to_doubles(&o.t);
        for (size_t n = 0; n < no; n++)
            if (!(fabs(got_o[n] - want_o[n]) <=
                  2.0 * half_ulp(c->dt) * fabs(want_o[n]) + half_tiny(c->dt) + 1e-15)) {
                CHECK_MSG(0, "%s: forward [%zu] %.9g vs %.9g", name, n, got_o[n], want_o[n]);
                ok = 0;
                break;
            }
        free(got_o);

        /* 2. the backward: every element written, nothing around them */
        tu_fill_canary(&dq);
        tu_fill_canary(&dk);
        tu_fill_canary(&dv);
        st = sdpa__ref_backward(ctx, &p, &dout.t, &dq.t, &dk.t, &dv.t);
        CHECK_MSG(st == SDPA_OK, "%s: backward: %s", name, sdpa_status_name(st));
        CHECK_MSG(tu_written_exactly(&dq, 0xA5) && tu_written_exactly(&dk, 0xA5) &&
                      tu_written_exactly(&dv, 0xA5),
                  "%s: an element left unwritten or a byte around them touched", name);

        /* 3. against central differences */
        double *gq = tu_to_doubles(&dq.t), *gk = tu_to_doubles(&dk.t), *gv = tu_to_doubles(&dv.t);
        double *fq = malloc(nq * sizeof(double)), *fk = malloc(nk * sizeof(double));
        double *fv = malloc(nv * sizeof(double));
        fd_gradient(&f, qd, kd, vd, qd, nq, fq);
        fd_gradient(&f, qd, kd, vd, kd, nk, fk);
        fd_gradient(&f, qd, kd, vd, vd, nv, fv);
        ok &= within(name, "dq", gq, fq, nq, c->dt);
        ok &= within(name, "dk", gk, fk, nk, c->dt);
        ok &= within(name, "dv", gv, fv, nv, c->dt);

        /* 4. exact zeros: dq of rows that see no key, dk and dv of keys that no query sees */
        const int64_t group = d.Hq / d.Hkv;
        long kept = 0, dropped = 0;
        for (int64_t b = 0; b < d.B; b++)
            for (int64_t hk = 0; hk < d.Hkv; hk++)
                for (int64_t j = 0; j < d.Lk; j++) {
                    int seen = 0;
                    for (int64_t h = hk * group; h < (hk + 1) * group; h++)
                        for (int64_t i = 0; i < d.Lq; i++)
                            seen |= fd_visible(&f, b, h, i, j);
                    for (int64_t x = 0; x < d.Dk && !seen; x++)
                        ok &= gk[at4(d.Hkv, d.Lk, d.Dk, b, hk, j, x)] == 0.0;
                    for (int64_t x = 0; x < d.Dv && !seen; x++)
                        ok &= gv[at4(d.Hkv, d.Lk, d.Dv, b, hk, j, x)] == 0.0;
                }
        for (int64_t b = 0; b < d.B; b++)
            for (int64_t h = 0; h < d.Hq; h++)
                for (int64_t i = 0; i < d.Lq; i++) {
                    int any = 0;
                    for (int64_t j = 0; j < d.Lk; j++) {
                        const int seen = fd_visible(&f, b, h, i, j);
                        const int keep =
                            sdpa__dropout_keep(c->drop_seed, c->drop_offset, b, h, i, j, c->drop_p);
                        any |= seen;
                        kept += seen && keep;
                        dropped += seen && !keep;
                    }
                    for (int64_t x = 0; x < d.Dk && !any; x++)
                        ok &= gq[at4(d.Hq, d.Lq, d.Dk, b, h, i, x)] == 0.0;
                }

        /* a dropout case that keeps everything or nothing would test little */
        CHECK_MSG(c->drop_p == 0.0 || (kept > 0 && dropped > 0), "%s: %ld kept, %ld dropped", name,
                  kept, dropped);
        if (c->drop_p > 0.0)
            printf("    %-44s %ld visible weights kept, %ld dropped\n", name, kept, dropped);

        /* 5. the same bytes again */
        tu_tensor dq2 = tu_alloc(c->dt, d.B, d.Hq, d.Lq, d.Dk, c->layout, c->pad, c->offset);
        tu_fill_canary(&dq2);
        CHECK(sdpa__ref_backward(ctx, &p, &dout.t, &dq2.t, &dk.t, &dv.t) == SDPA_OK);
        CHECK_MSG(memcmp(dq.buf, dq2.buf, dq.bytes) == 0, "%s: a second call differs", name);
        tu_free(&dq2);
        free(gq);
        free(gk);
        free(gv);
        free(fq);
        free(fk);
        free(fv);
    }
    printf("    %-44s %s\n", name, ok ? "ok" : "MISMATCH");
    sdpa_ctx_destroy(ctx);
    free(qd);
    free(kd);
    free(vd);
    free(dod);
    free(bias);
    free(want_o);
    tu_free(&q);
    tu_free(&k);
    tu_free(&v);
    tu_free(&dout);
    tu_free(&o);
    tu_free(&lse);
    tu_free(&lse0);
    tu_free(&dq);
    tu_free(&dk);
    tu_free(&dv);
    tu_free(&m);
    return ok;
}

/* ---- the sweep ------------------------------------------------------------------------------ */

static void test_plain_and_shapes(void) {
    bw_case c = base(5, 6, 4, 4);
    c.d.B = 2;
    CHECK(run_case("no features, B=2", &c));
    c = base(4, 6, 5, 3);
    CHECK(run_case("Dk=5 Dv=3, Lq < Lk", &c));
    c = base(6, 3, 2, 5);
    CHECK(run_case("Dk=2 Dv=5, Lq > Lk", &c));
    c = base(1, 6, 4, 4);
    CHECK(run_case("Lq=1", &c));
    c = base(6, 1, 4, 4);
    CHECK(run_case("Lk=1 (dq and dk are 0)", &c));
    c = base(5, 5, 3, 3);
    c.params.scale = -0.7f;
    CHECK(run_case("scale=-0.7", &c));
}

static void test_causal_and_windows(void) {
    static const int64_t lens[][2] = {{4, 6}, {5, 5}, {6, 4}};
    for (int n = 0; n < 3; n++)
        for (int align = 0; align < 2; align++) {
            bw_case c = base(lens[n][0], lens[n][1], 3, 4);
            c.params.causal = 1;
            c.params.align = (sdpa_align)align;
            char name[64];
            snprintf(name, sizeof name, "causal %s Lq=%lld Lk=%lld",
                     align ? "bottom-right" : "top-left", (long long)c.d.Lq, (long long)c.d.Lk);
            CHECK(run_case(name, &c));
        }
    bw_case c = base(6, 6, 3, 3);
    c.params.use_window = 1;
    c.params.window_left = 1;
    c.params.window_right = 1;
    CHECK(run_case("window (1,1)", &c));
    c = base(3, 6, 3, 3);
    c.params.use_window = 1;
    c.params.window_left = 2;
    c.params.window_right = 0;
    c.params.align = SDPA_ALIGN_BOTTOM_RIGHT;
    CHECK(run_case("window (2,0) bottom-right", &c));
    c = base(6, 4, 3, 3);
    c.params.use_window = 1;
    c.params.window_left = 0;
    c.params.window_right = 0;
    CHECK(run_case("window (0,0): rows 4, 5 see nothing", &c));
}

static void test_masks_softcap_alibi(void) {
    bw_case c = base(5, 6, 4, 3);
    c.mask = MASK_BOOL;
    c.masked_row = 3;
    CHECK(run_case("bool mask, row 2 fully masked", &c));
    c = base(6, 5, 3, 4);
    c.mask = MASK_ADD;
    c.masked_row = 1;
    CHECK(run_case("additive mask, row 0 all -inf", &c));
    c = base(5, 6, 4, 4);
    c.params.softcap = 2.0f;
    c.q_scale = 3.0;
    CHECK(run_case("softcap 2, q x3", &c));
    c = base(5, 6, 4, 4);
    c.params.softcap = 0.7f;
    CHECK(run_case("softcap 0.7", &c));
    c = base(5, 6, 4, 4);
    c.alibi = 1;
    c.params.causal = 1;
    c.params.align = SDPA_ALIGN_BOTTOM_RIGHT;
    CHECK(run_case("ALiBi, causal bottom-right", &c));
}

static void test_heads(void) {
    bw_case c = base(4, 5, 3, 4);
    c.d.Hq = 4;
    c.d.Hkv = 2;
    c.params.causal = 1;
    CHECK(run_case("GQA Hq=4 Hkv=2, causal", &c));
    c = base(4, 5, 3, 4);
    c.d.B = 2;
    c.d.Hq = 3;
    c.d.Hkv = 1;
    c.mask = MASK_BOOL;
    CHECK(run_case("MQA Hq=3 Hkv=1, bool mask", &c));
}

static void test_storage(void) {
    bw_case c = base(5, 6, 4, 3);
    c.layout = TU_BLHD;
    c.pad = 2;
    c.offset = 3;
    c.d.Hq = 4;
    CHECK(run_case("(B,L,H,D), row pad 2, offset 3, GQA", &c));
    c = base(5, 6, 4, 3);
    c.pad = 3;
    c.d.B = 2;
    CHECK(run_case("(B,H,L,D), row pad 3", &c));
    static const sdpa_dtype dts[] = {SDPA_F16, SDPA_BF16};
    for (int n = 0; n < 2; n++) {
        c = base(5, 6, 4, 5);
        c.dt = dts[n];
        c.d.Hq = 4;
        c.params.causal = 1;
        c.params.align = SDPA_ALIGN_BOTTOM_RIGHT;
        c.pad = 1;
        char name[64];
        snprintf(name, sizeof name, "%s storage, GQA, causal, padded", sdpa_dtype_name(dts[n]));
        CHECK(run_case(name, &c));
    }
}

static void test_dropout_gradients(void) {
    bw_case c = base(5, 6, 4, 4);
    c.drop_p = 0.3;
    c.drop_seed = 42;
    CHECK(run_case("dropout 0.3", &c));
    c = base(6, 6, 3, 4);
    c.d.Hq = 4;
    c.drop_p = 0.5;
    c.drop_seed = 7;
    c.drop_offset = 3;
    c.params.causal = 1;
    c.params.softcap = 1.5f;
    c.alibi = 1;
    c.mask = MASK_ADD;
    CHECK(run_case("dropout 0.5, GQA, causal, softcap, ALiBi, mask", &c));
    c = base(6, 4, 4, 2);
    c.d.B = 2;
    c.drop_p = 0.9;
    c.drop_seed = UINT64_MAX;
    c.drop_offset = UINT64_MAX;
    c.params.causal = 1;
    c.params.align = SDPA_ALIGN_BOTTOM_RIGHT;
    CHECK(run_case("dropout 0.9, causal bottom-right, Lq > Lk", &c));
}

/* Everything at once. */
static void test_all_features(void) {
    bw_case c = base(6, 5, 5, 3);
    c.d.B = 2;
    c.d.Hq = 4;
    c.d.Hkv = 2;
    c.params.causal = 1;
    c.params.align = SDPA_ALIGN_BOTTOM_RIGHT;
    c.params.use_window = 1;
    c.params.window_left = 3;
    c.params.softcap = 3.0f;
    c.params.scale = 0.6f;
    c.alibi = 1;
    c.mask = MASK_BOOL;
    c.masked_row = 4;
    c.layout = TU_BLHD;
    c.pad = 1;
    c.offset = 1;
    c.drop_p = 0.25;
    c.drop_seed = 0x0123456789ABCDEFu;
    c.drop_offset = 99;
    CHECK(run_case("all features, dropout, strided", &c));
    c.dt = SDPA_F16;
    CHECK(run_case("all features, dropout, strided, f16", &c));
}

/* ---- NaN and memory ------------------------------------------------------------------------ */

/* The problem of q, k, v (F32) with params, and its backward into dq, dk, dv. */
static sdpa_status backward_of(sdpa_ctx *ctx, tu_problem *pb, double drop_p, tu_tensor *dout,
                               tu_tensor *dq, tu_tensor *dk, tu_tensor *dv) {
    sdpa__problem p;
    sdpa_status st =
        sdpa__check_forward(ctx, &pb->q.t, &pb->k.t, &pb->v.t, &pb->p, &pb->o.t, &pb->lse.t, &p);
    if (st != SDPA_OK)
        return st;
    p.dropout_p = drop_p;
    p.dropout_seed = 5;
    return sdpa__ref_backward(ctx, &p, &dout->t, &dq->t, &dk->t, &dv->t);
}

/* NaN and Inf in K and V of keys no query may see reach no gradient, with or without
 * dropout; those keys' dK and dV are exactly 0. */
static void test_hidden_nan(void) {
    enum { LQ = 4, LK = 6, D = 3 };
    tu_rng r = {17};
    tu_problem pb = tu_problem_new((tu_dims){1, 2, 1, LQ, LK, D, D}, &r);
    tu_tensor dout = tu_alloc(SDPA_F32, 1, 2, LQ, D, TU_BHLD, 0, 0);
    tu_tensor dq = tu_alloc(SDPA_F32, 1, 2, LQ, D, TU_BHLD, 0, 0);
    tu_tensor dk = tu_alloc(SDPA_F32, 1, 1, LK, D, TU_BHLD, 0, 0);
    tu_tensor dv = tu_alloc(SDPA_F32, 1, 1, LK, D, TU_BHLD, 0, 0);
    tu_tensor m = tu_alloc(SDPA_BOOL, 1, 1, 1, LK, TU_BHLD, 0, 0);
    tu_fill_randn(&dout, &r, 1, 0);
    for (int j = 0; j < LK; j++)
        tu_set(&m.t, 0, 0, 0, j, j != 2);
    /* causal top-left with Lq = 4: no query sees keys 4 and 5; the mask hides key 2 */
    pb.p.causal = 1;
    pb.p.mask = &m.t;
    tu_set(&pb.k.t, 0, 0, 2, 0, NAN);
    tu_set(&pb.v.t, 0, 0, 2, 1, INFINITY);
    tu_set(&pb.k.t, 0, 0, 5, 2, INFINITY);
    tu_set(&pb.v.t, 0, 0, 4, 0, NAN);
    sdpa_ctx *ctx = tu_ctx(1, SDPA_ISA_AUTO);
    for (int drop = 0; drop < 2; drop++) {
        CHECK_INT_EQ(backward_of(ctx, &pb, drop ? 0.5 : 0.0, &dout, &dq, &dk, &dv), SDPA_OK);
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < LQ; i++)
                for (int x = 0; x < D; x++)
                    CHECK(isfinite(tu_get(&dq.t, 0, h, i, x)));
        for (int j = 0; j < LK; j++)
            for (int x = 0; x < D; x++) {
                const double gk = tu_get(&dk.t, 0, 0, j, x), gv = tu_get(&dv.t, 0, 0, j, x);
                CHECK_MSG(isfinite(gk) && isfinite(gv), "drop=%d key %d: %g %g", drop, j, gk, gv);
                if (j == 2 || j >= 4)
                    CHECK(gk == 0.0 && gv == 0.0);
            }
    }
    sdpa_ctx_destroy(ctx);
    tu_problem_free(&pb);
    tu_free(&dout);
    tu_free(&dq);
    tu_free(&dk);
    tu_free(&dv);
    tu_free(&m);
}

/* A NaN row (NaN in q_i, causal top-left): its dq is NaN in every column, the keys it sees get
 * NaN dK and dV, and nothing else does; every other row's dq stays finite. */
static void test_nan_row(void) {
    enum { L = 5, D = 3 };
    tu_rng r = {19};
    tu_problem pb = tu_problem_new((tu_dims){1, 1, 1, L, L, D, D}, &r);
    tu_tensor dout = tu_alloc(SDPA_F32, 1, 1, L, D, TU_BHLD, 0, 0);
    tu_tensor dq = tu_alloc(SDPA_F32, 1, 1, L, D, TU_BHLD, 0, 0);
    tu_tensor dk = tu_alloc(SDPA_F32, 1, 1, L, D, TU_BHLD, 0, 0);
    tu_tensor dv = tu_alloc(SDPA_F32, 1, 1, L, D, TU_BHLD, 0, 0);
    tu_fill_randn(&dout, &r, 1, 0);
    pb.p.causal = 1;
    /* row 1 sees keys 0 and 1; rows 2.. see them too, but their own rows are finite */
    tu_set(&pb.q.t, 0, 0, 1, 2, NAN);
    sdpa_ctx *ctx = tu_ctx(1, SDPA_ISA_AUTO);
    for (int drop = 0; drop < 2; drop++) {
        CHECK_INT_EQ(backward_of(ctx, &pb, drop ? 0.5 : 0.0, &dout, &dq, &dk, &dv), SDPA_OK);
        for (int i = 0; i < L; i++)
            for (int x = 0; x < D; x++)
                CHECK((i == 1) == (isnan(tu_get(&dq.t, 0, 0, i, x)) != 0));
        for (int j = 0; j < L; j++)
            for (int x = 0; x < D; x++) {
                CHECK((j <= 1) == (isnan(tu_get(&dk.t, 0, 0, j, x)) != 0));
                CHECK((j <= 1) == (isnan(tu_get(&dv.t, 0, 0, j, x)) != 0));
            }
    }
    sdpa_ctx_destroy(ctx);
    tu_problem_free(&pb);
    tu_free(&dout);
    tu_free(&dq);
    tu_free(&dk);
    tu_free(&dv);
}

/* No memory: SDPA_ERR_NOMEM, a message, nothing written, nothing leaked. */
static void test_nomem(void) {
    tu_failing_alloc fa = {0};
    sdpa_ctx_params cp = {0};
    cp.n_threads = 1;
    cp.allocator = tu_failing_allocator(&fa);
    sdpa_ctx *ctx = NULL;
    CHECK_INT_EQ(sdpa_ctx_create(&cp, &ctx), SDPA_OK);
    tu_rng r = {23};
    tu_problem pb = tu_problem_new((tu_dims){1, 2, 2, 4, 5, 3, 3}, &r);
    tu_tensor dout = tu_alloc(SDPA_F32, 1, 2, 4, 3, TU_BHLD, 0, 0);
    tu_tensor dq = tu_alloc(SDPA_F32, 1, 2, 4, 3, TU_BHLD, 0, 0);
    tu_tensor dk = tu_alloc(SDPA_F32, 1, 2, 5, 3, TU_BHLD, 0, 0);
    tu_tensor dv = tu_alloc(SDPA_F32, 1, 2, 5, 3, TU_BHLD, 0, 0);
    tu_fill_canary(&dq);
    tu_fill_canary(&dk);
    tu_fill_canary(&dv);
    const long before = fa.outstanding;
    fa.fail = 1;
    CHECK_INT_EQ(backward_of(ctx, &pb, 0.0, &dout, &dq, &dk, &dv), SDPA_ERR_NOMEM);
    CHECK_STR_CONTAINS(sdpa_ctx_last_error(ctx), "reference backward");
    CHECK(tu_is_canary(&dq) && tu_is_canary(&dk) && tu_is_canary(&dv));
    CHECK_INT_EQ(fa.outstanding, before);
    fa.fail = 0;
    CHECK_INT_EQ(backward_of(ctx, &pb, 0.0, &dout, &dq, &dk, &dv), SDPA_OK);
    CHECK_INT_EQ(fa.outstanding, before);
    sdpa_ctx_destroy(ctx);
    tu_problem_free(&pb);
    tu_free(&dout);
    tu_free(&dq);
    tu_free(&dk);
    tu_free(&dv);
}

int main(int argc, char **argv) {
    return CHECK_RUN(argc, argv, CASE(test_plain_and_shapes), CASE(test_causal_and_windows),
                     CASE(test_masks_softcap_alibi), CASE(test_heads), CASE(test_storage),
                     CASE(test_dropout_gradients), CASE(test_all_features), CASE(test_hidden_nan),
                     CASE(test_nan_row), CASE(test_nomem));
}
