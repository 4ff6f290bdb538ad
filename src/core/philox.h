/*
 * philox.h — the counter-based generator behind dropout, and the keep decision it makes.
 *
 * Dropout must give the same mask to the forward, the backward and the reference, whatever
 * the tiling, the thread count or the order in which elements are visited. A counter-based
 * generator makes that free: the draw for element (b, h, i, j) is a pure function of the
 * seed, the offset and those four indices, computed where it is needed, with no state to
 * carry from one element to the next.
 *
 * The generator is Philox4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers:
 * as easy as 1, 2, 3", SC'11): a keyed bijection of 128-bit counters, 10 rounds of two
 * 32x32 -> 64-bit multiplications whose halves are exchanged and XORed with the key, and a
 * Weyl sequence as the key schedule.
 *
 * The mapping (the contract the fast kernels must reproduce):
 *   key     = seed + offset * 0x9E3779B97F4A7C15  (mod 2^64; word 0 the low half, 1 the high)
 *   counter = (j / 4, i, h, b)                     (one 32-bit word each, word 0 first)
 *   draw    = word (j % 4) of Philox4x32-10(counter, key)
 * - Distinct (b, h, i, j) never share a draw under one key: b, h, i and j are below
 *   SDPA_MAX_EXTENT = 2^31, so each fits its word whole, and (j / 4, j % 4) recovers j. One
 *   call serves four neighbouring keys, which is what a kernel vectorising along j wants.
 * - The indices are the problem's own (the query head h, not the kv head), never a position
 *   in a tile or a buffer, so no shape enters the mapping: a split of the keys or the queries
 *   (split-KV, ring attention) draws the same mask if it passes the global indices.
 * - For one seed, distinct offsets give distinct keys: multiplying by an odd constant (the
 *   64-bit golden ratio) is a bijection mod 2^64. Two (seed, offset) pairs share a key only
 *   when seed - seed' = (offset' - offset) * 0x9E3779B97F4A7C15 mod 2^64, and the golden
 *   ratio being the number hardest to approximate by fractions, that product stays more than
 *   2^33 away from 0 (either way round) for every offset difference in (0, 2^30): the minimum,
 *   1.24e10, is at the Fibonacci number 701408733, found by an exhaustive search (test_dropout.c
 *   repeats it over a shorter range). So pairs whose seeds differ by less than 2^33 and whose
 *   offsets differ by less than 2^30 never share a key, and a training step can advance the
 *   offset by one for a fresh, unrelated mask.
 *
 * The keep decision: keep iff draw < threshold(p), with
 *   threshold(p) = 2^32 - round(p * 2^32)   (round half up; p clamped to [0, 1], NaN as 0)
 * so the probability of keeping is exactly threshold / 2^32, which differs from 1 - p by at
 * most 2^-33 (p is a double; the drop probability is p rounded to a multiple of 2^-32).
 * p = 0 keeps everything, p = 1 drops everything. Kept weights are scaled by 1 / (1 - p),
 * computed from p itself, as PyTorch and FlashAttention do.
 */
#ifndef SDPA_PHILOX_H
#define SDPA_PHILOX_H

#include <stdint.h>

/* Philox4x32-10's constants (philox.c says how they enter a round), shared with the
 * vectorised generators (src/kernels/<isa>/dropout_<isa>.c): the multipliers of counter
 * words 0 and 2, and the key schedule's Weyl increments of key words 0 and 1. */
#define SDPA__PHILOX_M0 0xD2511F53u
#define SDPA__PHILOX_M1 0xCD9E8D57u
#define SDPA__PHILOX_W0 0x9E3779B9u
#define SDPA__PHILOX_W1 0xBB67AE85u

/* Philox4x32-10: out = the 10-round Philox bijection of ctr under key. out may be ctr. */
void sdpa__philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* The Philox key of (seed, offset), as the mapping above states. */
void sdpa__dropout_key(uint64_t seed, uint64_t offset, uint32_t key[2]);

/* The four draws of keys 4*jq .. 4*jq + 3 of row (b, h, i) under key: draw[j % 4]. Every
 * index in [0, 2^32); the extents of a validated problem are. */
void sdpa__dropout_draws4(const uint32_t key[2], int64_t b, int64_t h, int64_t i, int64_t jq,
                          uint32_t draw[4]);

/* The keep threshold of drop probability p, in [0, 2^32]: keep iff draw < threshold. */
uint64_t sdpa__dropout_threshold(double p);

/* The 32-bit draw of element (b, h, i, j). */
uint32_t sdpa__dropout_draw(uint64_t seed, uint64_t offset, int64_t b, int64_t h, int64_t i,
                            int64_t j);

/* Whether element (b, h, i, j) is kept under drop probability p: 1 or 0. The one decision
 * the forward, the backward and the reference all make. */
int sdpa__dropout_keep(uint64_t seed, uint64_t offset, int64_t b, int64_t h, int64_t i, int64_t j,
                       double p);

#endif /* SDPA_PHILOX_H */
