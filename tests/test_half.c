/*
 * test_half.c — tests of the binary16 / bfloat16 conversions of src/core/half.h.
 *
 * Contract under test: widening (f16/bf16 -> f32) is exact; narrowing (f64 -> f16/bf16)
 * rounds once, to nearest with ties to even, straight from the double (never through f32),
 * whatever the host rounding mode; values beyond the largest finite value become infinities,
 * NaN stays NaN, signs (zeros included) are kept.
 *
 * The expected bits are worked out by hand in the comments, and a sweep compares random
 * doubles against an oracle of our own: a table of every finite value of the format and an
 * exact comparison with the midpoint of the two neighbours of x.
 */
#include "../src/core/half.h"
#include "check.h"
#include "testutil.h"

#include <fenv.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------------------------ */

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* x must narrow to `bits`, and -x to the same bits with the sign bit set; `name` is the
 * conversion's name in the messages. */
#define EXPECT_NARROW(name, narrow, x, bits)                                                       \
    do {                                                                                           \
        const double e__x = (x);                                                                   \
        const unsigned e__b = (bits), e__p = narrow(e__x), e__n = narrow(-e__x);                   \
        CHECK_MSG(e__p == e__b, "%s(%a) = 0x%04x, expected 0x%04x", name, e__x, e__p, e__b);       \
        CHECK_MSG(e__n == (e__b | 0x8000u), "%s(%a) = 0x%04x, expected 0x%04x", name, -e__x, e__n, \
                  e__b | 0x8000u);                                                                 \
    } while (0)
#define EXPECT_F16(x, bits) EXPECT_NARROW("f64_to_f16", sdpa__f64_to_f16, x, bits)
#define EXPECT_BF16(x, bits) EXPECT_NARROW("f64_to_bf16", sdpa__f64_to_bf16, x, bits)

/* The value of a positive, finite binary16 pattern, from the definition of the format:
 * 1 sign, 5 exponent (bias 15), 10 fraction bits; exponent field 0 is subnormal (m * 2^-24),
 * else (1024 + m) * 2^(e - 25). */
static double f16_value(unsigned p) {
    const unsigned e = p >> 10, m = p & 0x3ffu;
    return e == 0 ? ldexp((double)m, -24) : ldexp(1024.0 + m, (int)e - 25);
}

/* bfloat16: 1 sign, 8 exponent (bias 127), 7 fraction bits; subnormal m * 2^-133, else
 * (128 + m) * 2^(e - 134). */
static double bf16_value(unsigned p) {
    const unsigned e = p >> 7, m = p & 0x7fu;
    return e == 0 ? ldexp((double)m, -133) : ldexp(128.0 + m, (int)e - 134);
}

