/*
 * flash.c — the tiled forward pass with the online softmax ("flash attention" on the CPU).
 *
 * Work is split into tasks of (batch b, kv head hk, block of query positions). A task holds
 * the rows of every query head of hk's group for its positions (position-major: row r is
 * position i0 + r / group of head hk * group + r % group), so each K/V tile is read (or
 * packed) once for the whole group. For each tile of keys it computes the scores with the
 * ISA's micro-kernels (kernels.h), applies the rules that hide keys or bias scores, takes the
 * online-softmax step (running max m, running sum l, rescale factor alpha) and accumulates
 * P V into an f32 tile of outputs; at the end O = acc / l and LSE = m + log(l). Extra memory is
 * O(rows x (Dk + Dv + tile)) per thread, never Lq x Lk. Key tiles that the window or the causal
 * rule hide from every row of a task are never visited.
 *
 * Determinism: the decomposition (tile sizes, task boundaries) depends only on the problem and
 * the micro-kernel table, never on the number of threads, and a task's arithmetic does not
 * depend on which thread runs it: results are bitwise identical for any n_threads.
 *
 * The contract's corner cases: hidden scores are set to -inf before the softmax, which turns
 * them into -0.0 weights; when a slice has hidden keys and its V holds a NaN or an Inf, P V is
 * done by a careful loop that skips those -0.0 weights, so a hidden key never lets 0 * NaN in. A
 * row that saw no key ends with l = 0 and is written as O = 0, LSE = -inf.
 */
#include "../core/half.h"
#include "../kernels/kernels.h"

#include <math.h>
#include <string.h>

enum { TARGET_ROWS = 128, KEY_TILE = 64, KEY_SLICE = 16 };

typedef struct flash_plan {
    const sdpa__problem *p;
    const sdpa__ukernels *uk;
    sdpa_tensor *out, *lse;
    int64_t bq;        /* query positions per task */
    int64_t n_qb;      /* query blocks per (b, hk) */
    int64_t rp;        /* padded row capacity: group * bq rounded up to lanes */
    int64_t dvp;       /* row stride of the output accumulator */
    int q_direct;      /* Q is f32 with unit feature stride: copied without conversion */
    int k_direct;      /* K is f32 with unit feature stride: read in place */
    int v_direct;      /* likewise V */
    int out_direct;    /* out is f32 with unit feature stride: written without conversion */
    int needs_post;    /* softcap, ALiBi or a mask: every tile is post-processed */
    size_t per_worker; /* floats of scratch per worker */
    float *scratch;
} flash_plan;

static int64_t round_up(int64_t x, int64_t m) {
    return (x + m - 1) / m * m;
}

/* The keys of a tile as f32 rows: in place when possible, else widened into `pack`. */
static const float *tile_rows(const sdpa_tensor *t, int direct, int64_t b, int64_t hk, int64_t j0,
                              int64_t nk, int64_t d, float *pack, int64_t *ld) {
    if (direct) {
        *ld = t->stride[2];
        return (const float *)t->data + sdpa__offset(t, b, hk, j0, 0);
    }
    for (int64_t j = 0; j < nk; j++)
        for (int64_t c = 0; c < d; c++)
            pack[j * d + c] = sdpa__load(t->data, t->dtype, sdpa__offset(t, b, hk, j0 + j, c));
    *ld = d;
    return pack;
}

/* Whether rows [0, nk) of V (f32, row stride ld) hold a NaN or an Inf. Asked only of slices
 * where the softmax hid a key, the only case where such a value could leak as 0 x NaN. */
static int has_nonfinite(const float *v, int64_t nk, int64_t ld, int64_t d) {
    uint32_t bad = 0;
    for (int64_t j = 0; j < nk; j++)
        for (int64_t c = 0; c < d; c++) {
            uint32_t u;
            memcpy(&u, &v[j * ld + c], sizeof u);
            bad |= (u & 0x7f800000u) == 0x7f800000u;
        }
    return bad != 0;
}

/* The rows of a task: query head and position of row r, and the keys it may see under the
 * window rule, [lo[r], hi[r]] (wide open when a side is unbounded). */
typedef struct task_rows {
    int64_t *h, *i, *lo, *hi;
    const float **q_row; /* the f32 query row, when Q is read in place */
} task_rows;

