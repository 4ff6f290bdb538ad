/*
 * half.c — binary16 and bfloat16 conversions (see half.h for the contract).
 *
 * Narrowing works in two steps that are each exact except for one rounding: the double is
 * rounded to the target format's grid (a multiple of 2^(e - p + 1) for its exponent e, or of
 * the subnormal quantum), which is then representable in binary32, so the bit pattern is cut
 * out of the binary32 encoding with no further rounding.
 */
#include "half.h"

#include <math.h>
#include <string.h>

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float sdpa__f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) /* inf, or a NaN made quiet with its payload's bits (as vcvtph2ps does) */
        return bits_f32(sign | 0x7f800000u | (man != 0 ? 0x400000u : 0u) | (man << 13));
    if (exp == 0) { /* zero or subnormal: man * 2^-24, exact in binary32 */
        const float mag = (float)man * 0x1p-24f;
        return sign ? -mag : mag;
    }
    return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

float sdpa__bf16_to_f32(uint16_t h) {
    return bits_f32((uint32_t)h << 16);
}

/* Rounds |x| (finite, >= 0) to a multiple of quantum, ties to even. quantum is a power of two
 * and x / quantum < 2^53, so every step is exact. */
static double round_to_quantum(double x, double quantum) {
    const double q = x / quantum;
    double fl = floor(q);
    const double rest = q - fl;
    if (rest > 0.5 || (rest == 0.5 && fmod(fl, 2.0) != 0.0))
        fl += 1.0;
    return fl * quantum;
}

/* Rounds x to a format with `digits` significant bits and smallest normal exponent emin
 * (value 2^emin); the result is exact in binary32 or overflows it. */
static double round_to_format(double x, int digits, int emin) {
    const double mag = fabs(x);
    int e;
    (void)frexp(mag, &e); /* mag = f * 2^e, f in [0.5, 1): leading bit is 2^(e-1) */
    int lead = e - 1;
    if (lead < emin)
        lead = emin; /* subnormal range: fixed quantum */
    const double r = round_to_quantum(mag, ldexp(1.0, lead - (digits - 1)));
    return signbit(x) ? -r : r; /* signbit keeps -0.0 negative, unlike x < 0 */
}

uint16_t sdpa__f64_to_f16(double x) {
    if (isnan(x))
        return (uint16_t)(signbit(x) ? 0xfe00u : 0x7e00u);
    const uint16_t sign = signbit(x) ? 0x8000u : 0u;
    if (isinf(x))
        return (uint16_t)(sign | 0x7c00u);
    const double r = round_to_format(x, 11, -14);
    if (fabs(r) > 65504.0)
        return (uint16_t)(sign | 0x7c00u);
    const uint32_t u = f32_bits((float)r);
    const int32_t exp = (int32_t)((u >> 23) & 0xffu) - 127;
    if (r == 0.0)
        return sign;
    if (exp < -14) /* subnormal half: value = man * 2^-24 */
        return (uint16_t)(sign | (uint16_t)(fabs(r) * 0x1p24));
    return (uint16_t)(sign | (uint16_t)((exp + 15) << 10) | (uint16_t)((u >> 13) & 0x3ffu));
}

uint16_t sdpa__f64_to_bf16(double x) {
    if (isnan(x))
        return (uint16_t)(signbit(x) ? 0xffc0u : 0x7fc0u);
    const double r = round_to_format(x, 8, -126);
    /* Beyond the largest finite bfloat16 (0x7f7f) the grid point is 2^128: (float) gives inf. */
    const float f = fabs(r) > 0x1.fep127 ? (r < 0 ? -INFINITY : INFINITY) : (float)r;
    return (uint16_t)(f32_bits(f) >> 16);
}
