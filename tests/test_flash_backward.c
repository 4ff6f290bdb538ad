/*
 * test_flash_backward.c — the tiled backward (src/attn/flash_backward.c) at every ISA level the
 * CPU has, against the reference backward (src/ref/ref_backward.c, in double: the golden) by
 * testing.md's gradient rule: err(test) <= k err(lp) + floor, with k = 8 for f32 storage and 3
 * for f16/bf16, an NMSE gate on dV only, non-finite values at the same places, and the dQ of
 * fully masked rows exactly 0. The same-precision baseline (lp) is a naive backward written
 * here: S and P materialised per head, every product summed in float and every intermediate
 * rounded to the storage type, as a framework's math path would do it.
 *
 * The sweep: no features, causal in both alignments with Lq < Lk and Lq > Lk, windows, bool and
 * additive masks (broadcast too) with fully masked rows, softcap, ALiBi, GQA and MQA, Dk != Dv,
 * lengths around the kernel's block of 64 and odd ones, strided and (B, L, H, D) layouts,
 * f16/bf16 storage and dropout. Then: every element written and nothing around it; NaN and Inf
 * in keys hidden from every row reach no gradient (bitwise the clean run's), and a key that some
 * rows see makes exactly their gradients NaN; bitwise identical results for 1 to 16 threads and
 * on repeated calls; and running out of memory. Levels the CPU lacks are reported as skipped.
 * The backward's own schedules are reached through its internal tuning hook
 * (sdpa__flash_backward_tuned): the one-pass schedule in several waves (bitwise the one-wave
 * result), with forced chunk counts, and with several key blocks to a step (bitwise one at a
 * time), and the two kinds of task it falls back to, each by the rule and for 1 to 16 threads;
 * the two schedules bitwise equal, and the budget's growth for the workers.
 */
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

static fb_case plain(int64_t hq, int64_t hkv, int64_t lq, int64_t lk, int64_t dk, int64_t dv) {
    fb_case c;
    memset(&c, 0, sizeof c);
    c.d = (tu_dims){1, hq, hkv, lq, lk, dk, dv};
    c.dt = SDPA_F32;
    c.seed = 1;
    return c;
}

