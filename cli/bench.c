/*
 * bench.c — `sdpa bench`: times sdpa_forward through the public API at a list of shapes and
 * reports, per shape, the median time of N repetitions (and min/max), GFLOP/s, the bandwidth
 * of reading K and V, the peak extra memory the library allocated, and the ratio of each rate
 * to this machine's FP32 FMA peak, which the same run measures at its start and at its end,
 * and to the read bandwidth at the shape's own working set, measured right before and after
 * it (bench_peak.c). Q/O and K/V are f32, f16 or bf16 (--dtype, --kv-dtype). A table goes to
 * stdout; --json FILE writes every figure.
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
#include <float.h>
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
    "usage: sdpa bench [--preset quick|full|decode] [--shape SPEC]... [--dtype T]\n"
    "                  [--kv-dtype T] [--threads N] [--json FILE] [--reps N] [--warmup N]\n"
    "                  [--min-time S] [--peak-isa ISA] [--backward]\n"
    "\n"
    "Times sdpa_forward ((B, H, L, D) contiguous, fixed-seed inputs) at a list of shapes and\n"
    "measures this machine's FP32 FMA peak and read bandwidth at the start and at the end of\n"
    "the same run, and the read bandwidth at each shape's working set right before and after\n"
    "it, with the same number of threads, so that the figures can be compared with what the\n"
    "machine can do under today's load.\n"
    "\n"
    "options:\n"
    "  --preset NAME        the shapes to time (default quick). quick: a handful of small\n"
    "                       shapes (seconds even on the reference). full: the targets of the\n"
    "                       fast forward: B=1 H=16 D=64 L=512..4096, H=8 D=128 L=2048, their\n"
    "                       causal variants, and a decode step (Lq=1, Lk=4096, H=32, Hkv=8).\n"
    "                       decode: the decode targets, Lq=1 D=128 Hq=32: Hkv=8 and 32 at\n"
    "                       Lk=32768 and 4096, and B=8 Hkv=8 Lk=4096 (as many cache bytes as\n"
    "                       one Lk=32768 sequence), with f32 Q/O and an f16 K/V cache unless\n"
    "                       --dtype or --kv-dtype says otherwise; plus Hkv=8 and 32 at\n"
    "                       Lk=32768 with an f32 cache, always f32.\n"
    "  --shape SPEC         time this shape instead of the preset's (repeatable).\n"
    "                       SPEC = B,H,Lq,Lk,D[,MASK][,DTYPE] where H is Hq or Hq/Hkv\n"
    "                       (grouped-query attention), MASK is none (default), causal\n"
    "                       (top-left aligned, as PyTorch's is_causal), causal-br\n"
    "                       (bottom-right) or causal-add (causal as an f32 mask tensor of\n"
    "                       0 and -FLT_MAX, as Hugging Face makes them), and DTYPE is T\n"
    "                       (Q, K, V and O) or T/KVT (Q and O, then K and V), e.g.\n"
    "                       1,32/8,1,4096,128,f32/f16; it wins\n"
    "                       over --dtype and --kv-dtype for that shape.\n"
    "  --dtype T            f32 (default), f16 or bf16: the dtype of Q, K, V and O. The\n"
    "                       fixed-seed inputs (uniform in [-1, 1)) are drawn in f32 and\n"
    "                       rounded once to it (to nearest even).\n"
    "  --kv-dtype T         the dtype of K and V alone (default: --dtype; in the decode\n"
    "                       preset f16 unless --dtype is given): f32 Q/O with f16 K/V is the\n"
    "                       usual KV cache. With --backward dO and dQ take Q's dtype, dK and\n"
    "                       dV K's.\n"
    "  --threads N          threads of the library and of the probes (default 0 = one per\n"
    "                       online core)\n"
    "  --json FILE          also write every figure as JSON to FILE (checked first, written\n"
    "                       at the end through a temporary file; /dev/stdout works)\n"
    "  --reps N             at most N timed repetitions per shape (default 100)\n"
    "  --warmup N           untimed calls per shape before timing (default 1)\n"
    "  --min-time S         time budget per shape in seconds (default 1): after the warm-up,\n"
    "                       at least one timed repetition runs, and no new one starts once\n"
    "                       the timed repetitions have used S seconds. The table shows how\n"
    "                       many ran; the median is over those.\n"
    "  --peak-isa ISA       the FMA and read loops of the probes: auto (default: the level of\n"
    "                       the library's kernels, 'isa' in sdpa info), avx512, avx2 or\n"
    "                       generic; a level above the kernels' is refused (exit 1)\n"
    "  --backward           time sdpa_backward instead, each repetition after a timed\n"
    "                       sdpa_forward that gives it out and lse (the bwd/fwd column: the\n"
    "                       ratio of the medians); its FLOP are counted as 2.5 x the forward's\n"
    "                       (the usual convention: 5 products of the size of one of the\n"
    "                       forward's 2)\n";

/* The rest of the text (C99 promises string literals of 4095 characters, no more). */
static const char help_figures[] =
    "  --softcap C          scores capped as C tanh(s / C) (Gemma 2's 50; default 0: off)\n"
    "                       at every shape, forward and backward alike\n"
    "  --alibi              ALiBi with the standard slopes (as sdpa run --alibi) at every\n"
    "                       shape, forward and backward alike\n"
    "  --help               this text\n"
    "\n"
    "The header names the kernel the context prefers and its ISA level (each shape's table\n"
    "row, and shapes[].kernel in the JSON, name the one that ran it: flash-amx takes bf16\n"
    "alone, flash-avx512 the rest), the CPU (model, family and model numbers, L1d, L2 and\n"
    "L3 sizes) with the best level it offers (higher than the kernels' under SDPA_MAX_ISA,\n"
    "which the header then says), and the loop of the peak probe: compare a %peak only with\n"
    "figures of the same CPU, kernels and peak loop. The JSON holds\n"
    "the same as cpu_model, cpu_family, cpu_model_number, cache_kib, cpu_isa, isa, kernel and\n"
    "peak.*.isa. Where the kernels run on an AMX unit (isa amx, not an emulated build) and\n"
    "it takes a shape's forward (see %tile), the probe also times its TDPBF16PS at the start\n"
    "and the end (AMX tile peak; peak.*.tile_gflops, else null): the unit has slow phases\n"
    "that the FMA peak does not show, so read such a figure next to it. Where the start and\n"
    "end FMA peaks, or tile peaks, differ by more than 15 % of the higher, a note above the\n"
    "table says the machine was busy during part of the run (JSON: peak.fma_spread,\n"
    "peak.tile_spread, peak.disturbed): run it again before trusting its figures.\n"
    "\n"
    "Figures:\n"
    "  dtype       Q and O's dtype, then /K and V's where they differ (f32/f16)\n"
    "  ms          median, min and max wall time of one sdpa_forward call\n"
    "  GFLOP/s     FLOP / median time, FLOP = 4 * B * Hq * D * (visible (query, key) pairs):\n"
    "              2*D for the row of Q K^T and 2*D for the row of P V per visible pair; the\n"
    "              softmax is not counted. Without a mask every pair is visible (Lq*Lk); with\n"
    "              causal only the pairs the mask lets through are counted, exactly (top-left\n"
    "              with Lq = Lk: L(L+1)/2). The same count for every dtype.\n"
    "  %peak       GFLOP/s / the higher of the two FP32 FMA peaks measured in this run\n"
    "  %tile       where the AMX unit is timed, GFLOP/s / the higher of the two AMX tile\n"
    "              peaks for each shape the AMX table ran (kernel flash-amx: Q, K and V\n"
    "              bf16, D a multiple of 32 up to 256); pct_tile_peak in the JSON\n"
    "  GB/s        bytes of K and V / median time: 2 * B * Hkv * Lk * D * (2 for f16 and\n"
    "              bf16, 4 for f32) bytes (KV MB), the figure that matters for decode (Lq = 1),\n"
    "              where a call reads the cache once\n"
    "  rd GB/s     the read bandwidth at that working set: all N threads at once, each summing\n"
    "              its own slice of the very buffer that holds this shape's K and V (with\n"
    "              less than 64 + 256 * N bytes of zeros added) again and again with the\n"
    "              probe's read loop, the best of 10 trials; right before the shape's warm-up\n"
    "              and right after its timed calls, the higher of the two. A cache that fits\n"
    "              in L2 or L3 is thus compared with the bandwidth of that level, not DRAM's\n"
    "  %bw         GB/s / rd GB/s. The header's read bandwidth is the DRAM figure (a 256 MiB\n"
    "              buffer, at the start and the end); the JSON has the ratio to it too\n"
    "  extra MB    the peak of the bytes the library held through its allocator during the\n"
    "              calls, beyond what the fresh context held before them\n"
    "  kernel      the implementation that ran the shape (sdpa_ctx_last_kernel): the header's,\n"
    "              or the next one down for a problem it does not take\n"
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

