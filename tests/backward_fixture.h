/*
 * backward_fixture.h — what test_flash_backward.c and test_backward_schedules.c share: a
 * backward problem's tensors (with its golden forward), the call through the public API or the
 * internal tuning hook (sdpa__flash_backward_tuned), the golden (the reference backward in
 * double), the same-precision baseline (a naive backward written here: S and P materialised per
 * head, every product summed in float and every intermediate rounded to the storage type, as a
 * framework's math path would do it), testing.md's gradient rule, and run_case, which holds
 * every table the CPU runs to it.
 *
 * Header-only, like validate_fixture.h and for the same reason: the CHECKs count in the
 * program that includes them. The functions are static inline so that a program that does not
 * use one of them is not warned about it.
 */
#ifndef SDPA_TEST_BACKWARD_FIXTURE_H
#define SDPA_TEST_BACKWARD_FIXTURE_H

#include "check.h"
#include "testutil.h"

#include "../src/attn/flash.h"
#include "../src/core/half.h"
#include "../src/core/philox.h"
#include "../src/core/validate.h"
#include "../src/dispatch/impl.h"
#include "../src/ref/ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- one problem's tensors ---------------------------------------------------------------- */

enum mask_kind { MASK_NONE, MASK_BOOL, MASK_ADD, MASK_ADD_F16_BCAST };

typedef struct fb_case {
    tu_dims d;
    sdpa_params p; /* mask and alibi_slopes are set by the case's fields below */
    int mask;      /* enum mask_kind: random holes (~25%), and every 4th row hidden whole */
    int alibi;
    sdpa_dtype dt; /* storage of q, k, v, out, dout and the gradients */
    tu_layout layout;
    int64_t pad, offset; /* row padding and base offset of every tensor */
    int64_t nan_q;       /* > 0: q[0, 0, nan_q - 1, 0] is NaN (a NaN row) */
    int64_t nan_dout;    /* > 0: dout[0, 0, nan_dout - 1, 1] is NaN */
    uint64_t seed;
    int tuned;               /* run the flash backward with these tunables (dq_budget 0: the */
    sdpa__bwd_tuning tuning; /* schedule of two kinds of task) instead of sdpa_backward */
} fb_case;

typedef struct fb_tensors {
    tu_tensor q, k, v, o, lse, dout, dq, dk, dv, mask;
    float slopes[64];
    sdpa_params p;
    int tuned; /* as in the case; then impl is the implementation to run */
    sdpa__bwd_tuning tuning;
    const sdpa__impl *impl;
} fb_tensors;

static inline fb_case plain(int64_t hq, int64_t hkv, int64_t lq, int64_t lk, int64_t dk,
                            int64_t dv) {
    fb_case c;
    memset(&c, 0, sizeof c);
    c.d = (tu_dims){1, hq, hkv, lq, lk, dk, dv};
    c.dt = SDPA_F32;
    c.seed = 1;
    return c;
}

