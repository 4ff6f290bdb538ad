/*
 * bench.c — `sdpa bench`: times sdpa_forward through the public API at a list of shapes and
 * reports, per shape, the median time of N repetitions (and min/max), GFLOP/s, the bandwidth
 * of reading K and V, the peak extra memory the library allocated, and the ratio of each rate
 * to this machine's FP32 FMA peak, which the same run measures at its start and at its end,
 * and to the read bandwidth at the shape's own working set, measured right before and after
 * it (bench_peak.c). Q/O and K/V are f32, f16 or bf16 (--dtype, --kv-dtype). A table goes to
 * stdout; --json FILE writes every figure. The help text, the presets and the options are
 * bench_options.c's.
 *
 * Inputs are filled from fixed seeds, so every run times the same numbers. Each shape gets a
 * fresh context whose allocator hooks count bytes, so the extra memory is exact (for what the
 * library allocates through its context) and no shape inherits the scratch of another.
 */
#include "bench.h"
#include "cli.h"
#include "outputs.h"

#include "sdpa.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------- */
/* Shapes                                                                                    */
/* ---------------------------------------------------------------------------------------- */

/* The number of (query, key) pairs the mask lets through, per (batch, head). Query i sees
 * keys 0..i+off (off = 0 top-left, Lk-Lq bottom-right), clipped to 0..Lk-1. */
static int64_t visible_pairs(const bench_shape *s) {
    if (s->mask == BENCH_MASK_NONE)
        return s->lq * s->lk;
    const int64_t off = s->mask == BENCH_MASK_CAUSAL_BR ? s->lk - s->lq : 0;
    int64_t n = 0;
    for (int64_t i = 0; i < s->lq; i++) {
        int64_t last = i + off; /* the last visible key */
        if (last >= s->lk)
            last = s->lk - 1;
        if (last >= 0)
            n += last + 1;
    }
    return n;
}

/* ---------------------------------------------------------------------------------------- */
/* The counting allocator                                                                    */
/* ---------------------------------------------------------------------------------------- */

/* Counts the bytes the library holds. The workers of the library may allocate concurrently,
 * hence the atomics. Each block carries its size and header size just before the pointer. */
typedef struct counter {
    atomic_size_t current, peak;
    atomic_llong allocs;
} counter;

static void *counting_alloc(size_t size, size_t align, void *user) {
    counter *c = user;
    const size_t head = align < 16 ? 16 : align; /* room for two size_t, keeps the alignment */
    if (size > SIZE_MAX - head)
        return NULL;
    void *base = NULL;
    if (posix_memalign(&base, head, head + size) != 0)
        return NULL;
    char *p = (char *)base + head;
    ((size_t *)p)[-1] = size;
    ((size_t *)p)[-2] = head;
    const size_t now = atomic_fetch_add(&c->current, size) + size;
    size_t seen = atomic_load(&c->peak);
    while (now > seen && !atomic_compare_exchange_weak(&c->peak, &seen, now))
        ;
    atomic_fetch_add(&c->allocs, 1);
    return p;
}

static void counting_free(void *ptr, void *user) {
    counter *c = user;
    const size_t size = ((size_t *)ptr)[-1], head = ((size_t *)ptr)[-2];
    atomic_fetch_sub(&c->current, size);
    free((char *)ptr - head);
}

/* ---------------------------------------------------------------------------------------- */
/* Timing one shape                                                                          */
/* ---------------------------------------------------------------------------------------- */

/* f32 to f16, rounded to nearest even (the fills' values: finite, |x| < 1; still right up to
 * the f16 range, and beyond it Inf). The library's converters are internal (src/core), so the
 * command has its own, as npy.c has its decoder. */
static uint16_t f32_to_f16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const float a = fabsf(x);
    if (!(a < 65520.0f))
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x1p-14f) /* subnormal: a multiple of 2^-24, rounded to even by lrintf */
        return (uint16_t)(sign | (uint16_t)lrintf(a * 0x1p24f));
    const uint32_t mant = u & 0x7fffffu, e = ((u >> 23) & 0xffu) - 127u + 15u;
    uint32_t h = (e << 10) | (mant >> 13);
    const uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++; /* a carry out of the mantissa moves to the next exponent, as it should */
    return (uint16_t)(sign | h);
}

