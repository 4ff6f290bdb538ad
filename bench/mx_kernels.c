/*
 * mx_kernels.c -- cycles of the bf16 forward's steps on a matrix unit (flash-amx), each called
 * straight from the tables on slices of one head small enough to stay in L2: the unit's
 * scores (mx->qk, its sums left unscaled), the vector table's softmax_bf16p (which scales
 * them), and P V (mx->pv), for a task of 256 rows, as
 * flash.c calls them for one query head of an unmasked problem: slices of 128 keys where D <=
 * 64, else 64, and the scores' stride 272 rows (MX_KEY_TILE and the padded stride of
 * sdpa__flash_plan_init in flash_plan.c; the packed Q rows take the same stride, as there:
 * before 2026-11-29 they took 256, which put each feature pair's rows 1 KiB apart, into a few
 * L1 sets, and made pack_q look six times slower than it ran in the library), unless the last
 * two arguments say otherwise (64 and 256 are what flash.c did before 2026-11-28, 13:30 UTC,
 * and all an older library takes). What each step costs alone says what bounds the whole (x86
 * only: it counts TSC cycles; the TSC rate is /proc/cpuinfo's "cpu MHz" on most Linux guests).
 *
 *     cc -O2 -Iinclude bench/mx_kernels.c build/libsdpa.a -lm -lpthread -o /tmp/mk
 *     /tmp/mk [keys 1024] [reps 200] [D 128] [slice keys] [score stride]
 *
 * On a CPU with AMX it asks Linux for the tile data (as sdpa_ctx_create does); in a
 * -DSDPA_AMX_EMULATE build it times the emulation (the vector steps are the real ones). The
 * figures are TSC cycles per key per 16 query rows (one row block of the unit): the unit's
 * part of qk and pv is (D / 512) TDPBF16PS each. It prints the mean over the reps and the
 * fastest rep's figures, and the unit's own rate right before and after the reps: on a
 * shared machine the unit has slow phases (2.2-2.4 times slower, docs/benchmarks.md), so
 * compare builds by the fastest rep, running them in turn pinned to a CPU whose unit is fast.
 * Not a test: nothing is checked but that it runs.
 */
#include "../src/kernels/amx/tile_config.h"
#include "../src/kernels/ukernels.h"

#include "sdpa.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <immintrin.h>
#include <x86intrin.h> /* __rdtsc */

enum { ROWS = 256 };

/* TSC cycles per TDPBF16PS on this thread's unit now: four independent products a step
 * (about 15 on an Intel Xeon, model 207, at full rate; 2.2-2.4 times that in the slow phases
 * a shared machine's unit has, which the figures then carry: docs/benchmarks.md). Only where
 * the table runs the real instructions (not an emulated build). */
