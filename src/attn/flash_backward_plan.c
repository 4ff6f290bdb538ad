/*
 * flash_backward_plan.c — the schedule of the tiled backward (flash_backward_plan.h; the
 * schedules themselves are described at the top of flash_backward.c): each pair's key blocks
 * cut into chunks of about equal work, from the problem alone, so that dQ is summed in one
 * order whatever the workers; the pairs a wave of the one-pass schedule holds within the
 * budget; whether those waves keep the workers busy enough, or two kinds of task run instead;
 * and whether tasks keep their rows of Q and dO widened. Nothing here touches a tensor.
 */
#include "flash_backward_plan.h"

#include <math.h>

/* A task's query rows widened once. Where Q or dO cannot be read in place (f16, bf16, or a
 * feature stride), tile_a would widen a tile's rows for every key block it meets them with:
 * a chunk of n steps widens each of its rows n times. Instead a task of the one-pass schedule
 * keeps its chunk's rows of Q and dO (every query head of the group, whole query blocks)
 * widened to f32 in its worker's scratch, a query block at a time, the first time one of its
 * tiles reads it. Widening is exact, so the gradients are the same bits with or without it.
 * Used when some chunk takes at least two steps and the workers' rows take at most
 * WIDE_MAX_BYTES in all; if the allocator refuses them, the call runs without. (B=1 L=2048,
 * 2 threads on an Intel Xeon with AVX-512: the f16 backward 2.4 % faster at H=16 D=64 and
 * 1.8 % at H=8 D=128, bf16 6 % at D=64; with 8 query heads to a kv head, where a step takes
 * 4 key blocks, alike.) */
#define WIDE_MAX_BYTES ((size_t)32 << 20)

/* Splits a pair's key blocks into n chunks of about equal work (a block's work: the query rows
 * that see it, times the group; chunk c starts at the first block before which the work done
 * reaches c/n of the total) and finds each chunk's rows. @return the bytes of one pair's
 * partials, as a double: the offsets (chunk_at) are set only when they fit an int64_t. */
static double plan_chunks(bwd_plan *pl, int n) {
    const sdpa__problem *p = pl->p;
    int64_t total = 0, first, last;
    for (int64_t kb = 0; kb < pl->n_kb; kb++) {
        sdpa__bwd_block_rows(pl, kb, &first, &last);
        total += last > first ? last - first : 0;
    }
    int64_t done = 0; /* <= n_kb Lq < 2^56, and n <= 8 */
    int c = 1;
    pl->chunk_kb[0] = 0;
    for (int64_t kb = 0; kb < pl->n_kb; kb++) {
        while (c < n && done * n >= c * total)
            pl->chunk_kb[c++] = kb;
        sdpa__bwd_block_rows(pl, kb, &first, &last);
        done += last > first ? last - first : 0;
    }
    while (c <= n)
        pl->chunk_kb[c++] = pl->n_kb;
    int64_t all_rows = 0;
    for (c = 0; c < n; c++) {
        int64_t lo = p->Lq, hi = 0;
        for (int64_t kb = pl->chunk_kb[c]; kb < pl->chunk_kb[c + 1]; kb++) {
            sdpa__bwd_block_rows(pl, kb, &first, &last);
            if (first < last) {
                lo = first < lo ? first : lo;
                hi = last > hi ? last : hi;
            }
        }
        pl->chunk_lo[c] = lo < hi ? lo : 0;
        pl->chunk_hi[c] = lo < hi ? hi : 0;
        all_rows += pl->chunk_hi[c] - pl->chunk_lo[c];
    }
    pl->n_chunks = n;
    const double bytes = (double)p->group * (double)all_rows * (double)pl->dkp * sizeof(float);
    if (bytes <= 0x1p62) {
        pl->chunk_at[0] = 0;
        for (c = 0; c < n; c++)
            pl->chunk_at[c + 1] =
                pl->chunk_at[c] + p->group * (pl->chunk_hi[c] - pl->chunk_lo[c]) * pl->dkp;
    }
    return bytes;
}

/* The pairs a wave of the one-pass schedule holds with n chunks of `bytes` each pair, within
 * `budget`: up to TARGET_TASKS tasks; 0 where no wave of two tasks fits (unless the problem
 * has but one task). */
static int64_t wave_pairs(const bwd_plan *pl, int n, double bytes, size_t budget) {
    const int64_t pairs = pl->p->B * pl->p->Hkv, enough = (TARGET_TASKS + n - 1) / n;
    const int64_t most = enough < pairs ? enough : pairs;
    const double fit = bytes > 0.0 ? floor((double)budget / bytes) : (double)pairs;
    const int64_t wave = fit >= (double)most ? most : (int64_t)fit;
    return wave >= 1 && (wave * n >= 2 || pairs * pl->n_kb < 2) ? wave : 0;
}

