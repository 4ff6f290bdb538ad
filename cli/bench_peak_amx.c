/*
 * bench_peak_amx.c — the tile loop of the machine probe (bench.h): the rate of the AMX unit's
 * TDPBF16PS, which the bf16 forward of flash-amx spends its products on. This file alone is
 * compiled with -mamx-tile -mamx-bf16, and only where the library's AMX table is built with
 * the real instructions (not SDPA_AMX_EMULATE); bench_peak.c calls it only when the library's
 * kernels run at the AMX level (and a shape is a bf16 forward), so the CPU has the unit and
 * Linux has granted this process its tile data (sdpa_ctx_create asks).
 *
 * The FMA peak does not stand for the unit: on a shared Intel Xeon (model 207) the unit of
 * one vCPU ran 2.2-2.4 times slower for minutes at a time while the FMAs kept their rate
 * (docs/benchmarks.md, 2026-11-28, 18:10), so a bf16 figure is read beside this one.
 *
 * Four accumulator tiles take one product each per iteration from two A and two B tiles
 * loaded once (the 2 x 2 blocking of the table's scores): independent, so the loop runs at
 * the unit's throughput. Every value is a bf16 1.0 or 2^-20, so each product adds 2^-15 to an
 * accumulator element: no subnormal, no overflow for any count the probe runs.
 */
#include "bench.h"

#include <immintrin.h>
#include <string.h>

/* The tile configuration (palette 1): tiles 0-7 of 16 rows of 64 bytes. The library's AMX
 * table has the same (src/kernels/amx/tile_config.h); the command keeps to the public header. */
typedef struct tile_config {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

enum { TROWS = 16, TBYTES = 64 };

float bench_tdp_amx(int64_t iters, int64_t *flops_per_iter) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.colsb[t] = TBYTES;
        c.rows[t] = TROWS;
    }
    _Alignas(64) uint16_t a[TROWS * TBYTES / 2], b[TROWS * TBYTES / 2];
    for (int e = 0; e < TROWS * TBYTES / 2; e++) {
        a[e] = 0x3f80; /* 1.0 */
        b[e] = 0x3580; /* 2^-20 */
    }
    _Alignas(64) float out[TROWS * TBYTES / 4];
    /* (GCC 12's _tile_loadconfig says it reads only a pointer's size of c: the barrier, given
     * c's address, keeps the stores of colsb and rows, src/kernels/amx/tile_config.h) */
    __asm__ volatile("" : : "r"(&c) : "memory");
    _tile_loadconfig(&c);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    /* (GCC 12's _tile_loadd does not say it reads memory: the barrier keeps a and b filled) */
    __asm__ volatile("" ::: "memory");
    _tile_loadd(4, a, TBYTES);
    _tile_loadd(5, a, TBYTES);
    _tile_loadd(6, b, TBYTES);
    _tile_loadd(7, b, TBYTES);
    for (int64_t i = 0; i < iters; i++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, out, TBYTES);
    _tile_release();
    /* 4 products x 16 x 16 outputs x 32 multiply-adds x 2 FLOP */
    *flops_per_iter = 4 * TROWS * TROWS * 32 * 2;
    return out[0];
}
