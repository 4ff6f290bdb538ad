/*
 * context.h — the context struct, seen only by the two top-level files: context.c (creation,
 * the services of core/services.h, the description) and api.c (the entry points).
 */
#ifndef SDPA_CONTEXT_H
#define SDPA_CONTEXT_H

#include "dispatch/impl.h"
#include "sdpa.h"

#include <stdatomic.h>
#include <stdint.h>

#define SDPA__ERR_LEN 512
#define SDPA__DESCRIBE_LEN 1024

struct sdpa__pool; /* thread/pool.h */

struct sdpa_ctx {
    int n_threads;
    struct sdpa__pool *pool; /* n_threads - 1 workers; the calling thread is the last one */
    uint32_t features;       /* SDPA__CPU_* the CPU and OS provide (tile permission included) */
    sdpa_isa cap;            /* the lower of max_isa and SDPA_MAX_ISA; SDPA_ISA_AUTO = none */
    const sdpa__impl *impl[SDPA__N_OPS]; /* what each operation runs for ordinary problems */
    /* the implementation the last successful call ran (sdpa_ctx_last_kernel), NULL before any:
     * a problem impl[op] does not take (its `supports`) runs one further down the list.
     * Atomic (relaxed) so that a reader in another thread during a call races with nothing:
     * it sees the old name or the new one. */
    _Atomic(const sdpa__impl *) last;
    sdpa_allocator allocator;
    /* 1 while a call (sdpa_forward, sdpa_weights) runs on the context: a second thread's call
     * is refused with SDPA_ERR_BUSY instead of entering the pool beside it */
    atomic_int busy;
    char err[SDPA__ERR_LEN];
    char describe[SDPA__DESCRIBE_LEN];
};

#endif /* SDPA_CONTEXT_H */
