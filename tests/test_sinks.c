/*
 * test_sinks.c — attention sinks (sdpa_params.sinks, sdpa.h "Attention sinks"), issue 13 item 4.
 *
 * Sinks through sdpa_forward against a computation written here (the denominator gets
 * exp(sink_h)): split and non-split paths, a sink far above every score, -inf sinks (the bits
 * of no sinks), fully masked rows (O = 0, LSE = sink); sdpa_weights (rows sum to less than 1,
 * p = exp(s - lse)); sdpa_backward: the reference against central differences in double on a
 * tiny problem, the tiled backward against the reference by the gradient rule. Every ISA level
 * the CPU has. (Sinks over a paged cache are test_kv_cache.c's.)
 */
#include "check.h"
#include "testutil.h"

#include "../src/core/validate.h"
#include "../src/ref/ref.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The registered fast implementations; levels the CPU lacks are reported once by main. */
static tu_impl g_impls[TU_MAX_IMPLS];
static int g_n_impls;

/* A problem in doubles, contiguous (B, H, L, D), for the computation written here from
 * sdpa.h's text: s_ij = softcap(scale q_i . k_j) + mask_ij over the keys causal (with its
 * alignment) and the mask leave visible, and sink_h one more term of the denominator. */
typedef struct sk_prob {
    int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
    const double *q, *k, *v;
    const double *mask; /* NULL or (B, Hq, Lq, Lk) additive; -inf hides */
    const float *sinks; /* NULL or Hq */
    double scale, softcap;
    int causal, bottom_right;
} sk_prob;

/* Row (b, h, i)'s scores s[j] (-inf: hidden) and scaled products x[j], in double (lp = -1) or
 * rounded to lp with f32 sums. @return the largest of the visible scores and the sink (-inf if
 * there is neither); *any: whether a key is visible. */
static double sk_scores(const sk_prob *p, int lp, int64_t b, int64_t h, int64_t i, double *s,
                        double *x, int *any) {
    const int64_t hk = h / (p->Hq / p->Hkv), off = p->bottom_right ? p->Lk - p->Lq : 0;
    double m = p->sinks != NULL ? (double)p->sinks[h] : -INFINITY;
    *any = 0;
    for (int64_t j = 0; j < p->Lk; j++) {
        s[j] = -INFINITY;
        if (p->causal && j > i + off)
            continue;
        const double mv =
            p->mask != NULL ? p->mask[((b * p->Hq + h) * p->Lq + i) * p->Lk + j] : 0.0;
        if (mv == -INFINITY)
            continue;
        double dot = 0.0;
        for (int64_t d = 0; d < p->Dk; d++)
            dot = tu_acc_round(lp, dot + p->q[((b * p->Hq + h) * p->Lq + i) * p->Dk + d] *
                                             p->k[((b * p->Hkv + hk) * p->Lk + j) * p->Dk + d]);
        x[j] = tu_round(lp, p->scale * dot);
        const double c =
            p->softcap > 0.0 ? tu_round(lp, p->softcap * tanh(x[j] / p->softcap)) : x[j];
        s[j] = tu_round(lp, c + mv);
        *any = 1;
        if (s[j] > m)
            m = s[j];
    }
    return m;
}

/* The denominator of a row: exp(sink - m) + sum_j exp(s_j - m). */
static double sk_sum(const sk_prob *p, int lp, int64_t h, const double *s, double m) {
    double sum = p->sinks != NULL && p->sinks[h] != -INFINITY ? exp((double)p->sinks[h] - m) : 0.0;
    for (int64_t j = 0; j < p->Lk; j++)
        if (s[j] != -INFINITY)
            sum = tu_acc_round(lp, sum + tu_acc_round(lp, exp(s[j] - m)));
    return sum;
}

/* out (B, Hq, Lq, Dv), lse (B, Hq, Lq), and empty (NULL or B*Hq*Lq flags: no visible key). */
static void sk_forward(const sk_prob *p, int lp, double *out, double *lse, unsigned char *empty) {
    double *s = tu_xmalloc((size_t)p->Lk * sizeof *s), *x = tu_xmalloc((size_t)p->Lk * sizeof *x);
    for (int64_t b = 0; b < p->B; b++)
        for (int64_t h = 0; h < p->Hq; h++) {
            const int64_t hk = h / (p->Hq / p->Hkv);
            for (int64_t i = 0; i < p->Lq; i++) {
                const int64_t row = (b * p->Hq + h) * p->Lq + i;
                int any;
                const double m = sk_scores(p, lp, b, h, i, s, x, &any);
                if (empty != NULL)
                    empty[row] = (unsigned char)!any;
                double *o = out + row * p->Dv;
                for (int64_t d = 0; d < p->Dv; d++)
                    o[d] = 0.0;
                if (m == -INFINITY) {
                    lse[row] = -INFINITY;
                    continue;
                }
                const double sum = sk_sum(p, lp, h, s, m);
                for (int64_t d = 0; d < p->Dv; d++) {
                    double acc = 0.0;
                    for (int64_t j = 0; j < p->Lk; j++)
                        if (s[j] != -INFINITY)
                            acc = tu_acc_round(
                                lp, acc + tu_round(lp, exp(s[j] - m) / sum) *
                                              p->v[((b * p->Hkv + hk) * p->Lk + j) * p->Dv + d]);
                    o[d] = tu_round(lp, acc);
                }
                lse[row] = tu_acc_round(lp, m + log(sum));
            }
        }
    free(s);
    free(x);
}