/* Fills *t in place: its params point into it (the mask, the slopes). */
static inline void make(const fb_case *c, fb_tensors *t) {
    const tu_dims d = c->d;
    memset(t, 0, sizeof *t);
    tu_rng r = {c->seed};
    t->q = tu_alloc(c->dt, d.B, d.Hq, d.Lq, d.Dk, c->layout, c->pad, c->offset);
    t->k = tu_alloc(c->dt, d.B, d.Hkv, d.Lk, d.Dk, c->layout, c->pad, c->offset);
    t->v = tu_alloc(c->dt, d.B, d.Hkv, d.Lk, d.Dv, c->layout, c->pad, c->offset);
    t->o = tu_alloc(c->dt, d.B, d.Hq, d.Lq, d.Dv, c->layout, c->pad, c->offset);
    t->lse = tu_alloc(SDPA_F32, d.B, d.Hq, d.Lq, 1, TU_BHLD, 0, 0);
    t->dout = tu_alloc(c->dt, d.B, d.Hq, d.Lq, d.Dv, c->layout, c->pad, c->offset);
    t->dq = tu_alloc(c->dt, d.B, d.Hq, d.Lq, d.Dk, c->layout, c->pad, c->offset);
    t->dk = tu_alloc(c->dt, d.B, d.Hkv, d.Lk, d.Dk, c->layout, c->pad, c->offset);
    t->dv = tu_alloc(c->dt, d.B, d.Hkv, d.Lk, d.Dv, c->layout, c->pad, c->offset);
    tu_fill_randn(&t->q, &r, 1.0, 0.0);
    tu_fill_randn(&t->k, &r, 1.0, 0.0);
    tu_fill_randn(&t->v, &r, 1.0, 0.0);
    tu_fill_randn(&t->dout, &r, 1.0, 0.0);
    if (c->nan_q > 0)
        tu_set(&t->q.t, 0, 0, c->nan_q - 1, 0, NAN);
    if (c->nan_dout > 0)
        tu_set(&t->dout.t, 0, 0, c->nan_dout - 1, d.Dv > 1 ? 1 : 0, NAN);
    t->p = c->p;
    t->tuned = c->tuned;
    t->tuning = c->tuning;
    if (c->mask != MASK_NONE) {
        const int bcast = c->mask == MASK_ADD_F16_BCAST;
        const sdpa_dtype mdt = c->mask == MASK_BOOL ? SDPA_BOOL : bcast ? SDPA_F16 : SDPA_F32;
        const int64_t mb = bcast ? 1 : d.B, mh = bcast ? 1 : d.Hq;
        t->mask = tu_alloc(mdt, mb, mh, d.Lq, d.Lk, TU_BHLD, 0, 0);
        for (int64_t b = 0; b < mb; b++)
            for (int64_t h = 0; h < mh; h++)
                for (int64_t i = 0; i < d.Lq; i++)
                    for (int64_t j = 0; j < d.Lk; j++) {
                        const int hole = tu_uniform(&r) < 0.25 || i % 4 == 1;
                        const double bias = hole ? -INFINITY : tu_randn(&r);
                        tu_set(&t->mask.t, b, h, i, j, mdt == SDPA_BOOL ? !hole : bias);
                    }
        t->p.mask = &t->mask.t;
    }
    if (c->alibi) {
        for (int64_t h = 0; h < d.Hq && h < 64; h++)
            t->slopes[h] = (float)pow(2.0, -8.0 * (double)(h + 1) / (double)d.Hq);
        t->p.alibi_slopes = t->slopes;
    }
}

static inline void release(fb_tensors *t) {
    tu_tensor *all[] = {&t->q,    &t->k,  &t->v,  &t->o,  &t->lse,
                        &t->dout, &t->dq, &t->dk, &t->dv, &t->mask};
    for (size_t n = 0; n < sizeof all / sizeof all[0]; n++)
        tu_free(all[n]);
}

/* sdpa_backward, or with t->tuned the flash backward of t->impl with t->tuning (the internal
 * hook that makes the one-pass schedule run in several waves, with fewer chunks or several key
 * blocks to a step, or fall back to two kinds of task). */
static inline sdpa_status backward(sdpa_ctx *ctx, fb_tensors *t) {
    if (!t->tuned)
        return sdpa_backward(ctx, &t->q.t, &t->k.t, &t->v.t, &t->o.t, &t->lse.t, &t->dout.t, &t->p,
                             &t->dq.t, &t->dk.t, &t->dv.t);
    sdpa__problem p;
    sdpa_status st = sdpa__check_backward(ctx, &t->q.t, &t->k.t, &t->v.t, &t->o.t, &t->lse.t,
                                          &t->dout.t, &t->p, &t->dq.t, &t->dk.t, &t->dv.t, &p);
    if (st == SDPA_OK)
        st = sdpa__flash_backward_tuned(t->impl, ctx, &p, &t->o.t, &t->lse.t, &t->dout.t, &t->dq.t,
                                        &t->dk.t, &t->dv.t, &t->tuning);
    return st;
}

