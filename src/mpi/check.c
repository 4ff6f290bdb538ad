/*
 * check.c — the collective argument check of sdpa_mpi_forward and sdpa_mpi_backward, and the
 * agreements among the ranks (ring.h).
 *
 * Each rank runs the core's validation on its local tensors and the ring's own rules (no mask,
 * dropout or sinks; a known layout and known option flags), then the ranks swap a summary of
 * their arguments: shapes, dtypes and parameters must agree, and the local lengths must be
 * those of the layout. Nothing is written and no data moves before this check has passed on
 * every rank.
 */
#include "ring.h"

#include "core/services.h"
#include "core/validate.h"

#include <stdio.h>
#include <string.h>

/* The names used in SDPA_ERR_MISMATCH messages; F_STATUS, F_NQ and F_NK may differ. */
static const char *const field_names[F_COUNT] = {
    "status",      "layout",      "B",           "Hq",           "Hkv",
    "Dk",          "Dv",          "nq",          "nk",           "q.dtype",
    "k.dtype",     "v.dtype",     "out.dtype",   "lse given",    "dout.dtype",
    "dq.dtype",    "dk.dtype",    "dv.dtype",    "scale (bits)", "causal",
    "align",       "use_window",  "window_left", "window_right", "softcap (bits)",
    "alibi given", "alibi (hash)"};

static int64_t float_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (int64_t)u;
}

/* FNV-1a over the Hq slopes: ranks compare ALiBi by value without sending it. */
static int64_t hash_floats(const float *x, int64_t n) {
    uint64_t h = 1469598103934665603u;
    const unsigned char *c = (const unsigned char *)x;
    for (int64_t i = 0; i < n * (int64_t)sizeof(float); i++)
        h = (h ^ c[i]) * 1099511628211u;
    return (int64_t)(h >> 1);
}

sdpa_status sdpa__mpi_failed(ring *R, int rc, const char *what) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "MPI error code %d", rc);
    return sdpa__fail(R->ctx, SDPA_ERR_MPI, "%s failed on rank %d: %s", what, R->r, text);
}

sdpa_status sdpa__mpi_agree(ring *R, summary *mine, summary *all) {
    const int rc =
        MPI_Allgather(mine, (int)sizeof *mine, MPI_BYTE, all, (int)sizeof *mine, MPI_BYTE, R->comm);
    if (rc != MPI_SUCCESS)
        return sdpa__mpi_failed(R, rc, "MPI_Allgather");
    for (int s = 0; s < R->p; s++)
        if (all[s].f[F_STATUS] != SDPA_OK) {
            all[s].msg[sizeof all[s].msg - 1] = '\0';
            return sdpa__fail(R->ctx, (sdpa_status)all[s].f[F_STATUS], "rank %d: %s", s,
                              all[s].msg);
        }
    return SDPA_OK;
}

sdpa_status sdpa__mpi_agree_status(ring *R, sdpa_status st, summary *all) {
    summary mine;
    memset(&mine, 0, sizeof mine);
    mine.f[F_STATUS] = st;
    if (st != SDPA_OK)
        snprintf(mine.msg, sizeof mine.msg, "%s", sdpa_ctx_last_error(R->ctx));
    return sdpa__mpi_agree(R, &mine, all);
}

/* Every sdpa_mpi_flag: other bits of sdpa_mpi_options.flags are refused. */
static const unsigned known_flags = SDPA_MPI_ACCUMULATE_IN_OUTPUT;

/* This rank's own checks: the core's validation of its local tensors, then what the ring
 * does not offer, then the options. Fills the summary. */
