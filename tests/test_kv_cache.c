/*
 * test_kv_cache.c — sdpa_forward_kv (ragged and paged KV caches, sdpa.h "KV caches"), issue 13
 * items 3 and 5; its bad inputs are test_kv_bad.c's, attention sinks test_sinks.c's.
 *
 *   - Paged and ragged caches against the reference by testing.md's rule. A plain cache is
 *     built, then scattered into a pool of pages through a shuffled block table (unused entries
 *     -1, unused pages and rows past every length NaN, so that a read of them shows); the
 *     golden is the reference (tu_golden_forward) run per sequence on views of the plain cache
 *     of seqlens_q[b] queries and seqlens_k[b] keys, checked itself against the naive double
 *     implementation; the baseline is the naive one in f32. Batches of mixed lengths (0 keys,
 *     1, page boundaries +-1, around the split-KV chunks of 512), page sizes 16, 64 and 256,
 *     GQA ratios 1, 4 and 8, f32, f16 and bf16 caches under f32 queries, chunked prefill
 *     (seqlens_q < Lq: rows past it exactly 0 with LSE -inf, or the sink), causal bottom-right
 *     and top-left per sequence, windows, ALiBi, softcap, additive and bool masks indexed by
 *     the sequence's own positions, sinks; the plain layout with seqlens too. Every ISA level
 *     the CPU has; sdpa_forward per sequence on the plain slices passes the same rule.
 *   - Determinism: bitwise the same for n_threads 1, 2, 3 and 7 on a paged batch.
 */
#include "check.h"
#include "testutil.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- small helpers ------------------------------------------------------------------------ */

/* A view of t moved to batch b (unless t broadcasts it), with extent 1 there. */
static sdpa_tensor batch_view(const sdpa_tensor *t, int64_t b) {
    sdpa_tensor v = *t;
    if (t->shape[0] != 1)
        v.data = (char *)t->data + b * t->stride[0] * (int64_t)sdpa_dtype_size(t->dtype);
    v.shape[0] = 1;
    return v;
}

/* Joins sink sigma to a row (out[dv], lse) computed without it, in double: the algebra of
 * sdpa.h's Semantics, O' = O exp(lse - lse'), lse' = log(exp(lse) + exp(sigma)); the values
 * are rounded to lp (-1: kept). A row with no key gets lse' = sigma and stays 0. */
static void join_sink(double sigma, double *out, int64_t dv, double *lse, int lp) {
    if (sigma == -INFINITY || isnan(*lse))
        return;
    if (*lse == -INFINITY) {
        *lse = sigma;
        return;
    }
    const double top = fmax(*lse, sigma);
    const double a = exp(*lse - top), sum = a + exp(sigma - top);
    for (int64_t d = 0; d < dv; d++)
        out[d] = tu_round(lp, out[d] * (a / sum));
    *lse = tu_acc_round(lp, top + log(sum));
}

/* The registered fast implementations; levels the CPU lacks are reported once by main. */
static tu_impl g_impls[TU_MAX_IMPLS];
static int g_n_impls;

/* ======================================================================================== */
/* 1. Paged and ragged caches against the reference                                          */
/* ======================================================================================== */

enum { MAXB = 16 };
enum { MASK_NONE, MASK_ADD, MASK_BOOL_BCAST };

typedef struct kv_case {
    const char *what;
    int64_t B, Hq, Hkv, Lq, Dk, Dv;
    int64_t page;      /* 0: the plain layout (no block table) */
    int64_t cap;       /* keys a sequence may hold: Lk (plain) or max_pages x page (paged) */
    int blhd;          /* the cache (plain tensor or pool) in (B, L, H, D) order */
    sdpa_dtype kv_dt;  /* K and V; q and out are f32 */
    int32_t sk[MAXB];  /* seqlens_k */
    int32_t sq[MAXB];  /* seqlens_q */
    int no_sk, no_sq;  /* pass NULL instead (every sequence full) */
    int causal, align; /* align: SDPA_ALIGN_* */
    int64_t window_left, window_right; /* used when use_window */
    int use_window;
    float softcap;
    int mask, alibi, sinks;
    uint64_t seed;
} kv_case;

/* The tensors of a case: q, the plain cache (rows past a sequence's length NaN), the paged
 * cache built from it, the mask, slopes, sinks and the descriptor. */
typedef struct kv_bufs {
    tu_tensor q, k, v;      /* q (B, Hq, Lq, Dk); k, v the plain cache (B, Hkv, cap, D) */
    tu_tensor kpool, vpool; /* paged: (n_pages, Hkv, page, D) */
    int32_t *table;         /* paged: B x max_pages */
    int64_t n_pages, max_pages;
    tu_tensor mask, o, lse; /* o (B, Hq, Lq, Dv) and lse (B, Hq, Lq, 1), f32 */
    float slopes[64], sinks[64];
    sdpa_params p;
    sdpa_kv_cache cache;
    int64_t sk[MAXB], sq[MAXB]; /* the lengths in effect */
} kv_bufs;