/* Whether the cases run the backward of impls[n]: not where the CPU lacks the table (the sweeps
 * say so), nor for a table without a backward of its own (flash-amx: a context capped at its
 * level runs flash-avx512's backward, on the same micro-kernels, so it would only repeat that
 * table; tu_report_impls says so). Under ThreadSanitizer (which runs the determinism cases) only
 * the last table that would run: nothing the tasks share depends on the table
 * (flash_backward_plan.c's chunks, waves and budget, flash_backward.c's partials, whose rows are
 * padded to 16 floats, come from the problem, the tuning and the workers; a table's lanes shape
 * only a worker's own scratch), so a race among them shows with any, and the generic table's scalar
 * loops took about ten times a vector table's time there (most of the 446 s the four tables took in
 * CI). */
static inline int runs_backward(const tu_impl *impls, int n_impls, int n) {
    if (!impls[n].runs || !impls[n].backward)
        return 0;
#if defined(SDPA_UNDER_TSAN)
    for (int m = n + 1; m < n_impls; m++)
        if (impls[m].runs && impls[m].backward)
            return 0;
#else
    (void)n_impls;
#endif
    return 1;
}

/* The golden: the reference forward (out in the case's storage, as a training step would
 * keep it) into t->o and t->lse, then the reference backward into f32 gradients, as doubles. */
static inline int golden(fb_tensors *t, double **gq, double **gk, double **gv) {
    sdpa_ctx *ctx = tu_ctx(1, SDPA_ISA_GENERIC);
    const sdpa_tensor *q = &t->q.t, *k = &t->k.t, *v = &t->v.t;
    tu_tensor dq =
        tu_alloc(SDPA_F32, q->shape[0], q->shape[1], q->shape[2], q->shape[3], TU_BHLD, 0, 0);
    tu_tensor dk =
        tu_alloc(SDPA_F32, k->shape[0], k->shape[1], k->shape[2], k->shape[3], TU_BHLD, 0, 0);
    tu_tensor dv =
        tu_alloc(SDPA_F32, v->shape[0], v->shape[1], v->shape[2], v->shape[3], TU_BHLD, 0, 0);
    sdpa_status st = tu_golden_forward(ctx, q, k, v, &t->p, &t->o.t, &t->lse.t);
    if (st == SDPA_OK)
        st = tu_golden_backward(ctx, q, k, v, &t->o.t, &t->lse.t, &t->dout.t, &t->p, &dq.t, &dk.t,
                                &dv.t);
    CHECK_MSG(st == SDPA_OK, "golden: %s", sdpa_ctx_last_error(ctx));
    *gq = tu_to_doubles(&dq.t);
    *gk = tu_to_doubles(&dk.t);
    *gv = tu_to_doubles(&dv.t);
    tu_free(&dq);
    tu_free(&dk);
    tu_free(&dv);
    sdpa_ctx_destroy(ctx);
    return st == SDPA_OK;
}

/* ---- the same-precision baseline ---------------------------------------------------------- */

/* A float accumulator's next value. */
static inline double facc(double acc, double x) {
    return (double)(float)(acc + x);
}

/* acc + a b in f32 without a fused multiply-add: the product rounded, then the sum (naive f32
 * arithmetic; exact products of half-precision values are unchanged). */
static inline double fmac(double acc, double a, double b) {
    return facc(acc, (double)(float)(a * b));
}

/* The naive backward in the storage type's precision, into gq (B, Hq, Lq, Dk), gk and gv
 * (B, Hkv, Lk, D), contiguous: what a framework's math path does with the same inputs (q, k, v,
 * the forward's out and LSE, dout). Per (b, h): S and visibility materialised, P = exp(S - LSE),
 * the dropped P~ = z P, dV += P~^T dO, dP = z (dO V^T), Delta = rowsum(dO o out),
 * dS = P (dP - Delta) through softcap's derivative, dQ = scale dS K, dK += scale dS^T Q; every
 * product and sum in float (not fused: naive f32), every intermediate rounded to the storage
 * type. */
