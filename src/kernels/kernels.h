/*
 * kernels.h — the table of implementations the context dispatches to.
 *
 * An implementation (sdpa__impl) computes validated problems (see core/internal.h). Each
 * declares the instruction-set level it needs; dispatch (src/dispatch/dispatch.c) picks, once
 * per context, the best registered implementation whose level the CPU, the OS, the context's
 * max_isa and SDPA_MAX_ISA all allow. The reference (src/ref/) is the first entry and needs
 * nothing, so there is always one. Faster paths register themselves in dispatch.c's list;
 * an implementation that cannot handle some problem returns SDPA_ERR_UNSUPPORTED from its
 * `supports` hook and the next one down the list is tried.
 */
#ifndef SDPA_KERNELS_H
#define SDPA_KERNELS_H

#include "../core/internal.h"

typedef struct sdpa__impl {
    const char *name; /* shown by sdpa_ctx_describe() */
    sdpa_isa isa;     /* level it requires */
    /* Optional: returns nonzero if this implementation handles p. NULL = handles everything. */
    int (*supports)(const sdpa__problem *p);
    /* out: (B, Hq, Lq, Dv); lse: NULL or (B, Hq, Lq, 1) F32. May fail only with NOMEM. */
    sdpa_status (*forward)(sdpa_ctx *ctx, const sdpa__problem *p, sdpa_tensor *out,
                           sdpa_tensor *lse);
    /* w: (B, Hq, Lq, Lk) F32. May fail only with NOMEM. */
    sdpa_status (*weights)(sdpa_ctx *ctx, const sdpa__problem *p, sdpa_tensor *w);
} sdpa__impl;

/* The reference, in src/ref/: double accumulation, the whole contract. */
extern const sdpa__impl sdpa__impl_reference;

/* Chooses the implementation for a context at level `isa` and problem p: the best registered
 * one that supports p. Never NULL. */
const sdpa__impl *sdpa__select(sdpa_isa isa, const sdpa__problem *p);

/* The list in preference order (best last), for sdpa_ctx_describe(). */
const sdpa__impl *const *sdpa__impls(int *count);

#endif /* SDPA_KERNELS_H */
