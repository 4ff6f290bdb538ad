/*
 * bench_report.c — what `sdpa bench` prints: the human-readable table and the JSON record of a
 * run (every shape, every figure, the peaks measured at the start and at the end, the thread
 * count, the CPU model, the library's version, dispatch and kernel, the date).
 */
#include "bench.h"

#include "sdpa.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *bench_mask_name(bench_mask m) {
    return m == BENCH_MASK_CAUSAL_TL    ? "causal"
           : m == BENCH_MASK_CAUSAL_BR  ? "causal-br"
           : m == BENCH_MASK_CAUSAL_ADD ? "causal-add"
                                        : "none";
}

/* The heads as --shape takes them: "Hq", or "Hq/Hkv" for grouped-query attention. */
static void heads_spec(const bench_shape *s, char *buf, size_t cap) {
    if (s->hkv == s->hq)
        snprintf(buf, cap, "%lld", (long long)s->hq);
    else
        snprintf(buf, cap, "%lld/%lld", (long long)s->hq, (long long)s->hkv);
}

const char *bench_dtype_spec(const bench_shape *s, char *buf, size_t cap) {
    if (s->dtype == s->kv_dtype)
        snprintf(buf, cap, "%s", sdpa_dtype_name((sdpa_dtype)s->dtype));
    else
        snprintf(buf, cap, "%s/%s", sdpa_dtype_name((sdpa_dtype)s->dtype),
                 sdpa_dtype_name((sdpa_dtype)s->kv_dtype));
    return buf;
}

/* Writes the shape in --shape syntax, so a JSON consumer can hand it back to --shape. */
void bench_shape_spec(const bench_shape *s, char *buf, size_t cap) {
    char h[48], dt[16] = "";
    heads_spec(s, h, sizeof h);
    if (s->dtype != SDPA_F32 || s->kv_dtype != SDPA_F32) {
        dt[0] = ',';
        bench_dtype_spec(s, dt + 1, sizeof dt - 1);
    }
    snprintf(buf, cap, "%lld,%s,%lld,%lld,%lld%s%s%s", (long long)s->b, h, (long long)s->lq,
             (long long)s->lk, (long long)s->d, s->mask == BENCH_MASK_NONE ? "" : ",",
             s->mask == BENCH_MASK_NONE ? "" : bench_mask_name(s->mask), dt);
}

/* Splits a "key<tabs> : value" line of /proc/cpuinfo in place: *key is the key without its
 * trailing blanks, the value is returned without its newline. NULL: not such a line. */
static const char *cpuinfo_split(char *line, const char **key) {
    char *colon = strchr(line, ':');
    if (colon == NULL)
        return NULL;
    char *end = colon;
    while (end > line && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    *end = '\0';
    *key = line;
    char *v = colon + 1 + strspn(colon + 1, " \t");
    v[strcspn(v, "\n")] = '\0';
    return v;
}

/* The size in KiB of cpu0's cache of this level and type ("Data", "Unified"), or 0. */
static long cache_kib(int level, const char *type) {
    for (int index = 0; index < 8; index++) {
        char path[96], buf[32];
        long lvl = -1, kib = 0;
        int match = 0;
        static const char *const files[] = {"level", "type", "size"};
        for (int f = 0; f < 3; f++) {
            snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/%s", index,
                     files[f]);
            FILE *fp = fopen(path, "r");
            if (fp == NULL)
                return 0; /* no such index: the list has ended */
            const int got = fgets(buf, sizeof buf, fp) != NULL;
            fclose(fp);
            if (!got)
                break;
            buf[strcspn(buf, "\n")] = '\0';
            if (f == 0)
                lvl = strtol(buf, NULL, 10);
            else if (f == 1)
                match = strcmp(buf, type) == 0;
            else /* "48K", "1024K", "32M" */
                kib = strtol(buf, NULL, 10) * (strchr(buf, 'M') != NULL ? 1024 : 1);
        }
        if (lvl == level && match)
            return kib;
    }
    return 0;
}

