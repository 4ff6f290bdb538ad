/*
 * isa_rates.c -- how fast this CPU runs the instructions a half-precision kernel could be built
 * from: TSC cycles per instruction, issued back to back with no dependency between them but
 * their own accumulator (24 of them, more than latency x throughput needs), so that each
 * figure is the instruction's throughput. It answers which of them is worth building a path
 * on (issue 12): VDPBF16PS does 32 multiply-adds where VFMADD231PS does 16, so it wins only if
 * it issues at more than half the FMA's rate; AVX512-FP16's VFMADD231PH sums in f16 (the
 * accuracy rule wants f32 sums), so it is timed for scale only. On a CPU with AMX (and Linux's
 * permission for its tile data, asked for as sdpa_ctx_create does) it also times TDPBF16PS,
 * TILELOADD and TILESTORED from and to L1, each alone, and the 2 x 2 tile pattern of the AMX
 * table's scores (per step: 2 A and 2 B loads, 4 products) for a reduction of 128 features,
 * with and without the 4 stores that end each block, and how many FMAs a step of 4 products
 * hides: 4 TDPBF16PS and 64 or 128 FMAs a step, against each alone; then 128 adds, multiplies,
 * maxes or in-lane shuffles a step, which says which kinds of vector work run alongside the
 * unit's products (x86 only; the TSC rate is /proc/cpuinfo's "cpu MHz" on most Linux guests).
 *
 *     cc -O2 -Iinclude bench/isa_rates.c build/libsdpa.a -lm -lpthread -o /tmp/isa_rates
 *     /tmp/isa_rates [millions of instructions per figure, default 60]
 *     /tmp/isa_rates --unit    (TDPBF16PS's TSC cycles now, alone: bench/on_fast_unit.sh)
 *
 * Instructions the CPU (or the OS) lacks are reported as skipped. Each figure is the fastest
 * of three runs. Not a test: nothing is checked but that it runs.
 */
#include "../src/dispatch/cpu.h"
#include "../src/kernels/amx/tile_config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <x86intrin.h> /* __rdtsc */

#include <immintrin.h>

/* A list of the 24 accumulators' numbers, applied to a macro. (Kept out of clang-format,
 * which moves one more item to a line of its own on every pass over this macro.) */
/* clang-format off */
#define EACH24(M)                                                                              \
    M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11)                              \
    M(12) M(13) M(14) M(15) M(16) M(17) M(18) M(19) M(20) M(21) M(22) M(23)
/* clang-format on */

/* The body of a timed loop: 24 accumulators a##i, each updated by OP(a##i) per step. */
#define TIME24(n, DECL, OP, SUM)                                                                   \
    do {                                                                                           \
        EACH24(DECL)                                                                               \
        const uint64_t t0 = __rdtsc();                                                             \
        for (long step = 0; step < (n) / 24; step++) {                                             \
            EACH24(OP)                                                                             \
        }                                                                                          \
        const uint64_t t1 = __rdtsc();                                                             \
        EACH24(SUM)                                                                                \
        return (double)(t1 - t0) / (double)((n) / 24 * 24);                                        \
    } while (0)

static volatile float sink; /* the results go here, so that nothing is optimised away */

__attribute__((target("avx512f,fma"))) static double rate_fma(long n) {
    __m512 x = _mm512_set1_ps(1.0f);
    const __m512 y = _mm512_set1_ps(0x1p-30f);
    __asm__("" : "+v"(x)); /* (an unknown x: a compiler may not make the FMAs adds) */
#define DECL_F(i) __m512 a##i = _mm512_set1_ps((float)(i));
#define OP_F(i) a##i = _mm512_fmadd_ps(a##i, x, y);
#define SUM_F(i) sink += _mm512_reduce_add_ps(a##i);
    TIME24(n, DECL_F, OP_F, SUM_F);
}

__attribute__((target("avx512f,avx512bf16"))) static double rate_dpbf16(long n) {
    const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3000);
#define OP_B(i) a##i = _mm512_dpbf16_ps(a##i, x, y);
    TIME24(n, DECL_F, OP_B, SUM_F);
}

/* The widening of a half-precision cache, as the decode kernels do it: 16 values loaded from
 * L1 (a buffer the loop walks, so that no load or conversion is the same from one step to
 * the next and none can be hoisted out of the loop), widened to f32 -- f16 by VCVTPH2PS
 * (what = 1), bf16 by VPMOVZXWD and a 16-bit shift (what = 2) -- and fed to an FMA, as
 * against the same FMA with its f32 operand loaded (what = 0). */