static void kv_build(const kv_case *c, kv_bufs *t) {
    memset(t, 0, sizeof *t);
    tu_rng r = {c->seed};
    const tu_layout ly = c->blhd ? TU_BLHD : TU_BHLD;
    const int64_t cap = c->cap;
    for (int64_t b = 0; b < c->B; b++) {
        t->sk[b] = c->no_sk ? cap : c->sk[b];
        t->sq[b] = c->no_sq ? c->Lq : c->sq[b];
    }
    /* q: rows past seqlens_q NaN (never read) */
    t->q = tu_alloc(SDPA_F32, c->B, c->Hq, c->Lq, c->Dk, TU_BHLD, 0, 0);
    memset(t->q.buf, 0xFF, t->q.bytes);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->Hq; h++)
            for (int64_t i = 0; i < t->sq[b]; i++)
                for (int64_t d = 0; d < c->Dk; d++)
                    tu_set(&t->q.t, b, h, i, d, tu_randn(&r));
    /* the plain cache: rows past seqlens_k NaN (never read) */
    t->k = tu_alloc(c->kv_dt, c->B, c->Hkv, cap, c->Dk, ly, 0, 0);
    t->v = tu_alloc(c->kv_dt, c->B, c->Hkv, cap, c->Dv, ly, 0, 0);
    memset(t->k.buf, 0xFF, t->k.bytes);
    memset(t->v.buf, 0xFF, t->v.bytes);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->Hkv; h++)
            for (int64_t j = 0; j < t->sk[b]; j++) {
                for (int64_t d = 0; d < c->Dk; d++)
                    tu_set(&t->k.t, b, h, j, d, tu_randn(&r));
                for (int64_t d = 0; d < c->Dv; d++)
                    tu_set(&t->v.t, b, h, j, d, tu_randn(&r));
            }
    t->cache.k = &t->k.t;
    t->cache.v = &t->v.t;
    if (c->page > 0) {
        /* the pool: the pages a sequence's length uses, three spare ones, in shuffled order */
        t->max_pages = cap / c->page;
        int64_t used = 0;
        for (int64_t b = 0; b < c->B; b++)
            used += (t->sk[b] + c->page - 1) / c->page;
        t->n_pages = used + 3;
        int32_t *perm = tu_xmalloc((size_t)t->n_pages * sizeof *perm);
        for (int64_t n = 0; n < t->n_pages; n++)
            perm[n] = (int32_t)n;
        for (int64_t n = t->n_pages - 1; n > 0; n--) {
            const int64_t m = (int64_t)(tu_next(&r) % (uint64_t)(n + 1));
            const int32_t x = perm[n];
            perm[n] = perm[m];
            perm[m] = x;
        }
        t->table = tu_xmalloc((size_t)(c->B * t->max_pages) * sizeof *t->table);
        t->kpool = tu_alloc(c->kv_dt, t->n_pages, c->Hkv, c->page, c->Dk, ly, 0, 0);
        t->vpool = tu_alloc(c->kv_dt, t->n_pages, c->Hkv, c->page, c->Dv, ly, 0, 0);
        memset(t->kpool.buf, 0xFF, t->kpool.bytes);
        memset(t->vpool.buf, 0xFF, t->vpool.bytes);
        int64_t next = 0;
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t e = 0; e < t->max_pages; e++) {
                int32_t *entry = &t->table[b * t->max_pages + e];
                *entry = -1;
                if (e * c->page >= t->sk[b])
                    continue;
                *entry = perm[next++];
                for (int64_t h = 0; h < c->Hkv; h++)
                    for (int64_t j = e * c->page; j < t->sk[b] && j < (e + 1) * c->page; j++) {
                        for (int64_t d = 0; d < c->Dk; d++)
                            tu_set(&t->kpool.t, *entry, h, j - e * c->page, d,
                                   tu_get(&t->k.t, b, h, j, d));
                        for (int64_t d = 0; d < c->Dv; d++)
                            tu_set(&t->vpool.t, *entry, h, j - e * c->page, d,
                                   tu_get(&t->v.t, b, h, j, d));
                    }
            }
        free(perm);
        t->cache.k = &t->kpool.t;
        t->cache.v = &t->vpool.t;
        t->cache.block_table = t->table;
        t->cache.max_pages = t->max_pages;
    }
    t->o = tu_alloc(SDPA_F32, c->B, c->Hq, c->Lq, c->Dv, TU_BHLD, 0, 0);
    t->lse = tu_alloc(SDPA_F32, c->B, c->Hq, c->Lq, 1, TU_BHLD, 0, 0);

    t->p.causal = c->causal;
    t->p.align = (sdpa_align)c->align;
    t->p.use_window = c->use_window;
    t->p.window_left = c->window_left;
    t->p.window_right = c->window_right;
    t->p.softcap = c->softcap;
    if (c->mask == MASK_ADD) {
        /* (B, Hq, Lq, cap): biases and -inf holes where a sequence has the query and the key,
         * NaN where it has not (never read) */
        t->mask = tu_alloc(SDPA_F32, c->B, c->Hq, c->Lq, cap, TU_BHLD, 0, 0);
        memset(t->mask.buf, 0xFF, t->mask.bytes);
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t h = 0; h < c->Hq; h++)
                for (int64_t i = 0; i < t->sq[b]; i++)
                    for (int64_t j = 0; j < t->sk[b]; j++)
                        tu_set(&t->mask.t, b, h, i, j,
                               tu_uniform(&r) < 0.2 ? -INFINITY : 0.5 * tu_randn(&r));
        t->p.mask = &t->mask.t;
    } else if (c->mask == MASK_BOOL_BCAST) {
        /* (B, 1, Lq, cap), broadcast over the heads */
        t->mask = tu_alloc(SDPA_BOOL, c->B, 1, c->Lq, cap, TU_BHLD, 0, 0);
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t i = 0; i < c->Lq; i++)
                for (int64_t j = 0; j < cap; j++)
                    tu_set(&t->mask.t, b, 0, i, j, tu_uniform(&r) >= 0.25);
        t->p.mask = &t->mask.t;
    }
    if (c->alibi) {
        for (int64_t h = 0; h < c->Hq && h < 64; h++)
            t->slopes[h] = (float)pow(2.0, -8.0 * (double)(h + 1) / (double)c->Hq);
        t->p.alibi_slopes = t->slopes;
    }
    if (c->sinks) {
        for (int64_t h = 0; h < c->Hq && h < 64; h++)
            t->sinks[h] = h % 3 == 1 ? -INFINITY : (float)(2.0 * tu_uniform(&r) - 0.5);
        t->p.sinks = t->sinks;
    }
}

