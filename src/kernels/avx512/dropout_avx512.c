/*
 * dropout_avx512.c — dropout's factors for one row of keys with AVX-512F (ukernels.h,
 * dropout_row): Philox4x32-10 (core/philox.c) run on 16 counters at once, so a step gives the
 * draws of 64 consecutive keys (a forward key tile). Compiled with the table's AVX-512 flags
 * for this file only. Results are bitwise sdpa__dropout_row_generic's.
 *
 * _mm512_mul_epu32 multiplies 32-bit lanes into 64-bit products only in the even lanes, so
 * the counters are held as two groups of 8, a word per 64-bit lane in its low half: a
 * product's high half is then one shift away and its low half is already in place (the high
 * half of a lane is garbage that the multiplication ignores and the XORs carry along). A
 * round of a group is 2 multiplications, 2 shifts and 2 three-way XORs (vpternlogd), and no
 * shuffle: the shuffles that packing the products back into 32-bit lanes takes all compete
 * for one port (measured 15% slower). The round keys are formed by additions (any port) to
 * the broadcast key rather than by a broadcast each (one port).
 *
 * In rounds 1 and 2 only word 0 of the counter differs between the lanes (words 1..3 are i,
 * h and b), so one of each round's two products is the same for every lane and is taken once
 * in scalar. After round 10, two two-source permutes per group pair the words of each
 * counter, (w0 w1) and (w2 w3), and two more put them in order, key 4 c + w for counter c.
 * The decision draw < threshold is an unsigned compare with threshold - 1 (<=), which keeps
 * every draw at threshold = 2^32; threshold 0 (drop all) is done apart.
 */
#include "../ukernels.h"

#include "../../core/philox.h"

#include <immintrin.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

enum { ROUNDS = 10, COUNTERS = 16, KEYS = 4 * COUNTERS };

/* x ^ y ^ z in one instruction (the truth table of a three-way XOR) */
#define XOR3 0x96

/* A counter word of 8 counters: one per 64-bit lane, the word in the low half; the high half
 * is ignored (and may be anything), as _mm512_mul_epu32 ignores it. */
typedef __m512i word8;

/* The factors of the 64 keys 4 jq .. 4 jq + 63 into out[0, 64), for row (b, h, i) under the
 * key (k0, k1), whose words kv0 and kv1 are broadcast. */
