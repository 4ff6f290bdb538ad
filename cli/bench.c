/*
 * bench.c — `sdpa bench`: times sdpa_forward through the public API at a list of shapes and
 * reports, per shape, the median time of N repetitions (and min/max), GFLOP/s, the bandwidth
 * of reading K and V, the peak extra memory the library allocated, and the ratio of each rate
 * to this machine's FP32 FMA peak and read bandwidth, which the same run measures at its
 * start and at its end (bench_peak.c). A table goes to stdout; --json FILE writes every
 * figure.
 *
 * Inputs are filled from fixed seeds, so every run times the same numbers. Each shape gets a
 * fresh context whose allocator hooks count bytes, so the extra memory is exact (for what the
 * library allocates through its context) and no shape inherits the scratch of another.
 */
#include "args.h"
#include "bench.h"
#include "cli.h"
#include "outputs.h"

#include "sdpa.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { MAX_SHAPES = 64 };

static const char help[] =
    "usage: sdpa bench [--preset quick|full] [--shape SPEC]... [--threads N] [--json FILE]\n"
    "                  [--reps N] [--warmup N] [--min-time S] [--peak-isa ISA] [--backward]\n"
    "\n"
    "Times sdpa_forward (f32, (B, H, L, D) contiguous, fixed-seed inputs) at a list of shapes\n"
    "and measures this machine's FP32 FMA peak and read bandwidth at the start and at the end\n"
    "of the same run, with the same number of threads, so that the figures can be compared\n"
    "with what the machine can do under today's load.\n"
    "\n"
    "options:\n"
    "  --preset quick|full  the shapes to time (default quick). quick: a handful of small\n"
    "                       shapes (seconds even on the reference). full: the targets of the\n"
    "                       fast forward: B=1 H=16 D=64 L=512..4096, H=8 D=128 L=2048, their\n"
    "                       causal variants, and a decode step (Lq=1, Lk=4096, H=32, Hkv=8).\n"
    "  --shape SPEC         time this shape instead of the preset's (repeatable).\n"
    "                       SPEC = B,H,Lq,Lk,D[,MASK] where H is Hq or Hq/Hkv (grouped-query\n"
    "                       attention) and MASK is none (default), causal (top-left aligned,\n"
    "                       as PyTorch's is_causal) or causal-br (bottom-right aligned).\n"
    "  --threads N          threads of the library and of the peak probe (default 0 = one per\n"
    "                       online core)\n"
    "  --json FILE          also write every figure as JSON to FILE (checked first, written\n"
    "                       at the end through a temporary file; /dev/stdout works)\n"
    "  --reps N             at most N timed repetitions per shape (default 100)\n"
    "  --warmup N           untimed calls per shape before timing (default 1)\n"
    "  --min-time S         time budget per shape in seconds (default 1): after the warm-up,\n"
    "                       at least one timed repetition runs, and no new one starts once\n"
    "                       the timed repetitions have used S seconds. The table shows how\n"
    "                       many ran; the median is over those.\n"
    "  --peak-isa ISA       the FMA loop of the peak probe: auto (default: the level of the\n"
    "                       library's kernels, 'isa' in sdpa info), avx512, avx2 or generic;\n"
    "                       a level above the kernels' is refused (exit 1)\n"
    "  --backward           time sdpa_backward instead, each repetition after a timed\n"
    "                       sdpa_forward that gives it out and lse (the bwd/fwd column: the\n"
    "                       ratio of the medians); its FLOP are counted as 2.5 x the forward's\n"
    "                       (the usual convention: 5 products of the size of one of the\n"
    "                       forward's 2)\n"
    "  --help               this text\n"
    "\n"
    "The header names the kernels that ran and their ISA level, the CPU (model, family and\n"
    "model numbers, L1d, L2 and L3 sizes) with the best level it offers (higher than the\n"
    "kernels' under SDPA_MAX_ISA, which the header then says), and the loop of the peak probe:\n"
    "compare a %peak only with figures of the same CPU, kernels and peak loop. The JSON holds\n"
    "the same as cpu_model, cpu_family, cpu_model_number, cache_kib, cpu_isa, isa, kernel and\n"
    "peak.*.isa.\n"
    "\n"
    "Figures:\n"
    "  ms          median, min and max wall time of one sdpa_forward call\n"
    "  GFLOP/s     FLOP / median time, FLOP = 4 * B * Hq * D * (visible (query, key) pairs):\n"
    "              2*D for the row of Q K^T and 2*D for the row of P V per visible pair; the\n"
    "              softmax is not counted. Without a mask every pair is visible (Lq*Lk); with\n"
    "              causal only the pairs the mask lets through are counted, exactly (top-left\n"
    "              with Lq = Lk: L(L+1)/2).\n"
    "  %peak       GFLOP/s / the higher of the two FMA peaks measured in this run\n"
    "  GB/s, %bw   bytes of K and V (2 * B * Hkv * Lk * D * 4) / median time, and its ratio to\n"
    "              the measured read bandwidth: the figure that matters for decode (Lq = 1)\n"
    "  extra MB    the peak of the bytes the library held through its allocator during the\n"
    "              calls, beyond what the fresh context held before them\n"
    "\n"
    "A progress line goes to stderr when it is a terminal. Exit codes: 0 success, 1 runtime\n"
    "error, 2 usage error.\n";

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