static void kv_free(kv_bufs *t) {
    tu_tensor *all[] = {&t->q, &t->k, &t->v, &t->kpool, &t->vpool, &t->mask, &t->o, &t->lse};
    for (size_t n = 0; n < sizeof all / sizeof all[0]; n++)
        tu_free(all[n]);
    free(t->table);
}

/* The descriptor of a case, with its lengths in int32 arrays the caller owns. */
static sdpa_kv_cache kv_desc(const kv_case *c, const kv_bufs *t, int32_t *sk, int32_t *sq) {
    sdpa_kv_cache kc = t->cache;
    for (int64_t b = 0; b < c->B; b++) {
        sk[b] = (int32_t)t->sk[b];
        sq[b] = (int32_t)t->sq[b];
    }
    kc.seqlens_k = c->no_sk ? NULL : sk;
    kc.seqlens_q = c->no_sq ? NULL : sq;
    return kc;
}

/* The per-sequence oracles of a case, (B, Hq, Lq, Dv) and (B, Hq, Lq) doubles: the golden (the
 * reference on sequence b's views), the naive double result and the naive f32 baseline (both
 * with the sink joined afterwards), and whether a row sees no key (naive LSE -inf before the
 * sink, or a query or key count of 0). */
typedef struct kv_oracle {
    double *g_o, *g_l, *n_o, *n_l, *lp_o, *lp_l;
    unsigned char *empty;
} kv_oracle;

/* Sequence b's problem as plain tensors: q (1, Hq, sq, Dk), k and v (1, Hkv, sk, D), and params
 * with the mask cut to (.., sq, sk). */
static void seq_views(const kv_bufs *t, int64_t b, sdpa_tensor *q, sdpa_tensor *k, sdpa_tensor *v,
                      sdpa_tensor *mask, sdpa_params *p) {
    *q = batch_view(&t->q.t, b);
    q->shape[2] = t->sq[b];
    *k = batch_view(&t->k.t, b);
    k->shape[2] = t->sk[b];
    *v = batch_view(&t->v.t, b);
    v->shape[2] = t->sk[b];
    *p = t->p;
    if (t->p.mask != NULL) {
        *mask = batch_view(t->p.mask, b);
        if (mask->shape[2] != 1)
            mask->shape[2] = t->sq[b];
        mask->shape[3] = t->sk[b];
        p->mask = mask;
    }
}