INLINE void step(uint32_t k0, uint32_t k1, __m512i kv0, __m512i kv1, uint32_t jq, uint32_t i,
                 uint32_t h, uint32_t b, __m512i tm1, __m512 keep, float *out) {
    const __m512i m0 = _mm512_set1_epi64(SDPA__PHILOX_M0), m1 = _mm512_set1_epi64(SDPA__PHILOX_M1);
    const __m512i lane = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
    /* Rounds 1 and 2: only word 0 of the counter differs between the lanes, so one of each
     * round's two products is the same for all of them, and taken once in scalar. */
    const uint64_t p1 = (uint64_t)SDPA__PHILOX_M1 * h;
    const uint32_t u0 = (uint32_t)(p1 >> 32) ^ i ^ k0, u1 = (uint32_t)p1; /* round 1 */
    const uint64_t p0 = (uint64_t)SDPA__PHILOX_M0 * u0;                   /* round 2 */
    word8 c0[2], c1[2], c2[2], c3[2];
    for (int x = 0; x < 2; x++) {
        const word8 ctr = _mm512_add_epi64(_mm512_set1_epi64(jq + 8u * (uint32_t)x), lane);
        const __m512i q0 = _mm512_mul_epu32(ctr, m0);
        const word8 v2 =
            _mm512_xor_si512(_mm512_srli_epi64(q0, 32), _mm512_set1_epi32((int)(b ^ k1)));
        const __m512i q1 = _mm512_mul_epu32(v2, m1);
        c0[x] = _mm512_xor_si512(_mm512_srli_epi64(q1, 32),
                                 _mm512_set1_epi32((int)(u1 ^ (k0 + SDPA__PHILOX_W0))));
        c1[x] = q1;
        c2[x] = _mm512_xor_si512(
            q0, _mm512_set1_epi32((int)((uint32_t)(p0 >> 32) ^ (k1 + SDPA__PHILOX_W1))));
        c3[x] = _mm512_set1_epi32((int)(uint32_t)p0);
    }
    for (int r = 2; r < ROUNDS; r++) {
        /* round r (from 0)'s keys, by an addition (any port) rather than a broadcast (one port) */
        const __m512i r0 =
            _mm512_add_epi32(kv0, _mm512_set1_epi32((int)(SDPA__PHILOX_W0 * (uint32_t)r)));
        const __m512i r1 =
            _mm512_add_epi32(kv1, _mm512_set1_epi32((int)(SDPA__PHILOX_W1 * (uint32_t)r)));
        for (int x = 0; x < 2; x++) {
            const __m512i q0 = _mm512_mul_epu32(c0[x], m0), q1 = _mm512_mul_epu32(c2[x], m1);
            c0[x] = _mm512_ternarylogic_epi32(_mm512_srli_epi64(q1, 32), c1[x], r0, XOR3);
            c1[x] = q1;
            c2[x] = _mm512_ternarylogic_epi32(_mm512_srli_epi64(q0, 32), c3[x], r1, XOR3);
            c3[x] = q0;
        }
    }
    /* the transpose: (w0 w1) and (w2 w3) pairs of each group's 8 counters, then quadruples of
     * 4 counters, key 4 (jq + l) + w */
    const __m512i pair =
        _mm512_setr_epi32(0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
    const __m512i quad_lo =
        _mm512_setr_epi32(0, 1, 16, 17, 2, 3, 18, 19, 4, 5, 20, 21, 6, 7, 22, 23);
    const __m512i quad_hi =
        _mm512_setr_epi32(8, 9, 24, 25, 10, 11, 26, 27, 12, 13, 28, 29, 14, 15, 30, 31);
    for (int x = 0; x < 2; x++) {
        const __m512i p01 = _mm512_permutex2var_epi32(c0[x], pair, c1[x]);
        const __m512i p23 = _mm512_permutex2var_epi32(c2[x], pair, c3[x]);
        const __m512i d0 = _mm512_permutex2var_epi32(p01, quad_lo, p23);
        const __m512i d1 = _mm512_permutex2var_epi32(p01, quad_hi, p23);
        _mm512_storeu_ps(out + 32 * x, _mm512_maskz_mov_ps(_mm512_cmple_epu32_mask(d0, tm1), keep));
        _mm512_storeu_ps(out + 32 * x + 16,
                         _mm512_maskz_mov_ps(_mm512_cmple_epu32_mask(d1, tm1), keep));
    }
}

void sdpa__dropout_row_avx512(const uint32_t key[2], int64_t b, int64_t h, int64_t i, int64_t j0,
                              int64_t n, uint64_t threshold, float keep_scale, float *z) {
    if (threshold == 0) {
        for (int64_t jj = 0; jj < n; jj++)
            z[jj] = 0.0f;
        return;
    }
    const __m512i kv0 = _mm512_set1_epi32((int)key[0]), kv1 = _mm512_set1_epi32((int)key[1]);
    const __m512i tm1 = _mm512_set1_epi32((int)(uint32_t)(threshold - 1));
    const __m512 keep = _mm512_set1_ps(keep_scale);
    /* each counter word is its index mod 2^32, as sdpa__dropout_draws4 takes it */
    const uint32_t bw = (uint32_t)b, hw = (uint32_t)h, iw = (uint32_t)i;
    uint32_t jq = (uint32_t)(j0 / 4);
    /* key 4 jq, where a step starts, is z[at]: at < 0 while the first counter's keys before
     * j0 are skipped */
    for (int64_t at = -(j0 % 4); at < n; at += KEYS, jq += COUNTERS) {
        if (at >= 0 && n - at >= KEYS) {
            step(key[0], key[1], kv0, kv1, jq, iw, hw, bw, tm1, keep, z + at);
        } else { /* the row's first or last keys: a whole step, of which part is kept */
            float part[KEYS];
            step(key[0], key[1], kv0, kv1, jq, iw, hw, bw, tm1, keep, part);
            const int64_t lo = at < 0 ? -at : 0, hi = n - at < KEYS ? n - at : KEYS;
            memcpy(z + at + lo, part + lo, (size_t)(hi - lo) * sizeof *z);
        }
    }
}