static const bench_shape preset_quick[] = {
    {1, 8, 8, 256, 256, 64, BENCH_MASK_NONE},      {1, 8, 8, 512, 512, 64, BENCH_MASK_NONE},
    {1, 8, 8, 512, 512, 64, BENCH_MASK_CAUSAL_TL}, {1, 8, 8, 1024, 1024, 64, BENCH_MASK_NONE},
    {1, 32, 8, 1, 4096, 128, BENCH_MASK_NONE},
};

static const bench_shape preset_full[] = {
    {1, 16, 16, 512, 512, 64, BENCH_MASK_NONE},
    {1, 16, 16, 1024, 1024, 64, BENCH_MASK_NONE},
    {1, 16, 16, 2048, 2048, 64, BENCH_MASK_NONE},
    {1, 16, 16, 4096, 4096, 64, BENCH_MASK_NONE},
    {1, 8, 8, 2048, 2048, 128, BENCH_MASK_NONE},
    {1, 16, 16, 512, 512, 64, BENCH_MASK_CAUSAL_TL},
    {1, 16, 16, 1024, 1024, 64, BENCH_MASK_CAUSAL_TL},
    {1, 16, 16, 2048, 2048, 64, BENCH_MASK_CAUSAL_TL},
    {1, 16, 16, 4096, 4096, 64, BENCH_MASK_CAUSAL_TL},
    {1, 8, 8, 2048, 2048, 128, BENCH_MASK_CAUSAL_TL},
    {1, 32, 8, 1, 4096, 128, BENCH_MASK_NONE},
};

/* ---------------------------------------------------------------------------------------- */
/* Options                                                                                   */
/* ---------------------------------------------------------------------------------------- */

typedef struct options {
    const char *preset;
    bench_shape shapes[MAX_SHAPES];
    int n_shapes; /* from --shape; 0 = the preset's */
    int n_threads;
    const char *json;
    int reps, warmup;
    double min_time;
    sdpa_isa peak_isa; /* SDPA_ISA_AUTO: the level of the library's kernels */
    int backward;      /* time sdpa_backward */
} options;

/* Parses one field of a --shape, up to the next comma. @return the position after it. */
static const char *shape_field(const char *p, char *buf, size_t cap) {
    size_t n = strcspn(p, ",");
    if (n >= cap)
        n = cap - 1;
    memcpy(buf, p, n);
    buf[n] = '\0';
    p += strcspn(p, ",");
    return *p == ',' ? p + 1 : p;
}

