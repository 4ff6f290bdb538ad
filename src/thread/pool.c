/*
 * pool.c — the context's thread pool (contract in pool.h).
 *
 * One run is published by bumping a generation counter. Workers spin on that counter for a
 * short, bounded time after each run, so back-to-back runs (a decode step lasts a few
 * microseconds) reach them without a futex wake; after that they sleep on a condition
 * variable, so an idle context costs no CPU. Tasks are claimed from an atomic counter. The
 * caller takes part as worker 0 and then waits for the count of finished tasks, not for the
 * workers: a worker that is descheduled or asleep when a small run starts simply misses it,
 * which is what keeps an oversubscribed pool (16 threads on 2 cores) moving.
 *
 * The job description (fn, arg, n_tasks) is plain memory written by the caller. It is safe to
 * rewrite because a worker only reads it between incrementing `active` and re-reading the
 * generation, and the caller only rewrites it after marking the generation busy (odd) and
 * seeing `active` at zero: the two sides are a Dekker pair on sequentially consistent
 * atomics, so at least one of them sees the other (comments at each step).
 *
 * The library never prints or aborts: pthread failures at creation become a status; at run
 * time the mutex and condition variable calls cannot fail on a correctly used, initialised
 * default mutex, so their results are not checked there.
 */
#include "pool.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* How long an idle thread polls before it sleeps: pause instructions (about 3 to 40 ns each,
 * depending on the CPU) or plain iterations elsewhere. About 2000 pauses is tens of
 * microseconds: long enough to bridge the gap between two attention calls of a decode loop,
 * short enough that spinning threads of an oversubscribed machine soon yield the cores to the
 * threads that have work. */
#define SDPA__POOL_SPIN 2000

/* A cache line, so that the counters every worker writes do not share a line with the job
 * that every worker reads. */