static int kv_oracles(const kv_case *c, const kv_bufs *t, sdpa_ctx *ctx, kv_oracle *o) {
    const size_t n_out = (size_t)(c->B * c->Hq * c->Lq * c->Dv),
                 n_l = (size_t)(c->B * c->Hq * c->Lq);
    o->g_o = tu_xmalloc(n_out * sizeof(double));
    o->n_o = tu_xmalloc(n_out * sizeof(double));
    o->lp_o = tu_xmalloc(n_out * sizeof(double));
    o->g_l = tu_xmalloc(n_l * sizeof(double));
    o->n_l = tu_xmalloc(n_l * sizeof(double));
    o->lp_l = tu_xmalloc(n_l * sizeof(double));
    o->empty = tu_xmalloc(n_l);
    int ok = 1;
    for (int64_t b = 0; b < c->B; b++) {
        const int64_t sq = t->sq[b], sk = t->sk[b];
        /* rows the sequence lacks, and every row of a sequence without keys: 0 and -inf */
        for (int64_t h = 0; h < c->Hq; h++)
            for (int64_t i = 0; i < c->Lq; i++) {
                const size_t row = (size_t)((b * c->Hq + h) * c->Lq + i);
                o->empty[row] = 1;
                o->g_l[row] = o->n_l[row] = o->lp_l[row] = -INFINITY;
                for (int64_t d = 0; d < c->Dv; d++)
                    o->g_o[row * (size_t)c->Dv + (size_t)d] =
                        o->n_o[row * (size_t)c->Dv + (size_t)d] =
                            o->lp_o[row * (size_t)c->Dv + (size_t)d] = 0.0;
            }
        if (sq > 0 && sk > 0) {
            sdpa_tensor q, k, v, mask;
            sdpa_params p;
            seq_views(t, b, &q, &k, &v, &mask, &p);
            tu_tensor go = tu_alloc(SDPA_F32, 1, c->Hq, sq, c->Dv, TU_BHLD, 0, 0);
            tu_tensor gl = tu_alloc(SDPA_F32, 1, c->Hq, sq, 1, TU_BHLD, 0, 0);
            const sdpa_status st = tu_golden_forward(ctx, &q, &k, &v, &p, &go.t, &gl.t);
            if (st != SDPA_OK) {
                printf("    %s: the golden of sequence %lld: %s: %s\n", c->what, (long long)b,
                       sdpa_status_name(st), sdpa_ctx_last_error(ctx));
                ok = 0;
            }
            const size_t m = (size_t)(c->Hq * sq);
            double *nd = tu_xmalloc(m * (size_t)c->Dv * sizeof(double)),
                   *nl = tu_xmalloc(m * sizeof(double));
            double *ld = tu_xmalloc(m * (size_t)c->Dv * sizeof(double)),
                   *ll = tu_xmalloc(m * sizeof(double));
            sdpa_params pn = p;
            pn.sinks = NULL; /* tu_naive_forward knows no sinks: joined below */
            tu_naive_forward(&q, &k, &v, &pn, -1, nd, nl);
            tu_naive_forward(&q, &k, &v, &pn, SDPA_F32, ld, ll);
            for (int64_t h = 0; h < c->Hq; h++)
                for (int64_t i = 0; i < sq; i++) {
                    const size_t src = (size_t)(h * sq + i);
                    const size_t row = (size_t)((b * c->Hq + h) * c->Lq + i);
                    o->empty[row] = nl[src] == -INFINITY;
                    if (p.sinks != NULL) {
                        join_sink((double)p.sinks[h], nd + src * (size_t)c->Dv, c->Dv, &nl[src],
                                  -1);
                        join_sink((double)p.sinks[h], ld + src * (size_t)c->Dv, c->Dv, &ll[src],
                                  SDPA_F32);
                    }
                    o->g_l[row] = tu_get(&gl.t, 0, h, i, 0);
                    o->n_l[row] = nl[src];
                    o->lp_l[row] = ll[src];
                    for (int64_t d = 0; d < c->Dv; d++) {
                        const size_t at = row * (size_t)c->Dv + (size_t)d;
                        o->g_o[at] = tu_get(&go.t, 0, h, i, d);
                        o->n_o[at] = nd[src * (size_t)c->Dv + (size_t)d];
                        o->lp_o[at] = ld[src * (size_t)c->Dv + (size_t)d];
                    }
                }
            free(nd);
            free(nl);
            free(ld);
            free(ll);
            tu_free(&go);
            tu_free(&gl);
        }
        /* a row with no key has the sink's LSE */
        if (t->p.sinks != NULL)
            for (int64_t h = 0; h < c->Hq; h++)
                for (int64_t i = 0; i < c->Lq; i++) {
                    const size_t row = (size_t)((b * c->Hq + h) * c->Lq + i);
                    if (i >= sq || sk == 0)
                        o->g_l[row] = o->n_l[row] = o->lp_l[row] = (double)t->p.sinks[h];
                }
    }
    return ok;
}

static void kv_oracle_free(kv_oracle *o) {
    free(o->g_o);
    free(o->g_l);
    free(o->n_o);
    free(o->n_l);
    free(o->lp_o);
    free(o->lp_l);
    free(o->empty);
}

/* Rows that see no key: O exactly 0 and LSE exactly what the golden says (-inf or the sink). */
static int empty_rows_exact(const char *what, const double *o, const double *l, const kv_oracle *g,
                            size_t rows, int64_t dv) {
    size_t bad = 0;
    for (size_t r = 0; r < rows; r++) {
        if (!g->empty[r])
            continue;
        for (int64_t d = 0; d < dv; d++)
            bad += o[r * (size_t)dv + (size_t)d] != 0.0;
        bad += !(l[r] == g->g_l[r]);
    }
    if (bad)
        printf("    %s: %zu values of rows without keys are not 0 / the sink's LSE\n", what, bad);
    return bad == 0;
}

/* The rule on out and lse (f32 outputs: k = 3, NMSE gate 1e-10 on O) and the empty rows. */
static int kv_rule(const char *what, const double *o, const double *l, const kv_oracle *g,
                   size_t n_out, size_t n_l, int64_t dv) {
    char name[128];
    snprintf(name, sizeof name, "%s out", what);
    const int a = tu_rule(name, o, g->lp_o, g->g_o, n_out, SDPA_F32, 3.0, 1e-10);
    snprintf(name, sizeof name, "%s lse", what);
    const int b = tu_rule(name, l, g->lp_l, g->g_l, n_l, SDPA_F32, 3.0, 0.0);
    if (!b) /* where: the first rows off by more than a rounding, or non-finite elsewhere */
        for (size_t r = 0, shown = 0; r < n_l && shown < 6; r++) {
            const double x = l[r], y = g->g_l[r];
            const int off = !isfinite(x) || !isfinite(y) ? !(x == y || (isnan(x) && isnan(y)))
                                                         : fabs(x - y) > 1e-4 * (1.0 + fabs(y));
            if (off) {
                printf("      lse[%zu] = %.9g, golden %.9g\n", r, x, y);
                shown++;
            }
        }
    return a && b && empty_rows_exact(what, o, l, g, n_l, dv);
}

/* sdpa_forward per sequence on the plain slices, gathered into (B, Hq, Lq, Dv) like
 * sdpa_forward_kv's output; rows a sequence lacks take the golden's values. */