/* Hides keys outside each row's window (on tiles the window cuts through), then applies
 * softcap, ALiBi and the mask to the visible scores of keys ja.. (s[jj * rp + r]). */
static void post_process(const flash_plan *pl, int64_t b, const task_rows *tr, int64_t r0,
                         int64_t r1, int64_t ja, int64_t nk, int whole, float *s) {
    const sdpa__problem *p = pl->p;
    if (!whole) {
        /* Rows are sorted by position, so the rows a key is hidden from are a prefix (right
         * bound: i + off + wr < j) and a suffix (left bound: i + off - wl > j) of the range:
         * two fills per key, no per-score test. */
        for (int64_t jj = 0; jj < nk; jj++) {
            const int64_t j = ja + jj;
            int64_t a = r0, z = r1;
            while (a < r1 && j > tr->hi[a])
                a++;
            while (z > a && j < tr->lo[z - 1])
                z--;
            float *s_j = s + jj * pl->rp;
            for (int64_t r = r0; r < a; r++)
                s_j[r] = -INFINITY;
            for (int64_t r = z; r < r1; r++)
                s_j[r] = -INFINITY;
        }
    }
    if (!pl->needs_post)
        return;
    const float cap = (float)p->softcap;
    for (int64_t jj = 0; jj < nk; jj++) {
        const int64_t j = ja + jj;
        float *s_j = s + jj * pl->rp;
        for (int64_t r = r0; r < r1; r++) {
            if (j < tr->lo[r] || j > tr->hi[r])
                continue; /* hidden by the window: stays -inf */
            const int64_t h = tr->h[r], i = tr->i[r];
            float x = s_j[r];
            if (cap > 0.0f)
                x = cap * tanhf(x / cap);
            if (p->alibi != NULL)
                x -= p->alibi[h] * fabsf((float)(j - (i + p->off)));
            if (p->has_mask) {
                const float mv =
                    sdpa__load(p->mask.data, p->mask.dtype, sdpa__offset(&p->mask, b, h, i, j));
                if (p->mask.dtype == SDPA_BOOL)
                    x = mv == 0.0f ? -INFINITY : x;
                else
                    x = mv == -INFINITY ? -INFINITY : x + mv;
            }
            s_j[r] = x;
        }
    }
}

