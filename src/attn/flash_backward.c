/*
 * flash_backward.c — the tiled backward pass: FlashAttention-2's algorithm, made deterministic
 * without atomics, run with the micro-kernels of the implementation that calls it (self->uk).
 *
 * For query row i of (b, h) and key j of kv head hk = h / group, with the forward's out O and
 * log-sum-exp L (ref_backward.c names the forward lines these differentiate):
 *     Delta_i = dO_i . O_i                          one pass over the rows, first
 *     P_ij    = exp(s_ij - L_i)                     s_ij formed as the forward forms it
 *     dV_j   += z_ij P_ij dO_i                      z_ij: dropout's keep / (1 - p), or 1
 *     dS_ij   = P_ij (z_ij dO_i . v_j - Delta_i) s'(x_ij)    s': softcap's derivative, or 1
 *     dQ_i   += scale dS_ij k_j                     dK_j += scale dS_ij q_i
 * Nothing of size Lq x Lk is kept: P and dS are recomputed tile by tile. The work on a tile of
 * QUERY_BLOCK queries of head h against KEY_BLOCK keys (tile_a) forms S and P row-major (one key
 * per SIMD lane: qk with query rows where it takes keys, and the keys packed where it takes
 * Q^T), dV += P^T dO and dK += dS^T Q with pv summing over the query rows, and, in the one-pass
 * schedule, dQ += dS K with pv_t (or, in a table without it, pv over dS transposed by
 * pack_q): five tile products, the forward's two and three more, as in FlashAttention-2.
 *
 * The one-pass schedule. dK and dV of a block of keys are summed in a task's registers and
 * scratch and stored once; dQ of a row gets a term from every block of keys it sees, and so
 * from several tasks. To sum those without atomics in an order fixed by the problem alone,
 * each (b, kv head) pair's key blocks are split into n_chunks chunks of about equal work (the
 * work of a block: the query rows that see it, so causal chunks balance too). One task per
 * (pair, chunk) runs its key blocks in order, key_group at a time (several where the query
 * rows would not stay in cache between blocks): for every query head of the group in order
 * and every block of queries that sees the keys in order, tile_a for each key block; it stores
 * dK and dV of each block once, and sums dS K into the chunk's own f32 partial of dQ (group x
 * the rows its keys are seen by x Dk). A second loop then gives each row dQ = scale (partial_0 +
 * partial_1 + ...), the chunks in order, skipping those whose keys the row cannot see, stored once.
 * The number of chunks comes from the problem alone (chunk_count: enough for TARGET_TASKS tasks,
 * at most MAX_CHUNKS and the key blocks, fewer where the partials would pass DQ_BUDGET), never
 * from the thread count, and so does every boundary. The partials are O(group Lq Dk) per pair;
 * the pairs run in waves whose partials fit `dq_budget` bytes (DQ_BUDGET; each wave its chunk
 * loop, then its sums), so extra memory stays bounded whatever B and H. Neither waves nor key
 * groups change any sum; the tests reach them all through sdpa__flash_backward_tuned (flash.h).
 *
 * The two-kind schedule, where even one pair's partials would not fit the budget with two
 * tasks to a wave (long sequences with large query groups), needs no partials and recomputes
 * S and dP instead (seven products): tasks of kind A, one per (b, kv head, key block), run
 * tile_a without dQ; tasks of kind B, one per (b, query head, query block), own those rows of
 * dQ and, per block of keys the rows see, form S, P and dP transposed as the forward does (one
 * query row per lane) and dQ += dS K with pv. Both kinds run in one parallel loop. Kind B sums
 * dQ exactly as the one-pass schedule does, so that the two give the same bits and the choice
 * between them may follow the workers and the memory: a chain per chunk from +0, over the
 * chunk's whole key blocks in order, each into the rows of the block's query rows
 * (sdpa__bwd_block_rows) the task holds, with pv_careful where tile_a takes it (S, P, dP and
 * dS are tile_a's own bits, laid out transposed; pv gives pv_t's bits); then the chains of the
 * chunks whose rows hold the row, added in chunk order as sum_task adds them (add_chains). The
 * one-pass schedule runs where its waves keep the workers busy at least 5/7 of the time (its
 * five products against the seven of two kinds of task spread over every worker:
 * busy_enough); where the budget's waves would not, waves of the fewest pairs with a task for
 * every worker, smaller than the budget's or larger (the budget growing to GROWN_BUDGET);
 * where neither does (more workers than the pairs' tasks, past GROWN_BUDGET, or waves that
 * leave too many idle) or the allocator refuses the partials, two kinds of task.
 *
 * Extra memory: Delta (B Hq Lq floats), the partials of a wave (at most dq_budget bytes, or
 * GROWN_BUDGET where the budget grew: then about one or two groups' Lq x dkp floats a worker),
 * and
 * one scratch region per worker of O(block x (Dk + Dv + block)) floats, plus, where Q or dO is
 * widened, a chunk's rows of them (whole query blocks: at most group x n_qb QUERY_BLOCK x
 * (Dk + Dv) floats; WIDE_MAX_BYTES in all).
 *
 * The contract's corner cases:
 * - A fully masked row (L_i = -inf) sees nothing: every score of it is hidden, its dQ is 0 and
 *   it adds nothing to dK or dV. A NaN row (L_i NaN) has P_ij = NaN for every key it sees, so
 *   its dQ and the dK, dV of those keys are NaN; the keys it cannot see get nothing from it.
 * - Hidden scores (window, mask, a score below f32's range) become -0.0 weights, which exp
 *   never returns, and their dS is set to -0.0 too. The products are the table's own: where a
 *   tile has a hidden pair and the operand a hidden weight multiplies holds a NaN or an Inf,
 *   dK (Q) and dQ (K) take the table's pv_careful, which adds nothing for a zero weight and is
 *   otherwise bitwise pv: such a key or row has no effect at all. A visible pair whose dS is 0
 *   (softcap's derivative at a score of +-inf, which an Inf in q_i or k_j gives) then gets
 *   the NaN of 0 x Inf back from nan_of_visible_zeros, as in the reference. dV's operand is dO,
 *   whose NaN must still reach the dV of a key the row sees but dropped (0 x NaN, as in the
 *   reference); there a plain loop skips exactly the -0.0 weights.
 * - Every element of dq, dk and dv is written exactly once (keys no query sees get 0, rows no
 *   key block reaches get 0), rounded once by the table's store_row. All scratch is reserved
 *   before anything is written, so the only failure, SDPA_ERR_NOMEM, leaves the outputs
 *   untouched.
 *
 * Files: flash_backward_plan.c chooses the schedule (chunk_count, busy_enough) and the widened
 * rows (WIDE_MAX_BYTES); flash_backward_plan.h holds the plan, the blocks' sizes and the
 * budgets; this file runs the tasks.
 */