/* The chunks of a pair, from the problem alone: as many as TARGET_TASKS asks (at most
 * MAX_CHUNKS and the key blocks), or the most for which a wave of two tasks fits DQ_BUDGET;
 * where none does, 1 (several pairs, or one pair of one key block) or 2 (one pair, which then
 * takes two tasks). sdpa__bwd_plan_schedule then plans them. */
static int chunk_count(bwd_plan *pl) {
    const int64_t pairs = pl->p->B * pl->p->Hkv;
    int64_t most = (TARGET_TASKS + pairs - 1) / pairs;
    most = most < MAX_CHUNKS ? most : MAX_CHUNKS;
    most = most < pl->n_kb ? most : pl->n_kb;
    for (int n = (int)most; n >= 1; n--)
        if (wave_pairs(pl, n, plan_chunks(pl, n), DQ_BUDGET) >= 1)
            return n;
    return pairs >= 2 || most < 2 ? 1 : 2;
}

/* Whether the one-pass schedule's waves of `wave` pairs, n tasks a pair, keep `workers` busy
 * at least 5/7 of the time: the rounds of `workers` tasks they take (the last wave may hold
 * fewer pairs), in which its five products take no longer than the seven of two kinds of task
 * spread over every worker. (Tasks of a pair are of equal work, causal ones too.) */
static int busy_enough(int64_t pairs, int n, int64_t wave, int workers) {
    const int64_t rest = pairs % wave, per_wave = (wave * n + workers - 1) / workers;
    const int64_t rounds = pairs / wave * per_wave + (rest * n + workers - 1) / workers;
    return 7 * pairs * n >= 5 * rounds * workers;
}

void sdpa__bwd_plan_schedule(bwd_plan *pl, const sdpa__bwd_tuning *tuning, int workers) {
    const int64_t pairs = pl->p->B * pl->p->Hkv;
    int n = tuning->chunks;
    if (n >= 1) {
        n = n < MAX_CHUNKS ? n : MAX_CHUNKS;
        n = n < pl->n_kb ? n : (int)pl->n_kb;
    } else {
        n = chunk_count(pl);
    }
    const double bytes = plan_chunks(pl, n);
    pl->fused = 1;
    pl->wave_pairs = wave_pairs(pl, n, bytes, tuning->dq_budget);
    if (pl->wave_pairs >= 1 && (!tuning->adapt || busy_enough(pairs, n, pl->wave_pairs, workers)))
        return;
    const int64_t need = (workers + n - 1) / n; /* pairs for a task for every worker */
    const size_t most = tuning->dq_budget > GROWN_BUDGET ? tuning->dq_budget : GROWN_BUDGET;
    if (tuning->adapt && need <= pairs && (double)need * bytes <= (double)most &&
        busy_enough(pairs, n, need, workers)) {
        pl->wave_pairs = need;
        return;
    }
    pl->fused = 0;
}

void sdpa__bwd_plan_wide(bwd_plan *pl, int workers, int want) {
    const sdpa__problem *p = pl->p;
    pl->wide = 0;
    pl->wide_blocks = 0;
    if (!pl->fused || (pl->q_direct && pl->do_direct) || want < 0)
        return;
    int64_t blocks = 0, steps = 0;
    for (int c = 0; c < pl->n_chunks; c++) {
        const int64_t lo = pl->chunk_lo[c], hi = pl->chunk_hi[c];
        const int64_t span = lo < hi ? (hi + QUERY_BLOCK - 1) / QUERY_BLOCK - lo / QUERY_BLOCK : 0;
        const int64_t n =
            (pl->chunk_kb[c + 1] - pl->chunk_kb[c] + pl->key_group - 1) / pl->key_group;
        blocks = span > blocks ? span : blocks;
        steps = n > steps ? n : steps;
    }
    const double floats = (double)(pl->q_direct ? 0 : p->Dk) + (double)(pl->do_direct ? 0 : p->Dv);
    const double bytes =
        (double)workers * (double)p->group * (double)blocks * QUERY_BLOCK * floats * sizeof(float);
    if (blocks == 0 || (want == 0 && (steps < 2 || bytes > (double)WIDE_MAX_BYTES)))
        return;
    pl->wide = 1;
    pl->wide_blocks = blocks;
}
