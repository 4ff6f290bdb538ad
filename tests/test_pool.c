/*
 * test_pool.c — the thread pool (src/thread/pool.h): every task runs exactly once for any
 * thread count (oversubscribed too: 16 and 64 threads on whatever cores the machine has), on a
 * worker id in range that no other running task holds; many tiny runs back to back; pools
 * used from several threads at once; runs that make the caller and the workers fall asleep;
 * create/destroy loops; allocation failure without leaks; and per-task results that are
 * bitwise the same for any thread count. tests/tsan/run_tsan.sh runs it under
 * ThreadSanitizer, which checks the memory orders the pool relies on.
 */
#include "check.h"
#include "thread/pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The allocator the context would pass: aligned, counting what is outstanding, and able to
 * fail from the n-th call on (fail_at < 0: never). */
typedef struct counting_alloc {
    atomic_long outstanding;
    atomic_long calls;
    long fail_at;
} counting_alloc;

static void *ca_alloc(size_t size, size_t align, void *user) {
    counting_alloc *ca = user;
    const long call = atomic_fetch_add(&ca->calls, 1);
    if (ca->fail_at >= 0 && call >= ca->fail_at)
        return NULL;
    void *p = NULL;
    if (posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, size) != 0)
        return NULL;
    atomic_fetch_add(&ca->outstanding, 1);
    return p;
}

static void ca_free(void *ptr, void *user) {
    counting_alloc *ca = user;
    atomic_fetch_sub(&ca->outstanding, 1);
    free(ptr);
}

static sdpa_allocator make_allocator(counting_alloc *ca, long fail_at) {
    atomic_init(&ca->outstanding, 0);
    atomic_init(&ca->calls, 0);
    ca->fail_at = fail_at;
    sdpa_allocator a = {ca_alloc, ca_free, ca};
    return a;
}

static sdpa__pool *new_pool(int n_threads, const sdpa_allocator *a) {
    sdpa__pool *pool = NULL;
    const sdpa_status st = sdpa__pool_create(n_threads, a, &pool);
    CHECK_MSG(st == SDPA_OK && pool != NULL, "create(%d): %s", n_threads, sdpa_status_name(st));
    return pool;
}

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* ---- counting tasks ---------------------------------------------------------------------- */

/* What a counting run records. Checked by the thread that owns it (check.h is not thread
 * safe), so workers only write atomics. */
typedef struct count_job {
    atomic_int *count;   /* [n_tasks]: times each task ran */
    atomic_int *holding; /* [n_threads]: 1 while a task runs with that worker id */
    int n_threads;
    atomic_int bad_worker; /* ids out of range */
    atomic_int overlap;    /* two tasks running at once with the same id */
    atomic_long on_worker; /* tasks run by a worker other than the caller */
    long task_sleep_us;    /* > 0: every task sleeps (makes the caller wait for workers) */
} count_job;

static void count_task(void *arg, int64_t task, int worker) {
    count_job *job = arg;
    if (worker < 0 || worker >= job->n_threads) {
        atomic_fetch_add(&job->bad_worker, 1);
        return;
    }
    if (atomic_exchange(&job->holding[worker], 1) != 0)
        atomic_fetch_add(&job->overlap, 1);
    atomic_fetch_add_explicit(&job->count[task], 1, memory_order_relaxed);
    if (worker != 0)
        atomic_fetch_add_explicit(&job->on_worker, 1, memory_order_relaxed);
    if (job->task_sleep_us > 0)
        sleep_us(job->task_sleep_us);
    atomic_store(&job->holding[worker], 0);
}

static void count_job_init(count_job *job, int n_threads, int64_t max_tasks) {
    memset(job, 0, sizeof *job);
    job->count = calloc((size_t)(max_tasks > 0 ? max_tasks : 1), sizeof *job->count);
    job->holding = calloc((size_t)n_threads, sizeof *job->holding);
    job->n_threads = n_threads;
    atomic_init(&job->bad_worker, 0);
    atomic_init(&job->overlap, 0);
    atomic_init(&job->on_worker, 0);
}

static void count_job_free(count_job *job) {
    free(job->count);
    free(job->holding);
}

/* Runs n_tasks counting tasks; @return the number of tasks that did not run exactly once,
 * plus any worker-id faults. The count array is reset for the next run. */
static int64_t count_run(sdpa__pool *pool, count_job *job, int64_t n_tasks) {
    sdpa__pool_run(pool, n_tasks, count_task, job);
    int64_t wrong = 0;
    for (int64_t t = 0; t < n_tasks; t++) {
        if (atomic_load_explicit(&job->count[t], memory_order_relaxed) != 1)
            wrong++;
        atomic_store_explicit(&job->count[t], 0, memory_order_relaxed);
    }
    wrong += atomic_exchange(&job->bad_worker, 0) + atomic_exchange(&job->overlap, 0);
    return wrong;
}