#include "flash.h"

#include "../core/philox.h"
#include "../core/services.h"
#include "flash_backward_plan.h"
#include "tile.h"

#include <math.h>
#include <string.h>

/* Key blocks taken together by a task of the one-pass schedule (key_group). A task sweeps the
 * rows of its pair's query heads once per step: their Q, dO and dQ partial, group x Lq x
 * (2 Dk + Dv) floats. Where that passes SWEEP_IN_CACHE bytes (about a core's L2) it comes from
 * L3 or DRAM, and each tile of queries is then used for up to MAX_KEY_GROUP key blocks in a
 * row, while it is in L2, rather than once per block; the blocks' packed K and V and their dK
 * and dV, 512 (Dk + Dv) bytes a block, stay in the worker's scratch (at most 256 KiB: fewer
 * blocks for larger heads). Below, one block at a time measured slightly faster (at a sweep of
 * 3 MiB, B=1 H=8 L=2048 D=128 on an Intel Xeon with 2 MiB of L2, 4 blocks took 2-3 % less
 * time than 1; at 1.5 MiB, D=64, they measured alike). Nothing is summed in another
 * order: dK and dV of a block over the query tiles in order, dQ of a row over the key blocks
 * in order; the gradients are bitwise the same. (At B=1 Hq=16 Hkv=2 L=4096 D=64, 4 blocks at
 * a time took bwd/fwd from 3.4 to 2.8; at B=1 H=16 L=32768 D=64 causal, from 3.0 to 2.2.) */
enum { MAX_KEY_GROUP = 4 };
#define SWEEP_IN_CACHE (2.0 * 1024 * 1024)

/* One worker's scratch. Kind A and kind B use the same regions for their own purposes. */
typedef struct bwd_scratch {
    float *pk;     /* A: K^T packed (Dk x KEY_BLOCK per block of the group); B: Q^T */
    float *pv;     /* A: V^T packed; B: dO^T */
    float *krows;  /* K rows widened (KEY_BLOCK x Dk per block), when K is not read in place */
    float *vrows;  /* likewise V (KEY_BLOCK x Dv) */
    float *qrows;  /* likewise Q */
    float *dorows; /* likewise dO */
    float *acc_k;  /* A: dK of the blocks' keys (KEY_BLOCK x dkp per block); B: a chunk's dQ */
    float *dq_sum; /* B: dQ of its rows, the chunks so far */
    float *acc_v;  /* A: dV (KEY_BLOCK x dvp per block) */
    float *s;      /* scores, then the weights P (a tile) */
    float *dp;     /* dP, then dS */
    float *dst;    /* one-pass: dS transposed */
    float *pt;     /* with dropout: z P */
    float *z;      /* with dropout: z */
    float *dsdx;   /* with softcap: ds/dx */
    float *u;      /* per lane: the LSE to subtract */
    float *dl;     /* per lane: Delta */
    float *ones;   /* pv's alpha: 1 */
    float *orow;   /* Delta's pass: a row of O and one of dO, widened */
    float *dorow;
    const float **rowp; /* the rows pack_q reads */
    /* With pl->wide: the task's rows of Q and dO widened (when not read in place), query
     * blocks wide_qb0 .. wide_qb0 + wide_blocks - 1 of each head g of the group: query block
     * wide_qb0 + x of head g at (g wide_blocks + x) QUERY_BLOCK rows of Dk (Dv) floats, and
     * whether it is widened, ready[g wide_blocks + x]. */
    float *qwide, *dowide;
    unsigned char *ready;
    int64_t wide_qb0;
} bwd_scratch;

/* Takes `bytes` from the region at base (NULL: only measures), each piece 64-byte aligned. */
static void *take(char *base, size_t *at, size_t bytes) {
    void *ptr = base == NULL ? NULL : base + *at;
    *at += (bytes + 63) / 64 * 64;
    return ptr;
}

/* Lays out one worker's scratch at base and returns its size in bytes (base NULL: only
 * measures), the one place where the regions are both sized and pointed to. */
static size_t layout(const bwd_plan *pl, char *base, bwd_scratch *ws) {
    const sdpa__problem *p = pl->p;
    const size_t f = sizeof(float), dk = (size_t)p->Dk, dv = (size_t)p->Dv,
                 tile = QUERY_BLOCK * KEY_BLOCK * f, kg = (size_t)pl->key_group;
    size_t at = 0;
    ws->pk = take(base, &at, dk * WIDE * kg * f);
    ws->pv = take(base, &at, dv * WIDE * kg * f);
    ws->krows = take(base, &at, pl->k_direct ? 0 : KEY_BLOCK * dk * kg * f);
    ws->vrows = take(base, &at, pl->v_direct ? 0 : KEY_BLOCK * dv * f);
    ws->qrows = take(base, &at, pl->q_direct ? 0 : QUERY_BLOCK * dk * f);
    ws->dorows = take(base, &at, pl->do_direct ? 0 : QUERY_BLOCK * dv * f);
    ws->acc_k = take(base, &at, WIDE * (size_t)pl->dkp * kg * f);
    ws->acc_v = take(base, &at, KEY_BLOCK * (size_t)pl->dvp * kg * f);
    ws->dq_sum = take(base, &at, pl->fused ? 0 : QUERY_BLOCK * (size_t)pl->dkp * f);
    ws->s = take(base, &at, tile);
    ws->dp = take(base, &at, tile);
    ws->dst = take(base, &at, pl->fused ? tile : 0);
    ws->pt = take(base, &at, pl->dropout ? tile : 0);
    ws->z = take(base, &at, pl->dropout ? tile : 0);
    ws->dsdx = take(base, &at, p->softcap > 0.0 ? tile : 0);
    ws->u = take(base, &at, WIDE * f);
    ws->dl = take(base, &at, WIDE * f);
    ws->ones = take(base, &at, WIDE * f);
    ws->orow = take(base, &at, dv * f);
    ws->dorow = take(base, &at, dv * f);
    ws->rowp = take(base, &at, WIDE * sizeof(const float *));
    const size_t rows = pl->wide ? (size_t)(p->group * pl->wide_blocks) * QUERY_BLOCK : 0;
    ws->qwide = take(base, &at, pl->q_direct ? 0 : rows * dk * f);
    ws->dowide = take(base, &at, pl->do_direct ? 0 : rows * dv * f);
    ws->ready = take(base, &at, rows / QUERY_BLOCK);
    ws->wide_qb0 = 0; /* chunk_task sets it */
    return at;
}