/* In the tables, U marks a dtype that the options choose (--dtype, --kv-dtype, else the
 * preset's default); a preset's fixed variants name theirs. */
#define U BENCH_DTYPE_UNSET

static const bench_shape preset_quick[] = {
    {1, 8, 8, 256, 256, 64, BENCH_MASK_NONE, U, U},
    {1, 8, 8, 512, 512, 64, BENCH_MASK_NONE, U, U},
    {1, 8, 8, 512, 512, 64, BENCH_MASK_CAUSAL_TL, U, U},
    {1, 8, 8, 1024, 1024, 64, BENCH_MASK_NONE, U, U},
    {1, 32, 8, 1, 4096, 128, BENCH_MASK_NONE, U, U},
};

static const bench_shape preset_full[] = {
    {1, 16, 16, 512, 512, 64, BENCH_MASK_NONE, U, U},
    {1, 16, 16, 1024, 1024, 64, BENCH_MASK_NONE, U, U},
    {1, 16, 16, 2048, 2048, 64, BENCH_MASK_NONE, U, U},
    {1, 16, 16, 4096, 4096, 64, BENCH_MASK_NONE, U, U},
    {1, 8, 8, 2048, 2048, 128, BENCH_MASK_NONE, U, U},
    {1, 16, 16, 512, 512, 64, BENCH_MASK_CAUSAL_TL, U, U},
    {1, 16, 16, 1024, 1024, 64, BENCH_MASK_CAUSAL_TL, U, U},
    {1, 16, 16, 2048, 2048, 64, BENCH_MASK_CAUSAL_TL, U, U},
    {1, 16, 16, 4096, 4096, 64, BENCH_MASK_CAUSAL_TL, U, U},
    {1, 8, 8, 2048, 2048, 128, BENCH_MASK_CAUSAL_TL, U, U},
    {1, 32, 8, 1, 4096, 128, BENCH_MASK_NONE, U, U},
};