static int per_sequence_forward(const kv_case *c, const kv_bufs *t, sdpa_ctx *ctx,
                                const kv_oracle *g, double *o, double *l) {
    const size_t n_out = (size_t)(c->B * c->Hq * c->Lq * c->Dv),
                 n_l = (size_t)(c->B * c->Hq * c->Lq);
    memcpy(o, g->g_o, n_out * sizeof *o);
    memcpy(l, g->g_l, n_l * sizeof *l);
    for (int64_t b = 0; b < c->B; b++) {
        const int64_t sq = t->sq[b];
        if (sq == 0 || t->sk[b] == 0)
            continue;
        sdpa_tensor q, k, v, mask;
        sdpa_params p;
        seq_views(t, b, &q, &k, &v, &mask, &p);
        tu_tensor so = tu_alloc(SDPA_F32, 1, c->Hq, sq, c->Dv, TU_BHLD, 0, 0);
        tu_tensor sl = tu_alloc(SDPA_F32, 1, c->Hq, sq, 1, TU_BHLD, 0, 0);
        const sdpa_status st = sdpa_forward(ctx, &q, &k, &v, &p, &so.t, &sl.t);
        if (st != SDPA_OK) {
            printf("    sdpa_forward of sequence %lld: %s: %s\n", (long long)b,
                   sdpa_status_name(st), sdpa_ctx_last_error(ctx));
            tu_free(&so);
            tu_free(&sl);
            return 0;
        }
        for (int64_t h = 0; h < c->Hq; h++)
            for (int64_t i = 0; i < sq; i++) {
                const size_t row = (size_t)((b * c->Hq + h) * c->Lq + i);
                l[row] = tu_get(&sl.t, 0, h, i, 0);
                for (int64_t d = 0; d < c->Dv; d++)
                    o[row * (size_t)c->Dv + (size_t)d] = tu_get(&so.t, 0, h, i, d);
            }
        tu_free(&so);
        tu_free(&sl);
    }
    return 1;
}

/* One case: the golden against the naive double result, then at every ISA level the CPU has
 * sdpa_forward_kv (and sdpa_forward per sequence) by the rule. @return 1 if all agree. */
static int run_kv_case(const kv_case *c) {
    kv_bufs t;
    kv_build(c, &t);
    const size_t n_out = (size_t)(c->B * c->Hq * c->Lq * c->Dv),
                 n_l = (size_t)(c->B * c->Hq * c->Lq);
    sdpa_ctx *ctx = tu_ctx(1, SDPA_ISA_AUTO);
    kv_oracle g;
    int ok = kv_oracles(c, &t, ctx, &g);
    sdpa_ctx_destroy(ctx);
    ok = ok && tu_within_ulp("reference out vs naive", g.g_o, g.n_o, n_out) &&
         tu_within_ulp("reference lse vs naive", g.g_l, g.n_l, n_l);
    printf("    %-64s reference %s\n", c->what, ok ? "ok" : "MISMATCH");

    int32_t sk[MAXB], sq[MAXB];
    const sdpa_kv_cache kc = kv_desc(c, &t, sk, sq);
    double *o2 = tu_xmalloc(n_out * sizeof(double)), *l2 = tu_xmalloc(n_l * sizeof(double));
    for (int n = 0; n < g_n_impls; n++) {
        if (!g_impls[n].runs || !tu_impl_takes_kv(&g_impls[n], &t.q.t, &kc, &t.p, &t.o.t))
            continue; /* (f32 queries: not flash-amx's, flash-avx512's under its own name) */
        ctx = tu_ctx(0, g_impls[n].level);
        tu_fill_canary(&t.o);
        tu_fill_canary(&t.lse);
        const sdpa_status st = sdpa_forward_kv(ctx, &t.q.t, &kc, &t.p, &t.o.t, &t.lse.t);
        char what[160];
        if (st != SDPA_OK) {
            printf("    %s [%s]: sdpa_forward_kv: %s: %s\n", c->what, g_impls[n].name,
                   sdpa_status_name(st), sdpa_ctx_last_error(ctx));
            ok = 0;
        } else {
            double *o = tu_to_doubles(&t.o.t), *l = tu_to_doubles(&t.lse.t);
            snprintf(what, sizeof what, "[%s] kv", g_impls[n].name);
            if (!kv_rule(what, o, l, &g, n_out, n_l, c->Dv)) {
                printf("    %s [%s]: sdpa_forward_kv FAILS THE RULE\n", c->what, g_impls[n].name);
                ok = 0;
            }
            free(o);
            free(l);
        }
        snprintf(what, sizeof what, "[%s] per sequence", g_impls[n].name);
        if (!per_sequence_forward(c, &t, ctx, &g, o2, l2) ||
            !kv_rule(what, o2, l2, &g, n_out, n_l, c->Dv)) {
            printf("    %s [%s]: sdpa_forward per sequence FAILS THE RULE\n", c->what,
                   g_impls[n].name);
            ok = 0;
        }
        sdpa_ctx_destroy(ctx);
    }
    free(o2);
    free(l2);
    kv_oracle_free(&g);
    kv_free(&t);
    return ok;
}