static inline void lp_backward(const fb_tensors *t, sdpa_dtype dt, double *gq, double *gk,
                               double *gv) {
    const sdpa_tensor *q = &t->q.t, *k = &t->k.t, *v = &t->v.t, *dout = &t->dout.t;
    const sdpa_params *pr = &t->p;
    const int64_t B = q->shape[0], Hq = q->shape[1], Lq = q->shape[2], Dk = q->shape[3];
    const int64_t Hkv = k->shape[1], Lk = k->shape[2], Dv = v->shape[3], group = Hq / Hkv;
    const double scale = pr->scale != 0.0f ? (double)pr->scale : 1.0 / sqrt((double)Dk);
    const int64_t off = pr->align == SDPA_ALIGN_BOTTOM_RIGHT ? Lk - Lq : 0;
    const int64_t wl = pr->use_window ? pr->window_left : -1;
    const int64_t wr = pr->causal ? 0 : (pr->use_window ? pr->window_right : -1);
    double *S = malloc((size_t)(Lq * Lk) * sizeof *S), *D = malloc((size_t)(Lq * Lk) * sizeof *D);
    double *P = malloc((size_t)(Lq * Lk) * sizeof *P), *Z = malloc((size_t)(Lq * Lk) * sizeof *Z);
    unsigned char *vis = malloc((size_t)(Lq * Lk));
    memset(gk, 0, (size_t)(B * Hkv * Lk * Dk) * sizeof *gk);
    memset(gv, 0, (size_t)(B * Hkv * Lk * Dv) * sizeof *gv);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++) {
            const int64_t hk = h / group;
            for (int64_t i = 0; i < Lq; i++)
                for (int64_t j = 0; j < Lk; j++) {
                    const int64_t rel = j - (i + off), n = i * Lk + j;
                    int seen = !(wl >= 0 && rel < -wl) && !(wr >= 0 && rel > wr);
                    double s = 0.0;
                    for (int64_t c = 0; c < Dk; c++)
                        s = fmac(s, tu_get(q, b, h, i, c), tu_get(k, b, hk, j, c));
                    s = tu_round(dt, s * scale);
                    D[n] = 1.0;
                    if (pr->softcap > 0.0f) {
                        const double th = tanh(s / (double)pr->softcap);
                        D[n] = tu_round(dt, 1.0 - th * th);
                        s = tu_round(dt, (double)pr->softcap * th);
                    }
                    if (pr->alibi_slopes)
                        s = tu_round(dt, s - (double)pr->alibi_slopes[h] * fabs((double)rel));
                    if (pr->mask) {
                        const double mv = tu_mask_at(pr->mask, b, h, i, j);
                        if (pr->mask->dtype == SDPA_BOOL)
                            seen = seen && mv != 0.0;
                        else if (mv == -INFINITY)
                            seen = 0;
                        else
                            s = tu_round(dt, s + mv);
                    }
                    S[n] = s;
                    vis[n] = (unsigned char)(seen && s != -INFINITY);
                    Z[n] = pr->dropout_p > 0.0f
                               ? (sdpa__dropout_keep(pr->dropout_seed, pr->dropout_offset, b, h, i,
                                                     j, (double)pr->dropout_p)
                                      ? 1.0 / (1.0 - (double)pr->dropout_p)
                                      : 0.0)
                               : 1.0;
                }
            for (int64_t i = 0; i < Lq; i++) {
                const double lse = tu_get(&t->lse.t, b, h, i, 0);
                for (int64_t j = 0; j < Lk; j++)
                    P[i * Lk + j] = vis[i * Lk + j] && lse != -INFINITY
                                        ? tu_round(dt, exp(S[i * Lk + j] - lse))
                                        : 0.0;
                double delta = 0.0;
                for (int64_t c = 0; c < Dv; c++)
                    delta = fmac(delta, tu_get(dout, b, h, i, c), tu_get(&t->o.t, b, h, i, c));
                delta = tu_round(dt, delta);
                double *gq_i = gq + ((b * Hq + h) * Lq + i) * Dk;
                for (int64_t c = 0; c < Dk; c++)
                    gq_i[c] = 0.0;
                for (int64_t j = 0; j < Lk; j++) {
                    if (!vis[i * Lk + j] || lse == -INFINITY)
                        continue;
                    const int64_t n = i * Lk + j;
                    double *gv_j = gv + ((b * Hkv + hk) * Lk + j) * Dv;
                    double *gk_j = gk + ((b * Hkv + hk) * Lk + j) * Dk;
                    const double pt = tu_round(dt, Z[n] * P[n]);
                    double dpt = 0.0;
                    for (int64_t c = 0; c < Dv; c++) {
                        gv_j[c] = fmac(gv_j[c], pt, tu_get(dout, b, h, i, c));
                        dpt = fmac(dpt, tu_get(dout, b, h, i, c), tu_get(v, b, hk, j, c));
                    }
                    const double dp = tu_round(dt, Z[n] * tu_round(dt, dpt));
                    const double ds = tu_round(dt, tu_round(dt, P[n] * (dp - delta)) * D[n]);
                    for (int64_t c = 0; c < Dk; c++) {
                        gq_i[c] = fmac(gq_i[c], tu_round(dt, scale * ds), tu_get(k, b, hk, j, c));
                        gk_j[c] = fmac(gk_j[c], tu_round(dt, scale * ds), tu_get(q, b, h, i, c));
                    }
                }
                for (int64_t c = 0; c < Dk; c++)
                    gq_i[c] = tu_round(dt, gq_i[c]);
            }
        }
    for (int64_t n = 0; n < B * Hkv * Lk * Dk; n++)
        gk[n] = tu_round(dt, gk[n]);
    for (int64_t n = 0; n < B * Hkv * Lk * Dv; n++)
        gv[n] = tu_round(dt, gv[n]);
    free(S);
    free(D);
    free(P);
    free(Z);
    free(vis);
}