/* The decode targets of issue 13: one query row against a long cache, D = 128, Hq = 32. The
 * K/V dtype defaults to f16 here (the usual KV cache: f32 Q and O, f16 K and V); two variants
 * keep an f32 cache whatever the options say. The batch of 8 at Lk = 4096 reads as many cache
 * bytes as B = 1 at Lk = 32768: the contiguous baseline of a ragged or paged batch. */
static const bench_shape preset_decode[] = {
    {1, 32, 8, 1, 32768, 128, BENCH_MASK_NONE, U, U},
    {1, 32, 8, 1, 32768, 128, BENCH_MASK_NONE, SDPA_F32, SDPA_F32},
    {1, 32, 32, 1, 32768, 128, BENCH_MASK_NONE, U, U},
    {1, 32, 32, 1, 32768, 128, BENCH_MASK_NONE, SDPA_F32, SDPA_F32},
    {1, 32, 8, 1, 4096, 128, BENCH_MASK_NONE, U, U},
    {1, 32, 32, 1, 4096, 128, BENCH_MASK_NONE, U, U},
    {8, 32, 8, 1, 4096, 128, BENCH_MASK_NONE, U, U},
};

#undef U

typedef struct preset {
    const char *name;
    const bench_shape *shapes;
    int n;
    sdpa_dtype kv_default; /* K and V where neither --dtype nor --kv-dtype is given */
} preset;

