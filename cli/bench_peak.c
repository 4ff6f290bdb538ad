/*
 * bench_peak.c — the machine probe of `sdpa bench`: this CPU's FP32 FMA peak and its read
 * bandwidth, measured with every thread running at once, so that the attention figures can be
 * read as a fraction of what this machine, under today's load, can do at all.
 *
 * The inner loops live in bench_peak_avx512.c and bench_peak_avx2.c (compiled with their own
 * ISA flags, x86 only: SDPA_HAVE_X86) and here (plain C, always built). Where the library's
 * kernels run at the AMX level and the run times a shape its table takes, the probe also
 * times the tile unit (bench_peak_amx.c, built with the real AMX table: SDPA_HAVE_AMX_PROBE),
 * whose rate the FMA peak does not show. This file does not probe the CPU: the caller names a
 * level at or below the one the library's kernels run at (sdpa_ctx_isa), and the library has
 * checked that the CPU and the OS support it. The result
 * of a probe is the best of several trials: on a shared machine another process can only make
 * a trial slower, never faster, so the best trial is the closest to the peak.
 *
 * The read loop also measures the bandwidth at a given working-set size (bench_read_measure):
 * `sdpa bench` runs it over each shape's own K and V, whose bytes may partly live in a cache,
 * so that the rate of reading them is compared with what reading that many bytes can reach.
 */
#include "bench.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { TRIALS = 10 };
static const double FMA_TRIAL_S = 0.05;      /* seconds one FMA trial aims for */
static const double READ_TRIAL_S = 0.03;     /* seconds one read trial aims for */
static const double READ_WS_TRIAL_S = 0.02;  /* the same at a working-set size */
static const size_t READ_BYTES = 256u << 20; /* 8x a large L3: the reads come from DRAM */
enum { READ_GRAIN = 64 * sizeof(float) };    /* the read loops take multiples of 256 bytes */

sdpa_isa bench_peak_loop(sdpa_isa level) {
    return level >= SDPA_ISA_AVX512 ? SDPA_ISA_AVX512
           : level == SDPA_ISA_AVX2 ? SDPA_ISA_AVX2
                                    : SDPA_ISA_GENERIC;
}

/* The portable FMA loop: 8 chains of multiply-then-add (ISO C does not contract them into
 * FMAs), counted as 2 FLOP each. A floor for machines without a vector variant. */
float bench_fma_generic(int64_t iters, int64_t *flops_per_iter) {
    const float m = 1.0f - 0x1p-20f, c = 0x1p-20f;
    float a0 = 0.10f, a1 = 0.20f, a2 = 0.30f, a3 = 0.40f;
    float a4 = 0.50f, a5 = 0.60f, a6 = 0.70f, a7 = 0.80f;
    for (int64_t i = 0; i < iters; i++) {
        a0 = a0 * m + c;
        a1 = a1 * m + c;
        a2 = a2 * m + c;
        a3 = a3 * m + c;
        a4 = a4 * m + c;
        a5 = a5 * m + c;
        a6 = a6 * m + c;
        a7 = a7 * m + c;
    }
    *flops_per_iter = 8 * 2;
    return ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7));
}

/* Reads through memcpy: the buffer may hold f16 or bf16 data (a shape's K and V), which a
 * float lvalue must not read; compilers make the copy a plain load. */
float bench_read_generic(const float *p, size_t n) {
    float s[8] = {0};
    for (size_t i = 0; i < n; i += 8)
        for (int j = 0; j < 8; j++) {
            float x;
            memcpy(&x, p + i + (size_t)j, sizeof x);
            s[j] += x;
        }
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

double bench_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The inner loops of one level. Only x86 builds have the vector variants; elsewhere the
 * library runs at the generic level, and so does the probe. */
typedef struct loops {
    float (*fma)(int64_t iters, int64_t *flops_per_iter);
    float (*read)(const float *p, size_t n);
} loops;

static loops loops_for(sdpa_isa isa) {
    loops l = {bench_fma_generic, bench_read_generic};
#if defined(SDPA_HAVE_X86)
    if (isa == SDPA_ISA_AVX512)
        l = (loops){bench_fma_avx512, bench_read_avx512};
    else if (isa == SDPA_ISA_AVX2)
        l = (loops){bench_fma_avx2, bench_read_avx2};
#else
    (void)isa;
#endif
    return l;
}

/* A start gate: the workers wait until every one of them exists, then start together. If a
 * thread cannot be created, the ones already waiting are told to leave instead. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int state; /* 0 wait, 1 go, 2 abort */
} gate;