void bench_cpu_info(bench_run *run) {
    snprintf(run->cpu, sizeof run->cpu, "unknown");
    run->cpu_family = run->cpu_model = -1;
    run->cache_kib[0] = cache_kib(1, "Data");
    run->cache_kib[1] = cache_kib(2, "Unified");
    run->cache_kib[2] = cache_kib(3, "Unified");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f == NULL)
        return;
    char line[512];
    while (fgets(line, sizeof line, f) != NULL && strcmp(line, "\n") != 0) {
        const char *key; /* the first processor's block only: it ends at a blank line */
        const char *v = cpuinfo_split(line, &key);
        if (v == NULL)
            continue;
        if (strcmp(key, "model name") == 0)
            snprintf(run->cpu, sizeof run->cpu, "%s", v);
        else if (strcmp(key, "cpu family") == 0)
            run->cpu_family = (int)strtol(v, NULL, 10);
        else if (strcmp(key, "model") == 0)
            run->cpu_model = (int)strtol(v, NULL, 10);
    }
    fclose(f);
}

static double ratio(double x, double of) {
    return of > 0.0 ? x / of : NAN;
}

int bench_kernel_on_tiles(const char *kernel) {
    return strncmp(kernel, "flash-amx", 9) == 0;
}

/* GFLOP/s of a forward the AMX table takes over the higher tile peak (the unit's own rate,
 * where the run measured it), in %; NAN for another shape or where there is no tile peak. */
static double pct_tile(const bench_run *ri, const bench_result *r) {
    if (ri->backward || !bench_kernel_on_tiles(r->kernel))
        return NAN;
    return 100.0 * ratio(r->flops / r->t_med * 1e-9, ri->peak_tile_gflops);
}

double bench_peak_spread(double a, double b) {
    if (!(isfinite(a) && isfinite(b) && a > 0.0 && b > 0.0))
        return NAN;
    return fabs(a - b) / (a > b ? a : b);
}

/* Whether a spread of a run's start and end peaks says the run was disturbed. */
static int spread_high(double spread) {
    return isfinite(spread) && spread > BENCH_PEAK_SPREAD;
}

