/*
 * flash.c — the tiled forward pass with the online softmax ("flash attention" on the CPU).
 *
 * Work is split into tasks of (batch b, kv head hk, block of query positions). A task holds
 * the rows of every query head of hk's group for its positions (position-major: row r is
 * position i0 + r / group of head hk * group + r % group), so each K/V tile is read (or
 * packed) once for the whole group. For each tile of keys it computes the scores with the
 * ISA's micro-kernels (ukernels.h), applies the rules that hide keys or bias scores, takes the
 * online-softmax step (running max m, running sum l, rescale factor alpha) and accumulates
 * P V into an f32 tile of outputs; at the end O = acc / l and LSE = m + log(l). Extra memory is
 * O(rows x (Dk + Dv + tile)) per thread, never Lq x Lk, plus, where K or V is widened, each
 * worker's widened head, O(Lk x (Dk + Dv)) and WIDE_MAX_BYTES in all. Key tiles that the window
 * or the causal rule hide from every row of a task are never visited.
 *
 * Decode (split-KV): a problem of few tasks -- one or a few query rows per (b, kv head) --
 * also cuts its keys into chunks (plan_split), each chunk a task that leaves a partial (O, LSE),
 * merged in chunk order by a second pass (merge.h). A half-precision cache is read in place
 * by the tables' qk_few_half and pv_few there; elsewhere K and V tiles are widened, tile by
 * tile, or, where a head has several query blocks per worker, once per worker into its
 * widened head (WIDE_MIN_BLOCKS).
 *
 * KV caches (sdpa_forward_kv): each task works on its sequence's own problem (sdpa__seq: its
 * lengths and causal offset); rows past the sequence's queries are written as fully masked;
 * a paged cache is read through the block table (sdpa__kv_offset), a slice never crossing a
 * page. Attention sinks join each row's softmax once, at the end (sdpa__add_sink).
 *
 * Determinism: the decomposition (tile sizes, task boundaries, key chunks) depends only on the
 * problem and the micro-kernel table, never on the number of threads, and a task's arithmetic
 * does not depend on which thread runs it: results are bitwise identical for any n_threads.
 *
 * The contract's corner cases: hidden scores are set to -inf before the softmax, which turns
 * them into -0.0 weights; when a slice has hidden keys and its V holds a NaN or an Inf, P V is
 * done by the table's careful variant, which adds nothing for those -0.0 weights and is
 * otherwise bitwise the fast one, so a hidden key never lets 0 * NaN in, nor moves a bit. A
 * row that saw no key ends with l = 0 and is written as O = 0, LSE = -inf.
 */
#include "flash.h"

#include "../core/half.h"
#include "../core/philox.h"
#include "../core/services.h"
#include "../ref/ref.h"
#include "merge.h"
#include "tile.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

enum { TARGET_ROWS = 128, KEY_TILE = 64, KEY_SLICE = 16 };
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
/* The most rows beyond pass 0's that a matrix unit's tile takes in its one slice (merged),
 * and the fewest keys of a half tile (the comment above key_slice). */
enum { MX_MERGE_ROWS = 64, HALF_TILE_MIN = 64 };

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

typedef struct flash_plan {
    const sdpa__problem *p;
    const sdpa__ukernels *uk;
    const sdpa__mx_kernels *mx; /* the matrix unit's entries, where they fit (else NULL) */
    sdpa_tensor *out, *lse;
    sdpa_tensor *weights;   /* sdpa_weights' output (weights_task), else NULL */
    int64_t bq;             /* query positions per task */
    int64_t n_qb;           /* query blocks per (b, hk) */
    int64_t n_chunks;       /* key chunks per (b, hk, query block): 1 = no split */
    int64_t key_tile;       /* keys per tile: KEY_TILE, or MX_KEY_TILE for the matrix unit */
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
    int wide_k, wide_v;     /* K (V) is read from the worker's widened head (WIDE_MIN_BLOCKS) */
    int64_t n_tiles;        /* tiles of KEY_TILE keys in Lk, when wide_k or wide_v */
    int needs_post;         /* softcap, ALiBi or a mask: every tile is post-processed */
    int dropout;            /* the problem drops weights (philox.h) */
    float keep_scale;       /* 1 / (1 - p): a kept weight's factor */
    uint64_t threshold;     /* keep iff the draw is below it */
    uint32_t key[2];        /* Philox's key from the seed and offset */
    atomic_int *overflowed; /* set by a task whose accumulator reached +-inf (see the end) */
    size_t per_worker;      /* bytes of scratch per worker */
    char *scratch;
} flash_plan;

/* Where key row j of (b, hk) of t (p->k or p->v) starts, through the block table when the
 * cache is paged. */
static const char *kv_row(const sdpa__problem *p, const sdpa_tensor *t, int64_t b, int64_t hk,
                          int64_t j) {
    return (const char *)t->data +
           sdpa__kv_offset(p, t, b, hk, j) * (int64_t)sdpa_dtype_size(t->dtype);
}

/* The keys [j0, j0 + nk) of a slice (never across a page of a paged cache) as f32 rows: in
 * place when possible (f32 with unit feature stride), else widened into `pack`. */
static const float *tile_rows(const sdpa__ukernels *uk, const sdpa__problem *p,
                              const sdpa_tensor *t, int direct, int64_t b, int64_t hk, int64_t j0,
                              int64_t nk, int64_t d, float *pack, int64_t *ld) {
    if (direct) {
        *ld = t->stride[2];
        return (const float *)kv_row(p, t, b, hk, j0);
    }
    for (int64_t j = 0; j < nk; j++)
        uk->load_row((int)t->dtype, d, kv_row(p, t, b, hk, j0 + j), t->stride[3], pack + j * d);
    *ld = d;
    return pack;
}

/* The keys from js of a slice (within one tile) from the worker's widened head `wide` (Lk x d
 * f32, row stride *ld = d), widening their tile first if no task of this worker has: the rows
 * of tile [j0, j0 + KEY_TILE) that sequence p has. */