#define SDPA__POOL_LINE 64

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__) && defined(__GNUC__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

typedef struct sdpa__pool_worker {
    pthread_t thread;
    struct sdpa__pool *pool;
    int id; /* in [1, n_threads) */
} sdpa__pool_worker;

struct sdpa__pool {
    /* Written by the caller once per run, read by every worker. gen is even when a job is
     * published and odd while the caller rewrites it; it only ever grows. */
    _Alignas(SDPA__POOL_LINE) _Atomic uint64_t gen;
    void (*fn)(void *arg, int64_t task, int worker);
    void *arg;
    int64_t n_tasks;
    _Atomic int stop;     /* set once, by destroy */
    _Atomic int sleeping; /* workers inside the condition-variable wait */

    /* The claim counter, hammered by every worker: a line of its own. */
    _Alignas(SDPA__POOL_LINE) _Atomic int64_t next;

    /* Written by workers as they finish; read by the waiting caller. */
    _Alignas(SDPA__POOL_LINE) _Atomic int64_t done; /* tasks finished by workers, this run */
    _Atomic int64_t active;                         /* workers inside a job (see file top) */
    _Atomic int caller_waiting;                     /* caller sleeps on `idle` */

    _Alignas(SDPA__POOL_LINE) pthread_mutex_t mutex;
    pthread_cond_t wake; /* workers wait here for a new generation or stop */
    pthread_cond_t idle; /* the caller waits here for `done` or `active` */
    sdpa_allocator allocator;
    int n_threads;
    sdpa__pool_worker workers[]; /* n_threads - 1 */
};

/* Waits until *counter == target: the caller's side of a run (tasks finished, or workers
 * out of the previous job). Spins first, then sleeps on `idle`. Every load is seq_cst: for
 * `active` it must not be ordered before the caller's busy store (Dekker, see run), and
 * for the sleep it pairs with the workers' seq_cst updates followed by a load of
 * caller_waiting: either the worker sees caller_waiting set and signals under the mutex, or
 * the caller's load below sees the worker's update and does not wait. Sequential consistency
 * also includes the acquire that makes the tasks' writes visible. */
static void caller_wait(sdpa__pool *pool, _Atomic int64_t *counter, int64_t target) {
    for (int i = 0; i < SDPA__POOL_SPIN; i++) {
        if (atomic_load(counter) == target)
            return;
        cpu_relax();
    }
    pthread_mutex_lock(&pool->mutex);
    atomic_store(&pool->caller_waiting, 1);
    while (atomic_load(counter) != target)
        pthread_cond_wait(&pool->idle, &pool->mutex);
    /* Relaxed: a worker that still sees 1 only signals a condition nobody waits on. */
    atomic_store_explicit(&pool->caller_waiting, 0, memory_order_relaxed);
    pthread_mutex_unlock(&pool->mutex);
}

/* A worker's side of caller_wait, called after its seq_cst update of done/active. */
static void notify_caller(sdpa__pool *pool) {
    if (atomic_load(&pool->caller_waiting)) {
        pthread_mutex_lock(&pool->mutex);
        pthread_cond_signal(&pool->idle);
        pthread_mutex_unlock(&pool->mutex);
    }
}

static int is_new_job(uint64_t g, uint64_t seen) {
    return g != seen && (g & 1) == 0;
}

/* Waits for a published generation other than `seen`, or for stop. @return the generation
 * seen last (meaningless when stopping). */
static uint64_t wait_for_job(sdpa__pool *pool, uint64_t seen) {
    uint64_t g = 0;
    for (int i = 0; i < SDPA__POOL_SPIN; i++) {
        /* Acquire is enough while polling: the job is re-validated with seq_cst in
         * worker_main before it is read. stop needs no ordering: it carries no data, and
         * the join in destroy orders everything else. */
        g = atomic_load_explicit(&pool->gen, memory_order_acquire);
        if (is_new_job(g, seen) || atomic_load_explicit(&pool->stop, memory_order_relaxed))
            return g;
        cpu_relax();
    }
    pthread_mutex_lock(&pool->mutex);
    /* seq_cst increment, then seq_cst load of gen: pairs with the caller's seq_cst store of
     * gen followed by its load of `sleeping`. Either the caller sees us and wakes us under
     * the mutex (which we hold until pthread_cond_wait releases it), or we see its gen. */
    atomic_fetch_add(&pool->sleeping, 1);
    for (;;) {
        g = atomic_load(&pool->gen);
        if (is_new_job(g, seen) || atomic_load_explicit(&pool->stop, memory_order_relaxed))
            break;
        pthread_cond_wait(&pool->wake, &pool->mutex);
    }
    atomic_fetch_sub_explicit(&pool->sleeping, 1, memory_order_relaxed);
    pthread_mutex_unlock(&pool->mutex);
    return g;
}

static void *worker_main(void *p) {
    const sdpa__pool_worker *self = p;
    sdpa__pool *pool = self->pool;
    const int id = self->id;
    uint64_t seen = 0; /* the generation at creation: nothing published yet */
    for (;;) {
        const uint64_t g = wait_for_job(pool, seen);
        if (atomic_load_explicit(&pool->stop, memory_order_relaxed))
            break;
        /* Announce, then re-check (both seq_cst): if gen still reads g, the caller's busy
         * store comes later in the total order, so its load of `active` sees us and it
         * leaves the job alone until we leave. If gen moved on, we may have missed the
         * job, and reading it now could race with its rewrite: back off and look again. */
        atomic_fetch_add(&pool->active, 1);
        if (atomic_load(&pool->gen) == g) {
            seen = g;
            void (*fn)(void *, int64_t, int) = pool->fn;
            void *arg = pool->arg;
            const int64_t n = pool->n_tasks;
            int64_t ran = 0;
            for (;;) {
                /* Relaxed: the claim only needs atomicity, each index handed out once.
                 * Visibility of the job comes from gen, of the results from done. */
                const int64_t task =
                    atomic_fetch_add_explicit(&pool->next, 1, memory_order_relaxed);
                if (task >= n)
                    break;
                fn(arg, task, id);
                ran++;
            }
            /* seq_cst (a release for the tasks' writes, and ordered before the load of
             * caller_waiting in notify_caller). fn and arg are not touched after this. */
            if (ran > 0)
                atomic_fetch_add(&pool->done, ran);
        }
        atomic_fetch_sub(&pool->active, 1);
        notify_caller(pool);
    }
    return NULL;
}

/* Wakes up to `want` sleeping workers for a job just published with a seq_cst store of gen.
 * A sleeper not woken misses the job, which is harmless: the caller does not wait for it. */
static void wake_workers(sdpa__pool *pool, int64_t want) {
    const int sleeping = atomic_load(&pool->sleeping);
    if (sleeping == 0)
        return;
    pthread_mutex_lock(&pool->mutex);
    if (want >= sleeping) {
        pthread_cond_broadcast(&pool->wake);
    } else {
        for (int64_t i = 0; i < want; i++)
            pthread_cond_signal(&pool->wake);
    }
    pthread_mutex_unlock(&pool->mutex);
}

void sdpa__pool_run(sdpa__pool *pool, int64_t n_tasks,
                    void (*fn)(void *arg, int64_t task, int worker), void *arg) {
    if (n_tasks <= 0)
        return;
    if (n_tasks == 1 || pool->n_threads == 1) {
        for (int64_t task = 0; task < n_tasks; task++)
            fn(arg, task, 0);
        return;
    }
    /* Only the caller stores gen, and consecutive runs are ordered by the caller's contract,
     * so a relaxed load reads the current value. */
    const uint64_t g = atomic_load_explicit(&pool->gen, memory_order_relaxed);

    /* 1. Mark the job busy (odd) and wait until no worker is inside the previous one
     *    (seq_cst store, then seq_cst loads in caller_wait: the Dekker pair of worker_main). */
    atomic_store(&pool->gen, g + 1);
    caller_wait(pool, &pool->active, 0);

    /* 2. Write the job. The counters are reset relaxed: the release of step 3 publishes
     *    them with the job, and no worker of the previous run can still touch them. */
    pool->fn = fn;
    pool->arg = arg;
    pool->n_tasks = n_tasks;
    atomic_store_explicit(&pool->next, 0, memory_order_relaxed);
    atomic_store_explicit(&pool->done, 0, memory_order_relaxed);

    /* 3. Publish (seq_cst: a release for the job, and ordered before the load of `sleeping`
     *    in wake_workers). Wake no more sleepers than there are tasks for. */
    atomic_store(&pool->gen, g + 2);
    const int64_t helpers = pool->n_threads - 1;
    wake_workers(pool, n_tasks - 1 < helpers ? n_tasks - 1 : helpers);

    /* 4. Work as worker 0, then wait for the tasks the workers claimed. */
    int64_t ran = 0;
    for (;;) {
        const int64_t task = atomic_fetch_add_explicit(&pool->next, 1, memory_order_relaxed);
        if (task >= n_tasks)
            break;
        fn(arg, task, 0);
        ran++;
    }
    caller_wait(pool, &pool->done, n_tasks - ran);
}

int sdpa__pool_size(const sdpa__pool *pool) {
    return pool->n_threads;
}

/* Stops and joins workers[0, n_started), then releases everything. */
static void shutdown_pool(sdpa__pool *pool, int n_started) {
    atomic_store(&pool->stop, 1);
    /* Under the mutex: a worker checks stop under it before waiting, so it either sees the
     * flag or is already waiting when the broadcast comes. */
    pthread_mutex_lock(&pool->mutex);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mutex);
    for (int i = 0; i < n_started; i++)
        pthread_join(pool->workers[i].thread, NULL);
    pthread_cond_destroy(&pool->idle);
    pthread_cond_destroy(&pool->wake);
    pthread_mutex_destroy(&pool->mutex);
    const sdpa_allocator a = pool->allocator;
    a.free(pool, a.user);
}