void bench_print_table(FILE *f, const bench_run *ri, const bench_result *rs, int n) {
    fprintf(f, "sdpa bench: sdpa %s, kernel %s (isa %s), %d thread%s, %s\n", sdpa_version(),
            ri->kernel, ri->isa, ri->n_threads, ri->n_threads == 1 ? "" : "s", ri->date);
    fprintf(f,
            "CPU: %s, family %d model %d, L1d %ld KiB, L2 %ld KiB, L3 %ld KiB; its best isa %s%s\n",
            ri->cpu, ri->cpu_family, ri->cpu_model, ri->cache_kib[0], ri->cache_kib[1],
            ri->cache_kib[2], ri->cpu_isa,
            strcmp(ri->cpu_isa, ri->isa) != 0 ? " (the kernels are capped: max_isa or SDPA_MAX_ISA)"
                                              : "");
    fprintf(f,
            "FP32 FMA peak (%s loop, %d thread%s): %.1f GFLOP/s at the start, %.1f at the end; "
            "DRAM read bandwidth (256 MiB) %.1f / %.1f GB/s\n",
            sdpa_isa_name(ri->peak_start.isa), ri->peak_start.n_threads,
            ri->peak_start.n_threads == 1 ? "" : "s", ri->peak_start.gflops, ri->peak_end.gflops,
            ri->peak_start.read_gbs, ri->peak_end.read_gbs);
    /* the tile unit has slow phases the FMA peak does not show (bench_peak_amx.c) */
    if (isfinite(ri->peak_start.tile_gflops) || isfinite(ri->peak_end.tile_gflops))
        fprintf(f,
                "AMX tile peak (TDPBF16PS, %d thread%s): %.0f GFLOP/s at the start, %.0f at the "
                "end\n",
                ri->peak_start.n_threads, ri->peak_start.n_threads == 1 ? "" : "s",
                ri->peak_start.tile_gflops, ri->peak_end.tile_gflops);
    fputc('\n', f);
    const double fma = bench_peak_spread(ri->peak_start.gflops, ri->peak_end.gflops);
    const double tile = bench_peak_spread(ri->peak_start.tile_gflops, ri->peak_end.tile_gflops);
    if (spread_high(fma) || spread_high(tile)) {
        char moved[160];
        if (spread_high(fma) && spread_high(tile))
            snprintf(moved, sizeof moved,
                     "the FMA peaks and the AMX tile peaks at the start and at the end differ by "
                     "%.1f %% and %.1f %% of the higher",
                     100.0 * fma, 100.0 * tile);
        else
            snprintf(moved, sizeof moved,
                     "the %s at the start and at the end differ by %.1f %% of the higher",
                     spread_high(fma) ? "FMA peaks" : "AMX tile peaks",
                     100.0 * (spread_high(fma) ? fma : tile));
        fprintf(f,
                "note: %s (more than %.0f %%): the machine was busy during part of this run, so "
                "its figures measure the machine as much as the code; run it again before "
                "trusting them\n\n",
                moved, 100.0 * BENCH_PEAK_SPREAD);
    }
    if (strcmp(sdpa_isa_name(ri->peak_start.isa), ri->isa) != 0)
        fprintf(f,
                "note: the peak loop (%s) is below the kernels (%s): %%peak is against a peak "
                "they can exceed\n\n",
                sdpa_isa_name(ri->peak_start.isa), ri->isa);
    if (ri->softcap > 0.0f)
        fprintf(f, "softcap %g at every shape\n", (double)ri->softcap);
    if (ri->alibi)
        fprintf(f, "ALiBi (the standard slopes) at every shape\n");
    if (ri->backward)
        fprintf(f, "sdpa_backward (FLOP = 2.5 x the forward's):\n");
    const int tiles = isfinite(ri->peak_tile_gflops); /* a %tile column */
    fprintf(f,
            "%3s %6s %6s %6s %5s %-10s %-9s %5s %10s %10s %10s %9s %6s%s %8s %8s %8s %6s %9s%s  "
            "%s\n",
            "B", "H", "Lq", "Lk", "D", "mask", "dtype", "reps", "median ms", "min ms", "max ms",
            "GFLOP/s", "%peak", tiles ? "  %tile" : "", "GB/s", "KV MB", "rd GB/s", "%bw",
            "extra MB", ri->backward ? "  bwd/fwd" : "", "kernel");
    for (int i = 0; i < n; i++) {
        const bench_result *r = &rs[i];
        char h[48], dt[16];
        heads_spec(&r->s, h, sizeof h);
        const double gflops = r->flops / r->t_med * 1e-9, gbs = r->kv_bytes / r->t_med * 1e-9;
        fprintf(f, "%3lld %6s %6lld %6lld %5lld %-10s %-9s %5d %10.3f %10.3f %10.3f %9.2f %5.1f%%",
                (long long)r->s.b, h, (long long)r->s.lq, (long long)r->s.lk, (long long)r->s.d,
                bench_mask_name(r->s.mask), bench_dtype_spec(&r->s, dt, sizeof dt), r->reps,
                r->t_med * 1e3, r->t_min * 1e3, r->t_max * 1e3, gflops,
                100.0 * ratio(gflops, ri->peak_gflops));
        if (tiles) {
            const double pt = pct_tile(ri, r);
            if (isfinite(pt))
                fprintf(f, " %5.1f%%", pt);
            else
                fprintf(f, " %6s", "-");
        }
        fprintf(f, " %8.2f %8.1f %8.2f %5.1f%% %9.3f", gbs, r->kv_bytes / 1e6, r->ws_gbs,
                100.0 * ratio(gbs, r->ws_gbs), (double)r->extra_bytes / 1e6);
        if (ri->backward)
            fprintf(f, " %8.2f", ratio(r->t_med, r->t_fwd_med));
        fprintf(f, "  %s\n", r->kernel);
    }
    fprintf(f,
            "\nGFLOP/s = %s*B*Hq*D*(visible pairs) / median; %%peak against the higher of the two "
            "FMA peaks%s%s.\n"
            "dtype = Q and O[/K and V]. GB/s = K and V bytes (KV MB, in the K/V dtype) / median.\n"
            "rd GB/s = %d thread%s reading that K and V buffer again and again, right before and "
            "right after the shape\n(the higher), so that a cache that fits in L2 or L3 is "
            "compared with the bandwidth of that level; %%bw = GB/s / rd GB/s.\n",
            ri->backward ? "10" : "4",
            tiles ? ", %tile (the shapes the AMX unit takes) against the higher of the two AMX "
                    "tile peaks"
                  : "",
            ri->backward ? "; bwd/fwd = backward median / forward median, timed alternately" : "",
            ri->n_threads, ri->n_threads == 1 ? "" : "s");
    if (ri->backward)
        fprintf(f, "kernel = the implementation that ran the shape's sdpa_backward (sdpa info's "
                   "backward line; the forward timed beside it may have run another).\n");
    else
        fprintf(f,
                "kernel = the implementation that ran the shape: %s, or the next one down for a "
                "problem it does not take.\n",
                ri->kernel);
}

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        const unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* A number, or null where it is not finite (JSON has no NaN or Inf). */
static void json_number(FILE *f, double x) {
    if (isfinite(x))
        fprintf(f, "%.9g", x);
    else
        fputs("null", f);
}