#define PRESET(name, table, kv)                                                                    \
    { name, table, (int)(sizeof table / sizeof table[0]), kv }
static const preset presets[] = {
    PRESET("quick", preset_quick, SDPA_F32),
    PRESET("full", preset_full, SDPA_F32),
    PRESET("decode", preset_decode, SDPA_F16),
};
#undef PRESET

static const preset *find_preset(const char *name) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(presets[i].name, name) == 0)
            return &presets[i];
    return NULL;
}

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
    sdpa_isa peak_isa;   /* SDPA_ISA_AUTO: the level of the library's kernels */
    int backward;        /* time sdpa_backward */
    int dtype, kv_dtype; /* --dtype, --kv-dtype; BENCH_DTYPE_UNSET when not given */
    float softcap;       /* --softcap; 0: off */
    int alibi;           /* --alibi */
} options;

/* "f32", "f16" or "bf16". @return 0 and sets *dt, or -1. */
static int parse_dtype(const char *name, int *dt) {
    static const sdpa_dtype all[] = {SDPA_F32, SDPA_F16, SDPA_BF16};
    for (size_t i = 0; name != NULL && i < sizeof all / sizeof all[0]; i++)
        if (strcmp(name, sdpa_dtype_name(all[i])) == 0) {
            *dt = (int)all[i];
            return 0;
        }
    return -1;
}

/* The DTYPE field of --shape: "T" (Q, K, V and O) or "T/KVT" (Q and O, then K and V).
 * @return 0, or -1 if it is not one. */
static int parse_dtype_pair(const char *field, int *dt, int *kv) {
    char buf[32];
    snprintf(buf, sizeof buf, "%s", field);
    char *slash = strchr(buf, '/');
    if (slash != NULL)
        *slash = '\0';
    int a, b;
    if (parse_dtype(buf, &a) != 0 || (slash != NULL && parse_dtype(slash + 1, &b) != 0))
        return -1;
    *dt = a;
    *kv = slash != NULL ? b : a;
    return 0;
}

