/*
 * philox.c — Philox4x32-10 and the dropout keep decision (see philox.h for the mapping of
 * (seed, offset, b, h, i, j) to key and counter, and for the threshold rule).
 *
 * Written from the description in Salmon et al., SC'11 (the section on Philox): each round
 * multiplies two of the four counter words by fixed constants, keeps both halves of the
 * 64-bit products, and forms the next four words as
 *     (hi(M1 * c2) ^ c1 ^ k0,  lo(M1 * c2),  hi(M0 * c0) ^ c3 ^ k1,  lo(M0 * c0))
 * — a Feistel-like network whose S-box is the multiplication and whose P-box is the word
 * permutation. Between rounds the key advances by the Weyl constants W0, W1 (the golden ratio
 * and sqrt(3) - 1 as 32-bit fractions), so every round sees a different round key.
 */
#include "philox.h"

enum { PHILOX_ROUNDS = 10 };

static const uint32_t PHILOX_M0 = SDPA__PHILOX_M0; /* multiplies word 0 */
static const uint32_t PHILOX_M1 = SDPA__PHILOX_M1; /* multiplies word 2 */
static const uint32_t PHILOX_W0 = SDPA__PHILOX_W0; /* key schedule of word 0 */
static const uint32_t PHILOX_W1 = SDPA__PHILOX_W1; /* key schedule of word 1 */

/* One round: c <- the round function of c under the round key k. */
static void philox_round(uint32_t c[4], const uint32_t k[2]) {
    const uint64_t p0 = (uint64_t)PHILOX_M0 * c[0];
    const uint64_t p1 = (uint64_t)PHILOX_M1 * c[2];
    const uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    const uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    const uint32_t c1 = c[1], c3 = c[3];
    c[0] = hi1 ^ c1 ^ k[0];
    c[1] = lo1;
    c[2] = hi0 ^ c3 ^ k[1];
    c[3] = lo0;
}

void sdpa__philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
    uint32_t k[2] = {key[0], key[1]};
    for (int r = 0; r < PHILOX_ROUNDS; r++) {
        if (r > 0) {
            /* the key schedule: round r uses key + r * (W0, W1), each word mod 2^32 */
            k[0] += PHILOX_W0;
            k[1] += PHILOX_W1;
        }
        philox_round(c, k);
    }
    for (int w = 0; w < 4; w++)
        out[w] = c[w];
}

void sdpa__dropout_key(uint64_t seed, uint64_t offset, uint32_t key[2]) {
    /* unsigned arithmetic wraps mod 2^64, which is the bijection philox.h relies on */
    const uint64_t k = seed + offset * UINT64_C(0x9E3779B97F4A7C15);
    key[0] = (uint32_t)k;
    key[1] = (uint32_t)(k >> 32);
}

void sdpa__dropout_draws4(const uint32_t key[2], int64_t b, int64_t h, int64_t i, int64_t jq,
                          uint32_t draw[4]) {
    const uint32_t ctr[4] = {(uint32_t)jq, (uint32_t)i, (uint32_t)h, (uint32_t)b};
    sdpa__philox4x32_10(ctr, key, draw);
}

uint64_t sdpa__dropout_threshold(double p) {
    const uint64_t one = UINT64_C(1) << 32;
    if (!(p > 0.0)) /* also NaN: no dropout */
        return one;
    if (p >= 1.0)
        return 0;
    /* p * 2^32 is exact (a power-of-two scaling of a double below 1), and so are its integer
     * part and the fraction left over: rounding them by hand keeps the result independent of
     * the floating-point rounding mode, which nearbyint() would not. */
    const double x = p * 4294967296.0;
    uint64_t drop = (uint64_t)x;
    if (x - (double)drop >= 0.5)
        drop++;
    return one - drop;
}

uint32_t sdpa__dropout_draw(uint64_t seed, uint64_t offset, int64_t b, int64_t h, int64_t i,
                            int64_t j) {
    uint32_t key[2], draw[4];
    sdpa__dropout_key(seed, offset, key);
    sdpa__dropout_draws4(key, b, h, i, j / 4, draw);
    return draw[j % 4];
}

int sdpa__dropout_keep(uint64_t seed, uint64_t offset, int64_t b, int64_t h, int64_t i, int64_t j,
                       double p) {
    return (uint64_t)sdpa__dropout_draw(seed, offset, b, h, i, j) < sdpa__dropout_threshold(p);
}
