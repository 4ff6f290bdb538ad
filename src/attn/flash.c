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
 * also cuts its keys into chunks (flash_plan.c), each chunk a task that leaves a partial (O, LSE),
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
 *
 * Files: flash_plan.c makes the plan (tile sizes, tasks, split-KV chunks, widened heads:
 * the constants named above), flash_slices.c walks a task's slices (key_slice,
 * flash_plan.h); this file runs the tasks.
 */
#include "flash.h"

#include "../core/half.h"
#include "../core/services.h"
#include "../ref/ref.h"
#include "flash_plan.h"
#include "merge.h"
#include "tile.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

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

/* A row's LSE from its softmax's running max m and sum l, which the table gives times
 * 2^weight_exp2 (ukernels.h): m + log l, summed in double (one rounding, not three); -inf for
 * a row that saw nothing. */
static double row_lse(const sdpa__ukernels *uk, float m, float l) {
    return l == 0.0f ? -INFINITY : (double)m + log(ldexp((double)l, -uk->weight_exp2));
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
    for (sdpa__flash_slices_begin(pl, &t, chunk, &sl); sdpa__flash_slices_next(pl, &t, &sl);) {
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
    for (sdpa__flash_slices_begin(pl, &t, 0, &sl); sdpa__flash_slices_next(pl, &t, &sl);) {
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
    for (sdpa__flash_slices_begin(pl, &t, 0, &sl); sdpa__flash_slices_next(pl, &t, &sl);) {
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

sdpa_status sdpa__flash_forward(const sdpa__impl *self, sdpa_ctx *ctx, const sdpa__problem *p,
                                sdpa_tensor *out, sdpa_tensor *lse) {
    _Static_assert(SDPA__ELEM_F32 == (int)SDPA_F32 && SDPA__ELEM_F16 == (int)SDPA_F16 &&
                       SDPA__ELEM_BF16 == (int)SDPA_BF16,
                   "the micro-kernels' element codes are sdpa_dtype values");
    flash_plan pl;
    sdpa__flash_plan_init(&pl, self, p);
    pl.out = out;
    pl.lse = lse;
    sdpa__flash_plan_split(&pl);
    const int workers = sdpa__n_workers(ctx);
    sdpa__flash_plan_wide(&pl, workers);
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
    sdpa__flash_plan_init(&pl, self, p);
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
