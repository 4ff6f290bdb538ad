/*
 * pool.h — the context's thread pool: persistent pthreads workers that run the tasks of one
 * parallel loop at a time, for calls as small as a single decode step.
 *
 * Contract: sdpa__pool_run(pool, n, fn, arg) calls fn(arg, task, worker) exactly once for
 * every task in [0, n) and returns when all of them have finished; everything the tasks wrote
 * is then visible to the caller. Which worker runs which task is not specified, so a caller
 * that wants results independent of the thread count must make each task's result depend on
 * the task index alone (the `worker` index is for per-worker scratch memory only). No OpenMP:
 * the pool never touches the host program's threading runtime, and the library's threads
 * block the host's asynchronous signals.
 */
#ifndef SDPA_POOL_H
#define SDPA_POOL_H

#include "sdpa.h"

#include <stdint.h>

typedef struct sdpa__pool sdpa__pool;

/* Creates a pool of n_threads: n_threads - 1 persistent workers, the calling thread of
 * sdpa__pool_run being worker 0. Memory comes from the allocator, whose alloc and free must
 * both be set (the context resolves the defaults).
 * @param n_threads  in [1, SDPA_MAX_THREADS]; the context validates the user's value.
 * @param out        receives the pool; set to NULL on failure.
 * @return SDPA_OK; SDPA_ERR_NULL for a NULL out or allocator hook; SDPA_ERR_THREADS for
 *         n_threads out of range or when a thread cannot be created; SDPA_ERR_NOMEM. On
 *         failure nothing is leaked: workers already started are stopped and joined.
 * Thread safe. */
sdpa_status sdpa__pool_create(int n_threads, const sdpa_allocator *allocator, sdpa__pool **out);

/* Stops and joins the workers, then frees the pool. NULL is a no-op. No run may be in
 * progress. Returns promptly even right after sdpa__pool_create. */
void sdpa__pool_destroy(sdpa__pool *pool);

/* @return the n_threads the pool was created with (the caller counts as one). */
int sdpa__pool_size(const sdpa__pool *pool);

/* Runs fn(arg, task, worker) once for every task in [0, n_tasks) and returns when all have
 * finished. The calling thread takes part as worker 0; `worker` lies in [0, n_threads) and no
 * two tasks run at the same time with the same `worker`, so it may index per-worker scratch.
 * Tasks are claimed one at a time from a shared counter, in increasing order but on any
 * worker. With n_tasks <= 1 or a pool of one thread, the tasks run inline on the caller, in
 * order, and no worker is woken; n_tasks <= 0 does nothing.
 * Not reentrant: one run at a time per pool (fn must not call sdpa__pool_run on the same
 * pool). Consecutive runs may come from different threads if the caller orders them (a
 * context is used by one thread at a time). fn must not fail or unwind; it reports errors
 * through arg. */
void sdpa__pool_run(sdpa__pool *pool, int64_t n_tasks,
                    void (*fn)(void *arg, int64_t task, int worker), void *arg);

#endif /* SDPA_POOL_H */
