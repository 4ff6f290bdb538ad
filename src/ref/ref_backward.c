/*
 * ref_backward.c — the reference backward pass: dQ, dK and dV of ref_forward.c's output.
 *
 * The oracle of every fast backward, written to be read: one query row at a time, in double,
 * everything recomputed from q, k and v (a rounded out or lse is never trusted). For query row
 * i of (batch b, query head h), kv head hk = h / group, and the keys j that row i sees, the
 * forward is
 *     (F1) x_ij  = scale * q_i . k_j
 *     (F2) s_ij  = softcap(x_ij) + alibi_ij + mask_ij,    softcap(x) = c tanh(x / c)
 *     (F3) P_ij  = exp(s_ij) / sum_l exp(s_il)
 *     (F4) P~_ij = z_ij P_ij,                            z_ij = keep_ij / (1 - p), or 1
 *     (F5) O_i   = sum_j P~_ij v_j
 * and, given dO_i = dL/dO_i, each step below differentiates the forward line it names:
 *     (B5) dV_j += P~_ij dO_i                 and  dP~_ij = dO_i . v_j
 *     (B4) dP_ij = z_ij dP~_ij
 *     (B3) dS_ij = P_ij (dP_ij - Delta_i),     Delta_i = sum_l P_il dP_il = dO_i . O_i
 *     (B2) dX_ij = dS_ij softcap'(x_ij),       softcap'(x) = 1 - tanh^2(x / c), else 1
 *                  (sdpa__ref_row_scores gives it); ALiBi and the mask are constants and get
 *                  no gradient
 *     (B1) dQ_i += scale dX_ij k_j             and  dK_j += scale dX_ij q_i
 * Delta_i is taken over the dropped output O_i, which is what sum_l P_il dP_il is once (B4)
 * has put the mask in: the dropout mask enters exactly twice, in (B5) and (B4).
 *
 * The order of the sums is fixed: for each (b, hk), the query heads of its group in order,
 * their rows in order, the keys in order. dK and dV of a (b, hk) gather in double scratch and
 * are stored once, so every element of dq, dk and dv is written exactly once (zeros for keys
 * that no query sees), and each is rounded once, to its dtype.
 *
 * Rows outside the ordinary:
 * - A fully masked row (no visible key) gets dQ_i = 0 and adds nothing to dK or dV.
 * - A NaN row (a visible score that is NaN or +inf: the forward's O_i is NaN) has P_ij = NaN
 *   for every key it sees, so its dQ_i is NaN in every column and it adds NaN to dK_j and
 *   dV_j of every key it sees, the keys it drops included; the keys it cannot see get nothing
 *   from it. This is what autograd through the forward gives, restricted to the visible keys
 *   as the forward's NaN rule is. A NaN in dO_i[d] spreads alike, but reaches only column d of
 *   the dV rows (B5's product is per column).
 * - A hidden key (window, bool mask, -inf bias) is never read, so NaN or Inf in its K or V
 *   reaches no gradient; its dK and dV are 0 when no row sees it.
 * - A dropped key is visible: it still shapes the softmax, so it gets dK_j and gives dQ_i
 *   through (B3), with dP_ij = 0 * dP~_ij (a NaN in its V, which made O_i NaN, stays NaN).
 */
#include "ref.h"

#include "../core/half.h"
#include "../core/services.h"

#include <math.h>
#include <stdint.h>

/* Scratch of one call: rows of the current query and the dK, dV of one (b, hk). */
typedef struct bwd_scratch {
    double *q_i;   /* (Dk) the query row */
    double *do_i;  /* (Dv) dL/dO_i */
    double *o_i;   /* (Dv) O_i, recomputed */
    double *dq_i;  /* (Dk) dL/dq_i */
    double *s;     /* (Lk) scores s_ij; -inf where hidden */
    double *dsdx;  /* (Lk) ds_ij / dx_ij */
    double *prob;  /* (Lk) P_ij */
    double *z;     /* (Lk) dropout factors z_ij */
    double *dk_hk; /* (Lk, Dk) dL/dK of kv head hk */
    double *dv_hk; /* (Lk, Dv) dL/dV of kv head hk */
} bwd_scratch;

