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
 * Nothing of size Lq x Lk is kept: P and dS are recomputed tile by tile, in two kinds of task
 * that never write the same element, so that no sum needs an atomic or a lock:
 *   A. one per (b, kv head hk, block of KEY_BLOCK keys): owns those rows of dK and dV. For each
 *      query head of hk's group in order, and each block of QUERY_BLOCK queries that sees some
 *      of its keys in order, it forms S and P row-major (one key per SIMD lane: qk with query
 *      rows where it takes keys, and the keys packed where it takes Q^T), then dV += P^T dO
 *      and dK += dS^T Q with pv summing over the query rows. Stored once, at the end.
 *   B. one per (b, query head h, block of QUERY_BLOCK queries): owns those rows of dQ. For each
 *      block of keys the rows see, in order, it forms S, P and dP transposed as the forward
 *      does (one query row per lane), and dQ += dS K with pv. Stored once, at the end.
 * A task's sums run in an order fixed by the problem and the table alone, never by the thread
 * that runs it or by the thread count: the results are bitwise the same for any n_threads.
 * Both kinds are run in one parallel loop (they read the same inputs and Delta, and write
 * disjoint outputs), so neither waits for the slowest task of the other. Extra memory: Delta
 * (B Hq Lq floats) and one scratch region per worker of O(block x (Dk + Dv + block)) floats.
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
 * - Every element of dq, dk and dv is written exactly once (keys no query sees get 0), rounded
 *   once by the table's store_row. All scratch is reserved before anything is written, so the
 *   only failure, SDPA_ERR_NOMEM, leaves the outputs untouched.
 */
#include "flash.h"

#include "../core/philox.h"
#include "../core/services.h"
#include "tile.h"

#include <math.h>
#include <string.h>

/* Keys per task of kind A and per tile of kind B; query rows per tile of kind A and per task of
 * kind B. Tiles are BLOCK x BLOCK: every scratch tile has BLOCK rows of BLOCK floats (a
 * multiple of every table's lanes), and both block sizes must stay <= BLOCK. */
enum { BLOCK = 64, KEY_BLOCK = BLOCK, QUERY_BLOCK = BLOCK };

typedef struct bwd_plan {
    const sdpa__problem *p;
    const sdpa__ukernels *uk;
    const sdpa_tensor *out, *lse, *dout;
    sdpa_tensor *dq, *dk, *dv;
    float *delta;       /* (B, Hq, Lq): Delta_i */
    int64_t n_kb, n_qb; /* key blocks, query blocks */
    int64_t n_a;        /* tasks of kind A; those of kind B follow */
    int64_t dkp, dvp;   /* row strides of the dK/dQ and dV accumulators */
    int q_direct;       /* Q is f32 with unit feature stride: its rows are read in place */
    int k_direct;       /* likewise K */
    int v_direct;       /* likewise V */
    int do_direct;      /* likewise dout */
    int needs_post;     /* softcap, ALiBi or a mask: every tile is post-processed */
    int dropout;        /* the problem drops weights */
    float keep_scale;   /* 1 / (1 - p) */
    uint64_t threshold; /* keep iff draw < threshold */
    uint32_t key[2];    /* the Philox key of (seed, offset) */
    size_t per_worker;  /* bytes of scratch per worker */
    char *scratch;
} bwd_plan;