/* ---- checks --------------------------------------------------------------------------------- */

/* The backward into gradients filled with a canary, and whether it wrote every element and
 * nothing around them. A half-precision gradient may come out as the canary's own bits
 * (0xA5A5 is an f16 and a bf16), so a miss is confirmed with a second canary before it counts. */
static inline int backward_writes_exactly(sdpa_ctx *ctx, fb_tensors *t, sdpa_status *st) {
    static const unsigned char fills[2] = {0xA5, 0x5A};
    int ok = 0;
    for (int n = 0; n < 2 && !ok; n++) {
        memset(t->dq.buf, fills[n], t->dq.bytes);
        memset(t->dk.buf, fills[n], t->dk.bytes);
        memset(t->dv.buf, fills[n], t->dv.bytes);
        *st = backward(ctx, t);
        if (*st != SDPA_OK)
            return 0;
        ok = tu_written_exactly(&t->dq, fills[n]) && tu_written_exactly(&t->dk, fills[n]) &&
             tu_written_exactly(&t->dv, fills[n]);
    }
    return ok;
}

/* The rule's k and dV's NMSE gate for a storage type (testing.md). */
static inline double rule_k(sdpa_dtype dt) {
    return dt == SDPA_F32 ? 8.0 : 3.0;
}

static inline double nmse_gate(sdpa_dtype dt) {
    return dt == SDPA_F32 ? 1e-10 : dt == SDPA_F16 ? 1e-6 : 5e-5;
}

