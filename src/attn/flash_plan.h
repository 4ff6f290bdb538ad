/*
 * flash_plan.h — what the files of the tiled forward share: the plan of a call (flash_plan:
 * its tile sizes, tasks, split-KV chunks and widened heads, made by flash_plan.c), a task's
 * block of query rows (task_rows), and the slices of keys a task visits (key_slice, walked by
 * flash_slices.c); flash.c runs the tasks. The plan's decomposition depends on the problem and
 * the micro-kernel table only; whether heads are widened also on the workers, which changes no
 * bit of the results.
 */
#ifndef SDPA_FLASH_PLAN_H
#define SDPA_FLASH_PLAN_H

#include "flash.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

enum { TARGET_ROWS = 128, KEY_TILE = 64, KEY_SLICE = 16 };

typedef struct flash_plan {
    const sdpa__problem *p;
    const sdpa__ukernels *uk;
    const sdpa__mx_kernels *mx; /* the matrix unit's entries, where they fit (else NULL) */
    sdpa_tensor *out, *lse;
    sdpa_tensor *weights;   /* sdpa_weights' output (weights_task), else NULL */
    int64_t bq;             /* query positions per task */
    int64_t n_qb;           /* query blocks per (b, hk) */
    int64_t n_chunks;       /* key chunks per (b, hk, query block): 1 = no split */
    int64_t key_tile;       /* keys per tile: KEY_TILE, or the matrix unit's MX_KEY_TILE */
    int64_t chunk;          /* keys per chunk (a multiple of key_tile) when n_chunks > 1 */
    float *part_o;          /* split: [block][row][chunk][Dv], each chunk's normalised O */
    double *part_lse;       /* split: [block][row][chunk], each chunk's LSE (-inf: no key) */
    int64_t rp;             /* padded row capacity: group * bq rounded up to lanes */
    int64_t dvp;            /* row stride of the output accumulator */
    int q_direct;           /* Q is f32 with unit feature stride: its rows are read in place */
    int k_direct;           /* K is f32 with unit feature stride: read in place */
    int v_direct;           /* likewise V */
    int k_half, v_half;     /* K (V) is f16 or bf16 with unit feature stride: few-row tasks
                             * read it in place (qk_few_half, pv_few) */
    int wide_k, wide_v;     /* K (V) is read from the worker's widened head (flash_plan.c) */
    int64_t n_tiles;        /* tiles of KEY_TILE keys in Lk, when wide_k or wide_v */
    int needs_post;         /* softcap, ALiBi or a mask: every tile is post-processed */
    int dropout;            /* the problem drops weights (philox.h) */
    float keep_scale;       /* 1 / (1 - p): a kept weight's factor */
    uint64_t threshold;     /* keep iff the draw is below it */
    uint32_t key[2];        /* Philox's key from the seed and offset */
    atomic_int *overflowed; /* set by a task whose accumulator reached +-inf (see flash.c's end) */
    size_t per_worker;      /* bytes of scratch per worker */
    char *scratch;
} flash_plan;

/* The plan's fields that depend on the problem and the table only (not the split). */
void sdpa__flash_plan_init(flash_plan *pl, const sdpa__impl *self, const sdpa__problem *p);

/* How many chunks the keys of each task are cut into (see SPLIT_TASKS in flash_plan.c), and how
 * long they are; from the problem only. */
void sdpa__flash_plan_split(flash_plan *pl);

/* Whether each of the `workers` keeps its head's K and V widened (flash_plan.c's
 * WIDE_MIN_BLOCKS). */
void sdpa__flash_plan_wide(flash_plan *pl, int workers);

/* A task's block of query rows: what flash_task and weights_task both start from. */
typedef struct task_rows {
    sdpa__problem seq;      /* where p is kept when the problem is a batch of sequences */
    const sdpa__problem *p; /* sequence b's problem (sdpa__seq) */
    int64_t b, hk, bh, qb;
    /* the block's positions [i0, i0 + nq_all) of the problem, of which the sequence has the
     * first nq (fewer when its length is ragged; the rest are written as fully masked rows) */
    int64_t i0, nq_all, nq;
    int64_t rows, rows_all; /* group x nq, group x nq_all */
} task_rows;

