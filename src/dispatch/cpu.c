/*
 * cpu.c — CPUID + XGETBV probe (see cpu.h). On other architectures everything is absent and
 * the generic level is chosen.
 */
#include "cpu.h"

#include <ctype.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

void sdpa__cpu_probe(sdpa__cpu *cpu) {
    memset(cpu, 0, sizeof *cpu);
    cpu->best = SDPA_ISA_GENERIC;
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return;
    const int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
    const int fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx)
        return;
    const uint64_t xcr0 = xgetbv0();
    const int ymm_os = (xcr0 & 0x6) == 0x6;          /* XMM and YMM state */
    const int zmm_os = (xcr0 & 0xe6) == 0xe6;        /* + opmask, ZMM_Hi256, Hi16_ZMM */
    const int tile_os = (xcr0 & 0x60000) == 0x60000; /* XTILECFG, XTILEDATA */
    if (!ymm_os)
        return;
    unsigned max_leaf = __get_cpuid_max(0, NULL);
    unsigned b7 = 0, c7 = 0, d7 = 0, a71 = 0;
    if (max_leaf >= 7) {
        __cpuid_count(7, 0, a, b7, c7, d7);
        unsigned b71, c71, d71;
        __cpuid_count(7, 1, a71, b71, c71, d71);
        (void)b71, (void)c71, (void)d71;
    }
    cpu->fma = fma;
    cpu->f16c = f16c;
    cpu->avx2 = (b7 >> 5) & 1;
    if (zmm_os) {
        cpu->avx512f = (b7 >> 16) & 1;
        cpu->avx512dq = (b7 >> 17) & 1;
        cpu->avx512bw = (b7 >> 30) & 1;
        cpu->avx512vl = (b7 >> 31) & 1;
        cpu->avx512_fp16 = (d7 >> 23) & 1;
        cpu->avx512_bf16 = (a71 >> 5) & 1;
    }
    if (tile_os) {
        cpu->amx_bf16 = (d7 >> 22) & 1;
        cpu->amx_tile = (d7 >> 24) & 1;
    }
    if (cpu->avx2 && cpu->fma)
        cpu->best = SDPA_ISA_AVX2;
    if (cpu->best == SDPA_ISA_AVX2 && cpu->avx512f && cpu->avx512bw && cpu->avx512dq &&
        cpu->avx512vl)
        cpu->best = SDPA_ISA_AVX512;
    if (cpu->best == SDPA_ISA_AVX512 && cpu->amx_tile && cpu->amx_bf16)
        cpu->best = SDPA_ISA_AMX;
}
#else
void sdpa__cpu_probe(sdpa__cpu *cpu) {
    memset(cpu, 0, sizeof *cpu);
    cpu->best = SDPA_ISA_GENERIC;
}
#endif

sdpa_isa sdpa__parse_isa(const char *s, int *unknown) {
    static const struct {
        const char *name;
        sdpa_isa isa;
    } names[] = {{"generic", SDPA_ISA_GENERIC},
                 {"avx2", SDPA_ISA_AVX2},
                 {"avx512", SDPA_ISA_AVX512},
                 {"amx", SDPA_ISA_AMX}};
    *unknown = 0;
    if (s == NULL || s[0] == '\0')
        return SDPA_ISA_AUTO;
    for (size_t n = 0; n < sizeof names / sizeof names[0]; n++) {
        const char *a = names[n].name, *b = s;
        while (*a && *b && tolower((unsigned char)*b) == *a)
            a++, b++;
        if (*a == '\0' && *b == '\0')
            return names[n].isa;
    }
    *unknown = 1;
    return SDPA_ISA_AUTO;
}