static sdpa_status status_of(int err) {
    return err == ENOMEM ? SDPA_ERR_NOMEM : SDPA_ERR_THREADS;
}

/* Initialises the mutex and condition variables; on failure destroys what was made. */
static int init_sync(sdpa__pool *pool) {
    int err = pthread_mutex_init(&pool->mutex, NULL);
    if (err != 0)
        return err;
    err = pthread_cond_init(&pool->wake, NULL);
    if (err != 0) {
        pthread_mutex_destroy(&pool->mutex);
        return err;
    }
    err = pthread_cond_init(&pool->idle, NULL);
    if (err != 0) {
        pthread_cond_destroy(&pool->wake);
        pthread_mutex_destroy(&pool->mutex);
    }
    return err;
}

sdpa_status sdpa__pool_create(int n_threads, const sdpa_allocator *allocator, sdpa__pool **out) {
    if (out == NULL)
        return SDPA_ERR_NULL;
    *out = NULL;
    if (allocator == NULL || allocator->alloc == NULL || allocator->free == NULL)
        return SDPA_ERR_NULL;
    if (n_threads < 1 || n_threads > SDPA_MAX_THREADS)
        return SDPA_ERR_THREADS;

    /* n_threads <= SDPA_MAX_THREADS keeps this product far from overflow. */
    const size_t size = sizeof(sdpa__pool) + (size_t)(n_threads - 1) * sizeof(sdpa__pool_worker);
    sdpa__pool *pool = allocator->alloc(size, SDPA__POOL_LINE, allocator->user);
    if (pool == NULL)
        return SDPA_ERR_NOMEM;
    memset(pool, 0, size);
    pool->allocator = *allocator;
    pool->n_threads = n_threads;
    atomic_init(&pool->gen, 0);
    atomic_init(&pool->stop, 0);
    atomic_init(&pool->sleeping, 0);
    atomic_init(&pool->next, 0);
    atomic_init(&pool->done, 0);
    atomic_init(&pool->active, 0);
    atomic_init(&pool->caller_waiting, 0);
    const int err = init_sync(pool);
    if (err != 0) {
        allocator->free(pool, allocator->user);
        return status_of(err);
    }

    /* The workers inherit the creating thread's signal mask. Block the asynchronous
     * signals in them, so that the host's handlers (SIGINT, SIGCHLD, timers…) run on the
     * host's own threads; the synchronous ones stay open so that a fault in a worker is
     * still reported (by a debugger or a sanitizer) rather than turned into a silent kill. */
    sigset_t all, old;
    sigfillset(&all);
    sigdelset(&all, SIGSEGV);
    sigdelset(&all, SIGBUS);
    sigdelset(&all, SIGFPE);
    sigdelset(&all, SIGILL);
    sigdelset(&all, SIGABRT);
#ifdef SIGTRAP
    sigdelset(&all, SIGTRAP);
#endif
#ifdef SIGSYS
    sigdelset(&all, SIGSYS);
#endif
    const int masked = pthread_sigmask(SIG_SETMASK, &all, &old) == 0;

    int started = 0;
    int create_err = 0;
    for (; started < n_threads - 1; started++) {
        sdpa__pool_worker *w = &pool->workers[started];
        w->pool = pool;
        w->id = started + 1;
        create_err = pthread_create(&w->thread, NULL, worker_main, w);
        if (create_err != 0)
            break;
    }
    if (masked)
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (create_err != 0) {
        shutdown_pool(pool, started);
        /* EAGAIN (the usual failure: a limit on threads or memory) is a thread problem. */
        return SDPA_ERR_THREADS;
    }
    *out = pool;
    return SDPA_OK;
}

void sdpa__pool_destroy(sdpa__pool *pool) {
    if (pool == NULL)
        return;
    shutdown_pool(pool, pool->n_threads - 1);
}