static bwd_scratch scratch_of(const bwd_plan *pl, int worker) {
    bwd_scratch ws;
    layout(pl, pl->scratch + (size_t)worker * pl->per_worker, &ws);
    for (int n = 0; n < WIDE; n++)
        ws.ones[n] = 1.0f;
    return ws;
}

/* The f32 rows [l0, l0 + n) of t (batch b, head h, d features), row stride *ld: in place when
 * `direct`, else widened into buf. Also their pointers in rowp, when it is not NULL. */
static const float *rows_of(const sdpa__ukernels *uk, const sdpa_tensor *t, int direct, int64_t b,
                            int64_t h, int64_t l0, int64_t n, int64_t d, float *buf, int64_t *ld,
                            const float **rowp) {
    const float *base;
    if (direct) {
        *ld = t->stride[2];
        base = (const float *)t->data + sdpa__offset(t, b, h, l0, 0);
    } else {
        for (int64_t r = 0; r < n; r++)
            uk->load_row((int)t->dtype, d, sdpa__row_at(t, b, h, l0 + r), t->stride[3],
                         buf + r * d);
        *ld = d;
        base = buf;
    }
    if (rowp != NULL)
        for (int64_t r = 0; r < n; r++)
            rowp[r] = base + r * *ld;
    return base;
}

/* Rows [i0, i0 + nq) of t (head h, d features) within the query block of rows [a, a + n): in
 * place when `direct`, else from the task's widened block `wide` (row stride d), widened
 * first, whole, unless `ready`. */
static const float *kept_rows(const sdpa__ukernels *uk, const sdpa_tensor *t, int direct, int64_t b,
                              int64_t h, int64_t a, int64_t n, int64_t i0, int64_t nq, int64_t d,
                              float *wide, int ready, int64_t *ld) {
    if (direct)
        return rows_of(uk, t, 1, b, h, i0, nq, d, NULL, ld, NULL);
    if (!ready)
        rows_of(uk, t, 0, b, h, a, n, d, wide, ld, NULL);
    *ld = d;
    return wide + (i0 - a) * d;
}

/* The f32 rows [i0, i0 + nq) of Q and dO of head h, within one query block: *q and *dO, row
 * strides *ldq and *lddo. From the task's widened rows with pl->wide (the block widened first,
 * whole, if none of the task's tiles has), else as rows_of gives them. */
static void query_rows(const bwd_plan *pl, bwd_scratch *ws, int64_t b, int64_t h, int64_t i0,
                       int64_t nq, const float **q, int64_t *ldq, const float **dO, int64_t *lddo) {
    const sdpa__problem *p = pl->p;
    const sdpa__ukernels *uk = pl->uk;
    if (!pl->wide) {
        *q = rows_of(uk, &p->q, pl->q_direct, b, h, i0, nq, p->Dk, ws->qrows, ldq, NULL);
        *dO = rows_of(uk, pl->dout, pl->do_direct, b, h, i0, nq, p->Dv, ws->dorows, lddo, NULL);
        return;
    }
    const int64_t qb = i0 / QUERY_BLOCK, a = qb * QUERY_BLOCK;
    const int64_t x = h % p->group * pl->wide_blocks + qb - ws->wide_qb0;
    const int64_t n = a + QUERY_BLOCK < p->Lq ? QUERY_BLOCK : p->Lq - a;
    const int ready = ws->ready[x];
    ws->ready[x] = 1;
    /* (a block of a tensor read in place has no widened rows: no address into them is formed) */
    *q = kept_rows(uk, &p->q, pl->q_direct, b, h, a, n, i0, nq, p->Dk,
                   pl->q_direct ? NULL : ws->qwide + x * QUERY_BLOCK * p->Dk, ready, ldq);
    *dO = kept_rows(uk, pl->dout, pl->do_direct, b, h, a, n, i0, nq, p->Dv,
                    pl->do_direct ? NULL : ws->dowide + x * QUERY_BLOCK * p->Dv, ready, lddo);
}

static float lse_at(const bwd_plan *pl, int64_t b, int64_t h, int64_t i) {
    return ((const float *)pl->lse->data)[sdpa__offset(pl->lse, b, h, i, 0)];
}

/* The rules of the scores of a tile, s[r * rs + jj * js] for rows r < nr <= QUERY_BLOCK (query
 * positions i0 + r of head h) and keys ja + jj, jj < nk, holding the scaled products, one of rs
 * and js 1: softcap on every score (and ds/dx into dsdx, laid out like s), ALiBi and the mask,
 * as the forward applies them; then keys outside a row's window hidden (-inf) unless the whole
 * tile is visible. A row whose LSE is -inf (fully masked in the forward) is hidden whole: it
 * takes no part in anything. */
static void tile_rules(const bwd_plan *pl, int64_t b, int64_t h, int64_t i0, int64_t nr, int64_t ja,
                       int64_t nk, int whole, float *s, int64_t rs, int64_t js, float *dsdx) {
    const sdpa__problem *p = pl->p;
    if (p->softcap > 0.0) { /* along the contiguous side: a row's keys, or a key's rows */
        const int64_t runs = js == 1 ? nr : nk, len = js == 1 ? nk : nr, step = js == 1 ? rs : js;
        for (int64_t x = 0; x < runs; x++)
            pl->uk->softcap(len, s + x * step, (float)p->softcap, dsdx + x * step);
    }
    if (p->alibi != NULL || p->has_mask) {
        int64_t heads[QUERY_BLOCK], rows[QUERY_BLOCK];
        for (int64_t r = 0; r < nr; r++) {
            heads[r] = h;
            rows[r] = i0 + r;
        }
        sdpa__tile_bias(pl->uk, p, b, heads, rows, nr, ja, nk, s, rs, js);
    }
    for (int64_t r = 0; r < nr; r++) {
        const int64_t i = i0 + r;
        float *s_r = s + r * rs;
        int64_t a = 0, z = nk; /* the keys [a, z) of the tile that row i sees */
        if (lse_at(pl, b, h, i) == -INFINITY) {
            z = 0;
        } else if (!whole) {
            int64_t lo, hi;
            sdpa__row_keys(p, i, &lo, &hi);
            a = lo - ja < 0 ? 0 : lo - ja > nk ? nk : lo - ja;
            z = hi + 1 - ja < a ? a : hi + 1 - ja > nk ? nk : hi + 1 - ja;
        }
        /* dsdx is read by the table's ds, whose result is -0.0 there whatever it is */
        for (int64_t jj = 0; jj < a; jj++)
            s_r[jj * js] = -INFINITY;
        for (int64_t jj = z; jj < nk; jj++)
            s_r[jj * js] = -INFINITY;
        if (dsdx != NULL) {
            for (int64_t jj = 0; jj < a; jj++)
                dsdx[r * rs + jj * js] = 0.0f;
            for (int64_t jj = z; jj < nk; jj++)
                dsdx[r * rs + jj * js] = 0.0f;
        }
    }
}