static inline double max_abs(const sdpa_tensor *t) {
    double m = 0.0;
    for (int64_t a = 0; a < t->shape[0]; a++)
        for (int64_t b = 0; b < t->shape[1]; b++)
            for (int64_t c = 0; c < t->shape[2]; c++)
                for (int64_t d = 0; d < t->shape[3]; d++)
                    m = fmax(m, fabs(tu_get(t, a, b, c, d)));
    return m;
}

/* Explicit mantissa bits of a storage type. */
static inline int mantissa_bits(sdpa_dtype dt) {
    return dt == SDPA_F32 ? 23 : dt == SDPA_F16 ? 10 : 7;
}

/* testing.md's rule, with two degenerate cases where the same-precision baseline is exact and
 * the bound would shrink to the rounding floor alone:
 * - A gradient that is exactly 0: dq and dk when every row sees one key, where
 *   dS = P (dP - Delta) cancels. The golden forms both terms alike in double, and so can a
 *   naive path; the tiled backward forms Delta = dO . O apart from dP, as FlashAttention-2
 *   does, and keeps their difference in rounding. That is held to twice the rounding bound of
 *   an f32 dot product of the cancelled terms, times scale max|other operand|.
 * - A baseline exact everywhere (dv when each row sees one key: P = 1): the tiled backward's
 *   P = exp(s - LSE) from its own f32 score and the stored f32 LSE is 1 within a rounding of
 *   s, and the naive path's may happen to be exactly 1. Held to 4 ulps of the largest value.
 * @return 1 on pass. */
static inline int gradient_rule(const char *what, const double *test, const double *lp,
                                const double *gold, size_t n, sdpa_dtype dt, double nmse,
                                const fb_tensors *t, const sdpa_tensor *other) {
    int zero = 1, exact = 1;
    double scale_g = 0.0, worst = 0.0;
    for (size_t x = 0; x < n; x++) {
        if (!isfinite(gold[x]))
            continue;
        zero &= gold[x] == 0.0;
        exact &= lp[x] == gold[x];
        scale_g = fmax(scale_g, fabs(gold[x]));
    }
    if (zero && other != NULL) {
        /* the cancelled terms: A = max over (row, key) of sum_c |dO_c v_c|; an f32 dot product
         * of Dv terms is within Dv ulps of A, Delta within one */
        const sdpa_tensor *v = &t->v.t, *dout = &t->dout.t;
        const int64_t group = dout->shape[1] / v->shape[1];
        double big = 0.0;
        for (int64_t b = 0; b < dout->shape[0]; b++)
            for (int64_t h = 0; h < dout->shape[1]; h++)
                for (int64_t i = 0; i < dout->shape[2]; i++)
                    for (int64_t j = 0; j < v->shape[2]; j++) {
                        double a = 0.0;
                        for (int64_t c = 0; c < v->shape[3]; c++)
                            a += fabs(tu_get(dout, b, h, i, c) * tu_get(v, b, h / group, j, c));
                        big = fmax(big, a);
                    }
        const double scale =
            t->p.scale != 0.0f ? fabs((double)t->p.scale) : 1.0 / sqrt((double)t->q.t.shape[3]);
        const double bound =
            2.0 * (double)(v->shape[3] + 1) * 0x1p-24 * big * scale * max_abs(other);
        for (size_t x = 0; x < n; x++)
            worst = isnan(test[x]) ? INFINITY : fmax(worst, fabs(test[x]));
        printf("    %-44s exactly 0: max %.3e, bound %.3e\n", what, worst, bound);
        return worst <= bound;
    }
    if (exact && !zero) {
        const double bound = 4.0 * ldexp(1.0, ilogb(scale_g) - mantissa_bits(dt));
        for (size_t x = 0; x < n; x++)
            worst = isnan(test[x]) != isnan(gold[x]) ? INFINITY
                    : isnan(gold[x])                 ? worst
                                                     : fmax(worst, fabs(test[x] - gold[x]));
        printf("    %-44s baseline exact: err %.3e, bound %.3e\n", what, worst, bound);
        return worst <= bound;
    }
    return tu_rule(what, test, lp, gold, n, dt, rule_k(dt), nmse);
}