static int f16_is_nan(unsigned h) {
    return (h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0;
}

static int bf16_is_nan(unsigned h) {
    return (h & 0x7f80u) == 0x7f80u && (h & 0x007fu) != 0;
}

/* ---- widening and narrowing back, every pattern ------------------------------------------- */

/* A 16-bit format as the round-trip test sees it: the library's conversions, the format's
 * own definition, and the pattern of +inf. */
typedef struct half_format {
    const char *name; /* "f16" */
    float (*widen)(uint16_t);
    uint16_t (*narrow)(double);
    int (*is_nan)(unsigned);
    double (*value)(unsigned); /* of a positive, finite pattern */
    unsigned inf;
    int top_half_of_f32; /* bfloat16: the float's bits are the pattern << 16 exactly */
} half_format;

static const half_format f16_format = {
    "f16", sdpa__f16_to_f32, sdpa__f64_to_f16, f16_is_nan, f16_value, 0x7c00u, 0};
static const half_format bf16_format = {
    "bf16", sdpa__bf16_to_f32, sdpa__f64_to_bf16, bf16_is_nan, bf16_value, 0x7f80u, 1};

/* Every one of the 65536 patterns widens exactly and narrows back to itself. */
static void all_patterns_round_trip(const half_format *fmt) {
    int bad_value = 0, bad_trip = 0;
    for (unsigned h = 0; h <= 0xffffu; h++) {
        const float f = fmt->widen((uint16_t)h);
        const unsigned back = fmt->narrow((double)f);
        const unsigned mag = h & 0x7fffu;
        const int neg = (h & 0x8000u) != 0;
        if (fmt->is_nan(h)) {
            /* NaN widens to NaN and narrows back to a NaN (the payload may be canonical). */
            if (!isnan(f) || !fmt->is_nan(back))
                CHECK_MSG(bad_trip++ > 0, "NaN 0x%04x -> %a -> 0x%04x", h, (double)f, back);
            continue;
        }
        /* Widening is exact: the float equals the value from the format's definition, with
         * the sign bit kept (so 0x8000 is -0.0). */
        const double want = mag == fmt->inf ? INFINITY : fmt->value(mag);
        if ((double)f != (neg ? -want : want) || (signbit(f) != 0) != neg ||
            (fmt->top_half_of_f32 && bits_of(f) != (uint32_t)h << 16))
            CHECK_MSG(bad_value++ > 0, "%s_to_f32(0x%04x) = %a, expected %a", fmt->name, h,
                      (double)f, neg ? -want : want);
        if (back != h)
            CHECK_MSG(bad_trip++ > 0, "0x%04x -> %a -> 0x%04x", h, (double)f, back);
    }
    CHECK_INT_EQ(bad_value, 0);
    CHECK_INT_EQ(bad_trip, 0);
}

static void test_f16_all_patterns_round_trip(void) {
    all_patterns_round_trip(&f16_format);
}

static void test_bf16_all_patterns_round_trip(void) {
    all_patterns_round_trip(&bf16_format);
}

/* ---- round to nearest, ties to even: binary16 --------------------------------------------- */

static void test_f16_ties_normal(void) {
    /* In [1, 2) the f16 spacing is 2^-10: 1.0 = 0x3c00, 1 + 2^-10 = 0x3c01, ... */
    EXPECT_F16(1.0, 0x3c00);
    /* 1 + 2^-11 is halfway between 0x3c00 and 0x3c01: the even one, 0x3c00, wins. */
    EXPECT_F16(1.0 + 0x1p-11, 0x3c00);
    /* 1 + 3*2^-11 is halfway between 0x3c01 and 0x3c02: the even one, 0x3c02. */
    EXPECT_F16(1.0 + 3 * 0x1p-11, 0x3c02);
    /* Off the tie by a little either way, the nearer neighbour wins. */
    EXPECT_F16(1.0 + 0x1p-11 + 0x1p-20, 0x3c01);
    EXPECT_F16(1.0 + 3 * 0x1p-11 - 0x1p-20, 0x3c01);
    EXPECT_F16(1.0 + 0x1p-12, 0x3c00);     /* a quarter step: down */
    EXPECT_F16(1.0 + 3 * 0x1p-12, 0x3c01); /* three quarters: up */
    /* In [2048, 4096) the spacing is 2: 2048 = 2^11 is exponent field 11 + 15 = 26, 0x6800.
     * 2049 is the tie 2048 | 2050 -> 2048 (0x6800); 2051 is 2050 | 2052 -> 2052 (0x6802). */
    EXPECT_F16(2048.0, 0x6800);
    EXPECT_F16(2049.0, 0x6800);
    EXPECT_F16(2051.0, 0x6802);
    EXPECT_F16(2050.5, 0x6801);
    /* Rounding up can carry into the exponent: 2 - 2^-11 is the midpoint between 0x3fff
     * (2 - 2^-10, the largest value below 2) and 2.0 = 0x4000; 0x4000 is even. */
    EXPECT_F16(2.0 - 0x1p-11, 0x4000);
    /* 0.1: 0.1 * 2^14 = 1638.4, so between 1638 * 2^-14 and 1639 * 2^-14; 1638.4 is
     * nearer 1638 = 1024 + 614 in the binade [2^-4, 2^-3): exponent field 11, fraction 614
     * = 0x266, bits (11 << 10) | 0x266 = 0x2e66. */
    EXPECT_F16(0.1, 0x2e66);
}

static void test_f16_ties_subnormal(void) {
    /* Subnormal f16 values are m * 2^-24 (m = 1..1023); the spacing is 2^-24 down to 0. */
    EXPECT_F16(0x1p-24, 0x0001);           /* the smallest subnormal */
    EXPECT_F16(0x1p-25, 0x0000);           /* tie 0 | 2^-24 -> 0, the even one (a signed zero) */
    EXPECT_F16(3 * 0x1p-25, 0x0002);       /* 1.5 quanta: tie 1 | 2 -> 2 */
    EXPECT_F16(5 * 0x1p-25, 0x0002);       /* 2.5 quanta: tie 2 | 3 -> 2 */
    EXPECT_F16(7 * 0x1p-25, 0x0004);       /* 3.5 quanta: tie 3 | 4 -> 4 */
    EXPECT_F16(0x1p-26, 0x0000);           /* a quarter quantum: down to zero */
    EXPECT_F16(3 * 0x1p-26, 0x0001);       /* three quarters: up */
    EXPECT_F16(0x1p-25 + 0x1p-70, 0x0001); /* just above the tie with 0 */
    EXPECT_F16(1e-300, 0x0000);
    EXPECT_F16(DBL_TRUE_MIN, 0x0000); /* a subnormal double */
    /* 1022.5 quanta: tie 0x03fe | 0x03ff -> 0x03fe. */
    EXPECT_F16(1022.5 * 0x1p-24, 0x03fe);
    EXPECT_F16(1023 * 0x1p-24, 0x03ff); /* the largest subnormal */
}

static void test_f16_normal_subnormal_boundary(void) {
    /* The smallest normal is 2^-14 = 1024 quanta = 0x0400; the largest subnormal 1023 quanta
     * = 0x03ff. Their midpoint 1023.5 * 2^-24 is a tie whose even side is the normal 0x0400:
     * rounding leaves the subnormal range. */
    EXPECT_F16(0x1p-14, 0x0400);
    EXPECT_F16(1023.5 * 0x1p-24, 0x0400);
    EXPECT_F16(1023.5 * 0x1p-24 - 0x1p-60, 0x03ff);
    /* Above 2^-14 the spacing is still 2^-24: 2^-14 + 2^-25 is tie 0x0400 | 0x0401 -> 0x0400,
     * 2^-14 + 3 * 2^-25 is tie 0x0401 | 0x0402 -> 0x0402. */
    EXPECT_F16(0x1p-14 + 0x1p-25, 0x0400);
    EXPECT_F16(0x1p-14 + 3 * 0x1p-25, 0x0402);
}

static void test_f16_overflow_and_limits(void) {
    /* The largest finite f16 is (2 - 2^-10) * 2^15 = 65504 = 0x7bff; the spacing there is 32.
     * 65520 is the midpoint between 65504 (fraction 0x3ff, odd) and 2^16 (which would be the
     * even neighbour but does not exist): ties to even sends it to infinity, 0x7c00. */
    EXPECT_F16(65504.0, 0x7bff);
    EXPECT_F16(65519.0, 0x7bff);
    EXPECT_F16(nextafter(65520.0, 0.0), 0x7bff);
    EXPECT_F16(65520.0, 0x7c00);
    EXPECT_F16(65536.0, 0x7c00);
    EXPECT_F16(1e10, 0x7c00);
    EXPECT_F16((double)FLT_MAX, 0x7c00);
    EXPECT_F16(DBL_MAX, 0x7c00);
    EXPECT_F16(INFINITY, 0x7c00);
    CHECK(sdpa__f16_to_f32(0x7bff) == 65504.0f);
    CHECK(sdpa__f16_to_f32(0xfbff) == -65504.0f);
    CHECK(sdpa__f16_to_f32(0x7c00) == INFINITY);
    CHECK(sdpa__f16_to_f32(0xfc00) == -INFINITY);
    CHECK(sdpa__f16_to_f32(0x0001) == 0x1p-24f);
    CHECK(sdpa__f16_to_f32(0x8001) == -0x1p-24f);
    CHECK(sdpa__f16_to_f32(0x3c00) == 1.0f);
    CHECK(sdpa__f16_to_f32(0xc000) == -2.0f);
}

/* ---- round to nearest, ties to even: bfloat16 --------------------------------------------- */

static void test_bf16_ties_normal(void) {
    /* In [1, 2) the bf16 spacing is 2^-7: 1.0 = 0x3f80, 1 + 2^-7 = 0x3f81. */
    EXPECT_BF16(1.0, 0x3f80);
    EXPECT_BF16(1.0 + 0x1p-8, 0x3f80);     /* tie 0x3f80 | 0x3f81 -> 0x3f80 */
    EXPECT_BF16(1.0 + 3 * 0x1p-8, 0x3f82); /* tie 0x3f81 | 0x3f82 -> 0x3f82 */
    EXPECT_BF16(1.0 + 0x1p-8 + 0x1p-20, 0x3f81);
    EXPECT_BF16(1.0 + 3 * 0x1p-8 - 0x1p-20, 0x3f81);
    /* 2 - 2^-8 is the midpoint between 0x3fff (1 + 127/128 = 2 - 2^-7) and 0x4000 (2.0);
     * the carry into the exponent gives the even 0x4000. */
    EXPECT_BF16(2.0 - 0x1p-8, 0x4000);
    /* 257 = 2^8 * (1 + 2^-8): spacing at 256 is 2, so tie 256 | 258 -> 256 = 0x4380
     * (exponent field 8 + 127 = 135 = 0x87, bits 0x87 << 7 = 0x4380); 259 -> 260 = 0x4382. */
    EXPECT_BF16(257.0, 0x4380);
    EXPECT_BF16(259.0, 0x4382);
    /* pi = 1.5707963... * 2: fraction 0.5707963 * 128 = 73.06 -> 73 = 0x49, exponent field
     * 128 = 0x80: bits (0x80 << 7) | 0x49 = 0x4049. */
    EXPECT_BF16(3.14159265358979323846, 0x4049);
}

static void test_bf16_ties_subnormal_and_boundary(void) {
    /* bf16 subnormals are m * 2^-133 (m = 1..127); the smallest normal is 2^-126 = 0x0080. */
    EXPECT_BF16(0x1p-133, 0x0001);
    EXPECT_BF16(0x1p-134, 0x0000);     /* tie 0 | 1 -> 0 */
    EXPECT_BF16(3 * 0x1p-134, 0x0002); /* tie 1 | 2 -> 2 */
    EXPECT_BF16(5 * 0x1p-134, 0x0002); /* tie 2 | 3 -> 2 */
    EXPECT_BF16(0x1p-135, 0x0000);
    EXPECT_BF16(127 * 0x1p-133, 0x007f); /* the largest subnormal */
    EXPECT_BF16(126.5 * 0x1p-133, 0x007e);
    /* 127.5 quanta: tie 0x007f | 0x0080 -> the normal 0x0080. */
    EXPECT_BF16(127.5 * 0x1p-133, 0x0080);
    EXPECT_BF16(127.5 * 0x1p-133 - 0x1p-170, 0x007f);
    EXPECT_BF16(0x1p-126, 0x0080);
    /* Above 2^-126 the spacing is 2^-133: ties go to even again. */
    EXPECT_BF16(0x1p-126 + 0x1p-134, 0x0080);
    EXPECT_BF16(0x1p-126 + 3 * 0x1p-134, 0x0082);
    EXPECT_BF16(1e-300, 0x0000);
}

static void test_bf16_overflow_and_limits(void) {
    /* The largest finite bf16, 0x7f7f, is (1 + 127/128) * 2^127 = 255 * 2^120; the spacing is
     * 2^120. The midpoint above it, 255.5 * 2^120 = 0x1.ffp127, is a tie between 0x7f7f
     * (odd) and 2^128, so it overflows to infinity, 0x7f80. FLT_MAX = 0x1.fffffep127 is
     * above that midpoint: it is finite in f32 but infinite in bf16. */
    EXPECT_BF16(0x1.fep127, 0x7f7f);
    EXPECT_BF16(0x1.ffp127 - 0x1p90, 0x7f7f);
    EXPECT_BF16(0x1.ffp127, 0x7f80);
    EXPECT_BF16((double)FLT_MAX, 0x7f80);
    EXPECT_BF16(0x1p128, 0x7f80);
    EXPECT_BF16(DBL_MAX, 0x7f80);
    EXPECT_BF16(INFINITY, 0x7f80);
    CHECK(sdpa__bf16_to_f32(0x7f7f) == 0x1.fep127f);
    CHECK(sdpa__bf16_to_f32(0xff7f) == -0x1.fep127f);
    CHECK(sdpa__bf16_to_f32(0x7f80) == INFINITY);
    CHECK(sdpa__bf16_to_f32(0x0001) == 0x1p-133f);
    CHECK(sdpa__bf16_to_f32(0x3f80) == 1.0f);
}

/* ---- what a conversion through float would get wrong -------------------------------------- */

static void test_no_double_rounding_through_f32(void) {
    /* 1 + 2^-11 + 2^-30 is just above the f16 tie 0x3c00 | 0x3c01, so it rounds up to
     * 0x3c01. Through float it would first become 1 + 2^-11 exactly (2^-30 is below half an
     * f32 step, 2^-24), the tie, and then go to the even 0x3c00. */
    const double up = 1.0 + 0x1p-11 + 0x1p-30;
    CHECK((double)(float)up == 1.0 + 0x1p-11); /* the premise: float loses the excess */
    EXPECT_F16(up, 0x3c01);
    /* Just below the tie 0x3c01 | 0x3c02 it must round down to 0x3c01; through float it
     * would reach the tie and go up to 0x3c02. */
    EXPECT_F16(1.0 + 3 * 0x1p-11 - 0x1p-30, 0x3c01);
    /* The same at the f16 subnormal tie 0 | 2^-24 and at the largest finite value. */
    EXPECT_F16(0x1p-25 + 0x1p-55, 0x0001);
    EXPECT_F16(65520.0 - 0x1p-20, 0x7bff);
    /* bf16: 1 + 2^-8 + 2^-30 rounds up to 0x3f81 (through float: tie, 0x3f80). */
    EXPECT_BF16(1.0 + 0x1p-8 + 0x1p-30, 0x3f81);
    EXPECT_BF16(1.0 + 3 * 0x1p-8 - 0x1p-30, 0x3f81);
    /* bf16 subnormal: 2^-134 + 2^-160 is above the tie 0 | 2^-133; in float the 2^-160
     * falls below the smallest f32 subnormal (2^-149) and only the tie would remain. */
    EXPECT_BF16(0x1p-134 + 0x1p-160, 0x0001);
    /* Just below the bf16 overflow midpoint: float would round 0x1.ffp127 - 2^90 up to the
     * midpoint and so to infinity. */
    EXPECT_BF16(0x1.ffp127 - 0x1p90, 0x7f7f);
}

/* ---- zeros, infinities, NaN --------------------------------------------------------------- */

static void test_signed_zeros_inf_nan(void) {
    CHECK_INT_EQ(sdpa__f64_to_f16(0.0), 0x0000);
    CHECK_INT_EQ(sdpa__f64_to_f16(-0.0), 0x8000);
    CHECK_INT_EQ(sdpa__f64_to_bf16(0.0), 0x0000);
    CHECK_INT_EQ(sdpa__f64_to_bf16(-0.0), 0x8000);
    /* A negative value too small for the format keeps its sign. */
    CHECK_INT_EQ(sdpa__f64_to_f16(-1e-30), 0x8000);
    CHECK_INT_EQ(sdpa__f64_to_bf16(-1e-300), 0x8000);
    const float pz16 = sdpa__f16_to_f32(0x0000), nz16 = sdpa__f16_to_f32(0x8000);
    const float pzb = sdpa__bf16_to_f32(0x0000), nzb = sdpa__bf16_to_f32(0x8000);
    CHECK(pz16 == 0.0f && !signbit(pz16));
    CHECK(nz16 == 0.0f && signbit(nz16));
    CHECK(pzb == 0.0f && !signbit(pzb));
    CHECK(nzb == 0.0f && signbit(nzb));

    CHECK_INT_EQ(sdpa__f64_to_f16(INFINITY), 0x7c00);
    CHECK_INT_EQ(sdpa__f64_to_f16(-INFINITY), 0xfc00);
    CHECK_INT_EQ(sdpa__f64_to_bf16(INFINITY), 0x7f80);
    CHECK_INT_EQ(sdpa__f64_to_bf16(-INFINITY), 0xff80);

    const double nans[] = {NAN, -NAN, (double)nanf("0x1"), nan("0x7ffff")};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        const unsigned h = sdpa__f64_to_f16(nans[i]), b = sdpa__f64_to_bf16(nans[i]);
        CHECK_MSG(f16_is_nan(h), "f64_to_f16(NaN #%zu) = 0x%04x is not a NaN", i, h);
        CHECK_MSG(bf16_is_nan(b), "f64_to_bf16(NaN #%zu) = 0x%04x is not a NaN", i, b);
    }
    /* A signalling-looking bf16 NaN (top fraction bit clear) must not widen to infinity. */
    CHECK(isnan(sdpa__bf16_to_f32(0x7f81)));
    CHECK(isnan(sdpa__f16_to_f32(0x7c01)));
}

