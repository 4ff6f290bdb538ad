/*
 * cpu.h — what the CPU and the operating system let us use. The probe asks CPUID for the
 * instructions and XGETBV for whether the OS saves the matching registers: an instruction set
 * the OS does not save (a hypervisor that hides XSAVE state) is reported as absent.
 */
#ifndef SDPA_CPU_H
#define SDPA_CPU_H

#include "sdpa.h"

typedef struct sdpa__cpu {
    int avx2, fma, f16c;                       /* with OS support for YMM */
    int avx512f, avx512bw, avx512dq, avx512vl; /* with OS support for ZMM and opmasks */
    int avx512_bf16, avx512_fp16;
    int amx_tile, amx_bf16; /* CPUID and XCR0 tile state */
    sdpa_isa best;          /* highest sdpa_isa all of the above allow */
} sdpa__cpu;

/* Probes the CPU. Pure: no global state, cheap enough to call once per context. */
void sdpa__cpu_probe(sdpa__cpu *cpu);

/* Parses an SDPA_MAX_ISA value: "generic", "avx2", "avx512" or "amx" (case-insensitive).
 * @return the level, or SDPA_ISA_AUTO for NULL, "", or anything unknown (*unknown = 1). */
sdpa_isa sdpa__parse_isa(const char *s, int *unknown);

#endif /* SDPA_CPU_H */
