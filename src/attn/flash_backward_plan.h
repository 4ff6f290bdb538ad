/*
 * flash_backward_plan.h — what the tiled backward (flash_backward.c) and its schedule
 * (flash_backward_plan.c) share: the sizes of its blocks, the plan of a call (bwd_plan), and
 * the query rows that see a block of keys. flash_backward_plan.c chooses the schedule (the
 * chunks of key blocks, the waves, one pass or two kinds of task) and whether tasks keep their
 * rows of Q and dO widened; flash_backward.c runs it. The chunks come from the problem alone;
 * the rest may follow the workers and the memory, and changes no bit of the gradients.
 */
#ifndef SDPA_FLASH_BACKWARD_PLAN_H
#define SDPA_FLASH_BACKWARD_PLAN_H

#include "flash.h"

#include <stddef.h>
#include <stdint.h>

/* Keys per block (a step of a chunk, a task of kind A, a tile of kind B); query rows per tile
 * of kind A and per task of kind B. Every scratch tile holds QUERY_BLOCK x KEY_BLOCK floats:
 * row-major in tile_a (a query row's keys along the lanes, rows one after the other), and
 * transposed in tile_b (a key's query rows along the lanes). Both are multiples of every
 * table's lanes; WIDE is the larger. (128 keys to a block measured no faster, at L = 2048 and
 * 8192.) */
enum { QUERY_BLOCK = 64, KEY_BLOCK = 64, WIDE = KEY_BLOCK > QUERY_BLOCK ? KEY_BLOCK : QUERY_BLOCK };

/* The one-pass schedule's tasks per wave: TARGET_TASKS (pairs times chunks) where the problem
 * and the budget allow, so that every worker has one at 16; more only add partials to write
 * and sum (at B=1 H=16 L=2048 D=64 on two threads, 4 chunks per pair took 10 % longer than 1
 * or 2, which measured alike). At most MAX_CHUNKS chunks per pair. */
enum { TARGET_TASKS = 16, MAX_CHUNKS = 8 };

/* The most bytes of dQ partials held at once (sdpa__flash_backward), and the budget that sets
 * the chunks per pair (chunk_count). Where a wave of two tasks passes it (long sequences with
 * large query groups), the chunks are 2 for a single pair of several key blocks, else 1, and
 * the budget may grow to GROWN_BUDGET for waves with a task for every worker that keep them
 * busy enough (busy_enough), where the one-pass schedule's five products beat the seven of
 * two kinds of task (B=1 Hq=8 Hkv=1 L=8192 D=128 and Hq=4 Hkv=1 L=16384 on 2 threads:
 * 1.34-1.41x, docs/benchmarks.md, 2026-11-28, 01:08 UTC); elsewhere two kinds, which give the
 * same bits. */
#define DQ_BUDGET ((size_t)32 << 20)
#define GROWN_BUDGET ((size_t)1 << 30)

typedef struct bwd_plan {
    const sdpa__problem *p;
    const sdpa__ukernels *uk;
    const sdpa_tensor *out, *lse, *dout;
    sdpa_tensor *dq, *dk, *dv;
    float *delta;        /* (B, Hq, Lq): Delta_i */
    int64_t n_kb, n_qb;  /* key blocks, query blocks */
    int64_t n_a;         /* tasks of kind A; those of kind B follow */
    int64_t dkp, dvp;    /* row strides of the dK/dQ and dV accumulators */
    int key_group;       /* key blocks per step of a chunk (MAX_KEY_GROUP) */
    int q_direct;        /* Q is f32 with unit feature stride: its rows are read in place */
    int k_direct;        /* likewise K */
    int v_direct;        /* likewise V */
    int do_direct;       /* likewise dout */
    int wide;            /* tasks keep their rows of Q and dO widened (WIDE_MAX_BYTES) */
    int64_t wide_blocks; /* then: query blocks of the widest chunk's rows, per query head */
    int needs_post;      /* softcap, ALiBi or a mask: every tile is post-processed */
    int dropout;         /* the problem drops weights */
    float keep_scale;    /* 1 / (1 - p) */
    uint64_t threshold;  /* keep iff draw < threshold */
    uint32_t key[2];     /* the Philox key of (seed, offset) */
    /* The one-pass schedule (fused; else kinds A and B). Chunk c of a pair holds its key
     * blocks [chunk_kb[c], chunk_kb[c + 1]), which the query rows [chunk_lo[c], chunk_hi[c])
     * see (empty: lo = hi); its partial, rows (g, i) of the group's heads g, lies at chunk_at[c]
     * floats into the pair's, row (g, i) at (g (hi - lo) + i - lo) dkp. */
    int fused;
    int n_chunks;
    int64_t chunk_kb[MAX_CHUNKS + 1];
    int64_t chunk_lo[MAX_CHUNKS], chunk_hi[MAX_CHUNKS];
    int64_t chunk_at[MAX_CHUNKS + 1];
    int64_t wave_pairs; /* pairs per wave */
    int64_t wave0;      /* the running wave's first pair */
    float *part;        /* its partials: wave_pairs x chunk_at[n_chunks] floats */
    size_t per_worker;  /* bytes of scratch per worker */
    char *scratch;
} bwd_plan;

/* The query rows [*first, *last) that see some key of block kb (empty when first >= last). */
static inline void sdpa__bwd_block_rows(const bwd_plan *pl, int64_t kb, int64_t *first,
                                        int64_t *last) {
    const sdpa__problem *p = pl->p;
    const int64_t j0 = kb * KEY_BLOCK, j1 = j0 + KEY_BLOCK < p->Lk ? j0 + KEY_BLOCK : p->Lk;
    sdpa__block_queries(p, j0, j1, 0, p->Lq, first, last);
}

/* Chooses the schedule for `workers`: the one-pass one with the problem's chunks (or the
 * forced ones) in waves that fit the budget and, with `adapt`, keep the workers busy enough;
 * else, with `adapt`, in waves of the fewest pairs whose tasks are at least the workers
 * (fewer pairs than the budget's waves, or more: the budget grows), if the pairs are that
 * many, their partials take at most GROWN_BUDGET (or the budget, if larger) and the waves
 * keep the workers busy enough; else kinds A and B. Both give the same bits, so the choice may
 * follow the workers and the budget; the chunks may not. */
void sdpa__bwd_plan_schedule(bwd_plan *pl, const sdpa__bwd_tuning *tuning, int workers);

/* Whether the tasks keep their rows of Q and dO widened (WIDE_MAX_BYTES), for `workers`:
 * `want` 0 chooses by the rule, > 0 takes them wherever the one-pass schedule widens Q or dO,
 * < 0 never. */
void sdpa__bwd_plan_wide(bwd_plan *pl, int workers, int want);

#endif /* SDPA_FLASH_BACKWARD_PLAN_H */
