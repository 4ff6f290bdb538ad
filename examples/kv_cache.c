/*
 * kv_cache.c — a decode step over a paged KV cache with sdpa_forward_kv, timed against the
 * same bytes of cache read as one contiguous sequence.
 *
 *     build/examples/kv_cache [threads] [page_size] [reps]
 *
 * A batch of 8 sequences of mixed lengths (together 32768 keys: 1024 to 7168 each) holds its
 * keys and values, f16, in a pool of pages handed out in a shuffled order, as a serving engine
 * allocates them; each sequence has one new query row (Hq = 32 query heads over Hkv = 8 kv
 * heads, D = 128, f32 queries and outputs). The step is timed with sdpa_forward_kv, and beside
 * it, interleaved, the same computation on one contiguous sequence of 32768 keys with
 * sdpa_forward (the same bytes of cache read): the paged layout's cost is the ratio of the
 * two medians. It also checks each paged sequence's output against the same sequence laid out
 * contiguously and called alone with sdpa_forward (not bitwise: alone, a sequence of 8 tasks
 * is split into key chunks, and a page smaller than 64 keys cuts the key tiles), to f32
 * accumulation's accuracy. Exit status 0 on success.
 */
#include <sdpa.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { B = 8, HQ = 32, HKV = 8, D = 128, TOTAL = 32768 };
static const int32_t lengths[B] = {7168, 1024, 5120, 3072, 4096, 2048, 6144, 4096};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A value in f16 of modest size, from a counter: the cache's contents do not matter here. */
static uint16_t half_of(uint64_t n) {
    n = n * 0x9E3779B97F4A7C15u;
    return (uint16_t)(0x3000u | ((n >> 40) & 0x0fffu)); /* in [2^-3, 2^-1), either sign */
}

