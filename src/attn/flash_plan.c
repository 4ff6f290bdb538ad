/*
 * flash_plan.c — the plan of a tiled forward call (flash_plan.h): the rows of a task and the
 * keys of a tile, whether the matrix unit's entries take the problem, the cut of a decode
 * step's keys into chunks (split-KV), and whether each worker keeps its head's K and V
 * widened. Everything but the widened heads comes from the problem and the micro-kernel table
 * alone, never from the number of threads; the widened heads change no bit of the results.
 * Nothing here touches a tensor's data.
 */
#include "flash_plan.h"

#include "../core/philox.h"
#include "tile.h"

#include <string.h>

/* The rows of a task whose slices a matrix unit takes: each task reads all of its head's K
 * and V (looks them over for values the unit does not read as they are, packs V's pairs), so
 * that work is shared by more rows; its arithmetic per key is a few tile instructions. */
enum { MX_TARGET_ROWS = 256 };
/* The keys of a tile whose slices a matrix unit takes: P V's sums over a slice's keys are
 * added to the task's accumulator O (rows x Dv f32, out of L1) once a slice, so O's traffic
 * per key halves with every doubling of the slice, while V's pairs, which P V packs for the
 * slice and reads again for every 16 rows, grow with it. MX_KEY_TILE keys where those pairs
 * take at most MX_PAIRS_BYTES (a third of a 48 KiB L1), else KEY_TILE. On an Intel Xeon with
 * AMX (bench/mx_kernels.c: 1 thread, 1024 keys, the score stride below), 128 keys took the
 * forward's three steps from 29.2 to 27.9 TSC cycles per key and 16 rows at D = 64, and from
 * 43.3 to 47.0 at D = 128, where V's pairs for 128 keys take 32 KiB. */
enum { MX_KEY_TILE = 128, MX_PAIRS_BYTES = 16 << 10 };

/* Split-KV. A problem with fewer than SPLIT_TASKS tasks of (batch, kv head, query block) -- a
 * decode step: B x Hkv tasks of one or a few rows -- cannot keep many workers busy, so each
 * task's keys are cut into chunks of at least SPLIT_MIN_KEYS keys (a multiple of the key tile),
 * until there are about SPLIT_TASKS tasks or the partial results would pass SPLIT_MAX_BYTES.
 * Each chunk's task leaves a partial (O, LSE) and a second pass merges them in chunk order
 * (merge.h). The cut depends on the problem only, never on the number of threads. */
enum { SPLIT_TASKS = 32, SPLIT_MIN_KEYS = 512 };
#define SPLIT_MAX_BYTES ((size_t)32 << 20)

/* The head's K and V widened once per worker. Where K or V cannot be read in place (f16,
 * bf16, or a feature stride), each task widens every tile it reads, and each of a head's
 * query blocks reads them all again: 16 times over at L = 2048 with 128 rows to a block.
 * Instead each worker keeps the head it last worked on widened, a tile at a time as its tasks
 * first reach it, and its next task on that head (the pool hands a head's blocks out in
 * order, so a worker takes several in turn) reads the f32 rows from there. Widening is exact,
 * so results are the same bits whichever worker widened what, and whether or not a call uses
 * this. Used when a head has at least WIDE_MIN_BLOCKS query blocks and two per worker (so
 * that a worker meets a head more than once), and the workers' widened heads take at most
 * WIDE_MAX_BYTES in all. */
enum { WIDE_MIN_BLOCKS = 4 };
#define WIDE_MAX_BYTES ((size_t)32 << 20)

void sdpa__flash_plan_split(flash_plan *pl) {
    const sdpa__problem *p = pl->p;
    const int64_t tasks = p->B * p->Hkv * pl->n_qb;
    pl->n_chunks = 1;
    pl->chunk = p->Lk;
    if (tasks >= SPLIT_TASKS)
        return;
    int64_t n = (SPLIT_TASKS + tasks - 1) / tasks;
    const int64_t most = p->Lk / SPLIT_MIN_KEYS;
    n = n < most ? n : most;
    /* each chunk holds rp x (Dv + 2) values per task */
    const size_t per_chunk =
        (size_t)tasks * (size_t)pl->rp * ((size_t)p->Dv * sizeof(float) + sizeof(double));
    while (n > 1 && (size_t)n * per_chunk > SPLIT_MAX_BYTES)
        n--;
    if (n <= 1)
        return;
    pl->chunk = sdpa__round_up((p->Lk + n - 1) / n, pl->key_tile);
    pl->n_chunks = (p->Lk + pl->chunk - 1) / pl->chunk;
}

