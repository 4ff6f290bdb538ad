/*
 * flash_slices.c — the slices of keys a task of the tiled forward visits (key_slice,
 * flash_plan.h, says which and in what order): tile by tile over the keys its rows may see
 * within its chunk, each tile in up to two passes over the rows, each slice with the range of
 * rows that see some key of it. Nothing here touches a tensor: the slices depend on the
 * problem, the plan and the task's rows only.
 */
#include "flash_plan.h"

#include "tile.h"

#include <string.h>

/* The most rows beyond pass 0's that a matrix unit's tile takes in its one slice (merged),
 * and the fewest keys of a half tile (the comment above key_slice, flash_plan.h). */
enum { MX_MERGE_ROWS = 64, HALF_TILE_MIN = 64 };

void sdpa__flash_slices_begin(const flash_plan *pl, const task_rows *t, int64_t chunk,
                              key_slice *sl) {
    memset(sl, 0, sizeof *sl);
    if (t->nq > 0)
        sdpa__block_keys(t->p, t->i0, t->i0 + t->nq, &sl->jlo, &sl->jhi);
    if (pl->n_chunks > 1) {
        sl->jlo = sl->jlo > chunk * pl->chunk ? sl->jlo : chunk * pl->chunk;
        sl->jhi = sl->jhi < (chunk + 1) * pl->chunk ? sl->jhi : (chunk + 1) * pl->chunk;
    }
    if (sl->jlo >= sl->jhi) /* no key (a window past the keys, another chunk's keys): no tile */
        sl->jlo = sl->jhi = 0;
    sl->tile = pl->key_tile;
    sl->merge_rows = pl->mx != NULL ? MX_MERGE_ROWS : 0;
    sl->len = sl->tile;
    sl->j0 = sl->jlo / sl->tile * sl->tile - sl->tile; /* before the first tile */
    sl->pass = 1; /* (so that the first sdpa__flash_slices_next moves to the first tile) */
}

/* The slice's rows: [r0, r1), r0 a multiple of the lanes. */
static void slice_rows(const task_rows *t, int lanes, int64_t r0, int64_t r1, key_slice *sl) {
    sl->r0 = r0;
    sl->r1 = r1;
    sl->r1pad = sdpa__round_up(r1, lanes);
    sl->r1use = sl->r1pad < t->rows ? sl->r1pad : t->rows;
}

/* The rows [*r0, *r1) of the task that may see some key of [j0, j1), *r0 a multiple of the
 * lanes: @return 0 where none does. */
static int seeing_rows(const task_rows *t, int lanes, int64_t j0, int64_t j1, int64_t *r0,
                       int64_t *r1) {
    const sdpa__problem *p = t->p;
    int64_t first, last;
    sdpa__block_queries(p, j0, j1, t->i0, t->i0 + t->nq, &first, &last);
    *r0 = (first - t->i0) * p->group / lanes * lanes;
    *r1 = (last - t->i0) * p->group;
    return first < last;
}

/* The tile of len keys from j0: its keys and pass 0's rows (all that see a key of it, where
 * merged). */
static void tile_at(const task_rows *t, int lanes, int64_t len, key_slice *sl) {
    const sdpa__problem *p = t->p;
    sl->len = len;
    sl->ja = sl->j0 > sl->jlo ? sl->j0 : sl->jlo;
    sl->jb = sl->j0 + len < sl->jhi ? sl->j0 + len : sl->jhi;
    int64_t first, last;
    sdpa__block_queries_whole(p, sl->ja, sl->jb, t->i0, t->i0 + t->nq, &first, &last);
    sl->wa = sl->wb = 0;
    if (first < last) {
        /* inward to the lanes, but for the task's last row: its padding lanes are no row's */
        sl->wa = sdpa__round_up((first - t->i0) * p->group, lanes);
        sl->wb = (last - t->i0) * p->group;
        if (sl->wb < t->rows)
            sl->wb = sl->wb / lanes * lanes;
        if (sl->wa >= sl->wb)
            sl->wa = sl->wb = 0;
    }
    sl->pass = sl->wa < sl->wb ? 0 : 1;
    sl->merged = 0;
    if (sl->merge_rows > 0) {
        /* every row that sees some key of the tile, where those past pass 0's are few */
        int64_t r0, r1;
        if (seeing_rows(t, lanes, sl->ja, sl->jb, &r0, &r1) &&
            (r1 - r0) - (sl->wb - sl->wa) <= sl->merge_rows && !(r0 == sl->wa && r1 == sl->wb)) {
            sl->wa = r0;
            sl->wb = r1;
            sl->pass = 0;
            sl->merged = 1;
        }
    }
    sl->js = sl->ja;
}