/* Fills *t in place: its params point into it (the mask, the slopes). */
static void make(const fb_case *c, fb_tensors *t) {
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

static void release(fb_tensors *t) {
    tu_tensor *all[] = {&t->q,    &t->k,  &t->v,  &t->o,  &t->lse,
                        &t->dout, &t->dq, &t->dk, &t->dv, &t->mask};
    for (size_t n = 0; n < sizeof all / sizeof all[0]; n++)
        tu_free(all[n]);
}

/* sdpa_backward, or with t->tuned the flash backward of t->impl with t->tuning (the internal
 * hook that makes the one-pass schedule run in several waves, with fewer chunks or several key
 * blocks to a step, or fall back to two kinds of task). */
static sdpa_status backward(sdpa_ctx *ctx, fb_tensors *t) {
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
 * the last table that would run: the backward's tasks, partials and sums are the same for every
 * table (flash_backward.c's blocks are multiples of every table's lanes), so a race among them
 * shows with any, and the generic table's scalar loops take about ten times the vector
 * tables' time there. */
static int runs_backward(const tu_impl *impls, int n_impls, int n) {
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
static int golden(fb_tensors *t, double **gq, double **gk, double **gv) {
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
static double facc(double acc, double x) {
    return (double)(float)(acc + x);
}

/* acc + a b in f32 without a fused multiply-add: the product rounded, then the sum (naive f32
 * arithmetic; exact products of half-precision values are unchanged). */
static double fmac(double acc, double a, double b) {
    return facc(acc, (double)(float)(a * b));
}

/* The naive backward in the storage type's precision, into gq (B, Hq, Lq, Dk), gk and gv
 * (B, Hkv, Lk, D), contiguous: what a framework's math path does with the same inputs (q, k, v,
 * the forward's out and LSE, dout). Per (b, h): S and visibility materialised, P = exp(S - LSE),
 * the dropped P~ = z P, dV += P~^T dO, dP = z (dO V^T), Delta = rowsum(dO o out),
 * dS = P (dP - Delta) through softcap's derivative, dQ = scale dS K, dK += scale dS^T Q; every
 * product and sum in float (not fused: naive f32), every intermediate rounded to the storage
 * type. */
static void lp_backward(const fb_tensors *t, sdpa_dtype dt, double *gq, double *gk, double *gv) {
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

/* Every element of t written (not `fill` in every byte) and every byte around them still
 * `fill`. */
static int written_exactly(const tu_tensor *t, unsigned char fill) {
    const size_t es = sdpa_dtype_size(t->t.dtype);
    unsigned char *mine = calloc(t->bytes, 1);
    const unsigned char *bytes = t->buf;
    const size_t base_at = (size_t)((const unsigned char *)t->t.data - bytes);
    int ok = 1;
    for (int64_t a = 0; a < t->t.shape[0]; a++)
        for (int64_t b = 0; b < t->t.shape[1]; b++)
            for (int64_t c = 0; c < t->t.shape[2]; c++)
                for (int64_t e = 0; e < t->t.shape[3]; e++) {
                    const size_t at = base_at + (size_t)(a * t->t.stride[0] + b * t->t.stride[1] +
                                                         c * t->t.stride[2] + e * t->t.stride[3]) *
                                                    es;
                    int canary = 1;
                    for (size_t x = 0; x < es; x++) {
                        canary &= bytes[at + x] == fill;
                        mine[at + x] = 1;
                    }
                    ok &= !canary;
                }
    for (size_t x = 0; x < t->bytes; x++)
        ok &= mine[x] || bytes[x] == fill;
    free(mine);
    return ok;
}

/* The backward into gradients filled with a canary, and whether it wrote every element and
 * nothing around them. A half-precision gradient may come out as the canary's own bits
 * (0xA5A5 is an f16 and a bf16), so a miss is confirmed with a second canary before it counts. */
static int backward_writes_exactly(sdpa_ctx *ctx, fb_tensors *t, sdpa_status *st) {
    static const unsigned char fills[2] = {0xA5, 0x5A};
    int ok = 0;
    for (int n = 0; n < 2 && !ok; n++) {
        memset(t->dq.buf, fills[n], t->dq.bytes);
        memset(t->dk.buf, fills[n], t->dk.bytes);
        memset(t->dv.buf, fills[n], t->dv.bytes);
        *st = backward(ctx, t);
        if (*st != SDPA_OK)
            return 0;
        ok = written_exactly(&t->dq, fills[n]) && written_exactly(&t->dk, fills[n]) &&
             written_exactly(&t->dv, fills[n]);
    }
    return ok;
}

/* The rule's k and dV's NMSE gate for a storage type (testing.md). */
static double rule_k(sdpa_dtype dt) {
    return dt == SDPA_F32 ? 8.0 : 3.0;
}

static double nmse_gate(sdpa_dtype dt) {
    return dt == SDPA_F32 ? 1e-10 : dt == SDPA_F16 ? 1e-6 : 5e-5;
}

static double max_abs(const sdpa_tensor *t) {
    double m = 0.0;
    for (int64_t a = 0; a < t->shape[0]; a++)
        for (int64_t b = 0; b < t->shape[1]; b++)
            for (int64_t c = 0; c < t->shape[2]; c++)
                for (int64_t d = 0; d < t->shape[3]; d++)
                    m = fmax(m, fabs(tu_get(t, a, b, c, d)));
    return m;
}

/* Explicit mantissa bits of a storage type. */
static int mantissa_bits(sdpa_dtype dt) {
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
static int gradient_rule(const char *what, const double *test, const double *lp, const double *gold,
                         size_t n, sdpa_dtype dt, double nmse, const fb_tensors *t,
                         const sdpa_tensor *other) {
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
static int run_case(const char *name, const fb_case *c) {
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
        if (!runs_backward(impls, n_impls, n))
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

/* ---- NaN, determinism, memory --------------------------------------------------------------- */

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
 * in place (flash_backward.c, WIDE_MAX_BYTES): the gradients are bitwise those without, for 1
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
    tu_impl impls[TU_MAX_IMPLS];
    const int n_impls = tu_impls(impls);
    for (int n = 0; n < n_impls; n++) {
        if (impls[n].runs && impls[n].backward && !runs_backward(impls, n_impls, n))
            printf("    %-14s not run under ThreadSanitizer: the best table alone runs there\n",
                   impls[n].name);
    }
    return CHECK_RUN(argc, argv, CASE(test_exp_lse), CASE(test_shapes),
                     CASE(test_causal_and_windows), CASE(test_masks_softcap_alibi),
                     CASE(test_heads), CASE(test_layouts_and_storage), CASE(test_dropout),
                     CASE(test_two_kinds), CASE(test_hidden_nan), CASE(test_nan_rows),
                     CASE(test_deterministic), CASE(test_deterministic_waves),
                     CASE(test_deterministic_key_groups), CASE(test_widened_rows),
                     CASE(test_schedules_agree), CASE(test_grown_budget), CASE(test_busy_waves),
                     CASE(test_partials_refused), CASE(test_nomem));
}
