/*
 * half.h — conversions between binary16 / bfloat16 storage and wider floats.
 *
 * Widening (f16/bf16 -> f32) is exact. Narrowing (f64 -> f16/bf16) rounds once, to nearest
 * with ties to even, whatever the host's floating-point rounding mode: the reference rounds
 * its double results straight to the output type, never through f32 (which would round
 * twice). Values beyond the largest finite half become infinities, NaN stays NaN.
 */
#ifndef SDPA_HALF_H
#define SDPA_HALF_H

#include "sdpa.h"

#include <stdint.h>

float sdpa__f16_to_f32(uint16_t h);
float sdpa__bf16_to_f32(uint16_t h);
uint16_t sdpa__f64_to_f16(double x);
uint16_t sdpa__f64_to_bf16(double x);

/* Reads element `offset` (in elements) of an F32/F16/BF16 array as float. BOOL reads as
 * 0 or 1. */
static inline float sdpa__load(const void *base, sdpa_dtype dtype, int64_t offset) {
    switch (dtype) {
    case SDPA_F32:
        return ((const float *)base)[offset];
    case SDPA_F16:
        return sdpa__f16_to_f32(((const uint16_t *)base)[offset]);
    case SDPA_BF16:
        return sdpa__bf16_to_f32(((const uint16_t *)base)[offset]);
    case SDPA_BOOL:
        return ((const unsigned char *)base)[offset] != 0 ? 1.0f : 0.0f;
    }
    return 0.0f;
}

/* Writes x, rounded once to the dtype, at element `offset`. BOOL is not an output type. */
static inline void sdpa__store(void *base, sdpa_dtype dtype, int64_t offset, double x) {
    switch (dtype) {
    case SDPA_F32:
        ((float *)base)[offset] = (float)x;
        break;
    case SDPA_F16:
        ((uint16_t *)base)[offset] = sdpa__f64_to_f16(x);
        break;
    case SDPA_BF16:
        ((uint16_t *)base)[offset] = sdpa__f64_to_bf16(x);
        break;
    case SDPA_BOOL:
        break;
    }
}

#endif /* SDPA_HALF_H */
