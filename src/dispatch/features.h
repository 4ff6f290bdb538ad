/*
 * features.h — the CPU features an implementation may require, as bits of one mask.
 *
 * Levels (sdpa_isa) stack: each includes the one below. Features do not: F16C, AVX512-BF16,
 * AVX512-FP16 and the AMX tiles come in many combinations, so an implementation states the
 * exact set it needs and dispatch compares masks. A bit is set by the probe (cpu.c) only when
 * the CPU has the instructions and the OS saves the registers they use (XGETBV), and
 * SDPA__CPU_AMX_PERM only once Linux has granted this process the tile data state. This
 * header needs nothing: the micro-kernel ABI includes it.
 */
#ifndef SDPA_FEATURES_H
#define SDPA_FEATURES_H

enum sdpa__cpu_feature {
    SDPA__CPU_AVX2 = 1u << 0,
    SDPA__CPU_FMA = 1u << 1,
    SDPA__CPU_F16C = 1u << 2,
    SDPA__CPU_AVX512F = 1u << 3,
    SDPA__CPU_AVX512BW = 1u << 4,
    SDPA__CPU_AVX512DQ = 1u << 5,
    SDPA__CPU_AVX512VL = 1u << 6,
    SDPA__CPU_AVX512_BF16 = 1u << 7,
    SDPA__CPU_AVX512_FP16 = 1u << 8,
    SDPA__CPU_AMX_TILE = 1u << 9,
    SDPA__CPU_AMX_BF16 = 1u << 10,
    SDPA__CPU_AMX_PERM = 1u << 11 /* the OS let this process use the tile data state */
};

/* The sets the tables of this build require. */
#define SDPA__NEEDS_AVX2 (SDPA__CPU_AVX2 | SDPA__CPU_FMA | SDPA__CPU_F16C)
#define SDPA__NEEDS_AVX512                                                                         \
    (SDPA__NEEDS_AVX2 | SDPA__CPU_AVX512F | SDPA__CPU_AVX512BW | SDPA__CPU_AVX512DQ |              \
     SDPA__CPU_AVX512VL)
#define SDPA__NEEDS_AMX                                                                            \
    (SDPA__NEEDS_AVX512 | SDPA__CPU_AMX_TILE | SDPA__CPU_AMX_BF16 | SDPA__CPU_AMX_PERM)

#endif /* SDPA_FEATURES_H */
