/*
 * bench_options.c — the command line of `sdpa bench` (bench.h): its help text, the presets' shapes,
 * and the options and --shape specs read strictly, every bad one a usage error (exit code 2)
 * that names what was expected. bench.c times what these say.
 */
#include "args.h"
#include "bench.h"
#include "cli.h"

#include "sdpa.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
/* Presets                                                                                   */
/* ---------------------------------------------------------------------------------------- */

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

int bench_parse_options(int argc, char **argv, bench_options *o) {
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
            if (o->n_shapes == BENCH_MAX_SHAPES)
                return cli_usage_error("bench", "at most %d --shape options", BENCH_MAX_SHAPES);
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

int bench_resolve_shapes(const bench_options *o, bench_shape *shapes) {
    /* The shapes, their dtypes resolved: a --shape's own DTYPE field, else --dtype and
     * --kv-dtype (K and V default to --dtype), else the preset's (f32, and f16 K and V in
     * the decode preset), except for the preset's variants that name their own. */
    const preset *pr = find_preset(o->preset);
    const int n_shapes = o->n_shapes != 0 ? o->n_shapes : pr->n;
    const sdpa_dtype kv_default = o->n_shapes != 0 ? SDPA_F32 : pr->kv_default;
    for (int i = 0; i < n_shapes; i++) {
        bench_shape *s = &shapes[i];
        *s = o->n_shapes != 0 ? o->shapes[i] : pr->shapes[i];
        if (s->dtype == BENCH_DTYPE_UNSET)
            s->dtype = o->dtype != BENCH_DTYPE_UNSET ? o->dtype : SDPA_F32;
        if (s->kv_dtype == BENCH_DTYPE_UNSET)
            s->kv_dtype = o->kv_dtype != BENCH_DTYPE_UNSET ? o->kv_dtype
                          : o->dtype != BENCH_DTYPE_UNSET  ? o->dtype
                                                           : (int)kv_default;
    }
    return n_shapes;
}