static void test_every_task_once(void) {
    static const int64_t sizes[] = {0, 1, 2, 7, 1000, 100000};
    const int n_sizes = (int)(sizeof sizes / sizeof sizes[0]);
    counting_alloc ca;
    const sdpa_allocator a = make_allocator(&ca, -1);
    for (int n_threads = 1; n_threads <= 64; n_threads = n_threads < 16 ? n_threads + 1 : 64) {
        sdpa__pool *pool = new_pool(n_threads, &a);
        if (pool == NULL)
            continue;
        CHECK_INT_EQ(sdpa__pool_size(pool), n_threads);
        count_job job;
        count_job_init(&job, n_threads, 100000);
        for (int s = 0; s < n_sizes; s++) {
            const int64_t wrong = count_run(pool, &job, sizes[s]);
            CHECK_MSG(wrong == 0, "n_threads=%d n_tasks=%lld: %lld tasks or ids wrong", n_threads,
                      (long long)sizes[s], (long long)wrong);
        }
        count_job_free(&job);
        sdpa__pool_destroy(pool);
        if (n_threads == 64)
            break;
    }
    CHECK_INT_EQ(atomic_load(&ca.outstanding), 0);
}

/* Inline cases run in order on the caller, as worker 0. */
static void record_order(void *arg, int64_t task, int worker) {
    int64_t *log = arg;
    log[log[0] + 1] = task * 1000 + worker;
    log[0]++;
}

static void test_inline_runs(void) {
    counting_alloc ca;
    const sdpa_allocator a = make_allocator(&ca, -1);
    sdpa__pool *one = new_pool(1, &a), *four = new_pool(4, &a);
    if (one == NULL || four == NULL) {
        sdpa__pool_destroy(one);
        sdpa__pool_destroy(four);
        return;
    }
    int64_t log[8] = {0};
    sdpa__pool_run(one, 5, record_order, log);
    CHECK_INT_EQ(log[0], 5);
    for (int i = 0; i < 5; i++)
        CHECK_INT_EQ(log[i + 1], i * 1000);
    memset(log, 0, sizeof log);
    sdpa__pool_run(four, 1, record_order, log);
    CHECK_INT_EQ(log[0], 1);
    CHECK_INT_EQ(log[1], 0);
    sdpa__pool_run(four, 0, record_order, log);
    sdpa__pool_run(four, -3, record_order, log);
    CHECK_INT_EQ(log[0], 1);
    sdpa__pool_destroy(one);
    sdpa__pool_destroy(four);
    sdpa__pool_destroy(NULL);
    CHECK_INT_EQ(atomic_load(&ca.outstanding), 0);
}

/* ---- many tiny runs ---------------------------------------------------------------------- */

static void tiny_runs(int n_threads, int n_runs) {
    counting_alloc ca;
    const sdpa_allocator a = make_allocator(&ca, -1);
    sdpa__pool *pool = new_pool(n_threads, &a);
    if (pool == NULL)
        return;
    count_job job;
    count_job_init(&job, n_threads, 4);
    int64_t wrong = 0;
    for (int r = 0; r < n_runs; r++)
        wrong += count_run(pool, &job, 1 + r % 4);
    CHECK_MSG(wrong == 0, "n_threads=%d: %lld tasks or ids wrong over %d runs", n_threads,
              (long long)wrong, n_runs);
    count_job_free(&job);
    sdpa__pool_destroy(pool);
    CHECK_INT_EQ(atomic_load(&ca.outstanding), 0);
}

static void test_tiny_runs_back_to_back(void) {
    tiny_runs(4, 100000);
}

/* Oversubscribed: far more threads than cores, each run smaller than the pool. */
static void test_tiny_runs_oversubscribed(void) {
    tiny_runs(16, 20000);
}

/* ---- sleeping and waking ----------------------------------------------------------------- */

/* Pauses between runs longer than any spin make every worker sleep before the next run;
 * tasks that sleep make the caller sleep while it waits for the workers' tasks. */