/* A count held in a double (exact below 2^53), written without an exponent. */
static void json_count(FILE *f, double x) {
    fprintf(f, "%.0f", x);
}

static void json_peak(FILE *f, const char *name, const bench_peak *p) {
    fprintf(f, "    \"%s\": {\"isa\": \"%s\", \"threads\": %d, \"fma_gflops\": ", name,
            sdpa_isa_name(p->isa), p->n_threads);
    json_number(f, p->gflops);
    fputs(", \"read_gbs\": ", f);
    json_number(f, p->read_gbs);
    fputs(", \"tile_gflops\": ", f); /* null where not measured */
    json_number(f, p->tile_gflops);
    fputs("}", f);
}

void bench_write_json(FILE *f, const bench_run *ri, const bench_result *rs, int n) {
    fputs("{\n  \"tool\": \"sdpa bench\",\n  \"sdpa_version\": ", f);
    json_string(f, sdpa_version());
    fputs(",\n  \"date\": ", f);
    json_string(f, ri->date);
    fputs(",\n  \"cpu_model\": ", f);
    json_string(f, ri->cpu);
    fprintf(f,
            ",\n  \"cpu_family\": %d,\n  \"cpu_model_number\": %d,\n  \"cache_kib\": "
            "{\"l1d\": %ld, \"l2\": %ld, \"l3\": %ld},\n  \"cpu_isa\": \"%s\"",
            ri->cpu_family, ri->cpu_model, ri->cache_kib[0], ri->cache_kib[1], ri->cache_kib[2],
            ri->cpu_isa);
    fprintf(f, ",\n  \"threads\": %d,\n  \"isa\": \"%s\",\n  \"kernel\": ", ri->n_threads, ri->isa);
    json_string(f, ri->kernel);
    fputs(",\n  ", f);
    fputs("\"describe\": ", f);
    json_string(f, ri->describe);
    fputs(",\n  \"preset\": ", f);
    if (ri->preset != NULL)
        json_string(f, ri->preset);
    else
        fputs("null", f);
    /* The run's dtypes where every shape has the same, else "mixed": each shape has its own. */
    const char *dt = n > 0 ? sdpa_dtype_name((sdpa_dtype)rs[0].s.dtype) : "f32";
    const char *kdt = n > 0 ? sdpa_dtype_name((sdpa_dtype)rs[0].s.kv_dtype) : "f32";
    for (int i = 1; i < n; i++) {
        if (rs[i].s.dtype != rs[0].s.dtype)
            dt = "mixed";
        if (rs[i].s.kv_dtype != rs[0].s.kv_dtype)
            kdt = "mixed";
    }
    fprintf(f,
            ",\n  \"dtype\": \"%s\",\n  \"kv_dtype\": \"%s\",\n  \"layout\": \"BHLD\",\n"
            "  \"reps_max\": %d,\n  \"warmup\": %d,\n  \"min_time_s\": ",
            dt, kdt, ri->reps_max, ri->warmup);
    json_number(f, ri->min_time);
    fprintf(f, ",\n  \"op\": \"%s\",\n  \"softcap\": ", ri->backward ? "backward" : "forward");
    json_number(f, (double)ri->softcap);
    fprintf(f, ",\n  \"alibi\": %s", ri->alibi ? "true" : "false");
    fputs(",\n  \"flop_convention\": \"4*B*Hq*D*visible_pairs: 2*D per visible (query, key) "
          "pair for Q K^T and 2*D for P V; softmax not counted; causal counts only the visible "
          "pairs; the backward counts 2.5 times that\",\n  \"bandwidth_convention\": \"gbs = "
          "kv_bytes (B*Hkv*Lk*D*2 elements of kv_dtype) / median; read_bw = the best rate of "
          "the run's threads reading the buffer of that K and V (read_bw.bytes), right before "
          "and right after the shape; pct_bandwidth = gbs / read_bw.gbs; pct_bandwidth_dram = "
          "gbs / peak.read_gbs (a 256 MiB buffer)\",\n  \"peak\": {\n",
          f);
    json_peak(f, "start", &ri->peak_start);
    fputs(",\n", f);
    json_peak(f, "end", &ri->peak_end);
    fputs(",\n    \"fma_gflops\": ", f);
    json_number(f, ri->peak_gflops);
    fputs(",\n    \"read_gbs\": ", f);
    json_number(f, ri->peak_gbs);
    const double fma = bench_peak_spread(ri->peak_start.gflops, ri->peak_end.gflops);
    const double tile = bench_peak_spread(ri->peak_start.tile_gflops, ri->peak_end.tile_gflops);
    fputs(",\n    \"fma_spread\": ", f);
    json_number(f, fma);
    fputs(",\n    \"tile_spread\": ", f);
    json_number(f, tile);
    fprintf(f, ",\n    \"disturbed\": %s",
            spread_high(fma) || spread_high(tile) ? "true" : "false");
    fputs("\n  },\n  \"shapes\": [", f);
    for (int i = 0; i < n; i++) {
        const bench_result *r = &rs[i];
        char spec[96];
        bench_shape_spec(&r->s, spec, sizeof spec);
        const double gflops = r->flops / r->t_med * 1e-9, gbs = r->kv_bytes / r->t_med * 1e-9;
        fprintf(f, "%s\n    {\"spec\": ", i ? "," : "");
        json_string(f, spec);
        fprintf(f,
                ", \"B\": %lld, \"Hq\": %lld, \"Hkv\": %lld, \"Lq\": %lld, \"Lk\": %lld, "
                "\"D\": %lld, \"mask\": \"%s\", \"causal\": %s, \"align\": \"%s\",\n"
                "     \"dtype\": \"%s\", \"kv_dtype\": \"%s\", \"visible_pairs\": %lld, "
                "\"flops\": ",
                (long long)r->s.b, (long long)r->s.hq, (long long)r->s.hkv, (long long)r->s.lq,
                (long long)r->s.lk, (long long)r->s.d, bench_mask_name(r->s.mask),
                r->s.mask != BENCH_MASK_NONE ? "true" : "false",
                r->s.mask == BENCH_MASK_CAUSAL_BR ? "bottom-right" : "top-left",
                sdpa_dtype_name((sdpa_dtype)r->s.dtype), sdpa_dtype_name((sdpa_dtype)r->s.kv_dtype),
                (long long)r->visible);
        json_count(f, r->flops);
        fputs(", \"kv_bytes\": ", f);
        json_count(f, r->kv_bytes);
        fprintf(f, ", \"warmup\": %d, \"reps\": %d, \"kernel\": ", r->warmup, r->reps);
        json_string(f, r->kernel);
        fputs(",\n     \"ms_median\": ", f);
        json_number(f, r->t_med * 1e3);
        fputs(", \"ms_min\": ", f);
        json_number(f, r->t_min * 1e3);
        fputs(", \"ms_max\": ", f);
        json_number(f, r->t_max * 1e3);
        fputs(", \"gflops\": ", f);
        json_number(f, gflops);
        fputs(", \"gflops_best\": ", f);
        json_number(f, r->flops / r->t_min * 1e-9);
        fputs(", \"pct_peak\": ", f);
        json_number(f, 100.0 * ratio(gflops, ri->peak_gflops));
        /* null where the unit was not timed, or for a shape it does not take */
        fputs(", \"pct_tile_peak\": ", f);
        json_number(f, pct_tile(ri, r));
        fputs(",\n     \"gbs\": ", f);
        json_number(f, gbs);
        fprintf(f, ", \"read_bw\": {\"bytes\": %zu, \"threads\": %d, \"before_gbs\": ", r->ws_bytes,
                ri->n_threads);
        json_number(f, r->ws_gbs_before);
        fputs(", \"after_gbs\": ", f);
        json_number(f, r->ws_gbs_after);
        fputs(", \"gbs\": ", f);
        json_number(f, r->ws_gbs);
        fputs("},\n     \"pct_bandwidth\": ", f);
        json_number(f, 100.0 * ratio(gbs, r->ws_gbs));
        fputs(", \"pct_bandwidth_dram\": ", f);
        json_number(f, 100.0 * ratio(gbs, ri->peak_gbs));
        fprintf(f,
                ", \"extra_bytes\": %zu, \"ctx_bytes\": %zu, \"allocs_per_call\": ", r->extra_bytes,
                r->ctx_bytes);
        json_number(f, r->allocs_per_call);
        if (ri->backward) {
            fputs(", \"ms_forward_median\": ", f);
            json_number(f, r->t_fwd_med * 1e3);
            fputs(", \"bwd_over_fwd\": ", f);
            json_number(f, ratio(r->t_med, r->t_fwd_med));
        }
        fputs("}", f);
    }
    fputs("\n  ]\n}\n", f);
}
