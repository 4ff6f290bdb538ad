/*
 * cpu.c — CPUID + XGETBV probe and the AMX tile permission (see cpu.h). On other
 * architectures every feature is absent and the generic level is chosen.
 */
#define _DEFAULT_SOURCE /* syscall() */
#include "cpu.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
/* arch_prctl codes and the tile data component of the XSAVE state (asm/prctl.h) */
enum { ARCH_GET_XCOMP_PERM_ = 0x1022, ARCH_REQ_XCOMP_PERM_ = 0x1023, XTILEDATA_ = 18 };

static int tiles_permitted(void) {
    unsigned long bits = 0;
    if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM_, &bits) != 0)
        return 0;
    return (bits >> XTILEDATA_) & 1;
}

void sdpa__cpu_request_tiles(sdpa__cpu *cpu) {
    if (!(cpu->features & SDPA__CPU_AMX_TILE) || (cpu->features & SDPA__CPU_AMX_PERM))
        return;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM_, (unsigned long)XTILEDATA_) == 0 &&
        tiles_permitted())
        cpu->features |= SDPA__CPU_AMX_PERM;
}
#else
static int tiles_permitted(void) {
    return 0;
}

void sdpa__cpu_request_tiles(sdpa__cpu *cpu) {
    (void)cpu;
}
#endif

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static uint32_t bit(unsigned reg, int n, uint32_t feature) {
    return ((reg >> n) & 1) ? feature : 0;
}

void sdpa__cpu_probe(sdpa__cpu *cpu) {
    memset(cpu, 0, sizeof *cpu);
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return;
    const int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
    if (!osxsave || !avx)
        return;
    const uint64_t xcr0 = xgetbv0();
    const int ymm_os = (xcr0 & 0x6) == 0x6;          /* XMM and YMM state */
    const int zmm_os = (xcr0 & 0xe6) == 0xe6;        /* + opmask, ZMM_Hi256, Hi16_ZMM */
    const int tile_os = (xcr0 & 0x60000) == 0x60000; /* XTILECFG, XTILEDATA */
    if (!ymm_os)
        return;
    unsigned b7 = 0, c7 = 0, d7 = 0, a71 = 0;
    if (__get_cpuid_max(0, NULL) >= 7) {
        __cpuid_count(7, 0, a, b7, c7, d7);
        unsigned b71, c71, d71;
        __cpuid_count(7, 1, a71, b71, c71, d71);
        (void)b71, (void)c71, (void)d71;
    }
    uint32_t f =
        bit(c, 12, SDPA__CPU_FMA) | bit(c, 29, SDPA__CPU_F16C) | bit(b7, 5, SDPA__CPU_AVX2);
    if (zmm_os)
        f |= bit(b7, 16, SDPA__CPU_AVX512F) | bit(b7, 17, SDPA__CPU_AVX512DQ) |
             bit(b7, 30, SDPA__CPU_AVX512BW) | bit(b7, 31, SDPA__CPU_AVX512VL) |
             bit(d7, 23, SDPA__CPU_AVX512_FP16) | bit(a71, 5, SDPA__CPU_AVX512_BF16);
    if (tile_os) {
        f |= bit(d7, 22, SDPA__CPU_AMX_BF16) | bit(d7, 24, SDPA__CPU_AMX_TILE);
        if ((f & SDPA__CPU_AMX_TILE) && tiles_permitted())
            f |= SDPA__CPU_AMX_PERM;
    }
    cpu->features = f;
}
#else
void sdpa__cpu_probe(sdpa__cpu *cpu) {
    memset(cpu, 0, sizeof *cpu);
}

void sdpa__cpu_request_tiles(sdpa__cpu *cpu) {
    (void)cpu;
}
#endif

sdpa_isa sdpa__cpu_level(uint32_t features) {
    /* AMX counts as a level once the tiles exist, whether or not the permission was asked */
    const uint32_t amx = SDPA__NEEDS_AMX & ~(uint32_t)SDPA__CPU_AMX_PERM;
    if ((features & amx) == amx)
        return SDPA_ISA_AMX;
    if ((features & SDPA__NEEDS_AVX512) == SDPA__NEEDS_AVX512)
        return SDPA_ISA_AVX512;
    if ((features & SDPA__NEEDS_AVX2) == SDPA__NEEDS_AVX2)
        return SDPA_ISA_AVX2;
    return SDPA_ISA_GENERIC;
}

void sdpa__cpu_feature_names(uint32_t features, char *buf, size_t cap) {
    static const char *const names[] = {"avx2",        "fma",      "f16c",     "avx512f",
                                        "avx512bw",    "avx512dq", "avx512vl", "avx512_bf16",
                                        "avx512_fp16", "amx_tile", "amx_bf16", "amx_perm"};
    size_t len = 0;
    buf[0] = '\0';
    for (size_t n = 0; n < sizeof names / sizeof names[0]; n++) {
        if (!(features & (1u << n)) || len + 1 >= cap)
            continue;
        const int w = snprintf(buf + len, cap - len, "%s%s", len > 0 ? " " : "", names[n]);
        len = w < 0 ? len : len + (size_t)w;
    }
    if (buf[0] == '\0')
        snprintf(buf, cap, "(none)");
}

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
