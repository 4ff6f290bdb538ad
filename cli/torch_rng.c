/*
 * torch_rng.c — see torch_rng.h.
 */
#include "torch_rng.h"

#include <math.h>

void torch_rng_seed(torch_rng *r, uint64_t seed) {
    r->mt[0] = (uint32_t)seed;
    for (int i = 1; i < 624; i++)
        r->mt[i] = 1812433253u * (r->mt[i - 1] ^ (r->mt[i - 1] >> 30)) + (uint32_t)i;
    r->index = 624;
    r->has_cached = 0;
    r->cached = 0.0;
}

/* Regenerates the 624 words of state (the "twist"). */
static void twist(torch_rng *r) {
    for (int i = 0; i < 624; i++) {
        const uint32_t y = (r->mt[i] & 0x80000000u) | (r->mt[(i + 1) % 624] & 0x7fffffffu);
        r->mt[i] = r->mt[(i + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
    }
    r->index = 0;
}

uint32_t torch_rng_u32(torch_rng *r) {
    if (r->index >= 624)
        twist(r);
    uint32_t y = r->mt[r->index++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

/* A float uniform in [0, 1) from the low 24 bits of one draw. */
static float uniform_f32(torch_rng *r) {
    return (float)(torch_rng_u32(r) & 0xffffffu) * 0x1p-24f;
}

/* A double uniform in [0, 1) from the low 53 bits of two draws. */
static double uniform_f64(torch_rng *r) {
    const uint64_t hi = torch_rng_u32(r), lo = torch_rng_u32(r);
    const uint64_t bits = (hi << 32) | lo;
    return (double)(bits & ((1ull << 53) - 1)) * 0x1p-53;
}

/* Box-Muller over 16 uniforms in place: pairs (j, j + 8). */
static void normal_16(float *data) {
    const double two_pi = 6.283185307179586476925286766559;
    for (int j = 0; j < 8; j++) {
        const float u1 = 1.0f - data[j]; /* (0, 1] for the log */
        const float u2 = data[j + 8];
        const float radius = sqrtf(-2.0f * logf(u1));
        const float theta = (float)(two_pi * (double)u2);
        data[j] = radius * cosf(theta);
        data[j + 8] = radius * sinf(theta);
    }
}

void torch_rng_randn(torch_rng *r, float *out, int64_t n) {
    if (n >= 16) {
        for (int64_t i = 0; i < n; i++)
            out[i] = uniform_f32(r);
        for (int64_t i = 0; i + 16 <= n; i += 16)
            normal_16(out + i);
        if (n % 16 != 0) { /* the tail: redraw the last 16 and transform them again */
            float *tail = out + n - 16;
            for (int i = 0; i < 16; i++)
                tail[i] = uniform_f32(r);
            normal_16(tail);
        }
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        if (r->has_cached) {
            r->has_cached = 0;
            out[i] = (float)r->cached;
            continue;
        }
        const double u1 = uniform_f64(r), u2 = uniform_f64(r);
        const double radius = sqrt(-2.0 * log1p(-u2));
        const double theta = 2.0 * 3.14159265358979323846 * u1;
        r->cached = radius * sin(theta);
        r->has_cached = 1;
        out[i] = (float)(radius * cos(theta));
    }
}