static const float *wide_rows(const sdpa__ukernels *uk, const sdpa__problem *p,
                              const sdpa_tensor *t, int64_t b, int64_t hk, int64_t js, int64_t d,
                              float *wide, unsigned char *ready, int64_t *ld) {
    const int64_t tile = js / KEY_TILE, j0 = tile * KEY_TILE;
    if (!ready[tile]) {
        const int64_t j1 = j0 + KEY_TILE < p->Lk ? j0 + KEY_TILE : p->Lk;
        for (int64_t j = j0; j < j1; j++)
            uk->load_row((int)t->dtype, d, kv_row(p, t, b, hk, j), t->stride[3], wide + j * d);
        ready[tile] = 1;
    }
    *ld = d;
    return wide + js * d;
}

/* Asks for the rows [j0, j0 + n) of t (batch b, head h) to be brought into the cache, when
 * their features are contiguous. Used where a task has so few query rows that it does little
 * arithmetic per byte (decode): V is requested before the slice's Q K^T and softmax, so that
 * P V finds it arrived instead of waiting on DRAM a row at a time (K is requested ahead by the
 * tables' qk_few themselves). A prefetch never faults and has no effect on results. */
static void prefetch_rows(const sdpa__problem *p, const sdpa_tensor *t, int64_t b, int64_t h,
                          int64_t j0, int64_t n, int64_t d) {
    if (t->stride[3] != 1 && d > 1)
        return;
    const int64_t bytes = d * (int64_t)sdpa_dtype_size(t->dtype);
    for (int64_t j = 0; j < n; j++) {
        const char *row = kv_row(p, t, b, h, j0 + j);
        for (int64_t c = 0; c < bytes; c += 64)
            __builtin_prefetch(row + c, 0, 3);
    }
}

/* One worker's scratch: the task's tiles and its row table. */
typedef struct task_scratch {
    float *qt;        /* Q transposed: Dk x rp */
    float *s;         /* scores, transposed: key_tile x rp */
    float *sraw;      /* weights_task: a copy of the scores before exp_lse, like s */
    int64_t *written; /* weights_task: row r's weights [0, written[r]) are written */
    float *o;         /* the output accumulator: rp x dvp */
    float *m, *l, *alpha;
    float *qrows; /* Q rows widened to f32 (when Q is not read in place): rp x Dk */
    float *kpack; /* a K tile widened to f32 (when K is not read in place) */
    float *vpack; /* likewise V */
    /* the rows: query head and position of row r, and the keys it may see under the window
     * rule, [lo[r], hi[r]] (wide open when a side is unbounded) */
    int64_t *h, *i, *lo, *hi;
    const float **q_row; /* the f32 query rows pack_q and qk_few read */
    /* the worker's widened head (wide_k, wide_v): which (b, hk) it holds (-1: none), its K and
     * V rows (Lk x Dk, Lk x Dv f32) and which of its tiles are widened. These outlive a task. */
    int64_t *wide_bh;
    float *kwide, *vwide;
    unsigned char *kready, *vready;
    void *qmx; /* Q packed by mx->pack_q: (Dk / 2 + 1) x rp 32-bit words */
    /* the query rows mx->pack_q reads, in Q's own type: in place, or gathered into qrows
     * where Q's features are not adjacent */
    const void **q_src;
} task_scratch;

/* Takes `bytes` from the region at base (NULL: only measures), each piece 64-byte aligned. */
static void *take(char *base, size_t *at, size_t bytes) {
    void *ptr = base == NULL ? NULL : base + *at;
    *at += (bytes + 63) / 64 * 64;
    return ptr;
}

/* Lays out one worker's scratch at base and returns its size in bytes: the one place where
 * the regions are both sized and pointed to. With base NULL it only measures. */
static size_t layout(const flash_plan *pl, char *base, task_scratch *ts) {
    const sdpa__problem *p = pl->p;
    const size_t f = sizeof(float), rp = (size_t)pl->rp;
    size_t at = 0;
    ts->qt = take(base, &at, (size_t)p->Dk * rp * f);
    ts->s = take(base, &at, (size_t)pl->key_tile * rp * f);
    ts->sraw = take(base, &at, pl->weights != NULL ? (size_t)pl->key_tile * rp * f : 0);
    ts->written = take(base, &at, pl->weights != NULL ? rp * sizeof(int64_t) : 0);
    ts->o = take(base, &at, rp * (size_t)pl->dvp * f);
    ts->m = take(base, &at, rp * f);
    ts->l = take(base, &at, rp * f);
    ts->alpha = take(base, &at, rp * f);
    ts->qrows = take(base, &at, pl->q_direct ? 0 : rp * (size_t)p->Dk * f);
    /* The packing tiles are reserved even when K and V are read in place: the size of a
     * worker's region sets where the next worker's hot tiles (qt, s, o) fall relative to
     * this one's, and on two vCPUs that share a core's caches, dropping these 32 KiB (at
     * Dk = Dv = 64) made causal L = 512 about 5 % slower with 2 threads. Choosing that
     * stagger on purpose is tuning work (issue 9); until then the layout stays as tuned. */
    ts->kpack = take(base, &at, (size_t)pl->key_tile * (size_t)p->Dk * f);
    ts->vpack = take(base, &at, (size_t)pl->key_tile * (size_t)p->Dv * f);
    ts->h = take(base, &at, rp * sizeof(int64_t));
    ts->i = take(base, &at, rp * sizeof(int64_t));
    ts->lo = take(base, &at, rp * sizeof(int64_t));
    ts->hi = take(base, &at, rp * sizeof(int64_t));
    ts->q_row = take(base, &at, rp * sizeof(const float *));
    /* last, so that without it the hot tiles of the workers' regions fall where they did */
    const int wide = pl->wide_k || pl->wide_v;
    const size_t tiles = (size_t)pl->n_tiles, keys = tiles * KEY_TILE;
    ts->wide_bh = take(base, &at, wide ? sizeof(int64_t) : 0);
    ts->kready = take(base, &at, pl->wide_k ? tiles : 0);
    ts->vready = take(base, &at, pl->wide_v ? tiles : 0);
    ts->kwide = take(base, &at, pl->wide_k ? keys * (size_t)p->Dk * f : 0);
    ts->vwide = take(base, &at, pl->wide_v ? keys * (size_t)p->Dv * f : 0);
    ts->qmx = take(base, &at, pl->mx != NULL ? ((size_t)p->Dk / 2 + 1) * rp * 4 : 0);
    ts->q_src = take(base, &at, pl->mx != NULL ? rp * sizeof(const void *) : 0);
    return at;
}

