/*
 * dropout_avx2.c — dropout's factors for one row of keys with AVX2 (ukernels.h, dropout_row):
 * Philox4x32-10 (core/philox.c) run on 8 counters at once, so a step gives the draws of 32
 * consecutive keys (two steps, 64 keys, where the row has them). Compiled with -mavx2 for
 * this file only. Results are bitwise sdpa__dropout_row_generic's.
 *
 * AVX2 multiplies 32-bit lanes into 64-bit products only in the even lanes
 * (_mm256_mul_epu32), so the counters are held as groups of 4, a word per 64-bit lane in its
 * low half: a product's high half is then one shift away and its low half is already in
 * place (the high half of a lane is garbage that the multiplication ignores and the XORs
 * carry along), with no shuffle or blend to pack the halves back into 32-bit lanes. A round
 * of a group is 2 multiplications, 2 shifts and 4 XORs; the groups of a step are independent
 * chains, so that one's multiplication latency hides behind the others' work (4 groups, a
 * forward key tile of 64 keys, measured 10% faster a key than 2, though their 16 words fill
 * the 16 ymm registers and some live on the stack).
 *
 * In rounds 1 and 2 only word 0 of the counter differs between the lanes (words 1..3 are i,
 * h and b), so one of each round's two products is the same for every lane and is taken once
 * in scalar. After round 10, a group's words are paired in each 64-bit lane, (w0 w1) and
 * (w2 w3), and two unpacks and two 128-bit permutes put the keys in order, key 4 c + w for
 * counter c. The keep decision draw < threshold is taken unsigned as
 * min(draw, threshold - 1) == draw, which holds for every draw when threshold = 2^32;
 * threshold 0 (drop all) is done apart.
 */
#include "../ukernels.h"

#include "../../core/philox.h"

#include <immintrin.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

/* GROUP_KEYS: the keys of a group of 4 counters; a step has 2 groups (32 keys) or 4. */
enum { ROUNDS = 10, GROUP_KEYS = 16, MAX_GROUPS = 4 };

/* A word of a group of 4 counters: one per 64-bit lane, the word in the low half; the high
 * half is ignored (and may be anything), as _mm256_mul_epu32 ignores it. */
typedef __m256i word4;

/* The factors of the 16 * groups keys from key 4 jq on into out[0, 16 * groups), for row (b, h, i)
 * under the key (k0, k1); rk holds the round keys of rounds 2..9 (counting from 0), words 0 and 1
 * of round r at 2 (r - 2) and 2 (r - 2) + 1. */