static void test_sleep_and_wake(void) {
    counting_alloc ca;
    const sdpa_allocator a = make_allocator(&ca, -1);
    sdpa__pool *pool = new_pool(8, &a);
    if (pool == NULL)
        return;
    count_job job;
    count_job_init(&job, 8, 64);
    int64_t wrong = 0;
    for (int r = 0; r < 30; r++) {
        sleep_us(2000);
        wrong += count_run(pool, &job, 1 + r % 20);
    }
    /* While the caller sleeps in its first task, the woken workers must take the others. */
    job.task_sleep_us = 500;
    atomic_store(&job.on_worker, 0);
    for (int r = 0; r < 10; r++)
        wrong += count_run(pool, &job, 2 + r * 3);
    CHECK_INT_EQ(wrong, 0);
    CHECK(atomic_load(&job.on_worker) > 0);
    count_job_free(&job);
    sdpa__pool_destroy(pool);
}

/* ---- several pools from several threads --------------------------------------------------- */

typedef struct host_thread {
    int index;
    int64_t wrong;
    sdpa_status status;
} host_thread;

static void *host_main(void *p) {
    host_thread *h = p;
    counting_alloc ca;
    const sdpa_allocator a = make_allocator(&ca, -1);
    const int n_threads = 2 + h->index;
    sdpa__pool *pool = NULL;
    h->status = sdpa__pool_create(n_threads, &a, &pool);
    if (h->status != SDPA_OK)
        return NULL;
    count_job job;
    count_job_init(&job, n_threads, 500);
    for (int r = 0; r < 3000; r++)
        h->wrong += count_run(pool, &job, (r * 37 + h->index) % 500);
    count_job_free(&job);
    sdpa__pool_destroy(pool);
    h->wrong += atomic_load(&ca.outstanding);
    return NULL;
}

static void test_pools_on_several_threads(void) {
    enum { HOSTS = 4 };
    pthread_t threads[HOSTS];
    host_thread hosts[HOSTS];
    int started[HOSTS] = {0};
    for (int i = 0; i < HOSTS; i++) {
        hosts[i].index = i;
        hosts[i].wrong = 0;
        hosts[i].status = SDPA_ERR_INTERNAL;
        started[i] = pthread_create(&threads[i], NULL, host_main, &hosts[i]) == 0;
        CHECK(started[i]);
    }
    for (int i = 0; i < HOSTS; i++) {
        if (!started[i])
            continue;
        pthread_join(threads[i], NULL);
        CHECK_MSG(hosts[i].status == SDPA_OK, "host %d: %s", i, sdpa_status_name(hosts[i].status));
        CHECK_MSG(hosts[i].wrong == 0, "host %d: %lld wrong", i, (long long)hosts[i].wrong);
    }
}

/* One pool, its runs issued by different threads one after the other (ordered by join), as
 * a context handed from thread to thread is. */
typedef struct handoff {
    sdpa__pool *pool;
    count_job *job;
    int64_t wrong;
} handoff;

static void *handoff_main(void *p) {
    handoff *h = p;
    for (int r = 0; r < 200; r++)
        h->wrong += count_run(h->pool, h->job, 1 + r % 50);
    return NULL;
}

static void test_runs_from_successive_threads(void) {
    counting_alloc ca;
    const sdpa_allocator a = make_allocator(&ca, -1);
    sdpa__pool *pool = new_pool(4, &a);
    if (pool == NULL)
        return;
    count_job job;
    count_job_init(&job, 4, 50);
    handoff h = {pool, &job, 0};
    for (int i = 0; i < 5; i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, handoff_main, &h) != 0) {
            CHECK(0);
            break;
        }
        pthread_join(t, NULL);
        h.wrong += count_run(pool, &job, 9);
    }
    CHECK_INT_EQ(h.wrong, 0);
    count_job_free(&job);
    sdpa__pool_destroy(pool);
}

/* ---- lifetime ----------------------------------------------------------------------------- */

static void test_create_destroy_loop(void) {
    counting_alloc ca;
    const sdpa_allocator a = make_allocator(&ca, -1);
    count_job job;
    count_job_init(&job, 8, 16);
    int64_t wrong = 0;
    for (int i = 0; i < 1000; i++) {
        const int n_threads = 1 + i % 8;
        job.n_threads = n_threads;
        sdpa__pool *pool = NULL;
        const sdpa_status st = sdpa__pool_create(n_threads, &a, &pool);
        if (st != SDPA_OK) {
            CHECK_MSG(0, "iteration %d: %s", i, sdpa_status_name(st));
            break;
        }
        /* Every other pool is destroyed at once, before its workers have even started. */
        if (i % 2 == 1)
            wrong += count_run(pool, &job, 1 + i % 16);
        sdpa__pool_destroy(pool);
    }
    CHECK_INT_EQ(wrong, 0);
    CHECK_INT_EQ(atomic_load(&ca.outstanding), 0);
    count_job_free(&job);
}

