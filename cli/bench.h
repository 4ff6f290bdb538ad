/*
 * bench.h — the parts of `sdpa bench` shared between its files: the machine probe that
 * measures this CPU's FP32 FMA peak and its read bandwidth (bench_peak.c) with the ISA
 * variants of its inner loops (bench_peak_avx2.c, bench_peak_avx512.c, and the AMX unit's
 * rate in bench_peak_amx.c: compiled with their own flags and run only at or below the level of the
 * library's kernels on this machine, which the library has checked against the CPU and the OS),
 * the shapes and results that bench.c measures and bench_report.c prints, and the options that
 * bench_options.c reads from the command line.
 */
#ifndef SDPA_CLI_BENCH_H
#define SDPA_CLI_BENCH_H

#include "sdpa.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---------------------------------------------------------------------------------------- */
/* The machine probe (bench_peak.c)                                                          */
/* ---------------------------------------------------------------------------------------- */

/* What one probe measured, with all threads running at once. */
typedef struct bench_peak {
    sdpa_isa isa;    /* the loop that ran: SDPA_ISA_GENERIC, _AVX2 or _AVX512 */
    int n_threads;   /* threads that ran the loops at the same time */
    double gflops;   /* best FP32 FMA rate over the trials, 2 FLOP per lane per FMA */
    double read_gbs; /* best rate of reading a buffer far larger than the caches, 1e9 B/s */
    /* best rate of the AMX unit's TDPBF16PS (2 FLOP per bf16 multiply-add) with every thread
     * at once, where the run times the unit's work (bench_run.tiles); else NAN */
    double tile_gflops;
} bench_peak;

/* @return the loop of the probe for a level of the library's kernels: the widest loop at or
 *         below it (AMX takes the AVX-512 loop: the probe measures FP32 FMA). */
sdpa_isa bench_peak_loop(sdpa_isa level);

/* @return a monotonic clock in seconds, for the probe's trials and the timed calls. */
double bench_now_s(void);

/* Measures the FMA peak and read bandwidth with n_threads threads (>= 1) running the loops
 * of `isa` at once (a level the caller knows this CPU runs: see bench_peak_loop), and with
 * `tiles` the AMX unit's rate too (where this build has the tile loop: the caller asks only
 * when the library's kernels run at the AMX level, so the CPU and the OS let it run). Takes
 * about a second (a second and a half with the tiles).
 * @return 0, or -1 if a thread or the buffer could not be created (message in err, of size
 *         errcap). */
int bench_peak_measure(int n_threads, sdpa_isa isa, int tiles, bench_peak *out, char *err,
                       size_t errcap);

/* Measures the read bandwidth at one working-set size: n_threads threads (>= 1) running the
 * read loop of `isa` at once, each over its own slice of buf again and again (the best of
 * several trials, about a quarter of a second in all). The slices are equal multiples of 256
 * bytes; what does not fill one (less than 256 * n_threads bytes at the end of buf) is not
 * read. buf is aligned to 64 bytes and holds any data: only its bytes are counted.
 * @return 0 and sets *gbs (1e9 B/s, summed over the threads) and *bytes_read (the bytes of
 *         one pass over all slices), or -1 (message in err): a thread could not be created,
 *         or bytes < 256 * n_threads. */
int bench_read_measure(int n_threads, sdpa_isa isa, const void *buf, size_t bytes, double *gbs,
                       size_t *bytes_read, char *err, size_t errcap);

/* The inner loops. Each fma loop runs `iters` iterations of independent FMA chains and
 * returns a value that depends on all of them (so the compiler cannot drop the work);
 * *flops_per_iter is what one iteration counts. Each read loop sums n floats from p (n a
 * multiple of 64, p aligned to 64 bytes). */
float bench_fma_generic(int64_t iters, int64_t *flops_per_iter);
float bench_read_generic(const float *p, size_t n);
float bench_fma_avx2(int64_t iters, int64_t *flops_per_iter);
float bench_read_avx2(const float *p, size_t n);
float bench_fma_avx512(int64_t iters, int64_t *flops_per_iter);
float bench_read_avx512(const float *p, size_t n);
/* The tile loop (bench_peak_amx.c, built with SDPA_HAVE_AMX_PROBE): `iters` iterations of
 * four independent TDPBF16PS. */
