/*
 * test_threads.c — contexts and threads as a host program uses them: several contexts used
 * from several threads at once (each must give the bytes a lone context gives), many tiny
 * calls on one context (decode-sized work), create/destroy loops, n_threads from 1 to 64, and
 * a context used by two threads at once (the second call is refused with SDPA_ERR_BUSY).
 * Also run under ThreadSanitizer (tests/tsan/run_tsan.sh).
 */
#include "check.h"
#include "testutil.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { B = 1, HQ = 4, HKV = 2, LQ = 37, LK = 71, D = 24, N_HOSTS = 4 };

/* The problem of a seed: random inputs, causal for odd seeds. */
static tu_problem make_problem(uint64_t seed) {
    tu_rng r = {seed};
    tu_problem pb = tu_problem_new((tu_dims){B, HQ, HKV, LQ, LK, D, D}, &r);
    pb.p.causal = (int)(seed % 2);
    pb.p.align = SDPA_ALIGN_BOTTOM_RIGHT;
    return pb;
}

typedef struct host {
    tu_problem pb;
    const void *want; /* the bytes a lone single-thread context gave */
    int n_threads;
    int failures;
} host;

static void *host_main(void *arg) {
    host *h = arg;
    sdpa_ctx *ctx = tu_ctx(h->n_threads, SDPA_ISA_AUTO);
    for (int rep = 0; rep < 20; rep++) {
        memset(h->pb.o.buf, 0, h->pb.o.bytes);
        if (tu_problem_forward(ctx, &h->pb) != SDPA_OK ||
            memcmp(h->pb.o.buf, h->want, h->pb.o.bytes))
            h->failures++;
    }
    sdpa_ctx_destroy(ctx);
    return NULL;
}

/* N_HOSTS threads, each with its own context (2 workers each), each on its own problem. */
static void test_contexts_in_threads(void) {
    host hosts[N_HOSTS];
    void *want[N_HOSTS];
    sdpa_ctx *lone = tu_ctx(1, SDPA_ISA_AUTO);
    for (int n = 0; n < N_HOSTS; n++) {
        hosts[n].pb = make_problem((uint64_t)n + 1);
        CHECK_INT_EQ(tu_problem_forward(lone, &hosts[n].pb), SDPA_OK);
        want[n] = malloc(hosts[n].pb.o.bytes);
        memcpy(want[n], hosts[n].pb.o.buf, hosts[n].pb.o.bytes);
        hosts[n].want = want[n];
        hosts[n].n_threads = 1 + n % 3;
        hosts[n].failures = 0;
    }
    sdpa_ctx_destroy(lone);
    pthread_t tid[N_HOSTS];
    for (int n = 0; n < N_HOSTS; n++)
        CHECK(pthread_create(&tid[n], NULL, host_main, &hosts[n]) == 0);
    for (int n = 0; n < N_HOSTS; n++) {
        pthread_join(tid[n], NULL);
        CHECK_MSG(hosts[n].failures == 0, "host %d: %d of 20 calls differ", n, hosts[n].failures);
        tu_problem_free(&hosts[n].pb);
        free(want[n]);
    }
}

/* A decode loop: one query row against a growing cache, thousands of calls on one context. */
static void test_many_tiny_calls(void) {
    enum { CACHE = 300 };
    tu_rng r = {17};
    tu_problem pb = tu_problem_new((tu_dims){1, 8, 2, 1, CACHE, 32, 32}, &r);
    tu_tensor o1 = tu_alloc(SDPA_F32, 1, 8, 1, 32, TU_BHLD, 0, 0); /* the lone thread's output */
    sdpa_ctx *ctx = tu_ctx(4, SDPA_ISA_AUTO), *one = tu_ctx(1, SDPA_ISA_AUTO);
    int bad = 0;
    for (int step = 1; step <= CACHE; step++)
        for (int rep = 0; rep < 10; rep++) {
            sdpa_tensor kk = pb.k.t, vv = pb.v.t;
            kk.shape[2] = vv.shape[2] = step; /* the cache so far */
            bad += sdpa_forward(ctx, &pb.q.t, &kk, &vv, NULL, &pb.o.t, NULL) != SDPA_OK;
            if (rep == 0) {
                bad += sdpa_forward(one, &pb.q.t, &kk, &vv, NULL, &o1.t, NULL) != SDPA_OK;
                bad += memcmp(pb.o.buf, o1.buf, pb.o.bytes) != 0;
            }
        }
    CHECK_MSG(bad == 0, "%d of %d decode calls failed or differed", bad, CACHE * 10);
    sdpa_ctx_destroy(ctx);
    sdpa_ctx_destroy(one);
    tu_problem_free(&pb);
    tu_free(&o1);
}

/* Contexts of 1..64 threads give the same bytes; creating and destroying them in a loop
 * (with and without a call in between) leaks nothing and never hangs. */