/* The gradients of L = sum dout . O (dq like q, dk like k, dv like v; GQA heads summed):
 *   P_ij = exp(s_ij - LSE_i) (the sink in LSE), D_i = dO_i . O_i, dS_ij = P_ij (dO_i . v_j - D_i),
 *   dX_ij = dS_ij softcap'(x_ij), dQ_i = scale sum_j dX_ij k_j, dK_j = scale sum_i dX_ij q_i,
 *   dV_j = sum_i P_ij dO_i. */
static void sk_backward(const sk_prob *p, const double *dout, int lp, double *dq, double *dk,
                        double *dv) {
    double *s = tu_xmalloc((size_t)p->Lk * sizeof *s), *x = tu_xmalloc((size_t)p->Lk * sizeof *x);
    double *pr = tu_xmalloc((size_t)p->Lk * sizeof *pr), *o = tu_xmalloc((size_t)p->Dv * sizeof *o);
    memset(dk, 0, (size_t)(p->B * p->Hkv * p->Lk * p->Dk) * sizeof *dk);
    memset(dv, 0, (size_t)(p->B * p->Hkv * p->Lk * p->Dv) * sizeof *dv);
    for (int64_t b = 0; b < p->B; b++)
        for (int64_t h = 0; h < p->Hq; h++) {
            const int64_t hk = h / (p->Hq / p->Hkv);
            for (int64_t i = 0; i < p->Lq; i++) {
                const int64_t row = (b * p->Hq + h) * p->Lq + i;
                double *dq_i = dq + row * p->Dk;
                const double *q_i = p->q + row * p->Dk, *do_i = dout + row * p->Dv;
                for (int64_t d = 0; d < p->Dk; d++)
                    dq_i[d] = 0.0;
                int any;
                const double m = sk_scores(p, lp, b, h, i, s, x, &any);
                if (!any)
                    continue;
                const double sum = sk_sum(p, lp, h, s, m);
                for (int64_t j = 0; j < p->Lk; j++)
                    pr[j] = s[j] == -INFINITY ? 0.0 : tu_round(lp, exp(s[j] - m) / sum);
                double delta = 0.0;
                for (int64_t d = 0; d < p->Dv; d++) {
                    o[d] = 0.0;
                    for (int64_t j = 0; j < p->Lk; j++)
                        if (s[j] != -INFINITY)
                            o[d] = tu_acc_round(
                                lp,
                                o[d] + pr[j] * p->v[((b * p->Hkv + hk) * p->Lk + j) * p->Dv + d]);
                    delta = tu_acc_round(lp, delta + do_i[d] * tu_round(lp, o[d]));
                }
                for (int64_t j = 0; j < p->Lk; j++) {
                    if (s[j] == -INFINITY)
                        continue;
                    const double *k_j = p->k + ((b * p->Hkv + hk) * p->Lk + j) * p->Dk;
                    const double *v_j = p->v + ((b * p->Hkv + hk) * p->Lk + j) * p->Dv;
                    double *dk_j = dk + ((b * p->Hkv + hk) * p->Lk + j) * p->Dk;
                    double *dv_j = dv + ((b * p->Hkv + hk) * p->Lk + j) * p->Dv;
                    double dp = 0.0;
                    for (int64_t d = 0; d < p->Dv; d++) {
                        dp = tu_acc_round(lp, dp + do_i[d] * v_j[d]);
                        dv_j[d] = tu_acc_round(lp, dv_j[d] + pr[j] * do_i[d]);
                    }
                    double dx = tu_round(lp, pr[j] * (dp - delta));
                    if (p->softcap > 0.0) {
                        const double th = tanh(x[j] / p->softcap);
                        dx = tu_round(lp, dx * (1.0 - th * th));
                    }
                    for (int64_t d = 0; d < p->Dk; d++) {
                        dq_i[d] = tu_acc_round(lp, dq_i[d] + p->scale * dx * k_j[d]);
                        dk_j[d] = tu_acc_round(lp, dk_j[d] + p->scale * dx * q_i[d]);
                    }
                }
                for (int64_t d = 0; d < p->Dk; d++)
                    dq_i[d] = tu_round(lp, dq_i[d]);
            }
        }
    for (int64_t n = 0; n < p->B * p->Hkv * p->Lk * p->Dk; n++)
        dk[n] = tu_round(lp, dk[n]);
    for (int64_t n = 0; n < p->B * p->Hkv * p->Lk * p->Dv; n++)
        dv[n] = tu_round(lp, dv[n]);
    free(s);
    free(x);
    free(pr);
    free(o);
}

/* The tensors of a sinks case (plain sdpa_forward). */
typedef struct sk_case {
    const char *what;
    int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
    sdpa_dtype dt, kv_dt; /* q, out, dout and gradients; k and v */
    int causal, bottom_right;
    float softcap;
    int mask;        /* an additive mask: holes, and every 7th row hidden whole */
    float sinks[16]; /* Hq sinks */
    uint64_t seed;
} sk_case;

typedef struct sk_bufs {
    tu_tensor q, k, v, o, lse, mask, dout;
    double *qd, *kd, *vd, *md, *doutd;
    sdpa_params p;
    sk_prob pb;
} sk_bufs;