/* Dropout's factors z of the same tile (z[r * rs + jj * js]), from the global indices
 * (b, h, i0 + r, ja + jj), a row at a time by the table's dropout_row: straight into z when
 * a row's keys are contiguous, else through a row of scratch. */
static void tile_dropout(const bwd_plan *pl, int64_t b, int64_t h, int64_t i0, int64_t nr,
                         int64_t ja, int64_t nk, float *z, int64_t rs, int64_t js) {
    float row[WIDE];
    for (int64_t r = 0; r < nr; r++)
        for (int64_t jb = 0; jb < nk; jb += WIDE) { /* one pass: nk <= WIDE */
            const int64_t n = nk - jb < WIDE ? nk - jb : WIDE;
            float *zr = js == 1 ? z + r * rs + jb : row;
            pl->uk->dropout_row(pl->key, b, h, i0 + r, ja + jb, n, pl->threshold, pl->keep_scale,
                                zr);
            for (int64_t jj = 0; js != 1 && jj < n; jj++)
                z[r * rs + (jb + jj) * js] = row[jj];
        }
}

/* o[a * ldo + c] += sum_r w[r * ldw + a] x[r * ldx + c] for a < na, c < d, in the order of r,
 * skipping exactly the hidden weights (-0.0): dV's product for a tile with a hidden pair whose
 * dO holds a NaN or an Inf. A dropped visible key's +0 weight still multiplies, as in the
 * reference, so dO's NaN reaches it. Rare (NaN in the incoming gradient): written plainly. */
static void pv_skip_hidden(int64_t nr, int64_t na, int64_t d, const float *w, int64_t ldw,
                           const float *x, int64_t ldx, float *o, int64_t ldo) {
    for (int64_t a = 0; a < na; a++)
        for (int64_t r = 0; r < nr; r++) {
            const float wr = w[r * ldw + a];
            if (sdpa__hidden_mask(wr))
                continue;
            for (int64_t c = 0; c < d; c++)
                o[a * ldo + c] += wr * x[r * ldx + c];
        }
}

/* The keys of one block, as tile_a reads them: K^T and V^T packed (pk, pv, KEY_BLOCK lanes),
 * the f32 rows of K (k, row stride ldk), with k_bad set when they hold a NaN or an Inf, and
 * the block's dK and dV accumulators (acc_k, acc_v). */
typedef struct key_tile {
    int64_t j0, nk;
    const float *pk, *pv, *k;
    int64_t ldk;
    int k_bad;
    float *acc_k, *acc_v;
} key_tile;

/* One tile: query rows i0 .. i0 + nq - 1 of head h against the keys of kt, into its dK and dV
 * accumulators, and into the rows dq (row stride dkp) when it is not NULL. Row-major
 * tiles: entry (r, jj) at r * ld + jj, ld = nk rounded up to the table's lanes. */
static void tile_a(const bwd_plan *pl, bwd_scratch *ws, int64_t b, int64_t h, int64_t i0,
                   int64_t nq, const key_tile *kt, float *dq) {
    const sdpa__problem *p = pl->p;
    const sdpa__ukernels *uk = pl->uk;
    const int64_t j0 = kt->j0, nk = kt->nk, ld = sdpa__round_up(nk, uk->lanes);
    float *dsdx = p->softcap > 0.0 ? ws->dsdx : NULL;
    int64_t ldq, lddo;
    const float *q, *dO;
    query_rows(pl, ws, b, h, i0, nq, &q, &ldq, &dO, &lddo);

    // S: s[r][jj] = scale q_r . k_jj, then the rules
    uk->qk(nq, ld, p->Dk, q, ldq, kt->pk, KEY_BLOCK, (float)p->scale, ws->s, ld);
    const int whole = sdpa__block_whole(p, i0, i0 + nq, j0, j0 + nk);
    tile_rules(pl, b, h, i0, nq, j0, nk, whole, ws->s, ld, 1, dsdx);

    // P = exp(S - LSE), each row with its own LSE (the padding keys too: qk wrote them)
    const float *lse = (const float *)pl->lse->data + sdpa__offset(pl->lse, b, h, i0, 0);
    const int hidden = uk->exp_lse_rows(nq, ld, ws->s, ld, lse, pl->lse->stride[2]);

    // dV += (z P)^T dO
    const float *w = ws->s;
    if (pl->dropout) {
        tile_dropout(pl, b, h, i0, nq, j0, nk, ws->z, ld, 1);
        for (int64_t r = 0; r < nq; r++)
            for (int64_t jj = 0; jj < nk; jj++)
                ws->pt[r * ld + jj] = ws->z[r * ld + jj] * ws->s[r * ld + jj];
        w = ws->pt;
    }
    if (hidden && sdpa__has_nonfinite(dO, nq, lddo, p->Dv))
        pv_skip_hidden(nq, nk, p->Dv, w, ld, dO, lddo, kt->acc_v, pl->dvp);
    else
        uk->pv(nq, nk, p->Dv, w, ld, ws->ones, dO, lddo, kt->acc_v, pl->dvp);

    // dP~[r][jj] = dO_r . v_jj; dS
    uk->qk(nq, ld, p->Dv, dO, lddo, kt->pv, KEY_BLOCK, 1.0f, ws->dp, ld);
    uk->ds(nq, nk, ws->dp, ld, ws->s, pl->dropout ? ws->z : NULL, dsdx,
           pl->delta + ((b * p->Hq) + h) * p->Lq + i0, 0);

    // dK += dS^T Q (scaled when stored)
    if (hidden && sdpa__has_nonfinite(q, nq, ldq, p->Dk)) {
        uk->pv_careful(nq, nk, p->Dk, ws->dp, ld, ws->ones, q, ldq, kt->acc_k, pl->dkp);
        sdpa__nan_of_visible_zeros(nq, nk, p->Dk, ws->dp, ws->s, ld, 1, q, ldq, kt->acc_k, pl->dkp);
    } else
        uk->pv(nq, nk, p->Dk, ws->dp, ld, ws->ones, q, ldq, kt->acc_k, pl->dkp);

    // dQ += dS K (scaled when stored): by pv_t from dS as it is, else over dS transposed,
    // dst[jj][r], a query row per lane
    if (dq == NULL)
        return;
    const int careful = hidden && kt->k_bad;
    if (uk->pv_t != NULL && !careful) {
        uk->pv_t(nk, nq, p->Dk, ws->dp, ld, ws->ones, kt->k, kt->ldk, dq, pl->dkp);
        return;
    }
    for (int64_t r = 0; r < nq; r++)
        ws->rowp[r] = ws->dp + r * ld;
    uk->pack_q(nq, nk, ws->rowp, ws->dst, QUERY_BLOCK);
    if (careful) {
        uk->pv_careful(nk, nq, p->Dk, ws->dst, QUERY_BLOCK, ws->ones, kt->k, kt->ldk, dq, pl->dkp);
        sdpa__nan_of_visible_zeros(nk, nq, p->Dk, ws->dp, ws->s, 1, ld, kt->k, kt->ldk, dq,
                                   pl->dkp);
    } else
        uk->pv(nk, nq, p->Dk, ws->dst, QUERY_BLOCK, ws->ones, kt->k, kt->ldk, dq, pl->dkp);
}