/* One worker's scratch. Kind A and kind B use the same regions for their own purposes. */
typedef struct bwd_scratch {
    float *pk;     /* A: K^T packed (Dk x BLOCK); B: Q^T */
    float *pv;     /* A: V^T packed (Dv x BLOCK); B: dO^T */
    float *krows;  /* K rows widened (BLOCK x Dk), when K is not read in place */
    float *vrows;  /* likewise V (BLOCK x Dv) */
    float *qrows;  /* likewise Q */
    float *dorows; /* likewise dO */
    float *acc_k;  /* A: dK of the task's keys (BLOCK x dkp); B: dQ of its rows */
    float *acc_v;  /* A: dV (BLOCK x dvp) */
    float *s;      /* scores, then the weights P (BLOCK x BLOCK) */
    float *dp;     /* dP, then dS */
    float *pt;     /* with dropout: z P */
    float *z;      /* with dropout: z */
    float *dsdx;   /* with softcap: ds/dx */
    float *u;      /* per lane: the LSE to subtract */
    float *dl;     /* per lane: Delta */
    float *ones;   /* pv's alpha: 1 */
    float *orow;   /* Delta's pass: a row of O and one of dO, widened */
    float *dorow;
    const float **rowp; /* the rows pack_q reads */
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
                 tile = BLOCK * BLOCK * f;
    size_t at = 0;
    ws->pk = take(base, &at, dk * BLOCK * f);
    ws->pv = take(base, &at, dv * BLOCK * f);
    ws->krows = take(base, &at, pl->k_direct ? 0 : BLOCK * dk * f);
    ws->vrows = take(base, &at, pl->v_direct ? 0 : BLOCK * dv * f);
    ws->qrows = take(base, &at, pl->q_direct ? 0 : BLOCK * dk * f);
    ws->dorows = take(base, &at, pl->do_direct ? 0 : BLOCK * dv * f);
    ws->acc_k = take(base, &at, BLOCK * (size_t)pl->dkp * f);
    ws->acc_v = take(base, &at, BLOCK * (size_t)pl->dvp * f);
    ws->s = take(base, &at, tile);
    ws->dp = take(base, &at, tile);
    ws->pt = take(base, &at, pl->dropout ? tile : 0);
    ws->z = take(base, &at, pl->dropout ? tile : 0);
    ws->dsdx = take(base, &at, p->softcap > 0.0 ? tile : 0);
    ws->u = take(base, &at, BLOCK * f);
    ws->dl = take(base, &at, BLOCK * f);
    ws->ones = take(base, &at, BLOCK * f);
    ws->orow = take(base, &at, dv * f);
    ws->dorow = take(base, &at, dv * f);
    ws->rowp = take(base, &at, BLOCK * sizeof(const float *));
    return at;
}

