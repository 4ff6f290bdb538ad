/*
 * test_threads.c — contexts and threads as a host program uses them: several contexts used
 * from several threads at once (each must give the bytes a lone context gives), many tiny
 * calls on one context (decode-sized work), create/destroy loops, and n_threads from 1 to 64.
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

CHECK_MAIN(CASE(test_contexts_in_threads), CASE(test_many_tiny_calls),
           CASE(test_thread_counts_and_lifetimes))