INLINE void step(int groups, uint32_t k0, uint32_t k1, const __m256i rk[2 * (ROUNDS - 2)],
                 uint32_t jq, uint32_t i, uint32_t h, uint32_t b, __m256i tm1, __m256 keep,
                 float *out) {
    const __m256i m0 = _mm256_set1_epi64x(SDPA__PHILOX_M0),
                  m1 = _mm256_set1_epi64x(SDPA__PHILOX_M1);
    const __m256i lane = _mm256_setr_epi64x(0, 1, 2, 3);
    /* Rounds 1 and 2: only word 0 of the counter differs between the lanes, so one of each
     * round's two products is the same for all of them, and taken once in scalar. */
    const uint64_t p1 = (uint64_t)SDPA__PHILOX_M1 * h;
    const uint32_t u0 = (uint32_t)(p1 >> 32) ^ i ^ k0, u1 = (uint32_t)p1; /* round 1 */
    const uint64_t p0 = (uint64_t)SDPA__PHILOX_M0 * u0;                   /* round 2 */
    word4 c0[MAX_GROUPS], c1[MAX_GROUPS], c2[MAX_GROUPS], c3[MAX_GROUPS];
    for (int x = 0; x < groups; x++) {
        const word4 ctr = _mm256_add_epi64(_mm256_set1_epi64x(jq + 4u * (uint32_t)x), lane);
        const __m256i q0 = _mm256_mul_epu32(ctr, m0);
        const word4 v2 =
            _mm256_xor_si256(_mm256_srli_epi64(q0, 32), _mm256_set1_epi32((int)(b ^ k1)));
        const __m256i q1 = _mm256_mul_epu32(v2, m1);
        c0[x] = _mm256_xor_si256(_mm256_srli_epi64(q1, 32),
                                 _mm256_set1_epi32((int)(u1 ^ (k0 + SDPA__PHILOX_W0))));
        c1[x] = q1;
        c2[x] = _mm256_xor_si256(
            q0, _mm256_set1_epi32((int)((uint32_t)(p0 >> 32) ^ (k1 + SDPA__PHILOX_W1))));
        c3[x] = _mm256_set1_epi32((int)(uint32_t)p0);
    }
    for (int r = 2; r < ROUNDS; r++)
        for (int x = 0; x < groups; x++) {
            const __m256i q0 = _mm256_mul_epu32(c0[x], m0), q1 = _mm256_mul_epu32(c2[x], m1);
            c0[x] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(q1, 32), c1[x]),
                                     rk[2 * (r - 2)]);
            c1[x] = q1;
            c2[x] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(q0, 32), c3[x]),
                                     rk[2 * (r - 2) + 1]);
            c3[x] = q0;
        }
    /* the transpose, per group: each counter's words paired in its 64-bit lane, (w0 w1) and
     * (w2 w3), then counters (0 | 2) and (1 | 3) of the group in 128-bit halves, then in order */
    for (int x = 0; x < groups; x++) {
        const __m256i p01 = _mm256_blend_epi32(c0[x], _mm256_slli_epi64(c1[x], 32), 0xaa);
        const __m256i p23 = _mm256_blend_epi32(c2[x], _mm256_slli_epi64(c3[x], 32), 0xaa);
        const __m256i e = _mm256_unpacklo_epi64(p01, p23), o = _mm256_unpackhi_epi64(p01, p23);
        const __m256i d[2] = {_mm256_permute2x128_si256(e, o, 0x20),
                              _mm256_permute2x128_si256(e, o, 0x31)};
        for (int y = 0; y < 2; y++) {
            const __m256i kept = _mm256_cmpeq_epi32(_mm256_min_epu32(d[y], tm1), d[y]);
            _mm256_storeu_ps(out + GROUP_KEYS * x + 8 * y,
                             _mm256_and_ps(_mm256_castsi256_ps(kept), keep));
        }
    }
}

void sdpa__dropout_row_avx2(const uint32_t key[2], int64_t b, int64_t h, int64_t i, int64_t j0,
                            int64_t n, uint64_t threshold, float keep_scale, float *z) {
    if (threshold == 0) {
        for (int64_t jj = 0; jj < n; jj++)
            z[jj] = 0.0f;
        return;
    }
    __m256i rk[2 * (ROUNDS - 2)];
    uint32_t k0 = key[0] + 2 * SDPA__PHILOX_W0, k1 = key[1] + 2 * SDPA__PHILOX_W1;
    for (int r = 2; r < ROUNDS; r++, k0 += SDPA__PHILOX_W0, k1 += SDPA__PHILOX_W1) {
        rk[2 * (r - 2)] = _mm256_set1_epi32((int)k0);
        rk[2 * (r - 2) + 1] = _mm256_set1_epi32((int)k1);
    }
    const __m256i tm1 = _mm256_set1_epi32((int)(uint32_t)(threshold - 1));
    const __m256 keep = _mm256_set1_ps(keep_scale);
    /* each counter word is its index mod 2^32, as sdpa__dropout_draws4 takes it */
    const uint32_t bw = (uint32_t)b, hw = (uint32_t)h, iw = (uint32_t)i;
    uint32_t jq = (uint32_t)(j0 / 4);
    /* key 4 jq, where a step starts, is z[at]: at < 0 while the first counter's keys before
     * j0 are skipped */
    for (int64_t at = -(j0 % 4); at < n;) {
        const int groups = at >= 0 && n - at >= MAX_GROUPS * GROUP_KEYS ? MAX_GROUPS : 2;
        if (at >= 0 && n - at >= groups * GROUP_KEYS) {
            step(groups, key[0], key[1], rk, jq, iw, hw, bw, tm1, keep, z + at);
        } else { /* the row's first or last keys: a whole step, of which part is kept */
            float part[2 * GROUP_KEYS];
            step(2, key[0], key[1], rk, jq, iw, hw, bw, tm1, keep, part);
            const int64_t lo = at < 0 ? -at : 0;
            const int64_t hi = n - at < 2 * GROUP_KEYS ? n - at : 2 * GROUP_KEYS;
            memcpy(z + at + lo, part + lo, (size_t)(hi - lo) * sizeof *z);
        }
        at += groups * GROUP_KEYS;
        jq += 4 * (uint32_t)groups;
    }
}