static int parse_shape(const char *spec, bench_shape *s) {
    char f[7][32];
    int n = 0;
    const char *p = spec;
    while (*p != '\0' && n < 7)
        p = shape_field(p, f[n++], sizeof f[0]);
    if (*p != '\0' || n < 5 || n > 6 || spec[strlen(spec) - 1] == ',')
        return -1;
    int64_t hkv = 0;
    char *slash = strpbrk(f[1], "/:");
    if (slash != NULL) {
        *slash = '\0';
        if (cli_parse_int(slash + 1, 1, SDPA_MAX_EXTENT, &hkv) != 0)
            return -1;
    }
    if (cli_parse_int(f[0], 1, SDPA_MAX_EXTENT, &s->b) != 0 ||
        cli_parse_int(f[1], 1, SDPA_MAX_EXTENT, &s->hq) != 0 ||
        cli_parse_int(f[2], 1, SDPA_MAX_EXTENT, &s->lq) != 0 ||
        cli_parse_int(f[3], 1, SDPA_MAX_EXTENT, &s->lk) != 0 ||
        cli_parse_int(f[4], 1, SDPA_MAX_HEAD_DIM, &s->d) != 0)
        return -1;
    s->hkv = slash != NULL ? hkv : s->hq;
    if (s->hq % s->hkv != 0)
        return -1;
    s->mask = BENCH_MASK_NONE;
    if (n == 6) {
        const char *m = f[5];
        if (strcmp(m, "causal") == 0 || strcmp(m, "causal-tl") == 0 || strcmp(m, "tl") == 0 ||
            strcmp(m, "1") == 0)
            s->mask = BENCH_MASK_CAUSAL_TL;
        else if (strcmp(m, "causal-br") == 0 || strcmp(m, "br") == 0)
            s->mask = BENCH_MASK_CAUSAL_BR;
        else if (strcmp(m, "none") != 0 && strcmp(m, "0") != 0)
            return -1;
    }
    return 0;
}