static void sk_build(const sk_case *c, sk_bufs *t) {
    memset(t, 0, sizeof *t);
    tu_rng r = {c->seed};
    t->q = tu_alloc(c->dt, c->B, c->Hq, c->Lq, c->Dk, TU_BHLD, 0, 0);
    t->k = tu_alloc(c->kv_dt, c->B, c->Hkv, c->Lk, c->Dk, TU_BHLD, 0, 0);
    t->v = tu_alloc(c->kv_dt, c->B, c->Hkv, c->Lk, c->Dv, TU_BHLD, 0, 0);
    t->o = tu_alloc(c->dt, c->B, c->Hq, c->Lq, c->Dv, TU_BHLD, 0, 0);
    t->lse = tu_alloc(SDPA_F32, c->B, c->Hq, c->Lq, 1, TU_BHLD, 0, 0);
    t->dout = tu_alloc(c->dt, c->B, c->Hq, c->Lq, c->Dv, TU_BHLD, 0, 0);
    tu_fill_randn(&t->q, &r, 1.0, 0.0);
    tu_fill_randn(&t->k, &r, 1.0, 0.0);
    tu_fill_randn(&t->v, &r, 1.0, 0.0);
    tu_fill_randn(&t->dout, &r, 1.0, 0.0);
    t->p.causal = c->causal;
    t->p.align = c->bottom_right ? SDPA_ALIGN_BOTTOM_RIGHT : SDPA_ALIGN_TOP_LEFT;
    t->p.softcap = c->softcap;
    t->p.sinks = c->sinks;
    if (c->mask) {
        t->mask = tu_alloc(SDPA_F32, c->B, c->Hq, c->Lq, c->Lk, TU_BHLD, 0, 0);
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t h = 0; h < c->Hq; h++)
                for (int64_t i = 0; i < c->Lq; i++)
                    for (int64_t j = 0; j < c->Lk; j++)
                        tu_set(&t->mask.t, b, h, i, j,
                               i % 7 == 3 || tu_uniform(&r) < 0.2 ? -INFINITY : 0.5 * tu_randn(&r));
        t->p.mask = &t->mask.t;
        t->md = tu_to_doubles(&t->mask.t);
    }
    t->qd = tu_to_doubles(&t->q.t);
    t->kd = tu_to_doubles(&t->k.t);
    t->vd = tu_to_doubles(&t->v.t);
    t->doutd = tu_to_doubles(&t->dout.t);
    sk_prob *pb = &t->pb;
    pb->B = c->B, pb->Hq = c->Hq, pb->Hkv = c->Hkv, pb->Lq = c->Lq, pb->Lk = c->Lk;
    pb->Dk = c->Dk, pb->Dv = c->Dv;
    pb->q = t->qd, pb->k = t->kd, pb->v = t->vd, pb->mask = t->md, pb->sinks = c->sinks;
    pb->scale = 1.0 / sqrt((double)c->Dk);
    pb->softcap = (double)c->softcap;
    pb->causal = c->causal;
    pb->bottom_right = c->bottom_right;
}

static void sk_free(sk_bufs *t) {
    tu_tensor *all[] = {&t->q, &t->k, &t->v, &t->o, &t->lse, &t->mask, &t->dout};
    for (size_t n = 0; n < sizeof all / sizeof all[0]; n++)
        tu_free(all[n]);
    free(t->qd);
    free(t->kd);
    free(t->vd);
    free(t->md);
    free(t->doutd);
}

/* sdpa_forward with sinks at every ISA level against the computation above, by the rule; the
 * reference (tu_golden_forward) within an f32 ulp of it; rows that see no key exactly 0 with
 * LSE = the sink. */
