/*
 * ring.h — what the ring (ring.c) and its collective argument check (check.c) share: the
 * state of one call of sdpa_mpi_forward or sdpa_mpi_backward, its arguments, the summary of
 * arguments that the ranks swap, and the agreements among the ranks.
 *
 * An agreement is one MPI_Allgather of every rank's summary: every rank then returns the
 * first failing rank's status, its message prefixed by the rank, so that a failure on any
 * rank (short of MPI itself) becomes the same status on all of them.
 */
#ifndef SDPA_MPI_RING_H
#define SDPA_MPI_RING_H

#include "layout.h"
#include "sdpa_mpi.h"

#include <stdint.h>

/* The summary of one rank's arguments swapped before the ring starts. */
enum {
    F_STATUS,
    F_LAYOUT,
    F_B,
    F_HQ,
    F_HKV,
    F_DK,
    F_DV,
    F_NQ,
    F_NK,
    F_DT_Q,
    F_DT_K,
    F_DT_V,
    F_DT_OUT,
    F_HAS_LSE,
    F_DT_DOUT,
    F_DT_DQ,
    F_DT_DK,
    F_DT_DV,
    F_SCALE,
    F_CAUSAL,
    F_ALIGN,
    F_USE_WINDOW,
    F_WINDOW_LEFT,
    F_WINDOW_RIGHT,
    F_SOFTCAP,
    F_HAS_ALIBI,
    F_ALIBI_HASH,
    F_COUNT
};

typedef struct summary {
    int64_t f[F_COUNT];
    char msg[256];
} summary;

/* The arguments of either call: the forward's (dout, dq, dk, dv NULL) or the backward's. */
typedef struct args {
    const sdpa_tensor *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv;
    const sdpa_params *params;
    int backward;
    unsigned flags; /* sdpa_mpi_options.flags (0 without options) */
} args;

typedef struct ring {
    sdpa_ctx *ctx;
    MPI_Comm comm; /* a duplicate of the caller's, errors returned */
    int p, r;
    sdpa_mpi_layout layout;
    int64_t B, Hq, Hkv, Dk, Dv;
    sdpa_dtype kdt, vdt;
    int64_t *nq, *nk; /* p local lengths each */
    sdpa__window w;
    sdpa_params lp; /* what a placed call takes from the caller's params */
    sdpa__run qruns[2];
    int n_qruns;
    sdpa_mpi_stats *stats;
    int64_t scratch;
    MPI_Request *reqs;
    int n_reqs, cap_reqs;
} ring;

/* SDPA_ERR_MPI with MPI's message for error code rc of the call named what. */
sdpa_status sdpa__mpi_failed(ring *R, int rc, const char *what);

/* Swaps statuses (and, in *mine, the argument summary) among the ranks. Every rank gets the
 * first failing rank's status, with its message prefixed by the rank; all[] receives every
 * rank's summary. */
sdpa_status sdpa__mpi_agree(ring *R, summary *mine, summary *all);

/* sdpa__mpi_agree on a status alone (its message: the context's last error). */
sdpa_status sdpa__mpi_agree_status(ring *R, sdpa_status st, summary *all);

/* The collective check: every rank's own, then agreement of the summaries, then the lengths
 * against the layout. Fills R's shapes, window, placed parameters and query runs.
 * all: p summaries of scratch. */
sdpa_status sdpa__mpi_check(ring *R, const args *a, summary *all);

#endif /* SDPA_MPI_RING_H */