/* @return -1 to continue, or the exit code (0 after --help, 2 on a usage error). */
static int parse_options(int argc, char **argv, options *o) {
    memset(o, 0, sizeof *o);
    o->preset = "quick";
    o->reps = 100;
    o->warmup = 1;
    o->min_time = 1.0;
    for (int i = 0; i < argc; i++) {
        const char *v = NULL;
        int64_t n;
        if (cli_is_help(argv[i])) {
            fputs(help, stdout);
            return CLI_OK;
        } else if (cli_option_value(argc, argv, &i, "--preset", &v)) {
            if (v == NULL || (strcmp(v, "quick") != 0 && strcmp(v, "full") != 0))
                return cli_usage_error("bench", "--preset wants quick or full, got '%s'",
                                       v ? v : "");
            o->preset = v;
        } else if (cli_option_value(argc, argv, &i, "--shape", &v)) {
            if (o->n_shapes == MAX_SHAPES)
                return cli_usage_error("bench", "at most %d --shape options", MAX_SHAPES);
            if (v == NULL || parse_shape(v, &o->shapes[o->n_shapes]) != 0)
                return cli_usage_error("bench",
                                       "--shape wants B,H,Lq,Lk,D[,none|causal|causal-br] with H "
                                       "= Hq or Hq/Hkv (Hq a multiple of Hkv), got '%s'",
                                       v ? v : "");
            o->n_shapes++;
        } else if (cli_option_value(argc, argv, &i, "--threads", &v)) {
            if (cli_parse_int(v, 0, SDPA_MAX_THREADS, &n) != 0)
                return cli_usage_error("bench", "--threads wants an integer in 0..%d, got '%s'",
                                       SDPA_MAX_THREADS, v ? v : "");
            o->n_threads = (int)n;
        } else if (cli_option_value(argc, argv, &i, "--json", &v)) {
            if (v == NULL || *v == '\0')
                return cli_usage_error("bench", "--json wants a file name");
            o->json = v;
        } else if (cli_option_value(argc, argv, &i, "--reps", &v)) {
            if (cli_parse_int(v, 1, 1000000, &n) != 0)
                return cli_usage_error("bench", "--reps wants an integer in 1..1000000, got '%s'",
                                       v ? v : "");
            o->reps = (int)n;
        } else if (cli_option_value(argc, argv, &i, "--warmup", &v)) {
            if (cli_parse_int(v, 0, 1000000, &n) != 0)
                return cli_usage_error("bench", "--warmup wants an integer in 0..1000000, got '%s'",
                                       v ? v : "");
            o->warmup = (int)n;
        } else if (cli_option_value(argc, argv, &i, "--min-time", &v)) {
            char *end = NULL;
            const double t = v != NULL ? strtod(v, &end) : -1.0;
            if (v == NULL || *v == '\0' || *end != '\0' || !(t >= 0.0 && t <= 1e6))
                return cli_usage_error("bench", "--min-time wants seconds in 0..1e6, got '%s'",
                                       v ? v : "");
            o->min_time = t;
        } else if (strcmp(argv[i], "--backward") == 0) {
            o->backward = 1;
        } else if (cli_option_value(argc, argv, &i, "--peak-isa", &v)) {
            if (v != NULL && strcmp(v, "auto") == 0)
                o->peak_isa = SDPA_ISA_AUTO;
            else if (v != NULL && strcmp(v, "avx512") == 0)
                o->peak_isa = SDPA_ISA_AVX512;
            else if (v != NULL && strcmp(v, "avx2") == 0)
                o->peak_isa = SDPA_ISA_AVX2;
            else if (v != NULL && strcmp(v, "generic") == 0)
                o->peak_isa = SDPA_ISA_GENERIC;
            else
                return cli_usage_error("bench",
                                       "--peak-isa wants auto, avx512, avx2 or generic, got '%s'",
                                       v ? v : "");
        } else {
            return cli_usage_error("bench", "unknown option '%s'", argv[i]);
        }
    }
    return -1;
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

/* Uniform in [-1, 1) from splitmix64: fixed, portable inputs without libc's rand(). */
static void fill(float *x, size_t n, uint64_t seed) {
    uint64_t st = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        uint64_t z = (st += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        x[i] = (float)((double)(z >> 40) * 0x1p-23 - 1.0);
    }
}

/* @return a 64-byte aligned array of n floats, or NULL (also when n * 4 overflows). */
static float *alloc_floats(int64_t n) {
    if (n <= 0 || (uint64_t)n > SIZE_MAX / sizeof(float))
        return NULL;
    void *p = NULL;
    return posix_memalign(&p, 64, (size_t)n * sizeof(float)) == 0 ? p : NULL;
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

/* Times one shape. @return 0, or 1 (runtime error, reported on stderr). */
static int run_shape(const options *o, const bench_shape *s, progress *pg, bench_result *r) {
    memset(r, 0, sizeof *r);
    r->s = *s;
    r->visible = visible_pairs(s);
    r->flops = 4.0 * (double)s->b * (double)s->hq * (double)s->d * (double)r->visible;
    if (o->backward)
        r->flops *= 2.5; /* BENCH_BACKWARD_FLOPS: the convention --help states */
    r->kv_bytes = 2.0 * (double)s->b * (double)s->hkv * (double)s->lk * (double)s->d * 4.0;

    int64_t nq = s->b, nkv = s->b;
    if (!mul_ok(&nq, s->hq) || !mul_ok(&nq, s->lq) || !mul_ok(&nq, s->d) || !mul_ok(&nkv, s->hkv) ||
        !mul_ok(&nkv, s->lk) || !mul_ok(&nkv, s->d)) {
        progress_clear(pg);
        fprintf(stderr, "sdpa bench: %s: the tensors are too large\n", pg->spec);
        return CLI_RUNTIME;
    }
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
    float *q = alloc_floats(nq), *k = alloc_floats(nkv), *v = alloc_floats(nkv);
    float *out = alloc_floats(nq);
    double *times = malloc((size_t)o->reps * sizeof *times);
    /* the backward's: the forward's lse, dL/dout, and the gradients */
    const int bw = o->backward;
    float *lse = bw ? alloc_floats(nq / s->d) : NULL, *dout = bw ? alloc_floats(nq) : NULL;
    float *dq = bw ? alloc_floats(nq) : NULL, *dk = bw ? alloc_floats(nkv) : NULL;
    float *dv = bw ? alloc_floats(nkv) : NULL;
    double *times_f = bw ? malloc((size_t)o->reps * sizeof *times_f) : NULL;
    int rc = CLI_OK;
    if (q == NULL || k == NULL || v == NULL || out == NULL || times == NULL ||
        (bw && (lse == NULL || dout == NULL || dq == NULL || dk == NULL || dv == NULL ||
                times_f == NULL))) {
        progress_clear(pg);
        fprintf(stderr,
                "sdpa bench: %s: out of memory for the inputs (Q, K, V and the output%s: %.1f "
                "MB)\n",
                pg->spec, bw ? ", dO and the gradients" : "",
                (double)((bw ? 4 : 2) * nq + (bw ? 4 : 2) * nkv) * sizeof(float) / 1e6);
        rc = CLI_RUNTIME;
        goto done;
    }
    progress_show(pg, "filling the inputs");
    fill(q, (size_t)nq, 1);
    fill(k, (size_t)nkv, 2);
    fill(v, (size_t)nkv, 3);
    memset(out, 0, (size_t)nq * sizeof *out);
    sdpa_tensor tq = sdpa_tensor_bhld(q, SDPA_F32, s->b, s->hq, s->lq, s->d);
    sdpa_tensor tk = sdpa_tensor_bhld(k, SDPA_F32, s->b, s->hkv, s->lk, s->d);
    sdpa_tensor tv = sdpa_tensor_bhld(v, SDPA_F32, s->b, s->hkv, s->lk, s->d);
    sdpa_tensor to = sdpa_tensor_bhld(out, SDPA_F32, s->b, s->hq, s->lq, s->d);
    sdpa_tensor tl = sdpa_tensor_bhld(lse, SDPA_F32, s->b, s->hq, s->lq, 1);
    sdpa_tensor tdo = sdpa_tensor_bhld(dout, SDPA_F32, s->b, s->hq, s->lq, s->d);
    sdpa_tensor tdq = sdpa_tensor_bhld(dq, SDPA_F32, s->b, s->hq, s->lq, s->d);
    sdpa_tensor tdk = sdpa_tensor_bhld(dk, SDPA_F32, s->b, s->hkv, s->lk, s->d);
    sdpa_tensor tdv = sdpa_tensor_bhld(dv, SDPA_F32, s->b, s->hkv, s->lk, s->d);
    if (bw)
        fill(dout, (size_t)nq, 4);
    sdpa_params p = {0};
    p.causal = s->mask != BENCH_MASK_NONE;
    p.align = s->mask == BENCH_MASK_CAUSAL_BR ? SDPA_ALIGN_BOTTOM_RIGHT : SDPA_ALIGN_TOP_LEFT;

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
done:
    free(times);
    free(times_f);
    free(lse);
    free(dout);
    free(dq);
    free(dk);
    free(dv);
    free(q);
    free(k);
    free(v);
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
        fprintf(stderr, "\r\033[Kmeasuring the FMA peak and read bandwidth (%s)", when);
        fflush(stderr);
    }
    char err[160];
    if (bench_peak_measure(ri->n_threads, isa, out, err, sizeof err) != 0) {
        if (tty)
            fputs("\r\033[K", stderr);
        fprintf(stderr, "sdpa bench: %s\n", err);
        return CLI_RUNTIME;
    }
    return CLI_OK;
}

/* A probe context tells the thread count that 0 resolves to, the kernels chosen and their
 * level, which the peak probe's loop follows: by default the same level, and never a higher
 * one, since the library has checked that the CPU and the OS run that level and no other
 * part of the command asks the CPU. @return CLI_OK and fills ri and *peak_isa, or the exit
 * code (message printed). */
static int probe_library(const options *o, bench_run *ri, sdpa_isa *peak_isa) {
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
    options o;
    const int prc = parse_options(argc, argv, &o);
    if (prc >= 0)
        return prc;
    const bench_shape *shapes = o.shapes;
    int n_shapes = o.n_shapes;
    if (n_shapes == 0) {
        const int full = strcmp(o.preset, "full") == 0;
        shapes = full ? preset_full : preset_quick;
        n_shapes = full ? (int)(sizeof preset_full / sizeof preset_full[0])
                        : (int)(sizeof preset_quick / sizeof preset_quick[0]);
    }

    bench_run ri;
    memset(&ri, 0, sizeof ri);
    sdpa_isa peak_isa = SDPA_ISA_GENERIC;
    int rc = probe_library(&o, &ri, &peak_isa);
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
        rc = run_shape(&o, &shapes[i], &pg, &rs[i]);
    }
    if (rc == CLI_OK)
        rc = measure_peak(&ri, peak_isa, "end", &ri.peak_end, tty);
    if (tty)
        fputs("\r\033[K", stderr);
    if (rc != CLI_OK)
        goto done;
    ri.peak_gflops = fmax(ri.peak_start.gflops, ri.peak_end.gflops);
    ri.peak_gbs = fmax(ri.peak_start.read_gbs, ri.peak_end.read_gbs);
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