/* Applies softcap, ALiBi and the mask to the scores of keys ja.. of rows [r0, r1)
 * (s[jj * rp + r]), then hides keys outside each row's window (on tiles the window cuts
 * through). p is the problem of sequence b (sdpa__seq). */
static void post_process(const flash_plan *pl, const sdpa__problem *p, int64_t b,
                         const task_scratch *tr, int64_t r0, int64_t r1, int64_t ja, int64_t nk,
                         int whole, float *s) {
    if (p->softcap > 0.0) /* on every score, a key's rows a run */
        for (int64_t jj = 0; jj < nk; jj++)
            pl->uk->softcap(r1 - r0, s + jj * pl->rp + r0, (float)p->softcap, NULL);
    sdpa__tile_bias(pl->uk, p, b, tr->h + r0, tr->i + r0, r1 - r0, ja, nk, s + r0, 1, pl->rp);
    if (whole)
        return;
    /* Rows are sorted by position, so the rows a key is hidden from are a prefix (right bound:
     * i + off + wr < j) and a suffix (left bound: i + off - wl > j) of the range: two fills per
     * key, no per-score test. The prefix ends at a, the suffix starts at z; as the key moves
     * on, both only move down the rows (lo and hi grow with the position), so each is carried
     * from one key to the next rather than looked for from the ends of the range again (a
     * walk per key over the rows cost a causal forward at L = 512 about 0.3 % of its time,
     * f32, AVX-512: the fills are most of this step). */
    int64_t a = r0, z = r0;
    for (int64_t jj = 0; jj < nk; jj++) {
        const int64_t j = ja + jj;
        while (a < r1 && j > tr->hi[a])
            a++;
        z = z > a ? z : a;
        while (z < r1 && j >= tr->lo[z])
            z++;
        float *s_j = s + jj * pl->rp;
        for (int64_t r = r0; r < a; r++)
            s_j[r] = -INFINITY;
        for (int64_t r = z; r < r1; r++)
            s_j[r] = -INFINITY;
    }
}

/* Dropout on the weights of keys js.. of rows [r0, r1) (s[jj * rp + r]), drawn from the global
 * indices (b, h, i, j) by the table's dropout_row, a row of factors at a time: a kept weight is
 * multiplied by 1 / (1 - p), a dropped one becomes +0 (a hidden key's -0.0 stays -0.0). The
 * softmax's sum l has already taken the weights before dropout, as the LSE must. The factors
 * of DROP_ROWS rows are laid out as s is (zt[jj * DROP_ROWS + r]) in a 4 KiB tile before they
 * multiply, so that s is swept along its rows, a cache line at a time: a key at a time down
 * its columns (every weight of a row on another line, 512 bytes apart) cost as much as the
 * draws themselves. */
static void drop_weights(const flash_plan *pl, int64_t b, const task_scratch *tr, int64_t r0,
                         int64_t r1, int64_t js, int64_t nk, float *s) {
    enum { DROP_ROWS = 16 };
    float row[KEY_TILE], zt[KEY_TILE * DROP_ROWS];
    for (int64_t ja = 0; ja < nk; ja += KEY_TILE) { /* one pass but for MX_KEY_TILE's slices */
        const int64_t n = nk - ja < KEY_TILE ? nk - ja : KEY_TILE;
        for (int64_t ra = r0; ra < r1; ra += DROP_ROWS) {
            const int64_t nr = r1 - ra < DROP_ROWS ? r1 - ra : DROP_ROWS;
            for (int64_t r = 0; r < nr; r++) {
                pl->uk->dropout_row(pl->key, b, tr->h[ra + r], tr->i[ra + r], js + ja, n,
                                    pl->threshold, pl->keep_scale, row);
                for (int64_t jj = 0; jj < n; jj++)
                    zt[jj * DROP_ROWS + r] = row[jj];
            }
            for (int64_t jj = 0; jj < n; jj++)
                for (int64_t r = 0; r < nr; r++)
                    s[(ja + jj) * pl->rp + ra + r] *= zt[jj * DROP_ROWS + r];
        }
    }
}

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

/* Lays out the worker's scratch for task `task` (its block's number in the order the pool
 * hands it out) and sets up its rows: each row's head, position and window, m = -inf, l = 0,
 * and, with `pack`, Q transposed into tr->qt (else the caller packs it when a slice first
 * needs it: a decode task's slices all take qk_few, which reads the rows in place). */