/* The MASK field of --shape. @return 0 and sets *m, or -1. */
static int parse_mask(const char *f, bench_mask *m) {
    if (strcmp(f, "causal") == 0 || strcmp(f, "causal-tl") == 0 || strcmp(f, "tl") == 0 ||
        strcmp(f, "1") == 0)
        *m = BENCH_MASK_CAUSAL_TL;
    else if (strcmp(f, "causal-br") == 0 || strcmp(f, "br") == 0)
        *m = BENCH_MASK_CAUSAL_BR;
    else if (strcmp(f, "causal-add") == 0)
        *m = BENCH_MASK_CAUSAL_ADD;
    else if (strcmp(f, "none") == 0 || strcmp(f, "0") == 0)
        *m = BENCH_MASK_NONE;
    else
        return -1;
    return 0;
}

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
    char f[8][32];
    int n = 0;
    const char *p = spec;
    while (*p != '\0' && n < 8)
        p = shape_field(p, f[n++], sizeof f[0]);
    if (*p != '\0' || n < 5 || n > 7 || spec[strlen(spec) - 1] == ',')
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
    /* then MASK and DTYPE, each at most once, in either order */
    s->mask = BENCH_MASK_NONE;
    s->dtype = s->kv_dtype = BENCH_DTYPE_UNSET;
    int have_mask = 0;
    for (int i = 5; i < n; i++) {
        if (!have_mask && parse_mask(f[i], &s->mask) == 0)
            have_mask = 1;
        else if (s->dtype != BENCH_DTYPE_UNSET ||
                 parse_dtype_pair(f[i], &s->dtype, &s->kv_dtype) != 0)
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
    o->dtype = o->kv_dtype = BENCH_DTYPE_UNSET;
    for (int i = 0; i < argc; i++) {
        const char *v = NULL;
        int64_t n;
        if (cli_is_help(argv[i])) {
            fputs(help, stdout);
            fputs(help_figures, stdout);
            return CLI_OK;
        } else if (cli_option_value(argc, argv, &i, "--preset", &v)) {
            if (v == NULL || find_preset(v) == NULL)
                return cli_usage_error("bench", "--preset wants quick, full or decode, got '%s'",
                                       v ? v : "");
            o->preset = v;
        } else if (cli_option_value(argc, argv, &i, "--shape", &v)) {
            if (o->n_shapes == MAX_SHAPES)
                return cli_usage_error("bench", "at most %d --shape options", MAX_SHAPES);
            if (v == NULL || parse_shape(v, &o->shapes[o->n_shapes]) != 0)
                return cli_usage_error(
                    "bench",
                    "--shape wants B,H,Lq,Lk,D[,MASK][,DTYPE] with H = Hq or "
                    "Hq/Hkv (Hq a multiple of Hkv), MASK none, causal, "
                    "causal-br or causal-add, DTYPE T or T/KVT (T f32, f16 or bf16), got '%s'",
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
        } else if (cli_option_value(argc, argv, &i, "--dtype", &v)) {
            if (parse_dtype(v, &o->dtype) != 0)
                return cli_usage_error("bench", "--dtype wants f32, f16 or bf16, got '%s'",
                                       v ? v : "");
        } else if (cli_option_value(argc, argv, &i, "--kv-dtype", &v)) {
            if (parse_dtype(v, &o->kv_dtype) != 0)
                return cli_usage_error("bench", "--kv-dtype wants f32, f16 or bf16, got '%s'",
                                       v ? v : "");
        } else if (strcmp(argv[i], "--backward") == 0) {
            o->backward = 1;
        } else if (strcmp(argv[i], "--alibi") == 0) {
            o->alibi = 1;
        } else if (cli_option_value(argc, argv, &i, "--softcap", &v)) {
            char *end = NULL;
            const double c = v != NULL ? strtod(v, &end) : -1.0;
            if (v == NULL || *v == '\0' || *end != '\0' || !(c >= 0.0 && c <= 1e30))
                return cli_usage_error(
                    "bench", "--softcap wants a cap in 0..1e30 (0: off), got '%s'", v ? v : "");
            o->softcap = (float)c;
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
static int run_shape(const options *o, const bench_run *ri, sdpa_isa isa, const bench_shape *s,
                     progress *pg, bench_result *r) {
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
static int probe_library(const options *o, const bench_shape *shapes, int n_shapes, bench_run *ri,
                         sdpa_isa *peak_isa) {
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
    options o;
    const int prc = parse_options(argc, argv, &o);
    if (prc >= 0)
        return prc;
    /* The shapes, their dtypes resolved: a --shape's own DTYPE field, else --dtype and
     * --kv-dtype (K and V default to --dtype), else the preset's (f32, and f16 K and V in
     * the decode preset), except for the preset's variants that name their own. */
    const preset *pr = find_preset(o.preset);
    bench_shape shapes[MAX_SHAPES];
    const int n_shapes = o.n_shapes != 0 ? o.n_shapes : pr->n;
    const sdpa_dtype kv_default = o.n_shapes != 0 ? SDPA_F32 : pr->kv_default;
    for (int i = 0; i < n_shapes; i++) {
        bench_shape *s = &shapes[i];
        *s = o.n_shapes != 0 ? o.shapes[i] : pr->shapes[i];
        if (s->dtype == BENCH_DTYPE_UNSET)
            s->dtype = o.dtype != BENCH_DTYPE_UNSET ? o.dtype : SDPA_F32;
        if (s->kv_dtype == BENCH_DTYPE_UNSET)
            s->kv_dtype = o.kv_dtype != BENCH_DTYPE_UNSET ? o.kv_dtype
                          : o.dtype != BENCH_DTYPE_UNSET  ? o.dtype
                                                          : (int)kv_default;
    }

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
