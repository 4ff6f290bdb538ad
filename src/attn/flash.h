/*
 * flash.h — the tiled forward driver ("flash attention" on the CPU), run with the
 * micro-kernels of the implementation that calls it (self->uk).
 */
#ifndef SDPA_FLASH_H
#define SDPA_FLASH_H

#include "../dispatch/impl.h"

/* out: (B, Hq, Lq, Dv); lse: NULL or (B, Hq, Lq, 1) F32. May fail only with NOMEM. */
sdpa_status sdpa__flash_forward(const sdpa__impl *self, sdpa_ctx *ctx, const sdpa__problem *p,
                                sdpa_tensor *out, sdpa_tensor *lse);

#endif /* SDPA_FLASH_H */