/* f32 to bf16, rounded to nearest even (no NaN among the fills' values). */
static uint16_t f32_to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* n elements of dtype at x: uniform in [-1, 1) from splitmix64 (fixed, portable inputs
 * without libc's rand()), drawn in f32 and rounded once to the dtype. */
static void fill(void *x, sdpa_dtype dt, size_t n, uint64_t seed) {
    uint64_t st = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        uint64_t z = (st += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        const float f = (float)((double)(z >> 40) * 0x1p-23 - 1.0);
        if (dt == SDPA_F32)
            ((float *)x)[i] = f;
        else
            ((uint16_t *)x)[i] = dt == SDPA_F16 ? f32_to_f16(f) : f32_to_bf16(f);
    }
}

/* @return a 64-byte aligned block of n elements of size sz, or NULL (also when n * sz
 *         overflows). */
static void *alloc_elems(int64_t n, size_t sz) {
    if (n <= 0 || (uint64_t)n > SIZE_MAX / sz)
        return NULL;
    void *p = NULL;
    return posix_memalign(&p, 64, (size_t)n * sz) == 0 ? p : NULL;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct progress {
    int on; /* stderr is a terminal */
    int index, count;
    char spec[96];
} progress;

static void progress_show(const progress *pg, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static void progress_show(const progress *pg, const char *fmt, ...) {
    if (!pg->on)
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "\r\033[K[%d/%d] %s: ", pg->index + 1, pg->count, pg->spec);
    vfprintf(stderr, fmt, ap);
    fflush(stderr);
    va_end(ap);
}

/* Clears the progress line, so that an error message starts at the left margin. */
static void progress_clear(const progress *pg) {
    if (pg->on)
        fputs("\r\033[K", stderr);
}

/* Products of extents that are checked not to overflow int64 (sizes from the command line). */
static int mul_ok(int64_t *acc, int64_t x) {
    if (*acc > INT64_MAX / x)
        return 0;
    *acc *= x;
    return 1;
}

/* The read bandwidth at the shape's working set: the run's threads reading the buffer of K
 * and V (bench_read_measure). @return CLI_OK, or CLI_RUNTIME (message printed). */
static int measure_ws(const bench_run *ri, sdpa_isa isa, const void *kv, size_t bytes, progress *pg,
                      const char *when, bench_result *r, double *gbs) {
    progress_show(pg, "read bandwidth of its K and V (%.1f MB, %s)", (double)bytes / 1e6, when);
    char err[160];
    if (bench_read_measure(ri->n_threads, isa, kv, bytes, gbs, &r->ws_bytes, err, sizeof err) !=
        0) {
        progress_clear(pg);
        fprintf(stderr, "sdpa bench: %s: %s\n", pg->spec, err);
        return CLI_RUNTIME;
    }
    return CLI_OK;
}

/* Times one shape (its dtypes resolved), with the read probe of its working set right before
 * and right after. @return 0, or 1 (runtime error, reported on stderr). */
static int run_shape(const bench_options *o, const bench_run *ri, sdpa_isa isa,
                     const bench_shape *s, progress *pg, bench_result *r) {
    memset(r, 0, sizeof *r);
    r->s = *s;
    r->visible = visible_pairs(s);
    r->flops = 4.0 * (double)s->b * (double)s->hq * (double)s->d * (double)r->visible;
    if (o->backward)
        r->flops *= 2.5; /* BENCH_BACKWARD_FLOPS: the convention --help states */
    const sdpa_dtype qdt = (sdpa_dtype)s->dtype, kvdt = (sdpa_dtype)s->kv_dtype;
    const size_t qsz = sdpa_dtype_size(qdt), kvsz = sdpa_dtype_size(kvdt);
    r->kv_bytes = 2.0 * (double)s->b * (double)s->hkv * (double)s->lk * (double)s->d * (double)kvsz;

    int64_t nq = s->b, nkv = s->b;
    if (!mul_ok(&nq, s->hq) || !mul_ok(&nq, s->lq) || !mul_ok(&nq, s->d) || !mul_ok(&nkv, s->hkv) ||
        !mul_ok(&nkv, s->lk) || !mul_ok(&nkv, s->d) || nkv > INT64_MAX / 8 ||
        (uint64_t)nkv * 8 > SIZE_MAX / 2 - (size_t)SDPA_MAX_THREADS * 256) {
        progress_clear(pg);
        fprintf(stderr, "sdpa bench: %s: the tensors are too large\n", pg->spec);
        return CLI_RUNTIME;
    }
    /* K and V share one buffer, V at the next 64-byte boundary after K, padded to a whole
     * number of the read probe's slices (256 bytes per thread): the probe reads exactly this
     * buffer, the working set of the shape (with less than 256 bytes per thread of zeros). */
    const size_t kv_one = (size_t)nkv * kvsz, v_off = (kv_one + 63) / 64 * 64;
    const size_t grain = (size_t)ri->n_threads * 256;
    const size_t kv_alloc = (2 * v_off + grain - 1) / grain * grain;
    counter cnt;
    atomic_init(&cnt.current, 0);
    atomic_init(&cnt.peak, 0);
    atomic_init(&cnt.allocs, 0);
    sdpa_ctx_params cp = {0};
    cp.n_threads = o->n_threads;
    cp.allocator.alloc = counting_alloc;
    cp.allocator.free = counting_free;
    cp.allocator.user = &cnt;
    sdpa_ctx *ctx = NULL;
    const sdpa_status st = sdpa_ctx_create(&cp, &ctx);
    if (st != SDPA_OK) {
        progress_clear(pg);
        fprintf(stderr, "sdpa bench: cannot create a context: %s\n", sdpa_status_str(st));
        return CLI_RUNTIME;
    }
    char *kvbuf = alloc_elems((int64_t)kv_alloc, 1);
    void *q = alloc_elems(nq, qsz), *out = alloc_elems(nq, qsz);
    void *k = kvbuf, *v = kvbuf != NULL ? kvbuf + v_off : NULL;
    double *times = malloc((size_t)o->reps * sizeof *times);
    /* the backward's: the forward's lse, dL/dout, and the gradients, each in its input's
     * dtype (lse f32) */
    const int bw = o->backward;
    float *lse = bw ? alloc_elems(nq / s->d, sizeof(float)) : NULL;
    void *dout = bw ? alloc_elems(nq, qsz) : NULL, *dq = bw ? alloc_elems(nq, qsz) : NULL;
    void *dk = bw ? alloc_elems(nkv, kvsz) : NULL, *dv = bw ? alloc_elems(nkv, kvsz) : NULL;
    double *times_f = bw ? malloc((size_t)o->reps * sizeof *times_f) : NULL;
    /* causal-add's mask (1, 1, Lq, Lk), f32 */
    const int add = s->mask == BENCH_MASK_CAUSAL_ADD;
    int64_t nmask = s->lq;
    float *mask = add && mul_ok(&nmask, s->lk) ? alloc_elems(nmask, sizeof(float)) : NULL;
    float *slopes = o->alibi ? malloc((size_t)s->hq * sizeof *slopes) : NULL;
    int rc = CLI_OK;
    if (q == NULL || kvbuf == NULL || out == NULL || times == NULL || (add && mask == NULL) ||
        (o->alibi && slopes == NULL) ||
        (bw && (lse == NULL || dout == NULL || dq == NULL || dk == NULL || dv == NULL ||
                times_f == NULL))) {
        progress_clear(pg);
        fprintf(stderr,
                "sdpa bench: %s: out of memory for the inputs (Q, K, V and the output%s%s: "
                "%.1f MB)\n",
                pg->spec, bw ? ", dO and the gradients" : "", add ? ", the mask" : "",
                ((double)(bw ? 4 : 2) * (double)nq * (double)qsz +
                 (double)(bw ? 4 : 2) * (double)nkv * (double)kvsz +
                 (add ? 4.0 * (double)s->lq * (double)s->lk : 0.0)) /
                    1e6);
        rc = CLI_RUNTIME;
        goto done;
    }
    progress_show(pg, "filling the inputs");
    fill(q, qdt, (size_t)nq, 1);
    fill(k, kvdt, (size_t)nkv, 2);
    fill(v, kvdt, (size_t)nkv, 3);
    memset(kvbuf + kv_one, 0, v_off - kv_one);
    memset(kvbuf + v_off + kv_one, 0, kv_alloc - v_off - kv_one);
    memset(out, 0, (size_t)nq * qsz);
    sdpa_tensor tq = sdpa_tensor_bhld(q, qdt, s->b, s->hq, s->lq, s->d);
    sdpa_tensor tk = sdpa_tensor_bhld(k, kvdt, s->b, s->hkv, s->lk, s->d);
    sdpa_tensor tv = sdpa_tensor_bhld(v, kvdt, s->b, s->hkv, s->lk, s->d);
    sdpa_tensor to = sdpa_tensor_bhld(out, qdt, s->b, s->hq, s->lq, s->d);
    sdpa_tensor tl = sdpa_tensor_bhld(lse, SDPA_F32, s->b, s->hq, s->lq, 1);
    sdpa_tensor tdo = sdpa_tensor_bhld(dout, qdt, s->b, s->hq, s->lq, s->d);
    sdpa_tensor tdq = sdpa_tensor_bhld(dq, qdt, s->b, s->hq, s->lq, s->d);
    sdpa_tensor tdk = sdpa_tensor_bhld(dk, kvdt, s->b, s->hkv, s->lk, s->d);
    sdpa_tensor tdv = sdpa_tensor_bhld(dv, kvdt, s->b, s->hkv, s->lk, s->d);
    if (bw)
        fill(dout, qdt, (size_t)nq, 4);
    sdpa_params p = {0};
    p.causal = s->mask == BENCH_MASK_CAUSAL_TL || s->mask == BENCH_MASK_CAUSAL_BR;
    p.softcap = o->softcap;
    if (o->alibi) {
        cli_alibi_slopes(s->hq, slopes);
        p.alibi_slopes = slopes;
    }
    p.align = s->mask == BENCH_MASK_CAUSAL_BR ? SDPA_ALIGN_BOTTOM_RIGHT : SDPA_ALIGN_TOP_LEFT;
    sdpa_tensor tm;
    if (add) {
        for (int64_t i = 0; i < s->lq; i++)
            for (int64_t j = 0; j < s->lk; j++)
                mask[i * s->lk + j] = j <= i ? 0.0f : -FLT_MAX;
        tm = sdpa_tensor_bhld(mask, SDPA_F32, 1, 1, s->lq, s->lk);
        tm.stride[0] = tm.stride[1] = 0; /* broadcast over the batch and the heads */
        p.mask = &tm;
    }

    if ((rc = measure_ws(ri, isa, kvbuf, kv_alloc, pg, "before", r, &r->ws_gbs_before)) != 0)
        goto done;
    /* What the fresh context holds is not extra memory of the call; the peak restarts here. */
    r->ctx_bytes = atomic_load(&cnt.current);
    atomic_store(&cnt.peak, r->ctx_bytes);
    for (int w = 0; w < o->warmup; w++) {
        progress_show(pg, "warm-up %d/%d", w + 1, o->warmup);
        if (sdpa_forward(ctx, &tq, &tk, &tv, &p, &to, bw ? &tl : NULL) != SDPA_OK ||
            (bw &&
             sdpa_backward(ctx, &tq, &tk, &tv, &to, &tl, &tdo, &p, &tdq, &tdk, &tdv) != SDPA_OK)) {
            progress_clear(pg);
            fprintf(stderr, "sdpa bench: %s: %s\n", pg->spec, sdpa_ctx_last_error(ctx));
            rc = CLI_RUNTIME;
            goto done;
        }
    }
    const long long allocs0 = atomic_load(&cnt.allocs);
    double spent = 0.0;
    int n = 0;
    while (n < o->reps) {
        progress_show(pg, "rep %d (at most %d; %.1f of %.1f s spent)", n + 1, o->reps, spent,
                      o->min_time);
        double t0 = bench_now_s();
        sdpa_status fs = sdpa_forward(ctx, &tq, &tk, &tv, &p, &to, bw ? &tl : NULL);
        double t = bench_now_s() - t0;
        if (bw && fs == SDPA_OK) {
            /* the forward just timed, then the backward of its result */
            times_f[n] = t;
            t0 = bench_now_s();
            fs = sdpa_backward(ctx, &tq, &tk, &tv, &to, &tl, &tdo, &p, &tdq, &tdk, &tdv);
            t = bench_now_s() - t0;
        }
        if (fs != SDPA_OK) {
            progress_clear(pg);
            fprintf(stderr, "sdpa bench: %s: %s\n", pg->spec, sdpa_ctx_last_error(ctx));
            rc = CLI_RUNTIME;
            goto done;
        }
        times[n++] = t;
        spent += t;
        if (spent >= o->min_time)
            break;
    }
    r->reps = n;
    r->warmup = o->warmup;
    r->kernel = sdpa_ctx_last_kernel(ctx);
    r->allocs_per_call = (double)(atomic_load(&cnt.allocs) - allocs0) / n;
    r->extra_bytes = atomic_load(&cnt.peak) - r->ctx_bytes;
    qsort(times, (size_t)n, sizeof *times, cmp_double);
    r->t_min = times[0];
    r->t_max = times[n - 1];
    r->t_med = n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
    if (bw) {
        qsort(times_f, (size_t)n, sizeof *times_f, cmp_double);
        r->t_fwd_med = n % 2 ? times_f[n / 2] : 0.5 * (times_f[n / 2 - 1] + times_f[n / 2]);
    }
    if ((rc = measure_ws(ri, isa, kvbuf, kv_alloc, pg, "after", r, &r->ws_gbs_after)) != 0)
        goto done;
    r->ws_gbs = fmax(r->ws_gbs_before, r->ws_gbs_after);
done:
    free(mask);
    free(slopes);
    free(times);
    free(times_f);
    free(lse);
    free(dout);
    free(dq);
    free(dk);
    free(dv);
    free(q);
    free(kvbuf);
    free(out);
    sdpa_ctx_destroy(ctx);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* The command                                                                               */
/* ---------------------------------------------------------------------------------------- */

static int measure_peak(const bench_run *ri, sdpa_isa isa, const char *when, bench_peak *out,
                        int tty) {
    if (tty) {
        fprintf(stderr, "\r\033[Kmeasuring the FMA peak%s and read bandwidth (%s)",
                ri->tiles ? ", the AMX tile peak" : "", when);
        fflush(stderr);
    }
    char err[160];
    if (bench_peak_measure(ri->n_threads, isa, ri->tiles, out, err, sizeof err) != 0) {
        if (tty)
            fputs("\r\033[K", stderr);
        fprintf(stderr, "sdpa bench: %s\n", err);
        return CLI_RUNTIME;
    }
    return CLI_OK;
}

/* Whether the library's AMX table takes the forward of shape s: the table that runs a problem
 * of its dtypes and D, 16 positions of one head (the table takes or leaves a problem by its
 * dtypes, strides and D alone), on ctx. 0 where the memory for it is lacking. */
static int shape_on_tiles(sdpa_ctx *ctx, const bench_shape *s) {
    const size_t n = (size_t)(16 * s->d);
    char *buf = calloc(4 * n, 4); /* q, k, v and out, at most 4 bytes an element */
    if (buf == NULL)
        return 0;
    sdpa_tensor q = sdpa_tensor_bhld(buf, (sdpa_dtype)s->dtype, 1, 1, 16, s->d);
    sdpa_tensor k = sdpa_tensor_bhld(buf + 4 * n, (sdpa_dtype)s->kv_dtype, 1, 1, 16, s->d);
    sdpa_tensor v = sdpa_tensor_bhld(buf + 8 * n, (sdpa_dtype)s->kv_dtype, 1, 1, 16, s->d);
    sdpa_tensor out = sdpa_tensor_bhld(buf + 12 * n, (sdpa_dtype)s->dtype, 1, 1, 16, s->d);
    const sdpa_params p = {0};
    const int on = sdpa_forward(ctx, &q, &k, &v, &p, &out, NULL) == SDPA_OK &&
                   bench_kernel_on_tiles(sdpa_ctx_last_kernel(ctx));
    free(buf);
    return on;
}

/* A probe context tells the thread count that 0 resolves to, the kernels chosen and their
 * level, which the peak probe's loop follows: by default the same level, and never a higher
 * one, since the library has checked that the CPU and the OS run that level and no other
 * part of the command asks the CPU. @return CLI_OK and fills ri and *peak_isa, or the exit
 * code (message printed). */
static int probe_library(const bench_options *o, const bench_shape *shapes, int n_shapes,
                         bench_run *ri, sdpa_isa *peak_isa) {
    sdpa_ctx_params cp = {0};
    cp.n_threads = o->n_threads;
    sdpa_ctx *probe = NULL;
    const sdpa_status st = sdpa_ctx_create(&cp, &probe);
    if (st != SDPA_OK) {
        fprintf(stderr, "sdpa bench: cannot create a context: %s\n", sdpa_status_str(st));
        return CLI_RUNTIME;
    }
    const sdpa_isa level = sdpa_ctx_isa(probe);
    ri->n_threads = sdpa_ctx_n_threads(probe);
    ri->isa = sdpa_isa_name(level);
    ri->cpu_isa = sdpa_isa_name(sdpa_ctx_cpu_isa(probe));
    ri->kernel = sdpa_ctx_kernel(probe);
    snprintf(ri->describe, sizeof ri->describe, "%s", sdpa_ctx_describe(probe));
    /* The tile unit is timed where the kernels use it: the AMX table, which takes the forward
     * of bf16 problems alone (shape_on_tiles asks it). */
    ri->tiles = 0;
    if (level == SDPA_ISA_AMX && !o->backward)
        for (int i = 0; i < n_shapes && !ri->tiles; i++)
            ri->tiles = shape_on_tiles(probe, &shapes[i]);
    sdpa_ctx_destroy(probe);
    if (o->peak_isa > level) {
        /* a runtime error, not a usage error: the same command line is right on another
         * machine or without SDPA_MAX_ISA */
        fprintf(stderr,
                "sdpa bench: --peak-isa %s: the library's kernels run at %s on this machine "
                "(its CPU, or SDPA_MAX_ISA), and the probe does not go above them\n",
                sdpa_isa_name(o->peak_isa), ri->isa);
        return CLI_RUNTIME;
    }
    *peak_isa = o->peak_isa == SDPA_ISA_AUTO ? bench_peak_loop(level) : o->peak_isa;
    return CLI_OK;
}

/* What --json writes: every figure of the run (bench_write_json), as an output_writer. */
typedef struct json_arg {
    const bench_run *ri;
    const bench_result *rs;
    int n;
} json_arg;

static int json_writer(FILE *f, const void *arg, char *err, size_t errlen) {
    (void)err;
    (void)errlen;
    const json_arg *ja = arg;
    bench_write_json(f, ja->ri, ja->rs, ja->n);
    return 0;
}

int cli_bench(int argc, char **argv) {
    bench_options o;
    const int prc = bench_parse_options(argc, argv, &o);
    if (prc >= 0)
        return prc;
    bench_shape shapes[BENCH_MAX_SHAPES];
    const int n_shapes = bench_resolve_shapes(&o, shapes);

    bench_run ri;
    memset(&ri, 0, sizeof ri);
    sdpa_isa peak_isa = SDPA_ISA_GENERIC;
    int rc = probe_library(&o, shapes, n_shapes, &ri, &peak_isa);
    if (rc != CLI_OK)
        return rc;

    /* Check the JSON file's path next: a bad one should fail now, not after minutes of
     * timing. It is written at the end, all at once (outputs.h). */
    json_arg ja = {&ri, NULL, 0};
    outputs outs;
    outputs_init(&outs);
    outputs_add(&outs, "--json", o.json, json_writer, &ja);
    char err[1024];
    if ((rc = outputs_check(&outs, 0, NULL, NULL, err, sizeof err)) != 0) {
        fprintf(stderr, "sdpa bench: %s\n", err);
        return rc;
    }

    ri.preset = o.n_shapes == 0 ? o.preset : NULL;
    ri.backward = o.backward;
    ri.softcap = o.softcap;
    ri.alibi = o.alibi;
    ri.reps_max = o.reps;
    ri.warmup = o.warmup;
    ri.min_time = o.min_time;
    bench_cpu_info(&ri);
    const time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm) == NULL ||
        strftime(ri.date, sizeof ri.date, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
        snprintf(ri.date, sizeof ri.date, "unknown");
    bench_result *rs = calloc((size_t)n_shapes, sizeof *rs);
    if (rs == NULL) {
        fprintf(stderr, "sdpa bench: out of memory (%zu bytes for the results)\n",
                (size_t)n_shapes * sizeof *rs);
        rc = CLI_RUNTIME;
        goto done;
    }

    const int tty = isatty(STDERR_FILENO);
    rc = measure_peak(&ri, peak_isa, "start", &ri.peak_start, tty);
    progress pg = {tty, 0, n_shapes, ""};
    for (int i = 0; rc == CLI_OK && i < n_shapes; i++) {
        pg.index = i;
        bench_shape_spec(&shapes[i], pg.spec, sizeof pg.spec);
        rc = run_shape(&o, &ri, peak_isa, &shapes[i], &pg, &rs[i]);
    }
    if (rc == CLI_OK)
        rc = measure_peak(&ri, peak_isa, "end", &ri.peak_end, tty);
    if (tty)
        fputs("\r\033[K", stderr);
    if (rc != CLI_OK)
        goto done;
    ri.peak_gflops = fmax(ri.peak_start.gflops, ri.peak_end.gflops);
    ri.peak_gbs = fmax(ri.peak_start.read_gbs, ri.peak_end.read_gbs);
    ri.peak_tile_gflops = fmax(ri.peak_start.tile_gflops, ri.peak_end.tile_gflops); /* or NAN */
    bench_print_table(stdout, &ri, rs, n_shapes);
    ja.rs = rs;
    ja.n = n_shapes;
    if (outputs_commit(&outs, err, sizeof err) != 0) {
        fprintf(stderr, "sdpa bench: %s\n", err);
        rc = CLI_RUNTIME;
    }
done:
    free(rs);
    return rc;
}