static void fail(const char *what, sdpa_ctx *ctx, sdpa_status st) {
    fprintf(stderr, "kv_cache: %s: %s (%s)\n", what, sdpa_status_name(st),
            sdpa_ctx_last_error(ctx));
    exit(1);
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 0;
    const int64_t page = argc > 2 ? atoll(argv[2]) : 64;
    const int reps = argc > 3 ? atoi(argv[3]) : 50;
    if (threads < 0 || page < 1 || page > TOTAL || reps < 1) {
        fprintf(stderr, "usage: kv_cache [threads >= 0] [page_size 1..%d] [reps >= 1]\n", TOTAL);
        return 2;
    }
    sdpa_ctx_params cp = {0};
    cp.n_threads = threads;
    sdpa_ctx *ctx;
    if (sdpa_ctx_create(&cp, &ctx) != SDPA_OK)
        return 1;

    /* the pool: every sequence's pages, shuffled; the block table points into it */
    int64_t max_pages = 0, n_pages = 0;
    for (int b = 0; b < B; b++) {
        const int64_t np = (lengths[b] + page - 1) / page;
        max_pages = np > max_pages ? np : max_pages;
        n_pages += np;
    }
    int32_t *order = malloc((size_t)n_pages * sizeof *order);
    int32_t *table = malloc((size_t)(B * max_pages) * sizeof *table);
    for (int64_t n = 0; n < n_pages; n++)
        order[n] = (int32_t)n;
    uint64_t seed = 12345;
    for (int64_t n = n_pages - 1; n > 0; n--) {
        seed = seed * 6364136223846793005u + 1442695040888963407u;
        const int64_t m = (int64_t)((seed >> 33) % (uint64_t)(n + 1));
        const int32_t t = order[n];
        order[n] = order[m];
        order[m] = t;
    }
    const size_t page_elems = (size_t)(HKV * page * D);
    uint16_t *kpool = malloc((size_t)n_pages * page_elems * sizeof *kpool);
    uint16_t *vpool = malloc((size_t)n_pages * page_elems * sizeof *vpool);
    /* the contiguous twin: one sequence of TOTAL keys holding the batch's keys in order */
    uint16_t *kflat = malloc((size_t)(HKV * TOTAL * D) * sizeof *kflat);
    uint16_t *vflat = malloc((size_t)(HKV * TOTAL * D) * sizeof *vflat);
    int64_t used = 0, start = 0;
    for (int b = 0; b < B; b++) {
        for (int64_t e = 0; e < max_pages; e++)
            table[b * max_pages + e] = e * page < lengths[b] ? order[used++] : -1;
        for (int64_t hk = 0; hk < HKV; hk++)
            for (int64_t j = 0; j < lengths[b]; j++)
                for (int64_t d = 0; d < D; d++) {
                    const uint64_t id = (((uint64_t)b * HKV + hk) * TOTAL + j) * D + d;
                    const size_t at = (size_t)table[b * max_pages + j / page] * page_elems +
                                      (size_t)((hk * page + j % page) * D + d);
                    const size_t flat = (size_t)((hk * TOTAL + start + j) * D + d);
                    kpool[at] = kflat[flat] = half_of(2 * id);
                    vpool[at] = vflat[flat] = half_of(2 * id + 1);
                }
        start += lengths[b];
    }

    float *q = malloc((size_t)(B * HQ * D) * sizeof *q);
    float *out = malloc((size_t)(B * HQ * D) * sizeof *out);
    float *one = malloc((size_t)(HQ * D) * sizeof *one);
    for (int64_t n = 0; n < B * HQ * D; n++)
        q[n] = (float)((int64_t)(n * 7919 % 2001) - 1000) * 1e-3f;
    const sdpa_tensor tq = sdpa_tensor_bhld(q, SDPA_F32, B, HQ, 1, D);
    sdpa_tensor tout = sdpa_tensor_bhld(out, SDPA_F32, B, HQ, 1, D);
    const sdpa_tensor tk = sdpa_tensor_bhld(kpool, SDPA_F16, n_pages, HKV, page, D);
    const sdpa_tensor tv = sdpa_tensor_bhld(vpool, SDPA_F16, n_pages, HKV, page, D);
    sdpa_kv_cache cache = {&tk, &tv, lengths, NULL, table, max_pages};
    sdpa_params params = {0};
    params.causal = 1;
    params.align = SDPA_ALIGN_BOTTOM_RIGHT;

    /* each sequence alone on its contiguous slice: the same bits as in the paged batch */
    sdpa_status st = sdpa_forward_kv(ctx, &tq, &cache, &params, &tout, NULL);
    if (st != SDPA_OK)
        fail("sdpa_forward_kv", ctx, st);
    start = 0;
    double worst = 0.0, largest = 0.0;
    for (int b = 0; b < B; b++) {
        sdpa_tensor qb = sdpa_tensor_bhld(q + b * HQ * D, SDPA_F32, 1, HQ, 1, D);
        sdpa_tensor kb = sdpa_tensor_bhld(kflat + start * D, SDPA_F16, 1, HKV, lengths[b], D);
        sdpa_tensor vb = sdpa_tensor_bhld(vflat + start * D, SDPA_F16, 1, HKV, lengths[b], D);
        kb.stride[1] = vb.stride[1] = (int64_t)TOTAL * D;
        sdpa_tensor ob = sdpa_tensor_bhld(one, SDPA_F32, 1, HQ, 1, D);
        if ((st = sdpa_forward(ctx, &qb, &kb, &vb, &params, &ob, NULL)) != SDPA_OK)
            fail("sdpa_forward", ctx, st);
        for (int64_t n = 0; n < HQ * D; n++) {
            const double x = fabs((double)one[n] - (double)out[b * HQ * D + n]);
            worst = x > worst || isnan(x) ? x : worst;
            largest = fabs((double)one[n]) > largest ? fabs((double)one[n]) : largest;
        }
        start += lengths[b];
    }

    /* timing, interleaved: the paged batch, then the contiguous sequence of TOTAL keys */
    const sdpa_tensor q1 = sdpa_tensor_bhld(q, SDPA_F32, 1, HQ, 1, D);
    sdpa_tensor o1 = sdpa_tensor_bhld(one, SDPA_F32, 1, HQ, 1, D);
    const sdpa_tensor k1 = sdpa_tensor_bhld(kflat, SDPA_F16, 1, HKV, TOTAL, D);
    const sdpa_tensor v1 = sdpa_tensor_bhld(vflat, SDPA_F16, 1, HKV, TOTAL, D);
    double *t_paged = malloc((size_t)reps * sizeof *t_paged);
    double *t_flat = malloc((size_t)reps * sizeof *t_flat);
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        if ((st = sdpa_forward_kv(ctx, &tq, &cache, &params, &tout, NULL)) != SDPA_OK)
            fail("sdpa_forward_kv", ctx, st);
        t_paged[r] = now() - t0;
        t0 = now();
        if ((st = sdpa_forward(ctx, &q1, &k1, &v1, &params, &o1, NULL)) != SDPA_OK)
            fail("sdpa_forward", ctx, st);
        t_flat[r] = now() - t0;
    }
    qsort(t_paged, (size_t)reps, sizeof *t_paged, cmp_double);
    qsort(t_flat, (size_t)reps, sizeof *t_flat, cmp_double);
    const double bytes = 2.0 * HKV * TOTAL * D * sizeof(uint16_t);
    const double mp = t_paged[reps / 2], mf = t_flat[reps / 2];
    printf("kv_cache: %s, %d threads, Hq=%d Hkv=%d D=%d, f16 cache of %.1f MB, %d reps\n",
           sdpa_ctx_kernel(ctx), sdpa_ctx_n_threads(ctx), HQ, HKV, D, bytes * 1e-6, reps);
    printf("  paged (page %lld, %d sequences of 1024..7168 keys): median %.3f ms, %.1f GB/s\n",
           (long long)page, B, mp * 1e3, bytes / mp * 1e-9);
    printf("  contiguous (one sequence of %d keys):           median %.3f ms, %.1f GB/s\n", TOTAL,
           mf * 1e3, bytes / mf * 1e-9);
    printf("  paged / contiguous: %.3f\n", mp / mf);
    const int differ = !(worst <= 1e-5 * largest);
    printf("  each paged sequence against its contiguous slice alone: max |difference| %.3g "
           "(largest |output| %.3g): %s\n",
           worst, largest, differ ? "TOO FAR" : "ok");
    free(order);
    free(table);
    free(kpool);
    free(vpool);
    free(kflat);
    free(vflat);
    free(q);
    free(out);
    free(one);
    free(t_paged);
    free(t_flat);
    sdpa_ctx_destroy(ctx);
    return differ ? 1 : 0;
}
