/*
 * placement.h — attention between a block of queries and a block of keys cut out of longer
 * sequences, for libsdpa_mpi (src/mpi/), which computes one such pair per ring step.
 *
 * The public entry points place both blocks at position 0 of their sequences. Here the caller
 * states where they sit instead, in the blocks' own indices: query i may see key j iff
 * i + off - window_left <= j <= i + off + window_right (-1 = open side), and ALiBi's distance is
 * |alibi_step (j - i) - off - alibi_shift|. Any int64 off is allowed; a window may be wider than
 * the blocks. The params must not ask for causal, a window, bottom-right alignment, a mask,
 * dropout or sinks (the placement replaces the first three; the others are refused).
 *
 * These functions do not claim the context: the caller (an MPI entry point) holds it for the
 * whole of its call (services.h). Otherwise they validate, dispatch and fail as sdpa_forward
 * and sdpa_backward do.
 */
#ifndef SDPA_PLACEMENT_H
#define SDPA_PLACEMENT_H

#include "sdpa.h"

#include <stdint.h>

typedef struct sdpa__placement {
    int64_t off;
    int64_t window_left, window_right; /* -1 = open */
    int64_t alibi_step, alibi_shift;   /* 1 and 0 for consecutive positions */
} sdpa__placement;

sdpa_status sdpa__forward_placed(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                                 const sdpa_tensor *v, const sdpa_params *params,
                                 const sdpa__placement *place, sdpa_tensor *out, sdpa_tensor *lse);

sdpa_status sdpa__backward_placed(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                                  const sdpa_tensor *v, const sdpa_tensor *out,
                                  const sdpa_tensor *lse, const sdpa_tensor *dout,
                                  const sdpa_params *params, const sdpa__placement *place,
                                  sdpa_tensor *dq, sdpa_tensor *dk, sdpa_tensor *dv);

#endif /* SDPA_PLACEMENT_H */