static int run_sink_forward(const sk_case *c) {
    sk_bufs t;
    sk_build(c, &t);
    const size_t n_out = (size_t)(c->B * c->Hq * c->Lq * c->Dv),
                 n_l = (size_t)(c->B * c->Hq * c->Lq);
    double *g_o = tu_xmalloc(n_out * sizeof(double)), *g_l = tu_xmalloc(n_l * sizeof(double));
    double *lp_o = tu_xmalloc(n_out * sizeof(double)), *lp_l = tu_xmalloc(n_l * sizeof(double));
    unsigned char *empty = tu_xmalloc(n_l);
    sk_forward(&t.pb, -1, g_o, g_l, empty);
    sk_forward(&t.pb, (int)c->dt, lp_o, lp_l, NULL);

    sdpa_ctx *ctx = tu_ctx(1, SDPA_ISA_AUTO);
    int ok = tu_golden_forward(ctx, &t.q.t, &t.k.t, &t.v.t, &t.p, &t.o.t, &t.lse.t) == SDPA_OK;
    if (ok) {
        double *o = tu_to_doubles(&t.o.t), *l = tu_to_doubles(&t.lse.t);
        if (c->dt == SDPA_F32)
            ok = tu_within_ulp("reference out vs sinks in double", o, g_o, n_out);
        ok = tu_within_ulp("reference lse vs sinks in double", l, g_l, n_l) && ok;
        free(o);
        free(l);
    }
    sdpa_ctx_destroy(ctx);
    printf("    %-64s reference %s\n", c->what, ok ? "ok" : "MISMATCH");

    const double kf = c->dt == SDPA_F32 ? 3.0 : 2.0;
    const double gate = c->dt == SDPA_F32 ? 1e-10 : c->dt == SDPA_F16 ? 1e-6 : 5e-5;
    for (int n = 0; n < g_n_impls; n++) {
        if (!g_impls[n].runs || !tu_impl_takes(&g_impls[n], &t.q.t, &t.k.t, &t.v.t, &t.p, &t.o.t))
            continue;
        ctx = tu_ctx(0, g_impls[n].level);
        tu_fill_canary(&t.o);
        tu_fill_canary(&t.lse);
        const sdpa_status st = sdpa_forward(ctx, &t.q.t, &t.k.t, &t.v.t, &t.p, &t.o.t, &t.lse.t);
        CHECK_INT_EQ(st, SDPA_OK);
        double *o = tu_to_doubles(&t.o.t), *l = tu_to_doubles(&t.lse.t);
        char what[128];
        snprintf(what, sizeof what, "[%s] sinks out", g_impls[n].name);
        int good = tu_rule(what, o, lp_o, g_o, n_out, c->dt, kf, gate);
        snprintf(what, sizeof what, "[%s] sinks lse", g_impls[n].name);
        good = tu_rule(what, l, lp_l, g_l, n_l, SDPA_F32, 3.0, 0.0) && good;
        size_t bad_rows = 0;
        for (size_t r = 0; r < n_l; r++) {
            if (!empty[r])
                continue;
            for (int64_t d = 0; d < c->Dv; d++)
                bad_rows += o[r * (size_t)c->Dv + (size_t)d] != 0.0;
            bad_rows += !(l[r] == (double)c->sinks[r / (size_t)c->Lq % (size_t)c->Hq]);
        }
        if (bad_rows)
            printf("    [%s] %zu values of rows without keys are not 0 / the sink\n",
                   g_impls[n].name, bad_rows);
        if (!good || bad_rows) {
            printf("    %s [%s] FAILS\n", c->what, g_impls[n].name);
            ok = 0;
        }
        free(o);
        free(l);
        sdpa_ctx_destroy(ctx);
    }
    free(g_o);
    free(g_l);
    free(lp_o);
    free(lp_l);
    free(empty);
    sk_free(&t);
    return ok;
}

static sk_case sink_case(const char *what, int64_t B, int64_t hq, int64_t hkv, int64_t lq,
                         int64_t lk, int64_t d, uint64_t seed) {
    sk_case c;
    memset(&c, 0, sizeof c);
    c.what = what;
    c.B = B;
    c.Hq = hq;
    c.Hkv = hkv;
    c.Lq = lq;
    c.Lk = lk;
    c.Dk = c.Dv = d;
    c.dt = c.kv_dt = SDPA_F32;
    c.seed = seed;
    static const float pattern[8] = {0.5f, -INFINITY, 2.0f, -1.0f, 4.0f, 0.0f, -INFINITY, 1.5f};
    for (int h = 0; h < 16; h++)
        c.sinks[h] = pattern[h % 8];
    return c;
}

/* The tiled forward's two ways of finishing a row with a sink: once per row (no split), once
 * after the chunks' merge (split-KV: Lq = 1 and thousands of keys). */
static void test_sinks_forward(void) {
    sk_case c = sink_case("sinks: no split, causal bottom-right, mask (every 7th row hidden)", 2, 4,
                          2, 37, 75, 32, 6000);
    c.causal = c.bottom_right = 1;
    c.mask = 1;
    CHECK(run_sink_forward(&c));
    c = sink_case("sinks: no split, Lq > Lk bottom-right (7 rows without keys)", 1, 8, 2, 37, 30,
                  16, 6001);
    c.causal = c.bottom_right = 1;
    CHECK(run_sink_forward(&c));
    c = sink_case("sinks: no split, softcap 5 (the sink is not capped), bf16", 2, 4, 1, 20, 60, 24,
                  6002);
    c.softcap = 5.0f;
    c.dt = c.kv_dt = SDPA_BF16;
    for (int h = 0; h < 4; h++)
        c.sinks[h] = h == 1 ? 7.0f : c.sinks[h];
    CHECK(run_sink_forward(&c));
    c = sink_case("sinks: split Lq=1 Lk=2500 ratio 4, f16 cache", 1, 8, 2, 1, 2500, 64, 6003);
    c.kv_dt = SDPA_F16;
    CHECK(run_sink_forward(&c));
    c = sink_case("sinks: split Lq=2 Lk=2048 causal bottom-right, mask", 1, 4, 1, 2, 2048, 32,
                  6004);
    c.causal = c.bottom_right = 1;
    c.mask = 1;
    CHECK(run_sink_forward(&c));
    /* bf16 with D a multiple of 32: the AMX table's own forward, where the CPU has it */
    c = sink_case("sinks: no split, causal bottom-right, mask, bf16 D=64", 2, 4, 2, 150, 200, 64,
                  6005);
    c.causal = c.bottom_right = 1;
    c.mask = 1;
    c.dt = c.kv_dt = SDPA_BF16;
    CHECK(run_sink_forward(&c));
    c = sink_case("sinks: split Lq=1 Lk=2500 ratio 4, bf16 D=128", 1, 8, 2, 1, 2500, 128, 6006);
    c.dt = c.kv_dt = SDPA_BF16;
    CHECK(run_sink_forward(&c));
}

