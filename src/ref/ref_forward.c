/*
 * ref_forward.c — the reference forward pass and attention weights.
 *
 * Written to be read, not to be fast: one query row at a time, every score materialised in
 * double, two passes over the keys (scores and their maximum; then exponentials, sum and the
 * weighted sum of values). Every rule of the "Semantics" section of sdpa.h is implemented here
 * in the most literal way, and the fast paths are tested against this file.
 *
 * Dropout (problem.h, philox.h) acts on the weights after the softmax, as in PyTorch's math
 * path: O_i = sum_j z_ij p_ij v_j with z_ij = keep_ij / (1 - p). A dropped key still counts in
 * the normaliser, so the LSE is the softmax's, unchanged by dropout. It also still adds
 * 0 * v_j, so a NaN in its V reaches O_i: dropout is not a mask, and PyTorch's product of the
 * dropped weights with V gives the same NaN. sdpa__ref_weights returns p_ij before dropout:
 * sdpa_weights means "the softmax probabilities" (rows sum to 1, heatmaps show what the model
 * attends to), and whoever needs the dropped weights multiplies by sdpa__ref_dropout's factor.
 */
#include "ref.h"

#include "../core/half.h"
#include "../core/philox.h"
#include "../core/services.h"

#include <math.h>

/* x if f32 holds it, else the infinity of its sign: the fast paths form every score in f32,
 * so a q.k, a scaled score or a biased one beyond FLT_MAX is +-inf there, and the contract
 * (sdpa.h, "Scores") makes that the rule for every function. The threshold is where f32's
 * rounding to nearest gives inf: FLT_MAX plus half an ulp. */
static double f32_range(double x) {
    const double limit = 0x1.ffffffp127;
    return x >= limit ? INFINITY : x <= -limit ? -INFINITY : x;
}

/* Widens query row i of (b, h) into q_i (Dk). */
static void load_q(const sdpa__problem *p, int64_t b, int64_t h, int64_t i, double *q_i) {
    for (int64_t d = 0; d < p->Dk; d++)
        q_i[d] = (double)sdpa__load(p->q.data, p->q.dtype, sdpa__offset(&p->q, b, h, i, d));
}

/* Pass 1 for query row i of (b, h): s[j] for every key j of kv head hk (ref.h).
 *   q_i:  (Dk) the query row, written (widened to double)
 *   s:    (Lk) scores, written
 *   dsdx: NULL, or (Lk) ds_ij / dx_ij of the visible keys, written
 *   *m:   the largest finite score (-inf if none)                                          */
sdpa__row_kind sdpa__ref_row_scores(const sdpa__problem *p, int64_t b, int64_t h, int64_t i,
                                    double *q_i, double *s, double *dsdx, double *m) {
    const int64_t hk = h / p->group;
    int any_nan = 0;
    load_q(p, b, h, i, q_i);
    *m = -INFINITY;
    for (int64_t j = 0; j < p->Lk; j++) {
        s[j] = -INFINITY;
        if (!sdpa__visible(p, i, j))
            continue;
        double bias = 0.0;
        if (p->has_mask) {
            const float mv =
                sdpa__load(p->mask.data, p->mask.dtype, sdpa__offset(&p->mask, b, h, i, j));
            if (p->mask.dtype == SDPA_BOOL ? mv == 0.0f : mv == -INFINITY)
                continue; /* hidden before anything is computed: NaN in q or k stays out */
            if (p->mask.dtype != SDPA_BOOL)
                bias = (double)mv;
        }
        /* s_ij = softcap(scale * q_i . k_j) + alibi_ij + mask_ij */
        const int64_t k_j = sdpa__kv_offset(p, &p->k, b, hk, j);
        double dot = 0.0;
        for (int64_t d = 0; d < p->Dk; d++)
            dot += q_i[d] * (double)sdpa__load(p->k.data, p->k.dtype, k_j + d * p->k.stride[3]);
        double x = f32_range(p->scale * f32_range(dot));
        if (dsdx != NULL)
            dsdx[j] = 1.0;
        if (p->softcap > 0.0) {
            /* d/dx c tanh(x / c) = 1 - tanh^2(x / c), taken as 1 / cosh^2(x / c): the same
             * number without 1 - tanh^2's cancellation where tanh is near +-1, and exactly 0
             * once cosh^2 overflows (x = +-inf included) */
            if (dsdx != NULL) {
                const double ch = cosh(x / p->softcap);
                dsdx[j] = 1.0 / (ch * ch);
            }
            x = p->softcap * tanh(x / p->softcap);
        }
        if (p->alibi != NULL)
            x = f32_range(x - (double)p->alibi[h] * (double)sdpa__alibi_distance(p, i, j));
        x = f32_range(x + bias);
        if (x == -INFINITY)
            continue; /* a score below f32's range hides its key, as -inf does */
        s[j] = x;
        if (isnan(x) || x == INFINITY)
            any_nan = 1;
        else if (x > *m)
            *m = x;
    }
    if (any_nan)
        return SDPA__ROW_NAN;
    return *m == -INFINITY ? SDPA__ROW_EMPTY : SDPA__ROW_OK;
}