static sdpa_status check_local(ring *R, const args *a, summary *mine) {
    sdpa__problem p;
    sdpa_status st;
    memset(mine, 0, sizeof *mine);
    if (a->backward)
        st = sdpa__check_backward(R->ctx, a->q, a->k, a->v, a->out, a->lse, a->dout, a->params,
                                  a->dq, a->dk, a->dv, &p);
    else
        st = sdpa__check_forward(R->ctx, a->q, a->k, a->v, a->params, a->out, a->lse, &p);
    if (st == SDPA_OK && (R->layout < SDPA_MPI_CONTIGUOUS || R->layout > SDPA_MPI_ZIGZAG))
        st = sdpa__fail(R->ctx, SDPA_ERR_PARAM, "layout=%d is not a sdpa_mpi_layout",
                        (int)R->layout);
    if (st == SDPA_OK && (a->flags & ~known_flags) != 0)
        st = sdpa__fail(R->ctx, SDPA_ERR_PARAM,
                        "options.flags=0x%x: bits 0x%x are not sdpa_mpi_flag values", a->flags,
                        a->flags & ~known_flags);
    if (st == SDPA_OK && a->params != NULL) {
        const sdpa_params *pr = a->params;
        if (pr->mask != NULL)
            st = sdpa__fail(R->ctx, SDPA_ERR_UNSUPPORTED,
                            "params.mask: the ring takes no mask tensor (causal, window and "
                            "ALiBi use global positions)");
        else if (pr->dropout_p != 0.0f)
            st = sdpa__fail(R->ctx, SDPA_ERR_UNSUPPORTED,
                            "params.dropout_p=%g: the ring offers no dropout",
                            (double)pr->dropout_p);
        else if (pr->sinks != NULL)
            st = sdpa__fail(R->ctx, SDPA_ERR_UNSUPPORTED,
                            "params.sinks: the ring offers no attention sinks");
    }
    mine->f[F_STATUS] = st;
    if (st != SDPA_OK) {
        snprintf(mine->msg, sizeof mine->msg, "%s", sdpa_ctx_last_error(R->ctx));
        return st;
    }
    const sdpa_params none = {0};
    const sdpa_params *pr = a->params != NULL ? a->params : &none;
    int64_t *f = mine->f;
    f[F_LAYOUT] = R->layout;
    f[F_B] = p.B;
    f[F_HQ] = p.Hq;
    f[F_HKV] = p.Hkv;
    f[F_DK] = p.Dk;
    f[F_DV] = p.Dv;
    f[F_NQ] = p.Lq;
    f[F_NK] = p.Lk;
    f[F_DT_Q] = a->q->dtype;
    f[F_DT_K] = a->k->dtype;
    f[F_DT_V] = a->v->dtype;
    f[F_DT_OUT] = a->out->dtype;
    f[F_HAS_LSE] = a->lse != NULL;
    f[F_DT_DOUT] = a->dout != NULL ? (int64_t)a->dout->dtype : -1;
    f[F_DT_DQ] = a->dq != NULL ? (int64_t)a->dq->dtype : -1;
    f[F_DT_DK] = a->dk != NULL ? (int64_t)a->dk->dtype : -1;
    f[F_DT_DV] = a->dv != NULL ? (int64_t)a->dv->dtype : -1;
    f[F_SCALE] = float_bits(pr->scale);
    f[F_CAUSAL] = pr->causal != 0;
    f[F_ALIGN] = pr->align;
    f[F_USE_WINDOW] = pr->use_window != 0;
    f[F_WINDOW_LEFT] = pr->use_window ? pr->window_left : -1;
    f[F_WINDOW_RIGHT] = pr->use_window ? pr->window_right : -1;
    f[F_SOFTCAP] = float_bits(pr->softcap);
    f[F_HAS_ALIBI] = pr->alibi_slopes != NULL;
    f[F_ALIBI_HASH] = pr->alibi_slopes != NULL ? hash_floats(pr->alibi_slopes, p.Hq) : 0;
    return SDPA_OK;
}

sdpa_status sdpa__mpi_check(ring *R, const args *a, summary *all) {
    summary mine;
    check_local(R, a, &mine);
    sdpa_status st = sdpa__mpi_agree(R, &mine, all);
    if (st != SDPA_OK)
        return st;
    for (int s = 1; s < R->p; s++)
        for (int f = 0; f < F_COUNT; f++)
            if (f != F_NQ && f != F_NK && all[s].f[f] != all[0].f[f])
                return sdpa__fail(R->ctx, SDPA_ERR_MISMATCH,
                                  "rank %d has %s=%lld but rank 0 has %s=%lld", s, field_names[f],
                                  (long long)all[s].f[f], field_names[f], (long long)all[0].f[f]);
    int64_t lq = 0, lk = 0;
    for (int s = 0; s < R->p; s++) {
        R->nq[s] = all[s].f[F_NQ];
        R->nk[s] = all[s].f[F_NK];
        lq += R->nq[s];
        lk += R->nk[s];
    }
    if (lq > SDPA_MAX_EXTENT || lk > SDPA_MAX_EXTENT)
        return sdpa__fail(R->ctx, SDPA_ERR_DIM,
                          "the gathered sequence (Lq=%lld, Lk=%lld) exceeds SDPA_MAX_EXTENT",
                          (long long)lq, (long long)lk);
    for (int s = 0; s < R->p; s++) {
        const int64_t eq = sdpa__mpi_expected(R->layout, R->p, s, lq);
        const int64_t ek = sdpa__mpi_expected(R->layout, R->p, s, lk);
        if (eq >= 0 && R->nq[s] != eq)
            return sdpa__fail(R->ctx, SDPA_ERR_SHAPE,
                              "rank %d holds %lld queries but the %s layout of Lq=%lld over %d "
                              "ranks gives it %lld",
                              s, (long long)R->nq[s], sdpa_mpi_layout_name(R->layout),
                              (long long)lq, R->p, (long long)eq);
        if (ek >= 0 && R->nk[s] != ek)
            return sdpa__fail(R->ctx, SDPA_ERR_SHAPE,
                              "rank %d holds %lld keys but the %s layout of Lk=%lld over %d "
                              "ranks gives it %lld",
                              s, (long long)R->nk[s], sdpa_mpi_layout_name(R->layout),
                              (long long)lk, R->p, (long long)ek);
    }
    const int64_t *f = all[0].f;
    R->B = f[F_B];
    R->Hq = f[F_HQ];
    R->Hkv = f[F_HKV];
    R->Dk = f[F_DK];
    R->Dv = f[F_DV];
    R->kdt = a->k->dtype;
    R->vdt = a->v->dtype;
    R->w = sdpa__mpi_window(a->params, lq, lk);
    memset(&R->lp, 0, sizeof R->lp);
    if (a->params != NULL) {
        R->lp.scale = a->params->scale;
        R->lp.softcap = a->params->softcap;
        R->lp.alibi_slopes = a->params->alibi_slopes;
    }
    R->n_qruns = sdpa__mpi_runs(R->layout, R->p, R->r, R->nq, R->qruns);
    return SDPA_OK;
}
