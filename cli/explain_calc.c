/*
 * explain_calc.c — the arithmetic of the walk-through (explain.h), written out plainly in
 * double precision because showing it is the point, and the library's answer on the same
 * inputs, which the walk-through checks it against.
 */
#include "explain.h"

#include <math.h>

int explain_visible(const explain *e, int i, int j) {
    return !e->causal || j <= i;
}

void explain_compute(explain *e) {
    const double scale = 1.0 / sqrt((double)e->dk);
    for (int i = 0; i < e->lq; i++) {
        for (int j = 0; j < e->lk; j++) {
            double acc = 0.0;
            for (int t = 0; t < e->dk; t++)
                acc += (double)e->q[i * e->dk + t] * (double)e->k[j * e->dk + t];
            e->scores[i * e->lk + j] = acc;
            e->scaled[i * e->lk + j] = explain_visible(e, i, j) ? acc * scale : -INFINITY;
        }
        /* Subtracting the row's largest score first keeps exp() from overflowing; it cancels
         * in the division. Row 0 always sees key 0, so no row is fully masked. */
        const double *s = e->scaled + i * e->lk;
        double m = -INFINITY, sum = 0.0;
        for (int j = 0; j < e->lk; j++)
            m = s[j] > m ? s[j] : m;
        for (int j = 0; j < e->lk; j++)
            sum += exp(s[j] - m);
        for (int j = 0; j < e->lk; j++)
            e->w[i * e->lk + j] = exp(s[j] - m) / sum;
        for (int f = 0; f < e->dv; f++) {
            double acc = 0.0;
            for (int j = 0; j < e->lk; j++)
                acc += e->w[i * e->lk + j] * (double)e->v[j * e->dv + f];
            e->o[i * e->dv + f] = acc;
        }
    }
}

void explain_backward(explain *e) {
    const int lq = e->lq, lk = e->lk, dk = e->dk, dv = e->dv;
    const double scale = 1.0 / sqrt((double)dk);
    /* dO = 1 everywhere: each entry of out adds itself to L */
    for (int j = 0; j < lk; j++)
        for (int f = 0; f < dv; f++) {
            double acc = 0.0; /* dV = P^T dO */
            for (int i = 0; i < lq; i++)
                acc += e->w[i * lk + j];
            e->dvv[j * dv + f] = acc;
        }
    for (int i = 0; i < lq; i++) {
        double delta = 0.0; /* Delta_i = dO_i . o_i */
        for (int f = 0; f < dv; f++)
            delta += e->o[i * dv + f];
        e->delta[i] = delta;
        for (int j = 0; j < lk; j++) {
            double acc = 0.0; /* dP = dO V^T */
            for (int f = 0; f < dv; f++)
                acc += (double)e->v[j * dv + f];
            e->dp[i * lk + j] = acc;
            /* dS = P o (dP - Delta): softmax's derivative; a masked key has P = 0 */
            e->ds[i * lk + j] = explain_visible(e, i, j) ? e->w[i * lk + j] * (acc - delta) : 0.0;
        }
    }
    for (int i = 0; i < lq; i++)
        for (int f = 0; f < dk; f++) {
            double acc = 0.0; /* dQ = dS K / sqrt(d_k) */
            for (int j = 0; j < lk; j++)
                acc += e->ds[i * lk + j] * (double)e->k[j * dk + f];
            e->dq[i * dk + f] = acc * scale;
        }
    for (int j = 0; j < lk; j++)
        for (int f = 0; f < dk; f++) {
            double acc = 0.0; /* dK = dS^T Q / sqrt(d_k) */
            for (int i = 0; i < lq; i++)
                acc += e->ds[i * lk + j] * (double)e->q[i * dk + f];
            e->dkk[j * dk + f] = acc * scale;
        }
}

double explain_loss_moved_q(const explain *e, int i, int f, double h) {
    const double scale = 1.0 / sqrt((double)e->dk);
    double loss = 0.0;
    for (int r = 0; r < e->lq; r++) {
        double s[EXPLAIN_MAX_L], m = -INFINITY, sum = 0.0;
        for (int j = 0; j < e->lk; j++) {
            double acc = 0.0;
            for (int t = 0; t < e->dk; t++)
                acc += ((double)e->q[r * e->dk + t] + (r == i && t == f ? h : 0.0)) *
                       (double)e->k[j * e->dk + t];
            s[j] = explain_visible(e, r, j) ? acc * scale : -INFINITY;
            m = s[j] > m ? s[j] : m;
        }
        for (int j = 0; j < e->lk; j++)
            sum += exp(s[j] - m);
        for (int j = 0; j < e->lk; j++)
            for (int c = 0; c < e->dv; c++)
                loss += exp(s[j] - m) / sum * (double)e->v[j * e->dv + c];
    }
    return loss;
}