double sdpa__ref_row_sum(const sdpa__problem *p, int64_t h, const double *s, double *m) {
    const double sink = p->sinks != NULL ? (double)p->sinks[h] : -INFINITY;
    if (sink > *m)
        *m = sink;
    double sum = 0.0;
    for (int64_t j = 0; j < p->Lk; j++)
        if (s[j] != -INFINITY)
            sum += exp(s[j] - *m);
    return sink == -INFINITY ? sum : sum + exp(sink - *m);
}

double sdpa__ref_dropout(const sdpa__problem *p, int64_t b, int64_t h, int64_t i, int64_t j) {
    if (!(p->dropout_p > 0.0))
        return 1.0;
    return sdpa__dropout_keep(p->dropout_seed, p->dropout_offset, b, h, i, j, p->dropout_p)
               ? 1.0 / (1.0 - p->dropout_p)
               : 0.0;
}

void sdpa__ref_forward_row(const sdpa__problem *p, int64_t b, int64_t h, int64_t i, double *q_i,
                           double *s, double *o_i, sdpa_tensor *out, sdpa_tensor *lse) {
    const int64_t hk = h / p->group;
    // pass 1: scores and their maximum (a query the sequence does not have sees nothing)
    double m = -INFINITY;
    const sdpa__row_kind kind =
        i < p->Lq ? sdpa__ref_row_scores(p, b, h, i, q_i, s, NULL, &m) : SDPA__ROW_EMPTY;

    // pass 2: o_i = sum_j z_ij exp(s_ij - m) v_j / sum, z_ij the dropout factor (1 without
    // dropout, where the product is skipped to leave the bits as they were), and sum the
    // softmax's denominator (with the sink's term)
    const int dropout = p->dropout_p > 0.0;
    const double sum = kind == SDPA__ROW_OK ? sdpa__ref_row_sum(p, h, s, &m) : 0.0;
    for (int64_t d = 0; d < p->Dv; d++)
        o_i[d] = 0.0;
    if (kind == SDPA__ROW_OK) {
        for (int64_t j = 0; j < p->Lk; j++) {
            if (s[j] == -INFINITY)
                continue; /* hidden keys never touch V: NaN there stays out */
            const double e = exp(s[j] - m);
            const double w = dropout ? e * sdpa__ref_dropout(p, b, h, i, j) : e;
            const int64_t v_j = sdpa__kv_offset(p, &p->v, b, hk, j);
            for (int64_t d = 0; d < p->Dv; d++)
                o_i[d] += w * (double)sdpa__load(p->v.data, p->v.dtype, v_j + d * p->v.stride[3]);
        }
    }

    // pass 3: normalise, round once, store; an empty row's LSE is its sink's (or -inf)
    double row_lse;
    if (kind == SDPA__ROW_OK)
        row_lse = m + log(sum);
    else if (kind == SDPA__ROW_EMPTY)
        row_lse = p->sinks != NULL ? (double)p->sinks[h] : -INFINITY;
    else
        row_lse = NAN;
    for (int64_t d = 0; d < p->Dv; d++) {
        double o = 0.0;
        if (kind == SDPA__ROW_OK)
            o = o_i[d] / sum;
        else if (kind == SDPA__ROW_NAN)
            o = NAN;
        sdpa__store(out->data, out->dtype, sdpa__offset(out, b, h, i, d), o);
    }
    if (lse != NULL)
        ((float *)lse->data)[sdpa__offset(lse, b, h, i, 0)] = (float)row_lse;
}

