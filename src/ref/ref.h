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

/* Row i of (batch b, query head h) of sdpa__ref_forward, into out and (when not NULL) lse,
 * with caller-owned scratch: q_i (Dk doubles), s (Lk doubles), o_i (Dv doubles). For fast
 * paths that hand it the rows they cannot compute exactly (flash.c: accumulator overflow). */
void sdpa__ref_forward_row(const sdpa__problem *p, int64_t b, int64_t h, int64_t i, double *q_i,
                           double *s, double *o_i, sdpa_tensor *out, sdpa_tensor *lse);

/* w: (B, Hq, Lq, Lk) F32. */
sdpa_status sdpa__ref_weights(sdpa_ctx *ctx, const sdpa__problem *p, sdpa_tensor *w);

#endif /* SDPA_REF_H */
