/*
 * services.h — what the lower layers (validation, the reference, the drivers) may ask of a
 * context: record an error message, allocate scratch memory through the caller's allocator,
 * and run a parallel loop on the context's threads. The context itself (src/context.h) stays
 * out of their sight; these functions are implemented in src/context.c.
 */
#ifndef SDPA_SERVICES_H
#define SDPA_SERVICES_H

/* The contract's rules for NaN and Inf (masked and NaN rows, the backward's sums) need IEEE
 * arithmetic: -ffinite-math-only, which -ffast-math implies, would fold x != x to false. */
#if defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__
#error "sdpa must be built without -ffinite-math-only (or -ffast-math)"
#endif

#include "sdpa.h"

#include <stddef.h>
#include <stdint.h>

/* Records a message in ctx (printf-style) and returns status, so that a check reads
 * `return sdpa__fail(ctx, SDPA_ERR_SHAPE, "k.shape[3]=%lld but ...", ...)`. */
sdpa_status sdpa__fail(sdpa_ctx *ctx, sdpa_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Scratch memory through the context's allocator. align is a power of two <= 4096.
 * sdpa__alloc returns NULL on failure (and for size 0 it allocates 1 byte). */
void *sdpa__alloc(const sdpa_ctx *ctx, size_t size, size_t align);
void sdpa__free(const sdpa_ctx *ctx, void *ptr);

/* The number of workers sdpa__parallel_for may use: per-worker scratch is sized by it. */
int sdpa__n_workers(const sdpa_ctx *ctx);

/* A context serves one call at a time. sdpa__claim takes it for a call: 0, or 1 if another
 * call holds it (then nothing is touched); sdpa__release gives it back and returns status, so
 * that an entry point ends with `return sdpa__release(ctx, st)`. */
int sdpa__claim(sdpa_ctx *ctx);
sdpa_status sdpa__release(sdpa_ctx *ctx, sdpa_status status);

/* Runs fn(arg, task, worker) once for every task < n_tasks on the context's threads, with
 * worker < sdpa__n_workers(ctx); returns when all are done. Which worker runs which task is
 * unspecified, so results must not depend on it. */
void sdpa__parallel_for(sdpa_ctx *ctx, int64_t n_tasks, void (*fn)(void *, int64_t, int),
                        void *arg);

#endif /* SDPA_SERVICES_H */