sdpa_status sdpa__ref_forward(sdpa_ctx *ctx, const sdpa__problem *p, sdpa_tensor *out,
                              sdpa_tensor *lse) {
    double *q_i = sdpa__alloc(ctx, (size_t)p->Dk * sizeof(double), 64);
    double *s = sdpa__alloc(ctx, (size_t)p->Lk * sizeof(double), 64);
    double *o_i = sdpa__alloc(ctx, (size_t)p->Dv * sizeof(double), 64);
    if (q_i == NULL || s == NULL || o_i == NULL) {
        sdpa__free(ctx, q_i);
        sdpa__free(ctx, s);
        sdpa__free(ctx, o_i);
        return sdpa__fail(ctx, SDPA_ERR_NOMEM, "reference forward: no memory for %lld scores",
                          (long long)p->Lk);
    }
    for (int64_t b = 0; b < p->B; b++) {
        sdpa__problem tmp;
        const sdpa__problem *seq = sdpa__seq(p, b, &tmp);
        for (int64_t h = 0; h < p->Hq; h++)
            for (int64_t i = 0; i < p->Lq; i++)
                sdpa__ref_forward_row(seq, b, h, i, q_i, s, o_i, out, lse);
    }
    sdpa__free(ctx, q_i);
    sdpa__free(ctx, s);
    sdpa__free(ctx, o_i);
    return SDPA_OK;
}

sdpa_status sdpa__ref_weights(sdpa_ctx *ctx, const sdpa__problem *p, sdpa_tensor *w) {
    double *q_i = sdpa__alloc(ctx, (size_t)p->Dk * sizeof(double), 64);
    double *s = sdpa__alloc(ctx, (size_t)p->Lk * sizeof(double), 64);
    if (q_i == NULL || s == NULL) {
        sdpa__free(ctx, q_i);
        sdpa__free(ctx, s);
        return sdpa__fail(ctx, SDPA_ERR_NOMEM, "reference weights: no memory for %lld scores",
                          (long long)p->Lk);
    }
    float *w_data = w->data;
    for (int64_t b = 0; b < p->B; b++) {
        for (int64_t h = 0; h < p->Hq; h++) {
            for (int64_t i = 0; i < p->Lq; i++) {
                // pass 1: scores and their maximum
                double m;
                const sdpa__row_kind kind = sdpa__ref_row_scores(p, b, h, i, q_i, s, NULL, &m);

                // pass 2: the normaliser (with the sink's term)
                const double sum = kind == SDPA__ROW_OK ? sdpa__ref_row_sum(p, h, s, &m) : 0.0;

                // pass 3: p_ij = exp(s_ij - m) / sum; hidden keys 0; a NaN row is NaN where
                // it can see. Before dropout, whatever the problem's dropout_p (see the top).
                for (int64_t j = 0; j < p->Lk; j++) {
                    double pij = 0.0;
                    if (s[j] != -INFINITY)
                        pij = kind == SDPA__ROW_OK ? exp(s[j] - m) / sum : NAN;
                    w_data[sdpa__offset(w, b, h, i, j)] = (float)pij;
                }
            }
        }
    }
    sdpa__free(ctx, q_i);
    sdpa__free(ctx, s);
    return SDPA_OK;
}
