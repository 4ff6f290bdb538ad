/*
 * ref.h — the reference implementation: the whole semantic contract of sdpa.h in plain C
 * with double accumulation. It is the oracle every fast path is tested against, and the
 * implementation dispatch falls back on (src/dispatch/dispatch.c registers it).
 */
#ifndef SDPA_REF_H
#define SDPA_REF_H

#include "../core/problem.h"

/* out: (B, Hq, Lq, Dv); lse: NULL or (B, Hq, Lq, 1) F32. */
sdpa_status sdpa__ref_forward(sdpa_ctx *ctx, const sdpa__problem *p, sdpa_tensor *out,
                              sdpa_tensor *lse);

/* w: (B, Hq, Lq, Lk) F32. */
sdpa_status sdpa__ref_weights(sdpa_ctx *ctx, const sdpa__problem *p, sdpa_tensor *w);

#endif /* SDPA_REF_H */