/* The keys a task visits, one slice at a time, tile by tile (the plan's key_tile keys, fewer at
 * the ends of the task's keys), each tile in up to two passes over its rows:
 * - pass 0: the rows that see every key of the tile, as far as whole groups of lanes hold
 *   them (all rows where the window cuts none), the tile in one slice, with no window to
 *   apply;
 * - pass 1: the others (those the window cuts through, next to the causal diagonal, and
 *   those that pass 0's lanes left out), in slices of KEY_SLICE keys (twice that for a
 *   matrix unit, whose P V takes 32 keys a tile: a 16-key slice cost it as much as 32;
 *   32-key slices ran a causal bf16 forward at 0.98-1.04 times the speed of 16-key ones,
 *   faster in 4 of 5 comparisons, bench/ab.py, 1 thread, an Intel Xeon with AMX), each
 *   computed only for the rows that see some key of it (rows are sorted by position, so
 *   those are one range, or two around pass 0's), so that most of the hidden triangle is
 *   skipped while the rows past it still take the tile at once.
 * For a matrix unit, a tile whose rows beyond pass 0's are few (merge_rows, rows not positions:
 * the causal diagonal's tile at D = 128 without GQA) is instead one slice of pass 0 over every row
 * that sees some key of it, the window applied to its scores: the hidden pairs it computes cost
 * less than a pass 1's calls (two of 32 keys: their K scans, V's pairs packed again, O updated
 * twice). A causal bf16 forward ran 1.027 and 1.055 times as fast at 1,8,2048,2048,128 and
 * 1,16,1024,1024,128 (bench/ab.py --best, 1 thread, an Intel Xeon with AMX). Where a whole tile
 * cuts more rows than that (128 keys, at D = 64) but its first half does not, the tile is that half
 * (and the next tile starts after it): 1.027 and 1.046 at 1,16,2048,2048,64 and 1,16,1024,1024,64
 * causal; taking the whole 128-key tile over every row instead gave 0.97-1.10 (noise).
 * Each row meets its keys in increasing order, though slices as a whole do not (pass 1, and
 * a second range of rows, go back to keys already visited). A slice of a paged cache never
 * crosses a page. */
typedef struct key_slice {
    int64_t jlo, jhi; /* the keys any row of the task may see, within its chunk */
    int64_t tile;     /* keys per tile (the plan's key_tile) */
    int64_t len;      /* this tile's: tile, or half of it */
    int64_t j0;       /* the tile: keys [ja, jb) of [j0, j0 + len) */
    int64_t ja, jb;
    int pass;       /* 0 or 1, as above */
    int64_t wa, wb; /* pass 0's rows, lane-aligned (wb may be the task's rows, or any row where
                       merged): empty if equal */
    int whole;      /* every row of the slice sees every key of it: pass 0, not merged */
    int64_t js, nk; /* the slice: keys [js, js + nk) */
    int64_t r0, r1; /* rows [r0, r1) see a key of it (of its tile, where merged); r0 a
                       multiple of the lanes */
    int64_t r1pad;  /* r1 rounded up to the lanes */
    int64_t r1use;  /* r1pad, or the task's rows if fewer */
    int64_t more0, more1; /* pass 1: the slice's rows past pass 0's, still to come */
    int64_t merge_rows;   /* pass 0 takes every row of the tile where this adds at most so many */
    int merged;           /* pass 0 took every row that sees some key of the tile */
} key_slice;

/* Sets sl before the first slice of task t's keys in chunk `chunk` (0 where the keys are
 * not split); sdpa__flash_slices_next then moves from slice to slice. */
void sdpa__flash_slices_begin(const flash_plan *pl, const task_rows *t, int64_t chunk,
                              key_slice *sl);

/* Moves to the next slice that some row sees. @return 0 when there is none. */
int sdpa__flash_slices_next(const flash_plan *pl, const task_rows *t, key_slice *sl);

#endif /* SDPA_FLASH_PLAN_H */