/* A sink far above every score: O is that far below V (exp(s - sink)), LSE the sink to f32's
 * precision; at 1e30 and FLT_MAX the weights are exactly 0 and LSE exactly the sink. */
static void test_sinks_far_above(void) {
    static const float big[4] = {80.0f, 1e30f, FLT_MAX, 60.0f};
    for (int split = 0; split < 2; split++) {
        sk_case c = split ? sink_case("far sinks, split", 1, 4, 2, 1, 3000, 32, 6100)
                          : sink_case("far sinks, no split", 2, 4, 2, 9, 40, 32, 6101);
        memcpy(c.sinks, big, sizeof big);
        sk_bufs t;
        sk_build(&c, &t);
        const size_t n_l = (size_t)(c.B * c.Hq * c.Lq);
        double *g_o = tu_xmalloc(n_l * (size_t)c.Dv * sizeof(double)),
               *g_l = tu_xmalloc(n_l * sizeof(double));
        sk_forward(&t.pb, -1, g_o, g_l, NULL);
        for (int n = 0; n < g_n_impls; n++) {
            if (!g_impls[n].runs ||
                !tu_impl_takes(&g_impls[n], &t.q.t, &t.k.t, &t.v.t, &t.p, &t.o.t))
                continue;
            sdpa_ctx *ctx = tu_ctx(0, g_impls[n].level);
            CHECK_INT_EQ(sdpa_forward(ctx, &t.q.t, &t.k.t, &t.v.t, &t.p, &t.o.t, &t.lse.t),
                         SDPA_OK);
            size_t bad = 0;
            double worst = 0.0;
            for (size_t r = 0; r < n_l; r++) {
                const int64_t h = (int64_t)(r / (size_t)c.Lq % (size_t)c.Hq);
                const double lse = ((const float *)t.lse.t.data)[r];
                bad += !(lse == (double)c.sinks[h]);
                double row_max = 0.0;
                for (int64_t d = 0; d < c.Dv; d++)
                    row_max = fmax(row_max, fabs(g_o[r * (size_t)c.Dv + (size_t)d]));
                for (int64_t d = 0; d < c.Dv; d++) {
                    const double got = ((float *)t.o.t.data)[r * (size_t)c.Dv + (size_t)d];
                    const double want = g_o[r * (size_t)c.Dv + (size_t)d];
                    if (c.sinks[h] >= 1e30f) {
                        bad += got != 0.0;
                    } else {
                        const double e = fabs(got - want) / row_max;
                        worst = fmax(worst, e);
                        bad += !(e <= 1e-5) || !(row_max > 0.0);
                    }
                }
            }
            printf("    [%s] %s: worst error of O relative to its row %.2e\n", g_impls[n].name,
                   c.what, worst);
            CHECK_MSG(bad == 0, "[%s] %s: %zu values off", g_impls[n].name, c.what, bad);
            sdpa_ctx_destroy(ctx);
        }
        free(g_o);
        free(g_l);
        sk_free(&t);
    }
}

/* -inf on every head: the bits of no sinks at all, on every path (reference included). */
static void test_sinks_minus_inf(void) {
    for (int split = 0; split < 2; split++) {
        sk_case c = split ? sink_case("-inf sinks, split", 1, 8, 2, 1, 2100, 40, 6200)
                          : sink_case("-inf sinks, no split, mask", 2, 4, 2, 30, 50, 40, 6201);
        c.mask = !split;
        c.causal = c.bottom_right = 1;
        for (int h = 0; h < 16; h++)
            c.sinks[h] = -INFINITY;
        sk_bufs t;
        sk_build(&c, &t);
        tu_tensor o2 = tu_alloc(SDPA_F32, c.B, c.Hq, c.Lq, c.Dv, TU_BHLD, 0, 0);
        tu_tensor l2 = tu_alloc(SDPA_F32, c.B, c.Hq, c.Lq, 1, TU_BHLD, 0, 0);
        sdpa_params none = t.p;
        none.sinks = NULL;
        for (int n = -1; n < g_n_impls; n++) {
            if (n >= 0 && (!g_impls[n].runs ||
                           !tu_impl_takes(&g_impls[n], &t.q.t, &t.k.t, &t.v.t, &t.p, &t.o.t)))
                continue;
            sdpa_ctx *ctx = tu_ctx(0, n < 0 ? SDPA_ISA_AUTO : g_impls[n].level);
            sdpa_status a, b;
            if (n < 0) { /* the reference */
                a = tu_golden_forward(ctx, &t.q.t, &t.k.t, &t.v.t, &t.p, &t.o.t, &t.lse.t);
                b = tu_golden_forward(ctx, &t.q.t, &t.k.t, &t.v.t, &none, &o2.t, &l2.t);
            } else {
                a = sdpa_forward(ctx, &t.q.t, &t.k.t, &t.v.t, &t.p, &t.o.t, &t.lse.t);
                b = sdpa_forward(ctx, &t.q.t, &t.k.t, &t.v.t, &none, &o2.t, &l2.t);
            }
            CHECK(a == SDPA_OK && b == SDPA_OK);
            const int same =
                memcmp(t.o.buf, o2.buf, o2.bytes) == 0 && memcmp(t.lse.buf, l2.buf, l2.bytes) == 0;
            const char *name = n < 0 ? "reference" : g_impls[n].name;
            printf("    [%s] %s: %s\n", name, c.what, same ? "bitwise no sinks" : "DIFFERS");
            CHECK_MSG(same, "[%s] %s differs from no sinks", name, c.what);
            sdpa_ctx_destroy(ctx);
        }
        tu_free(&o2);
        tu_free(&l2);
        sk_free(&t);
    }
}