/* Key blocks [kb0, kb1) of (b, kv head hk), at most key_group of them: for every query head of
 * the group in order, and every block of queries that sees some of their keys in order, tile_a
 * for each block that those queries see, in order; then dK and dV of each block stored once
 * (keys no query sees get their 0). With part (one-pass), dS K is summed into the chunk's
 * partial, whose rows start at row lo and number `rows` per head; *zeroed is where the rows
 * not yet set to 0 begin (the blocks' rows only move forward, so each row is cleared once,
 * just before its first use). */
static void key_blocks(const bwd_plan *pl, bwd_scratch *ws, int64_t b, int64_t hk, int64_t kb0,
                       int64_t kb1, float *part, int64_t lo, int64_t rows, int64_t *zeroed) {
    const sdpa__problem *p = pl->p;
    const sdpa__ukernels *uk = pl->uk;
    key_tile kt[MAX_KEY_GROUP];
    int64_t first[MAX_KEY_GROUP], last[MAX_KEY_GROUP], seen_lo = p->Lq, seen_hi = 0;
    const int n = (int)(kb1 - kb0);
    for (int x = 0; x < n; x++) {
        key_tile *t = &kt[x];
        t->j0 = (kb0 + x) * KEY_BLOCK;
        t->nk = t->j0 + KEY_BLOCK <= p->Lk ? KEY_BLOCK : p->Lk - t->j0;
        t->pk = ws->pk + x * p->Dk * KEY_BLOCK;
        t->pv = ws->pv + x * p->Dv * KEY_BLOCK;
        t->acc_k = ws->acc_k + x * KEY_BLOCK * pl->dkp;
        t->acc_v = ws->acc_v + x * KEY_BLOCK * pl->dvp;
        memset(t->acc_k, 0, (size_t)(t->nk * pl->dkp) * sizeof(float));
        memset(t->acc_v, 0, (size_t)(t->nk * pl->dvp) * sizeof(float));
        sdpa__bwd_block_rows(pl, kb0 + x, &first[x], &last[x]);
        if (first[x] >= last[x])
            continue;
        int64_t ld;
        t->k = rows_of(uk, &p->k, pl->k_direct, b, hk, t->j0, t->nk, p->Dk,
                       ws->krows + x * KEY_BLOCK * p->Dk, &t->ldk, ws->rowp);
        uk->pack_q(t->nk, p->Dk, ws->rowp, ws->pk + x * p->Dk * KEY_BLOCK, KEY_BLOCK);
        rows_of(uk, &p->v, pl->v_direct, b, hk, t->j0, t->nk, p->Dv, ws->vrows, &ld, ws->rowp);
        uk->pack_q(t->nk, p->Dv, ws->rowp, ws->pv + x * p->Dv * KEY_BLOCK, KEY_BLOCK);
        t->k_bad = part != NULL && sdpa__has_nonfinite(t->k, t->nk, t->ldk, p->Dk);
        seen_lo = first[x] < seen_lo ? first[x] : seen_lo;
        seen_hi = last[x] > seen_hi ? last[x] : seen_hi;
    }

    if (part != NULL && seen_hi > *zeroed) {
        for (int64_t g = 0; g < p->group; g++)
            memset(part + (g * rows + *zeroed - lo) * pl->dkp, 0,
                   (size_t)((seen_hi - *zeroed) * pl->dkp) * sizeof(float));
        *zeroed = seen_hi;
    }
    for (int64_t g = 0; g < p->group && seen_lo < seen_hi; g++)
        for (int64_t qb = seen_lo / QUERY_BLOCK; qb * QUERY_BLOCK < seen_hi; qb++)
            for (int x = 0; x < n; x++) {
                const int64_t a = qb * QUERY_BLOCK, z = a + QUERY_BLOCK;
                const int64_t i0 = a > first[x] ? a : first[x], i1 = z < last[x] ? z : last[x];
                if (i0 >= i1)
                    continue;
                float *dq = part != NULL ? part + (g * rows + i0 - lo) * pl->dkp : NULL;
                tile_a(pl, ws, b, hk * p->group + g, i0, i1 - i0, &kt[x], dq);
            }

    /* stored once: dK scaled, dV as it is */
    for (int x = 0; x < n; x++)
        for (int64_t jj = 0; jj < kt[x].nk; jj++) {
            const int64_t j = kt[x].j0 + jj;
            uk->store_row((int)pl->dk->dtype, p->Dk, kt[x].acc_k + jj * pl->dkp, (float)p->scale,
                          (void *)sdpa__row_at(pl->dk, b, hk, j), pl->dk->stride[3]);
            uk->store_row((int)pl->dv->dtype, p->Dv, kt[x].acc_v + jj * pl->dvp, 1.0f,
                          (void *)sdpa__row_at(pl->dv, b, hk, j), pl->dv->stride[3]);
        }
}

/* One-pass, first loop: task = (pair of the wave, chunk), the chunk's key blocks in order,
 * key_group at a time. */