static kv_case decode_case(const char *what, int64_t B, int64_t hq, int64_t hkv, int64_t page,
                           int64_t cap, sdpa_dtype dt, const int32_t *lens, uint64_t seed) {
    kv_case c;
    memset(&c, 0, sizeof c);
    c.what = what;
    c.B = B;
    c.Hq = hq;
    c.Hkv = hkv;
    c.Lq = 1;
    c.Dk = 32;
    c.Dv = 24;
    c.page = page;
    c.cap = cap;
    c.kv_dt = dt;
    for (int64_t b = 0; b < B; b++) {
        c.sk[b] = lens[b];
        c.sq[b] = 1;
    }
    c.align = SDPA_ALIGN_BOTTOM_RIGHT;
    c.seed = seed;
    return c;
}

/* Gives case n of a sweep its features, in turn: none; causal and a window with sinks; ALiBi,
 * softcap and an additive mask; causal, a bool mask and sinks. */
static void vary_features(kv_case *c, int n) {
    switch (n % 4) {
    case 1:
        c->causal = 1;
        c->use_window = 1;
        c->window_left = 300;
        c->window_right = -1;
        c->sinks = 1;
        break;
    case 2:
        c->alibi = 1;
        c->softcap = 8.0f;
        c->mask = MASK_ADD;
        break;
    case 3:
        c->causal = 1;
        c->mask = MASK_BOOL_BCAST;
        c->sinks = 1;
        c->alibi = 1;
        break;
    default:
        break;
    }
}

static const char *feature_name(int n) {
    static const char *const names[4] = {"plain", "causal+window+sinks", "alibi+softcap+mask",
                                         "causal+bool mask+sinks+alibi"};
    return names[n % 4];
}

/* Decode (Lq = 1) on paged caches: page sizes 16, 64 and 256, GQA ratios 1, 4 and 8, f32, f16
 * and bf16. Four sequences of two kv heads are 8 tasks, so a capacity of 2048 keys is split
 * into 4 chunks of 512: lengths at the chunk boundaries +-1, at page boundaries +-1, 0 and
 * 1 key, and the full capacity. */
static void test_paged_decode(void) {
    static const int64_t pages[3] = {16, 64, 256};
    static const int64_t ratios[3] = {1, 4, 8};
    static const sdpa_dtype dts[3] = {SDPA_F32, SDPA_F16, SDPA_BF16};
    int n = 0;
    for (int a = 0; a < 3; a++)
        for (int g = 0; g < 3; g++, n++) {
            const int64_t P = pages[a];
            /* chunk boundaries (512, 1024, 1536) +-1, page boundaries +-1, 0, 1, full */
            const int32_t d = (int32_t)(n % 3) - 1;
            const int32_t lens[8] = {(int32_t)(512 + d),         (int32_t)(1024 - d),
                                     (int32_t)(P - 1 + (n % 3)), n % 2 ? 0 : 1,
                                     (int32_t)(1536 + d),        2048,
                                     (int32_t)(3 * P + d),       (int32_t)(2 * P)};
            char what[128];
            snprintf(what, sizeof what, "paged decode page %lld ratio %lld %s %s", (long long)P,
                     (long long)ratios[g], sdpa_dtype_name(dts[(a + g) % 3]), feature_name(n));
            /* B = 4 sequences of 2 kv heads, or 8 of 1 (both 8 tasks) */
            const int64_t hkv = n % 2 ? 1 : 2, B = 8 / hkv;
            kv_case c = decode_case(what, B, hkv * ratios[g], hkv, P, 2048, dts[(a + g) % 3], lens,
                                    1000 + (uint64_t)n);
            c.blhd = n % 2;
            vary_features(&c, n);
            CHECK_MSG(run_kv_case(&c), "%s", what);
        }
}

/* Mixed lengths on a batch of 10 (20 tasks: two chunks), and one of 13 sequences of one kv head
 * (no split); seqlens_k NULL (every sequence full) and seqlens_q NULL. */
static void test_paged_mixed(void) {
    static const int32_t lens[13] = {0, 1, 15, 16, 17, 63, 64, 65, 255, 256, 257, 700, 1000};
    int n = 0;
    for (int64_t P = 16; P <= 256; P *= 4, n++) {
        char what[128];
        snprintf(what, sizeof what, "paged mixed B=10 page %lld f16 %s", (long long)P,
                 feature_name(n + 1));
        kv_case c = decode_case(what, 10, 8, 2, P, 1024, SDPA_F16, lens + 3, 2000 + (uint64_t)n);
        vary_features(&c, n + 1);
        c.no_sq = 1;
        CHECK_MSG(run_kv_case(&c), "%s", what);
    }
    kv_case c = decode_case("paged B=13 page 64 ratio 4 bf16, alibi+softcap+mask", 13, 4, 1, 64,
                            1024, SDPA_BF16, lens, 2100);
    vary_features(&c, 2);
    CHECK(run_kv_case(&c));
    c = decode_case("paged B=3 every sequence full (seqlens_k NULL) page 16", 3, 8, 2, 16, 528,
                    SDPA_F32, lens, 2200);
    c.no_sk = 1;
    c.sinks = 1;
    CHECK(run_kv_case(&c));
}

/* Chunked prefill: several queries per sequence, seqlens_q < Lq (rows past it 0 and -inf or
 * the sink), causal bottom-right per sequence (a sequence with fewer keys than queries has
 * fully masked rows), windows, ALiBi, softcap, masks; query blocks of the kernel cut by the
 * lengths (ratio 8: 16 positions a block). */