static void test_thread_counts_and_lifetimes(void) {
    tu_problem pb = make_problem(9);
    sdpa_ctx *one = tu_ctx(1, SDPA_ISA_AUTO);
    CHECK_INT_EQ(tu_problem_forward(one, &pb), SDPA_OK);
    sdpa_ctx_destroy(one);
    void *want = malloc(pb.o.bytes);
    memcpy(want, pb.o.buf, pb.o.bytes);
    for (int n = 1; n <= 64; n += n < 8 ? 1 : 8) {
        sdpa_ctx *ctx = tu_ctx(n, SDPA_ISA_AUTO);
        CHECK_INT_EQ(sdpa_ctx_n_threads(ctx), n);
        memset(pb.o.buf, 0, pb.o.bytes);
        CHECK_INT_EQ(tu_problem_forward(ctx, &pb), SDPA_OK);
        CHECK_MSG(memcmp(pb.o.buf, want, pb.o.bytes) == 0, "n_threads=%d differs", n);
        sdpa_ctx_destroy(ctx);
    }
    for (int n = 0; n < 200; n++) {
        sdpa_ctx *ctx = tu_ctx(1 + n % 5, SDPA_ISA_AUTO);
        if (n % 2)
            CHECK_INT_EQ(tu_problem_forward(ctx, &pb), SDPA_OK);
        sdpa_ctx_destroy(ctx);
    }
    free(want);
    tu_problem_free(&pb);
}

/* The allocator of test_busy_context: once armed, the next allocation (the forward's scratch,
 * made inside the call) says so and waits until the main thread opens the gate, so the call
 * holds its context for as long as the test needs. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int armed, inside, open;
} gate;

static void *gate_alloc(size_t size, size_t align, void *user) {
    gate *g = user;
    pthread_mutex_lock(&g->mu);
    if (g->armed) {
        g->armed = 0;
        g->inside = 1;
        pthread_cond_broadcast(&g->cv);
        while (!g->open)
            pthread_cond_wait(&g->cv, &g->mu);
    }
    pthread_mutex_unlock(&g->mu);
    void *ptr = NULL;
    return posix_memalign(&ptr, align < sizeof(void *) ? sizeof(void *) : align, size) == 0 ? ptr
                                                                                            : NULL;
}

static void gate_free(void *ptr, void *user) {
    (void)user;
    free(ptr);
}

typedef struct caller {
    sdpa_ctx *ctx;
    tu_problem *pb;
    sdpa_status st;
} caller;

static void *caller_main(void *arg) {
    caller *c = arg;
    c->st = tu_problem_forward(c->ctx, c->pb);
    return NULL;
}

/* One context, two threads: while one thread's sdpa_forward runs, the other's sdpa_forward
 * and sdpa_weights return SDPA_ERR_BUSY at once, write nothing and leave the last error
 * alone; the running call finishes with the bytes it gives alone, and the context serves the
 * next call. (Before the check, the second call ran the pool beside the first: the two hung
 * for ever once both were inside it.) */
static void test_busy_context(void) {
    gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0};
    sdpa_ctx_params cp = {0};
    cp.n_threads = 2;
    cp.allocator.alloc = gate_alloc;
    cp.allocator.free = gate_free;
    cp.allocator.user = &g;
    sdpa_ctx *ctx = NULL;
    CHECK_INT_EQ(sdpa_ctx_create(&cp, &ctx), SDPA_OK);
    if (ctx == NULL)
        return;
    tu_problem pb = make_problem(3), other = make_problem(4);
    tu_tensor w = tu_alloc(SDPA_F32, B, HQ, LQ, LK, TU_BHLD, 0, 0);
    CHECK_INT_EQ(tu_problem_forward(ctx, &pb), SDPA_OK);
    void *want = malloc(pb.o.bytes);
    memcpy(want, pb.o.buf, pb.o.bytes);
    memset(pb.o.buf, 0, pb.o.bytes);
    /* a failed call leaves a message that the refused calls must not replace */
    CHECK_INT_EQ(sdpa_forward(ctx, NULL, &pb.k.t, &pb.v.t, NULL, &pb.o.t, NULL), SDPA_ERR_NULL);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", sdpa_ctx_last_error(ctx));

    pthread_mutex_lock(&g.mu);
    g.armed = 1;
    pthread_mutex_unlock(&g.mu);
    caller c = {ctx, &pb, SDPA_ERR_INTERNAL};
    pthread_t tid;
    CHECK(pthread_create(&tid, NULL, caller_main, &c) == 0);
    pthread_mutex_lock(&g.mu);
    while (!g.inside)
        pthread_cond_wait(&g.cv, &g.mu);
    pthread_mutex_unlock(&g.mu);

    tu_fill_canary(&other.o);
    tu_fill_canary(&w);
    CHECK_INT_EQ(tu_problem_forward(ctx, &other), SDPA_ERR_BUSY);
    CHECK_INT_EQ(sdpa_weights(ctx, &other.q.t, &other.k.t, &other.p, &w.t), SDPA_ERR_BUSY);
    CHECK(tu_is_canary(&other.o));
    CHECK(tu_is_canary(&w));

    pthread_mutex_lock(&g.mu);
    g.open = 1;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
    pthread_join(tid, NULL);
    CHECK_INT_EQ(c.st, SDPA_OK);
    CHECK(memcmp(pb.o.buf, want, pb.o.bytes) == 0);
    CHECK_STR_CONTAINS(sdpa_ctx_last_error(ctx), msg);
    CHECK(msg[0] != '\0');
    CHECK_INT_EQ(tu_problem_forward(ctx, &other), SDPA_OK);
    CHECK_INT_EQ(sdpa_weights(ctx, &other.q.t, &other.k.t, &other.p, &w.t), SDPA_OK);

    sdpa_ctx_destroy(ctx);
    free(want);
    tu_free(&w);
    tu_problem_free(&pb);
    tu_problem_free(&other);
}

CHECK_MAIN(CASE(test_contexts_in_threads), CASE(test_many_tiny_calls),
           CASE(test_thread_counts_and_lifetimes), CASE(test_busy_context))
