/*
 * tile_config.h — the AMX tile configuration the table uses (LDTILECFG's 64-byte operand,
 * palette 1): tiles 0-7 of 16 rows of 64 bytes each. Shared by the AMX table and
 * bench/isa_rates.c. (The command's probe, cli/bench_peak_amx.c, keeps its own copy: the
 * command uses the library through its public header only.)
 */
#ifndef SDPA_TILE_CONFIG_H
#define SDPA_TILE_CONFIG_H

#include <stdint.h>
#include <string.h>

typedef struct sdpa__tile_config {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16]; /* bytes per row of tiles 0-15 */
    uint8_t rows[16];   /* rows of tiles 0-15 */
} sdpa__tile_config;

/* Every one of the 8 tiles 16 rows of 64 bytes: 16 x 32 bf16, or 16 x 16 f32. */
static inline void sdpa__tile_config_full(sdpa__tile_config *c) {
    memset(c, 0, sizeof *c);
    c->palette = 1;
    for (int t = 0; t < 8; t++) {
        c->colsb[t] = 64;
        c->rows[t] = 16;
    }
    /* GCC 12's _tile_loadconfig tells the compiler that LDTILECFG reads only a pointer's
     * size of its operand, so where this is inlined beside it the stores of colsb and rows
     * may be dropped as dead: the tiles then stay unconfigured and the first tile instruction
     * faults (it did in bench/isa_rates.c). An empty asm that is given the address and may
     * read memory keeps every store. */
    __asm__ volatile("" : : "r"(c) : "memory");
}

#endif /* SDPA_TILE_CONFIG_H */