static void chunk_task(void *arg, int64_t task, int worker) {
    const bwd_plan *pl = arg;
    const int64_t w = task / pl->n_chunks, c = task % pl->n_chunks, pair = pl->wave0 + w;
    const int64_t lo = pl->chunk_lo[c], rows = pl->chunk_hi[c] - lo;
    float *part = pl->part + w * pl->chunk_at[pl->n_chunks] + pl->chunk_at[c];
    bwd_scratch ws = scratch_of(pl, worker);
    if (pl->wide) { /* none of this task's rows widened yet */
        ws.wide_qb0 = lo / QUERY_BLOCK;
        memset(ws.ready, 0, (size_t)(pl->p->group * pl->wide_blocks));
    }
    int64_t zeroed = lo;
    for (int64_t kb = pl->chunk_kb[c]; kb < pl->chunk_kb[c + 1]; kb += pl->key_group) {
        const int64_t end =
            kb + pl->key_group < pl->chunk_kb[c + 1] ? kb + pl->key_group : pl->chunk_kb[c + 1];
        key_blocks(pl, &ws, pair / pl->p->Hkv, pair % pl->p->Hkv, kb, end, part, lo, rows, &zeroed);
    }
}

/* sum[c] = a[c] + b[c] for c < n (sum may be a or b), where a NaN of a wins over one of b: x86
 * returns the first operand's NaN where both are NaN, and which operand comes first is the
 * compiler's (it vectorises the loop), so sum_task and kind B, which add the same chunks'
 * chains, would otherwise give the same NaN with different signs. */
static void add_chains(float *sum, const float *a, const float *b, int64_t n) {
    for (int64_t c = 0; c < n; c++)
        sum[c] = a[c] != a[c] ? a[c] : a[c] + b[c];
}

/* One-pass, second loop: task = (pair of the wave, head of its group, block of queries);
 * each row's dQ = scale (partial_0 + partial_1 + ...) over the chunks whose keys it may see,
 * in chunk order, stored once (0 where there are none). */
static void sum_task(void *arg, int64_t task, int worker) {
    const bwd_plan *pl = arg;
    const sdpa__problem *p = pl->p;
    const int64_t per_pair = p->group * pl->n_qb, w = task / per_pair;
    const int64_t g = task % per_pair / pl->n_qb, qb = task % pl->n_qb, pair = pl->wave0 + w;
    const int64_t b = pair / p->Hkv, h = pair % p->Hkv * p->group + g;
    const int64_t i0 = qb * QUERY_BLOCK, i1 = i0 + QUERY_BLOCK < p->Lq ? i0 + QUERY_BLOCK : p->Lq;
    const float *part = pl->part + w * pl->chunk_at[pl->n_chunks];
    bwd_scratch ws = scratch_of(pl, worker);
    float *sum = ws.acc_k;
    for (int64_t i = i0; i < i1; i++) {
        const float *row = NULL;
        for (int c = 0; c < pl->n_chunks; c++) {
            const int64_t lo = pl->chunk_lo[c], hi = pl->chunk_hi[c];
            if (i < lo || i >= hi)
                continue;
            const float *x = part + pl->chunk_at[c] + (g * (hi - lo) + i - lo) * pl->dkp;
            if (row == NULL) {
                row = x;
                continue;
            }
            add_chains(sum, row, x, p->Dk);
            row = sum;
        }
        if (row == NULL) {
            memset(sum, 0, (size_t)p->Dk * sizeof(float));
            row = sum;
        }
        pl->uk->store_row((int)pl->dq->dtype, p->Dk, row, (float)p->scale,
                          (void *)sdpa__row_at(pl->dq, b, h, i), pl->dq->stride[3]);
    }
}

/* Whether a transposed tile of weights w[jj * ld + r] holds a hidden one (-0.0) in rows r < nr
 * of keys jj < nk. */
static int any_hidden(const float *w, int64_t ld, int64_t nk, int64_t nr) {
    uint32_t any = 0;
    for (int64_t jj = 0; jj < nk; jj++)
        for (int64_t r = 0; r < nr; r++)
            any |= sdpa__hidden_mask(w[jj * ld + r]);
    return any != 0;
}

/* Kind B, one tile: the task's query rows (Q^T in ws->pk, dO^T in ws->pv, their LSE and Delta
 * in ws->u and ws->dl) against key block kb of kv head hk, into the chunk's dQ (ws->acc_k) of
 * the rows r0 .. r0 + nr - 1 that see the block (sdpa__bwd_block_rows): the rows, products and
 * choice of pv_careful of tile_a's tile of those rows. Transposed tiles: entry (jj, r) at
 * jj * QUERY_BLOCK + r, rows padded to rpad lanes. */
static void tile_b(const bwd_plan *pl, bwd_scratch *ws, int64_t b, int64_t h, int64_t i0,
                   int64_t nq, int64_t kb, int64_t r0, int64_t nr) {
    const sdpa__problem *p = pl->p;
    const sdpa__ukernels *uk = pl->uk;
    const int64_t hk = h / p->group, rpad = sdpa__round_up(nq, uk->lanes);
    const int64_t ja = kb * KEY_BLOCK, nk = ja + KEY_BLOCK <= p->Lk ? KEY_BLOCK : p->Lk - ja;
    float *dsdx = p->softcap > 0.0 ? ws->dsdx : NULL;
    int64_t ldk, ldv;
    const float *k = rows_of(uk, &p->k, pl->k_direct, b, hk, ja, nk, p->Dk, ws->krows, &ldk, NULL);
    const float *v = rows_of(uk, &p->v, pl->v_direct, b, hk, ja, nk, p->Dv, ws->vrows, &ldv, NULL);

    // S: s[jj][r] = scale k_jj . q_r, then the rules (padding rows are left as they are)
    uk->qk(nk, rpad, p->Dk, k, ldk, ws->pk, QUERY_BLOCK, (float)p->scale, ws->s, QUERY_BLOCK);
    const int whole = sdpa__block_whole(p, i0, i0 + nq, ja, ja + nk);
    tile_rules(pl, b, h, i0, nq, ja, nk, whole, ws->s, 1, QUERY_BLOCK, dsdx);

    // P = exp(S - LSE), the rows along the lanes
    const int hidden = uk->exp_lse(nk, rpad, ws->s, QUERY_BLOCK, ws->u);
    if (pl->dropout)
        tile_dropout(pl, b, h, i0, nq, ja, nk, ws->z, 1, QUERY_BLOCK);

    // dP~[jj][r] = v_jj . dO_r; dS
    uk->qk(nk, rpad, p->Dv, v, ldv, ws->pv, QUERY_BLOCK, 1.0f, ws->dp, QUERY_BLOCK);
    uk->ds(nk, nq, ws->dp, QUERY_BLOCK, ws->s, pl->dropout ? ws->z : NULL, dsdx, ws->dl, 1);

    // dQ += dS K (scaled when stored), rows r0 .. r0 + nr - 1; pv_careful where tile_a's tile
    // of these rows takes it: a hidden pair among them, and a NaN or an Inf in the block's K
    const float *ds = ws->dp + r0, *w = ws->s + r0;
    float *acc = ws->acc_k + r0 * pl->dkp;
    if (hidden && sdpa__has_nonfinite(k, nk, ldk, p->Dk) && any_hidden(w, QUERY_BLOCK, nk, nr)) {
        uk->pv_careful(nk, nr, p->Dk, ds, QUERY_BLOCK, ws->ones, k, ldk, acc, pl->dkp);
        sdpa__nan_of_visible_zeros(nk, nr, p->Dk, ds, w, QUERY_BLOCK, 1, k, ldk, acc, pl->dkp);
    } else
        uk->pv(nk, nr, p->Dk, ds, QUERY_BLOCK, ws->ones, k, ldk, acc, pl->dkp);
}