/* sdpa_weights with sinks: p_ij = exp(s_ij - LSE_i) with the sink in LSE, so a row sums to
 * 1 - exp(sink - LSE) < 1; rows without keys are 0; a -inf sink sums to 1. */
static void test_sinks_weights(void) {
    sk_case c = sink_case("weights", 2, 4, 2, 9, 20, 16, 6300);
    c.mask = 1;
    c.causal = c.bottom_right = 1;
    sk_bufs t;
    sk_build(&c, &t);
    const size_t n_l = (size_t)(c.B * c.Hq * c.Lq);
    double *g_o = tu_xmalloc(n_l * (size_t)c.Dv * sizeof(double)),
           *g_l = tu_xmalloc(n_l * sizeof(double));
    unsigned char *empty = tu_xmalloc(n_l);
    sk_forward(&t.pb, -1, g_o, g_l, empty);
    tu_tensor w = tu_alloc(SDPA_F32, c.B, c.Hq, c.Lq, c.Lk, TU_BHLD, 0, 0);
    sdpa_ctx *ctx = tu_ctx(0, SDPA_ISA_AUTO);
    CHECK_INT_EQ(sdpa_weights(ctx, &t.q.t, &t.k.t, &t.p, &w.t), SDPA_OK);
    double *s = tu_xmalloc((size_t)c.Lk * sizeof *s), *x = tu_xmalloc((size_t)c.Lk * sizeof *x);
    size_t bad = 0, below_one = 0, finite_rows = 0;
    double worst = 0.0;
    for (int64_t b = 0; b < c.B; b++)
        for (int64_t h = 0; h < c.Hq; h++)
            for (int64_t i = 0; i < c.Lq; i++) {
                const size_t row = (size_t)((b * c.Hq + h) * c.Lq + i);
                int any;
                sk_scores(&t.pb, -1, b, h, i, s, x, &any);
                double sum = 0.0;
                for (int64_t j = 0; j < c.Lk; j++) {
                    const double got = tu_get(&w.t, b, h, i, j);
                    const double want = s[j] == -INFINITY ? 0.0 : exp(s[j] - g_l[row]);
                    const double rel = fabs(got - want) / (want + 1e-40);
                    worst = rel > worst ? rel : worst;
                    /* the tiled path forms the score, its exp and the factor 1 / l in
                     * f32 (about 5 ulp here): 16 ulp of the weight */
                    bad += !(fabs(got - want) <= 0x1p-19 * want + 1e-40);
                    sum += got;
                }
                const double sink = (double)c.sinks[h];
                if (!any) {
                    bad += sum != 0.0;
                } else if (sink == -INFINITY) {
                    bad += !(fabs(sum - 1.0) <= 1e-6);
                } else {
                    finite_rows++;
                    below_one += sum < 1.0;
                    bad += !(fabs(sum - (1.0 - exp(sink - g_l[row]))) <= 1e-6);
                }
            }
    printf(
        "    weights: %zu rows with a finite sink, %zu sum below 1; %zu values off, worst %.3g\n",
        finite_rows, below_one, bad, worst);
    CHECK(bad == 0);
    CHECK(finite_rows > 0 && below_one == finite_rows);
    free(s);
    free(x);
    free(g_o);
    free(g_l);
    free(empty);
    tu_free(&w);
    sdpa_ctx_destroy(ctx);
    sk_free(&t);
}

/* The reference backward (in double) on c's problem, into f32 gradients it allocates.
 * @return 1, or 0 (with a message) on failure. */
static int ref_backward(sdpa_ctx *ctx, sk_bufs *t, const sk_case *c, tu_tensor *dq, tu_tensor *dk,
                        tu_tensor *dv) {
    *dq = tu_alloc(SDPA_F32, c->B, c->Hq, c->Lq, c->Dk, TU_BHLD, 0, 0);
    *dk = tu_alloc(SDPA_F32, c->B, c->Hkv, c->Lk, c->Dk, TU_BHLD, 0, 0);
    *dv = tu_alloc(SDPA_F32, c->B, c->Hkv, c->Lk, c->Dv, TU_BHLD, 0, 0);
    sdpa__problem p;
    sdpa_status st = sdpa__check_backward(ctx, &t->q.t, &t->k.t, &t->v.t, &t->o.t, &t->lse.t,
                                          &t->dout.t, &t->p, &dq->t, &dk->t, &dv->t, &p);
    if (st == SDPA_OK)
        st = sdpa__ref_backward(ctx, &p, &t->dout.t, &dq->t, &dk->t, &dv->t);
    if (st != SDPA_OK)
        printf("    reference backward: %s: %s\n", sdpa_status_name(st), sdpa_ctx_last_error(ctx));
    return st == SDPA_OK;
}