typedef struct worker {
    gate *g;
    loops run;
    int read;      /* 0: the FMA loop; 1: the read loop */
    int64_t count; /* FMA iterations, or passes over the slice */
    const float *p;
    size_t n;
    double t0, t1;
    int64_t flops_per_iter;
    float result;
} worker;

static void *worker_main(void *arg) {
    worker *w = arg;
    pthread_mutex_lock(&w->g->mu);
    while (w->g->state == 0)
        pthread_cond_wait(&w->g->cv, &w->g->mu);
    const int go = w->g->state == 1;
    pthread_mutex_unlock(&w->g->mu);
    if (!go)
        return NULL;
    w->t0 = bench_now_s();
    float r = 0.0f;
    if (!w->read)
        r = w->run.fma(w->count, &w->flops_per_iter);
    else
        for (int64_t pass = 0; pass < w->count; pass++)
            r += w->run.read(w->p, w->n);
    w->t1 = bench_now_s();
    w->result = r;
    return NULL;
}

/* Runs one trial on all workers at once. @return the wall time from the first start to the
 * last finish, or -1 if a thread could not be created. */
static double run_trial(worker *ws, int n, char *err, size_t errcap) {
    gate g;
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cv, NULL);
    g.state = 0;
    pthread_t *tids = malloc((size_t)n * sizeof *tids);
    int created = 0, rc = 0;
    if (tids == NULL)
        rc = ENOMEM;
    for (; rc == 0 && created < n; created++) {
        ws[created].g = &g;
        rc = pthread_create(&tids[created], NULL, worker_main, &ws[created]);
        if (rc != 0)
            break;
    }
    pthread_mutex_lock(&g.mu);
    g.state = rc == 0 ? 1 : 2;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
    for (int i = 0; i < created; i++)
        pthread_join(tids[i], NULL);
    free(tids);
    pthread_cond_destroy(&g.cv);
    pthread_mutex_destroy(&g.mu);
    if (rc != 0) {
        snprintf(err, errcap, "cannot start %d probe threads: %s", n, strerror(rc));
        return -1.0;
    }
    double t0 = ws[0].t0, t1 = ws[0].t1;
    for (int i = 1; i < n; i++) {
        if (ws[i].t0 < t0)
            t0 = ws[i].t0;
        if (ws[i].t1 > t1)
            t1 = ws[i].t1;
    }
    return t1 - t0;
}

/* Doubles the work until a trial takes a measurable time, scales it to `target` seconds,
 * then keeps the fastest of TRIALS trials. @return work units per second summed over the
 * threads (units: FLOP, or bytes), or -1 on error. */
static double best_rate(worker *ws, int n, double unit_per_count, double target, char *err,
                        size_t errcap) {
    int64_t count = ws[0].count;
    double t = 0.0;
    for (;;) {
        for (int i = 0; i < n; i++)
            ws[i].count = count;
        t = run_trial(ws, n, err, errcap);
        if (t < 0.0)
            return -1.0;
        if (t >= 0.2 * target || count > ((int64_t)1 << 50))
            break;
        count *= 2;
    }
    if (t > 0.0 && t < target) {
        const double scaled = (double)count * target / t;
        count = scaled < 1.0 ? 1 : (int64_t)scaled;
    }
    double best = 0.0;
    for (int trial = 0; trial < TRIALS; trial++) {
        for (int i = 0; i < n; i++)
            ws[i].count = count;
        t = run_trial(ws, n, err, errcap);
        if (t < 0.0)
            return -1.0;
        /* flops_per_iter is only known after a loop has run; it is the same for all. */
        const double unit = unit_per_count > 0.0 ? unit_per_count : (double)ws[0].flops_per_iter;
        const double rate = unit * (double)count * n / t;
        if (rate > best)
            best = rate;
    }
    return best;
}