static void task_b(const bwd_plan *pl, int64_t task, int worker) {
    const sdpa__problem *p = pl->p;
    const sdpa__ukernels *uk = pl->uk;
    /* As in the forward: when a right window bound (causal) makes later query blocks see more
     * keys, each head's blocks are taken last first, so the large tasks start early. */
    const int64_t bh = task / pl->n_qb, rank = task % pl->n_qb;
    const int64_t b = bh / p->Hq, h = bh % p->Hq;
    const int64_t qb = p->window_right >= 0 ? pl->n_qb - 1 - rank : rank;
    const int64_t i0 = qb * QUERY_BLOCK, nq = i0 + QUERY_BLOCK <= p->Lq ? QUERY_BLOCK : p->Lq - i0;
    bwd_scratch ws = scratch_of(pl, worker);
    memset(ws.acc_k, 0, (size_t)(nq * pl->dkp) * sizeof(float));

    /* the rows' LSE and Delta along the lanes; padding lanes get 0, which keeps them finite */
    for (int64_t r = 0; r < QUERY_BLOCK; r++) {
        ws.u[r] = r < nq ? lse_at(pl, b, h, i0 + r) : 0.0f;
        ws.dl[r] = r < nq ? pl->delta[((b * p->Hq) + h) * p->Lq + i0 + r] : 0.0f;
    }
    int64_t ld;
    rows_of(uk, &p->q, pl->q_direct, b, h, i0, nq, p->Dk, ws.qrows, &ld, ws.rowp);
    uk->pack_q(nq, p->Dk, ws.rowp, ws.pk, QUERY_BLOCK);
    rows_of(uk, pl->dout, pl->do_direct, b, h, i0, nq, p->Dv, ws.dorows, &ld, ws.rowp);
    uk->pack_q(nq, p->Dv, ws.rowp, ws.pv, QUERY_BLOCK);

    /* Per chunk whose rows [lo, hi) hold some of the task's: its blocks' chains from +0 in
     * ws.acc_k, then each of those rows' chain added to dq_sum as sum_task adds the partials
     * (the first taken as it is), and its chain cleared for the next chunk. */
    unsigned char started[QUERY_BLOCK] = {0};
    for (int c = 0; c < pl->n_chunks; c++) {
        const int64_t lo = pl->chunk_lo[c] > i0 ? pl->chunk_lo[c] : i0;
        const int64_t hi = pl->chunk_hi[c] < i0 + nq ? pl->chunk_hi[c] : i0 + nq;
        if (lo >= hi)
            continue;
        for (int64_t kb = pl->chunk_kb[c]; kb < pl->chunk_kb[c + 1]; kb++) {
            int64_t first, last;
            sdpa__bwd_block_rows(pl, kb, &first, &last);
            const int64_t r0 = first > i0 ? first : i0, r1 = last < i0 + nq ? last : i0 + nq;
            if (r0 < r1)
                tile_b(pl, &ws, b, h, i0, nq, kb, r0 - i0, r1 - r0);
        }
        for (int64_t r = lo - i0; r < hi - i0; r++) {
            float *chain = ws.acc_k + r * pl->dkp, *sum = ws.dq_sum + r * pl->dkp;
            if (started[r])
                add_chains(sum, sum, chain, p->Dk);
            else
                memcpy(sum, chain, (size_t)p->Dk * sizeof(float));
            started[r] = 1;
            memset(chain, 0, (size_t)p->Dk * sizeof(float));
        }
    }

    for (int64_t r = 0; r < nq; r++) {
        float *sum = ws.dq_sum + r * pl->dkp;
        if (!started[r]) /* no chunk's keys reach the row: 0, as sum_task stores it */
            memset(sum, 0, (size_t)p->Dk * sizeof(float));
        uk->store_row((int)pl->dq->dtype, p->Dk, sum, (float)p->scale,
                      (void *)sdpa__row_at(pl->dq, b, h, i0 + r), pl->dq->stride[3]);
    }
}

/* The two-kind schedule's loop: tasks of kind A (one per key block of each pair), then of
 * kind B. */
static void two_kind_task(void *arg, int64_t task, int worker) {
    const bwd_plan *pl = arg;
    if (task < pl->n_a) {
        const int64_t pair = task / pl->n_kb, kb = task % pl->n_kb;
        bwd_scratch ws = scratch_of(pl, worker);
        key_blocks(pl, &ws, pair / pl->p->Hkv, pair % pl->p->Hkv, kb, kb + 1, NULL, 0, 0, NULL);
    } else {
        task_b(pl, task - pl->n_a, worker);
    }
}

/* Delta_i = dO_i . O_i for the rows of one (b, h), summed in double: Lq Dv products, nothing
 * beside the tiles' work, and then one rounding rather than Dv. */
static void delta_task(void *arg, int64_t task, int worker) {
    const bwd_plan *pl = arg;
    const sdpa__problem *p = pl->p;
    const sdpa__ukernels *uk = pl->uk;
    const int64_t b = task / p->Hq, h = task % p->Hq;
    bwd_scratch ws;
    layout(pl, pl->scratch + (size_t)worker * pl->per_worker, &ws);
    for (int64_t i = 0; i < p->Lq; i++) {
        uk->load_row((int)pl->out->dtype, p->Dv, sdpa__row_at(pl->out, b, h, i), pl->out->stride[3],
                     ws.orow);
        uk->load_row((int)pl->dout->dtype, p->Dv, sdpa__row_at(pl->dout, b, h, i),
                     pl->dout->stride[3], ws.dorow);
        double sum = 0.0;
        for (int64_t c = 0; c < p->Dv; c++)
            sum += (double)ws.dorow[c] * (double)ws.orow[c];
        pl->delta[(b * p->Hq + h) * p->Lq + i] = (float)sum;
    }
}