/* One case at every level: the rule on dq, dk, dv; every element written; the dq of fully
 * masked rows exactly 0. @return 1 if all pass. */
static inline int run_case(const char *name, const fb_case *c) {
    fb_tensors t;
    make(c, &t);
    const tu_dims d = c->d;
    const size_t nq = (size_t)(d.B * d.Hq * d.Lq * d.Dk), nk = (size_t)(d.B * d.Hkv * d.Lk * d.Dk);
    const size_t nv = (size_t)(d.B * d.Hkv * d.Lk * d.Dv);
    double *gq, *gk, *gv;
    int ok = golden(&t, &gq, &gk, &gv);
    double *lq = malloc(nq * sizeof *lq), *lk = malloc(nk * sizeof *lk);
    double *lv = malloc(nv * sizeof *lv);
    lp_backward(&t, c->dt, lq, lk, lv);
    tu_impl impls[TU_MAX_IMPLS];
    const int n_impls = tu_impls(impls);
    for (int n = 0; n < n_impls && ok; n++) {
        if (!impls[n].runs)
            printf("    %-44s [%s] skipped: the CPU lacks %s\n", name, impls[n].name,
                   impls[n].missing);
        if (!runs_backward(impls, n_impls, n))
            continue;
        sdpa_ctx *ctx = tu_ctx(2, impls[n].level);
        sdpa_status st;
        t.impl = impls[n].impl;
        int all = backward_writes_exactly(ctx, &t, &st);
        CHECK_MSG(st == SDPA_OK, "%s [%s]: %s", name, impls[n].name, sdpa_ctx_last_error(ctx));
        sdpa_ctx_destroy(ctx);
        if (st != SDPA_OK) {
            ok = 0;
            break;
        }
        CHECK_MSG(all, "%s [%s]: an element unwritten or a byte around them touched", name,
                  impls[n].name);
        double *xq = tu_to_doubles(&t.dq.t), *xk = tu_to_doubles(&t.dk.t);
        double *xv = tu_to_doubles(&t.dv.t);
        char what[128];
        snprintf(what, sizeof what, "%s [%s] dq", name, impls[n].name);
        all &= gradient_rule(what, xq, lq, gq, nq, c->dt, 0.0, &t, &t.k.t);
        snprintf(what, sizeof what, "%s [%s] dk", name, impls[n].name);
        all &= gradient_rule(what, xk, lk, gk, nk, c->dt, 0.0, &t, &t.q.t);
        snprintf(what, sizeof what, "%s [%s] dv", name, impls[n].name);
        all &= gradient_rule(what, xv, lv, gv, nv, c->dt, nmse_gate(c->dt), &t, NULL);
        /* fully masked rows: dq exactly 0 */
        int64_t masked = 0, wrong = 0;
        for (int64_t b = 0; b < d.B; b++)
            for (int64_t h = 0; h < d.Hq; h++)
                for (int64_t i = 0; i < d.Lq; i++) {
                    if (tu_get(&t.lse.t, b, h, i, 0) != -INFINITY)
                        continue;
                    masked++;
                    for (int64_t x = 0; x < d.Dk; x++)
                        wrong += tu_get(&t.dq.t, b, h, i, x) != 0.0;
                }
        CHECK_MSG(wrong == 0, "%s [%s]: %lld dq of fully masked rows not 0", name, impls[n].name,
                  (long long)wrong);
        if (n == 0 && masked > 0)
            printf("    %-44s %lld fully masked rows\n", name, (long long)masked);
        ok &= all && wrong == 0;
        free(xq);
        free(xk);
        free(xv);
    }
    free(gq);
    free(gk);
    free(gv);
    free(lq);
    free(lk);
    free(lv);
    release(&t);
    return ok;
}

#endif /* SDPA_TEST_BACKWARD_FIXTURE_H */