void sdpa__flash_plan_wide(flash_plan *pl, int workers) {
    const sdpa__problem *p = pl->p;
    const int k = !pl->k_direct, v = !pl->v_direct;
    if (pl->mx != NULL) /* the matrix unit reads K and V in place */
        return;
    if (pl->n_qb < WIDE_MIN_BLOCKS || pl->n_qb < 2 * (int64_t)workers || !(k || v))
        return;
    const int64_t tiles = (p->Lk + KEY_TILE - 1) / KEY_TILE;
    const size_t bytes = (size_t)tiles * KEY_TILE * (size_t)(k * p->Dk + v * p->Dv) * sizeof(float);
    if (bytes > WIDE_MAX_BYTES / (size_t)workers)
        return;
    pl->wide_k = k;
    pl->wide_v = v;
    pl->n_tiles = tiles;
}

int sdpa__flash_mx_fits(const sdpa__mx_kernels *mx, const sdpa__problem *p) {
    if (mx == NULL || MX_KEY_TILE > mx->keys_max)
        return 0;
    const int e = mx->elem;
    return (int)p->q.dtype == e && (int)p->k.dtype == e && (int)p->v.dtype == e &&
           p->k.stride[3] == 1 && p->v.stride[3] == 1 && p->Dk % mx->dk_step == 0 &&
           p->Dv % mx->dv_step == 0 && p->Dk <= mx->d_max && p->Dv <= mx->d_max;
}

void sdpa__flash_plan_init(flash_plan *pl, const sdpa__impl *self, const sdpa__problem *p) {
    memset(pl, 0, sizeof *pl);
    pl->p = p;
    pl->uk = self->uk;
    /* (the unit's blocks of rows are the vector table's vectors of rows, and its P V may read
     * a subnormal weight as 0: the softmax must give none) */
    pl->mx = sdpa__flash_mx_fits(self->mx, p) && self->uk->lanes == self->mx->lanes &&
                     self->uk->weight_exp2 > 0
                 ? self->mx
                 : NULL;
    const int64_t target = pl->mx != NULL ? MX_TARGET_ROWS : TARGET_ROWS;
    pl->key_tile =
        pl->mx != NULL && MX_KEY_TILE * p->Dv * 2 <= MX_PAIRS_BYTES ? MX_KEY_TILE : KEY_TILE;
    pl->bq = target / p->group > 1 ? target / p->group : 1;
    if (pl->bq > p->Lq)
        pl->bq = p->Lq;
    pl->n_qb = (p->Lq + pl->bq - 1) / pl->bq;
    pl->n_chunks = 1;
    pl->chunk = p->Lk;
    pl->rp = sdpa__round_up(p->group * pl->bq, 16); /* a multiple of every ISA's lanes */
    /* The scores' stride (rp floats) an odd number of cache lines for the matrix unit's tasks:
     * at 256 rows (1 KiB) a key tile's column of scores, which the softmax reads twice and P V
     * once more, fell into 4 of a 48 KiB L1's 64 sets. 272 took the forward's three steps from
     * 33.8 to 30.6 TSC cycles per key and 16 rows at D = 64, 52.6 to 50.2 at D = 128
     * (bench/mx_kernels.c, an Intel Xeon with AMX). The vector tables' layout stays as tuned. */
    if (pl->mx != NULL && pl->rp / 16 % 2 == 0)
        pl->rp += 16;
    pl->dvp = sdpa__round_up(p->Dv, 16);
    pl->q_direct = p->q.dtype == SDPA_F32 && (p->q.stride[3] == 1 || p->Dk == 1);
    pl->k_direct = p->k.dtype == SDPA_F32 && (p->k.stride[3] == 1 || p->Dk == 1);
    pl->v_direct = p->v.dtype == SDPA_F32 && (p->v.stride[3] == 1 || p->Dv == 1);
    pl->dropout = p->dropout_p > 0.0;
    if (pl->dropout) {
        pl->keep_scale = (float)(1.0 / (1.0 - p->dropout_p));
        pl->threshold = sdpa__dropout_threshold(p->dropout_p);
        sdpa__dropout_key(p->dropout_seed, p->dropout_offset, pl->key);
    }
    pl->k_half = p->k.dtype != SDPA_F32 && (p->k.stride[3] == 1 || p->Dk == 1);
    pl->v_half = p->v.dtype != SDPA_F32 && (p->v.stride[3] == 1 || p->Dv == 1);
    pl->needs_post = p->softcap > 0.0 || p->alibi != NULL || p->has_mask;
}