__attribute__((target("amx-tile,amx-bf16"))) static double tdp_cycles(void) {
    enum { STEPS = 20000 };
    _Alignas(64) static uint16_t a[16 * 32], b[16 * 32];
    for (int e = 0; e < 16 * 32; e++) {
        a[e] = 0x3f80; /* 1.0 */
        b[e] = 0x3580; /* 2^-20: no subnormal, no overflow */
    }
    sdpa__tile_config c;
    sdpa__tile_config_full(&c);
    _tile_loadconfig(&c);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    __asm__ volatile("" ::: "memory"); /* (GCC 12's _tile_loadd does not say it reads memory) */
    _tile_loadd(4, a, 64);
    _tile_loadd(5, a, 64);
    _tile_loadd(6, b, 64);
    _tile_loadd(7, b, 64);
    const uint64_t t0 = __rdtsc();
    for (int s = 0; s < STEPS; s++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    const uint64_t t1 = __rdtsc();
    _tile_release();
    return (double)(t1 - t0) / (4.0 * STEPS);
}

static uint16_t bf16_of(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

int main(int argc, char **argv) {
    const long nkeys = argc > 1 ? atol(argv[1]) : 1024, reps = argc > 2 ? atol(argv[2]) : 200;
    const long d = argc > 3 ? atol(argv[3]) : 128;
    const long slice = argc > 4 ? atol(argv[4]) : d <= 64 ? 128 : 64;
    const long lds = argc > 5 ? atol(argv[5]) : ROWS + 16;
    if (slice < 16 || slice > 128 || slice % 16 != 0 || nkeys < slice || nkeys % slice != 0 ||
        reps < 1 || d < 32 || d > 256 || d % 32 != 0 || lds < ROWS || lds % 16 != 0) {
        fprintf(stderr,
                "mx_kernels: slice keys 16..128 (a multiple of 16), keys a positive multiple "
                "of them (%ld); D 32..256, a multiple of 32; the score stride at least %d rows, "
                "a multiple of 16\n",
                slice, ROWS);
        return 2;
    }
    /* a context asks Linux for the tile data where the CPU has AMX, and says what runs */
    sdpa_ctx *ctx;
    if (sdpa_ctx_create(NULL, &ctx) != SDPA_OK)
        return 1;
    if (sdpa_ctx_isa(ctx) != SDPA_ISA_AMX) {
        fprintf(stderr, "mx_kernels: no AMX table runs here (%s)\n", sdpa_ctx_kernel(ctx));
        return 2;
    }
    const sdpa__mx_kernels *mx = &sdpa__mx_amx;
    const sdpa__ukernels *uk = &sdpa__uk_avx512;
    if (uk->softmax_bf16p == NULL) {
        fprintf(stderr, "mx_kernels: the %s table has no softmax_bf16p\n", uk->name);
        return 2;
    }
    const size_t n = (size_t)nkeys * (size_t)d;
    uint16_t *k = aligned_alloc(64, n * 2), *v = aligned_alloc(64, n * 2);
    uint16_t *qrows = aligned_alloc(64, (size_t)ROWS * (size_t)d * 2);
    const void **rows = malloc(ROWS * sizeof *rows);
    uint32_t *qt = aligned_alloc(64, ((size_t)d / 2 + 1) * (size_t)lds * 4);
    float *s = aligned_alloc(64, (size_t)slice * (size_t)lds * sizeof(float));
    float *o = aligned_alloc(64, (size_t)ROWS * (size_t)d * sizeof(float));
    float m[ROWS], l[ROWS], alpha[ROWS];
    if (k == NULL || v == NULL || qrows == NULL || rows == NULL || qt == NULL || s == NULL ||
        o == NULL)
        return 1;
    uint32_t seed = 1;
    for (size_t e = 0; e < n; e++) {
        seed = seed * 1664525u + 1013904223u;
        k[e] = bf16_of((float)(int)(seed >> 8 & 0xffff) / 32768.0f - 1.0f);
        seed = seed * 1664525u + 1013904223u;
        v[e] = bf16_of((float)(int)(seed >> 8 & 0xffff) / 32768.0f - 1.0f);
    }
    for (long r = 0; r < ROWS; r++) {
        for (long c = 0; c < d; c++) {
            seed = seed * 1664525u + 1013904223u;
            qrows[r * d + c] = bf16_of((float)(int)(seed >> 8 & 0xffff) / 32768.0f - 1.0f);
        }
        rows[r] = qrows + r * d;
    }
    const float scale = 0.0883883f;
    /* each step's cycles summed over a rep's slices; the mean over the reps and the fastest
     * rep (on a shared machine the fastest is the stable figure: another tenant only adds) */
    const int unit = strcmp(mx->name, "amx") == 0; /* the real unit, not an emulation */
    const double tdp_before = unit ? tdp_cycles() : 0.0;
    uint64_t t_pack = 0, sum[3] = {0, 0, 0}, best[3] = {UINT64_MAX, UINT64_MAX, UINT64_MAX};
    for (long rep = 0; rep < reps; rep++) {
        uint64_t t0 = __rdtsc();
        mx->pack_q(ROWS, d, rows, qt, lds);
        t_pack += __rdtsc() - t0;
        for (long r = 0; r < ROWS; r++) {
            m[r] = -1e30f;
            l[r] = 0.0f;
        }
        memset(o, 0, (size_t)ROWS * (size_t)d * sizeof *o);
        uint64_t step[3] = {0, 0, 0};
        for (long j0 = 0; j0 < nkeys; j0 += slice) {
            t0 = __rdtsc();
            /* as flash.c takes a whole slice: the unit's sums unscaled, the softmax scales */
            mx->qk(slice, ROWS, d, k + j0 * d, d, qt, lds, 1.0f, s, lds);
            const uint64_t t1 = __rdtsc();
            uk->softmax_bf16p(slice, ROWS, s, lds, scale, m, l, alpha);
            const uint64_t t2 = __rdtsc();
            mx->pv(slice, ROWS, d, s, lds, alpha, v + j0 * d, d, o, d);
            const uint64_t t3 = __rdtsc();
            step[0] += t1 - t0;
            step[1] += t2 - t1;
            step[2] += t3 - t2;
        }
        for (int i = 0; i < 3; i++) {
            sum[i] += step[i];
            best[i] = step[i] < best[i] ? step[i] : best[i];
        }
    }
    const double tdp_after = unit ? tdp_cycles() : 0.0;
    const double units = (double)nkeys * (ROWS / 16); /* key x 16 rows, one rep */
    printf("%s (%s), D = %ld, %ld keys in slices of %ld, %d rows (score stride %ld), %ld reps: "
           "TSC cycles per key per 16 rows\n",
           mx->name, sdpa_ctx_kernel(ctx), d, nkeys, slice, ROWS, lds, reps);
    printf("  mean:         qk %.2f   softmax %.2f   pv %.2f   total %.2f\n",
           (double)sum[0] / units / (double)reps, (double)sum[1] / units / (double)reps,
           (double)sum[2] / units / (double)reps,
           (double)(sum[0] + sum[1] + sum[2]) / units / (double)reps);
    printf("  fastest rep:  qk %.2f   softmax %.2f   pv %.2f   total %.2f\n",
           (double)best[0] / units, (double)best[1] / units, (double)best[2] / units,
           (double)(best[0] + best[1] + best[2]) / units);
    printf("  (pack_q %.0f per task)\n", (double)t_pack / (double)reps);
    if (unit) {
        /* qk and pv each take d / 512 TDPBF16PS per key and 16 rows */
        const double slow = tdp_before > tdp_after ? tdp_before : tdp_after;
        printf("  the unit: %.1f TSC cycles per TDPBF16PS before the reps, %.1f after, so its\n"
               "  products alone take %.2f each for qk and pv%s\n",
               tdp_before, tdp_after, tdp_before * (double)d / 512.0,
               slow > 1.3 * (tdp_before < tdp_after ? tdp_before : tdp_after) || slow > 20.0
                   ? "\n  (a slow phase of the unit, or a change of one: run again, pinned with "
                     "taskset to a CPU whose unit is fast)"
                   : "");
    }
    printf("  (o[0] = %g, so that nothing is optimised away)\n", (double)o[0]);
    sdpa_ctx_destroy(ctx);
    return 0;
}