static void test_chunked_prefill(void) {
    static const int64_t pages[3] = {16, 64, 256};
    static const int64_t ratios[3] = {1, 4, 8};
    for (int n = 0; n < 6; n++) {
        kv_case c;
        memset(&c, 0, sizeof c);
        char what[128];
        const int64_t P = pages[n % 3], ratio = ratios[(n + n / 3) % 3];
        snprintf(what, sizeof what, "chunked prefill page %lld ratio %lld %s", (long long)P,
                 (long long)ratio, feature_name(n));
        c.what = what;
        c.B = 4;
        c.Hkv = 2;
        c.Hq = 2 * ratio;
        c.Lq = 40;
        c.Dk = 24;
        c.Dv = 40;
        c.page = P;
        c.cap = 1024;
        c.kv_dt = n % 3 == 0 ? SDPA_F32 : n % 3 == 1 ? SDPA_F16 : SDPA_BF16;
        const int32_t sq[4] = {40, 17, 0, 16}, sk[4] = {600, 17, 300, 9};
        memcpy(c.sq, sq, sizeof sq);
        memcpy(c.sk, sk, sizeof sk);
        c.causal = 1;
        c.align = SDPA_ALIGN_BOTTOM_RIGHT;
        c.blhd = n % 2;
        c.seed = 3000 + (uint64_t)n;
        vary_features(&c, n);
        c.causal = 1;
        CHECK_MSG(run_kv_case(&c), "%s", what);
    }
}

/* The case with 1 and 2 threads (each worker's widened head, flash_plan.c WIDE_MIN_BLOCKS) bitwise
 * with 32 threads (too few query blocks a worker for it: tiles widened as read), at every
 * level, whatever the cores. */
static int widened_bitwise(const kv_case *c) {
    kv_bufs t;
    kv_build(c, &t);
    int32_t sk[MAXB], sq[MAXB];
    const sdpa_kv_cache kc = kv_desc(c, &t, sk, sq);
    tu_tensor o2 = tu_alloc(SDPA_F32, c->B, c->Hq, c->Lq, c->Dv, TU_BHLD, 0, 0);
    tu_tensor l2 = tu_alloc(SDPA_F32, c->B, c->Hq, c->Lq, 1, TU_BHLD, 0, 0);
    int ok = 1;
    for (int n = 0; n < g_n_impls; n++) {
        if (!g_impls[n].runs || !tu_impl_takes_kv(&g_impls[n], &t.q.t, &kc, &t.p, &t.o.t))
            continue; /* (f32 queries: not flash-amx's, flash-avx512's under its own name) */
        sdpa_ctx *ctx = tu_ctx(32, g_impls[n].level);
        ok &= sdpa_forward_kv(ctx, &t.q.t, &kc, &t.p, &t.o.t, &t.lse.t) == SDPA_OK;
        sdpa_ctx_destroy(ctx);
        for (int threads = 1; threads <= 2; threads++) {
            ctx = tu_ctx(threads, g_impls[n].level);
            tu_fill_canary(&o2);
            tu_fill_canary(&l2);
            const int same = sdpa_forward_kv(ctx, &t.q.t, &kc, &t.p, &o2.t, &l2.t) == SDPA_OK &&
                             memcmp(t.o.buf, o2.buf, o2.bytes) == 0 &&
                             memcmp(t.lse.buf, l2.buf, l2.bytes) == 0;
            if (!same)
                printf("    %s [%s]: %d threads differ from 32\n", c->what, g_impls[n].name,
                       threads);
            ok &= same;
            sdpa_ctx_destroy(ctx);
        }
    }
    tu_free(&o2);
    tu_free(&l2);
    kv_free(&t);
    return ok;
}

/* Chunked prefill long enough that each kv head has 4 or more query blocks (ratio 8: 16
 * positions a block: 13 blocks, two per worker up to 6 workers), so that the half-precision
 * cache is read from each worker's widened head (flash_plan.c, WIDE_MIN_BLOCKS): through the block
 * table with pages 16 and 64, and the plain layout with ragged lengths, in both alignments;
 * against the reference, and bitwise the tiles widened as read. One kv head, so that a
 * worker's next head is another sequence's. */
static void test_chunked_prefill_widened(void) {
    for (int n = 0; n < 3; n++) {
        kv_case c;
        memset(&c, 0, sizeof c);
        c.what = n == 0   ? "long chunked prefill f16, page 16, causal bottom-right"
                 : n == 1 ? "long chunked prefill bf16, page 64, window and softcap, (B, L, H, D)"
                          : "long chunked prefill f16, plain ragged, top-left causal, mask";
        c.B = 4;
        c.Hkv = 1;
        c.Hq = 8;
        c.Lq = 200;
        c.Dk = 24;
        c.Dv = 40;
        c.page = n == 0 ? 16 : n == 1 ? 64 : 0;
        c.cap = 1024;
        c.kv_dt = n == 1 ? SDPA_BF16 : SDPA_F16;
        const int32_t sq[4] = {200, 70, 0, 150}, sk[4] = {700, 70, 300, 140};
        memcpy(c.sq, sq, sizeof sq);
        memcpy(c.sk, sk, sizeof sk);
        c.causal = 1;
        c.align = n == 2 ? SDPA_ALIGN_TOP_LEFT : SDPA_ALIGN_BOTTOM_RIGHT;
        c.blhd = n == 1;
        c.seed = 3100 + (uint64_t)n;
        if (n == 1) {
            c.use_window = 1;
            c.window_left = 40;
            c.window_right = 0;
            c.softcap = 20.0f;
        }
        if (n == 2)
            c.mask = MASK_ADD;
        CHECK_MSG(run_kv_case(&c), "%s", c.what);
        CHECK_MSG(widened_bitwise(&c), "%s", c.what);
    }
}