static void test_bad_arguments(void) {
    counting_alloc ca;
    const sdpa_allocator a = make_allocator(&ca, -1);
    sdpa__pool *pool = (sdpa__pool *)&ca; /* must be overwritten with NULL */
    CHECK_INT_EQ(sdpa__pool_create(0, &a, &pool), SDPA_ERR_THREADS);
    CHECK(pool == NULL);
    CHECK_INT_EQ(sdpa__pool_create(SDPA_MAX_THREADS + 1, &a, &pool), SDPA_ERR_THREADS);
    CHECK_INT_EQ(sdpa__pool_create(2, NULL, &pool), SDPA_ERR_NULL);
    const sdpa_allocator half = {ca_alloc, NULL, &ca};
    CHECK_INT_EQ(sdpa__pool_create(2, &half, &pool), SDPA_ERR_NULL);
    CHECK_INT_EQ(sdpa__pool_create(2, &a, NULL), SDPA_ERR_NULL);
    CHECK_INT_EQ(atomic_load(&ca.calls), 0);
}

/* Every allocation of a successful create, made to fail in turn. */
static void test_nomem_without_leaks(void) {
    counting_alloc ca;
    sdpa_allocator a = make_allocator(&ca, -1);
    sdpa__pool *pool = new_pool(6, &a);
    sdpa__pool_destroy(pool);
    const long n_allocs = atomic_load(&ca.calls);
    CHECK(n_allocs >= 1);
    for (long k = 0; k < n_allocs; k++) {
        a = make_allocator(&ca, k);
        pool = (sdpa__pool *)&ca;
        CHECK_INT_EQ(sdpa__pool_create(6, &a, &pool), SDPA_ERR_NOMEM);
        CHECK(pool == NULL);
        CHECK_INT_EQ(atomic_load(&ca.outstanding), 0);
    }
}

/* ---- determinism -------------------------------------------------------------------------- */

enum { SCRATCH = 64 };

/* Each task fills its worker's scratch with a recurrence seeded by the task index alone and
 * reduces it: the result must not depend on which worker, or how many, computed it. */
typedef struct det_job {
    float *scratch; /* [n_threads][SCRATCH] */
    float *out;     /* [n_tasks] */
} det_job;

static void det_task(void *arg, int64_t task, int worker) {
    det_job *job = arg;
    float *s = job->scratch + (size_t)worker * SCRATCH;
    uint64_t x = 0x9E3779B97F4A7C15u * (uint64_t)(task + 1);
    for (int i = 0; i < SCRATCH; i++) {
        x ^= x >> 29;
        x *= 0xBF58476D1CE4E5B9u;
        s[i] = (float)(x >> 40) / 16777216.0f - 0.5f;
    }
    float acc = 0.0f;
    for (int i = 0; i < SCRATCH; i++)
        acc = acc * 0.75f + s[i] * s[(i * 7) % SCRATCH];
    job->out[task] = acc;
}

static void test_same_results_any_thread_count(void) {
    enum { TASKS = 3001 };
    static const int counts[] = {1, 2, 3, 4, 7, 16, 64};
    counting_alloc ca;
    const sdpa_allocator a = make_allocator(&ca, -1);
    float *first = calloc(TASKS, sizeof *first);
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        sdpa__pool *pool = new_pool(counts[c], &a);
        if (pool == NULL)
            continue;
        det_job job = {calloc((size_t)counts[c] * SCRATCH, sizeof(float)),
                       calloc(TASKS, sizeof(float))};
        for (int rep = 0; rep < 3; rep++) {
            sdpa__pool_run(pool, TASKS, det_task, &job);
            if (c == 0 && rep == 0)
                memcpy(first, job.out, TASKS * sizeof *first);
            CHECK_MSG(memcmp(first, job.out, TASKS * sizeof *first) == 0,
                      "n_threads=%d rep %d differs from 1 thread", counts[c], rep);
        }
        free(job.scratch);
        free(job.out);
        sdpa__pool_destroy(pool);
    }
    free(first);
    CHECK_INT_EQ(atomic_load(&ca.outstanding), 0);
}

CHECK_MAIN(CASE(test_every_task_once), CASE(test_inline_runs), CASE(test_tiny_runs_back_to_back),
           CASE(test_tiny_runs_oversubscribed), CASE(test_sleep_and_wake),
           CASE(test_pools_on_several_threads), CASE(test_runs_from_successive_threads),
           CASE(test_create_destroy_loop), CASE(test_bad_arguments), CASE(test_nomem_without_leaks),
           CASE(test_same_results_any_thread_count))