/* n * m doubles in bytes, or 0 when that overflows size_t (no allocation can succeed). */
static size_t doubles(int64_t n, int64_t m) {
    if ((uint64_t)n > SIZE_MAX / sizeof(double) / (uint64_t)m)
        return 0;
    return (size_t)n * (size_t)m * sizeof(double);
}

static void free_scratch(sdpa_ctx *ctx, bwd_scratch *w) {
    double **all[] = {&w->q_i,  &w->do_i, &w->o_i, &w->dq_i,  &w->s,
                      &w->dsdx, &w->prob, &w->z,   &w->dk_hk, &w->dv_hk};
    for (size_t n = 0; n < sizeof all / sizeof all[0]; n++) {
        sdpa__free(ctx, *all[n]);
        *all[n] = NULL;
    }
}

/* @return 1 with every buffer allocated, else 0 with none. */
static int alloc_scratch(sdpa_ctx *ctx, const sdpa__problem *p, bwd_scratch *w) {
    const size_t row_k = doubles(p->Dk, 1), row_v = doubles(p->Dv, 1), keys = doubles(p->Lk, 1);
    const size_t dk_bytes = doubles(p->Lk, p->Dk), dv_bytes = doubles(p->Lk, p->Dv);
    *w = (bwd_scratch){0};
    if (row_k == 0 || row_v == 0 || keys == 0 || dk_bytes == 0 || dv_bytes == 0)
        return 0;
    w->q_i = sdpa__alloc(ctx, row_k, 64);
    w->do_i = sdpa__alloc(ctx, row_v, 64);
    w->o_i = sdpa__alloc(ctx, row_v, 64);
    w->dq_i = sdpa__alloc(ctx, row_k, 64);
    w->s = sdpa__alloc(ctx, keys, 64);
    w->dsdx = sdpa__alloc(ctx, keys, 64);
    w->prob = sdpa__alloc(ctx, keys, 64);
    w->z = sdpa__alloc(ctx, keys, 64);
    w->dk_hk = sdpa__alloc(ctx, dk_bytes, 64);
    w->dv_hk = sdpa__alloc(ctx, dv_bytes, 64);
    if (w->q_i && w->do_i && w->o_i && w->dq_i && w->s && w->dsdx && w->prob && w->z && w->dk_hk &&
        w->dv_hk)
        return 1;
    free_scratch(ctx, w);
    return 0;
}

/* Element (i0, i1, i2, i3) of t, widened. */
static double load(const sdpa_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return (double)sdpa__load(t->data, t->dtype, sdpa__offset(t, i0, i1, i2, i3));
}