float bench_tdp_amx(int64_t iters, int64_t *flops_per_iter);

/* ---------------------------------------------------------------------------------------- */
/* What is timed and what was measured (bench.c fills them, bench_report.c prints them)     */
/* ---------------------------------------------------------------------------------------- */

typedef enum bench_mask {
    BENCH_MASK_NONE = 0,
    BENCH_MASK_CAUSAL_TL = 1, /* causal, top-left aligned (PyTorch's is_causal) */
    BENCH_MASK_CAUSAL_BR = 2, /* causal, bottom-right aligned (FlashAttention >= 2.1) */
    /* the top-left causal pattern as an explicit additive f32 mask (1, 1, Lq, Lk): 0 where
     * the key is visible, -FLT_MAX elsewhere, as Hugging Face transformers builds masks */
    BENCH_MASK_CAUSAL_ADD = 3
} bench_mask;

/* One shape: Q and O (b, hq, lq, d) of dtype, K and V (b, hkv, lk, d) of kv_dtype,
 * contiguous (B, H, L, D). dtype and kv_dtype are SDPA_F32, SDPA_F16 or SDPA_BF16, or
 * BENCH_DTYPE_UNSET before the options have been applied (bench_resolve_shapes). */
typedef struct bench_shape {
    int64_t b, hq, hkv, lq, lk, d;
    bench_mask mask;
    int dtype, kv_dtype; /* sdpa_dtype values */
} bench_shape;

#define BENCH_DTYPE_UNSET (-1)

typedef struct bench_result {
    bench_shape s;
    int64_t visible;        /* visible (query, key) pairs per (batch, head) */
    double flops, kv_bytes; /* per call: 4*B*Hq*D*visible; the bytes of K and V */
    int reps, warmup;
    double t_med, t_min, t_max; /* seconds */
    size_t extra_bytes;         /* peak held by the library during the calls, beyond ctx */
    size_t ctx_bytes;           /* held by the fresh context before the calls */
    double allocs_per_call;
    double t_fwd_med; /* with --backward: the median of the forwards timed beside it */
    /* sdpa_ctx_last_kernel() after the timed calls: the implementation that ran the timed
     * operation (the run's kernel, or the next one down for a problem it does not take) */
    const char *kernel;
    /* The read bandwidth at this shape's working set: n_threads threads reading the buffer
     * that holds its K and V (bench_read_measure), right before and right after the timed
     * calls; the ratio %bw divides by the higher of the two. */
    size_t ws_bytes; /* the bytes one pass of that probe reads: K, V and < 64 + 256 n of zeros */
    double ws_gbs_before, ws_gbs_after, ws_gbs;
} bench_result;

/* The whole run, as reported. */
typedef struct bench_run {
    const char *preset; /* NULL when the shapes came from --shape */
    int backward;       /* the timed call is sdpa_backward (FLOP: 2.5 x the forward's) */
    float softcap;      /* every shape's softcap (0: off) */
    int alibi;          /* every shape with ALiBi's standard slopes */
    int n_threads;
    /* the probe times the AMX unit too: the kernels run at the AMX level and the AMX table
     * takes a shape's forward (bf16 alone: bench.c's shape_on_tiles asks the library) */
    int tiles;
    const char *isa;     /* sdpa_isa_name(sdpa_ctx_isa()): the level of the kernels that run */
    const char *kernel;  /* sdpa_ctx_kernel(): the implementation preferred (each shape's own:
                            bench_result.kernel) */
    char describe[2048]; /* sdpa_ctx_describe(): the dispatch and the kernels available */
    const char *cpu_isa; /* sdpa_isa_name(sdpa_ctx_cpu_isa()): the CPU's best level, uncapped */
    char cpu[128];       /* the model name */
    int cpu_family, cpu_model; /* as /proc/cpuinfo gives them; -1 unknown */
    long cache_kib[3];         /* L1d, L2, L3 of cpu0 in KiB (sysfs); 0 unknown */
    char date[32];
    int reps_max, warmup;
    double min_time;
    bench_peak peak_start, peak_end;
    double peak_gflops, peak_gbs; /* the higher of start and end: %peak's denominator, and
                                     the DRAM figure beside each shape's own %bw */
    double peak_tile_gflops;      /* the higher tile peak (%tile's denominator); NAN if none */
} bench_run;