/* The plain layout with seqlens (no block table): rows past a length are NaN and never read;
 * decode across the chunks and prefill, causal in both alignments. */
static void test_plain_ragged(void) {
    static const int32_t lens[6] = {0, 1, 700, 1023, 1024, 1100};
    kv_case c = decode_case("plain ragged decode f32 (B, L, H, D), causal+window+sinks", 6, 8, 1, 0,
                            1100, SDPA_F32, lens, 4000);
    c.blhd = 1;
    vary_features(&c, 1);
    CHECK(run_kv_case(&c));
    c = decode_case("plain ragged decode bf16, alibi+softcap+mask", 6, 4, 1, 0, 1100, SDPA_BF16,
                    lens, 4001);
    vary_features(&c, 2);
    CHECK(run_kv_case(&c));
    c = decode_case("plain ragged prefill f16, top-left causal, mask, sinks", 3, 6, 2, 0, 300,
                    SDPA_F16, lens, 4002);
    c.Lq = 20;
    const int32_t sq[3] = {20, 0, 7}, sk[3] = {300, 50, 5};
    memcpy(c.sq, sq, sizeof sq);
    memcpy(c.sk, sk, sizeof sk);
    c.causal = 1;
    c.align = SDPA_ALIGN_TOP_LEFT;
    c.mask = MASK_ADD;
    c.sinks = 1;
    CHECK(run_kv_case(&c));
    c.what = "plain ragged prefill f16, window (3, 2) bottom-right, seqlens_q NULL";
    c.causal = 0;
    c.align = SDPA_ALIGN_BOTTOM_RIGHT;
    c.use_window = 1;
    c.window_left = 3;
    c.window_right = 2;
    c.no_sq = 1;
    c.sinks = 0;
    CHECK(run_kv_case(&c));
}

/* ======================================================================================== */
/* 2. Determinism                                                                            */
/* ======================================================================================== */

/* A paged batch, split into chunks: bitwise the same out and lse for 1, 2, 3 and 7 threads at
 * every ISA level, and on a second call. */
static void test_determinism(void) {
    static const int32_t lens[4] = {1500, 3, 1025, 2048};
    kv_case c = decode_case("determinism", 4, 8, 2, 64, 2048, SDPA_F16, lens, 5000);
    c.Lq = 3;
    for (int b = 0; b < 4; b++)
        c.sq[b] = b == 1 ? 2 : 3;
    c.causal = 1;
    c.sinks = 1;
    c.mask = MASK_ADD;
    kv_bufs t;
    kv_build(&c, &t);
    int32_t sk[MAXB], sq[MAXB];
    const sdpa_kv_cache kc = kv_desc(&c, &t, sk, sq);
    static const int threads[4] = {1, 2, 3, 7};
    unsigned char *ref_o = tu_xmalloc(t.o.bytes), *ref_l = tu_xmalloc(t.lse.bytes);
    for (int n = 0; n < g_n_impls; n++) {
        if (!g_impls[n].runs || !tu_impl_takes_kv(&g_impls[n], &t.q.t, &kc, &t.p, &t.o.t))
            continue; /* (f32 queries: not flash-amx's, flash-avx512's under its own name) */
        int same = 1;
        for (int a = 0; a < 4; a++) {
            sdpa_ctx *ctx = tu_ctx(threads[a], g_impls[n].level);
            for (int rep = 0; rep < (a == 0 ? 2 : 1); rep++) {
                tu_fill_canary(&t.o);
                tu_fill_canary(&t.lse);
                CHECK_INT_EQ(sdpa_forward_kv(ctx, &t.q.t, &kc, &t.p, &t.o.t, &t.lse.t), SDPA_OK);
                if (a == 0 && rep == 0) {
                    memcpy(ref_o, t.o.buf, t.o.bytes);
                    memcpy(ref_l, t.lse.buf, t.lse.bytes);
                } else {
                    same &= memcmp(ref_o, t.o.buf, t.o.bytes) == 0 &&
                            memcmp(ref_l, t.lse.buf, t.lse.bytes) == 0;
                }
            }
            sdpa_ctx_destroy(ctx);
        }
        printf("    [%s] threads 1, 2, 3, 7: %s\n", g_impls[n].name,
               same ? "bitwise equal" : "DIFFER");
        CHECK_MSG(same, "[%s] sdpa_forward_kv differs between thread counts", g_impls[n].name);
    }
    free(ref_o);
    free(ref_l);
    kv_free(&t);
}

int main(int argc, char **argv) {
    tu_report_impls();
    g_n_impls = tu_impls(g_impls);
    return CHECK_RUN(argc, argv, CASE(test_paged_decode), CASE(test_paged_mixed),
                     CASE(test_chunked_prefill), CASE(test_chunked_prefill_widened),
                     CASE(test_plain_ragged), CASE(test_determinism));
}