/* Moves to the next tile: the plan's tile of keys, or its first half where only that half can
 * be merged. Only without a left window: there a task's first tile is often cut, and a half
 * tile would move every later one off the plan's grid (and across more pages). */
static void next_tile(const task_rows *t, int lanes, key_slice *sl) {
    sl->j0 += sl->len;
    tile_at(t, lanes, sl->tile, sl);
    const int64_t mid = sl->j0 + sl->tile / 2;
    if (sl->merge_rows > 0 && !sl->merged && !(sl->wa == 0 && sl->wb == t->rows) &&
        t->p->window_left < 0 && sl->tile >= 2 * HALF_TILE_MIN && sl->ja < mid && mid < sl->jb) {
        const key_slice full = *sl;
        tile_at(t, lanes, sl->tile / 2, sl);
        if (!sl->merged)
            *sl = full;
    }
}

int sdpa__flash_slices_next(const flash_plan *pl, const task_rows *t, key_slice *sl) {
    const sdpa__problem *p = t->p;
    const int lanes = pl->uk->lanes;
    if (sl->more0 < sl->more1) { /* the same keys for the rows past pass 0's */
        slice_rows(t, lanes, sl->more0, sl->more1, sl);
        sl->more0 = sl->more1 = 0;
        return 1;
    }
    for (;;) {
        sl->js += sl->nk;
        if (sl->js >= sl->jb) {
            /* pass 1 follows unless pass 0 took every row (the window cuts none, or the
             * tile was merged) */
            if (sl->pass == 0 && !sl->merged && !(sl->wa == 0 && sl->wb == t->rows)) {
                sl->pass = 1;
                sl->js = sl->ja;
            } else {
                if (sl->j0 + sl->len >= sl->jhi)
                    return 0;
                next_tile(t, lanes, sl);
            }
        }
        const int64_t step = sl->pass == 0 ? sl->tile : pl->mx != NULL ? 2 * KEY_SLICE : KEY_SLICE;
        sl->nk = sl->js + step < sl->jb ? step : sl->jb - sl->js;
        if (p->block_table != NULL) /* a slice stays within one page of the cache */
            sl->nk = sl->nk < p->page_size - sl->js % p->page_size
                         ? sl->nk
                         : p->page_size - sl->js % p->page_size;
        sl->whole = sl->pass == 0 && !sl->merged;
        if (sl->pass == 0) {
            slice_rows(t, lanes, sl->wa, sl->wb, sl);
            return 1;
        }
        int64_t r0, r1; /* the rows that see a key of the slice */
        if (!seeing_rows(t, lanes, sl->js, sl->js + sl->nk, &r0, &r1))
            continue;
        if (sl->wa == sl->wb) {
            slice_rows(t, lanes, r0, r1, sl);
            return 1;
        }
        /* without pass 0's rows: those before them, then those after (wa and wb are lanes) */
        const int64_t a1 = r1 < sl->wa ? r1 : sl->wa, b0 = r0 > sl->wb ? r0 : sl->wb;
        if (r0 < a1) {
            slice_rows(t, lanes, r0, a1, sl);
            if (b0 < r1) {
                sl->more0 = b0;
                sl->more1 = r1;
            }
            return 1;
        }
        if (b0 < r1) {
            slice_rows(t, lanes, b0, r1, sl);
            return 1;
        }
    }
}