sdpa_status sdpa__flash_backward_tuned(const sdpa__impl *self, sdpa_ctx *ctx,
                                       const sdpa__problem *p, const sdpa_tensor *out,
                                       const sdpa_tensor *lse, const sdpa_tensor *dout,
                                       sdpa_tensor *dq, sdpa_tensor *dk, sdpa_tensor *dv,
                                       const sdpa__bwd_tuning *tuning) {
    bwd_plan pl;
    memset(&pl, 0, sizeof pl);
    pl.p = p;
    pl.uk = self->uk;
    pl.out = out;
    pl.lse = lse;
    pl.dout = dout;
    pl.dq = dq;
    pl.dk = dk;
    pl.dv = dv;
    pl.n_kb = (p->Lk + KEY_BLOCK - 1) / KEY_BLOCK;
    pl.n_qb = (p->Lq + QUERY_BLOCK - 1) / QUERY_BLOCK;
    pl.n_a = p->B * p->Hkv * pl.n_kb;
    pl.dkp = sdpa__round_up(p->Dk, 16);
    pl.dvp = sdpa__round_up(p->Dv, 16);
    const int64_t fits = 512 / (p->Dk + p->Dv); /* blocks of 512 (Dk + Dv) bytes in 256 KiB */
    const double sweep =
        (double)p->group * (double)p->Lq * (double)(2 * p->Dk + p->Dv) * sizeof(float);
    pl.key_group = sweep <= SWEEP_IN_CACHE || fits < 1 ? 1
                   : fits > MAX_KEY_GROUP              ? MAX_KEY_GROUP
                                                       : (int)fits;
    if (tuning->key_group >= 1 && tuning->key_group <= MAX_KEY_GROUP)
        pl.key_group = tuning->key_group;
    pl.q_direct = p->q.dtype == SDPA_F32 && (p->q.stride[3] == 1 || p->Dk == 1);
    pl.k_direct = p->k.dtype == SDPA_F32 && (p->k.stride[3] == 1 || p->Dk == 1);
    pl.v_direct = p->v.dtype == SDPA_F32 && (p->v.stride[3] == 1 || p->Dv == 1);
    pl.do_direct = dout->dtype == SDPA_F32 && (dout->stride[3] == 1 || p->Dv == 1);
    pl.needs_post = p->softcap > 0.0 || p->alibi != NULL || p->has_mask;
    pl.dropout = p->dropout_p > 0.0;
    if (pl.dropout) {
        pl.keep_scale = (float)(1.0 / (1.0 - p->dropout_p));
        pl.threshold = sdpa__dropout_threshold(p->dropout_p);
        sdpa__dropout_key(p->dropout_seed, p->dropout_offset, pl.key);
    }
    const int workers = sdpa__n_workers(ctx);
    sdpa__bwd_plan_schedule(&pl, tuning, workers);
    const int64_t pairs = p->B * p->Hkv;
    sdpa__bwd_plan_wide(&pl, workers, tuning->wide);

    /* Delta's B Hq Lq floats first, then a wave's partials (at most dq_budget bytes, or
     * GROWN_BUDGET where the budget grew), then the workers' regions: all reserved before
     * anything is written. B Hq Lq Dk elements of dq exist (an output never overlaps itself),
     * so the product fits; the sum is checked anyway, a failure being reported as what it is.
     * Where the allocator refuses, the widened rows are left out, then the partials (two kinds
     * of task): the same bits each time. */
    const uint64_t rows = (uint64_t)p->B * (uint64_t)p->Hq * (uint64_t)p->Lq;
    const size_t delta_bytes = (size_t)sdpa__round_up((int64_t)(rows * sizeof(float)), 64);
    bwd_scratch unused;
    size_t bytes = 0, fixed = 0;
    char *mem = NULL;
    for (;;) {
        const size_t part_bytes =
            pl.fused ? ((size_t)(pl.wave_pairs * pl.chunk_at[pl.n_chunks]) * sizeof(float) + 63) /
                           64 * 64
                     : 0;
        fixed = delta_bytes + part_bytes;
        pl.per_worker = layout(&pl, NULL, &unused);
        bytes = fixed + (size_t)workers * pl.per_worker;
        mem = bytes < fixed ? NULL : sdpa__alloc(ctx, bytes, 64);
        if (mem != NULL || (!pl.wide && !pl.fused))
            break;
        if (pl.wide)
            sdpa__bwd_plan_wide(&pl, workers, -1);
        else
            pl.fused = 0;
    }
    if (mem == NULL)
        return sdpa__fail(ctx, SDPA_ERR_NOMEM, "flash backward: no memory for %zu bytes", bytes);
    pl.delta = (float *)mem;
    pl.part = (float *)(mem + delta_bytes);
    pl.scratch = mem + fixed;

    sdpa__parallel_for(ctx, p->B * p->Hq, delta_task, &pl);
    if (pl.fused) {
        for (pl.wave0 = 0; pl.wave0 < pairs; pl.wave0 += pl.wave_pairs) {
            const int64_t n = pairs - pl.wave0 < pl.wave_pairs ? pairs - pl.wave0 : pl.wave_pairs;
            sdpa__parallel_for(ctx, n * pl.n_chunks, chunk_task, &pl);
            sdpa__parallel_for(ctx, n * p->group * pl.n_qb, sum_task, &pl);
        }
    } else {
        sdpa__parallel_for(ctx, pl.n_a + p->B * p->Hq * pl.n_qb, two_kind_task, &pl);
    }
    sdpa__free(ctx, mem);
    return SDPA_OK;
}

sdpa_status sdpa__flash_backward(const sdpa__impl *self, sdpa_ctx *ctx, const sdpa__problem *p,
                                 const sdpa_tensor *out, const sdpa_tensor *lse,
                                 const sdpa_tensor *dout, sdpa_tensor *dq, sdpa_tensor *dk,
                                 sdpa_tensor *dv) {
    const sdpa__bwd_tuning tuning = {DQ_BUDGET, 0, 0, 0, 1};
    return sdpa__flash_backward_tuned(self, ctx, p, out, lse, dout, dq, dk, dv, &tuning);
}