double explain_sample_var(const double *x, int n) {
    double mean = 0.0, ss = 0.0;
    for (int i = 0; i < n; i++)
        mean += x[i];
    mean /= n;
    for (int i = 0; i < n; i++)
        ss += (x[i] - mean) * (x[i] - mean);
    return ss / (n - 1);
}

double explain_sample_var_f(const float *x, int n) {
    static double tmp[EXPLAIN_MAX_L * EXPLAIN_MAX_D];
    for (int i = 0; i < n; i++)
        tmp[i] = x[i];
    return explain_sample_var(tmp, n);
}

int explain_most_spread_row(const explain *e) {
    int best = 0;
    double best_max = 2.0;
    for (int i = 0; i < e->lq; i++) {
        double m = 0.0;
        for (int j = 0; j < e->lk; j++)
            m = e->w[i * e->lk + j] > m ? e->w[i * e->lk + j] : m;
        if (m < best_max - 1e-12) {
            best_max = m;
            best = i;
        }
    }
    return best;
}

sdpa_status explain_library(explain *e, sdpa_ctx *ctx, float *weights, float *out, float *lse) {
    sdpa_tensor tq = sdpa_tensor_bhld(e->q, SDPA_F32, 1, 1, e->lq, e->dk);
    sdpa_tensor tk = sdpa_tensor_bhld(e->k, SDPA_F32, 1, 1, e->lk, e->dk);
    sdpa_tensor tv = sdpa_tensor_bhld(e->v, SDPA_F32, 1, 1, e->lk, e->dv);
    sdpa_tensor tw = sdpa_tensor_bhld(weights, SDPA_F32, 1, 1, e->lq, e->lk);
    sdpa_tensor to = sdpa_tensor_bhld(out, SDPA_F32, 1, 1, e->lq, e->dv);
    sdpa_tensor tl = sdpa_tensor_bhld(lse, SDPA_F32, 1, 1, e->lq, 1);
    sdpa_params p = {0};
    p.causal = e->causal;
    p.align = SDPA_ALIGN_TOP_LEFT;
    sdpa_status st = sdpa_weights(ctx, &tq, &tk, &p, &tw);
    if (st == SDPA_OK)
        st = sdpa_forward(ctx, &tq, &tk, &tv, &p, &to, lse != NULL ? &tl : NULL);
    return st;
}

sdpa_status explain_library_backward(explain *e, sdpa_ctx *ctx, float *dq, float *dk, float *dv) {
    static float out[EXPLAIN_MAX_L * EXPLAIN_MAX_D], lse[EXPLAIN_MAX_L],
        ones[EXPLAIN_MAX_L * EXPLAIN_MAX_D];
    for (int t = 0; t < e->lq * e->dv; t++)
        ones[t] = 1.0f;
    sdpa_tensor tq = sdpa_tensor_bhld(e->q, SDPA_F32, 1, 1, e->lq, e->dk);
    sdpa_tensor tk = sdpa_tensor_bhld(e->k, SDPA_F32, 1, 1, e->lk, e->dk);
    sdpa_tensor tv = sdpa_tensor_bhld(e->v, SDPA_F32, 1, 1, e->lk, e->dv);
    sdpa_tensor to = sdpa_tensor_bhld(out, SDPA_F32, 1, 1, e->lq, e->dv);
    sdpa_tensor tl = sdpa_tensor_bhld(lse, SDPA_F32, 1, 1, e->lq, 1);
    sdpa_tensor tdo = sdpa_tensor_bhld(ones, SDPA_F32, 1, 1, e->lq, e->dv);
    sdpa_tensor tdq = sdpa_tensor_bhld(dq, SDPA_F32, 1, 1, e->lq, e->dk);
    sdpa_tensor tdk = sdpa_tensor_bhld(dk, SDPA_F32, 1, 1, e->lk, e->dk);
    sdpa_tensor tdv = sdpa_tensor_bhld(dv, SDPA_F32, 1, 1, e->lk, e->dv);
    sdpa_params p = {0};
    p.causal = e->causal;
    sdpa_status st = sdpa_forward(ctx, &tq, &tk, &tv, &p, &to, &tl);
    if (st == SDPA_OK)
        st = sdpa_backward(ctx, &tq, &tk, &tv, &to, &tl, &tdo, &p, &tdq, &tdk, &tdv);
    return st;
}