/* ---- random doubles against an oracle ------------------------------------------------------ */

/* Every positive finite value of a format, in increasing order (the patterns 0..n-1 are
 * increasing for both formats). */
enum { F16_FINITE = 0x7c00, BF16_FINITE = 0x7f80 };
static double f16_table[F16_FINITE];
static double bf16_table[BF16_FINITE];

static void fill_tables(void) {
    for (unsigned p = 0; p < F16_FINITE; p++)
        f16_table[p] = f16_value(p);
    for (unsigned p = 0; p < BF16_FINITE; p++)
        bf16_table[p] = bf16_value(p);
}

/* The correctly rounded pattern of finite x >= 0: the nearest entry of the table, ties to the
 * even pattern; x at or above `overflow_at` (the midpoint between the largest value and the
 * next power of two) is infinity, pattern n. Every comparison here is exact: midpoints of
 * neighbouring values have one more bit than the format and fit in a double. */
static unsigned oracle_round(const double *table, unsigned n, double overflow_at, double x) {
    if (x >= overflow_at)
        return n;
    unsigned lo = 0, hi = n - 1; /* find the last index with table[i] <= x */
    while (lo < hi) {
        const unsigned mid = lo + (hi - lo + 1) / 2;
        if (table[mid] <= x)
            lo = mid;
        else
            hi = mid - 1;
    }
    if (table[lo] == x || lo == n - 1)
        return lo;
    const double midpoint = (table[lo] + table[lo + 1]) / 2;
    if (x < midpoint)
        return lo;
    if (x > midpoint)
        return lo + 1;
    return (lo & 1u) == 0 ? lo : lo + 1;
}