/* @return "none", "causal" or "causal-br" (the names --shape accepts). */
const char *bench_mask_name(bench_mask m);

/* @return nonzero if `kernel` (an implementation's name: sdpa_ctx_last_kernel) is the AMX
 * table, real or emulated: a shape it ran is timed against the tile unit's peak (%tile). */
int bench_kernel_on_tiles(const char *kernel);

/* @return "f32/f16" for Q/O f32 with K/V f16, or just "f16" when both are the same: the
 * DTYPE field of --shape (in buf, of size cap). */
const char *bench_dtype_spec(const bench_shape *s, char *buf, size_t cap);

/* Writes the shape in --shape syntax ("1,32/8,1,4096,128", "1,32/8,1,4096,128,f32/f16": the
 * dtypes are written unless both are f32), so that a JSON consumer can hand it back to
 * --shape. */
void bench_shape_spec(const bench_shape *s, char *buf, size_t cap);

/* Fills run's cpu (the "model name" of /proc/cpuinfo, or "unknown"), cpu_family and cpu_model
 * (its "cpu family" and "model", or -1) and cache_kib (the L1 data, L2 and L3 caches of cpu0
 * from /sys/devices/system/cpu/cpu0/cache, or 0). */
void bench_cpu_info(bench_run *run);

/* The spread beyond which the start and end peaks of a run say it was disturbed: the machine
 * was busy during part of it (another tenant; on some of our VMs, two cores' FMA units, or
 * one vCPU's tile unit, slowing for minutes), so that its figures measure the machine, not
 * the code. bench/peers/run_peers.py warns at the same 15 % of the higher peak. */
#define BENCH_PEAK_SPREAD 0.15

/* @return |a - b| / max(a, b): how far two measurements of one peak are apart, as a share of
 *         the higher (as bench/ab.py and run_peers.py measure it); NAN unless both are finite
 *         and positive. */
double bench_peak_spread(double a, double b);

/* Prints the human-readable table, with a note where the start and end FMA peaks (or the AMX
 * tile peaks) are more than BENCH_PEAK_SPREAD apart. */
void bench_print_table(FILE *f, const bench_run *run, const bench_result *rs, int n);

/* Writes every figure as one JSON object, with the peaks' spreads (peak.fma_spread,
 * peak.tile_spread: bench_peak_spread of start and end, null where not measured) and
 * peak.disturbed (either above BENCH_PEAK_SPREAD). The caller checks ferror(f). */
void bench_write_json(FILE *f, const bench_run *run, const bench_result *rs, int n);

/* ---------------------------------------------------------------------------------------- */
/* The command line (bench_options.c reads it, bench.c runs it)                              */
/* ---------------------------------------------------------------------------------------- */

enum { BENCH_MAX_SHAPES = 64 }; /* --shape options, and the shapes of a run, at most */

/* The options of `sdpa bench`, as given: the shapes' dtypes are not yet resolved. */
typedef struct bench_options {
    const char *preset;
    bench_shape shapes[BENCH_MAX_SHAPES];
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
} bench_options;

/* Reads the arguments after `sdpa bench` into *o (the help text to stdout for --help, a usage
 * error to stderr for anything wrong).
 * @return -1 to continue, or the exit code (0 after --help, 2 on a usage error). */
int bench_parse_options(int argc, char **argv, bench_options *o);

/* Fills shapes[0..BENCH_MAX_SHAPES) with the run's shapes, their dtypes resolved (none left
 * BENCH_DTYPE_UNSET): o's --shape ones, else those of its preset (a name that
 * bench_parse_options accepted). @return their count. */
int bench_resolve_shapes(const bench_options *o, bench_shape *shapes);

#endif