/* The backward with sinks. On tiny problems the gradients written here are checked against
 * central differences of the forward written here (f64, eps 1e-6, relative error <= 1e-6), and
 * the reference backward against them to f32's rounding; then the tiled backward at every ISA
 * level against the reference by testing.md's rule for gradients (k = 8 for f32, 3 for bf16;
 * NMSE gate on dV only), with this file's backward in the storage precision as the baseline,
 * and dq = 0 exactly in rows without keys. */
static void test_sinks_backward(void) {
    /* 1. tiny problems: the gradients of L = sum dout . O by central differences */
    for (int n = 0; n < 2; n++) {
        sk_case c = sink_case(n ? "tiny: softcap 2, sinks 3 and -inf" : "tiny: causal, mask, sinks",
                              1, 2, 1, 3, 4, 3, 6400 + (uint64_t)n);
        c.Dv = 2;
        if (n == 0) {
            c.causal = c.bottom_right = 1;
            c.mask = 1; /* row 3 of 7 does not exist here: hide row 1 of head 0 by hand below */
            c.sinks[0] = 0.7f;
            c.sinks[1] = -0.3f;
        } else {
            c.softcap = 2.0f;
            c.sinks[0] = 3.0f;
            c.sinks[1] = -INFINITY;
        }
        sk_bufs t;
        sk_build(&c, &t);
        if (n == 0) {
            for (int64_t j = 0; j < c.Lk; j++) {
                tu_set(&t.mask.t, 0, 0, 1, j, -INFINITY);
                t.md[(0 * c.Hq + 0) * c.Lq * c.Lk + 1 * c.Lk + j] = -INFINITY;
            }
        }
        const size_t nq = (size_t)(c.Hq * c.Lq * c.Dk), nk = (size_t)(c.Hkv * c.Lk * c.Dk),
                     nv = (size_t)(c.Hkv * c.Lk * c.Dv), no = (size_t)(c.Hq * c.Lq * c.Dv);
        double *dq = tu_xmalloc(nq * sizeof(double)), *dk = tu_xmalloc(nk * sizeof(double)),
               *dv = tu_xmalloc(nv * sizeof(double));
        sk_backward(&t.pb, t.doutd, -1, dq, dk, dv);
        double *o = tu_xmalloc(no * sizeof(double)),
               *l = tu_xmalloc((size_t)(c.Hq * c.Lq) * sizeof(double));
        double *const params[3] = {t.qd, t.kd, t.vd}, *const grads[3] = {dq, dk, dv};
        const size_t sizes[3] = {nq, nk, nv};
        static const char *const names[3] = {"dq", "dk", "dv"};
        for (int a = 0; a < 3; a++) {
            double worst = 0.0, scale = 0.0;
            for (size_t e = 0; e < sizes[a]; e++) {
                const double keep = params[a][e], eps = 1e-6;
                double loss[2];
                for (int side = 0; side < 2; side++) {
                    params[a][e] = keep + (side ? -eps : eps);
                    sk_forward(&t.pb, -1, o, l, NULL);
                    loss[side] = 0.0;
                    for (size_t m = 0; m < no; m++)
                        loss[side] += t.doutd[m] * o[m];
                }
                params[a][e] = keep;
                const double fd = (loss[0] - loss[1]) / (2.0 * eps);
                worst = fmax(worst, fabs(fd - grads[a][e]));
                scale = fmax(scale, fabs(fd));
            }
            printf("    %s: %s analytic vs central differences: %.2e of %.2e\n", c.what, names[a],
                   worst, scale);
            CHECK_MSG(worst <= 1e-6 * scale, "%s: %s off the central differences", c.what,
                      names[a]);
        }
        /* the reference backward against the analytic gradients, to f32's rounding */
        sdpa_ctx *ctx = tu_ctx(1, SDPA_ISA_AUTO);
        CHECK_INT_EQ(sdpa_forward(ctx, &t.q.t, &t.k.t, &t.v.t, &t.p, &t.o.t, &t.lse.t), SDPA_OK);
        tu_tensor rq, rk, rv;
        if (ref_backward(ctx, &t, &c, &rq, &rk, &rv)) {
            const tu_tensor *const ref[3] = {&rq, &rk, &rv};
            for (int a = 0; a < 3; a++) {
                double *r = tu_to_doubles(&ref[a]->t);
                size_t bad = 0;
                for (size_t e = 0; e < sizes[a]; e++)
                    bad += !(fabs(r[e] - grads[a][e]) <= 0x1p-23 * fabs(grads[a][e]) + 1e-12);
                CHECK_MSG(bad == 0, "%s: the reference's %s: %zu values off", c.what, names[a],
                          bad);
                free(r);
            }
        }
        tu_free(&rq);
        tu_free(&rk);
        tu_free(&rv);
        sdpa_ctx_destroy(ctx);
        free(dq);
        free(dk);
        free(dv);
        free(o);
        free(l);
        sk_free(&t);
    }

    /* 2. the tiled backward against the reference */
    for (int n = 0; n < 3; n++) {
        sk_case c =
            n == 0   ? sink_case("tiled backward: causal, mask, sinks", 2, 4, 2, 70, 130, 32, 6500)
            : n == 1 ? sink_case("tiled backward: GQA 4, softcap, sinks, bf16", 1, 8, 2, 33, 97, 24,
                                 6501)
                     : sink_case("tiled backward: Lq=1, Lk=600, sinks", 2, 8, 1, 1, 600, 16, 6502);
        if (n == 0) {
            c.causal = c.bottom_right = 1;
            c.mask = 1;
            c.Dv = 24;
        } else if (n == 1) {
            c.softcap = 4.0f;
            c.dt = c.kv_dt = SDPA_BF16;
        }
        sk_bufs t;
        sk_build(&c, &t);
        const size_t nq = (size_t)(c.B * c.Hq * c.Lq * c.Dk),
                     nk = (size_t)(c.B * c.Hkv * c.Lk * c.Dk),
                     nv = (size_t)(c.B * c.Hkv * c.Lk * c.Dv), n_l = (size_t)(c.B * c.Hq * c.Lq);
        double *lq = tu_xmalloc(nq * sizeof(double)), *lk = tu_xmalloc(nk * sizeof(double)),
               *lv = tu_xmalloc(nv * sizeof(double));
        sk_backward(&t.pb, t.doutd, (int)c.dt, lq, lk, lv);
        /* the rows without keys, from the forward written here */
        double *fo = tu_xmalloc((size_t)(c.B * c.Hq * c.Lq * c.Dv) * sizeof(double));
        double *gl = tu_xmalloc(n_l * sizeof(double));
        unsigned char *empty = tu_xmalloc(n_l);
        sk_forward(&t.pb, -1, fo, gl, empty);
        free(fo);
        sdpa_ctx *ctx = tu_ctx(1, SDPA_ISA_AUTO);
        tu_tensor rq, rk, rv;
        CHECK_INT_EQ(tu_golden_forward(ctx, &t.q.t, &t.k.t, &t.v.t, &t.p, &t.o.t, &t.lse.t),
                     SDPA_OK);
        const int have_ref = ref_backward(ctx, &t, &c, &rq, &rk, &rv);
        CHECK(have_ref);
        sdpa_ctx_destroy(ctx);
        double *g[3] = {tu_to_doubles(&rq.t), tu_to_doubles(&rk.t), tu_to_doubles(&rv.t)};
        const double *lp[3] = {lq, lk, lv};
        const size_t sizes[3] = {nq, nk, nv};
        static const char *const names[3] = {"dq", "dk", "dv"};
        const double kf = c.dt == SDPA_F32 ? 8.0 : 3.0;
        const double gate = c.dt == SDPA_F32 ? 1e-10 : 5e-5;
        tu_tensor dq = tu_alloc(c.dt, c.B, c.Hq, c.Lq, c.Dk, TU_BHLD, 0, 0);
        tu_tensor dk = tu_alloc(c.dt, c.B, c.Hkv, c.Lk, c.Dk, TU_BHLD, 0, 0);
        tu_tensor dv = tu_alloc(c.dt, c.B, c.Hkv, c.Lk, c.Dv, TU_BHLD, 0, 0);
        const tu_tensor *const out[3] = {&dq, &dk, &dv};
        for (int m = 0; m < g_n_impls && have_ref; m++) {
            /* (a table that takes neither this forward nor any backward would repeat the one
             * below it) */
            if (!g_impls[m].runs ||
                (!g_impls[m].backward &&
                 !tu_impl_takes(&g_impls[m], &t.q.t, &t.k.t, &t.v.t, &t.p, &t.o.t)))
                continue;
            ctx = tu_ctx(0, g_impls[m].level);
            CHECK_INT_EQ(sdpa_forward(ctx, &t.q.t, &t.k.t, &t.v.t, &t.p, &t.o.t, &t.lse.t),
                         SDPA_OK);
            CHECK_INT_EQ(sdpa_backward(ctx, &t.q.t, &t.k.t, &t.v.t, &t.o.t, &t.lse.t, &t.dout.t,
                                       &t.p, &dq.t, &dk.t, &dv.t),
                         SDPA_OK);
            int good = 1;
            for (int a = 0; a < 3; a++) {
                double *x = tu_to_doubles(&out[a]->t);
                char what[128];
                snprintf(what, sizeof what, "[%s] %s %s", g_impls[m].name, c.what, names[a]);
                good &= tu_rule(what, x, lp[a], g[a], sizes[a], c.dt, kf, a == 2 ? gate : 0.0);
                if (a == 0)
                    for (size_t r = 0; r < n_l; r++)
                        for (int64_t d = 0; d < c.Dk && empty[r]; d++)
                            good &= x[r * (size_t)c.Dk + (size_t)d] == 0.0;
                free(x);
            }
            CHECK_MSG(good, "[%s] %s fails the rule", g_impls[m].name, c.what);
            sdpa_ctx_destroy(ctx);
        }
        for (int a = 0; a < 3; a++)
            free(g[a]);
        tu_free(&dq);
        tu_free(&dk);
        tu_free(&dv);
        tu_free(&rq);
        tu_free(&rk);
        tu_free(&rv);
        free(lq);
        free(lk);
        free(lv);
        free(gl);
        free(empty);
        sk_free(&t);
    }
}

int main(int argc, char **argv) {
    tu_report_impls();
    g_n_impls = tu_impls(g_impls);
    return CHECK_RUN(argc, argv, CASE(test_sinks_forward), CASE(test_sinks_far_above),
                     CASE(test_sinks_minus_inf), CASE(test_sinks_weights),
                     CASE(test_sinks_backward));
}