static bwd_scratch scratch_of(const bwd_plan *pl, int worker) {
    bwd_scratch ws;
    layout(pl, pl->scratch + (size_t)worker * pl->per_worker, &ws);
    for (int n = 0; n < BLOCK; n++)
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

static float lse_at(const bwd_plan *pl, int64_t b, int64_t h, int64_t i) {
    return ((const float *)pl->lse->data)[sdpa__offset(pl->lse, b, h, i, 0)];
}

/* The rules of the scores of a tile, s[r * rs + jj * js] for rows r < nr (query positions
 * i0 + r of head h) and keys ja + jj, jj < nk, holding the scaled products: keys outside a
 * row's window hidden (-inf) unless the whole tile is visible, then softcap, ALiBi and the mask
 * (and ds/dx into dsdx, laid out like s, with softcap). A row whose LSE is -inf (fully masked
 * in the forward) is hidden whole: it takes no part in anything. */
static void tile_rules(const bwd_plan *pl, int64_t b, int64_t h, int64_t i0, int64_t nr, int64_t ja,
                       int64_t nk, int whole, float *s, int64_t rs, int64_t js, float *dsdx) {
    const sdpa__problem *p = pl->p;
    for (int64_t r = 0; r < nr; r++) {
        const int64_t i = i0 + r;
        float *s_r = s + r * rs;
        if (lse_at(pl, b, h, i) == -INFINITY) {
            for (int64_t jj = 0; jj < nk; jj++)
                s_r[jj * js] = -INFINITY;
            if (dsdx != NULL) /* read by ds_run, whose result is -0.0 there whatever it is */
                for (int64_t jj = 0; jj < nk; jj++)
                    dsdx[r * rs + jj * js] = 0.0f;
            continue;
        }
        int64_t a = 0, z = nk; /* the keys [a, z) of the tile that the window lets row i see */
        if (!whole) {
            int64_t lo, hi;
            sdpa__row_keys(p, i, &lo, &hi);
            a = lo - ja < 0 ? 0 : lo - ja > nk ? nk : lo - ja;
            z = hi + 1 - ja < a ? a : hi + 1 - ja > nk ? nk : hi + 1 - ja;
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
        if (pl->needs_post)
            for (int64_t jj = a; jj < z; jj++)
                s_r[jj * js] = sdpa__tile_score(p, b, h, i, ja + jj, s_r[jj * js],
                                                dsdx != NULL ? &dsdx[r * rs + jj * js] : NULL);
    }
}

/* Dropout's factors z of the same tile (z[r * rs + jj * js]), from the global indices
 * (b, h, i0 + r, ja + jj), four keys per Philox call. */
static void tile_dropout(const bwd_plan *pl, int64_t b, int64_t h, int64_t i0, int64_t nr,
                         int64_t ja, int64_t nk, float *z, int64_t rs, int64_t js) {
    for (int64_t r = 0; r < nr; r++)
        for (int64_t jj = 0; jj < nk;) {
            const int64_t j = ja + jj;
            uint32_t draw[4];
            sdpa__dropout_draws4(pl->key, b, h, i0 + r, j / 4, draw);
            for (int64_t t = j % 4; t < 4 && jj < nk; t++, jj++)
                z[r * rs + jj * js] = (uint64_t)draw[t] < pl->threshold ? pl->keep_scale : 0.0f;
        }
}

/* Whether w is -0.0, the mark of a hidden weight. */
static inline uint32_t hidden_mask(float w) {
    uint32_t u;
    memcpy(&u, &w, sizeof u);
    return u == 0x80000000u ? 0xffffffffu : 0u;
}

/* dS over n entries that lie contiguously in memory: dp[c] (dP~ = dO . v) becomes
 * w[c] (z[c] dp[c] - delta[c]) dsdx[c] (z and dsdx NULL when absent), and -0.0 where w[c] is
 * (a hidden pair: dp may be NaN from a hidden key's V, and must not get through). */
static void ds_run(int64_t n, const float *restrict w, float *restrict dp, const float *restrict z,
                   const float *restrict dsdx, const float *restrict delta) {
    if (z != NULL)
        for (int64_t c = 0; c < n; c++)
            dp[c] *= z[c];
    if (dsdx != NULL)
        for (int64_t c = 0; c < n; c++)
            dp[c] = w[c] * (dp[c] - delta[c]) * dsdx[c];
    else
        for (int64_t c = 0; c < n; c++)
            dp[c] = w[c] * (dp[c] - delta[c]);
    for (int64_t c = 0; c < n; c++) {
        const uint32_t h = hidden_mask(w[c]);
        uint32_t x;
        memcpy(&x, &dp[c], sizeof x);
        x = (x & ~h) | (0x80000000u & h);
        memcpy(&dp[c], &x, sizeof x);
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
            if (hidden_mask(wr))
                continue;
            for (int64_t c = 0; c < d; c++)
                o[a * ldo + c] += wr * x[r * ldx + c];
        }
}

/* After pv_careful, which adds nothing for any zero weight: a weight dS that is 0 (either
 * sign) on a pair the row sees (its P, in the same layout as dS, is not the -0.0 of a hidden
 * pair) still multiplies its operand in the reference, where 0 x Inf and 0 x NaN are NaN
 * (softcap's derivative is 0 at a score of +-inf, which an Inf in q or k gives): that NaN is
 * put where it goes. pv's layout: o[r * ldo + c] gets w[j * ldw + r] x[j * ldx + c]. */
static void nan_of_visible_zeros(int64_t nj, int64_t nr, int64_t d, const float *w,
                                 const float *prob, int64_t ldw, const float *x, int64_t ldx,
                                 float *o, int64_t ldo) {
    for (int64_t j = 0; j < nj; j++)
        for (int64_t r = 0; r < nr; r++) {
            if (w[j * ldw + r] != 0.0f || hidden_mask(prob[j * ldw + r]))
                continue;
            for (int64_t c = 0; c < d; c++)
                if (!isfinite(x[j * ldx + c]))
                    o[r * ldo + c] = NAN;
        }
}

/* Kind A, one tile: query rows i0 .. i0 + nq - 1 of head h against the task's keys j0 ..
 * j0 + nk - 1 (packed in ws->pk and ws->pv), into ws->acc_k and ws->acc_v. Row-major tiles:
 * entry (r, jj) at r * BLOCK + jj. */
static void tile_a(const bwd_plan *pl, bwd_scratch *ws, int64_t b, int64_t h, int64_t i0,
                   int64_t nq, int64_t j0, int64_t nk) {
    const sdpa__problem *p = pl->p;
    const sdpa__ukernels *uk = pl->uk;
    const int64_t kpad = sdpa__round_up(nk, uk->lanes);
    float *dsdx = p->softcap > 0.0 ? ws->dsdx : NULL;
    int64_t ldq, lddo;
    const float *q = rows_of(uk, &p->q, pl->q_direct, b, h, i0, nq, p->Dk, ws->qrows, &ldq, NULL);
    const float *dO =
        rows_of(uk, pl->dout, pl->do_direct, b, h, i0, nq, p->Dv, ws->dorows, &lddo, NULL);

    // S: s[r][jj] = scale q_r . k_jj, then the rules
    uk->qk(nq, kpad, p->Dk, q, ldq, ws->pk, BLOCK, (float)p->scale, ws->s, BLOCK);
    const int whole = sdpa__block_whole(p, i0, i0 + nq, j0, j0 + nk);
    tile_rules(pl, b, h, i0, nq, j0, nk, whole, ws->s, BLOCK, 1, dsdx);

    // P = exp(S - LSE), a row at a time (the LSE is the row's, the lanes are keys)
    int hidden = 0;
    for (int64_t r = 0; r < nq; r++) {
        const float lse = lse_at(pl, b, h, i0 + r);
        for (int64_t jj = 0; jj < kpad; jj++)
            ws->u[jj] = lse;
        hidden |= uk->exp_lse(1, kpad, ws->s + r * BLOCK, BLOCK, ws->u);
    }

    // dV += (z P)^T dO
    const float *w = ws->s;
    if (pl->dropout) {
        tile_dropout(pl, b, h, i0, nq, j0, nk, ws->z, BLOCK, 1);
        for (int64_t r = 0; r < nq; r++)
            for (int64_t jj = 0; jj < nk; jj++)
                ws->pt[r * BLOCK + jj] = ws->z[r * BLOCK + jj] * ws->s[r * BLOCK + jj];
        w = ws->pt;
    }
    if (hidden && sdpa__has_nonfinite(dO, nq, lddo, p->Dv))
        pv_skip_hidden(nq, nk, p->Dv, w, BLOCK, dO, lddo, ws->acc_v, pl->dvp);
    else
        uk->pv(nq, nk, p->Dv, w, BLOCK, ws->ones, dO, lddo, ws->acc_v, pl->dvp);

    // dP~[r][jj] = dO_r . v_jj; dS
    uk->qk(nq, kpad, p->Dv, dO, lddo, ws->pv, BLOCK, 1.0f, ws->dp, BLOCK);
    for (int64_t r = 0; r < nq; r++) {
        const float d = pl->delta[((b * p->Hq) + h) * p->Lq + i0 + r];
        for (int64_t jj = 0; jj < nk; jj++)
            ws->dl[jj] = d;
        const int64_t at = r * BLOCK;
        ds_run(nk, ws->s + at, ws->dp + at, pl->dropout ? ws->z + at : NULL,
               dsdx != NULL ? dsdx + at : NULL, ws->dl);
    }

    // dK += dS^T Q (scaled when stored)
    if (hidden && sdpa__has_nonfinite(q, nq, ldq, p->Dk)) {
        uk->pv_careful(nq, nk, p->Dk, ws->dp, BLOCK, ws->ones, q, ldq, ws->acc_k, pl->dkp);
        nan_of_visible_zeros(nq, nk, p->Dk, ws->dp, ws->s, BLOCK, q, ldq, ws->acc_k, pl->dkp);
    } else
        uk->pv(nq, nk, p->Dk, ws->dp, BLOCK, ws->ones, q, ldq, ws->acc_k, pl->dkp);
}

static void task_a(const bwd_plan *pl, int64_t task, int worker) {
    const sdpa__problem *p = pl->p;
    const sdpa__ukernels *uk = pl->uk;
    const int64_t bh = task / pl->n_kb, kb = task % pl->n_kb;
    const int64_t b = bh / p->Hkv, hk = bh % p->Hkv;
    const int64_t j0 = kb * KEY_BLOCK, nk = j0 + KEY_BLOCK <= p->Lk ? KEY_BLOCK : p->Lk - j0;
    bwd_scratch ws = scratch_of(pl, worker);
    memset(ws.acc_k, 0, (size_t)(nk * pl->dkp) * sizeof(float));
    memset(ws.acc_v, 0, (size_t)(nk * pl->dvp) * sizeof(float));

    /* the queries that may see some key of the block, in the fixed grid of query blocks */
    int64_t first, last;
    sdpa__block_queries(p, j0, j0 + nk, 0, p->Lq, &first, &last);
    if (first < last) {
        int64_t ld;
        rows_of(uk, &p->k, pl->k_direct, b, hk, j0, nk, p->Dk, ws.krows, &ld, ws.rowp);
        uk->pack_q(nk, p->Dk, ws.rowp, ws.pk, BLOCK);
        rows_of(uk, &p->v, pl->v_direct, b, hk, j0, nk, p->Dv, ws.vrows, &ld, ws.rowp);
        uk->pack_q(nk, p->Dv, ws.rowp, ws.pv, BLOCK);
        for (int64_t h = hk * p->group; h < (hk + 1) * p->group; h++)
            for (int64_t qb = first / QUERY_BLOCK; qb * QUERY_BLOCK < last; qb++) {
                const int64_t i0 = qb * QUERY_BLOCK > first ? qb * QUERY_BLOCK : first;
                const int64_t i1 = (qb + 1) * QUERY_BLOCK < last ? (qb + 1) * QUERY_BLOCK : last;
                tile_a(pl, &ws, b, h, i0, i1 - i0, j0, nk);
            }
    }

    /* stored once: dK scaled, dV as it is; keys no query sees get their 0 */
    for (int64_t jj = 0; jj < nk; jj++) {
        uk->store_row((int)pl->dk->dtype, p->Dk, ws.acc_k + jj * pl->dkp, (float)p->scale,
                      (void *)sdpa__row_at(pl->dk, b, hk, j0 + jj), pl->dk->stride[3]);
        uk->store_row((int)pl->dv->dtype, p->Dv, ws.acc_v + jj * pl->dvp, 1.0f,
                      (void *)sdpa__row_at(pl->dv, b, hk, j0 + jj), pl->dv->stride[3]);
    }
}

/* Kind B, one tile: the task's query rows (Q^T in ws->pk, dO^T in ws->pv, their LSE and Delta
 * in ws->u and ws->dl) against keys ja .. ja + nk - 1 of kv head hk, into ws->acc_k.
 * Transposed tiles: entry (jj, r) at jj * BLOCK + r, rows padded to rpad lanes. */
static void tile_b(const bwd_plan *pl, bwd_scratch *ws, int64_t b, int64_t h, int64_t i0,
                   int64_t nq, int64_t ja, int64_t nk) {
    const sdpa__problem *p = pl->p;
    const sdpa__ukernels *uk = pl->uk;
    const int64_t hk = h / p->group, rpad = sdpa__round_up(nq, uk->lanes);
    float *dsdx = p->softcap > 0.0 ? ws->dsdx : NULL;
    int64_t ldk, ldv;
    const float *k = rows_of(uk, &p->k, pl->k_direct, b, hk, ja, nk, p->Dk, ws->krows, &ldk, NULL);
    const float *v = rows_of(uk, &p->v, pl->v_direct, b, hk, ja, nk, p->Dv, ws->vrows, &ldv, NULL);

    // S: s[jj][r] = scale k_jj . q_r, then the rules (padding rows are left as they are)
    uk->qk(nk, rpad, p->Dk, k, ldk, ws->pk, BLOCK, (float)p->scale, ws->s, BLOCK);
    const int whole = sdpa__block_whole(p, i0, i0 + nq, ja, ja + nk);
    tile_rules(pl, b, h, i0, nq, ja, nk, whole, ws->s, 1, BLOCK, dsdx);

    // P = exp(S - LSE), the rows along the lanes
    const int hidden = uk->exp_lse(nk, rpad, ws->s, BLOCK, ws->u);
    if (pl->dropout)
        tile_dropout(pl, b, h, i0, nq, ja, nk, ws->z, 1, BLOCK);

    // dP~[jj][r] = v_jj . dO_r; dS
    uk->qk(nk, rpad, p->Dv, v, ldv, ws->pv, BLOCK, 1.0f, ws->dp, BLOCK);
    for (int64_t jj = 0; jj < nk; jj++) {
        const int64_t at = jj * BLOCK;
        ds_run(nq, ws->s + at, ws->dp + at, pl->dropout ? ws->z + at : NULL,
               dsdx != NULL ? dsdx + at : NULL, ws->dl);
    }

    // dQ += dS K (scaled when stored)
    if (hidden && sdpa__has_nonfinite(k, nk, ldk, p->Dk)) {
        uk->pv_careful(nk, nq, p->Dk, ws->dp, BLOCK, ws->ones, k, ldk, ws->acc_k, pl->dkp);
        nan_of_visible_zeros(nk, nq, p->Dk, ws->dp, ws->s, BLOCK, k, ldk, ws->acc_k, pl->dkp);
    } else
        uk->pv(nk, nq, p->Dk, ws->dp, BLOCK, ws->ones, k, ldk, ws->acc_k, pl->dkp);
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
    for (int64_t r = 0; r < BLOCK; r++) {
        ws.u[r] = r < nq ? lse_at(pl, b, h, i0 + r) : 0.0f;
        ws.dl[r] = r < nq ? pl->delta[((b * p->Hq) + h) * p->Lq + i0 + r] : 0.0f;
    }
    int64_t ld;
    rows_of(uk, &p->q, pl->q_direct, b, h, i0, nq, p->Dk, ws.qrows, &ld, ws.rowp);
    uk->pack_q(nq, p->Dk, ws.rowp, ws.pk, BLOCK);
    rows_of(uk, pl->dout, pl->do_direct, b, h, i0, nq, p->Dv, ws.dorows, &ld, ws.rowp);
    uk->pack_q(nq, p->Dv, ws.rowp, ws.pv, BLOCK);

    int64_t jlo, jhi;
    sdpa__block_keys(p, i0, i0 + nq, &jlo, &jhi);
    for (int64_t j0 = jlo / KEY_BLOCK * KEY_BLOCK; j0 < jhi; j0 += KEY_BLOCK) {
        const int64_t ja = j0 > jlo ? j0 : jlo, jb = j0 + KEY_BLOCK < jhi ? j0 + KEY_BLOCK : jhi;
        tile_b(pl, &ws, b, h, i0, nq, ja, jb - ja);
    }

    for (int64_t r = 0; r < nq; r++)
        uk->store_row((int)pl->dq->dtype, p->Dk, ws.acc_k + r * pl->dkp, (float)p->scale,
                      (void *)sdpa__row_at(pl->dq, b, h, i0 + r), pl->dq->stride[3]);
}

static void bwd_task(void *arg, int64_t task, int worker) {
    const bwd_plan *pl = arg;
    if (task < pl->n_a)
        task_a(pl, task, worker);
    else
        task_b(pl, task - pl->n_a, worker);
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

sdpa_status sdpa__flash_backward(const sdpa__impl *self, sdpa_ctx *ctx, const sdpa__problem *p,
                                 const sdpa_tensor *out, const sdpa_tensor *lse,
                                 const sdpa_tensor *dout, sdpa_tensor *dq, sdpa_tensor *dk,
                                 sdpa_tensor *dv) {
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
    bwd_scratch unused;
    pl.per_worker = layout(&pl, NULL, &unused);
    const int workers = sdpa__n_workers(ctx);

    /* Delta's B Hq Lq floats first, then the workers' regions: all reserved before anything
     * is written. B Hq Lq Dk elements of dq exist (an output never overlaps itself), so the
     * product fits; the sum is checked anyway, a failure being reported as what it is. */
    const uint64_t rows = (uint64_t)p->B * (uint64_t)p->Hq * (uint64_t)p->Lq;
    const size_t delta_bytes = (size_t)sdpa__round_up((int64_t)(rows * sizeof(float)), 64);
    const size_t bytes = delta_bytes + (size_t)workers * pl.per_worker;
    char *mem = bytes < delta_bytes ? NULL : sdpa__alloc(ctx, bytes, 64);
    if (mem == NULL)
        return sdpa__fail(ctx, SDPA_ERR_NOMEM, "flash backward: no memory for %zu bytes", bytes);
    pl.delta = (float *)mem;
    pl.scratch = mem + delta_bytes;

    sdpa__parallel_for(ctx, p->B * p->Hq, delta_task, &pl);
    sdpa__parallel_for(ctx, pl.n_a + p->B * p->Hq * pl.n_qb, bwd_task, &pl);
    sdpa__free(ctx, mem);
    return SDPA_OK;
}