static void flash_task(void *arg, int64_t task, int worker) {
    const flash_plan *pl = arg;
    const sdpa__problem *p = pl->p;
    const sdpa__ukernels *uk = pl->uk;
    /* When a right window bound (causal) makes later query blocks see more keys, each head's
     * blocks are taken last first: the pool hands out tasks in increasing order, so within a
     * head the large tasks start early and the small ones fill the gaps, while neighbouring
     * tasks still share their K/V tiles in cache. The mapping depends on the problem only,
     * never on the threads. */
    const int64_t bh = task / pl->n_qb, rank = task % pl->n_qb;
    const int64_t b = bh / p->Hkv, hk = bh % p->Hkv;
    const int64_t qb = p->window_right >= 0 ? pl->n_qb - 1 - rank : rank;
    const int64_t i0 = qb * pl->bq, nq = i0 + pl->bq <= p->Lq ? pl->bq : p->Lq - i0;
    const int64_t rows = p->group * nq, rpad = round_up(rows, uk->lanes), rp = pl->rp;

    float *qt = pl->scratch + (size_t)worker * pl->per_worker;
    float *s = qt + p->Dk * rp;
    float *o = s + KEY_TILE * rp;
    float *m = o + rp * pl->dvp, *l = m + rp, *alpha = l + rp;
    float *kpack = alpha + rp;
    float *vpack = kpack + round_up(KEY_TILE * p->Dk, 16);
    task_rows tr;
    tr.h = (int64_t *)(void *)(vpack + round_up(KEY_TILE * p->Dv, 16));
    tr.i = tr.h + rp;
    tr.lo = tr.i + rp;
    tr.hi = tr.lo + rp;
    tr.q_row = (const float **)(void *)(tr.hi + rp);

    /* the rows of the task: Q transposed, and each row's head, position and window */
    const int64_t open = p->Lq + p->Lk; /* beyond any key index */
    for (int64_t r = 0; r < rpad; r++) {
        const int64_t h = hk * p->group + r % p->group, i = i0 + r / p->group;
        m[r] = -INFINITY;
        l[r] = 0.0f;
        tr.h[r] = h;
        tr.i[r] = i;
        tr.lo[r] = p->window_left >= 0 ? i + p->off - p->window_left : -open;
        tr.hi[r] = p->window_right >= 0 ? i + p->off + p->window_right : open;
    }
    if (pl->q_direct) {
        for (int64_t r = 0; r < rows; r++)
            tr.q_row[r] = (const float *)p->q.data + sdpa__offset(&p->q, b, tr.h[r], tr.i[r], 0);
        uk->pack_q(rows, p->Dk, tr.q_row, qt, rp);
    } else {
        for (int64_t r = 0; r < rows; r++)
            for (int64_t d = 0; d < p->Dk; d++)
                qt[d * rp + r] =
                    sdpa__load(p->q.data, p->q.dtype, sdpa__offset(&p->q, b, tr.h[r], tr.i[r], d));
        for (int64_t d = 0; d < p->Dk; d++)
            for (int64_t r = rows; r < rpad; r++)
                qt[d * rp + r] = 0.0f;
    }
    memset(o, 0, (size_t)(rows * pl->dvp) * sizeof *o);

    /* the keys any row of the task may see */
    int64_t jlo = 0, jhi = p->Lk;
    if (p->window_left >= 0 && i0 + p->off - p->window_left > jlo)
        jlo = i0 + p->off - p->window_left;
    if (p->window_right >= 0 && i0 + nq + p->off + p->window_right < jhi)
        jhi = i0 + nq + p->off + p->window_right;

    for (int64_t j0 = jlo / KEY_TILE * KEY_TILE; j0 < jhi; j0 += KEY_TILE) {
        const int64_t ja = j0 > jlo ? j0 : jlo, jb = j0 + KEY_TILE < jhi ? j0 + KEY_TILE : jhi;
        const int64_t min_rel = ja - (i0 + nq - 1 + p->off), max_rel = jb - 1 - (i0 + p->off);
        const int whole = (p->window_right < 0 || max_rel <= p->window_right) &&
                          (p->window_left < 0 || min_rel >= -p->window_left);
        /* A tile the window cuts through (the causal diagonal) goes in slices of KEY_SLICE
         * keys, each computed only for the rows that see some of it: rows are sorted by
         * position, so those are one range, and most of the hidden triangle is skipped. */
        const int64_t step = whole ? KEY_TILE : KEY_SLICE;
        for (int64_t js = ja; js < jb; js += step) {
            const int64_t nk = js + step < jb ? step : jb - js;
            int64_t first = 0, last = nq; /* positions [first, last) see a key of the slice */
            if (p->window_right >= 0)
                first = js - p->off - p->window_right - i0;
            if (p->window_left >= 0)
                last = js + nk - 1 - p->off + p->window_left - i0 + 1;
            first = first < 0 ? 0 : first;
            last = last > nq ? nq : last;
            if (first >= last)
                continue;
            const int64_t r0 = first * p->group / uk->lanes * uk->lanes;
            const int64_t r1 = last * p->group, r1pad = round_up(r1, uk->lanes);
            const int64_t r1use = r1pad < rows ? r1pad : rows;
            float *s0 = s + r0;
            int64_t ldk, ldv;
            const float *kt = tile_rows(&p->k, pl->k_direct, b, hk, js, nk, p->Dk, kpack, &ldk);
            if (uk->qk_few != NULL && pl->q_direct && r1use - r0 <= SDPA__FEW_ROWS &&
                r1pad - r0 == uk->lanes)
                uk->qk_few(nk, r1use - r0, p->Dk, kt, ldk, tr.q_row + r0, (float)p->scale, s0, rp);
            else
                uk->qk(nk, r1pad - r0, p->Dk, kt, ldk, qt + r0, rp, (float)p->scale, s0, rp);
            if (!whole || pl->needs_post)
                post_process(pl, b, &tr, r0, r1use, js, nk, whole, s0 - r0);
            const int hidden = uk->softmax(nk, r1pad - r0, s0, rp, m + r0, l + r0, alpha + r0);
            const float *vt = tile_rows(&p->v, pl->v_direct, b, hk, js, nk, p->Dv, vpack, &ldv);
            float *o0 = o + r0 * pl->dvp;
            if (hidden && has_nonfinite(vt, nk, ldv, p->Dv))
                sdpa__pv_generic(nk, r1use - r0, p->Dv, s0, rp, alpha + r0, vt, ldv, o0, pl->dvp);
            else
                uk->pv(nk, r1use - r0, p->Dv, s0, rp, alpha + r0, vt, ldv, o0, pl->dvp);
        }
    }

    /* O = acc / l, LSE = m + log l (summed in double: one rounding, not three); rows that saw
     * nothing: 0 and -inf */
    for (int64_t r = 0; r < rows; r++) {
        const int64_t h = tr.h[r], i = tr.i[r];
        const float inv = l[r] == 0.0f ? 0.0f : 1.0f / l[r];
        const float *o_r = o + r * pl->dvp;
        if (pl->out_direct) {
            float *dst = (float *)pl->out->data + sdpa__offset(pl->out, b, h, i, 0);
            for (int64_t d = 0; d < p->Dv; d++)
                dst[d] = o_r[d] * inv;
        } else {
            for (int64_t d = 0; d < p->Dv; d++)
                sdpa__store(pl->out->data, pl->out->dtype, sdpa__offset(pl->out, b, h, i, d),
                            (double)(o_r[d] * inv));
        }
        if (pl->lse != NULL)
            ((float *)pl->lse->data)[sdpa__offset(pl->lse, b, h, i, 0)] =
                l[r] == 0.0f ? -INFINITY : (float)((double)m[r] + log((double)l[r]));
    }
}