/* A double near pattern p of a table: its value plus a fraction of the next spacing, either
 * random in all 53 bits or within a hair (2^-k of a step, k up to 52) of the midpoint. */
static double near_value(tu_rng *r, const double *table, unsigned n, unsigned p) {
    const double base = table[p];
    const double step = p + 1 < n ? table[p + 1] - base : base - table[p - 1];
    double frac;
    switch (tu_next(r) % 3) {
    case 0:
        frac = (double)(tu_next(r) >> 11) * 0x1p-53;
        break;
    case 1:
        frac = 0.5;
        break;
    default: {
        const int k = 12 + (int)(tu_next(r) % 41); /* 12..52 */
        frac = (tu_next(r) & 1) ? 0.5 + ldexp(1.0, -k) : 0.5 - ldexp(1.0, -k);
        break;
    }
    }
    return base + frac * step;
}

static void sweep(const char *name, const double *table, unsigned n, double overflow_at,
                  uint16_t (*narrow)(double), uint64_t seed) {
    tu_rng r = {seed};
    int bad = 0;
    for (int i = 0; i < 400000; i++) {
        const unsigned p = (unsigned)(tu_next(&r) % n);
        const double mag = near_value(&r, table, n, p);
        const int neg = (int)(tu_next(&r) & 1);
        const double x = neg ? -mag : mag;
        const unsigned want = oracle_round(table, n, overflow_at, mag) | (neg ? 0x8000u : 0u);
        const unsigned got = narrow(x);
        if (got != want)
            CHECK_MSG(bad++ > 3, "%s(%a) = 0x%04x, expected 0x%04x", name, x, got, want);
    }
    CHECK_INT_EQ(bad, 0);
}