int bench_peak_measure(int n_threads, sdpa_isa isa, int tiles, bench_peak *out, char *err,
                       size_t errcap) {
    const int n = n_threads < 1 ? 1 : n_threads;
    out->isa = bench_peak_loop(isa);
    out->n_threads = n;
    out->gflops = 0.0;
    out->read_gbs = 0.0;
    out->tile_gflops = NAN;
    worker *ws = calloc((size_t)n, sizeof *ws);
    if (ws == NULL) {
        snprintf(err, errcap, "out of memory (%zu bytes for %d workers)", (size_t)n * sizeof *ws,
                 n);
        return -1;
    }

    /* 1. FMA: every thread runs the same number of iterations of independent chains. */
    for (int i = 0; i < n; i++) {
        ws[i].run = loops_for(out->isa);
        ws[i].count = (int64_t)1 << 12;
    }
    const double flops = best_rate(ws, n, 0.0, FMA_TRIAL_S, err, errcap);
    if (flops < 0.0) {
        free(ws);
        return -1;
    }
    out->gflops = flops * 1e-9;

    /* 2. Read bandwidth: each thread sums its own slice of one buffer. The buffer is written
     * first so that every page is mapped before the clock starts. */
    const size_t per = (READ_BYTES / sizeof(float) / (size_t)n) / 64 * 64;
    float *buf = NULL;
    if (per == 0 || posix_memalign((void **)&buf, 64, per * (size_t)n * sizeof(float)) != 0) {
        snprintf(err, errcap, "cannot allocate the %zu MiB read buffer", READ_BYTES >> 20);
        free(ws);
        return -1;
    }
    memset(buf, 0, per * (size_t)n * sizeof(float));
    for (int i = 0; i < n; i++) {
        ws[i].read = 1;
        ws[i].p = buf + (size_t)i * per;
        ws[i].n = per;
        ws[i].count = 1;
    }
    const double bytes = best_rate(ws, n, (double)(per * sizeof(float)), READ_TRIAL_S, err, errcap);
    free(buf);
    if (bytes < 0.0) {
        free(ws);
        return -1;
    }
    out->read_gbs = bytes * 1e-9;

    /* 3. The AMX unit, where the run times its work: every thread runs the tile loop at
     * once, so the rate is n times the slowest thread's. */
#if defined(SDPA_HAVE_AMX_PROBE)
    if (tiles) {
        for (int i = 0; i < n; i++) {
            ws[i].run = (loops){bench_tdp_amx, NULL};
            ws[i].read = 0;
            ws[i].p = NULL;
            ws[i].n = 0;
            ws[i].count = (int64_t)1 << 8;
        }
        const double tile = best_rate(ws, n, 0.0, FMA_TRIAL_S, err, errcap);
        if (tile < 0.0) {
            free(ws);
            return -1;
        }
        out->tile_gflops = tile * 1e-9;
    }
#else
    (void)tiles;
#endif
    free(ws);
    return 0;
}

int bench_read_measure(int n_threads, sdpa_isa isa, const void *buf, size_t bytes, double *gbs,
                       size_t *bytes_read, char *err, size_t errcap) {
    const int n = n_threads < 1 ? 1 : n_threads;
    const size_t slice = bytes / (size_t)n / READ_GRAIN * READ_GRAIN; /* bytes per thread */
    *gbs = 0.0;
    *bytes_read = slice * (size_t)n;
    if (slice == 0) {
        snprintf(err, errcap, "the read probe needs at least %zu bytes for %d threads, got %zu",
                 (size_t)READ_GRAIN * (size_t)n, n, bytes);
        return -1;
    }
    worker *ws = calloc((size_t)n, sizeof *ws);
    if (ws == NULL) {
        snprintf(err, errcap, "out of memory (%zu bytes for %d workers)", (size_t)n * sizeof *ws,
                 n);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        ws[i].run = loops_for(bench_peak_loop(isa));
        ws[i].read = 1;
        ws[i].p = (const float *)((const char *)buf + (size_t)i * slice);
        ws[i].n = slice / sizeof(float);
        ws[i].count = 1;
    }
    const double rate = best_rate(ws, n, (double)slice, READ_WS_TRIAL_S, err, errcap);
    free(ws);
    if (rate < 0.0)
        return -1;
    *gbs = rate * 1e-9;
    return 0;
}
