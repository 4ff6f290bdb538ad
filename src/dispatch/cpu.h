/*
 * cpu.h — what the CPU and the operating system let us use. The probe asks CPUID for the
 * instructions and XGETBV for whether the OS saves the matching registers: an instruction set
 * the OS does not save (a hypervisor that hides XSAVE state) is reported as absent. The AMX
 * tile data state needs one more step on Linux, a permission the process must request; the
 * probe only reads it, and sdpa__cpu_request_tiles asks for it when a table needs it.
 */
#ifndef SDPA_CPU_H
#define SDPA_CPU_H

#include "features.h"
#include "sdpa.h"

#include <stdint.h>

typedef struct sdpa__cpu {
    uint32_t features; /* SDPA__CPU_* bits */
} sdpa__cpu;

/* Probes the CPU. Pure apart from reading the process's tile permission: no global state,
 * cheap enough to call once per context. */
void sdpa__cpu_probe(sdpa__cpu *cpu);

/* Asks the OS for the AMX tile data state (Linux: arch_prctl ARCH_REQ_XCOMP_PERM) when the
 * CPU has tiles and the permission is not yet granted; sets SDPA__CPU_AMX_PERM in cpu on
 * success. The permission belongs to the process and is never given back, so this is called
 * only when a table that needs it could be chosen. */
void sdpa__cpu_request_tiles(sdpa__cpu *cpu);

/* The highest level whose features are all in `features` (SDPA_ISA_GENERIC at least). */
sdpa_isa sdpa__cpu_level(uint32_t features);

/* Writes the names of the features in `features`, separated by spaces, into buf (always
 * terminated). */
void sdpa__cpu_feature_names(uint32_t features, char *buf, size_t cap);

/* Parses an SDPA_MAX_ISA value: "generic", "avx2", "avx512" or "amx" (case-insensitive).
 * @return the level, or SDPA_ISA_AUTO for NULL, "", or anything unknown (*unknown = 1). */
sdpa_isa sdpa__parse_isa(const char *s, int *unknown);

#endif /* SDPA_CPU_H */