static void task_begin(const flash_plan *pl, int64_t task, int worker, int pack, task_rows *t,
                       task_scratch *tr) {
    const sdpa__ukernels *uk = pl->uk;
    const sdpa__problem *p = sdpa__seq(pl->p, task / pl->n_qb / pl->p->Hkv, &t->seq);
    t->p = p;
    /* When a right window bound (causal) makes later query blocks see more keys, each head's
     * blocks are taken last first: the pool hands out tasks in increasing order, so within a
     * head the large tasks start early and the small ones fill the gaps, while neighbouring
     * tasks still share their K/V tiles in cache. The mapping depends on the problem only,
     * never on the threads. */
    t->bh = task / pl->n_qb;
    const int64_t rank = task % pl->n_qb;
    t->b = t->bh / p->Hkv;
    t->hk = t->bh % p->Hkv;
    t->qb = p->window_right >= 0 ? pl->n_qb - 1 - rank : rank;
    t->i0 = t->qb * pl->bq;
    t->nq_all = t->i0 + pl->bq <= pl->p->Lq ? pl->bq : pl->p->Lq - t->i0;
    t->nq = t->i0 >= p->Lq ? 0 : t->i0 + t->nq_all <= p->Lq ? t->nq_all : p->Lq - t->i0;
    t->rows = p->group * t->nq;
    t->rows_all = p->group * t->nq_all;
    const int64_t rpad = sdpa__round_up(t->rows, uk->lanes);
    const int64_t rinit = rpad > t->rows_all ? rpad : t->rows_all;

    layout(pl, pl->scratch + (size_t)worker * pl->per_worker, tr);
    for (int64_t r = 0; r < rinit; r++) {
        const int64_t h = t->hk * p->group + r % p->group, i = t->i0 + r / p->group;
        tr->m[r] = -INFINITY;
        tr->l[r] = 0.0f;
        tr->h[r] = h;
        tr->i[r] = i;
        sdpa__row_keys(p, i, &tr->lo[r], &tr->hi[r]);
    }
    for (int64_t r = 0; r < t->rows; r++) {
        if (pl->mx != NULL) { /* the unit packs Q from its own type: nothing widened */
            const void *src = sdpa__row_at(&p->q, t->b, tr->h[r], tr->i[r]);
            if (p->q.stride[3] != 1) { /* (the unit's types are 16 bits wide) */
                uint16_t *row = (uint16_t *)(void *)(tr->qrows + r * p->Dk);
                for (int64_t d = 0; d < p->Dk; d++)
                    row[d] = ((const uint16_t *)src)[d * p->q.stride[3]];
                src = row;
            }
            tr->q_src[r] = src;
        } else if (pl->q_direct) {
            tr->q_row[r] = sdpa__row_at(&p->q, t->b, tr->h[r], tr->i[r]);
        } else {
            float *row = tr->qrows + r * p->Dk;
            uk->load_row((int)p->q.dtype, p->Dk, sdpa__row_at(&p->q, t->b, tr->h[r], tr->i[r]),
                         p->q.stride[3], row);
            tr->q_row[r] = row;
        }
    }
    if (pack)
        uk->pack_q(t->rows, p->Dk, tr->q_row, tr->qt, pl->rp);
    if ((pl->wide_k || pl->wide_v) && *tr->wide_bh != t->bh) { /* another head: none widened */
        *tr->wide_bh = t->bh;
        if (pl->wide_k)
            memset(tr->kready, 0, (size_t)pl->n_tiles);
        if (pl->wide_v)
            memset(tr->vready, 0, (size_t)pl->n_tiles);
    }
}

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