/* Query row i of (b, h): writes dq row i and adds its share to w->dk_hk and w->dv_hk. */
static void row_backward(const sdpa__problem *p, const sdpa_tensor *dout, sdpa_tensor *dq,
                         int64_t b, int64_t h, int64_t i, bwd_scratch *w) {
    const int64_t hk = h / p->group;
    const int64_t Lk = p->Lk, Dk = p->Dk, Dv = p->Dv;
    // forward (F1)-(F2): the scores, their maximum, and softcap's derivative
    double m;
    const sdpa__row_kind kind = sdpa__ref_row_scores(p, b, h, i, w->q_i, w->s, w->dsdx, &m);
    for (int64_t d = 0; d < Dk; d++)
        w->dq_i[d] = 0.0;
    if (kind == SDPA__ROW_EMPTY) {
        /* no visible key: O_i = 0 is a constant, so dQ_i = 0 and no key gets anything */
        for (int64_t d = 0; d < Dk; d++)
            sdpa__store(dq->data, dq->dtype, sdpa__offset(dq, b, h, i, d), 0.0);
        return;
    }

    // forward (F3)-(F4): P_ij, NaN for every visible key of a NaN row; z_ij
    const double sum = kind == SDPA__ROW_OK ? sdpa__ref_row_sum(p, h, w->s, &m) : 0.0;
    for (int64_t j = 0; j < Lk; j++) {
        w->prob[j] = 0.0;
        w->z[j] = 0.0;
        if (w->s[j] == -INFINITY)
            continue;
        w->prob[j] = kind == SDPA__ROW_OK ? exp(w->s[j] - m) / sum : NAN;
        w->z[j] = sdpa__ref_dropout(p, b, h, i, j);
    }

    // forward (F5): O_i = sum_j P~_ij v_j
    for (int64_t d = 0; d < Dv; d++)
        w->o_i[d] = 0.0;
    for (int64_t j = 0; j < Lk; j++) {
        if (w->s[j] == -INFINITY)
            continue; /* hidden keys are never read: NaN in their V stays out */
        const double pt = w->z[j] * w->prob[j];
        for (int64_t d = 0; d < Dv; d++)
            w->o_i[d] += pt * load(&p->v, b, hk, j, d);
    }

    // (B3)'s Delta_i = dO_i . O_i, over the dropped output
    double delta = 0.0;
    for (int64_t d = 0; d < Dv; d++) {
        w->do_i[d] = load(dout, b, h, i, d);
        delta += w->do_i[d] * w->o_i[d];
    }

    for (int64_t j = 0; j < Lk; j++) {
        if (w->s[j] == -INFINITY)
            continue; /* a hidden key neither gives nor gets a gradient */
        double *dv_j = w->dv_hk + j * Dv, *dk_j = w->dk_hk + j * Dk;
        // (B5) dV_j += P~_ij dO_i;  dP~_ij = dO_i . v_j
        const double pt = w->z[j] * w->prob[j];
        double dpt = 0.0;
        for (int64_t d = 0; d < Dv; d++) {
            dv_j[d] += pt * w->do_i[d];
            dpt += w->do_i[d] * load(&p->v, b, hk, j, d);
        }
        // (B4) dP_ij = z_ij dP~_ij
        const double dp = w->z[j] * dpt;
        // (B3) dS_ij = P_ij (dP_ij - Delta_i)
        const double ds = w->prob[j] * (dp - delta);
        // (B2) dX_ij = dS_ij softcap'(x_ij)
        const double dx = ds * w->dsdx[j];
        // (B1) dQ_i += scale dX_ij k_j;  dK_j += scale dX_ij q_i
        for (int64_t d = 0; d < Dk; d++) {
            w->dq_i[d] += p->scale * dx * load(&p->k, b, hk, j, d);
            dk_j[d] += p->scale * dx * w->q_i[d];
        }
    }
    for (int64_t d = 0; d < Dk; d++)
        sdpa__store(dq->data, dq->dtype, sdpa__offset(dq, b, h, i, d), w->dq_i[d]);
}

sdpa_status sdpa__ref_backward(sdpa_ctx *ctx, const sdpa__problem *p, const sdpa_tensor *dout,
                               sdpa_tensor *dq, sdpa_tensor *dk, sdpa_tensor *dv) {
    bwd_scratch w;
    if (!alloc_scratch(ctx, p, &w))
        return sdpa__fail(ctx, SDPA_ERR_NOMEM,
                          "reference backward: no memory for the gradients of %lld keys "
                          "(Dk=%lld, Dv=%lld)",
                          (long long)p->Lk, (long long)p->Dk, (long long)p->Dv);
    for (int64_t b = 0; b < p->B; b++) {
        for (int64_t hk = 0; hk < p->Hkv; hk++) {
            // 1. dK and dV of (b, hk) start at 0: keys no query sees keep it
            for (int64_t n = 0; n < p->Lk * p->Dk; n++)
                w.dk_hk[n] = 0.0;
            for (int64_t n = 0; n < p->Lk * p->Dv; n++)
                w.dv_hk[n] = 0.0;
            // 2. every row of every query head of the group, in order: dq rows written,
            // dK and dV gathered
            for (int64_t h = hk * p->group; h < (hk + 1) * p->group; h++)
                for (int64_t i = 0; i < p->Lq; i++)
                    row_backward(p, dout, dq, b, h, i, &w);
            // 3. dK and dV of (b, hk) rounded and stored, once
            for (int64_t j = 0; j < p->Lk; j++) {
                for (int64_t d = 0; d < p->Dk; d++)
                    sdpa__store(dk->data, dk->dtype, sdpa__offset(dk, b, hk, j, d),
                                w.dk_hk[j * p->Dk + d]);
                for (int64_t d = 0; d < p->Dv; d++)
                    sdpa__store(dv->data, dv->dtype, sdpa__offset(dv, b, hk, j, d),
                                w.dv_hk[j * p->Dv + d]);
            }
        }
    }
    free_scratch(ctx, &w);
    return SDPA_OK;
}