sdpa_status sdpa__flash_forward(const sdpa__impl *self, sdpa_ctx *ctx, const sdpa__problem *p,
                                sdpa_tensor *out, sdpa_tensor *lse) {
    flash_plan pl;
    memset(&pl, 0, sizeof pl);
    pl.p = p;
    pl.uk = self->uk;
    pl.out = out;
    pl.lse = lse;
    pl.bq = TARGET_ROWS / p->group > 1 ? TARGET_ROWS / p->group : 1;
    if (pl.bq > p->Lq)
        pl.bq = p->Lq;
    pl.n_qb = (p->Lq + pl.bq - 1) / pl.bq;
    pl.rp = round_up(p->group * pl.bq, 16); /* a multiple of every ISA's lanes */
    pl.dvp = round_up(p->Dv, 16);
    pl.q_direct = p->q.dtype == SDPA_F32 && (p->q.stride[3] == 1 || p->Dk == 1);
    pl.k_direct = p->k.dtype == SDPA_F32 && (p->k.stride[3] == 1 || p->Dk == 1);
    pl.out_direct = out->dtype == SDPA_F32 && (out->stride[3] == 1 || p->Dv == 1);
    pl.v_direct = p->v.dtype == SDPA_F32 && (p->v.stride[3] == 1 || p->Dv == 1);
    pl.needs_post = p->softcap > 0.0 || p->alibi != NULL || p->has_mask;
    /* qt, s, o, m, l, alpha, then the K and V packing tiles; each region keeps 64-byte
     * alignment because every size is a multiple of 16 floats */
    /* + the row table: four int64 arrays and a pointer array of rp (10 floats per row) */
    pl.per_worker =
        (size_t)(p->Dk * pl.rp + KEY_TILE * pl.rp + pl.rp * pl.dvp + 3 * pl.rp +
                 round_up(KEY_TILE * p->Dk, 16) + round_up(KEY_TILE * p->Dv, 16) + 10 * pl.rp);
    const int workers = sdpa__n_workers(ctx);
    const size_t bytes = (size_t)workers * pl.per_worker * sizeof(float);
    pl.scratch = sdpa__alloc(ctx, bytes, 64);
    if (pl.scratch == NULL)
        return sdpa__fail(ctx, SDPA_ERR_NOMEM, "flash forward: no memory for %zu bytes", bytes);
    sdpa__parallel_for(ctx, p->B * p->Hkv * pl.n_qb, flash_task, &pl);
    sdpa__free(ctx, pl.scratch);
    return SDPA_OK;
}