static void slices_begin(const flash_plan *pl, const task_rows *t, int64_t chunk, key_slice *sl) {
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
    sl->pass = 1; /* (so that the first slices_next moves to the first tile) */
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

/* A row's LSE from its softmax's running max m and sum l, which the table gives times
 * 2^weight_exp2 (ukernels.h): m + log l, summed in double (one rounding, not three); -inf for
 * a row that saw nothing. */
static double row_lse(const sdpa__ukernels *uk, float m, float l) {
    return l == 0.0f ? -INFINITY : (double)m + log(ldexp((double)l, -uk->weight_exp2));
}

/* Moves to the next slice that some row sees. @return 0 when there is none. */
static int slices_next(const flash_plan *pl, const task_rows *t, key_slice *sl) {
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

static void flash_task(void *arg, int64_t task_chunk, int worker) {
    const flash_plan *pl = arg;
    const sdpa__ukernels *uk = pl->uk;
    const int64_t task = task_chunk / pl->n_chunks, chunk = task_chunk % pl->n_chunks;
    task_rows t;
    task_scratch tr;
    task_begin(pl, task, worker, 0, &t, &tr);
    int q_packed = 0;
    int mx_packed = 0; /* Q packed for the matrix unit */
    const sdpa__problem *p = t.p;
    const int64_t b = t.b, hk = t.hk, bh = t.bh, qb = t.qb, rows = t.rows, rp = pl->rp;
    const int64_t rows_all = t.rows_all;
    float *qt = tr.qt, *s = tr.s, *o = tr.o, *m = tr.m, *l = tr.l, *alpha = tr.alpha;
    /* O's accumulator starts at zero: zeroed here for a vector table; for a matrix unit before
     * the first slice's P V, unless that is over every row, which then writes it whole (the
     * zeroing took 6,500-7,400 TSC cycles of a 256-row task at D = 128, bench/task_costs.py,
     * about 1 % of a causal one), or after the slices if there was none */
    const size_t o_bytes = (size_t)(rows_all * pl->dvp) * sizeof *o;
    int o_ready = pl->mx == NULL;
    if (o_ready)
        memset(o, 0, o_bytes);

    key_slice sl;
    int v_asked = 0; /* the previous slice's pv_few asked for this slice's V rows */
    for (slices_begin(pl, &t, chunk, &sl); slices_next(pl, &t, &sl);) {
        const int64_t js = sl.js, nk = sl.nk, r0 = sl.r0, r1pad = sl.r1pad, r1use = sl.r1use;
        float *s0 = s + r0;
        /* qk_few serves f32 queries read in place (widened half-precision queries keep
         * qk's order of summation); a half-precision cache is then read in place too, even
         * where the worker keeps the head widened: qk_few_half may sum bf16 keys in an order
         * of its own, and wide_k depends on the number of workers */
        const int few = uk->qk_few != NULL && pl->q_direct && r1use - r0 <= SDPA__FEW_ROWS &&
                        r1pad - r0 == uk->lanes;
        const int k_half = few && pl->k_half && uk->qk_few_half != NULL;
        const int v_few = few && (pl->v_direct || pl->v_half || pl->wide_v) && uk->pv_few != NULL;
        /* the next slice's first key, whose rows the kernels ask for ahead (the next page's
         * in a paged cache; past the chunk, the next chunk's); the sequence's last slice
         * names its own. Exact for the few-row tasks that ask (a tile of a larger task may
         * go back to its first key for pass 1, where the request is only wasted) */
        const int64_t jn = js + nk < p->Lk ? js + nk : js;
        int64_t ldk, ldv;
        /* A paged cache gets no requests from here: a slice's rows asked for in one burst
         * (its V, the next page's K) stalled the loop on the fill buffers, and the step over 8
         * sequences in pages of 64 took 1.8x the time of the same cache read contiguously,
         * 1.4x without them (f16, Hq=32 Hkv=8 D=128, AVX-512, an Intel Xeon). */
        if (rows <= SDPA__FEW_ROWS && p->block_table == NULL) {
            /* V's rows of the slice, unless the previous slice's pv_few asked for them
             * already. Asking twice cost 4-9 % at Lq=1 Hq=32 Hkv=8 Lk=32768 D=128 on an Intel
             * Xeon. */
            if ((!v_few || !v_asked) && !pl->wide_v)
                prefetch_rows(p, &p->v, b, hk, js, nk, p->Dv);
            /* K widened into kpack is read there, where qk_few's own requests ahead do
             * not land: the next slice's K rows are asked for here instead */
            const int64_t next = sl.jhi - js - nk < nk ? sl.jhi - js - nk : nk;
            if (!pl->k_direct && !pl->wide_k && !k_half && next > 0)
                prefetch_rows(p, &p->k, b, hk, js + nk, next, p->Dk);
        }
        /* the matrix unit's entries, K and V read in place; where softmax_bf16p takes a
         * slice with nothing to post-process but the window's -inf (which a positive scale
         * keeps), the unit's sums are left unscaled and the softmax scales them (raw) */
        const int mx = pl->mx != NULL && !few;
        const int few_softmax = r1use - r0 <= SDPA__FEW_ROWS && uk->softmax_few != NULL;
        const int raw = mx && (sl.whole || p->scale > 0.0) && !pl->needs_post && !few_softmax &&
                        uk->softmax_bf16p != NULL;
        if (mx && !mx_packed) {
            mx_packed = 1;
            pl->mx->pack_q(rows, p->Dk, tr.q_src, tr.qmx, rp);
        }
        if (k_half) {
            uk->qk_few_half((int)p->k.dtype, nk, r1use - r0, p->Dk, kv_row(p, &p->k, b, hk, js),
                            p->k.stride[2], kv_row(p, &p->k, b, hk, jn), tr.q_row + r0,
                            (float)p->scale, s0, rp);
        } else if (mx) {
            pl->mx->qk(nk, r1pad - r0, p->Dk, kv_row(p, &p->k, b, hk, js), p->k.stride[2],
                       (const uint32_t *)tr.qmx + r0, rp, raw ? 1.0f : (float)p->scale, s0, rp);
        } else {
            const float *kt =
                pl->wide_k
                    ? wide_rows(uk, p, &p->k, b, hk, js, p->Dk, tr.kwide, tr.kready, &ldk)
                    : tile_rows(uk, p, &p->k, pl->k_direct, b, hk, js, nk, p->Dk, tr.kpack, &ldk);
            /* (a K widened into kpack gets no requests from qk_few, which would land in kpack:
             * those above, for a contiguous cache) */
            const float *k_next = pl->k_direct ? (const float *)kv_row(p, &p->k, b, hk, jn)
                                  : pl->wide_k ? tr.kwide + jn * p->Dk
                                               : kt;
            if (few)
                uk->qk_few(nk, r1use - r0, p->Dk, kt, ldk, k_next, tr.q_row + r0, (float)p->scale,
                           s0, rp);
            else {
                if (!q_packed)
                    uk->pack_q(rows, p->Dk, tr.q_row, qt, rp);
                q_packed = 1;
                uk->qk(nk, r1pad - r0, p->Dk, kt, ldk, qt + r0, rp, (float)p->scale, s0, rp);
            }
        }
        if (!sl.whole || pl->needs_post)
            post_process(pl, p, b, &tr, r0, r1use, js, nk, sl.whole, s0 - r0);
        /* (the unit rounds the weights to bf16: a cheaper exp serves it, where offered) */
        const int hidden =
            few_softmax ? uk->softmax_few(nk, r1use - r0, s0, rp, m + r0, l + r0, alpha + r0)
            : mx && uk->softmax_bf16p != NULL
                ? uk->softmax_bf16p(nk, r1pad - r0, s0, rp, raw ? (float)p->scale : 1.0f, m + r0,
                                    l + r0, alpha + r0)
                : uk->softmax(nk, r1pad - r0, s0, rp, m + r0, l + r0, alpha + r0);
        if (pl->dropout)
            drop_weights(pl, b, &tr, r0, r1use, js, nk, s);
        float *o0 = o + r0 * pl->dvp;
        /* V as f32 rows where pv_few cannot read it in place, or to look for a NaN or an Inf
         * that a hidden key's zero weight must keep out */
        const float *vt = NULL;
        if (pl->wide_v)
            vt = wide_rows(uk, p, &p->v, b, hk, js, p->Dv, tr.vwide, tr.vready, &ldv);
        else if (!mx && (!v_few || hidden))
            vt = tile_rows(uk, p, &p->v, pl->v_direct, b, hk, js, nk, p->Dv, tr.vpack, &ldv);
        v_asked = 0;
        const int o_first = !o_ready && mx && r0 == 0 && r1use == rows_all;
        if (!o_ready && !o_first)
            memset(o, 0, o_bytes);
        o_ready = 1;
        if (mx) { /* (which keeps a hidden key's NaN out itself) */
            pl->mx->pv(nk, r1use - r0, p->Dv, s0, rp, o_first ? NULL : alpha + r0,
                       kv_row(p, &p->v, b, hk, js), p->v.stride[2], o0, pl->dvp);
        } else if (hidden && sdpa__has_nonfinite(vt, nk, ldv, p->Dv)) {
            uk->pv_careful(nk, r1use - r0, p->Dv, s0, rp, alpha + r0, vt, ldv, o0, pl->dvp);
            /* a +0 weight (dropped, or underflowed) still lets 0 x NaN in */
            sdpa__nan_of_visible_zeros(nk, r1use - r0, p->Dv, s0, s0, rp, 1, vt, ldv, o0, pl->dvp);
        } else if (v_few && pl->wide_v) {
            uk->pv_few(SDPA__ELEM_F32, nk, r1use - r0, p->Dv, s0, rp, alpha + r0, vt, ldv,
                       tr.vwide + jn * p->Dv, o0, pl->dvp);
        } else if (v_few) {
            uk->pv_few((int)p->v.dtype, nk, r1use - r0, p->Dv, s0, rp, alpha + r0,
                       kv_row(p, &p->v, b, hk, js), p->v.stride[2], kv_row(p, &p->v, b, hk, jn), o0,
                       pl->dvp);
            v_asked = 1;
        } else
            uk->pv(nk, r1use - r0, p->Dv, s0, rp, alpha + r0, vt, ldv, o0, pl->dvp);
    }
    if (!o_ready) /* no slice: every row saw nothing */
        memset(o, 0, o_bytes);

    /* O = acc / l, LSE = m + log l (summed in double: one rounding, not three); rows that saw
     * nothing: 0 and -inf. A chunk of a split task leaves them as its partial. */
    const sdpa_tensor *out = pl->out;
    for (int64_t r = 0; r < rows_all; r++) {
        const int64_t h = tr.h[r], i = tr.i[r];
        /* a row the sequence lacks (r >= rows) saw nothing, though as a padding lane of the
         * softmax it may have gathered a running sum (no table writes its accumulator) */
        if (r >= rows)
            l[r] = 0.0f;
        float inv = l[r] == 0.0f ? 0.0f : 1.0f / l[r];
        /* An accumulator at +-inf, or a NaN in a row whose sum l is a number: a weight that
         * underflowed to +0 in f32 met an Inf in V (0 x Inf), where the reference's weight,
         * in double, is positive (or a NaN in V, which the reference makes NaN too). store_row
         * says what the row held as it stores it (a pass of its own over every row had cost
         * as much as the store: the task's accumulator is read from L2). A sink's scaling
         * below, by a power of two at most 1, makes no Inf or NaN and unmakes none. */
        int kinds;
        if (pl->n_chunks > 1) {
            const int64_t at = ((bh * pl->n_qb + qb) * pl->rp + r) * pl->n_chunks + chunk;
            kinds = uk->store_row(SDPA__ELEM_F32, p->Dv, o + r * pl->dvp, inv,
                                  pl->part_o + at * p->Dv, 1);
            pl->part_lse[at] = row_lse(uk, m[r], l[r]);
            if ((kinds & SDPA__STORED_INF) || (kinds != 0 && l[r] == l[r]))
                atomic_store_explicit(pl->overflowed, 1, memory_order_relaxed);
            continue;
        }
        /* (a log in double a row: asked for only where it is used) */
        double row_lse_r = pl->lse != NULL || p->sinks != NULL ? row_lse(uk, m[r], l[r]) : 0.0;
        if (p->sinks != NULL) {
            /* f / l falls far below f32's normal range for a sink far above the scores, and
             * further with l scaled: the accumulator is brought back to its unscaled values
             * first (exactly: a power of two), and divided by the unscaled l */
            const double f = sdpa__add_sink((double)p->sinks[h], &row_lse_r);
            const float down = ldexpf(1.0f, -uk->weight_exp2);
            for (int64_t c = 0; c < p->Dv; c++)
                o[r * pl->dvp + c] *= down;
            inv = l[r] == 0.0f ? 0.0f : (float)(f / (double)(l[r] * down));
        }
        kinds = uk->store_row((int)out->dtype, p->Dv, o + r * pl->dvp, inv,
                              (void *)sdpa__row_at(out, b, h, i), out->stride[3]);
        if ((kinds & SDPA__STORED_INF) || (kinds != 0 && l[r] == l[r]))
            atomic_store_explicit(pl->overflowed, 1, memory_order_relaxed);
        if (pl->lse != NULL)
            ((float *)pl->lse->data)[sdpa__offset(pl->lse, b, h, i, 0)] = (float)row_lse_r;
    }
}

/* The second pass of a split problem: task (b, hk, query block) -- the block's number, not
 * the order flash_task takes it in -- merges its rows' chunks, in chunk order, and writes O
 * and LSE. */
static void merge_task(void *arg, int64_t task, int worker) {
    const flash_plan *pl = arg;
    const sdpa__problem *p = pl->p;
    const int64_t b = task / pl->n_qb / p->Hkv, hk = task / pl->n_qb % p->Hkv;
    const int64_t i0 = task % pl->n_qb * pl->bq, nq = i0 + pl->bq <= p->Lq ? pl->bq : p->Lq - i0;
    double *row = (double *)(pl->scratch + (size_t)worker * pl->per_worker);
    for (int64_t r = 0; r < p->group * nq; r++) {
        const int64_t h = hk * p->group + r % p->group, i = i0 + r / p->group;
        const int64_t at = (task * pl->rp + r) * pl->n_chunks;
        double lse = sdpa__merge_row(pl->n_chunks, p->Dv, pl->part_o + at * p->Dv, p->Dv,
                                     pl->part_lse + at, row);
        /* the sink's term joins once, after the chunks (none of them saw it) */
        const double f = p->sinks != NULL ? sdpa__add_sink((double)p->sinks[h], &lse) : 1.0;
        if (f != 1.0)
            for (int64_t c = 0; c < p->Dv; c++)
                row[c] *= f;
        const int64_t o0 = sdpa__offset(pl->out, b, h, i, 0), st = pl->out->stride[3];
        if (pl->out->dtype == SDPA_F32) { /* sdpa__store's rounding, in a loop that vectorises */
            float *dst = (float *)pl->out->data + o0;
            for (int64_t c = 0; c < p->Dv; c++)
                dst[c * st] = (float)row[c];
        } else {
            for (int64_t c = 0; c < p->Dv; c++)
                sdpa__store(pl->out->data, pl->out->dtype, o0 + c * st, row[c]);
        }
        if (pl->lse != NULL)
            ((float *)pl->lse->data)[sdpa__offset(pl->lse, b, h, i, 0)] = (float)lse;
    }
}

/* The scores of a slice's rows, as flash_task forms them with qk: into tr->s, transposed. */
static void slice_scores(const flash_plan *pl, const task_rows *t, const key_slice *sl,
                         const task_scratch *tr) {
    const sdpa__problem *p = t->p;
    int64_t ldk;
    const float *kt = tile_rows(pl->uk, p, &p->k, pl->k_direct, t->b, t->hk, sl->js, sl->nk, p->Dk,
                                tr->kpack, &ldk);
    pl->uk->qk(sl->nk, sl->r1pad - sl->r0, p->Dk, kt, ldk, tr->qt + sl->r0, pl->rp, (float)p->scale,
               tr->s + sl->r0, pl->rp);
    if (!sl->whole || pl->needs_post)
        post_process(pl, p, t->b, tr, sl->r0, sl->r1use, sl->js, sl->nk, sl->whole, tr->s);
}

/* Weights [j0, j1) of row (b, h, i) of w: +0. */
static void zero_weights(const sdpa_tensor *w, int64_t b, int64_t h, int64_t i, int64_t j0,
                         int64_t j1) {
    float *w_r = (float *)w->data + sdpa__offset(w, b, h, i, 0);
    for (int64_t j = j0; j < j1; j++)
        w_r[j * w->stride[3]] = 0.0f;
}

/* sdpa_weights' task (b, hk, query block): the weights p_ij = exp(s_ij - m_i) / l_i of the
 * block's rows, in two sweeps over the keys the rows see, each forming the scores as
 * flash_task does (qk, then the window and post_process). The first takes the online
 * softmax's running max m and sum l (its weights are dropped); the second forms
 * exp(s - m) with the table's exp_lse and multiplies by 1 / l (f / l with a sink, f its
 * factor, as flash_task scales O), so that each weight is rounded a few times in f32 and
 * never through the log of the LSE. Hidden keys, and keys outside the rows' reach, are +0; a
 * NaN row (l NaN) is NaN wherever it sees a key. Before dropout, as the reference. */
static void weights_task(void *arg, int64_t task, int worker) {
    const flash_plan *pl = arg;
    const sdpa__ukernels *uk = pl->uk;
    task_rows t;
    task_scratch tr;
    task_begin(pl, task, worker, 1, &t, &tr);
    const sdpa__problem *p = t.p;
    const int64_t b = t.b, rp = pl->rp;
    const sdpa_tensor *w = pl->weights;
    float *m = tr.m, *l = tr.l;

    // pass 1: each row's max m and sum l
    key_slice sl;
    for (slices_begin(pl, &t, 0, &sl); slices_next(pl, &t, &sl);) {
        slice_scores(pl, &t, &sl, &tr);
        uk->softmax(sl.nk, sl.r1pad - sl.r0, tr.s + sl.r0, rp, m + sl.r0, l + sl.r0,
                    tr.alpha + sl.r0);
    }

    // each row's factor 1 / l (alpha), l unscaled (exp_lse's weights are not scaled)
    for (int64_t r = 0; r < t.rows; r++) {
        const float l_r = ldexpf(l[r], -uk->weight_exp2);
        float inv = l_r == 0.0f ? 0.0f : 1.0f / l_r;
        if (p->sinks != NULL && l_r != 0.0f) {
            double lse = row_lse(uk, m[r], l[r]);
            inv = (float)(sdpa__add_sink((double)p->sinks[tr.h[r]], &lse) / (double)l_r);
        }
        tr.alpha[r] = inv;
        tr.written[r] = 0;
    }

    // pass 2: p_ij = exp(s_ij - m_i) / l_i, each slice's rows transposed into theirs; the
    // keys a row does not reach (before, between and after the slices it is in) are +0.
    // Every weight is written once: each row meets its keys in increasing order.
    for (slices_begin(pl, &t, 0, &sl); slices_next(pl, &t, &sl);) {
        slice_scores(pl, &t, &sl, &tr);
        for (int64_t jj = 0; jj < sl.nk; jj++)
            memcpy(tr.sraw + jj * rp + sl.r0, tr.s + jj * rp + sl.r0,
                   (size_t)(sl.r1pad - sl.r0) * sizeof(float));
        uk->exp_lse(sl.nk, sl.r1pad - sl.r0, tr.s + sl.r0, rp, m + sl.r0);
        for (int64_t r = sl.r0; r < sl.r1use; r++) {
            zero_weights(w, b, tr.h[r], tr.i[r], tr.written[r], sl.js);
            tr.written[r] = sl.js + sl.nk;
            float *w_r = (float *)w->data + sdpa__offset(w, b, tr.h[r], tr.i[r], sl.js);
            for (int64_t jj = 0; jj < sl.nk; jj++) {
                float e = tr.s[jj * rp + r];
                if (sdpa__hidden_mask(e)) { /* +0, whatever the factor (a NaN row's) */
                    w_r[jj * w->stride[3]] = 0.0f;
                    continue;
                }
                /* The tables' exp keeps its accuracy down to f32's smallest normal: below it
                 * (s - m < -87, seldom), where the weight is a subnormal or 0 (PyTorch
                 * prints exp(-100) = 3.78e-44 and exp(-150) = 0), libm's expf takes over. */
                if (e < 0x1p-125f)
                    e = expf(tr.sraw[jj * rp + r] - m[r]);
                w_r[jj * w->stride[3]] = e * tr.alpha[r];
            }
        }
    }
    for (int64_t r = 0; r < t.rows; r++)
        zero_weights(w, b, tr.h[r], tr.i[r], tr.written[r], p->Lk);
}

/* How many chunks the keys of each task are cut into (see SPLIT_TASKS), and how long they
 * are; from the problem only. */
static void plan_split(flash_plan *pl) {
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

/* The unnormalised accumulator O = sum_j p_j v_j (p_j <= 1) reaches +-inf when the weights'
 * sum times |v| passes FLT_MAX, though O / l, the output, is finite: V = 1e35 over 4096 keys
 * with equal scores, or V = 3e38 over 3. Such a row leaves an inf in its output (as does a
 * row that sees an Inf in V), and is computed again, exactly, by the reference (in double,
 * one row at a time): free when it does not happen, and it happens only at the edge of f32's
 * range. So is a row whose weight of a key with an Inf in V underflowed to +0 in f32 (its
 * score more than 104 below the row's best), which gives 0 x Inf = NaN, where the reference
 * gives Inf. scratch: Dk + Lk + Dv doubles. */
static void redo_overflowed_rows(const sdpa__problem *p, sdpa_tensor *out, sdpa_tensor *lse,
                                 double *scratch) {
    for (int64_t b = 0; b < p->B; b++) {
        sdpa__problem tmp;
        const sdpa__problem *seq = sdpa__seq(p, b, &tmp);
        for (int64_t h = 0; h < p->Hq; h++)
            for (int64_t i = 0; i < p->Lq; i++) {
                /* a split row merges an infinite partial into inf, or NaN where its weight is 0 */
                int bad = 0;
                for (int64_t c = 0; c < p->Dv && !bad; c++)
                    bad =
                        !isfinite(sdpa__load(out->data, out->dtype, sdpa__offset(out, b, h, i, c)));
                if (bad)
                    sdpa__ref_forward_row(seq, b, h, i, scratch, scratch + p->Dk,
                                          scratch + p->Dk + p->Lk, out, lse);
            }
    }
}

/* Whether each of the `workers` keeps its head's K and V widened (WIDE_MIN_BLOCKS). */
static void plan_wide(flash_plan *pl, int workers) {
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

/* The plan's fields that depend on the problem and the table only (not the split). */
static void plan_init(flash_plan *pl, const sdpa__impl *self, const sdpa__problem *p) {
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

sdpa_status sdpa__flash_forward(const sdpa__impl *self, sdpa_ctx *ctx, const sdpa__problem *p,
                                sdpa_tensor *out, sdpa_tensor *lse) {
    _Static_assert(SDPA__ELEM_F32 == (int)SDPA_F32 && SDPA__ELEM_F16 == (int)SDPA_F16 &&
                       SDPA__ELEM_BF16 == (int)SDPA_BF16,
                   "the micro-kernels' element codes are sdpa_dtype values");
    flash_plan pl;
    plan_init(&pl, self, p);
    pl.out = out;
    pl.lse = lse;
    plan_split(&pl);
    const int workers = sdpa__n_workers(ctx);
    plan_wide(&pl, workers);
    atomic_int overflowed = 0;
    pl.overflowed = &overflowed;
    /* and, after the workers' regions, what redo_overflowed_rows needs: reserved now, so that
     * a call never fails after it has written outputs */
    const int64_t tasks = p->B * p->Hkv * pl.n_qb;
    const size_t redo = (size_t)(p->Dk + p->Lk + p->Dv) * sizeof(double);
    const size_t parts = pl.n_chunks > 1 ? (size_t)(tasks * pl.rp * pl.n_chunks) : 0;
    size_t bytes;
    for (;;) {
        task_scratch unused;
        pl.per_worker = layout(&pl, NULL, &unused);
        bytes = (size_t)workers * pl.per_worker + redo + parts * (size_t)p->Dv * 4 +
                parts * sizeof(double);
        pl.scratch = sdpa__alloc(ctx, bytes, 64);
        if (pl.scratch != NULL || !(pl.wide_k || pl.wide_v))
            break;
        pl.wide_k = pl.wide_v = 0; /* the widened heads are a speed-up: do without them */
    }
    if (pl.scratch == NULL)
        return sdpa__fail(ctx, SDPA_ERR_NOMEM, "flash forward: no memory for %zu bytes", bytes);
    char *after = pl.scratch + (size_t)workers * pl.per_worker;
    pl.part_lse = (double *)(after + redo);
    pl.part_o = (float *)(after + redo + parts * sizeof(double));
    for (int w = 0; w < workers && (pl.wide_k || pl.wide_v); w++) {
        task_scratch ts;
        layout(&pl, pl.scratch + (size_t)w * pl.per_worker, &ts);
        *ts.wide_bh = -1;
    }
    sdpa__parallel_for(ctx, tasks * pl.n_chunks, flash_task, &pl);
    if (pl.n_chunks > 1)
        sdpa__parallel_for(ctx, tasks, merge_task, &pl);
    if (atomic_load(&overflowed))
        redo_overflowed_rows(p, out, lse, (double *)after);
    sdpa__free(ctx, pl.scratch);
    return SDPA_OK;
}

sdpa_status sdpa__flash_weights(const sdpa__impl *self, sdpa_ctx *ctx, const sdpa__problem *p,
                                sdpa_tensor *weights) {
    flash_plan pl;
    plan_init(&pl, self, p);
    pl.weights = weights;
    task_scratch unused;
    pl.per_worker = layout(&pl, NULL, &unused);
    const size_t bytes = (size_t)sdpa__n_workers(ctx) * pl.per_worker;
    pl.scratch = sdpa__alloc(ctx, bytes, 64);
    if (pl.scratch == NULL)
        return sdpa__fail(ctx, SDPA_ERR_NOMEM, "flash weights: no memory for %zu bytes", bytes);
    sdpa__parallel_for(ctx, p->B * p->Hkv * pl.n_qb, weights_task, &pl);
    sdpa__free(ctx, pl.scratch);
    return SDPA_OK;
}
