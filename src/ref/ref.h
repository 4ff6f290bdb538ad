/*
 * ref.h — the reference implementation: the whole semantic contract of sdpa.h in plain C
 * with double accumulation. It is the oracle every fast path is tested against, and the
 * implementation dispatch falls back on (src/dispatch/dispatch.c registers it).
 */
#ifndef SDPA_REF_H
#define SDPA_REF_H

#include "../core/problem.h"

/* out: (B, Hq, Lq, Dv); lse: NULL or (B, Hq, Lq, 1) F32. The problem's dropout applies to
 * out; lse is the softmax's normaliser, the same with or without dropout. */
sdpa_status sdpa__ref_forward(sdpa_ctx *ctx, const sdpa__problem *p, sdpa_tensor *out,
                              sdpa_tensor *lse);

/* Row i of (batch b, query head h) of sdpa__ref_forward, into out and (when not NULL) lse,
 * with caller-owned scratch: q_i (Dk doubles), s (Lk doubles), o_i (Dv doubles). For fast
 * paths that hand it the rows they cannot compute exactly (flash.c: accumulator overflow).
 * With ragged lengths p is sequence b's own problem (sdpa__seq), and a row i >= p->Lq (a
 * query the sequence does not have) is written as a fully masked one. */
void sdpa__ref_forward_row(const sdpa__problem *p, int64_t b, int64_t h, int64_t i, double *q_i,
                           double *s, double *o_i, sdpa_tensor *out, sdpa_tensor *lse);

/* w: (B, Hq, Lq, Lk) F32: the softmax probabilities p_ij, before dropout (see
 * ref_forward.c). */
sdpa_status sdpa__ref_weights(sdpa_ctx *ctx, const sdpa__problem *p, sdpa_tensor *w);

/* The gradients of sdpa__ref_forward's out, given dout = dL/dout, recomputed in double from
 * q, k and v alone (no stored out or lse is trusted). Every element of dq, dk and dv is
 * written exactly once, after all scratch is allocated: on SDPA_ERR_NOMEM nothing is written.
 *   dout: (B, Hq, Lq, Dv)   dq: (B, Hq, Lq, Dk)   dk: (B, Hkv, Lk, Dk)   dv: (B, Hkv, Lk, Dv)
 * any strides (outputs must not overlap anything), F32/F16/BF16. */
sdpa_status sdpa__ref_backward(sdpa_ctx *ctx, const sdpa__problem *p, const sdpa_tensor *dout,
                               sdpa_tensor *dq, sdpa_tensor *dk, sdpa_tensor *dv);

/* ---- shared by the reference's own files (ref_forward.c, ref_backward.c) ---------------- */

/* What a row's scores show. */
typedef enum sdpa__row_kind {
    SDPA__ROW_OK,    /* at least one key contributes and every score is finite or -inf */
    SDPA__ROW_EMPTY, /* no key contributes: fully masked, output 0 and LSE -inf */
    SDPA__ROW_NAN    /* a contributing score is NaN or +inf: the row is NaN */
} sdpa__row_kind;

/* Query row i of (b, h), widened into q_i (Dk), and its scores s (Lk): keys hidden by the
 * window, the bool mask or a -inf bias get s[j] = -inf and take no further part. *m is the
 * largest finite score (-inf if none). When dsdx is not NULL it receives ds_ij / dx_ij for
 * every visible key, the derivative of the score by the scaled product x_ij = scale q_i.k_j
 * (softcap's sech^2(x / c), else 1); the backward needs it. */
sdpa__row_kind sdpa__ref_row_scores(const sdpa__problem *p, int64_t b, int64_t h, int64_t i,
                                    double *q_i, double *s, double *dsdx, double *m);

/* The softmax denominator of row scores s of query head h (an SDPA__ROW_OK row over the
 * problem's Lk keys, -inf for hidden ones) with *m their largest: sum_j exp(s_j - *m), summed in
 * key order, and with an attention sink sigma_h (problem.sinks) also exp(sigma_h - *m), *m
 * first raised to sigma_h where the sink is above every score. */
double sdpa__ref_row_sum(const sdpa__problem *p, int64_t h, const double *s, double *m);

/* Dropout's factor z_ij of weight (b, h, i, j): 1 when dropout is off, else 1 / (1 - p) for a
 * kept weight and 0 for a dropped one (philox.h makes the decision). */
double sdpa__ref_dropout(const sdpa__problem *p, int64_t b, int64_t h, int64_t i, int64_t j);

#endif /* SDPA_REF_H */
