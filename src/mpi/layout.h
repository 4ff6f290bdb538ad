/*
 * layout.h — where each rank's positions sit in the gathered sequence (sdpa_mpi_layout), and
 * which keys of one rank's block the queries of another may see: the arithmetic of the ring,
 * kept apart from MPI so that it can be read and tested alone.
 *
 * A rank's block of a sequence is one or two runs of positions start + i * step (i < n); the
 * run begins at row `at` of the rank's local tensor. A pair of runs (queries, keys) becomes a
 * placed problem (core/placement.h) in the runs' own indices.
 */
#ifndef SDPA_MPI_LAYOUT_H
#define SDPA_MPI_LAYOUT_H

#include "core/placement.h"
#include "sdpa_mpi.h"

#include <stdint.h>

typedef struct sdpa__run {
    int64_t start, step, n, at;
} sdpa__run;

/* The global window rule of the gathered problem: key j is visible to query i iff
 * i + off - left <= j <= i + off + right (-1: open side), in global positions. */
typedef struct sdpa__window {
    int64_t off, left, right;
} sdpa__window;

/* The window rule of params (NULL = defaults) for a gathered sequence of lq queries and lk
 * keys, as the core's validator resolves it (causal folded in, bounds beyond lq + lk open). */
sdpa__window sdpa__mpi_window(const sdpa_params *params, int64_t lq, int64_t lk);

/* The number of positions rank r holds under layout, for a sequence of length len over p
 * ranks; for SDPA_MPI_CONTIGUOUS, where any length will do, -1. */
int64_t sdpa__mpi_expected(sdpa_mpi_layout layout, int p, int r, int64_t len);

/* Rank r's runs under layout (p ranks; lens[p] the ranks' local lengths, which must agree
 * with the layout): runs[0..count) in the order of the local rows, empty runs left out.
 * @return count, 1 or 2 (0 for a rank with no positions). */
int sdpa__mpi_runs(sdpa_mpi_layout layout, int p, int r, const int64_t *lens, sdpa__run runs[2]);

/* Rows [r0, r1) of run: the run of those positions. */
sdpa__run sdpa__mpi_subrun(const sdpa__run *run, int64_t r0, int64_t r1);

/* The placement of queries qr against keys kr (runs of one step) under window w.
 * @return 0 if no query of qr may see a key of kr (nothing to compute), else 1 with *place
 *         filled. */
int sdpa__mpi_place(const sdpa__run *qr, const sdpa__run *kr, const sdpa__window *w,
                    sdpa__placement *place);

#endif /* SDPA_MPI_LAYOUT_H */