static _Alignas(64) uint16_t half_src[8 * 24 * 32];

/* 16 values at p (64-byte aligned) as f32: f32 loaded (what = 0), f16 (1) or bf16 (2) widened */
__attribute__((target("avx512f"), always_inline)) static inline __m512 widen(int what,
                                                                             const uint16_t *p) {
    if (what == 0)
        return _mm512_load_ps(p);
    const __m256i h = _mm256_load_si256((const __m256i *)p);
    if (what == 1)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

__attribute__((target("avx512f,fma"), always_inline)) static inline double rate_widen(int what,
                                                                                      long n) {
    const __m512 x = _mm512_set1_ps(1.0f);
    const uint16_t *src = half_src;
#define OP_W(i)                                                                                    \
    a##i = _mm512_fmadd_ps(widen(what, src + (i)*32), x, a##i);                                    \
    if ((i) == 23)                                                                                 \
        src = half_src + (step & 7) * 24 * 32;
    TIME24(n, DECL_F, OP_W, SUM_F);
}

/* rate_widen with `what` a constant in each, so that its loop has no branch */
__attribute__((target("avx512f,fma"))) static double rate_load_fma(long n) {
    return rate_widen(0, n);
}
__attribute__((target("avx512f,fma"))) static double rate_cvtph_fma(long n) {
    return rate_widen(1, n);
}
__attribute__((target("avx512f,fma"))) static double rate_bf16_fma(long n) {
    return rate_widen(2, n);
}

__attribute__((target("avx512f,avx512fp16"))) static double rate_fmaph(long n) {
    const __m512h x = _mm512_set1_ph((_Float16)1.0f), y = _mm512_set1_ph((_Float16)0x1p-14f);
#define DECL_H(i) __m512h a##i = _mm512_set1_ph((_Float16)(i));
#define OP_H(i) a##i = _mm512_fmadd_ph(a##i, x, y);
#define SUM_H(i) sink += (float)_mm512_reduce_add_ph(a##i);
    TIME24(n, DECL_H, OP_H, SUM_H);
}

static _Alignas(64) unsigned char tile_mem[8][16 * 64];

/* The tiles configured (every tile 16 rows of 64 bytes), tiles 0-3 zeroed and 4-7 loaded
 * from tile_mem, which holds bf16 values of 1.0 (0-3) and 2^-20 (4-7): products of 2^-40, no
 * subnormal and no overflow. */
__attribute__((target("amx-tile"))) static void tiles_ready(void) {
    for (int t = 0; t < 8; t++)
        for (int e = 0; e < 16 * 32; e++) {
            const uint16_t v = t < 4 ? 0x3f80 : 0x3580;
            memcpy(tile_mem[t] + 2 * e, &v, 2);
        }
    sdpa__tile_config c;
    sdpa__tile_config_full(&c);
    _tile_loadconfig(&c);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    /* (GCC 12's _tile_loadd does not say it reads memory: the barrier keeps tile_mem filled) */
    __asm__ volatile("" ::: "memory");
    _tile_loadd(4, tile_mem[4], 64);
    _tile_loadd(5, tile_mem[5], 64);
    _tile_loadd(6, tile_mem[6], 64);
    _tile_loadd(7, tile_mem[7], 64);
}

/* 0: TDPBF16PS into 4 accumulators from 4 sources loaded once; 1: TILELOADD of 1 KiB in L1
 * into each of the 8 tiles in turn; 2: TILESTORED of the 8 tiles in turn into L1; 3: the
 * scores' 2 x 2 pattern, a block of 4 steps of (2 A, 2 B loads and 4 products) after zeroing
 * the 4 accumulators, per product; 4: the same, each block ended by the 4 accumulators'
 * stores. Bf16 values of 1.0 and 2^-20 products: no subnormal, no overflow. */
__attribute__((target("amx-tile,amx-bf16"))) static double rate_amx(int what, long n) {
    tiles_ready();
    long count = 0;
    const uint64_t t0 = __rdtsc();
    if (what == 0) {
        for (long s = 0; s < n / 4; s++) {
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        count = n / 4 * 4;
    } else if (what == 1) {
        for (long s = 0; s < n / 8; s++) {
            __asm__ volatile("" ::: "memory");
            _tile_loadd(0, tile_mem[0], 64);
            _tile_loadd(1, tile_mem[1], 64);
            _tile_loadd(2, tile_mem[2], 64);
            _tile_loadd(3, tile_mem[3], 64);
            _tile_loadd(4, tile_mem[4], 64);
            _tile_loadd(5, tile_mem[5], 64);
            _tile_loadd(6, tile_mem[6], 64);
            _tile_loadd(7, tile_mem[7], 64);
        }
        count = n / 8 * 8;
    } else if (what == 2) {
        for (long s = 0; s < n / 8; s++) {
            _tile_stored(0, tile_mem[0], 64);
            _tile_stored(1, tile_mem[1], 64);
            _tile_stored(2, tile_mem[2], 64);
            _tile_stored(3, tile_mem[3], 64);
            _tile_stored(4, tile_mem[4], 64);
            _tile_stored(5, tile_mem[5], 64);
            _tile_stored(6, tile_mem[6], 64);
            _tile_stored(7, tile_mem[7], 64);
        }
        count = n / 8 * 8;
    } else {
        _Alignas(64) static unsigned char ab[4][4][16 * 64]; /* [step][A0 A1 B0 B1] */
        for (int s = 0; s < 4; s++)
            for (int t = 0; t < 4; t++)
                memcpy(ab[s][t], tile_mem[4 + t], sizeof ab[s][t]);
        static _Alignas(64) float out[4][16 * 16];
        for (long blk = 0; blk < n / 16; blk++) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int s = 0; s < 4; s++) {
                __asm__ volatile("" ::: "memory");
                _tile_loadd(4, ab[s][0], 64);
                _tile_loadd(6, ab[s][2], 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_loadd(7, ab[s][3], 64);
                _tile_dpbf16ps(1, 4, 7);
                _tile_loadd(5, ab[s][1], 64);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
            if (what == 4) {
                _tile_stored(0, out[0], 64);
                _tile_stored(1, out[1], 64);
                _tile_stored(2, out[2], 64);
                _tile_stored(3, out[3], 64);
            }
        }
        count = n / 16 * 16;
    }
    const uint64_t t1 = __rdtsc();
    _tile_stored(0, tile_mem[0], 64);
    _tile_release();
    float f;
    memcpy(&f, tile_mem[0], sizeof f);
    sink += f;
    return (double)(t1 - t0) / (double)count;
}

/* The vector instructions timed beside the tile unit: which of the vector work a kernel does
 * between the unit's products runs alongside them. */
enum beside_op { BESIDE_FMA, BESIDE_ADD, BESIDE_MUL, BESIDE_MAX, BESIDE_SHUFFLE, BESIDE_OPS };
static const char *const beside_names[BESIDE_OPS] = {"VFMADD231PS", "VADDPS", "VMULPS", "VMAXPS",
                                                     "VPERMILPS"};

/* Vector instructions beside the tile unit: per step, 4 TDPBF16PS into 4 accumulator tiles
 * (as rate_amx 0) and `ops` instructions of kind `op` (zmm, a multiple of 16) over 16 vector
 * accumulators, issued after them; ops = 0 times the products alone, and tdp = 0 the vector
 * instructions alone. @return TSC cycles per step. Where the two overlapped, a step would take
 * the longer of the two alone. (Inlined with op a constant: each caller's loop holds one kind.) */
#define BESIDE_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,fma")))
BESIDE_TARGET __attribute__((always_inline)) static inline double
rate_beside(int tdp, enum beside_op op, int ops, long steps) {
    tiles_ready();
    __m512 x = _mm512_set1_ps(1.0f);
    const __m512 y = _mm512_set1_ps(0x1p-30f);
    __asm__("" : "+v"(x)); /* (an unknown x: a compiler may not make the FMAs adds) */
    /* 16 accumulators: twice the FMA's latency times its rate, so that they alone run at it */
#define BESIDE16(M)                                                                                \
    M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) M(12) M(13) M(14) M(15)
#define DECL_B(i) __m512 b##i = _mm512_set1_ps((float)(i));
#define FMA_B(i) b##i = _mm512_fmadd_ps(b##i, x, y);
#define ADD_B(i) b##i = _mm512_add_ps(b##i, y);
#define MUL_B(i) b##i = _mm512_mul_ps(b##i, x);
#define MAX_B(i) b##i = _mm512_max_ps(b##i, y);
#define SHUF_B(i) b##i = _mm512_permute_ps(b##i, 0x1b);
#define KEEP_B(i) __asm__ volatile("" : "+v"(b##i));
#define SUM_B(i) sink += _mm512_reduce_add_ps(b##i);
    BESIDE16(DECL_B)
    const uint64_t t0 = __rdtsc();
    for (long s = 0; s < steps; s++) {
        if (tdp) {
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        for (int k = 0; k < ops; k += 16) {
            switch (op) {
            case BESIDE_FMA:
                BESIDE16(FMA_B)
                break;
            case BESIDE_ADD:
                BESIDE16(ADD_B)
                break;
            case BESIDE_MUL:
                BESIDE16(MUL_B)
                break;
            case BESIDE_MAX:
                BESIDE16(MAX_B)
                break;
            default:
                BESIDE16(SHUF_B)
                break;
            }
            /* (each instruction done in turn, in registers: none merged or hoisted by the
             * compiler) */
            BESIDE16(KEEP_B)
        }
    }
    const uint64_t t1 = __rdtsc();
    _tile_release();
    BESIDE16(SUM_B)
    return (double)(t1 - t0) / (double)steps;
}

/* Each kind's own rate_beside: op is a constant there, so that each loop holds one kind. */
BESIDE_TARGET static double beside_fma(int tdp, int ops, long steps) {
    return rate_beside(tdp, BESIDE_FMA, ops, steps);
}
BESIDE_TARGET static double beside_add(int tdp, int ops, long steps) {
    return rate_beside(tdp, BESIDE_ADD, ops, steps);
}
BESIDE_TARGET static double beside_mul(int tdp, int ops, long steps) {
    return rate_beside(tdp, BESIDE_MUL, ops, steps);
}
BESIDE_TARGET static double beside_max(int tdp, int ops, long steps) {
    return rate_beside(tdp, BESIDE_MAX, ops, steps);
}
BESIDE_TARGET static double beside_shuffle(int tdp, int ops, long steps) {
    return rate_beside(tdp, BESIDE_SHUFFLE, ops, steps);
}
static double (*const beside[BESIDE_OPS])(int, int, long) = {beside_fma, beside_add, beside_mul,
                                                             beside_max, beside_shuffle};

/* The fastest of three runs. */
#define BEST3(expr)                                                                                \
    ({                                                                                             \
        double best_ = 1e300;                                                                      \
        for (int run_ = 0; run_ < 3; run_++) {                                                     \
            const double r_ = (expr);                                                              \
            best_ = r_ < best_ ? r_ : best_;                                                       \
        }                                                                                          \
        best_;                                                                                     \
    })

/* --unit: TDPBF16PS's TSC cycles now, alone on a line (bench/on_fast_unit.sh reads it). */
static int unit_now(void) {
    sdpa__cpu cpu;
    sdpa__cpu_probe(&cpu);
    sdpa__cpu_request_tiles(&cpu);
    if ((cpu.features & SDPA__NEEDS_AMX) != SDPA__NEEDS_AMX) {
        fprintf(stderr, "isa_rates: no AMX-BF16, or no tile permission from the OS\n");
        return 2;
    }
    /* The first run warms the unit up (it reads about 2 cycles high); then the best of 3 runs
     * of 80,000 products, each about 0.6 ms at the unit's full rate. */
    (void)rate_amx(0, 80000);
    printf("%.1f\n", BEST3(rate_amx(0, 80000)));
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--unit") == 0)
        return unit_now();
    const long millions = argc > 1 ? atol(argv[1]) : 60;
    if (millions < 1 || millions > 100000) {
        fprintf(stderr, "isa_rates: millions of instructions per figure: 1..100000\n");
        return 2;
    }
    const long n = millions * 1000000L;
    sdpa__cpu cpu;
    sdpa__cpu_probe(&cpu);
    const uint32_t f = cpu.features;
    char names[256];
    sdpa__cpu_feature_names(f, names, sizeof names);
    printf("isa_rates: %s\n", names);
    printf("TSC cycles per instruction (fastest of 3 runs of %ld M), and multiply-adds per TSC "
           "cycle where it does them\n",
           millions);
    if (!(f & SDPA__CPU_AVX512F)) {
        printf("  AVX-512: skipped (not on this CPU)\n");
        return 0;
    }
    const double fma = BEST3(rate_fma(n));
    printf("  VFMADD231PS zmm     %6.3f   %5.1f f32 MACs (the reference)\n", fma, 16.0 / fma);
    if (f & SDPA__CPU_AVX512_BF16) {
        const double r = BEST3(rate_dpbf16(n));
        printf("  VDPBF16PS zmm       %6.3f   %5.1f bf16 MACs into f32: %.2fx the FMA's rate\n", r,
               32.0 / r, 32.0 / r / (16.0 / fma));
    } else
        printf("  VDPBF16PS zmm       skipped (no AVX512-BF16)\n");
    {
        const double base = BEST3(rate_load_fma(n)), f16 = BEST3(rate_cvtph_fma(n));
        const double bf16 = BEST3(rate_bf16_fma(n));
        printf("  FMA, its operand loaded from L1       %6.3f\n", base);
        printf("  VCVTPH2PS zmm (f16) and that FMA      %6.3f   the widening costs %.1f FMAs\n",
               f16, (f16 - base) / fma);
        printf("  VPMOVZXWD + VPSLLD (bf16) and the FMA %6.3f   the widening costs %.1f FMAs\n",
               bf16, (bf16 - base) / fma);
    }
    if (f & SDPA__CPU_AVX512_FP16) {
        const double r = BEST3(rate_fmaph(n));
        printf("  VFMADD231PH zmm     %6.3f   %5.1f f16 MACs summed in f16 (not usable: the rule "
               "wants f32 sums)\n",
               r, 32.0 / r);
    } else
        printf("  VFMADD231PH zmm     skipped (no AVX512-FP16)\n");
    sdpa__cpu_request_tiles(&cpu);
    if ((cpu.features & SDPA__NEEDS_AMX) != SDPA__NEEDS_AMX) {
        printf("  AMX: skipped (no AMX-BF16, or no tile permission from the OS)\n");
        return 0;
    }
    const long nt = n / 16; /* tile instructions are about 16 times slower */
    const double dp = BEST3(rate_amx(0, nt));
    printf("  TDPBF16PS           %6.3f   %5.1f bf16 MACs into f32: %.1fx the FMA's rate\n", dp,
           8192.0 / dp, 8192.0 / dp / (16.0 / fma));
    printf("  TILELOADD (L1)      %6.3f\n", BEST3(rate_amx(1, nt)));
    printf("  TILESTORED (L1)     %6.3f\n", BEST3(rate_amx(2, nt)));
    const double pat = BEST3(rate_amx(3, nt)), pat_st = BEST3(rate_amx(4, nt));
    printf("  2 x 2 scores pattern, per TDPBF16PS: %.3f (%.2fx TDPBF16PS alone); with the "
           "block's 4 stores: %.3f (%.2fx)\n",
           pat, pat / dp, pat_st, pat_st / dp);
    /* how much vector work a step of 4 products hides: 64 FMAs (alone, about half as long as
     * the products at the unit's full rate) and 128 (about as long) */
    const long steps = nt / 4;
    const double tdp4 = BEST3(beside[BESIDE_FMA](1, 0, steps));
    for (int fmas = 64; fmas <= 128; fmas += 64) {
        const double alone = BEST3(beside[BESIDE_FMA](0, fmas, steps));
        const double both = BEST3(beside[BESIDE_FMA](1, fmas, steps));
        printf("  4 TDPBF16PS and %3d FMAs a step: %.1f, where the products alone take %.1f and "
               "the FMAs alone %.1f (overlapped: %.1f; one after the other: %.1f)\n",
               fmas, both, tdp4, alone, tdp4 > alone ? tdp4 : alone, tdp4 + alone);
    }
    /* which kinds of vector work run alongside the products: 128 of each a step */
    for (int op = BESIDE_ADD; op < BESIDE_OPS; op++) {
        const double alone = BEST3(beside[op](0, 128, steps));
        const double both = BEST3(beside[op](1, 128, steps));
        printf("  4 TDPBF16PS and 128 %-11s a step: %.1f, where the products alone take %.1f "
               "and the %s alone %.1f (overlapped: %.1f; one after the other: %.1f)\n",
               beside_names[op], both, tdp4, beside_names[op], alone, tdp4 > alone ? tdp4 : alone,
               tdp4 + alone);
    }
    return 0;
}