static void test_f16_random_against_oracle(void) {
    fill_tables();
    sweep("f64_to_f16", f16_table, F16_FINITE, 65520.0, sdpa__f64_to_f16, 0x5eed16);
}

static void test_bf16_random_against_oracle(void) {
    fill_tables();
    sweep("f64_to_bf16", bf16_table, BF16_FINITE, 0x1.ffp127, sdpa__f64_to_bf16, 0x5eedbf16);
}

/* ---- independence from the host rounding mode --------------------------------------------- */

static void test_any_rounding_mode(void) {
    static const int modes[] = {
#ifdef FE_UPWARD
        FE_UPWARD,
#endif
#ifdef FE_DOWNWARD
        FE_DOWNWARD,
#endif
#ifdef FE_TOWARDZERO
        FE_TOWARDZERO,
#endif
        FE_TONEAREST};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        if (fesetround(modes[i]) != 0)
            continue;
        /* Ties and near-ties, both signs, both formats; each would move under a directed
         * rounding mode if the conversion relied on the host's rounding. */
        EXPECT_F16(1.0 + 0x1p-11, 0x3c00);
        EXPECT_F16(1.0 + 3 * 0x1p-11, 0x3c02);
        EXPECT_F16(1.0 + 0x1p-11 + 0x1p-30, 0x3c01);
        EXPECT_F16(1.0 + 0x1p-12, 0x3c00);
        EXPECT_F16(3 * 0x1p-26, 0x0001);
        EXPECT_F16(1023.5 * 0x1p-24, 0x0400);
        EXPECT_F16(65520.0, 0x7c00);
        EXPECT_F16(65519.0, 0x7bff);
        EXPECT_F16(0.1, 0x2e66);
        EXPECT_BF16(1.0 + 0x1p-8, 0x3f80);
        EXPECT_BF16(1.0 + 3 * 0x1p-8, 0x3f82);
        EXPECT_BF16(1.0 + 0x1p-8 + 0x1p-30, 0x3f81);
        EXPECT_BF16(0x1p-134 + 0x1p-160, 0x0001);
        EXPECT_BF16(0x1.ffp127, 0x7f80);
        EXPECT_BF16(3.14159265358979323846, 0x4049);
        int bad = 0;
        for (unsigned h = 0; h < 0x7c00u; h++)
            bad += sdpa__f64_to_f16((double)sdpa__f16_to_f32((uint16_t)h)) != h;
        CHECK_MSG(bad == 0, "rounding mode #%zu: %d f16 patterns do not round-trip", i, bad);
    }
    fesetround(FE_TONEAREST);
}

CHECK_MAIN(CASE(test_f16_all_patterns_round_trip), CASE(test_bf16_all_patterns_round_trip),
           CASE(test_f16_ties_normal), CASE(test_f16_ties_subnormal),
           CASE(test_f16_normal_subnormal_boundary), CASE(test_f16_overflow_and_limits),
           CASE(test_bf16_ties_normal), CASE(test_bf16_ties_subnormal_and_boundary),
           CASE(test_bf16_overflow_and_limits), CASE(test_no_double_rounding_through_f32),
           CASE(test_signed_zeros_inf_nan), CASE(test_f16_random_against_oracle),
           CASE(test_bf16_random_against_oracle), CASE(test_any_rounding_mode))
