/*
 * flash.h — the tiled drivers ("flash attention" on the CPU), forward and backward, run with
 * the micro-kernels of the implementation that calls them (self->uk).
 */
#ifndef SDPA_FLASH_H
#define SDPA_FLASH_H

#include "../dispatch/impl.h"

/* out: (B, Hq, Lq, Dv); lse: NULL or (B, Hq, Lq, 1) F32. May fail only with NOMEM. */
sdpa_status sdpa__flash_forward(const sdpa__impl *self, sdpa_ctx *ctx, const sdpa__problem *p,
                                sdpa_tensor *out, sdpa_tensor *lse);

/* The gradients (flash_backward.c): from dout (B, Hq, Lq, Dv) and the forward's out
 * (B, Hq, Lq, Dv) and lse (B, Hq, Lq, 1) F32, writes dq (B, Hq, Lq, Dk), dk (B, Hkv, Lk, Dk) and
 * dv (B, Hkv, Lk, Dv), every element once. May fail only with NOMEM, before writing. */
sdpa_status sdpa__flash_backward(const sdpa__impl *self, sdpa_ctx *ctx, const sdpa__problem *p,
                                 const sdpa_tensor *out, const sdpa_tensor *lse,
                                 const sdpa_tensor *dout, sdpa_tensor *dq, sdpa_tensor *dk,
                                 sdpa_tensor *dv);

#endif /* SDPA_FLASH_H */
