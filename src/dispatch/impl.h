/*
 * impl.h — the table of implementations and the choice among them.
 *
 * An implementation (sdpa__impl) computes validated problems (core/problem.h). Each states
 * the CPU features it needs (a mask of SDPA__CPU_* bits, features.h) and the level a
 * max_isa / SDPA_MAX_ISA cap compares with. The list in dispatch.c runs in increasing order
 * of preference; sdpa__select takes the last entry that offers the operation, whose features
 * the CPU and OS provide, whose level the cap allows, and whose `supports` hook (if any)
 * accepts the problem. The reference (src/ref/) is the first entry and needs nothing, so
 * there is always one.
 */
#ifndef SDPA_IMPL_H
#define SDPA_IMPL_H

#include "../core/problem.h"
#include "../kernels/ukernels.h"

#include <stdint.h>

typedef enum sdpa__op {
    SDPA__OP_FORWARD,
    SDPA__OP_WEIGHTS,
    SDPA__OP_BACKWARD,
    SDPA__N_OPS
} sdpa__op;

typedef struct sdpa__impl sdpa__impl;
struct sdpa__impl {
    const char *name;         /* shown by sdpa_ctx_describe() and sdpa_ctx_kernel() */
    sdpa_isa level;           /* what a max_isa or SDPA_MAX_ISA cap is compared with */
    uint32_t needs;           /* SDPA__CPU_* features it requires */
    const sdpa__ukernels *uk; /* the micro-kernels it drives, or NULL */
    /* Optional: returns nonzero if this implementation handles operation op on p. NULL =
     * handles everything. */
    int (*supports)(sdpa__op op, const sdpa__problem *p);
    const char *takes; /* with supports: the problems it handles, in words (sdpa info) */
    /* out: (B, Hq, Lq, Dv); lse: NULL or (B, Hq, Lq, 1) F32. May fail only with NOMEM. */
    sdpa_status (*forward)(const sdpa__impl *self, sdpa_ctx *ctx, const sdpa__problem *p,
                           sdpa_tensor *out, sdpa_tensor *lse);
    /* w: (B, Hq, Lq, Lk) F32. May fail only with NOMEM. NULL: not offered (the next
     * implementation down the list that offers it is used). */
    sdpa_status (*weights)(const sdpa__impl *self, sdpa_ctx *ctx, const sdpa__problem *p,
                           sdpa_tensor *w);
    /* The gradients: dout (B, Hq, Lq, Dv) with the forward's out (B, Hq, Lq, Dv) and lse
     * (B, Hq, Lq, 1) F32 give dq (B, Hq, Lq, Dk), dk (B, Hkv, Lk, Dk), dv (B, Hkv, Lk, Dv).
     * May fail only with NOMEM, before writing. NULL: not offered. */
    sdpa_status (*backward)(const sdpa__impl *self, sdpa_ctx *ctx, const sdpa__problem *p,
                            const sdpa_tensor *out, const sdpa_tensor *lse, const sdpa_tensor *dout,
                            sdpa_tensor *dq, sdpa_tensor *dk, sdpa_tensor *dv);
    /* Optional: a matrix unit's entries, which the tiled forward takes where they fit the
     * problem (sdpa__flash_mx_fits), with uk for the rest. */
    const sdpa__mx_kernels *mx;
};

/* Whether impl has an entry for op (weights and backward may be NULL). */
int sdpa__impl_offers(const sdpa__impl *impl, sdpa__op op);

/* Whether impl may run on a CPU with `features` under `cap` (SDPA_ISA_AUTO = no cap). */
int sdpa__impl_allowed(const sdpa__impl *impl, uint32_t features, sdpa_isa cap);

/* Chooses the implementation of `op` for p (NULL: an ordinary problem, for reports) on a CPU
 * with `features` under `cap`. Never NULL (the reference offers all). */
const sdpa__impl *sdpa__select(uint32_t features, sdpa_isa cap, sdpa__op op,
                               const sdpa__problem *p);

/* The list in preference order (best last). */
const sdpa__impl *const *sdpa__impls(int *count);

/* The union of the features the registered implementations need (what is worth asking the
 * OS for). */
uint32_t sdpa__impls_needs(void);

#endif /* SDPA_IMPL_H */
